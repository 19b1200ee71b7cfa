//! The validated configuration model.
//!
//! Everything here has passed validation: defaults are filled in, durations and sizes are
//! parsed, names are resolved to indices, and no `Option` remains that validation settled.
//! Runtime code (the data plane, the admin API) only ever sees these types.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// A whole validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub server: ServerSettings,
    pub admin: AdminSettings,
    pub listeners: Vec<Listener>,
    /// Upstream pools; a route refers to one by its index in this vector.
    pub upstreams: Vec<Upstream>,
    /// `[cluster]`: what the instances of a fleet share.
    pub cluster: Cluster,
    /// `[tracing]`: OpenTelemetry traces (`None`: no tracing work at all).
    pub tracing: Option<Tracing>,
    /// `[caches.NAME]`, sorted by name: the HTTP cache stores routes refer to.
    pub caches: Vec<CacheStore>,
    /// The paths written relative to the config file's directory, as resolved (the
    /// settings above hold the resolved ones); empty for text parsed without a file.
    pub relative_paths: Vec<crate::RelativePath>,
}

/// `[cluster]`: what the instances of a fleet share.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cluster {
    /// `node`, `etcd` and `binds`: the shared objects live in etcd (docs/cluster.md).
    pub etcd: Option<crate::cluster::EtcdCluster>,
    /// `[cluster.redis.NAME]`, sorted by name: where shared rate limits count.
    pub redis: Vec<RedisSettings>,
}

/// Process-wide settings (`[server]`).
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    pub workers: Workers,
    pub drain_timeout: Duration,
    /// How often the TLS certificate, key and CA files are checked for changes on disk
    /// (changed files are reloaded); zero: never.
    pub cert_check_interval: Duration,
    /// How the process log (stderr) is written; `WEIR_LOG_FORMAT` overrides it. Fixed at
    /// start.
    pub log_format: LogFormat,
    /// Cache revalidations (stale-while-revalidate) a worker runs in the background at
    /// once; past them a stale answer starts none (a later request does).
    pub background_revalidations: usize,
    /// Password checks (`basic_auth` bcrypt or argon2 hashes) running at once in the
    /// process, off the event loops; a request needing one more is answered 503.
    pub password_checks: usize,
}

/// The process log's format (`[server] log_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One line per event, for people (colour only on a terminal, never with `NO_COLOR`).
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl LogFormat {
    /// `"text"` or `"json"`.
    pub fn parse(text: &str) -> Option<LogFormat> {
        match text.trim() {
            "text" => Some(LogFormat::Text),
            "json" => Some(LogFormat::Json),
            _ => None,
        }
    }
}

/// How many worker threads to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// One per available core.
    Auto,
    Count(usize),
}

/// The admin listener (`[admin]`).
#[derive(Debug, Clone, PartialEq)]
pub struct AdminSettings {
    /// `None` when the admin listener is disabled (`bind = "off"`).
    pub bind: Option<SocketAddr>,
    /// File holding the bearer token every admin request must carry (`None`: no token;
    /// writes are then accepted only on a loopback bind).
    pub token_file: Option<std::path::PathBuf>,
    /// Names (lower-case) and IP addresses (as `IpAddr` displays them) accepted in `Host`
    /// and `Origin` besides the listener's own address (`allowed_hosts`).
    pub allowed_hosts: Vec<String>,
    /// Time allowed for a whole request head: from the connection's accept for its first
    /// request, from the first byte for later ones.
    pub header_timeout: Duration,
    /// Longest wait for the client between requests, for a request body, and for the
    /// client to take response bytes.
    pub idle_timeout: Duration,
    /// Most admin connections open at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
    /// The dashboard (`/ui/`, `/api/v1/stats`); `None` when `dashboard = false`.
    pub dashboard: Option<DashboardSettings>,
}

impl AdminSettings {
    /// A warning when the admin API listens beyond loopback without `token_file`: then
    /// anyone who reaches the address reads the config, secrets included (`[tracing]`
    /// headers, passwords in Redis URLs, header rules), and the metrics. A warning, not an
    /// error: probes and scrapers need a reachable address, a config that ran before still
    /// loads, and a network policy may be what guards the port (as Caddy allows
    /// `admin 0.0.0.0:2019`).
    pub fn exposure_warning(&self) -> Option<String> {
        let bind = self.bind?;
        (self.token_file.is_none() && !bind.ip().to_canonical().is_loopback()).then(|| {
            format!(
                "admin.bind = \"{bind}\" without admin.token_file: anyone who reaches it reads \
                 the config through the API (secrets in it included) and the metrics; set \
                 token_file, or bind the admin listener to 127.0.0.1"
            )
        })
    }
}

/// The dashboard's sampling (`[admin] dashboard_interval`, `dashboard_history`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DashboardSettings {
    /// How often the admin thread samples the metric shards.
    pub interval: Duration,
    /// How far back the samples kept in memory reach.
    pub history: Duration,
}

impl DashboardSettings {
    /// How many samples cover `history` (at least one).
    pub fn points(&self) -> usize {
        let n = self.history.as_millis() / self.interval.as_millis().max(1);
        usize::try_from(n).unwrap_or(usize::MAX).max(1)
    }
}

impl Default for DashboardSettings {
    fn default() -> Self {
        DashboardSettings {
            interval: Duration::from_secs(2),
            history: Duration::from_secs(300),
        }
    }
}

/// What a listener speaks.
#[derive(Debug, Clone, PartialEq)]
pub enum Protocol {
    /// HTTP/1.1: routes, filters, default response.
    Http,
    /// Layer 4: every connection is relayed byte for byte to one upstream pool.
    Tcp(TcpSettings),
}

/// The keys only a `protocol = "tcp"` listener has.
#[derive(Debug, Clone, PartialEq)]
pub struct TcpSettings {
    /// Index into [`Config::upstreams`].
    pub upstream: usize,
    /// A connection with no byte moving either way for this long is closed (both sides).
    pub idle_timeout: Duration,
    /// After one side half-closed (FIN), the connection is closed once nothing has moved
    /// for this long (HAProxy's `timeout client-fin`/`server-fin`). Default and maximum:
    /// `idle_timeout`.
    pub fin_timeout: Duration,
    /// How far the sockets' unsent queues must shrink, with no transfer Weir saw, to count
    /// as progress against the bounds (a slow reader draining a full buffer); less is a
    /// slow-read attack, and the connection is closed after the bound.
    pub min_progress: u64,
    /// Bytes buffered per direction when copying (not splicing).
    pub buffer_size: usize,
    pub splice: SpliceMode,
    /// Routing by the TLS ClientHello's server name, without terminating TLS (empty: every
    /// connection goes to `upstream`, and nothing is read before connecting).
    pub sni_routes: Vec<SniRoute>,
    /// Time allowed for the ClientHello to arrive when `sni_routes` is set.
    pub preread_timeout: Duration,
}

/// One entry of `sni_routes`: connections whose SNI matches one of `hosts` go to `upstream`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SniRoute {
    /// Exact names or `*.suffix` patterns (never `*` alone: that is `upstream`'s job).
    pub hosts: Vec<HostPattern>,
    /// Index into [`Config::upstreams`].
    pub upstream: usize,
}

/// Whether a TCP listener relays with splice(2) (Linux) or through a user-space buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpliceMode {
    /// Copy small exchanges through the buffer; a direction whose reads keep filling the
    /// buffer (a bulk transfer) switches to splice.
    Auto,
    /// Splice from the first byte.
    Always,
    /// Always copy through the buffer.
    Never,
}

