//! `GET /api/v1/stats`: every listener (with its routes) and upstream (with its servers)
//! of the running config, each with its numbers over the last [`WINDOW`] (`now`) and per
//! sample (`series`, only the samples after the client's `since`): requests per second,
//! the share of 5xx answers, and the 50th and 99th latency percentiles, estimated from the
//! histogram buckets as Prometheus' `histogram_quantile` does. Names, states and settings
//! come from the running snapshot, so a drain shows at once; numbers from the last sample.

use std::collections::VecDeque;
use std::time::Duration;

use serde_json::{json, Map, Value as Json};
use weir_config::{Config, Route, RouteTarget};
use weir_core::metrics::shard::LATENCY_BUCKETS;
use weir_core::metrics::totals::BUCKETS;
use weir_core::upstream::state::now_ms;
use weir_core::Proxy;

use super::ring::{Key, Point, Ring, Tick};
use crate::api::views::server_state;

/// What `now` covers: the samples of the last 10 seconds (at least one).
pub const WINDOW: Duration = Duration::from_secs(10);

pub fn stats(ring: &Ring, proxy: &Proxy, since: u64) -> Json {
    let settings = ring.settings.unwrap_or_default();
    let window = (WINDOW.as_millis() / settings.interval.as_millis().max(1)).max(1) as usize;
    let oldest = ring.ticks.front().map_or(ring.seq() + 1, |t| t.seq);
    let snapshot = proxy.snapshot();
    let config = &snapshot.config;
    let view = View {
        ring,
        since,
        window,
        config,
    };
    let listeners: Vec<Json> = config
        .listeners
        .iter()
        .map(|l| view.listener(l, proxy))
        .collect();
    let upstreams: Vec<Json> = config
        .upstreams
        .iter()
        .zip(&snapshot.upstreams)
        .map(|(u, plan)| view.upstream(u, plan))
        .collect();
    json!({
        "interval_ms": settings.interval.as_millis() as u64,
        "points": settings.points(),
        "window_s": WINDOW.as_secs(),
        "seq": ring.seq(),
        "from": oldest.max(since + 1),
        "at_ms": ring.ticks.back().map(|t| t.at_ms),
        "listeners": listeners,
        "upstreams": upstreams,
    })
}

struct View<'a> {
    ring: &'a Ring,
    since: u64,
    /// How many of the last samples `now` adds up.
    window: usize,
    config: &'a Config,
}

impl View<'_> {
    fn listener(&self, l: &weir_config::Listener, proxy: &Proxy) -> Json {
        let key = Key::Listener(l.name.clone());
        let latest = self.ring.latest(&key);
        let http2 = latest.filter(|_| l.tcp().is_none()).map(|c| {
            let map: Map<String, Json> = c
                .http2
                .iter()
                .map(|(n, v)| ((*n).into(), (*v).into()))
                .collect();
            Json::Object(map)
        });
        let mut routes: Vec<Json> = l
            .routes
            .iter()
            .map(|r| {
                let key = Key::Route(l.name.clone(), Some(r.name.clone()));
                let mut route = self.numbers(&key, false);
                route["name"] = r.name.clone().into();
                route["target"] = target(self.config, r).into();
                route
            })
            .collect();
        if l.tcp().is_none() {
            let mut unrouted = self.numbers(&Key::Route(l.name.clone(), None), false);
            unrouted["name"] = Json::Null;
            unrouted["target"] = "default response (no route matched)".into();
            routes.push(unrouted);
        }
        let mut listener = self.numbers(&key, true);
        let extra = json!({
            "name": l.name,
            "addr": proxy.listener_addr(&l.name).map(|a| a.to_string()),
            "kind": if l.tcp().is_some() { "tcp" } else { "http" },
            "tls": l.tls.is_some(),
            "open": latest.map(|c| c.open),
            "http2": http2,
            "routes": routes,
        });
        merge(&mut listener, extra);
        listener
    }

    fn upstream(
        &self,
        u: &weir_config::Upstream,
        plan: &weir_core::upstream::UpstreamPlan,
    ) -> Json {
        let now = now_ms();
        let servers: Vec<Json> = u
            .servers
            .iter()
            .zip(plan.servers.iter())
            .map(|(s, state)| {
                let key = Key::Server(u.name.clone(), s.name.clone());
                let latest = self.ring.latest(&key);
                let mut server = self.numbers(&key, false);
                let extra = json!({
                    "addr": s.name,
                    "state": server_state(s, state, now),
                    "weight": s.weight,
                    "backup": s.backup,
                    "drain": s.drain,
                    "in_flight": latest.map(|c| c.open),
                    "connect_errors": latest.map(|c| c.connect_errors),
                });
                merge(&mut server, extra);
                server
            })
            .collect();
        let mut upstream = self.numbers(&Key::Upstream(u.name.clone()), false);
        merge(
            &mut upstream,
            json!({"name": u.name, "lb": u.lb.as_str(), "servers": servers}),
        );
        upstream
    }

    /// `{"requests", "errors", "now": {...}, "series": {...}}` of one object: its totals
    /// since start (as of the last sample), its rates (`cps`: with new connections per
    /// second, for listeners).
    fn numbers(&self, key: &Key, cps: bool) -> Json {
        let empty = VecDeque::new();
        let points = self.ring.series.get(key).unwrap_or(&empty);
        let ticks = &self.ring.ticks;
        // A series is aligned with the newest ticks; the ticks before its first point were
        // idle ones (`Ring::record` keeps no zeros in front).
        let zero = Point::default();
        let idle = std::iter::repeat_n(&zero, ticks.len().saturating_sub(points.len()));
        let pairs: Vec<(&Tick, &Point)> = ticks.iter().zip(idle.chain(points)).collect();
        let recent = &pairs[pairs.len().saturating_sub(self.window)..];
        let now = (!recent.is_empty()).then(|| Sum::of(recent).rates(cps));
        let mut series: Map<String, Json> = Map::new();
        for (t, p) in pairs.iter().filter(|(t, _)| t.seq > self.since) {
            let rates = Sum::of(&[(*t, *p)]).rates(cps);
            for (name, value) in rates.as_object().into_iter().flatten() {
                let column = series.entry(name.clone()).or_insert_with(|| json!([]));
                if let Some(c) = column.as_array_mut() {
                    c.push(value.clone());
                }
            }
        }
        let latest = self.ring.latest(key).map(|c| &c.traffic);
        json!({
            "requests": latest.map(|t| t.requests),
            "errors": latest.map(|t| t.errors),
            "now": now,
            "series": series,
        })
    }
}

