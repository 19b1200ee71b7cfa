//! The scrape: merging shards and writing Prometheus text with `prometheus-client`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use weir_config::Config;

use super::cluster::{DiscoveryStats, RedisStats};
use super::layout::SlotMap;
use super::process::ProcessStats;
use super::shard::{
    AbortReason, Counter, DefaultReason, Histogram, ListenerMetrics, Protocol, TlsFailure,
    WorkerMetrics, ACCEPT_ERRORS, LATENCY_BUCKETS, METHODS, PROTOCOLS, STATUS_SLOTS, TLS_VERSIONS,
};
use super::view::ShardWalk;
use super::Metrics;
use crate::snapshot::Snapshot;
use crate::tcp::sni::SniResult;

/// One counter of a listener's metrics.
pub(super) type PickCounter = fn(&ListenerMetrics) -> &Counter;

/// Renders all metrics of the objects in `snapshot`'s config in the Prometheus text format.
pub fn encode_text(metrics: &Metrics, snapshot: &Snapshot) -> String {
    let collector = Scrape {
        shards: metrics.shards(),
        config: (*snapshot.config).clone(),
        slots: snapshot.slots.clone(),
        dropped: metrics.dropped_log_lines(),
        etcd: metrics.etcd.clone(),
        up: up_table(snapshot),
        certs: cert_table(snapshot),
        renewals: renewal_table(snapshot),
        redis: metrics.cluster.redis(),
        discovery: metrics.cluster.discovery(),
        caches: super::cache::rows(snapshot),
    };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(collector));
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out.clear();
        let _ = writeln!(out, "# encoding metrics failed");
    }
    out
}

fn up_table(snapshot: &Snapshot) -> Vec<Vec<bool>> {
    snapshot
        .upstreams
        .iter()
        .map(|u| u.servers.iter().map(|s| s.up.load(Relaxed)).collect())
        .collect()
}

/// `(listener index, names joined by ",", not-after)` of every certificate in use.
fn cert_table(snapshot: &Snapshot) -> Vec<(usize, String, i64)> {
    let mut rows = Vec::new();
    for (li, plan) in snapshot.listeners.iter().enumerate() {
        for cert in plan.tls.iter().flat_map(|t| t.store.certs()) {
            rows.push((li, cert.facts.names.join(","), cert.facts.not_after));
        }
        let auto = plan.tls.as_ref().and_then(|t| t.store.auto());
        if let Some(cert) = auto.and_then(|a| a.current()) {
            rows.push((li, cert.facts.names.join(","), cert.facts.not_after));
        }
    }
    rows
}

/// `(listener index, names, renewal time)` of every automatic certificate in use.
fn renewal_table(snapshot: &Snapshot) -> Vec<(usize, String, i64)> {
    let mut rows = Vec::new();
    for (li, plan) in snapshot.listeners.iter().enumerate() {
        let Some(auto) = plan.tls.as_ref().and_then(|t| t.store.auto()) else {
            continue;
        };
        if let Some(at) = auto.status().renew_at {
            rows.push((li, auto.names.join(","), at));
        }
    }
    rows
}

#[derive(Debug)]
struct Scrape {
    shards: Vec<std::sync::Arc<WorkerMetrics>>,
    config: Config,
    /// Where each object of `config` counts in the shards.
    slots: SlotMap,
    dropped: u64,
    up: Vec<Vec<bool>>,
    certs: Vec<(usize, String, i64)>,
    renewals: Vec<(usize, String, i64)>,
    etcd: std::sync::Arc<super::etcd::EtcdMetrics>,
    redis: BTreeMap<String, RedisStats>,
    discovery: BTreeMap<String, DiscoveryStats>,
    caches: Vec<super::cache::StoreRow>,
}