/// PROXY protocol settings of a listener (`proxy_protocol = { ... }`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProxyProtocol {
    /// Every connection must start with a PROXY header (v1 or v2) and come from `trusted`.
    pub accept: bool,
    /// Source ranges allowed to send PROXY headers (non-empty when `accept`).
    pub trusted: Vec<Cidr>,
    /// The header sent to upstream servers (TCP listeners only).
    pub send: ProxyVersion,
}

/// Which PROXY header to send upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyVersion {
    #[default]
    Off,
    V1,
    V2,
}

/// An address range such as `10.0.0.0/8` or `::1/128`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    /// Leading bits that must match (at most 32 for IPv4, 128 for IPv6).
    pub prefix: u8,
}

impl Cidr {
    /// Whether `ip` is in the range; an IPv4-mapped IPv6 address counts as its IPv4 form.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => same_prefix(
                u128::from(net.to_bits()) << 96,
                u128::from(ip.to_bits()) << 96,
                self.prefix,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                same_prefix(net.to_bits(), ip.to_bits(), self.prefix)
            }
            _ => false,
        }
    }
}

fn same_prefix(a: u128, b: u128, prefix: u8) -> bool {
    let mask = u128::MAX
        .checked_shl(128 - u32::from(prefix.min(128)))
        .unwrap_or(0);
    a & mask == b & mask
}

/// One data-plane listener (`[[listeners]]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Listener {
    pub name: String,
    /// Where the listener accepts, all with the same routes and settings: its `bind`
    /// addresses first (TLS when `tls` is set), then its plain-HTTP ones (`http_bind`, or
    /// the port-80 bind `acme` implies). Never empty.
    pub binds: Vec<Bind>,
    pub protocol: Protocol,
    /// Accepting (any listener) and sending (TCP listeners) PROXY protocol headers.
    pub proxy_protocol: ProxyProtocol,
    /// TLS termination (`[listeners.tls]`); `None`: plain TCP.
    pub tls: Option<Tls>,
    pub backlog: u32,
    /// TCP_DEFER_ACCEPT: hand a connection to Weir only once its first bytes have arrived
    /// (or after about a second). Default on for HTTP, off for TCP listeners.
    pub defer_accept: bool,
    pub max_connections: usize,
    /// Idle time allowed between requests on a client connection.
    pub keepalive_timeout: Duration,
    /// Requests served on one client connection before it is closed; 0 = unlimited.
    pub keepalive_requests: u64,
    /// Time allowed to receive a whole request head.
    pub header_timeout: Duration,
    /// Longest wait for the client to send or accept data while a request is in flight.
    pub client_timeout: Duration,
    /// The least a request body must average while Weir waits for it; `None`: no floor.
    pub min_body_rate: Option<MinBodyRate>,
    /// An upgraded connection (WebSocket over HTTP/1.1 or RFC 8441) with no byte moving
    /// either way for this long is closed (HAProxy's `timeout tunnel`).
    pub tunnel_idle_timeout: Duration,
    /// After one side of a tunnel ended its direction, the tunnel is closed once nothing
    /// has moved for this long. Default and maximum: `tunnel_idle_timeout`.
    pub tunnel_fin_timeout: Duration,
    /// [`TcpSettings::min_progress`] for tunnels.
    pub tunnel_min_progress: u64,
    /// Largest request body accepted; `None` = unlimited.
    pub max_body_size: Option<u64>,
    /// Largest request head (request line + headers) accepted; beyond it: 431.
    pub max_header_size: usize,
    /// Most header fields accepted in one request head; beyond it: 431.
    pub max_headers: usize,
    /// 1xx heads (100, 103 Early Hints, ...) an upstream may send an HTTP/1.1 client before
    /// its final response; one more fails the response (502), so an upstream sending 1xx
    /// in a loop cannot keep a client busy. HTTP/2 clients: `http2.max_informational`.
    pub max_informational: u32,
    pub default_response: DefaultResponse,
    /// `None` when access logging is off.
    pub access_log: Option<AccessLog>,
    /// How the request path is normalised before routing and forwarding.
    pub path_normalization: PathNormalization,
    pub routes: Vec<Route>,
    /// HTTP/2 (h2c with prior knowledge) settings and flood defences.
    pub http2: Http2,
    /// HTTP/3 over QUIC on the listener's addresses (UDP), TLS listeners only; `None`: off.
    pub http3: Option<Http3>,
    /// `Some(port)`: every request that arrives over plain HTTP is answered with a 308
    /// redirect to `https://{host}:{port}{uri}` (the port left out when it is 443): on a
    /// listener without `tls`, all of them (routes unused); on a TLS listener, those on its
    /// plain-HTTP binds.
    pub redirect_https: Option<u16>,
    /// Traffic-policy settings of the listener (issue 16): request ids, ...
    pub policy: ListenerPolicy,
}

/// HTTP/2 settings of an HTTP listener (`[listeners.http2]`, docs/http2.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Http2 {
    /// SETTINGS_MAX_CONCURRENT_STREAMS advertised to clients.
    pub max_concurrent_streams: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE: larger header blocks are refused.
    pub max_header_list_size: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE: request body bytes a stream may send ahead.
    pub initial_stream_window: u32,
    /// Request body bytes all streams of a connection together may send ahead.
    pub initial_connection_window: u32,
    /// Response bytes buffered per stream before Weir stops reading its upstream.
    pub max_send_buffer: u32,
    /// Response DATA bytes all streams of a connection together may have handed to the
    /// `h2` crate and not yet written to the socket; past it, streams wait (a client that
    /// opens many streams and never reads holds this much, not streams x
    /// `max_send_buffer`).
    pub max_connection_send_buffer: u32,
    /// Client resets of accepted streams allowed per `reset_window` before GOAWAY
    /// ENHANCE_YOUR_CALM (rapid reset, CVE-2023-44487).
    pub reset_budget: u32,
    pub reset_window: Duration,
    /// Streams reset by the client before Weir accepted them, queued at once (h2's guard).
    pub max_pending_accept_resets: u32,
    /// Resets Weir sends because of client errors before GOAWAY (MadeYouReset,
    /// CVE-2025-8671).
    pub max_local_error_resets: u32,
    /// Frames that cost Weir work but carry no request (SETTINGS, PING, empty DATA,
    /// WINDOW_UPDATEs no DATA explains, PRIORITY, unknown types) allowed per `glitch_window` before
    /// GOAWAY ENHANCE_YOUR_CALM (CVE-2019-9512, -9515, -9518).
    pub glitch_budget: u32,
    pub glitch_window: Duration,
    /// How long a stream may wait for flow-control window, and a connection for its
    /// writes to make progress, before the stream is reset or the connection closed
    /// (CVE-2019-9517, zero-window and never-reading clients).
    pub stall_timeout: Duration,
    /// 1xx heads (103 Early Hints, ...) relayed to the client per response; more are
    /// dropped (each is a HEADERS frame h2 queues without flow control). 0: none.
    pub max_informational: u32,
    /// RFC 8441 WebSocket tunnels one client connection may hold at once (each is an
    /// upstream connection of its own, for up to `tunnel_idle_timeout`); more get 429.
    pub max_tunnels: u32,
}

