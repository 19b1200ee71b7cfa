//! The samples kept for the dashboard: per object (listener, route, upstream, server), the
//! difference of its totals from one sample to the next, for the last `points` samples.
//!
//! Objects are known by name, so a reload that keeps a name keeps its history (as the
//! metrics keep their counts, `weir_core::metrics::layout`); an object that leaves the
//! config leaves the history with it. Memory is bounded by the objects with traffic in the
//! window times `points` ([`Point`] is 72 bytes); an idle object's series is dropped and
//! reads as zeros.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use weir_config::DashboardSettings;
use weir_core::metrics::totals::{Traffic, BUCKETS};

/// One object of the config, by name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    Listener(String),
    /// Listener, route (`None`: the requests no route matched).
    Route(String, Option<String>),
    Upstream(String),
    /// Upstream, server address as written.
    Server(String, String),
}

/// An object's counts at one sample: cumulative ones, and gauges shown as they were.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Count {
    pub traffic: Traffic,
    /// Connections accepted (listeners).
    pub connections: u64,
    /// Connections open (listeners) or requests in flight (servers).
    pub open: u64,
    /// Failed connection attempts (servers).
    pub connect_errors: u64,
    /// The HTTP/2 defence counters (listeners), by short name.
    pub http2: Vec<(&'static str, u64)>,
}

/// What one object did between two samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Point {
    pub requests: u32,
    pub errors: u32,
    pub connections: u32,
    pub latency: [u32; BUCKETS],
}

impl Point {
    fn between(old: &Count, new: &Count) -> Point {
        // Counters never go back; saturate anyway, and clamp an interval's worth to u32.
        let d = |a: u64, b: u64| u32::try_from(b.saturating_sub(a)).unwrap_or(u32::MAX);
        let (o, n) = (&old.traffic, &new.traffic);
        Point {
            requests: d(o.requests, n.requests),
            errors: d(o.errors, n.errors),
            connections: d(old.connections, new.connections),
            latency: std::array::from_fn(|i| d(o.latency[i], n.latency[i])),
        }
    }
}

/// When a sample was taken and how long after the one before.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tick {
    pub seq: u64,
    /// Unix milliseconds.
    pub at_ms: u64,
    /// Seconds since the sample before.
    pub secs: f64,
}

/// The samples of one set of dashboard settings.
#[derive(Debug, Default)]
pub struct Ring {
    /// The settings the samples were taken with (`None`: the dashboard is off).
    pub settings: Option<DashboardSettings>,
    /// The last `points` ticks, oldest first; the newest is `seq`.
    pub ticks: VecDeque<Tick>,
    /// Each object's points, oldest first; the last is at the newest tick (an object that
    /// came later, or was idle before, has fewer: the ticks before its first point are
    /// zeros; one idle for the whole window has none).
    pub series: HashMap<Key, VecDeque<Point>>,
    /// The counts at the last sample, to take the next one's differences from.
    last: HashMap<Key, Count>,
    last_at: Option<Instant>,
    seq: u64,
}

impl Ring {
    /// Starts over with `settings` when they differ from the ones the samples were taken
    /// with (a reload changed them, or turned the dashboard off: then it holds nothing).
    pub fn configure(&mut self, settings: Option<DashboardSettings>) {
        if self.settings != settings {
            *self = Ring {
                settings,
                ..Ring::default()
            };
        }
    }

    /// Records `counts`, taken at `now` (Unix time `at_ms`): each object gets a point with
    /// the difference from the last sample. The first sample only sets the baseline.
    pub fn record(&mut self, counts: HashMap<Key, Count>, now: Instant, at_ms: u64) {
        let Some(settings) = self.settings else {
            return;
        };
        let points = settings.points();
        if let Some(before) = self.last_at {
            self.seq += 1;
            let secs = now.saturating_duration_since(before).as_secs_f64();
            push_bounded(
                &mut self.ticks,
                Tick {
                    seq: self.seq,
                    at_ms,
                    secs,
                },
                points,
            );
            for (key, count) in &counts {
                let Some(old) = self.last.get(key) else {
                    continue;
                };
                let point = Point::between(old, count);
                match self.series.get_mut(key) {
                    Some(series) => push_bounded(series, point, points),
                    None if point != Point::default() => {
                        self.series.insert(key.clone(), VecDeque::from([point]));
                    }
                    None => {}
                }
            }
        }
        // An object idle for the whole window keeps no series (it reads as zeros): a
        // fleet's 10,000 routes, most of them quiet, would otherwise hold `points` each.
        self.series.retain(|key, series| {
            counts.contains_key(key) && series.iter().any(|p| *p != Point::default())
        });
        self.last = counts;
        self.last_at = Some(now);
    }

