//! Per-worker metric shards: plain counters a single worker writes and the scraper sums.
//!
//! Each worker owns one `WorkerMetrics` and is its only writer, so an increment is a relaxed
//! load plus a relaxed store: no lock, no atomic read-modify-write, no shared cache line on
//! the request path. The admin thread reads every shard at scrape time and adds them up.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Duration;

use super::layout::{SlotMap, NO_ROUTE_SLOT};
use super::slots::Slots;

/// A monotonically increasing count, or a gauge, written by one thread only.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Only the owning worker may call this (single writer).
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }

    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }

    /// Takes one off a gauge, never below zero (owning worker only).
    #[inline]
    pub fn dec(&self) {
        self.0
            .store(self.0.load(Relaxed).saturating_sub(1), Relaxed);
    }

    /// Sets a gauge value (owning worker only).
    #[inline]
    pub fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Upper bounds (seconds) of the latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A latency histogram: per-bucket counts (not cumulative), sum and count.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [Counter; LATENCY_BUCKETS.len()],
    sum_nanos: Counter,
    count: Counter,
}

impl Histogram {
    fn zero(&self) {
        for c in self.buckets.iter().chain([&self.sum_nanos, &self.count]) {
            c.set(0);
        }
    }

    #[inline]
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].inc();
        }
        self.sum_nanos.add(d.as_nanos() as u64);
        self.count.inc();
    }

    /// Adds this shard into (sum seconds, count, per-bucket counts).
    pub fn merge_into(
        &self,
        sum: &mut f64,
        count: &mut u64,
        buckets: &mut [u64; LATENCY_BUCKETS.len()],
    ) {
        *sum += self.sum_nanos.get() as f64 / 1e9;
        *count += self.count.get();
        for (total, b) in buckets.iter_mut().zip(&self.buckets) {
            *total += b.get();
        }
    }
}

/// Methods with their own label value; everything else is "OTHER".
pub const METHODS: [&str; 10] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "CONNECT", "OTHER",
];

/// The label slot of a request method.
pub fn method_index(method: &[u8]) -> usize {
    METHODS[..METHODS.len() - 1]
        .iter()
        .position(|m| m.as_bytes() == method)
        .unwrap_or(METHODS.len() - 1)
}

/// The client's protocol, the `protocol` label of the per-request series. Chosen once per
/// connection (HTTP/1) or stream (HTTP/2), so counting by it is an array index. HTTP/1.0
/// requests count as `HTTP/1.1`: one HTTP/1 family, set per connection, not per request
/// (the access log still tells them apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http1 = 0,
    Http2 = 1,
    Http3 = 2,
}

/// Label values of [`Protocol`], spelled as the access log's `protocol` field.
pub const PROTOCOLS: [&str; 3] = ["HTTP/1.1", "HTTP/2.0", "HTTP/3"];

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::Http1, Protocol::Http2, Protocol::Http3];

    pub fn label(self) -> &'static str {
        PROTOCOLS[self as usize]
    }
}

/// Status codes 100..=599 each have a slot; anything else shares the last one (label "other").
pub const STATUS_SLOTS: usize = 501;

#[inline]
pub fn status_index(status: u16) -> usize {
    match status {
        100..=599 => usize::from(status - 100),
        _ => STATUS_SLOTS - 1,
    }
}

/// Why the listener answered by itself instead of forwarding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultReason {
    NoRoute,
    NoHealthyServer,
    BadRequest,
    TooLarge,
    Timeout,
}

impl DefaultReason {
    pub const ALL: [DefaultReason; 5] = [
        DefaultReason::NoRoute,
        DefaultReason::NoHealthyServer,
        DefaultReason::BadRequest,
        DefaultReason::TooLarge,
        DefaultReason::Timeout,
    ];

    pub fn label(self) -> &'static str {
        match self {
            DefaultReason::NoRoute => "no_route",
            DefaultReason::NoHealthyServer => "no_healthy_server",
            DefaultReason::BadRequest => "bad_request",
            DefaultReason::TooLarge => "too_large",
            DefaultReason::Timeout => "timeout",
        }
    }
}

/// Why a response was cut short after its head was sent (`weir_responses_aborted_total`,
/// the access log's `aborted`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortReason {
    /// The upstream closed before the end of the body.
    UpstreamClosed,
    /// Reading the body from the upstream failed (a reset, usually).
    UpstreamReset,
    /// The upstream sent no body byte within `response_timeout`.
    UpstreamTimeout,
    /// The upstream's body broke its framing (a bad chunk).
    UpstreamMalformed,
    /// The client closed or reset the connection.
    ClientClosed,
    /// The client took no bytes within `client_timeout`.
    ClientTimeout,
}