impl Default for Http2 {
    fn default() -> Http2 {
        Http2 {
            max_concurrent_streams: 128,
            max_header_list_size: 64 * 1024,
            initial_stream_window: 256 * 1024,
            initial_connection_window: 1024 * 1024,
            max_send_buffer: 256 * 1024,
            max_connection_send_buffer: 1024 * 1024,
            reset_budget: 200,
            reset_window: Duration::from_secs(10),
            max_pending_accept_resets: 20,
            max_local_error_resets: 200,
            glitch_budget: 1000,
            glitch_window: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(30),
            max_informational: 8,
            max_tunnels: 16,
        }
    }
}

/// HTTP/3 settings of a TLS listener (`http3 = true | { ... }`, docs/http3.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Http3 {
    /// Request streams a client may have open at once (QUIC `initial_max_streams_bidi`).
    pub max_concurrent_streams: u32,
    /// Request body bytes one stream may send ahead (QUIC stream receive window).
    pub stream_window: u32,
    /// Request body bytes all streams of a connection together may send ahead.
    pub connection_window: u32,
    /// A connection with no packet either way for this long is closed (QUIC
    /// `max_idle_timeout`).
    pub idle_timeout: Duration,
    /// SETTINGS_MAX_FIELD_SECTION_SIZE: larger request heads are refused.
    pub max_field_section_size: u32,
    /// The `ma` of the `Alt-Svc` header HTTP/1.1 and HTTP/2 responses carry.
    pub alt_svc_max_age: Duration,
    /// New connections per second (per worker) past which a client must prove its address
    /// with a Retry round trip before Weir does any handshake work; 0: always.
    pub retry_threshold: u32,
    /// 0-RTT: requests a resuming client sends before its handshake completes are served
    /// (safe methods only, forwarded with `Early-Data: 1`; others answered 425, RFC 8470).
    pub early_data: bool,
}

impl Default for Http3 {
    fn default() -> Http3 {
        Http3 {
            max_concurrent_streams: 100,
            stream_window: 256 * 1024,
            connection_window: 1024 * 1024,
            idle_timeout: Duration::from_secs(30),
            max_field_section_size: 64 * 1024,
            alt_svc_max_age: Duration::from_secs(86_400),
            retry_threshold: 1000,
            early_data: false,
        }
    }
}

/// How a listener normalises request paths (`[listeners.path_normalization]`). Requests
/// are routed on the normalised path, and it is the path sent upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathNormalization {
    /// Resolve `.` and `..` segments (also written `%2e`); a path climbing above `/` is
    /// refused with 400. `false` routes on the path as sent (unsafe behind prefix routes).
    pub dot_segments: bool,
    /// Merge runs of `/` into one (nginx `merge_slashes`).
    pub merge_slashes: bool,
    /// What `%2F` and `%5C` (and a raw `\`) in the path mean.
    pub encoded_slash: EncodedSlash,
}

impl Default for PathNormalization {
    fn default() -> PathNormalization {
        PathNormalization {
            dot_segments: true,
            merge_slashes: false,
            encoded_slash: EncodedSlash::Reject,
        }
    }
}

impl PathNormalization {
    /// Whether the path is left exactly as sent (every normalisation turned off).
    pub fn is_off(&self) -> bool {
        !self.dot_segments && !self.merge_slashes && self.encoded_slash == EncodedSlash::Keep
    }
}

/// The treatment of an encoded slash or backslash in a request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodedSlash {
    /// Refuse the request with 400.
    Reject,
    /// Keep it encoded: part of a segment, not a separator.
    Keep,
    /// Decode it to `/`: a segment separator (nginx).
    Decode,
}

/// TLS termination on a listener (`[listeners.tls]`). The files are read when the config is
/// applied (weir-core), not by validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    /// Certificate chains with their keys; empty only with `acme` or `internal_ca`.
    pub certs: Vec<CertKey>,
    /// Certificates ordered from an ACME server (`acme = { ... }`, docs/tls.md).
    pub acme: Option<Acme>,
    /// Certificates issued by a local CA made once (`internal_ca = { ... }`).
    pub internal_ca: Option<InternalCa>,
    /// Index into `certs` of the certificate for clients without SNI or with an unknown name.
    pub default_cert: usize,
    pub min_version: TlsVersion,
    /// ALPN protocols offered, in order of preference; empty: no ALPN.
    pub alpn: Vec<String>,
    /// Session tickets (rotating keys) and a server-side session cache.
    pub session_resumption: bool,
    /// Client certificates (mTLS); `None`: not asked for.
    pub client_auth: Option<ClientAuth>,
    /// Header carrying the verified client certificate's facts upstream (as written);
    /// any copy the client sends is removed.
    pub client_cert_header: Option<String>,
    /// Time allowed for a handshake, from the first byte (after any PROXY header).
    pub handshake_timeout: Duration,
    /// Handshakes in progress at once, per worker; connections beyond it are closed.
    pub max_handshakes: usize,
}

/// Automatic certificates from an ACME server (RFC 8555) for `domains`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acme {
    /// The names of the certificate (one order for all of them), lower-cased.
    pub domains: Vec<String>,
    /// Account contact URLs (`mailto:...`); may be empty.
    pub contact: Vec<String>,
    /// The ACME directory URL.
    pub directory: String,
    pub challenge: AcmeChallenge,
    /// Directory of the account key and certificates (files 0600).
    pub storage: std::path::PathBuf,
    /// PEM root the ACME server's own HTTPS certificate chains to (private/test servers).
    pub directory_ca: Option<std::path::PathBuf>,
    /// First wait after a failed order; doubled (with jitter) up to an hour.
    pub retry_initial: Duration,
}

/// How the ACME server validates that Weir answers for a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcmeChallenge {
    /// A self-signed certificate through the `acme-tls/1` ALPN on this listener (port 443).
    TlsAlpn01,
    /// `/.well-known/acme-challenge/TOKEN` answered on every HTTP listener (port 80).
    Http01,
}

/// A local CA for development (`internal_ca = { storage = "..." }`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternalCa {
    /// Directory of the CA (`ca.pem`, `ca.key`) and the leaf certificates.
    pub storage: std::path::PathBuf,
    /// The leaf's names: the listener's route hosts, or `localhost` and `127.0.0.1`.
    pub names: Vec<String>,
    /// Validity of each leaf certificate; renewed at two thirds of it.
    pub lifetime: Duration,
}

/// One certificate chain (leaf first) and its private key, as paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertKey {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

/// The lowest TLS version accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    V1_2,
    V1_3,
}

/// Client certificate verification (`client_auth = { ca, required }`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientAuth {
    /// PEM file of the CA certificates client certificates must chain to.
    pub ca: std::path::PathBuf,
    /// Without a certificate the handshake fails; `false`: a client may send none.
    pub required: bool,
}

/// Where and how a listener logs each request (`[listeners.access_log]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLog {
    pub format: AccessLogFormat,
    pub target: LogTarget,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// Apache/nginx common log format.
    Common,
    /// Common plus referer and user agent.
    Combined,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    Stdout,
    File(std::path::PathBuf),
}

/// The response sent when no route matches (seed 002's default backend).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultResponse {
    pub status: u16,
    pub body: String,
    pub content_type: String,
}

