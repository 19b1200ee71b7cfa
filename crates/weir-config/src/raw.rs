//! The configuration exactly as written: serde structs mirroring the TOML.
//!
//! Every key is optional here (`Option`), integers are `i64` and durations and sizes are
//! strings, so that missing keys, ranges and units are reported by validation with a
//! message and a fix instead of a bare serde error. Unknown keys are rejected everywhere.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::Deserialize;

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub server: Option<RawServer>,
    pub admin: Option<RawAdmin>,
    pub listeners: Option<Vec<RawListener>>,
    /// `[upstreams.NAME]`: the server pools routes and TCP listeners send to, by name
    /// (a `BTreeMap`: sorted by name).
    pub upstreams: Option<BTreeMap<String, RawUpstream>>,
    pub cluster: Option<crate::cluster::RawCluster>,
    pub tracing: Option<RawTracing>,
    /// `[caches.NAME]`: HTTP cache stores routes refer to by name.
    pub caches: Option<BTreeMap<String, RawCacheStore>>,
}

/// `[tracing]`: OpenTelemetry traces exported over OTLP/HTTP (validate/tracing.rs).
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTracing {
    pub endpoint: Option<String>,
    pub sampling: Option<f64>,
    pub service_name: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
    pub queue_size: Option<i64>,
    pub batch_size: Option<i64>,
    pub batch_delay: Option<String>,
    pub timeout: Option<String>,
    pub ca_file: Option<String>,
}

/// `tracing = { sampling }` of a route.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRouteTracing {
    pub sampling: Option<f64>,
}

/// `[caches.NAME]`: one HTTP cache store.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCacheStore {
    pub kind: Option<String>,
    pub path: Option<String>,
    pub max_size: Option<StrOrInt>,
    pub max_object_size: Option<StrOrInt>,
    pub sendfile_min_size: Option<StrOrInt>,
    pub max_fill_memory: Option<StrOrInt>,
    pub index_size: Option<StrOrInt>,
}

/// A route's `cache = { store, key, status_header, lock_timeout, serve_stale_on }`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRouteCache {
    pub store: Option<String>,
    pub key: Option<Vec<String>>,
    pub status_header: Option<bool>,
    pub lock_timeout: Option<String>,
    pub serve_stale_on: Option<Vec<String>>,
}

/// `[cluster.redis.NAME]`: a Redis server holding shared rate-limit counts.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRedis {
    pub url: Option<String>,
    pub ca: Option<String>,
    pub client_cert: Option<RawCertKey>,
    pub password_file: Option<String>,
    pub timeout: Option<String>,
    pub sync_interval: Option<String>,
    pub prefix: Option<String>,
}

/// `[server]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    pub workers: Option<StrOrInt>,
    pub drain_timeout: Option<String>,
    pub cert_check_interval: Option<String>,
    pub log_format: Option<String>,
    pub background_revalidations: Option<i64>,
    pub password_checks: Option<i64>,
}

/// `[admin]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub bind: Option<String>,
    pub token_file: Option<String>,
    pub allowed_hosts: Option<Vec<String>>,
    pub header_timeout: Option<String>,
    pub idle_timeout: Option<String>,
    pub max_connections: Option<i64>,
    pub dashboard: Option<bool>,
    pub dashboard_interval: Option<String>,
    pub dashboard_history: Option<String>,
}

/// `[[listeners]]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListener {
    pub name: Option<String>,
    /// One address or several (`"0.0.0.0:443"`, `["0.0.0.0:443", "[::]:443"]`).
    pub bind: Option<StrOrList>,
    /// Plain-HTTP addresses of a TLS listener, with the same routes; `"off"`.
    pub http_bind: Option<StrOrList>,
    pub protocol: Option<String>,
    pub backlog: Option<i64>,
    pub defer_accept: Option<bool>,
    pub max_connections: Option<i64>,
    pub keepalive_timeout: Option<String>,
    pub keepalive_requests: Option<i64>,
    pub header_timeout: Option<String>,
    pub client_timeout: Option<String>,
    pub min_body_rate: Option<StrOrInt>,
    pub min_body_rate_grace: Option<String>,
    pub tunnel_idle_timeout: Option<String>,
    pub tunnel_fin_timeout: Option<String>,
    pub tunnel_min_progress: Option<StrOrInt>,
    pub max_body_size: Option<StrOrInt>,
    pub max_header_size: Option<StrOrInt>,
    pub max_headers: Option<i64>,
    pub max_informational: Option<i64>,
    pub default_response: Option<RawDefaultResponse>,
    pub access_log: Option<RawAccessLog>,
    pub routes: Option<Vec<RawRoute>>,
    pub proxy_protocol: Option<RawProxyProtocol>,
    pub path_normalization: Option<RawPathNormalization>,
    pub http2: Option<RawHttp2>,
    pub http3: Option<RawHttp3>,
    pub tls: Option<RawTls>,
    pub redirect_https: Option<bool>,
    pub redirect_https_port: Option<i64>,
    // Traffic policy (issue 16; validate/policy.rs).
    pub request_id: Option<RawRequestId>,
    pub trusted_proxies: Option<Vec<String>>,
    // TCP listeners only.
    pub upstream: Option<String>,
    pub idle_timeout: Option<String>,
    pub fin_timeout: Option<String>,
    pub min_progress: Option<StrOrInt>,
    pub buffer_size: Option<StrOrInt>,
    pub splice: Option<String>,
    pub sni_routes: Option<Vec<RawSniRoute>>,
    pub preread_timeout: Option<String>,
}

