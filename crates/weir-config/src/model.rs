//! The validated configuration model.
//!
//! Everything here has passed validation: defaults are filled in, durations and sizes are
//! parsed, names are resolved to indices, and no `Option` remains that validation settled.
//! Runtime code (the data plane, the admin API) only ever sees these types.

use std::net::SocketAddr;
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http,
}

/// One data-plane listener (`[[listeners]]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Listener {
    pub name: String,
    pub bind: SocketAddr,
    pub protocol: Protocol,
    pub backlog: u32,
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
    /// Index into [`Config::upstreams`].
    pub upstream: usize,
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
}

/// One server of an upstream pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamServer {
    /// The address as written in the config (used as `Host` when `preserve_host = false`).
    pub name: String,
    pub addr: SocketAddr,
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