/// One route of a listener (`[[listeners.routes]]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub name: String,
    pub hosts: Vec<HostPattern>,
    /// Always starts with `/`.
    pub path_prefix: String,
    /// Replaces `path_prefix` in the upstream request (Apache ProxyPass); `None` = unchanged.
    pub rewrite_prefix: Option<String>,
    /// Map `Location`, `Content-Location` and `URI` response headers back (ProxyPassReverse).
    pub reverse_rewrite: bool,
    /// Keep the client's `Host`; `false` sends the upstream server's address instead.
    pub preserve_host: bool,
    /// Set `X-Real-IP`, `X-Forwarded-Proto`, `X-Forwarded-Host`, append `X-Forwarded-For`.
    pub forwarded_headers: bool,
    /// The protocols a client may switch to through this route (`Upgrade`, then a tunnel
    /// after `101`), lower-cased names without a version; empty: none. Never `h2c`.
    pub upgrades: Vec<String>,
    /// The request conditions beyond host and path prefix (see [`RouteMatch`]).
    pub matching: RouteMatch,
    /// Where a matched request goes: an upstream pool, a weighted split, or a local answer.
    pub target: RouteTarget,
    /// A split (`upstreams = [...]`) sends a pool's share to the other pools while it has
    /// no usable server (`split_fallback`, default true; meaningless for other targets).
    pub split_fallback: bool,
    /// Traffic-policy filters (issue 16): header rules, access lists, rate limit, auth.
    pub filters: RouteFilters,
    /// `tracing = { sampling }`: this route's share of new traces, instead of
    /// `[tracing] sampling` (`None`: the global one).
    pub trace_sampling: Option<f64>,
}

// ---------------------------------------------------------------- route matching and targets
// (issue 16: `exact`, `methods`, `match_headers`, `match_query`, `upstreams`, `respond`,
// `redirect`; validated in validate/route_match.rs)

/// What a request must carry, beyond host and path prefix, to take a route.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RouteMatch {
    /// `path_prefix` is the whole path (the query is not part of it).
    pub exact: bool,
    /// Allowed methods, as written (methods are case-sensitive); empty: any method.
    pub methods: Vec<String>,
    /// Header conditions; names lower-cased. All must hold.
    pub headers: Vec<(String, MatchValue)>,
    /// Query parameter conditions, compared as raw (undecoded) bytes. All must hold.
    pub query: Vec<(String, MatchValue)>,
}

impl RouteMatch {
    /// Whether the route has method, header or query conditions (`exact` is not one: it is
    /// part of where the route sits in the match order).
    pub fn has_conditions(&self) -> bool {
        !self.methods.is_empty() || !self.headers.is_empty() || !self.query.is_empty()
    }
}

/// The value a header or query parameter must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatchValue {
    /// `"*"`: present, with any value.
    Present,
    /// Exactly this value.
    Exact(String),
}

/// Where a route sends a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteTarget {
    /// `upstream = "NAME"`: index into [`Config::upstreams`].
    Upstream(usize),
    /// `upstreams = [{ name, weight }, ...]`: a weighted split over pools.
    Split(Vec<WeightedUpstream>),
    /// `respond = { ... }`: a fixed local response.
    Respond(LocalResponse),
    /// `redirect = { ... }`: a redirect rendered per request.
    Redirect(Redirect),
    /// `files = { ... }`: files under a directory (and the route's `upstream`, if it has
    /// one, for what no file answers).
    Files(Box<Files>),
}

impl RouteTarget {
    /// The pools this target may forward to (none for a local answer).
    pub fn upstreams(&self) -> Vec<usize> {
        match self {
            RouteTarget::Upstream(u) => vec![*u],
            RouteTarget::Split(split) => split.iter().map(|w| w.upstream).collect(),
            RouteTarget::Respond(_) | RouteTarget::Redirect(_) => Vec::new(),
            RouteTarget::Files(files) => files.fallback.into_iter().collect(),
        }
    }
}

/// A route's `files`: what it serves from `root` and how (nginx `root` / `try_files`,
/// Caddy `file_server`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Files {
    /// Absolute; the request path is looked up beneath it.
    pub root: std::path::PathBuf,
    /// Names tried, in order, for a directory (`index`; default `["index.html"]`).
    pub index: Vec<String>,
    /// Paths tried in order (`try_files`), each `{path}` replaced by the request's path;
    /// one ending in `/` names a directory (served by its index). Empty: the request's
    /// path alone, a directory without its `/` redirected to it.
    pub try_files: Vec<String>,
    /// The route's `upstream`: gets the requests no file answers (and methods other than
    /// GET and HEAD).
    pub fallback: Option<usize>,
    /// Symbolic links may lead outside `root`.
    pub follow_symlinks: bool,
    /// Names starting with `.` (but `.well-known`) are served.
    pub hidden: bool,
    /// Siblings `NAME.br`, `NAME.zst`, `NAME.gz` served to clients that accept the coding,
    /// in this order of preference.
    pub precompressed: Vec<Encoding>,
    /// The `Cache-Control` value of every file response.
    pub cache_control: Option<String>,
    /// Plain-TCP HTTP/1.1 bodies at least this long go out with sendfile(2).
    pub sendfile_min_size: u64,
    /// A directory without an index file gets an HTML listing.
    pub listing: bool,
    /// Open files (descriptor and metadata) each worker keeps for hot paths; 0: none.
    pub open_file_cache: usize,
    /// How long a kept file is served before its path is looked up again.
    pub open_file_cache_valid: Duration,
}

/// One pool of a weighted split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightedUpstream {
    /// Index into [`Config::upstreams`].
    pub upstream: usize,
    /// Relative share (1..=1000).
    pub weight: u32,
}

/// A response Weir writes itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    pub status: u16,
    pub body: String,
    /// Extra headers, names as written; never framing or hop-by-hop headers.
    pub headers: Vec<(String, String)>,
}

/// A redirect: `Location` rendered from a template per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// 301, 302, 303, 307 or 308.
    pub status: u16,
    pub to: Template,
}

// ---------------------------------------------------------------- end of route matching

/// A host pattern of a route, already lower-cased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// `"*"`: any host.
    Any,
    /// `"example.com"`.
    Exact(String),
    /// `"*.example.com"`, stored as `".example.com"`: matches `a.example.com`, not `example.com`.
    Suffix(String),
}

/// An upstream pool (`[upstreams.NAME]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    pub name: String,
    pub servers: Vec<UpstreamServer>,
    pub connect_timeout: Duration,
    /// Until the response head arrives, and between two reads of the response body.
    pub response_timeout: Duration,
    /// How long a pooled upstream connection may sit idle.
    pub idle_timeout: Duration,
    /// Pooled idle connections per server per worker.
    pub max_idle: usize,
    /// How a server is chosen for each request.
    pub lb: LbPolicy,
    /// Active health checking (`[upstreams.NAME.health_check]`); `None`: every server is
    /// considered up as far as active checks go.
    pub health_check: Option<HealthCheck>,
    /// Passive ejection on consecutive failures (`[upstreams.NAME.passive]`).
    pub passive: PassiveHealth,
    /// Retrying failed attempts on another server (`[upstreams.NAME.retry]`).
    pub retry: RetryPolicy,
    /// TLS to the servers (`tls = { ... }`); `None`: plain TCP.
    pub tls: Option<UpstreamTls>,
    /// The HTTP version spoken to the servers by HTTP/2 clients' requests (`protocol`).
    pub protocol: UpstreamProtocol,
    /// Most streams Weir opens at once on one HTTP/2 connection to a server (also bounded
    /// by the server's SETTINGS_MAX_CONCURRENT_STREAMS).
    pub max_concurrent_streams: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE Weir sends an HTTP/2 server: the largest header block
    /// (a head, a 1xx, trailers) it takes from it, decoded.
    pub max_header_list_size: u32,
    /// `discover = { dns, ... }`: the servers come from DNS, re-resolved while running
    /// (`servers` is then empty in the config as loaded).
    pub discover: Option<Discover>,
}