/// Points added up over their intervals.
#[derive(Default)]
struct Sum {
    secs: f64,
    requests: u64,
    errors: u64,
    connections: u64,
    latency: [u64; BUCKETS],
}

impl Sum {
    fn of(pairs: &[(&Tick, &Point)]) -> Sum {
        let mut sum = Sum::default();
        for (t, p) in pairs {
            sum.secs += t.secs;
            sum.requests += u64::from(p.requests);
            sum.errors += u64::from(p.errors);
            sum.connections += u64::from(p.connections);
            for (a, b) in sum.latency.iter_mut().zip(p.latency) {
                *a += u64::from(b);
            }
        }
        sum
    }

    /// `rps`, `error_rate` (5xx share, `null` without requests), `p50_ms`, `p99_ms`
    /// (`null` without requests), and `cps` if asked.
    fn rates(&self, cps: bool) -> Json {
        let per_sec = |n: u64| round(n as f64 / self.secs.max(1e-3), 2);
        let error_rate =
            (self.requests > 0).then(|| round(self.errors as f64 / self.requests as f64, 4));
        let mut rates = json!({
            "rps": per_sec(self.requests),
            "error_rate": error_rate,
            "p50_ms": quantile_ms(&self.latency, 0.5),
            "p99_ms": quantile_ms(&self.latency, 0.99),
        });
        if cps {
            rates["cps"] = per_sec(self.connections).into();
        }
        rates
    }
}

/// The `q` quantile of a latency histogram in milliseconds, by linear interpolation inside
/// its bucket (the first starts at 0); one in the bucket above the last bound is that bound.
/// `None` when it is empty.
pub fn quantile_ms(latency: &[u64; BUCKETS], q: f64) -> Option<f64> {
    let total: u64 = latency.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let (mut below, mut lower) = (0.0, 0.0);
    for (i, &n) in latency.iter().enumerate() {
        let upper = LATENCY_BUCKETS.get(i).copied();
        let n = n as f64;
        if n > 0.0 && below + n >= rank {
            let at = upper.map_or(lower, |u| lower + (u - lower) * (rank - below) / n);
            return Some(round(at * 1000.0, 3));
        }
        below += n;
        lower = upper.unwrap_or(lower);
    }
    Some(round(lower * 1000.0, 3))
}

/// What a route does, in a few words: its upstream, its split, or a local answer.
fn target(config: &Config, route: &Route) -> String {
    let name = |u: usize| config.upstreams.get(u).map_or("?", |u| u.name.as_str());
    match &route.target {
        RouteTarget::Upstream(u) => name(*u).to_string(),
        RouteTarget::Split(pools) => pools
            .iter()
            .map(|w| format!("{} (weight {})", name(w.upstream), w.weight))
            .collect::<Vec<_>>()
            .join(", "),
        RouteTarget::Respond(_) => "local response".to_string(),
        RouteTarget::Redirect(_) => "redirect".to_string(),
        RouteTarget::Files(files) => format!("files {}", files.root.display()),
    }
}

fn merge(into: &mut Json, from: Json) {
    if let (Some(into), Json::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
}

fn round(x: f64, decimals: i32) -> f64 {
    let f = 10f64.powi(decimals);
    (x * f).round() / f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        let mut latency = [0u64; BUCKETS];
        assert_eq!(quantile_ms(&latency, 0.5), None);
        // 100 requests between 5 and 10 ms (bucket 4: 0.005..0.01).
        latency[4] = 100;
        assert_eq!(quantile_ms(&latency, 0.5), Some(7.5));
        assert_eq!(quantile_ms(&latency, 0.99), Some(9.95));
        // One more over the last bound (10 s): p99 is still in the 5-10 ms bucket.
        latency[BUCKETS - 1] = 1;
        assert!(quantile_ms(&latency, 0.99).unwrap() <= 10.0);
        latency[4] = 1;
        assert_eq!(
            quantile_ms(&latency, 0.99),
            Some(10_000.0),
            "the last bound"
        );
        // The first bucket starts at 0.
        let mut fast = [0u64; BUCKETS];
        fast[0] = 4;
        assert_eq!(quantile_ms(&fast, 0.5), Some(0.25));
    }
}