/// `weir_http2_*`: HTTP/2 connections, streams, client resets and GOAWAYs for calm, the
/// defence counters (name, help, counter); the dashboard shows them too (`totals`).
pub(super) const HTTP2_FAMILIES: [(&str, &str, PickCounter); 7] = [
    ("weir_http2_connections", "Client connections that spoke HTTP/2 (h2c, or h2 through ALPN on TLS).", |m| &m.http2.connections),
    ("weir_http2_streams", "HTTP/2 streams (requests) served.", |m| &m.http2.streams),
    ("weir_http2_client_resets", "HTTP/2 streams the client reset while in flight; each cancelled its upstream request.", |m| &m.http2.client_resets),
    ("weir_http2_calm_goaways", "HTTP/2 connections closed with GOAWAY ENHANCE_YOUR_CALM (a reset or glitch budget exceeded).", |m| &m.http2.calm_goaways),
    ("weir_http2_forced_resets", "HTTP/2 streams Weir reset because of the client's error on them (MadeYouReset).", |m| &m.http2.forced_resets),
    ("weir_http2_glitches", "HTTP/2 client frames that carried no request (SETTINGS, PING, empty DATA, unexplained WINDOW_UPDATE, PRIORITY, unknown).", |m| &m.http2.glitches),
    ("weir_http2_stalled", "HTTP/2 connections closed because their writes made no progress for stall_timeout.", |m| &m.http2.stalled),
];

/// `weir_http3_*`: QUIC handshakes and their failures, refusals, Retry packets, streams
/// and packet statistics per listener (name, help, counter).
#[rustfmt::skip]
pub(super) const HTTP3_FAMILIES: [(&str, &str, PickCounter); 13] = [
    ("weir_http3_handshakes", "QUIC handshakes completed (HTTP/3 connections).", |m| &m.http3.handshakes),
    ("weir_http3_handshake_failures", "QUIC handshakes that failed (TLS or transport error, client gone).", |m| &m.http3.handshake_failures),
    ("weir_http3_handshake_timeouts", "QUIC handshakes not finished within handshake_timeout.", |m| &m.http3.handshake_timeouts),
    ("weir_http3_handshake_evictions", "QUIC handshakes closed at max_handshakes to make room for a new one (the idlest).", |m| &m.http3.handshake_evictions),
    ("weir_http3_refused", "QUIC connection attempts refused (at max_connections with no idle connection giving way within handshake_timeout, or while draining).", |m| &m.http3.refused),
    ("weir_http3_retries", "QUIC Retry packets sent (address validation above retry_threshold handshakes per second).", |m| &m.http3.retries),
    ("weir_http3_streams", "HTTP/3 request streams served.", |m| &m.http3.streams),
    ("weir_http3_client_resets", "HTTP/3 request streams the client reset or stopped (RESET_STREAM, STOP_SENDING) before the response ended.", |m| &m.http3.client_resets),
    ("weir_http3_glitches", "HTTP/3 client actions that carried no request (unidirectional streams past the three needed, control-stream frames after SETTINGS).", |m| &m.http3.glitches),
    ("weir_http3_excessive_load_closes", "HTTP/3 connections closed with H3_EXCESSIVE_LOAD (a reset or glitch budget exceeded).", |m| &m.http3.excessive_load_closes),
    ("weir_http3_sent_packets", "QUIC packets sent (counted when each connection closes).", |m| &m.http3.sent_packets),
    ("weir_http3_lost_packets", "QUIC packets declared lost and retransmitted (counted when each connection closes).", |m| &m.http3.lost_packets),
    ("weir_http3_congestion_events", "QUIC congestion events (counted when each connection closes).", |m| &m.http3.congestion_events),
];

pub(super) type Result = std::result::Result<(), std::fmt::Error>;