/// DNS service discovery of a pool's servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discover {
    /// The name looked up: a host name (`kind = "A/AAAA"`) or an SRV name such as
    /// `_http._tcp.example.com`.
    pub name: String,
    pub kind: DiscoverKind,
    /// How often the name is looked up again (with `respect_ttl`: at most this long).
    pub interval: Duration,
    /// Look up again when the answer's TTL runs out, if that is sooner than `interval`.
    pub respect_ttl: bool,
    /// The DNS server asked; `None`: those of the system (`/etc/resolv.conf`).
    pub nameserver: Option<SocketAddr>,
    /// How long one lookup may take before it counts as failed.
    pub timeout: Duration,
}

/// What a discovery looks up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoverKind {
    /// A and AAAA records of a host; every address is a server on `port`.
    Ip { port: u16 },
    /// SRV records: each target's addresses on the record's port, weighted by the record's
    /// weight; the lowest priority is the primary group, the others are backups.
    Srv,
}

impl Cluster {
    pub fn redis(&self, name: &str) -> Option<&RedisSettings> {
        self.redis.iter().find(|r| r.name == name)
    }
}

/// `[cluster.redis.NAME]`: a Redis server that shared rate limits count in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    pub name: String,
    /// `redis://[user:password@]host:port[/db]`, or `rediss://` for TLS.
    pub url: String,
    /// The CA certificates trusted for `rediss://`; `None`: the system's roots.
    pub ca: Option<PemFile>,
    /// A client certificate (chain) and key for `rediss://` servers that ask.
    pub client_cert: Option<PemCertKey>,
    /// A file holding the password (read at each connect, so a rotated one is picked up);
    /// the url then has none.
    pub password_file: Option<std::path::PathBuf>,
    /// Connecting and each exchange with Redis: longer counts as Redis being down.
    pub timeout: Duration,
    /// How often an instance sends its counts and reads back the fleet's.
    pub sync_interval: Duration,
    /// Prefix of every key Weir writes.
    pub prefix: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 (over TLS when the upstream has `tls`).
    #[default]
    Http1,
    /// HTTP/2 over TLS, ALPN `h2` offered (the upstream must have `tls`).
    H2,
    /// HTTP/2 over cleartext TCP with prior knowledge.
    H2c,
    /// Over TLS: ALPN offers `h2` and `http/1.1` and the server chooses; without TLS:
    /// HTTP/1.1.
    Auto,
}

/// TLS to an upstream's servers (`[upstreams.NAME] tls = { ... }`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTls {
    /// The name sent as SNI and verified in the server's certificate; `None`: each server's
    /// host as written in `addr` (a name is sent and verified; an IP address is verified
    /// against the certificate's IP addresses, and no SNI is sent).
    pub server_name: Option<String>,
    /// The CA certificates trusted; `None`: the system's roots.
    pub ca: Option<PemFile>,
    /// A client certificate (chain) and key presented to servers that ask (mTLS).
    pub client_cert: Option<PemCertKey>,
    /// No verification of the server's certificate at all (tests, never the default).
    pub insecure_skip_verify: bool,
}

/// A certificate chain and its private key, both PEM files read at load (an upstream's
/// `client_cert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PemCertKey {
    pub cert: PemFile,
    pub key: PemFile,
}

/// A PEM file as read when the configuration was loaded (checked to hold what its key
/// needs). Comparing contents makes a reload notice a changed file.
#[derive(Clone, PartialEq, Eq)]
pub struct PemFile {
    /// As written in the configuration, a relative path joined to the config file's
    /// directory.
    pub path: std::path::PathBuf,
    pub contents: Vec<u8>,
}

impl std::fmt::Debug for PemFile {
    // Never prints the contents: a key file's bytes are a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PemFile")
            .field("path", &self.path)
            .field("bytes", &self.contents.len())
            .finish()
    }
}

/// One server of an upstream pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamServer {
    /// The address as written in the config (used as `Host` when `preserve_host = false`).
    pub name: String,
    pub addr: SocketAddr,
    /// Relative share of requests under weighted policies (1..=1000).
    pub weight: u32,
    /// Most requests in flight to this server at once, across all workers (each worker
    /// enforces its share, rounded up); `None` = unlimited.
    pub max_connections: Option<u32>,
    /// Used only while no primary (non-backup) server is available.
    pub backup: bool,
    /// Draining: no new requests; requests in flight finish (set live by the admin API).
    pub drain: bool,
}

/// A load-balancing policy (`lb = "..."`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LbPolicy {
    /// Servers in turn, each equally (weights not allowed).
    RoundRobin,
    /// nginx's smooth weighted round robin.
    WeightedRoundRobin,
    /// Fewest in-flight requests relative to weight.
    LeastConnections,
    /// Weighted random.
    Random,
    /// Power of two random choices, comparing peak-EWMA latency x in-flight requests.
    P2cEwma,
    /// A hash ring over the servers, keyed by part of the request.
    ConsistentHash(HashKey),
    /// A cookie names the server; requests without a valid one get one (weighted round robin).
    StickyCookie {
        /// The cookie's name.
        cookie: String,
    },
}

/// What a consistent-hash policy hashes (`hash_key = "..."`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    ClientIp,
    /// The value of the first header of this name (stored lower-cased).
    Header(String),
    /// The value of the cookie of this name.
    Cookie(String),
    /// The request path, without the query string.
    Path,
}

/// Active health checks of an upstream's servers, run once per process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    pub kind: HealthCheckKind,
    /// Time between two checks of a server.
    pub interval: Duration,
    /// Time allowed for one check (connect and, for HTTP, the response status line).
    pub timeout: Duration,
    /// Consecutive successes that mark a down server up.
    pub rise: u32,
    /// Consecutive failures that mark an up server down.
    pub fall: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthCheckKind {
    /// A TCP connect succeeding is a success.
    Tcp,
    /// `GET path` with a status in `expect_status` is a success.
    Http {
        path: String,
        expect_status: Vec<StatusRange>,
    },
    /// gRPC `grpc.health.v1.Health/Check` for `service` (empty: the whole server) over
    /// HTTP/2 (h2c, or h2 on TLS upstreams); `SERVING` is a success.
    Grpc { service: String },
}

/// An inclusive range of status codes (`"200-399"`, or one code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusRange {
    pub first: u16,
    pub last: u16,
}

impl StatusRange {
    pub fn contains(&self, status: u16) -> bool {
        (self.first..=self.last).contains(&status)
    }
}

/// Passive ejection: a server failing `max_fails` times in a row is not chosen for
/// `fail_timeout`, then its weight ramps back up over `slow_start`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassiveHealth {
    /// Consecutive failures that eject a server; 0 turns passive ejection off.
    pub max_fails: u32,
    pub fail_timeout: Duration,
    /// Time over which a returning server's weight ramps from little to full; zero = none.
    pub slow_start: Duration,
}