impl AbortReason {
    pub const ALL: [AbortReason; 6] = [
        AbortReason::UpstreamClosed,
        AbortReason::UpstreamReset,
        AbortReason::UpstreamTimeout,
        AbortReason::UpstreamMalformed,
        AbortReason::ClientClosed,
        AbortReason::ClientTimeout,
    ];

    pub fn label(self) -> &'static str {
        match self {
            AbortReason::UpstreamClosed => "upstream_closed",
            AbortReason::UpstreamReset => "upstream_reset",
            AbortReason::UpstreamTimeout => "upstream_timeout",
            AbortReason::UpstreamMalformed => "upstream_malformed",
            AbortReason::ClientClosed => "client_closed",
            AbortReason::ClientTimeout => "client_timeout",
        }
    }

    /// The reason an error that cut a response short counts as. Only the errors of
    /// relaying a body occur then; any other counts by its side.
    pub fn of(error: crate::error::ProxyError) -> AbortReason {
        use crate::error::{ProxyError::*, Side};
        match error {
            UpstreamClosed => AbortReason::UpstreamClosed,
            UpstreamTimeout | UpstreamConnectTimeout => AbortReason::UpstreamTimeout,
            UpstreamMalformed(_) => AbortReason::UpstreamMalformed,
            ClientTimeout | HeaderTimeout | BodyTooSlow => AbortReason::ClientTimeout,
            e if e.side() == Side::Client => AbortReason::ClientClosed,
            _ => AbortReason::UpstreamReset,
        }
    }
}

/// Kinds of accept errors with their own label value.
pub const ACCEPT_ERRORS: [&str; 3] = ["EMFILE", "ENFILE", "other"];

pub fn accept_error_index(e: &std::io::Error) -> usize {
    match e.raw_os_error() {
        Some(libc::EMFILE) => 0,
        Some(libc::ENFILE) => 1,
        _ => 2,
    }
}

/// Requests of one route (or of "no route"), by protocol, method and status, and their
/// durations.
#[derive(Debug)]
pub struct RouteMetrics {
    /// HTTP/1.x requests, by method x status (allocated with the route, as before the
    /// `protocol` label: the HTTP/1 path looks up no `OnceLock`).
    http1: Box<[Counter]>,
    /// HTTP/2 requests, the same table, allocated by the route's first HTTP/2 request
    /// (most routes never see one; a table is 40 KiB per worker).
    http2: OnceLock<Box<[Counter]>>,
    /// HTTP/3 requests, allocated likewise by the route's first HTTP/3 request.
    http3: OnceLock<Box<[Counter]>>,
    /// By `Protocol`.
    duration: [Histogram; PROTOCOLS.len()],
    /// Responses cut short after their head, by `Protocol`, then `AbortReason`.
    aborted: [[Counter; AbortReason::ALL.len()]; PROTOCOLS.len()],
    /// Requests refused by the route's `rate_limit` (429), by `Protocol`.
    rate_limited: [Counter; PROTOCOLS.len()],
    /// Body bytes a route's `compression` took in and sent out, by `Encoding::index`.
    pub compressed_in: [Counter; 3],
    pub compressed_out: [Counter; 3],
}

impl RouteMetrics {
    fn new() -> RouteMetrics {
        RouteMetrics {
            http1: new_request_table(),
            http2: OnceLock::new(),
            http3: OnceLock::new(),
            duration: Default::default(),
            aborted: Default::default(),
            rate_limited: Default::default(),
            compressed_in: Default::default(),
            compressed_out: Default::default(),
        }
    }

    #[inline]
    pub fn aborted(&self, protocol: Protocol, reason: AbortReason) -> &Counter {
        &self.aborted[protocol as usize][reason as usize]
    }

    /// Requests of `protocol` the route's `rate_limit` refused.
    #[inline]
    pub fn rate_limited(&self, protocol: Protocol) -> &Counter {
        &self.rate_limited[protocol as usize]
    }

    #[inline]
    pub fn duration(&self, protocol: Protocol) -> &Histogram {
        &self.duration[protocol as usize]
    }

    /// The counter of one request. Only the owning worker calls this: the route's first
    /// HTTP/2 request allocates the HTTP/2 table (once per route and worker).
    #[inline]
    pub fn request(&self, protocol: Protocol, method: usize, status: u16) -> &Counter {
        let table = match protocol {
            Protocol::Http1 => &self.http1,
            Protocol::Http2 => self.http2.get_or_init(new_request_table),
            Protocol::Http3 => self.http3.get_or_init(new_request_table),
        };
        &table[method * STATUS_SLOTS + status_index(status)]
    }