/// Label pairs of one series.
pub(super) type Labels = Vec<(&'static str, String)>;

impl Scrape {
    /// Automatic certificates: ACME orders by result, failed attempts, renewal times.
    fn acme(&self, enc: &mut DescriptorEncoder) -> Result {
        use crate::tls::auto::{ORDERS_FAILED, ORDERS_VALID, RENEWAL_FAILURES};
        let orders = [("valid", &ORDERS_VALID), ("failed", &ORDERS_FAILED)]
            .map(|(result, n)| (vec![("result", result.to_owned())], n.load(Relaxed)));
        counter(
            enc,
            "weir_acme_orders",
            "ACME orders completed, by result.",
            &orders,
        )?;
        use crate::tls::auto::shared::{INSTALLS, LOCK_WAITS};
        #[rustfmt::skip]
        unlabelled(enc, &[
            ("weir_acme_renewal_failures", "Failed attempts to obtain or renew an automatic certificate.", RENEWAL_FAILURES.load(Relaxed)),
            ("weir_acme_fleet_lock_waits", "Attempts to order a certificate that found another fleet instance holding its lock.", LOCK_WAITS.load(Relaxed)),
            ("weir_acme_fleet_installs", "Certificates installed from another fleet instance's order.", INSTALLS.load(Relaxed)),
        ])?;
        let renewals: Vec<(Labels, i64)> = self
            .renewals
            .iter()
            .map(|(li, names, at)| {
                let listener = ("listener", self.config.listeners[*li].name.clone());
                (vec![listener, ("names", names.clone())], *at)
            })
            .collect();
        gauge(
            enc,
            "weir_certificate_next_renewal_timestamp_seconds",
            "When each automatic certificate is due for renewal (Unix time).",
            &renewals,
        )
    }
}

/// The `result="ok"` and `result="error"` series of each named item (`(ok, error)`
/// counts), labelled `key="NAME"`.
fn by_result<S>(
    items: &[(&String, &S)],
    key: &'static str,
    counts: fn(&S) -> (u64, u64),
) -> Vec<(Labels, u64)> {
    items
        .iter()
        .flat_map(|(name, s)| {
            let (ok, error) = counts(s);
            [("ok", ok), ("error", error)].map(|(result, n)| {
                let labels = vec![(key, (*name).clone()), ("result", result.to_owned())];
                (labels, n)
            })
        })
        .collect()
}

impl Scrape {
    /// Redis syncs and DNS discovery, for the names in the running config.
    fn cluster(&self, enc: &mut DescriptorEncoder) -> Result {
        let redis: Vec<(&String, &RedisStats)> = self
            .redis
            .iter()
            .filter(|(name, _)| self.config.cluster.redis(name).is_some())
            .collect();
        let label = |name: &String| vec![("redis", name.clone())];
        let syncs = by_result(&redis, "redis", |s| (s.syncs_ok, s.syncs_failed));
        counter(
            enc,
            "weir_redis_syncs",
            "Syncs of shared rate-limit counts with each [cluster.redis.NAME], by result.",
            &syncs,
        )?;
        let up: Vec<(Labels, i64)> = redis
            .iter()
            .map(|(name, s)| (label(name), i64::from(s.up)))
            .collect();
        gauge(
            enc,
            "weir_redis_up",
            "Whether the last sync with each [cluster.redis.NAME] succeeded (1) or failed (0).",
            &up,
        )?;
        self.discovery(enc)
    }

    fn discovery(&self, enc: &mut DescriptorEncoder) -> Result {
        let pools: Vec<(&String, &DiscoveryStats)> = self
            .discovery
            .iter()
            .filter(|(name, _)| {
                let upstream = self.config.upstreams.iter().find(|u| &u.name == *name);
                upstream.is_some_and(|u| u.discover.is_some())
            })
            .collect();
        let label = |name: &String| vec![("upstream", name.clone())];
        let lookups = by_result(&pools, "upstream", |s| (s.lookups_ok, s.lookups_failed));
        counter(
            enc,
            "weir_discovery_lookups",
            "DNS lookups of each discovered upstream, by result (an error or an empty answer keeps the last servers).",
            &lookups,
        )?;
        let rows = |f: fn(&DiscoveryStats) -> u64| -> Vec<(Labels, u64)> {
            pools.iter().map(|(name, s)| (label(name), f(s))).collect()
        };
        counter(
            enc,
            "weir_discovery_updates",
            "Lookups whose answer changed the upstream's servers.",
            &rows(|s| s.updates),
        )?;
        let servers: Vec<(Labels, i64)> = rows(|s| s.servers)
            .into_iter()
            .map(|(l, n)| (l, n as i64))
            .collect();
        gauge(
            enc,
            "weir_discovery_servers",
            "Servers of each discovered upstream now (from the last answer kept).",
            &servers,
        )?;
        let mut m = enc.encode_descriptor(
            "weir_discovery_last_success_timestamp_seconds",
            "When each discovered upstream's last successful lookup was (Unix time; 0: none yet).",
            None,
            MetricType::Gauge,
        )?;
        for (name, s) in &pools {
            ConstGauge::new(s.last_success).encode(m.encode_family(&label(name))?)?;
        }
        Ok(())
    }
}

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result {
        self.requests(&mut enc)?;
        self.aborted(&mut enc)?;
        self.durations(&mut enc)?;
        self.rate_limited(&mut enc)?;
        self.compressed(&mut enc)?;
        self.listener_counters(&mut enc)?;
        self.tunnel_timeouts(&mut enc)?;
        self.http2_counters(&mut enc)?;
        self.tls(&mut enc)?;
        self.acme(&mut enc)?;
        self.cluster(&mut enc)?;
        super::cache::encode(&mut enc, &self.caches)?;
        self.upstream_counters(&mut enc)?;
        self.upstream_histograms(&mut enc)?;
        self.etcd(&mut enc)?;
        self.tracing(&mut enc)?;
        self.process(&mut enc)
    }
}