/// When and how often a failed attempt is retried on another server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Other servers tried after the first attempt fails; 0 = no retries.
    pub attempts: u32,
    pub on: RetryOn,
    /// Retries allowed per 100 requests (per worker, with a small burst allowance).
    pub budget_percent: u32,
}

/// The failures that may be retried (each only when replaying the request is safe).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RetryOn {
    /// The connection could not be opened (nothing was sent).
    pub connect_error: bool,
    /// The connection failed before any response byte.
    pub reset_before_response: bool,
    /// `response_timeout` passed before any response byte.
    pub timeout: bool,
    /// Response statuses retried (before anything was sent to the client).
    pub statuses: Vec<u16>,
}

impl LbPolicy {
    /// The policy's name as written in the config (`lb = "..."`).
    pub fn as_str(&self) -> &'static str {
        match self {
            LbPolicy::RoundRobin => "round_robin",
            LbPolicy::WeightedRoundRobin => "weighted_round_robin",
            LbPolicy::LeastConnections => "least_connections",
            LbPolicy::Random => "random",
            LbPolicy::P2cEwma => "p2c_ewma",
            LbPolicy::ConsistentHash(_) => "consistent_hash",
            LbPolicy::StickyCookie { .. } => "sticky_cookie",
        }
    }
}

/// One address a listener accepts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bind {
    pub addr: SocketAddr,
    /// A plain-HTTP address of a TLS listener (`http_bind`): no handshake; its requests
    /// are redirected to HTTPS when the listener has `redirect_https`.
    pub plain_http: bool,
    /// Not written: the port-80 bind an `acme` listener gets (`http_bind` changes it).
    pub implied: bool,
}

impl Bind {
    /// A written address of the listener's own protocol.
    pub fn new(addr: SocketAddr) -> Bind {
        Bind {
            addr,
            plain_http: false,
            implied: false,
        }
    }
}

/// `min_body_rate` and `min_body_rate_grace` of a listener: a client sending a request body
/// may keep Weir waiting for it `grace`, plus one second for every `bytes_per_second` bytes
/// it has sent; past that the request is abandoned (408). Only time spent waiting for the
/// client counts, not time the upstream takes to accept what was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinBodyRate {
    pub bytes_per_second: u64,
    pub grace: Duration,
}

impl Listener {
    /// Whether `self` and `other` are the same but for their routes, without copying them
    /// (a fleet's listener may have 10,000). Every field is named: one added to `Listener`
    /// does not compile here until it is compared.
    pub fn same_but_routes(&self, other: &Listener) -> bool {
        let Listener {
            name,
            binds,
            protocol,
            proxy_protocol,
            tls,
            backlog,
            defer_accept,
            max_connections,
            keepalive_timeout,
            keepalive_requests,
            header_timeout,
            client_timeout,
            min_body_rate,
            tunnel_idle_timeout,
            tunnel_fin_timeout,
            tunnel_min_progress,
            max_body_size,
            max_header_size,
            max_headers,
            max_informational,
            default_response,
            access_log,
            path_normalization,
            routes: _,
            http2,
            http3,
            redirect_https,
            policy,
        } = self;
        *name == other.name
            && *binds == other.binds
            && *protocol == other.protocol
            && *proxy_protocol == other.proxy_protocol
            && *tls == other.tls
            && (*backlog, *defer_accept, *max_connections)
                == (other.backlog, other.defer_accept, other.max_connections)
            && (*keepalive_timeout, *keepalive_requests)
                == (other.keepalive_timeout, other.keepalive_requests)
            && (*header_timeout, *client_timeout) == (other.header_timeout, other.client_timeout)
            && *min_body_rate == other.min_body_rate
            && (
                *tunnel_idle_timeout,
                *tunnel_fin_timeout,
                *tunnel_min_progress,
            ) == (
                other.tunnel_idle_timeout,
                other.tunnel_fin_timeout,
                other.tunnel_min_progress,
            )
            && (
                *max_body_size,
                *max_header_size,
                *max_headers,
                *max_informational,
            ) == (
                other.max_body_size,
                other.max_header_size,
                other.max_headers,
                other.max_informational,
            )
            && *default_response == other.default_response
            && *access_log == other.access_log
            && *path_normalization == other.path_normalization
            && *http2 == other.http2
            && *http3 == other.http3
            && *redirect_https == other.redirect_https
            && *policy == other.policy
    }

    /// The first address of the listener's own protocol (its first `bind`).
    pub fn first_addr(&self) -> SocketAddr {
        self.binds[0].addr
    }

    /// The TCP settings of a `protocol = "tcp"` listener.
    pub fn tcp(&self) -> Option<&TcpSettings> {
        match &self.protocol {
            Protocol::Tcp(tcp) => Some(tcp),
            Protocol::Http => None,
        }
    }
}

impl Config {
    /// Settings that are valid but dangerous, one line each, for `weir check` and the log.
    pub fn warnings(&self) -> Vec<String> {
        let insecure = self
            .upstreams
            .iter()
            .filter(|u| u.tls.as_ref().is_some_and(|t| t.insecure_skip_verify))
            .map(|u| {
                format!(
                    "upstreams.{}.tls.insecure_skip_verify = true: the servers' certificates \
                     are NOT verified, so anyone on the network path can impersonate them; \
                     set ca (and server_name) instead",
                    u.name
                )
            });
        insecure
            .chain(self.plain_binds_past_client_auth())
            .chain(self.admin.exposure_warning())
            .collect()
    }

    /// Listeners with `client_auth` whose plain `http_bind` addresses serve the routes: a
    /// client there presents no certificate at all. A warning, not an error: a plain bind
    /// serving some routes to anyone can be meant, and a config that ran before still
    /// loads; the client-certificate header is removed there all the same.
    fn plain_binds_past_client_auth(&self) -> impl Iterator<Item = String> + '_ {
        self.listeners
            .iter()
            .filter(|l| l.redirect_https.is_none())
            .filter(|l| {
                let auth = l.tls.as_ref().and_then(|t| t.client_auth.as_ref());
                auth.is_some_and(|a| a.required)
            })
            .filter_map(|l| {
                let plain = l.binds.iter().filter(|b| b.plain_http);
                let addrs: Vec<String> = plain.map(|b| b.addr.to_string()).collect();
                (!addrs.is_empty()).then(|| {
                    format!(
                        "listeners.{}.tls.client_auth: its http_bind address(es) {} serve the \
                         same routes over plain HTTP, where no client certificate is asked \
                         for; set redirect_https = true (or drop http_bind) to keep every \
                         route behind client certificates",
                        l.name,
                        addrs.join(", ")
                    )
                })
            })
    }

    /// One line for `weir check`: counts of listeners, routes, upstreams and servers.
    pub fn summary(&self) -> String {
        let routes: usize = self.listeners.iter().map(|l| l.routes.len()).sum();
        let servers: usize = self.upstreams.iter().map(|u| u.servers.len()).sum();
        format!(
            "{} listener(s), {} route(s), {} upstream(s), {} server(s)",
            self.listeners.len(),
            routes,
            self.upstreams.len(),
            servers
        )
    }
}

// ---------------------------------------------------------------- traffic policy (issue 16)
// The per-route filters and per-listener client settings of docs/configuration.md
// "Traffic policy". Each filter is an `Option`: `None` costs a route nothing per request.