    /// The table of protocol index `protocol` (`PROTOCOLS`), if it has one yet.
    fn table(&self, protocol: usize) -> Option<&[Counter]> {
        match protocol {
            0 => Some(&self.http1),
            1 => self.http2.get().map(|t| &t[..]),
            _ => self.http3.get().map(|t| &t[..]),
        }
    }

    /// Requests of protocol index `protocol`, method and status slot.
    pub fn requests(&self, protocol: usize, method: usize, slot: usize) -> u64 {
        self.table(protocol)
            .map_or(0, |t| t[method * STATUS_SLOTS + slot].get())
    }

    /// Whether requests of protocol index `protocol` may have been counted here (HTTP/1
    /// always may; HTTP/2 once its table exists).
    pub fn saw(&self, protocol: usize) -> bool {
        self.table(protocol).is_some()
    }
}

#[cold]
fn new_request_table() -> Box<[Counter]> {
    (0..METHODS.len() * STATUS_SLOTS)
        .map(|_| Counter::default())
        .collect()
}

#[derive(Debug, Default)]
pub struct ListenerMetrics {
    /// By route slot (see `layout`); slot 0: requests no route matched.
    pub routes: Slots<RouteMetrics>,
    pub default_responses: [Counter; 5],
    pub connections_active: Counter,
    pub connections_total: Counter,
    pub accept_errors: [Counter; 3],
    /// Times an accept loop paused because the listener had `max_connections` open.
    pub accept_paused: Counter,
    /// Idle connections closed at `max_connections` for a new one (`listener::reclaim`).
    pub connections_evicted: Counter,
    pub bytes_in: Counter,
    pub bytes_out: Counter,
    /// Connections closed for a missing, malformed or untrusted PROXY header.
    pub proxy_rejected: Counter,
    pub http2: Http2Metrics,
    pub http3: Http3Metrics,
    /// Completed TLS handshakes: index `2 * version + resumed` (`TLS_VERSIONS`; 0 full,
    /// 1 resumed).
    pub tls_handshakes: [Counter; 4],
    /// Failed TLS handshakes, by reason (`TlsFailure`).
    pub tls_failures: [Counter; TlsFailure::ALL.len()],
    /// TCP listeners with `sni_routes`: connections by how their SNI step ended
    /// (indexed by `tcp::sni::SniResult as usize`).
    pub sni: [Counter; crate::tcp::sni::SniResult::ALL.len()],
    /// Tunnels (Upgrade, RFC 8441) and TCP relays closed by a still-time bound: index 0
    /// idle, 1 fin (a half-closed tail) (`crate::idle::count`).
    pub tunnel_timeouts: [Counter; 2],
}

/// HTTP/2 client connections of a listener (their requests also count in the route
/// metrics, like HTTP/1.1 ones).
#[derive(Debug, Default)]
pub struct Http2Metrics {
    /// Connections that started with the HTTP/2 preface.
    pub connections: Counter,
    /// Streams (requests) served.
    pub streams: Counter,
    /// Streams the client reset while Weir worked on them; each cancelled its upstream
    /// request.
    pub client_resets: Counter,
    /// Connections closed with GOAWAY ENHANCE_YOUR_CALM (a reset budget exceeded).
    pub calm_goaways: Counter,
    /// Resets Weir sent because of a client's error on the stream (MadeYouReset).
    pub forced_resets: Counter,
    /// Client frames that carried no request (glitches: SETTINGS, PING, empty DATA, ...).
    pub glitches: Counter,
    /// Connections closed because their writes made no progress for `stall_timeout`.
    pub stalled: Counter,
}

/// QUIC connections of a listener with `http3` (their requests count in the route
/// metrics with `protocol="HTTP/3"`). Packet counts come from quinn's statistics of each
/// connection, added when it closes.
#[derive(Debug, Default)]
pub struct Http3Metrics {
    /// Handshakes completed.
    pub handshakes: Counter,
    /// Handshakes that failed (a TLS or transport error, the client gone).
    pub handshake_failures: Counter,
    /// Handshakes that did not finish within `handshake_timeout`.
    pub handshake_timeouts: Counter,
    /// Handshakes closed at the TLS `max_handshakes` to make room for a new one (the one
    /// that had gone longest without a step forward: `places`).
    pub handshake_evictions: Counter,
    /// Connection attempts refused: at `max_connections`, or while draining.
    pub refused: Counter,
    /// Retry packets sent (address validation under a handshake flood).
    pub retries: Counter,
    /// Request streams served.
    pub streams: Counter,
    /// Request streams the client reset or stopped before the response ended.
    pub client_resets: Counter,
    /// Client actions that carried no request (unidirectional streams past the three
    /// HTTP/3 needs, control-stream frames after SETTINGS).
    pub glitches: Counter,
    /// Connections closed with H3_EXCESSIVE_LOAD (a reset or glitch budget exceeded).
    pub excessive_load_closes: Counter,
    /// Packets sent, and of them declared lost (and so retransmitted).
    pub sent_packets: Counter,
    pub lost_packets: Counter,
    /// Congestion events (losses or ECN marks that cut the window).
    pub congestion_events: Counter,
}