pub(super) fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, u64)],
) -> Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

/// Counter families of one series without labels each: (name, help, value).
fn unlabelled(enc: &mut DescriptorEncoder, families: &[(&str, &str, u64)]) -> Result {
    for (name, help, v) in families {
        counter(enc, name, help, &[(Vec::new(), *v)])?;
    }
    Ok(())
}

pub(super) fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, i64)],
) -> Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn histogram(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, Vec<&Histogram>)],
) -> Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, parts) in rows {
        let (mut sum, mut count, mut per_bucket) = (0.0, 0, [0u64; LATENCY_BUCKETS.len()]);
        for h in parts {
            h.merge_into(&mut sum, &mut count, &mut per_bucket);
        }
        // prometheus-client accumulates the buckets itself: pass per-bucket counts.
        let mut buckets: Vec<(f64, u64)> =
            LATENCY_BUCKETS.iter().copied().zip(per_bucket).collect();
        let overflow = count.saturating_sub(per_bucket.iter().sum());
        buckets.push((f64::INFINITY, overflow));
        m.encode_family(labels)?
            .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
    }
    Ok(())
}

fn status_label(slot: usize) -> String {
    if slot == STATUS_SLOTS - 1 {
        "other".to_string()
    } else {
        (slot + 100).to_string()
    }
}

fn route_label(config: &Config, listener: usize, route: usize) -> String {
    match route {
        0 => "default".to_string(),
        r => config.listeners[listener].routes[r - 1].name.clone(),
    }
}

impl ShardWalk for Scrape {
    fn shards(&self) -> &[std::sync::Arc<WorkerMetrics>] {
        &self.shards
    }

    fn slots(&self) -> &SlotMap {
        &self.slots
    }
}

impl Scrape {
    fn requests(&self, enc: &mut DescriptorEncoder) -> Result {
        let mut rows = Vec::new();
        for (li, l) in self.config.listeners.iter().enumerate() {
            for ri in 0..=l.routes.len() {
                for (pi, protocol) in PROTOCOLS.iter().enumerate() {
                    if !self.saw(li, ri, pi) {
                        continue;
                    }
                    for (mi, method) in METHODS.iter().enumerate() {
                        for slot in 0..STATUS_SLOTS {
                            let v =
                                self.sum(|s| Some(self.route(s, li, ri)?.requests(pi, mi, slot)));
                            if v > 0 {
                                let labels = vec![
                                    ("listener", l.name.clone()),
                                    ("route", route_label(&self.config, li, ri)),
                                    ("method", method.to_string()),
                                    ("code", status_label(slot)),
                                    ("protocol", protocol.to_string()),
                                ];
                                rows.push((labels, v));
                            }
                        }
                    }
                }
            }
        }
        counter(
            enc,
            "weir_requests",
            "Requests answered, by listener, route, method, status code and client protocol.",
            &rows,
        )
    }

    fn aborted(&self, enc: &mut DescriptorEncoder) -> Result {
        let mut rows = Vec::new();
        for (li, l) in self.config.listeners.iter().enumerate() {
            for ri in 0..=l.routes.len() {
                for protocol in Protocol::ALL {
                    for reason in AbortReason::ALL {
                        let v = self
                            .sum(|s| Some(self.route(s, li, ri)?.aborted(protocol, reason).get()));
                        if v > 0 {
                            let labels = vec![
                                ("listener", l.name.clone()),
                                ("route", route_label(&self.config, li, ri)),
                                ("reason", reason.label().to_string()),
                                ("protocol", protocol.label().to_string()),
                            ];
                            rows.push((labels, v));
                        }
                    }
                }
            }
        }
        counter(
            enc,
            "weir_responses_aborted",
            "Responses cut short after their head was sent, by reason and client protocol (also \
             counted in weir_requests_total with the status sent).",
            &rows,
        )
    }

