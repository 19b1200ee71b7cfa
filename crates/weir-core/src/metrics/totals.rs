//! Cumulative totals per object of a snapshot, for the dashboard's sampler (weir-admin
//! `stats`, which keeps their differences over time): requests, 5xx answers and latency
//! buckets of every listener, route, upstream and server, with connections, in-flight
//! requests and the HTTP/2 defence counters. Read from the shards as a scrape reads them,
//! with nothing formatted: the admin side walks the shards, the workers do nothing more.

use std::sync::Arc;

use super::encode::HTTP2_FAMILIES;
use super::layout::SlotMap;
use super::shard::{Histogram, WorkerMetrics, LATENCY_BUCKETS, METHODS, PROTOCOLS, STATUS_SLOTS};
use super::view::ShardWalk;
use super::Metrics;
use crate::snapshot::Snapshot;

/// Latency buckets of [`Traffic`]: those of [`LATENCY_BUCKETS`], then one for anything
/// slower than the last bound.
pub const BUCKETS: usize = LATENCY_BUCKETS.len() + 1;

/// Status slots of 5xx answers (`shard::status_index` of 500..=599).
const ERROR_SLOTS: std::ops::Range<usize> = 400..500;

/// Requests, the 5xx answers among them, and how long they took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    pub requests: u64,
    pub errors: u64,
    /// Requests by latency bucket (not cumulative); see [`BUCKETS`].
    pub latency: [u64; BUCKETS],
}

impl Traffic {
    pub fn add(&mut self, other: &Traffic) {
        self.requests += other.requests;
        self.errors += other.errors;
        for (a, b) in self.latency.iter_mut().zip(other.latency) {
            *a += b;
        }
    }

    fn add_histogram(&mut self, h: &Histogram) {
        let (mut sum, mut count, mut buckets) = (0.0, 0, [0; LATENCY_BUCKETS.len()]);
        h.merge_into(&mut sum, &mut count, &mut buckets);
        for (a, b) in self.latency.iter_mut().zip(buckets) {
            *a += b;
        }
        self.latency[BUCKETS - 1] += count.saturating_sub(buckets.iter().sum());
    }
}

/// Totals of every object of a snapshot's config, indexed like it.
#[derive(Debug, Clone, Default)]
pub struct Totals {
    pub listeners: Vec<ListenerTotals>,
    pub upstreams: Vec<UpstreamTotals>,
}

#[derive(Debug, Clone, Default)]
pub struct ListenerTotals {
    /// All its requests, routed or not.
    pub traffic: Traffic,
    /// Index 0: requests no route matched; `r + 1`: the config's route `r`.
    pub routes: Vec<Traffic>,
    /// Connections accepted.
    pub connections: u64,
    /// Connections open.
    pub active: u64,
    /// The HTTP/2 defence counters, by short name (`connections`, `streams`,
    /// `client_resets`, `calm_goaways`, `forced_resets`, `glitches`, `stalled`).
    pub http2: Vec<(&'static str, u64)>,
}

#[derive(Debug, Clone, Default)]
pub struct UpstreamTotals {
    /// All its servers' attempts.
    pub traffic: Traffic,
    pub servers: Vec<ServerTotals>,
}

#[derive(Debug, Clone, Default)]
pub struct ServerTotals {
    /// Attempts by the status the server (or Weir for it) answered; latency to the
    /// response head.
    pub traffic: Traffic,
    /// Requests (TCP: connections) on it now.
    pub in_flight: u64,
    pub connect_errors: u64,
}

/// The totals of `snapshot`'s objects, summed over all workers.
pub fn totals(metrics: &Metrics, snapshot: &Snapshot) -> Totals {
    let walk = Walk {
        shards: metrics.shards(),
        slots: &snapshot.slots,
    };
    let config = &snapshot.config;
    Totals {
        listeners: (0..config.listeners.len())
            .map(|li| walk.listener_totals(li, config.listeners[li].routes.len()))
            .collect(),
        upstreams: (0..config.upstreams.len())
            .map(|ui| walk.upstream_totals(ui, config.upstreams[ui].servers.len()))
            .collect(),
    }
}

struct Walk<'a> {
    shards: Vec<Arc<WorkerMetrics>>,
    slots: &'a SlotMap,
}

impl ShardWalk for Walk<'_> {
    fn shards(&self) -> &[Arc<WorkerMetrics>] {
        &self.shards
    }

    fn slots(&self) -> &SlotMap {
        self.slots
    }
}