/// TLS versions counted apart.
pub const TLS_VERSIONS: [&str; 2] = ["1.2", "1.3"];

/// Why a TLS handshake failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFailure {
    /// No cipher suite, key exchange group or signature scheme both sides have.
    NoSharedCipher,
    /// No TLS version both sides accept (such as a TLS 1.2 client and `min_version = "1.3"`).
    NoSharedVersion,
    /// A client certificate was required and missing, or did not verify.
    BadClientCert,
    /// Not finished within `handshake_timeout`.
    Timeout,
    /// The first byte was not a TLS handshake record but text: plain HTTP to a TLS port.
    PlainHttp,
    /// At `max_handshakes`, a newcomer took its place: it had gone longest without a
    /// step forward (`places`).
    Evicted,
    /// The client's server name is not a host name (`example.com:443`, `[::1]`): rustls
    /// refuses it (an IP address, though not allowed either, is taken as no SNI).
    BadSni,
    Other,
}

impl TlsFailure {
    pub const ALL: [TlsFailure; 8] = [
        TlsFailure::NoSharedCipher,
        TlsFailure::NoSharedVersion,
        TlsFailure::BadClientCert,
        TlsFailure::Timeout,
        TlsFailure::PlainHttp,
        TlsFailure::Evicted,
        TlsFailure::BadSni,
        TlsFailure::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            TlsFailure::NoSharedCipher => "no_shared_cipher",
            TlsFailure::NoSharedVersion => "no_shared_version",
            TlsFailure::BadClientCert => "bad_client_cert",
            TlsFailure::Timeout => "timeout",
            TlsFailure::PlainHttp => "plain_http",
            TlsFailure::Evicted => "evicted",
            TlsFailure::BadSni => "bad_sni",
            TlsFailure::Other => "other",
        }
    }
}

impl ListenerMetrics {
    #[inline]
    pub fn route(&self, slot: usize) -> Option<&RouteMetrics> {
        self.routes.get(slot)
    }

    #[inline]
    pub fn default_response(&self, reason: DefaultReason) -> &Counter {
        &self.default_responses[reason as usize]
    }
}

/// One server of an upstream pool.
#[derive(Debug)]
pub struct ServerMetrics {
    requests: Box<[Counter]>,
    pub connect: Histogram,
    pub response: Histogram,
    pub pool_idle: Counter,
    /// Connection attempts that failed (refused, unreachable, timed out).
    pub connect_errors: Counter,
    /// Requests (TCP: connections) of this worker that picked the server and have not
    /// ended, a gauge. Shared with the worker's load-balancing state
    /// (`upstream::local`), which counts it as picks come and go.
    pub in_flight: std::sync::Arc<Counter>,
}

impl ServerMetrics {
    fn new() -> ServerMetrics {
        ServerMetrics {
            requests: (0..STATUS_SLOTS).map(|_| Counter::default()).collect(),
            connect: Histogram::default(),
            response: Histogram::default(),
            pool_idle: Counter::default(),
            connect_errors: Counter::default(),
            in_flight: Default::default(),
        }
    }

    #[inline]
    pub fn request(&self, status: u16) -> &Counter {
        &self.requests[status_index(status)]
    }

    pub fn requests(&self, slot: usize) -> u64 {
        self.requests[slot].get()
    }

    /// Zeroes every count, for the next server given this slot (`layout::Layout::reclaim`:
    /// no snapshot that could count on it is left, so no worker writes it meanwhile).
    pub(crate) fn zero(&self) {
        let counters = self
            .requests
            .iter()
            .chain([&self.pool_idle, &self.connect_errors]);
        for c in counters.chain([&*self.in_flight]) {
            c.set(0);
        }
        self.connect.zero();
        self.response.zero();
    }
}

#[derive(Debug, Default)]
pub struct UpstreamMetrics {
    /// By server slot.
    pub servers: Slots<ServerMetrics>,
    pub retries: Counter,
}