/// One entry of a TCP listener's `sni_routes = [{ hosts, upstream }]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSniRoute {
    pub hosts: Option<Vec<String>>,
    pub upstream: Option<String>,
}

/// `proxy_protocol = { ... }` of a listener.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProxyProtocol {
    pub accept: Option<bool>,
    pub send: Option<String>,
    pub trusted: Option<Vec<String>>,
}

/// `[listeners.path_normalization]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPathNormalization {
    pub dot_segments: Option<bool>,
    pub merge_slashes: Option<bool>,
    pub encoded_slash: Option<String>,
}

/// `[listeners.http2]`: HTTP/2 (h2c) settings and flood defences of an HTTP listener.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHttp2 {
    pub max_concurrent_streams: Option<i64>,
    pub max_header_list_size: Option<StrOrInt>,
    pub initial_stream_window: Option<StrOrInt>,
    pub initial_connection_window: Option<StrOrInt>,
    pub max_send_buffer: Option<StrOrInt>,
    pub max_connection_send_buffer: Option<StrOrInt>,
    pub reset_budget: Option<i64>,
    pub reset_window: Option<String>,
    pub max_pending_accept_resets: Option<i64>,
    pub max_local_error_resets: Option<i64>,
    pub glitch_budget: Option<i64>,
    pub glitch_window: Option<String>,
    pub stall_timeout: Option<String>,
    pub max_informational: Option<i64>,
    pub max_tunnels: Option<i64>,
}

/// `[listeners.tls]`: TLS termination.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    pub certs: Option<Vec<RawCertKey>>,
    pub acme: Option<RawAcme>,
    pub internal_ca: Option<RawInternalCa>,
    pub default_cert: Option<String>,
    pub min_version: Option<String>,
    pub alpn: Option<Vec<String>>,
    pub session_resumption: Option<bool>,
    pub client_auth: Option<RawClientAuth>,
    pub client_cert_header: Option<String>,
    pub handshake_timeout: Option<String>,
    pub max_handshakes: Option<i64>,
}

/// `acme = { domains = [...], ... }`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAcme {
    pub domains: Option<Vec<String>>,
    pub contact: Option<StrOrList>,
    pub directory: Option<String>,
    pub challenge: Option<String>,
    pub storage: Option<String>,
    pub directory_ca: Option<String>,
    pub retry_initial: Option<String>,
}

/// `"one"` or `["one", "two"]`.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub(crate) enum StrOrList {
    One(String),
    Many(Vec<String>),
}

/// `internal_ca = { storage = "...", lifetime = "7d" }`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawInternalCa {
    pub storage: Option<String>,
    pub lifetime: Option<String>,
}

/// `{ cert = "chain.pem", key = "key.pem" }`: an entry of a listener's `certs`, or an
/// upstream's `client_cert`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCertKey {
    pub cert: Option<String>,
    pub key: Option<String>,
}

/// `client_auth = { ca = "...", required = true }`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawClientAuth {
    pub ca: Option<String>,
    pub required: Option<bool>,
}

/// `[listeners.access_log]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAccessLog {
    pub format: Option<String>,
    pub path: Option<String>,
}

/// `default_response = { ... }` of a listener.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDefaultResponse {
    pub status: Option<i64>,
    pub body: Option<String>,
    pub content_type: Option<String>,
}