    /// Every route has an HTTP/1.1 row, zero until its first request (as before the
    /// `protocol` label: a histogram row per route); its HTTP/2.0 row appears as its
    /// `weir_requests_total` series do, once an HTTP/2 request came.
    fn durations(&self, enc: &mut DescriptorEncoder) -> Result {
        let mut rows = Vec::new();
        for (li, l) in self.config.listeners.iter().enumerate() {
            for ri in 0..=l.routes.len() {
                for protocol in Protocol::ALL {
                    if !self.saw(li, ri, protocol as usize) {
                        continue;
                    }
                    let parts = self
                        .shards
                        .iter()
                        .filter_map(|s| Some(self.route(s, li, ri)?.duration(protocol)))
                        .collect();
                    rows.push((
                        vec![
                            ("listener", l.name.clone()),
                            ("route", route_label(&self.config, li, ri)),
                            ("protocol", protocol.label().to_string()),
                        ],
                        parts,
                    ));
                }
            }
        }
        histogram(
            enc,
            "weir_request_duration_seconds",
            "Time from a complete request head to the end of the response, by client protocol.",
            &rows,
        )
    }

    /// Routes with a `rate_limit` only: an HTTP/1.1 row (zero until the first refusal), and
    /// an HTTP/2.0 one once the route saw an HTTP/2 request (as `weir_requests_total`).
    fn rate_limited(&self, enc: &mut DescriptorEncoder) -> Result {
        let mut rows = Vec::new();
        for (li, l) in self.config.listeners.iter().enumerate() {
            for (r, route) in l.routes.iter().enumerate() {
                if route.filters.rate_limit.is_none() {
                    continue;
                }
                for protocol in Protocol::ALL {
                    if !self.saw(li, r + 1, protocol as usize) {
                        continue;
                    }
                    let v =
                        self.sum(|s| Some(self.route(s, li, r + 1)?.rate_limited(protocol).get()));
                    let labels = vec![
                        ("listener", l.name.clone()),
                        ("route", route.name.clone()),
                        ("protocol", protocol.label().to_string()),
                    ];
                    rows.push((labels, v));
                }
            }
        }
        counter(
            enc,
            "weir_rate_limited",
            "Requests refused with 429 by a route's rate_limit, by listener, route and client \
             protocol.",
            &rows,
        )
    }

    /// Routes with `compression` only: body bytes in and out per algorithm.
    fn compressed(&self, enc: &mut DescriptorEncoder) -> Result {
        let mut rows = Vec::new();
        for (li, l) in self.config.listeners.iter().enumerate() {
            for (r, route) in l.routes.iter().enumerate() {
                let Some(c) = &route.filters.compression else {
                    continue;
                };
                for e in &c.algorithms {
                    let i = e.index();
                    for (dir, pick) in [("in", 0), ("out", 1)] {
                        let v = self.sum(|s| {
                            let m = self.route(s, li, r + 1)?;
                            Some([&m.compressed_in, &m.compressed_out][pick][i].get())
                        });
                        let labels = vec![
                            ("listener", l.name.clone()),
                            ("route", route.name.clone()),
                            ("algorithm", e.token().to_string()),
                            ("direction", dir.to_string()),
                        ];
                        rows.push((labels, v));
                    }
                }
            }
        }
        counter(
            enc,
            "weir_compression_bytes",
            "Response body bytes a route's compression read (in) and sent (out), by listener, route and algorithm.",
            &rows,
        )
    }

    /// `weir_tunnel_timeouts_total`: tunnels and TCP relays a still-time bound closed.
    fn tunnel_timeouts(&self, enc: &mut DescriptorEncoder) -> Result {
        let mut rows = vec![];
        for (li, l) in self.config.listeners.iter().enumerate() {
            for (i, reason) in ["idle", "fin"].into_iter().enumerate() {
                let v = self.sum(|s| Some(self.listener(s, li)?.tunnel_timeouts[i].get()));
                let labels = vec![("listener", l.name.clone()), ("reason", reason.to_string())];
                rows.push((labels, v));
            }
        }
        counter(
            enc,
            "weir_tunnel_timeouts",
            "Tunnels (Upgrade, RFC 8441) and TCP connections closed because nothing moved for the idle bound, or for the fin bound after one side half-closed.",
            &rows,
        )
    }