    /// The newest tick's sequence number (0: no interval measured yet).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// An object's counts at the last sample.
    pub fn latest(&self, key: &Key) -> Option<&Count> {
        self.last.get(key)
    }
}

fn push_bounded<T>(queue: &mut VecDeque<T>, item: T, max: usize) {
    if queue.len() >= max {
        queue.pop_front();
    }
    queue.push_back(item);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn count(requests: u64, errors: u64) -> Count {
        let mut traffic = Traffic {
            requests,
            errors,
            ..Traffic::default()
        };
        traffic.latency[2] = requests;
        Count {
            traffic,
            connections: requests / 2,
            ..Count::default()
        }
    }

    fn route(name: &str) -> Key {
        Key::Route("web".into(), Some(name.into()))
    }

    #[test]
    fn points_are_differences_kept_for_the_configured_history() {
        let mut ring = Ring::default();
        let settings = DashboardSettings {
            interval: Duration::from_secs(1),
            history: Duration::from_secs(3),
        };
        ring.configure(Some(settings));
        let t0 = Instant::now();
        let at = |i: u64| (t0 + Duration::from_secs(i), 1_000 * i);
        let (now, ms) = at(0);
        ring.record(HashMap::from([(route("a"), count(10, 1))]), now, ms);
        assert_eq!((ring.seq(), ring.series.len()), (0, 0), "a baseline only");
        for i in 1..=4 {
            let (now, ms) = at(i);
            let mut counts = HashMap::from([(route("a"), count(10 + 4 * i, 1 + i))]);
            if i >= 3 {
                counts.insert(route("b"), count(i, 0));
            }
            ring.record(counts, now, ms);
        }
        assert_eq!(ring.seq(), 4);
        let a = &ring.series[&route("a")];
        assert_eq!(a.len(), 3, "bounded by history / interval");
        assert_eq!((a[2].requests, a[2].errors, a[2].connections), (4, 1, 2));
        assert_eq!(a[2].latency[2], 4);
        assert_eq!(
            ring.series[&route("b")].len(),
            1,
            "b came at the third sample"
        );
        let ticks: Vec<u64> = ring.ticks.iter().map(|t| t.seq).collect();
        assert_eq!(ticks, [2, 3, 4]);
        assert_eq!(ring.ticks[2].secs, 1.0);
        // A route that leaves the config leaves the history.
        let (now, ms) = at(5);
        ring.record(HashMap::from([(route("b"), count(9, 0))]), now, ms);
        assert!(!ring.series.contains_key(&route("a")));
        // New settings start over; off holds nothing.
        ring.configure(Some(DashboardSettings::default()));
        assert_eq!((ring.seq(), ring.series.len()), (0, 0));
        ring.configure(None);
        ring.record(HashMap::from([(route("b"), count(9, 0))]), now, ms);
        assert!(ring.last.is_empty() && ring.ticks.is_empty());
    }

    #[test]
    fn an_idle_object_keeps_no_points() {
        let mut ring = Ring::default();
        ring.configure(Some(DashboardSettings {
            interval: Duration::from_secs(1),
            history: Duration::from_secs(3),
        }));
        let t0 = Instant::now();
        // "a" serves at the first interval only, "b" never: "a" keeps its series until
        // its busy point leaves the window (three points), "b" never has one; the first
        // sample is the baseline.
        for (i, a) in [(0, 5), (1, 9), (2, 9), (3, 9), (4, 9)] {
            let counts = HashMap::from([(route("a"), count(a, 0)), (route("b"), count(7, 0))]);
            ring.record(counts, t0 + Duration::from_secs(i), 1_000 * i);
            assert!(!ring.series.contains_key(&route("b")), "sample {i}");
            assert_eq!(
                ring.series.contains_key(&route("a")),
                (1..4).contains(&i),
                "sample {i}"
            );
        }
    }
}