/// `[[listeners.routes]]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    /// The route as validated before from the same value and upstream names (a fleet's
    /// `cluster::objects::Parsed` keeps it; never read from a file): taken as it is.
    #[serde(skip)]
    pub validated: Option<Box<crate::model::Route>>,
    pub name: Option<String>,
    pub hosts: Option<Vec<String>>,
    pub path_prefix: Option<String>,
    pub rewrite_prefix: Option<String>,
    pub reverse_rewrite: Option<bool>,
    pub preserve_host: Option<bool>,
    pub forwarded_headers: Option<bool>,
    pub upgrades: Option<Vec<String>>,
    pub upstream: Option<String>,
    // Matching conditions and local targets (issue 16), validated in validate/route_match.rs.
    pub exact: Option<bool>,
    pub methods: Option<Vec<String>>,
    pub match_headers: Option<BTreeMap<String, String>>,
    pub match_query: Option<BTreeMap<String, String>>,
    pub upstreams: Option<Vec<RawWeightedUpstream>>,
    pub split_fallback: Option<bool>,
    pub respond: Option<RawRespond>,
    pub redirect: Option<RawRedirect>,
    /// Static files (issue 27; validate/files.rs).
    pub files: Option<RawFiles>,
    // Traffic policy (issue 16; validate/policy.rs).
    pub request_headers: Option<RawHeaderRules>,
    pub response_headers: Option<RawHeaderRules>,
    pub allow: Option<Vec<String>>,
    pub deny: Option<Vec<String>>,
    pub rate_limit: Option<RawRateLimit>,
    pub basic_auth: Option<RawBasicAuth>,
    pub compression: Option<RawCompression>,
    pub tracing: Option<RawRouteTracing>,
    // The HTTP cache (issue 27; validate/cache.rs).
    pub cache: Option<RawRouteCache>,
}

/// `compression = { algorithms, min_size, types, level }` of a route.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCompression {
    pub algorithms: Option<Vec<String>>,
    pub min_size: Option<StrOrInt>,
    pub types: Option<Vec<String>>,
    pub level: Option<RawCompressionLevels>,
}

/// `level = { gzip, br, zstd }` of a route's `compression`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCompressionLevels {
    pub gzip: Option<i64>,
    pub br: Option<i64>,
    pub zstd: Option<i64>,
}

/// One entry of a route's `upstreams = [{ name = "v1", weight = 95 }]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWeightedUpstream {
    pub name: Option<String>,
    pub weight: Option<i64>,
}

/// `respond = { status, body, headers }` of a route.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRespond {
    pub status: Option<i64>,
    pub body: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
}

/// `redirect = { to, status }` of a route.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRedirect {
    pub to: Option<String>,
    pub status: Option<i64>,
}

/// `files = { root, index, try_files, ... }` of a route.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFiles {
    pub root: Option<String>,
    pub index: Option<Vec<String>>,
    pub try_files: Option<Vec<String>>,
    pub follow_symlinks: Option<bool>,
    pub hidden: Option<bool>,
    pub precompressed: Option<Vec<String>>,
    pub cache_control: Option<String>,
    pub sendfile_min_size: Option<StrOrInt>,
    pub listing: Option<bool>,
    pub open_file_cache: Option<i64>,
    pub open_file_cache_valid: Option<String>,
}

/// `basic_auth = { users_file, realm }` of a route.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBasicAuth {
    pub users_file: Option<String>,
    pub realm: Option<String>,
}

/// `rate_limit = { rate, burst, key, max_keys, shared, on_error }` of a route.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateLimit {
    pub rate: Option<String>,
    pub burst: Option<i64>,
    pub key: Option<String>,
    pub max_keys: Option<i64>,
    pub shared: Option<String>,
    pub on_error: Option<String>,
}

/// A setting written as `true` / `false` or as a table of its settings (`request_id`,
/// `http3`).
#[derive(Debug, Clone)]
pub(crate) enum Switch<T> {
    Switch(bool),
    Table(T),
}

/// `request_id = false | true | { header, trust_client }` of a listener.
pub(crate) type RawRequestId = Switch<RawRequestIdTable>;

/// `http3 = false | true | { max_concurrent_streams, ... }` of a TLS listener.
pub(crate) type RawHttp3 = Switch<RawHttp3Table>;

impl<'de, T: Deserialize<'de> + Described> Deserialize<'de> for Switch<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(SwitchVisitor(std::marker::PhantomData))
    }
}

/// What a table of a [`Switch`] is, for the parser's error.
pub(crate) trait Described {
    const EXPECTING: &'static str;
}

