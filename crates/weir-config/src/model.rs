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
}

/// Process-wide settings (`[server]`).
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    pub workers: Workers,
    pub drain_timeout: Duration,
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
    /// Time allowed for a whole request head: from the connection's accept for its first
    /// request, from the first byte for later ones.
    pub header_timeout: Duration,
    /// Longest wait for the client between requests, for a request body, and for the
    /// client to take response bytes.
    pub idle_timeout: Duration,
    /// Most admin connections open at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
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
    /// Bytes buffered per direction when copying (not splicing).
    pub buffer_size: usize,
    pub splice: SpliceMode,
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
    pub bind: SocketAddr,
    pub protocol: Protocol,
    /// Accepting (any listener) and sending (TCP listeners) PROXY protocol headers.
    pub proxy_protocol: ProxyProtocol,
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
    /// Largest request body accepted; `None` = unlimited.
    pub max_body_size: Option<u64>,
    /// Largest request head (request line + headers) accepted; beyond it: 431.
    pub max_header_size: usize,
    /// Most header fields accepted in one request head; beyond it: 431.
    pub max_headers: usize,
    pub default_response: DefaultResponse,
    /// `None` when access logging is off.
    pub access_log: Option<AccessLog>,
    pub routes: Vec<Route>,
    /// Traffic-policy settings of the listener (issue 16): request ids, ...
    pub policy: ListenerPolicy,
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
    /// Index into [`Config::upstreams`].
    pub upstream: usize,
    /// Traffic-policy filters (issue 16): header rules, access lists, ...
    pub filters: RouteFilters,
}

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

impl Listener {
    /// The TCP settings of a `protocol = "tcp"` listener.
    pub fn tcp(&self) -> Option<&TcpSettings> {
        match &self.protocol {
            Protocol::Tcp(tcp) => Some(tcp),
            Protocol::Http => None,
        }
    }
}

impl Config {
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
    /// The lower-cased names whose incoming lines are dropped: every `set` and `remove` name.
    pub drop: Vec<String>,
    /// `set` has a `Host` rule (request headers only): it replaces the Host Weir would send.
    pub sets_host: bool,
}

impl HeaderRules {
    /// Whether an incoming header named `name` is dropped (`set` or `remove`).
    #[inline]
    pub fn drops(&self, name: &[u8]) -> bool {
        self.drop
            .iter()
            .any(|d| d.len() == name.len() && d.as_bytes().eq_ignore_ascii_case(name))
    }
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
    /// The request target: path and query, as the client sent it.
    Uri,
    /// The target's path, without the query.
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