/// The policy filters of one route (`request_headers`, `response_headers`, ...).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RouteFilters {
    /// Rules applied to the request head sent upstream.
    pub request_headers: Option<HeaderRules>,
    /// Rules applied to the response head sent to the client.
    pub response_headers: Option<HeaderRules>,
    /// `allow` / `deny` address lists on the client address.
    pub access: Option<AccessList>,
    /// `rate_limit = { rate, burst, key, max_keys }`.
    pub rate_limit: Option<RateLimit>,
    /// `basic_auth = { users_file, realm }`.
    pub basic_auth: Option<BasicAuth>,
    /// `compression = { algorithms, min_size, types, level }`.
    pub compression: Option<Compression>,
    /// `cache = { store, key, status_header }`: responses cached in a store.
    pub cache: Option<RouteCache>,
}

/// `[caches.NAME]`: an HTTP cache store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheStore {
    pub name: String,
    pub kind: CacheKind,
    /// The bytes of all entries (bodies and heads) together; the least recently used go
    /// first past it.
    pub max_size: u64,
    /// A response with a larger body is streamed through uncached.
    pub max_object_size: u64,
    /// Bodies at least this long go to plain-TCP HTTP/1.1 clients with sendfile(2): a
    /// memory store keeps them in a sealed memfd, a disk store sends them from the file.
    pub sendfile_min_size: u64,
    /// The bytes the store's fills in flight (misses whose body is being recorded) hold in
    /// memory together; a fill that would pass it is abandoned (its response streams on,
    /// uncached). At least `max_object_size`.
    pub max_fill_memory: u64,
    /// A disk store's index in memory (keys, heads, policies): past it the least recently
    /// used keys go, as past `max_size`. `u64::MAX` for a memory store, whose entries
    /// count their index in `max_size`.
    pub index_size: u64,
}

/// Where a cache store keeps its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheKind {
    /// In memory, shared by all workers, emptied by a restart.
    Memory,
    /// One file per entry under `path` (an index in memory, shared by all workers, rebuilt
    /// from the files at start): kept across restarts.
    Disk { path: std::path::PathBuf },
}

impl CacheKind {
    pub fn name(&self) -> &'static str {
        match self {
            CacheKind::Memory => "memory",
            CacheKind::Disk { .. } => "disk",
        }
    }
}

/// A route's cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteCache {
    /// The store's name, and its index in `Config::caches` (set once the stores are known).
    pub store_name: String,
    pub store: usize,
    /// Whose entries the route's are: its listener's and its own name, each after its
    /// length (set with `store`). Every variant the route stores begins with it, and the
    /// route is answered only from those: routes sharing a store never answer from each
    /// other's entries (their upstreams may differ), whatever `key` lists.
    pub scope: std::sync::Arc<[u8]>,
    /// What a response is cached under, in order (default: scheme, host, path, query).
    pub key: Vec<CacheKeyPart>,
    /// Add a `Cache-Status` response header (RFC 9211).
    pub status_header: bool,
    /// How long a miss waits for another request's fetch of its key (collapsed
    /// forwarding) before it goes upstream itself.
    pub lock_timeout: Duration,
    /// When a stale entry answers instead of the upstream's failure.
    pub serve_stale_on: StaleOn,
    /// The request fields Weir writes upstream for this route in place of (or besides) the
    /// client's (the forwarded headers, the request id, `request_headers` rules, trace
    /// context), folded ([`fold_name_byte`]; set with `store`): a response varying on one
    /// is not stored, as the client's copy says nothing of what the upstream saw.
    pub rewritten: std::sync::Arc<[Box<str>]>,
}

/// `serve_stale_on`: the upstream failures a stale entry answers for (besides those a
/// response's `stale-if-error` allows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StaleOn {
    /// The upstream could not be reached or broke off (502, 503).
    pub error: bool,
    /// It did not answer in time (504).
    pub timeout: bool,
    /// It answered with a 5xx status.
    pub status_5xx: bool,
}

/// One part of a cache key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheKeyPart {
    Scheme,
    Host,
    Path,
    Query,
}

impl CacheKeyPart {
    pub const ALL: [CacheKeyPart; 4] = [
        CacheKeyPart::Scheme,
        CacheKeyPart::Host,
        CacheKeyPart::Path,
        CacheKeyPart::Query,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CacheKeyPart::Scheme => "scheme",
            CacheKeyPart::Host => "host",
            CacheKeyPart::Path => "path",
            CacheKeyPart::Query => "query",
        }
    }
}

/// A route's response compression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compression {
    /// The server's preference order (used when the client's q-values tie); not empty,
    /// no repeats.
    pub algorithms: Vec<Encoding>,
    /// Bodies whose Content-Length is below this are sent as they are.
    pub min_size: u64,
    /// Media types compressed (lower case): `type/subtype`, `type/*` or `*/*`.
    pub types: Vec<String>,
    pub levels: CompressionLevels,
}

impl Compression {
    /// Whether a response whose `Content-Type` is `content_type` is compressed: its media
    /// type (before any `;` parameter) matches one of `types`, ignoring case. Never gRPC
    /// (`application/grpc`, `application/grpc+proto`, ...; gRPC-Web is a browser's, which
    /// decodes), whatever `types` says: gRPC compresses per message (`grpc-encoding`), and
    /// its clients do not undo a `Content-Encoding`.
    pub fn compresses_type(&self, content_type: &[u8]) -> bool {
        let media = content_type
            .split(|b| *b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        const GRPC: &[u8] = b"application/grpc";
        let grpc = media.len() >= GRPC.len()
            && media[..GRPC.len()].eq_ignore_ascii_case(GRPC)
            && matches!(media.get(GRPC.len()), None | Some(b'+'));
        if grpc {
            return false;
        }
        self.types.iter().any(|t| {
            let t = t.as_bytes();
            if t == b"*/*" {
                return !media.is_empty();
            }
            match t.strip_suffix(b"*") {
                Some(prefix) => {
                    media.len() > prefix.len() && media[..prefix.len()].eq_ignore_ascii_case(prefix)
                }
                None => media.eq_ignore_ascii_case(t),
            }
        })
    }
}

/// A content coding Weir can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Zstd,
    Br,
    Gzip,
}

impl Encoding {
    pub const ALL: [Encoding; 3] = [Encoding::Zstd, Encoding::Br, Encoding::Gzip];

    /// The coding's token (Content-Encoding, Accept-Encoding and the config).
    pub fn token(self) -> &'static str {
        match self {
            Encoding::Zstd => "zstd",
            Encoding::Br => "br",
            Encoding::Gzip => "gzip",
        }
    }

    /// A dense index (metrics).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Compression level per algorithm (`level = { gzip, br, zstd }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressionLevels {
    /// 1..=9; default 1 (nginx's `gzip_comp_level` default).
    pub gzip: u32,
    /// Brotli quality 0..=11; default 3.
    pub br: u32,
    /// 1..=19; default 3 (zstd's own default).
    pub zstd: i32,
}

impl Default for CompressionLevels {
    fn default() -> CompressionLevels {
        CompressionLevels {
            gzip: 1,
            br: 3,
            zstd: 3,
        }
    }
}

/// HTTP Basic authentication against an htpasswd file, read when the config is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BasicAuth {
    /// Printable ASCII without `"` or `\`.
    pub realm: String,
    pub users_file: std::path::PathBuf,
    /// The file's entries, sorted by name (names are unique).
    pub users: Vec<HtUser>,
}

/// One `name:hash` line of an htpasswd file (bcrypt `$2a$`/`$2b$`/`$2y$`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HtUser {
    pub name: String,
    pub hash: String,
}