/// Everything one worker counts, by slot (see `layout`). The control plane fills the slots
/// of a new config before publishing its snapshot, so the request path finds every slot it
/// looks up; existing slots never move, so counts survive any reload.
#[derive(Debug, Default)]
pub struct WorkerMetrics {
    pub listeners: Slots<ListenerMetrics>,
    pub upstreams: Slots<UpstreamMetrics>,
}

impl WorkerMetrics {
    /// A shard with a slot for every object `slots` names.
    pub fn new(slots: &SlotMap) -> WorkerMetrics {
        let shard = WorkerMetrics::default();
        shard.fill(slots);
        shard
    }

    /// Fills the slots `slots` names that are still empty.
    pub fn fill(&self, slots: &SlotMap) {
        for l in slots.listeners.iter() {
            if let Some(m) = self.listeners.get_or_init(l.slot, ListenerMetrics::default) {
                m.routes.get_or_init(NO_ROUTE_SLOT, RouteMetrics::new);
                for &r in l.children.iter() {
                    m.routes.get_or_init(r, RouteMetrics::new);
                }
            }
        }
        for u in slots.upstreams.iter() {
            if let Some(m) = self.upstreams.get_or_init(u.slot, UpstreamMetrics::default) {
                for &s in u.children.iter() {
                    m.servers.get_or_init(s, ServerMetrics::new);
                }
            }
        }
    }

    #[inline]
    pub fn listener(&self, slot: usize) -> Option<&ListenerMetrics> {
        self.listeners.get(slot)
    }

    #[inline]
    pub fn upstream(&self, slot: usize) -> Option<&UpstreamMetrics> {
        self.upstreams.get(slot)
    }

    #[inline]
    pub fn server(&self, upstream: usize, server: usize) -> Option<&ServerMetrics> {
        self.upstreams.get(upstream)?.servers.get(server)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices() {
        assert_eq!(method_index(b"GET"), 0);
        assert_eq!(method_index(b"PATCH"), 6);
        assert_eq!(method_index(b"BREW"), METHODS.len() - 1);
        assert_eq!(status_index(100), 0);
        assert_eq!(status_index(599), 499);
        assert_eq!(status_index(999), STATUS_SLOTS - 1);
    }

    #[test]
    fn requests_count_by_protocol_and_allocate_on_first_use() {
        for (i, p) in Protocol::ALL.into_iter().enumerate() {
            assert_eq!(p as usize, i, "ALL is in declaration order");
        }
        assert_eq!(Protocol::Http1.label(), "HTTP/1.1");
        assert_eq!(Protocol::Http2.label(), "HTTP/2.0");
        let route = RouteMetrics::new();
        assert!(route.saw(0) && !route.saw(1));
        route.request(Protocol::Http2, 0, 200).inc();
        route
            .aborted(Protocol::Http2, AbortReason::ClientClosed)
            .inc();
        assert!(route.saw(1));
        assert_eq!(route.requests(1, 0, status_index(200)), 1);
        assert_eq!(route.requests(0, 0, status_index(200)), 0);
        assert_eq!(
            route
                .aborted(Protocol::Http1, AbortReason::ClientClosed)
                .get(),
            0
        );
    }

    #[test]
    fn abort_reasons() {
        use crate::error::ProxyError;
        for (i, r) in AbortReason::ALL.into_iter().enumerate() {
            assert_eq!(r as usize, i, "ALL is in declaration order");
        }
        let cases = [
            (ProxyError::UpstreamClosed, "upstream_closed"),
            (
                ProxyError::UpstreamIo(std::io::ErrorKind::ConnectionReset),
                "upstream_reset",
            ),
            (ProxyError::UpstreamTimeout, "upstream_timeout"),
            (
                ProxyError::UpstreamMalformed("bad chunk"),
                "upstream_malformed",
            ),
            (ProxyError::ClientClosed, "client_closed"),
            (
                ProxyError::ClientIo(std::io::ErrorKind::BrokenPipe),
                "client_closed",
            ),
            (ProxyError::ClientTimeout, "client_timeout"),
        ];
        for (error, label) in cases {
            assert_eq!(AbortReason::of(error).label(), label, "{error}");
        }
    }

    #[test]
    fn histogram_buckets() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(60));
        let (mut sum, mut count, mut buckets) = (0.0, 0, [0; LATENCY_BUCKETS.len()]);
        h.merge_into(&mut sum, &mut count, &mut buckets);
        assert_eq!(count, 3);
        assert_eq!(buckets[0], 1);
        assert_eq!(buckets[3], 1);
        assert_eq!(buckets.iter().sum::<u64>(), 2);
        assert!((sum - 60.0033).abs() < 1e-6);
    }
}