impl Described for RawRequestIdTable {
    const EXPECTING: &'static str =
        "true, false or a table { header = \"X-Request-Id\", trust_client = true }";
}

impl Described for RawHttp3Table {
    const EXPECTING: &'static str =
        "true, false or a table { max_concurrent_streams = 100, idle_timeout = \"30s\", ... }";
}

struct SwitchVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de> + Described> Visitor<'de> for SwitchVisitor<T> {
    type Value = Switch<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Switch<T>, E> {
        Ok(Switch::Switch(v))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Switch<T>, A::Error> {
        T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Switch::Table)
    }
}

/// `http3 = { ... }`: QUIC and HTTP/3 settings of a TLS listener (docs/http3.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHttp3Table {
    pub enabled: Option<bool>,
    pub max_concurrent_streams: Option<i64>,
    pub stream_window: Option<StrOrInt>,
    pub connection_window: Option<StrOrInt>,
    pub idle_timeout: Option<String>,
    pub max_field_section_size: Option<StrOrInt>,
    pub alt_svc_max_age: Option<String>,
    pub retry_threshold: Option<i64>,
    pub early_data: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRequestIdTable {
    pub header: Option<String>,
    pub trust_client: Option<bool>,
}

/// `request_headers` / `response_headers = { set, add, remove }` of a route.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHeaderRules {
    pub set: Option<BTreeMap<String, String>>,
    pub add: Option<BTreeMap<String, String>>,
    pub remove: Option<Vec<String>>,
}

/// `[upstreams.NAME]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpstream {
    pub servers: Option<Vec<RawUpstreamServer>>,
    pub connect_timeout: Option<String>,
    pub response_timeout: Option<String>,
    pub idle_timeout: Option<String>,
    pub max_idle: Option<i64>,
    pub lb: Option<String>,
    pub hash_key: Option<String>,
    pub sticky_cookie: Option<String>,
    pub health_check: Option<RawHealthCheck>,
    pub passive: Option<RawPassive>,
    pub retry: Option<RawRetry>,
    pub tls: Option<RawUpstreamTls>,
    pub protocol: Option<String>,
    pub max_concurrent_streams: Option<i64>,
    pub max_header_list_size: Option<StrOrInt>,
    pub discover: Option<RawDiscover>,
}

/// `discover = { dns, kind, interval, respect_ttl, nameserver, timeout }` of an upstream.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDiscover {
    pub dns: Option<String>,
    pub kind: Option<String>,
    pub interval: Option<String>,
    pub respect_ttl: Option<bool>,
    pub nameserver: Option<String>,
    pub timeout: Option<String>,
}

/// `tls = { ... }` of an upstream.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpstreamTls {
    pub server_name: Option<String>,
    pub ca: Option<String>,
    pub client_cert: Option<RawCertKey>,
    pub insecure_skip_verify: Option<bool>,
}

/// One entry of `servers = [{ addr = "..." }]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpstreamServer {
    pub addr: Option<String>,
    pub weight: Option<i64>,
    pub max_connections: Option<i64>,
    pub backup: Option<bool>,
    pub drain: Option<bool>,
}

/// `[upstreams.NAME.health_check]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHealthCheck {
    pub kind: Option<String>,
    pub path: Option<String>,
    pub expect_status: Option<StrOrInt>,
    pub service: Option<String>,
    pub interval: Option<String>,
    pub timeout: Option<String>,
    pub rise: Option<i64>,
    pub fall: Option<i64>,
}

/// `[upstreams.NAME.passive]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPassive {
    pub max_fails: Option<i64>,
    pub fail_timeout: Option<String>,
    pub slow_start: Option<String>,
}

/// `[upstreams.NAME.retry]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRetry {
    pub attempts: Option<i64>,
    pub on: Option<Vec<StrOrInt>>,
    pub budget_percent: Option<i64>,
}

/// A value that may be written as a string or as an integer (`workers`, sizes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StrOrInt {
    Str(String),
    Int(i64),
}

impl<'de> Deserialize<'de> for StrOrInt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrOrIntVisitor)
    }
}

struct StrOrIntVisitor;

impl Visitor<'_> for StrOrIntVisitor {
    type Value = StrOrInt;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string or an integer")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<StrOrInt, E> {
        Ok(StrOrInt::Str(v.to_owned()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<StrOrInt, E> {
        Ok(StrOrInt::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<StrOrInt, E> {
        i64::try_from(v)
            .map(StrOrInt::Int)
            .map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
    }
}