impl BasicAuth {
    /// The entry of user `name`.
    pub fn user(&self, name: &[u8]) -> Option<&HtUser> {
        let i = self
            .users
            .binary_search_by(|u| u.name.as_bytes().cmp(name))
            .ok()?;
        self.users.get(i)
    }
}

/// A route's request rate limit (GCRA, shared by all workers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    /// Time between two requests at the sustained rate (`1s / 100` for `"100/s"`).
    pub interval: Duration,
    /// Requests that may come at once (at least 1).
    pub burst: u32,
    pub key: RateKey,
    /// Keys tracked at once: the table's fixed size.
    pub max_keys: usize,
    /// `shared = "NAME"`: the limit holds across every instance that counts in
    /// `[cluster.redis.NAME]`; `None`: this instance alone.
    pub shared: Option<SharedLimit>,
}

/// Where a fleet-wide rate limit counts, and what it does when it cannot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedLimit {
    /// The `[cluster.redis.NAME]` holding the counts.
    pub redis: String,
    pub on_error: OnRedisError,
}

/// `on_error` of a shared rate limit: what requests get while Redis cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnRedisError {
    /// Limited by this instance's own count only (fail open).
    #[default]
    Allow,
    /// Refused with 503 until Redis answers again (fail closed).
    Deny,
}

/// What a rate limit counts separately.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateKey {
    /// Each client address (after PROXY protocol and `trusted_proxies`).
    ClientIp,
    /// Each value of this request header (its name as written); requests without it
    /// share one count.
    Header(String),
    /// The whole route.
    Route,
}

/// `allow = [CIDR...]`, `deny = [CIDR...]` of a route: deny wins; when `allow` is given,
/// addresses outside it are refused too (403).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AccessList {
    /// Empty: every address not denied.
    pub allow: Vec<Cidr>,
    pub deny: Vec<Cidr>,
}

impl AccessList {
    /// Whether a client at `ip` may use the route.
    pub fn permits(&self, ip: IpAddr) -> bool {
        !self.deny.iter().any(|c| c.contains(ip))
            && (self.allow.is_empty() || self.allow.iter().any(|c| c.contains(ip)))
    }
}

/// `request_headers` / `response_headers = { set, add, remove }`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeaderRules {
    /// Replace every header of the name with one line (in name order).
    pub set: Vec<HeaderRule>,
    /// Append one line, keeping the headers already there (in name order).
    pub add: Vec<HeaderRule>,
    /// The names whose incoming lines are dropped, folded ([`fold_name_byte`]): every
    /// `set` and `remove` name.
    pub drop: Vec<String>,
    /// `set` has a `Host` rule (request headers only): it replaces the Host Weir would send.
    pub sets_host: bool,
}

impl HeaderRules {
    /// Whether an incoming header named `name` is dropped (`set` or `remove`), in any case
    /// and with `_` for `-`: `X_User` reaches a WSGI or CGI backend as `HTTP_X_USER`, the
    /// same variable as Weir's `X-User`, so it must not pass beside it.
    #[inline]
    pub fn drops(&self, name: &[u8]) -> bool {
        self.drop.iter().any(|d| {
            d.len() == name.len() && (d.bytes().zip(name)).all(|(d, n)| d == fold_name_byte(*n))
        })
    }
}

/// A header-name byte as Weir compares names a backend may read as one: lower-case, `_`
/// as `-` (CGI, WSGI and PHP map both to `_`).
#[inline]
pub fn fold_name_byte(b: u8) -> u8 {
    match b.to_ascii_lowercase() {
        b'_' => b'-',
        other => other,
    }
}

/// `name` with every byte folded ([`fold_name_byte`]).
pub fn fold_name(name: &str) -> String {
    name.bytes()
        .map(|b| char::from(fold_name_byte(b)))
        .collect()
}

/// One `"Name" = "value template"` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderRule {
    /// The name as written.
    pub name: String,
    pub value: Template,
}

/// A header value with `{variable}`s, split once at load into literal text and variables.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Template(pub Vec<TemplatePart>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplatePart {
    Text(String),
    Var(Variable),
}

/// The variables a header value may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variable {
    /// `http` (or `https` on a TLS listener).
    Scheme,
    /// The request's Host (or absolute-form authority), as sent.
    Host,
    /// The request target as routed: the normalised path and the query.
    Uri,
    /// The routed (normalised) path, without the query.
    Path,
    /// The target's query, without the `?` (empty when there is none).
    Query,
    /// The client address (after PROXY protocol and `trusted_proxies`).
    ClientIp,
    /// The request's id (empty when the listener has `request_id = false`).
    RequestId,
}

impl Variable {
    pub const ALL: [(&'static str, Variable); 7] = [
        ("scheme", Variable::Scheme),
        ("host", Variable::Host),
        ("uri", Variable::Uri),
        ("path", Variable::Path),
        ("query", Variable::Query),
        ("client_ip", Variable::ClientIp),
        ("request_id", Variable::RequestId),
    ];
}

/// The listener's traffic-policy settings (`request_id`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerPolicy {
    /// `None`: `request_id = false`, requests get no id.
    pub request_id: Option<RequestIdSettings>,
    /// Peers whose `X-Forwarded-For` is believed: the client address is then the rightmost
    /// entry not in this list. Empty: the peer (after PROXY protocol) is the client.
    pub trusted_proxies: Vec<Cidr>,
}

impl Default for ListenerPolicy {
    fn default() -> ListenerPolicy {
        ListenerPolicy {
            request_id: Some(RequestIdSettings::default()),
            trusted_proxies: Vec::new(),
        }
    }
}

/// `request_id = { header, trust_client }`: every request gets an id, sent upstream in
/// `header` and logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestIdSettings {
    /// The header name as written (default `X-Request-Id`).
    pub header: String,
    /// Keep a well-formed id the client sent (one line, 1..=128 of `[A-Za-z0-9._-]`).
    pub trust_client: bool,
}

impl Default for RequestIdSettings {
    fn default() -> RequestIdSettings {
        RequestIdSettings {
            header: "X-Request-Id".to_owned(),
            trust_client: true,
        }
    }
}

/// `[tracing]`: spans of requests exported over OTLP/HTTP (protobuf) to a collector.
#[derive(Debug, Clone, PartialEq)]
pub struct Tracing {
    pub endpoint: TracingEndpoint,
    /// Share of new traces sampled, 0.0 to 1.0 (parent-based: a trusted parent's flag
    /// decides for its trace).
    pub sampling: f64,
    /// `service.name` of the exported resource.
    pub service_name: String,
    /// Extra request headers for the collector (such as an API key), name and value.
    pub headers: Vec<(String, String)>,
    /// Most finished spans waiting for export; past it, spans are dropped and counted.
    pub queue_size: usize,
    /// Most spans in one export request.
    pub batch_size: usize,
    /// Longest wait before a batch that is not full is sent.
    pub batch_delay: Duration,
    /// Connect, write and response deadline of one export request.
    pub timeout: Duration,
    /// The CA certificates trusted for an `https://` endpoint; `None`: the system's roots.
    pub ca: Option<PemFile>,
}

/// Where spans are posted: an `http://` or `https://host:port/path` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracingEndpoint {
    /// `host:port`, as connected to and sent in `Host`.
    pub authority: String,
    pub path: String,
    /// `https://`: the export goes over TLS, the certificate checked for the host.
    pub tls: bool,
}