    fn listener_counters(&self, enc: &mut DescriptorEncoder) -> Result {
        let (mut defaults, mut active, mut accept, mut bytes, mut sni) =
            (vec![], vec![], vec![], vec![], vec![]);
        for (li, l) in self.config.listeners.iter().enumerate() {
            let name = || ("listener", l.name.clone());
            for reason in DefaultReason::ALL {
                let v = self.sum(|s| Some(self.listener(s, li)?.default_response(reason).get()));
                defaults.push((vec![name(), ("reason", reason.label().to_string())], v));
            }
            active.push((
                vec![name()],
                self.sum(|s| Some(self.listener(s, li)?.connections_active.get())) as i64,
            ));
            for (ki, kind) in ACCEPT_ERRORS.iter().enumerate() {
                let v = self.sum(|s| Some(self.listener(s, li)?.accept_errors[ki].get()));
                accept.push((vec![name(), ("kind", kind.to_string())], v));
            }
            let picks: [(&str, PickCounter); 2] =
                [("in", |m| &m.bytes_in), ("out", |m| &m.bytes_out)];
            for (direction, pick) in picks {
                let v = self.sum(|s| Some(pick(self.listener(s, li)?).get()));
                bytes.push((vec![name(), ("direction", direction.to_string())], v));
            }
            if l.tcp().is_some_and(|t| !t.sni_routes.is_empty()) {
                for result in SniResult::ALL {
                    sni.push((
                        vec![name(), ("result", result.label().to_string())],
                        self.sum(|s| Some(self.listener(s, li)?.sni[result as usize].get())),
                    ));
                }
            }
        }
        counter(
            enc,
            "weir_default_responses",
            "Responses Weir generated itself, by reason.",
            &defaults,
        )?;
        gauge(
            enc,
            "weir_connections_active",
            "Open client connections.",
            &active,
        )?;
        counter(
            enc,
            "weir_accept_errors",
            "Failed accepts, by kind (EMFILE: out of file descriptors).",
            &accept,
        )?;
        counter(
            enc,
            "weir_bytes",
            "Bytes received from (in) and sent to (out) clients.",
            &bytes,
        )?;
        counter(
            enc,
            "weir_tcp_sni",
            "TCP connections of listeners with sni_routes, by how the ClientHello was routed.",
            &sni,
        )?;
        self.per_listener(enc, &[
            ("weir_connections", "Client connections accepted.", |m| &m.connections_total),
            ("weir_accept_paused", "Times a worker stopped accepting because the listener had max_connections open (and, on HTTP listeners, no idle connection on the worker to close for the new one).", |m| &m.accept_paused),
            ("weir_connections_evicted", "Idle client connections (waiting for a request, an HTTP/2 or HTTP/3 connection with no stream open, or in their TLS or QUIC handshake) closed at max_connections to make room for a new one.", |m| &m.connections_evicted),
            ("weir_proxy_protocol_rejected", "Connections closed for a missing, malformed or untrusted PROXY header.", |m| &m.proxy_rejected),
        ])?;
        let dropped = vec![(vec![], self.dropped)];
        counter(
            enc,
            "weir_access_log_dropped",
            "Access-log lines dropped because the writer fell behind.",
            &dropped,
        )
    }

    /// `weir_tracing_*`: the span exporter's counts (only with `[tracing]`).
    fn tracing(&self, enc: &mut DescriptorEncoder) -> Result {
        use std::sync::atomic::Ordering::Relaxed;
        if self.config.tracing.is_none() {
            return Ok(());
        }
        let s = &crate::otel::export::STATS;
        let exported = vec![(vec![], s.exported.load(Relaxed))];
        counter(
            enc,
            "weir_tracing_spans_exported",
            "Spans the collector accepted.",
            &exported,
        )?;
        let dropped = vec![
            (
                vec![("reason", "queue_full".to_owned())],
                s.dropped_queue_full.load(Relaxed),
            ),
            (
                vec![("reason", "export_failed".to_owned())],
                s.dropped_export_failed.load(Relaxed),
            ),
        ];
        counter(
            enc,
            "weir_tracing_spans_dropped",
            "Spans not exported: the queue was full (the collector slow or down), or their export request failed.",
            &dropped,
        )
    }

    /// `weir_http2_*` ([`HTTP2_FAMILIES`]) per listener. Separate series, so the request
    /// series keep their labels.
    fn http2_counters(&self, enc: &mut DescriptorEncoder) -> Result {
        self.per_listener(enc, &HTTP2_FAMILIES)?;
        self.per_listener(enc, &HTTP3_FAMILIES)
    }