impl Walk<'_> {
    fn listener_totals(&self, li: usize, routes: usize) -> ListenerTotals {
        let routes: Vec<Traffic> = (0..=routes).map(|ri| self.route_traffic(li, ri)).collect();
        let mut traffic = Traffic::default();
        routes.iter().for_each(|r| traffic.add(r));
        let http2 = HTTP2_FAMILIES
            .iter()
            .map(|(name, _, pick)| {
                let short = name.trim_start_matches("weir_http2_");
                (short, self.sum(|s| Some(pick(self.listener(s, li)?).get())))
            })
            .collect();
        ListenerTotals {
            traffic,
            routes,
            connections: self.sum(|s| Some(self.listener(s, li)?.connections_total.get())),
            active: self.sum(|s| Some(self.listener(s, li)?.connections_active.get())),
            http2,
        }
    }

    /// Every request counts once in its route's duration histogram (`proxy::record`), so
    /// the histogram's count is the request count; the 5xx come from the status table.
    fn route_traffic(&self, li: usize, ri: usize) -> Traffic {
        let mut t = Traffic::default();
        for s in &self.shards {
            let Some(route) = self.route(s, li, ri) else {
                continue;
            };
            for pi in 0..PROTOCOLS.len() {
                if !route.saw(pi) {
                    continue;
                }
                let h = route.duration(super::shard::Protocol::ALL[pi]);
                t.add_histogram(h);
                for mi in 0..METHODS.len() {
                    t.errors += ERROR_SLOTS
                        .map(|slot| route.requests(pi, mi, slot))
                        .sum::<u64>();
                }
            }
        }
        t.requests = t.latency.iter().sum();
        t
    }

    fn upstream_totals(&self, ui: usize, servers: usize) -> UpstreamTotals {
        let servers: Vec<ServerTotals> =
            (0..servers).map(|si| self.server_totals(ui, si)).collect();
        let mut traffic = Traffic::default();
        servers.iter().for_each(|s| traffic.add(&s.traffic));
        UpstreamTotals { traffic, servers }
    }

    fn server_totals(&self, ui: usize, si: usize) -> ServerTotals {
        let mut t = ServerTotals::default();
        for s in &self.shards {
            let Some(m) = self.server(s, ui, si) else {
                continue;
            };
            t.traffic.requests += (0..STATUS_SLOTS).map(|slot| m.requests(slot)).sum::<u64>();
            t.traffic.errors += ERROR_SLOTS.map(|slot| m.requests(slot)).sum::<u64>();
            t.traffic.add_histogram(&m.response);
            t.in_flight += m.in_flight.get();
            t.connect_errors += m.connect_errors.get();
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::metrics::layout::Layout;
    use crate::metrics::shard::{method_index, Protocol};

    const CONFIG: &str = "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\n\
        [[listeners.routes]]\nname = \"a\"\npath_prefix = \"/a\"\nupstream = \"u\"\n\
        [upstreams.u]\nservers = [{ addr = \"127.0.0.1:1\" }, { addr = \"127.0.0.1:2\" }]\n";

    #[test]
    fn totals_add_up_workers_routes_and_servers() {
        let config = weir_config::parse_str(CONFIG, "t.toml").unwrap();
        let slots = Layout::default().assign(&config);
        let shards: Vec<Arc<WorkerMetrics>> = (0..2)
            .map(|_| Arc::new(WorkerMetrics::new(&slots)))
            .collect();
        let no_route = slots.listeners[0].route(None);
        for (i, shard) in shards.iter().enumerate() {
            let l = shard.listener(slots.listeners[0].slot).unwrap();
            let route = l.route(slots.listeners[0].route(Some(0))).unwrap();
            route
                .request(Protocol::Http1, method_index(b"GET"), 200)
                .inc();
            route
                .duration(Protocol::Http1)
                .observe(Duration::from_millis(3));
            route
                .request(Protocol::Http2, method_index(b"POST"), 503)
                .inc();
            route
                .duration(Protocol::Http2)
                .observe(Duration::from_secs(60));
            l.route(no_route)
                .unwrap()
                .request(Protocol::Http1, 0, 404)
                .inc();
            l.route(no_route)
                .unwrap()
                .duration(Protocol::Http1)
                .observe(Duration::ZERO);
            l.http2.glitches.add(i as u64 + 1);
            let u = &slots.upstreams[0];
            let server = shard.server(u.slot, u.children[1]).unwrap();
            server.request(502).inc();
            server.request(200).inc();
            server.response.observe(Duration::from_millis(1));
            server.in_flight.inc();
        }
        let walk = Walk {
            shards,
            slots: &slots,
        };
        let l = walk.listener_totals(0, 1);
        assert_eq!((l.routes[1].requests, l.routes[1].errors), (4, 2));
        assert_eq!(l.routes[1].latency[3], 2, "3 ms: the 5 ms bucket");
        assert_eq!(
            l.routes[1].latency[BUCKETS - 1],
            2,
            "60 s: over the last bound"
        );
        assert_eq!((l.routes[0].requests, l.routes[0].errors), (2, 0));
        assert_eq!((l.traffic.requests, l.traffic.errors), (6, 2));
        assert!(l.http2.contains(&("glitches", 3)), "{:?}", l.http2);
        let u = walk.upstream_totals(0, 2);
        assert_eq!(u.servers[0].traffic, Traffic::default());
        let s = &u.servers[1];
        assert_eq!(
            (s.traffic.requests, s.traffic.errors, s.in_flight),
            (4, 2, 2)
        );
        assert_eq!(s.traffic.latency[1], 2);
        assert_eq!(u.traffic.requests, 4);
    }
}