    /// Counter families whose only label is the listener: name, help, and the counter.
    fn per_listener(
        &self,
        enc: &mut DescriptorEncoder,
        families: &[(&str, &str, PickCounter)],
    ) -> Result {
        for (name, help, pick) in families {
            let rows: Vec<_> = self
                .config
                .listeners
                .iter()
                .enumerate()
                .map(|(li, l)| {
                    let v = self.sum(|s| Some(pick(self.listener(s, li)?).get()));
                    (vec![("listener", l.name.clone())], v)
                })
                .collect();
            counter(enc, name, help, &rows)?;
        }
        Ok(())
    }

    /// Handshakes and certificate expiry of the listeners that terminate TLS.
    fn tls(&self, enc: &mut DescriptorEncoder) -> Result {
        let (mut handshakes, mut failures) = (vec![], vec![]);
        for (li, l) in self.config.listeners.iter().enumerate() {
            if l.tls.is_none() {
                continue;
            }
            let name = || ("listener", l.name.clone());
            let row = |version: &str, result: &str, v| {
                let labels = vec![
                    name(),
                    ("version", version.into()),
                    ("result", result.into()),
                ];
                (labels, v)
            };
            for (vi, version) in TLS_VERSIONS.iter().enumerate() {
                for (ri, result) in ["full", "resumed"].iter().enumerate() {
                    let v =
                        self.sum(|s| Some(self.listener(s, li)?.tls_handshakes[2 * vi + ri].get()));
                    handshakes.push(row(version, result, v));
                }
            }
            let mut failed = 0;
            for reason in TlsFailure::ALL {
                let v =
                    self.sum(|s| Some(self.listener(s, li)?.tls_failures[reason as usize].get()));
                failed += v;
                failures.push((vec![name(), ("reason", reason.label().to_string())], v));
            }
            handshakes.push(row("unknown", "failed", failed));
        }
        if handshakes.is_empty() {
            return Ok(());
        }
        counter(
            enc,
            "weir_tls_handshakes",
            "TLS handshakes: completed (full or resumed, by version) and failed.",
            &handshakes,
        )?;
        counter(
            enc,
            "weir_tls_handshake_failures",
            "Failed TLS handshakes, by reason.",
            &failures,
        )?;
        let expiry: Vec<(Labels, i64)> = self
            .certs
            .iter()
            .map(|(li, names, not_after)| {
                let listener = ("listener", self.config.listeners[*li].name.clone());
                (vec![listener, ("names", names.clone())], *not_after)
            })
            .collect();
        gauge(
            enc,
            "weir_tls_certificate_expiry_timestamp_seconds",
            "When each certificate in use expires (Unix time).",
            &expiry,
        )
    }

    fn upstream_counters(&self, enc: &mut DescriptorEncoder) -> Result {
        let (mut requests, mut up, mut retries, mut idle) = (vec![], vec![], vec![], vec![]);
        let (mut connect_errors, mut in_flight) = (vec![], vec![]);
        for (ui, u) in self.config.upstreams.iter().enumerate() {
            for (si, server) in u.servers.iter().enumerate() {
                let labels = || {
                    vec![
                        ("upstream", u.name.clone()),
                        ("server", server.name.clone()),
                    ]
                };
                self.server_requests(ui, si, labels, &mut requests);
                let is_up = self
                    .up
                    .get(ui)
                    .and_then(|s| s.get(si))
                    .copied()
                    .unwrap_or(true);
                up.push((labels(), i64::from(is_up)));
                idle.push((
                    labels(),
                    self.sum(|s| Some(self.server(s, ui, si)?.pool_idle.get())) as i64,
                ));
                connect_errors.push((
                    labels(),
                    self.sum(|s| Some(self.server(s, ui, si)?.connect_errors.get())),
                ));
                in_flight.push((
                    labels(),
                    self.sum(|s| Some(self.server(s, ui, si)?.in_flight.get())) as i64,
                ));
            }
            retries.push((
                vec![("upstream", u.name.clone())],
                self.sum(|s| Some(self.upstream(s, ui)?.retries.get())),
            ));
        }
        counter(
            enc,
            "weir_upstream_requests",
            "Responses received from upstream servers, by status code.",
            &requests,
        )?;
        gauge(
            enc,
            "weir_upstream_server_up",
            "1 if the server is considered up.",
            &up,
        )?;
        counter(
            enc,
            "weir_upstream_retries",
            "Requests retried on another connection or server.",
            &retries,
        )?;
        counter(
            enc,
            "weir_upstream_connect_errors",
            "Failed connection attempts to the server (refused, unreachable, timed out).",
            &connect_errors,
        )?;
        gauge(
            enc,
            "weir_upstream_pool_idle",
            "Idle pooled connections to the server, all workers.",
            &idle,
        )?;
        gauge(
            enc,
            "weir_upstream_in_flight",
            "Requests (TCP listeners: connections) sent to the server and not yet ended, all workers.",
            &in_flight,
        )
    }

    /// The `weir_upstream_requests` rows of server `si` of upstream `ui`, by status code.
    fn server_requests(
        &self,
        ui: usize,
        si: usize,
        labels: impl Fn() -> Labels,
        rows: &mut Vec<(Labels, u64)>,
    ) {
        for slot in 0..STATUS_SLOTS {
            let v = self.sum(|s| Some(self.server(s, ui, si)?.requests(slot)));
            if v > 0 {
                let mut l = labels();
                l.push(("code", status_label(slot)));
                rows.push((l, v));
            }
        }
    }

    fn upstream_histograms(&self, enc: &mut DescriptorEncoder) -> Result {
        let (mut connect, mut response) = (vec![], vec![]);
        for (ui, u) in self.config.upstreams.iter().enumerate() {
            for (si, server) in u.servers.iter().enumerate() {
                let labels = vec![
                    ("upstream", u.name.clone()),
                    ("server", server.name.clone()),
                ];
                connect.push((
                    labels.clone(),
                    self.shards
                        .iter()
                        .filter_map(|s| Some(&self.server(s, ui, si)?.connect))
                        .collect(),
                ));
                response.push((
                    labels,
                    self.shards
                        .iter()
                        .filter_map(|s| Some(&self.server(s, ui, si)?.response))
                        .collect(),
                ));
            }
        }
        histogram(
            enc,
            "weir_upstream_connect_duration_seconds",
            "Time to open a new upstream connection.",
            &connect,
        )?;
        histogram(
            enc,
            "weir_upstream_response_duration_seconds",
            "Time from sending the request to the response head.",
            &response,
        )
    }

    /// `weir_cluster_*`: a fleet member's view of etcd (only on a member).
    fn etcd(&self, enc: &mut DescriptorEncoder) -> Result {
        let e = &self.etcd;
        if !e.enabled.load(Relaxed) {
            return Ok(());
        }
        let revisions = [
            (
                vec![("state", "applied".to_string())],
                e.applied_revision.load(Relaxed),
            ),
            (
                vec![("state", "seen".to_string())],
                e.seen_revision.load(Relaxed),
            ),
        ];
        gauge(enc, "weir_cluster_config_revision", "The etcd revision of the last shared-config change this instance applied, and the last it has seen (a rejected change is seen, not applied).", &revisions)?;
        let age = e.contact_age().unwrap_or(-1.0);
        let mut m = enc.encode_descriptor(
            "weir_cluster_etcd_contact_age_seconds",
            "Seconds since this instance last heard from etcd (-1: never).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(age).encode(m.encode_family(&Vec::<(&str, String)>::new())?)?;
        let lease = 3.0 * e.lease_interval_s();
        gauge(enc, "weir_cluster_in_sync", "1 when this instance applied every shared change it has seen and heard from etcd within three lease renewals.", &[(vec![], i64::from(e.in_sync(lease)))])?;
        #[rustfmt::skip]
        let families = [
            ("weir_cluster_rejected", "Shared-config changes this instance did not apply (invalid here, or failed to apply); it keeps the last good config.", e.rejected.load(Relaxed)),
            ("weir_cluster_relists", "Full reads of the shared objects from etcd (start, and history compacted past the revision a lost watch resumes from).", e.relists.load(Relaxed)),
        ];
        unlabelled(enc, &families)
    }

    fn process(&self, enc: &mut DescriptorEncoder) -> Result {
        let p = ProcessStats::read();
        let mut m = enc.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time.",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(p.cpu_seconds).encode(m)?;
        m = enc.encode_descriptor(
            "process_resident_memory_bytes",
            "Resident memory.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(p.resident_bytes as i64).encode(m)?;
        m = enc.encode_descriptor(
            "process_open_fds",
            "Open file descriptors.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(p.open_fds as i64).encode(m)?;
        m = enc.encode_descriptor(
            "process_max_fds",
            "Limit on open file descriptors.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(p.max_fds as i64).encode(m)?;
        m = enc.encode_descriptor(
            "process_start_time_seconds",
            "Start time since the Unix epoch.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(p.start_time_seconds).encode(m)
    }
}
