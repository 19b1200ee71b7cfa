//! Validation: raw TOML structs to the validated [`crate::model`].
//!
//! One small function per section or value. Each fills in defaults, parses durations,
//! sizes and addresses, checks ranges and cross-references, and on the first problem
//! returns an [`Issue`] naming the key, what is wrong and how to fix it. Upstream server
//! addresses given as `host:port` are resolved here (the crate's only network access).

use std::collections::HashMap;
use std::net::{Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::ops::RangeInclusive;
use std::time::Duration;

use crate::error::{FieldPath, Issue};
use crate::model::{
    AccessLog, AccessLogFormat, AdminSettings, Config, DashboardSettings, DefaultResponse,
    HostPattern, Listener, LogFormat, LogTarget, MinBodyRate, PathNormalization, Protocol, Route,
    ServerSettings, Upstream, UpstreamServer, Workers,
};
use crate::raw::{
    RawAccessLog, RawAdmin, RawConfig, RawDefaultResponse, RawListener, RawRoute, RawServer,
    RawUpstream, RawUpstreamServer, StrOrInt,
};
use crate::units::{parse_duration, parse_size};

/// The admin listener's address when `[admin] bind` is not given.
const DEFAULT_ADMIN_BIND: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9901);

/// What names of listeners and upstreams may contain, for messages.
const NAME_CHARS: &str = "letters, digits, '_', '.' and '-'";

/// Validates a whole configuration.
pub(crate) fn config(mut raw: RawConfig) -> Result<Config, Issue> {
    let root = FieldPath::default();
    let etcd = crate::cluster::validate(raw.cluster.as_mut(), &root.key("cluster"))?;
    if let Some(listeners) = raw.listeners.as_mut() {
        crate::cluster::override_binds(raw.cluster.as_ref(), listeners);
    }
    let upstream_names: Vec<String> = raw
        .upstreams
        .as_ref()
        .map(|u| u.keys().cloned().collect())
        .unwrap_or_default();
    let server = server(raw.server.unwrap_or_default(), &root.key("server"))?;
    let admin = admin(raw.admin.unwrap_or_default(), &root.key("admin"))?;
    // A fleet member may have no listeners yet: they arrive from etcd.
    let listeners = match raw.listeners {
        None if etcd.is_some() => Vec::new(),
        listeners_raw => listeners(
            listeners_raw,
            &root.key("listeners"),
            &upstream_names,
            admin.bind,
        )?,
    };
    let redis = cluster::redis(raw.cluster.as_mut(), &root.key("cluster"))?;
    cluster::check_shared_refs(&listeners, &redis, &root.key("listeners"))?;
    let caches = cache::stores(raw.caches.take(), &root.key("caches"))?;
    let mut listeners = listeners;
    cache::resolve_refs(&mut listeners, &caches, &root.key("listeners"))?;
    let mut upstreams = Vec::new();
    for (name, upstream_raw) in raw.upstreams.unwrap_or_default() {
        let path = root.key("upstreams").key(&name);
        upstreams.push(upstream(name, upstream_raw, &path)?);
    }
    tcp::check_passthrough(&listeners, &upstreams, &root.key("listeners"))?;
    let tracing = raw
        .tracing
        .map(|t| tracing::tracing(t, &root.key("tracing")))
        .transpose()?;
    Ok(Config {
        server,
        admin,
        listeners,
        upstreams,
        cluster: crate::model::Cluster { etcd, redis },
        tracing,
        caches,
        relative_paths: Vec::new(),
    })
}

// ---------------------------------------------------------------- [server], [admin]

fn server(raw: RawServer, path: &FieldPath) -> Result<ServerSettings, Issue> {
    Ok(ServerSettings {
        workers: workers(raw.workers, &path.key("workers"))?,
        drain_timeout: duration(raw.drain_timeout, "30s", &path.key("drain_timeout"), false)?,
        cert_check_interval: duration(
            raw.cert_check_interval,
            "5s",
            &path.key("cert_check_interval"),
            false,
        )?,
        background_revalidations: int_in(
            raw.background_revalidations,
            64,
            0..=100_000,
            &path.key("background_revalidations"),
        )?,
        password_checks: int_in(
            raw.password_checks,
            4,
            1..=1024,
            &path.key("password_checks"),
        )?,
        log_format: match raw.log_format.as_deref() {
            None => LogFormat::Text,
            Some(text) => LogFormat::parse(text).ok_or_else(|| {
                Issue::new(
                    &path.key("log_format"),
                    format!("unknown log_format \"{text}\""),
                    "write log_format = \"text\" (the default) or \"json\"",
                )
            })?,
        },
    })
}

fn workers(raw: Option<StrOrInt>, path: &FieldPath) -> Result<Workers, Issue> {
    let fix = r#"use workers = "auto" (one per core) or a number from 1 to 1024"#;
    match raw {
        None => Ok(Workers::Auto),
        Some(StrOrInt::Str(text)) if text == "auto" => Ok(Workers::Auto),
        Some(StrOrInt::Int(n @ 1..=1024)) => usize::try_from(n)
            .map(Workers::Count)
            .map_err(|_| Issue::new(path, format!("workers = {n} is too large"), fix)),
        Some(StrOrInt::Int(n)) => Err(Issue::new(
            path,
            format!("workers must be \"auto\" or from 1 to 1024, not {n}"),
            fix,
        )),
        Some(StrOrInt::Str(text)) if text.trim().parse::<i64>().is_ok() => Err(Issue::new(
            path,
            format!("workers = \"{text}\" is a string, not a number"),
            format!(
                "write workers = {} without quotes, or \"auto\"",
                text.trim()
            ),
        )),
        Some(StrOrInt::Str(text)) => Err(Issue::new(
            path,
            format!("unknown workers value \"{text}\""),
            fix,
        )),
    }
}

/// `[admin] token_file`, refused when it exists but is not a regular file or is too large:
/// read for every API request, a FIFO would hang them all, `/dev/zero` fill memory. A file
/// missing or unreadable here is accepted: it may be made later, or be readable only by
/// the user weir runs as (the API answers 500 until it is readable).
fn token_file(text: &str, at: &FieldPath) -> Result<std::path::PathBuf, Issue> {
    use crate::named_file::{fix_for, read, MAX_SECRET_SIZE};
    let path = std::path::PathBuf::from(text);
    if let Err(e) = read(&path, MAX_SECRET_SIZE) {
        if let Some(fix) = fix_for(&e) {
            return Err(Issue::new(at, format!("token_file {text}: {e}"), fix));
        }
    }
    Ok(path)
}

pub(crate) fn admin(raw: RawAdmin, path: &FieldPath) -> Result<AdminSettings, Issue> {
    let bind = match raw.bind.as_deref() {
        None => Some(DEFAULT_ADMIN_BIND),
        Some("off") => None,
        Some(text) => Some(text.trim().parse::<SocketAddr>().map_err(|_| {
            Issue::new(
                &path.key("bind"),
                format!("invalid admin address \"{text}\": expected an IP address and a port"),
                r#"use an address such as "127.0.0.1:9901", or "off" to disable the admin listener"#,
            )
        })?),
    };
    let token_file = match raw.token_file.as_deref().map(str::trim) {
        None => None,
        Some("") => {
            return Err(Issue::new(
                &path.key("token_file"),
                "token_file is empty",
                "give the path of a file holding the admin API token, or remove token_file",
            ))
        }
        Some(p) => Some(token_file(p, &path.key("token_file"))?),
    };
    let dashboard = dashboard(&raw, path)?;
    let allowed_hosts = admin_hosts::allowed_hosts(raw.allowed_hosts, &path.key("allowed_hosts"))?;
    Ok(AdminSettings {
        bind,
        token_file,
        allowed_hosts,
        header_timeout: duration(raw.header_timeout, "10s", &path.key("header_timeout"), true)?,
        idle_timeout: duration(raw.idle_timeout, "60s", &path.key("idle_timeout"), true)?,
        max_connections: int_in(
            raw.max_connections,
            64,
            1..=65_536,
            &path.key("max_connections"),
        )?,
        dashboard,
    })
}

/// `dashboard`, `dashboard_interval` and `dashboard_history`: the interval from 1 s to
/// 60 s, the history from one interval to an hour (so at most 3600 samples in memory).
fn dashboard(raw: &RawAdmin, path: &FieldPath) -> Result<Option<DashboardSettings>, Issue> {
    let interval_path = path.key("dashboard_interval");
    let interval = duration(raw.dashboard_interval.clone(), "2s", &interval_path, true)?;
    if !(Duration::from_secs(1)..=Duration::from_secs(60)).contains(&interval) {
        return Err(Issue::new(
            &interval_path,
            format!("dashboard_interval must be from 1s to 60s, not {interval:?}"),
            "set dashboard_interval = \"2s\" (the default) or another value from \"1s\" to \"60s\"",
        ));
    }
    let history_path = path.key("dashboard_history");
    let history = duration(raw.dashboard_history.clone(), "5m", &history_path, true)?;
    if history < interval || history > Duration::from_secs(3600) {
        return Err(Issue::new(
            &history_path,
            format!(
                "dashboard_history must be from dashboard_interval ({interval:?}) to 1h, not {history:?}"
            ),
            "set dashboard_history = \"5m\" (the default) or another value up to \"1h\"",
        ));
    }
    let settings = DashboardSettings { interval, history };
    Ok(raw.dashboard.unwrap_or(true).then_some(settings))
}

// ---------------------------------------------------------------- [[listeners]]

fn listeners(
    raw: Option<Vec<RawListener>>,
    path: &FieldPath,
    upstreams: &[String],
    admin: Option<SocketAddr>,
) -> Result<Vec<Listener>, Issue> {
    let raw = raw.filter(|l| !l.is_empty()).ok_or_else(|| {
        Issue::new(
            path,
            "no listeners are defined",
            "add a [[listeners]] table with at least name and bind, such as \
             name = \"web\" and bind = \"127.0.0.1:8080\"",
        )
    })?;
    let https_port = binds::default_https_port(&raw);
    let mut out: Vec<Listener> = Vec::with_capacity(raw.len());
    let mut wants_http_bind = Vec::with_capacity(raw.len());
    for (i, raw_listener) in raw.into_iter().enumerate() {
        let (listener, binds) = listener(raw_listener, &path.index(i), upstreams, https_port)?;
        check_unique_name(&out, &listener, &path.index(i))?;
        binds::check_free(&out, admin, &binds)?;
        let acme = listener.tls.as_ref().is_some_and(|t| t.acme.is_some());
        wants_http_bind.push(acme && binds.http_bind == binds::HttpBind::Absent);
        out.push(listener);
    }
    binds::imply_http_binds(&mut out, &wants_http_bind);
    Ok(out)
}

/// Names must be unique (addresses: `binds::check_free`).
fn check_unique_name(
    earlier: &[Listener],
    listener: &Listener,
    path: &FieldPath,
) -> Result<(), Issue> {
    match earlier.iter().position(|l| l.name == listener.name) {
        Some(i) => Err(Issue::new(
            &path.key("name"),
            format!(
                "duplicate listener name \"{}\" (also listeners[{i}])",
                listener.name
            ),
            "give each listener a unique name",
        )),
        None => Ok(()),
    }
}

/// What kind of listener a setting belongs to, which decides what `bind`, `http_bind`
/// and `http3` may say.
#[derive(Debug, Clone, Copy)]
struct ListenerKind {
    /// It has `[listeners.tls]`.
    tls: bool,
    /// It is a `protocol = "tcp"` listener (a byte relay), not an HTTP one.
    tcp: bool,
}

/// One listener, and its addresses with the keys they were written at; `https_port` is
/// where `redirect_https` sends to unless the listener says otherwise.
fn listener(
    mut raw: RawListener,
    path: &FieldPath,
    upstreams: &[String],
    https_port: u16,
) -> Result<(Listener, binds::Binds), Issue> {
    let key = |k: &str| path.key(k);
    let name = name(raw.name.take(), &key("name"), "listener")?;
    let protocol = tcp::protocol(&mut raw, path, upstreams)?;
    let policy = policy::listener_policy(&mut raw, path)?;
    let tcp = matches!(protocol, Protocol::Tcp(_));
    let kind = ListenerKind {
        tls: raw.tls.is_some(),
        tcp,
    };
    let binds = binds::binds(raw.bind.take(), raw.http_bind.take(), kind, path)?;
    let redirect_https = binds::redirect_https(&raw, &binds, path, https_port)?;
    // A TCP listener may carry a protocol where the server speaks first (SMTP, MySQL):
    // deferring its accept would stall it, so there it is opt-in.
    let defer_accept = raw
        .defer_accept
        .unwrap_or(matches!(protocol, Protocol::Http));
    let normalization =
        path::path_normalization(raw.path_normalization.take(), &key("path_normalization"))?;
    let tunnel_idle_timeout = duration(
        raw.tunnel_idle_timeout.take(),
        "1h",
        &key("tunnel_idle_timeout"),
        true,
    )?;
    Ok(Listener {
        name,
        binds: binds.binds.iter().map(|(b, _)| *b).collect(),
        protocol,
        proxy_protocol: tcp::proxy_protocol(raw.proxy_protocol, &key("proxy_protocol"))?,
        tls: tls::tls(raw.tls, &key("tls"), tcp)?,
        backlog: int_in(raw.backlog, 4096, 1..=65535, &key("backlog"))?,
        defer_accept,
        max_connections: int_in(
            raw.max_connections,
            10_000,
            1..=i64::MAX,
            &key("max_connections"),
        )?,
        keepalive_timeout: duration(
            raw.keepalive_timeout,
            "5s",
            &key("keepalive_timeout"),
            false,
        )?,
        keepalive_requests: int_in(
            raw.keepalive_requests,
            500,
            0..=i64::MAX,
            &key("keepalive_requests"),
        )?,
        header_timeout: duration(raw.header_timeout, "10s", &key("header_timeout"), true)?,
        client_timeout: duration(raw.client_timeout, "60s", &key("client_timeout"), true)?,
        min_body_rate: min_body_rate(raw.min_body_rate, raw.min_body_rate_grace, &key)?,
        tunnel_idle_timeout,
        tunnel_fin_timeout: fin_bound(
            raw.tunnel_fin_timeout,
            tunnel_idle_timeout,
            "tunnel_idle_timeout",
            &key("tunnel_fin_timeout"),
        )?,
        tunnel_min_progress: min_progress(raw.tunnel_min_progress, &key("tunnel_min_progress"))?,
        max_body_size: Some(size(raw.max_body_size, 0, &key("max_body_size"))?).filter(|n| *n > 0),
        max_header_size: max_header_size(raw.max_header_size, &key("max_header_size"))?,
        max_headers: int_in(raw.max_headers, 100, 1..=1000, &key("max_headers"))?,
        max_informational: int_in(raw.max_informational, 8, 1..=100, &key("max_informational"))?,
        default_response: default_response(raw.default_response, &key("default_response"))?,
        access_log: access_log(raw.access_log, &key("access_log"))?,
        redirect_https,
        routes: routes(raw.routes, &key("routes"), upstreams, &normalization)?,
        path_normalization: normalization,
        http2: http2::http2(raw.http2, &key("http2"))?,
        http3: http3::http3(raw.http3, kind, &key("http3"))?,
        policy,
    })
    .and_then(|l| policy::check_listener(l, path))
    .and_then(|mut l| {
        http3::check_early_data(&l, &key("http3").key("early_data"))?;
        http3::advertise(&mut l);
        tls::fill_internal_names(&mut l);
        tls::fill_acme_domains(&mut l, &key("routes"), &key("tls").key("acme"))?;
        Ok((l, binds))
    })
}

fn max_header_size(raw: Option<StrOrInt>, path: &FieldPath) -> Result<usize, Issue> {
    let bytes = size(raw, 16 * 1024, path)?;
    if !(1024..=1024 * 1024).contains(&bytes) {
        return Err(Issue::new(
            path,
            format!("max_header_size must be between 1KiB and 1MiB, not {bytes} bytes"),
            r#"set max_header_size to a size such as "16KiB" (the default)"#,
        ));
    }
    usize::try_from(bytes)
        .map_err(|_| Issue::new(path, "max_header_size is too large", "use at most \"1MiB\""))
}

fn default_response(
    raw: Option<RawDefaultResponse>,
    path: &FieldPath,
) -> Result<DefaultResponse, Issue> {
    let raw = raw.unwrap_or_default();
    let content_type = raw.content_type.unwrap_or_else(|| "text/plain".to_owned());
    let printable = content_type
        .chars()
        .all(|c| c == '\t' || (' '..='~').contains(&c));
    if content_type.trim().is_empty() || !printable {
        return Err(Issue::new(
            &path.key("content_type"),
            "content_type must be a non-empty header value of printable ASCII characters",
            r#"use a media type such as "text/plain" or "text/html; charset=utf-8""#,
        ));
    }
    Ok(DefaultResponse {
        status: int_in(raw.status, 404, 200..=599, &path.key("status"))?,
        body: raw.body.unwrap_or_else(|| "no route\n".to_owned()),
        content_type,
    })
}

fn access_log(raw: Option<RawAccessLog>, path: &FieldPath) -> Result<Option<AccessLog>, Issue> {
    let Some(raw) = raw else { return Ok(None) };
    let format = match raw.format.as_deref() {
        None | Some("combined") => AccessLogFormat::Combined,
        Some("common") => AccessLogFormat::Common,
        Some("json") => AccessLogFormat::Json,
        Some("off") => return Ok(None),
        Some(other) => {
            return Err(Issue::new(
                &path.key("format"),
                format!("unknown access log format \"{other}\""),
                r#"use format = "combined", "common", "json" or "off""#,
            ))
        }
    };
    let target = match raw.path.as_deref().map(str::trim) {
        None | Some("stdout") => LogTarget::Stdout,
        Some("") => {
            return Err(Issue::new(
                &path.key("path"),
                "the access log path is empty",
                r#"write a file path such as path = "/var/log/weir/access.log", or "stdout""#,
            ))
        }
        Some(file) => LogTarget::File(file.into()),
    };
    Ok(Some(AccessLog { format, target }))
}

// ---------------------------------------------------------------- [[listeners.routes]]

fn routes(
    raw: Option<Vec<RawRoute>>,
    path: &FieldPath,
    upstreams: &[String],
    normalization: &PathNormalization,
) -> Result<Vec<Route>, Issue> {
    let raw = raw.unwrap_or_default();
    let mut out: Vec<Route> = Vec::with_capacity(raw.len());
    let mut earlier = EarlierRoutes::with_capacity(raw.len());
    for (i, mut raw_route) in raw.into_iter().enumerate() {
        let route = match raw_route.validated.take() {
            Some(validated) => *validated,
            None => route(raw_route, &path.index(i), upstreams)?,
        };
        path::check_prefix(
            &route.path_prefix,
            normalization,
            &path.index(i).key("path_prefix"),
        )?;
        earlier.check(&out, &route, &path.index(i))?;
        earlier.add(&route, i);
        out.push(route);
    }
    Ok(out)
}

/// A listener's routes so far, indexed by name and by place (path prefix, exact or not) so
/// that checking a route against them does not compare it with every earlier one (a fleet's
/// listener may have 10,000 routes).
#[derive(Default)]
struct EarlierRoutes {
    names: HashMap<String, usize>,
    places: HashMap<(String, bool), Vec<usize>>,
}

impl EarlierRoutes {
    fn with_capacity(n: usize) -> EarlierRoutes {
        EarlierRoutes {
            names: HashMap::with_capacity(n),
            places: HashMap::with_capacity(n),
        }
    }

    fn add(&mut self, route: &Route, i: usize) {
        self.names.insert(route.name.clone(), i);
        let place = (route.path_prefix.clone(), route.matching.exact);
        self.places.entry(place).or_default().push(i);
    }

    /// Route names are unique per listener, and a route must be able to match something.
    fn check(&self, earlier: &[Route], route: &Route, path: &FieldPath) -> Result<(), Issue> {
        if let Some(i) = self.names.get(&route.name) {
            return Err(Issue::new(
                &path.key("name"),
                format!(
                    "duplicate route name \"{}\" (also routes[{i}] of this listener)",
                    route.name
                ),
                "give each route of a listener a unique name",
            ));
        }
        // An earlier route at the same place takes every request this one could match when
        // it has no conditions (a catch-all there) or exactly the same ones.
        let place = (route.path_prefix.clone(), route.matching.exact);
        let same = |r: &&Route| {
            same_hosts(&r.hosts, &route.hosts)
                && (!r.matching.has_conditions() || r.matching == route.matching)
        };
        let at_place = self.places.get(&place).map_or(&[][..], Vec::as_slice);
        match at_place.iter().map(|&i| &earlier[i]).find(same) {
            None => Ok(()),
            Some(first) => Err(Issue::new(
                &path.key("path_prefix"),
                format!(
                    "route \"{}\" has the same hosts and path_prefix \"{}\" as route \"{}\" (which has no method, header or query conditions, or the same ones), so it could never match",
                    route.name, route.path_prefix, first.name
                ),
                "change its hosts or path_prefix, or remove one of the two routes",
            )),
        }
    }
}

fn same_hosts(a: &[HostPattern], b: &[HostPattern]) -> bool {
    a.iter().all(|h| b.contains(h)) && b.iter().all(|h| a.contains(h))
}

/// Whether validating `route` read files: a `basic_auth` users file, a `files` root. A
/// route validated once may be taken as it was (a fleet's cached routes, parsed.rs) only
/// when this is false; a new check in [`route`] that reads the disk must be named here.
pub(crate) fn route_reads_files(route: &Route) -> bool {
    route.filters.basic_auth.is_some()
        || matches!(route.target, crate::model::RouteTarget::Files(_))
}

fn route(mut raw: RawRoute, path: &FieldPath, upstreams: &[String]) -> Result<Route, Issue> {
    let filters = policy::route_filters(&mut raw, path)?;
    let name = raw
        .name
        .take()
        .filter(|n| !n.trim().is_empty())
        .ok_or_else(|| {
            Issue::new(
                &path.key("name"),
                "the route has no name",
                r#"add name = "..." to the route"#,
            )
        })?;
    let matching = route_match::matching(&mut raw, path)?;
    let split_fallback = route_match::split_fallback(&raw, path)?;
    let target = route_match::target(&mut raw, path, upstreams)?;
    let rewrite_prefix = match raw.rewrite_prefix {
        None => None,
        Some(text) => Some(url_path(text, &path.key("rewrite_prefix"))?),
    };
    let reverse_rewrite = raw.reverse_rewrite.unwrap_or(false);
    if reverse_rewrite && rewrite_prefix.is_none() {
        return Err(Issue::new(
            &path.key("reverse_rewrite"),
            "reverse_rewrite = true needs rewrite_prefix",
            r#"set rewrite_prefix (such as "/"), or remove reverse_rewrite"#,
        ));
    }
    route_match::check_local_keys(&target, rewrite_prefix.is_some(), path)?;
    let trace_sampling = tracing::route_tracing(raw.tracing.take(), path)?;
    Ok(Route {
        hosts: hosts(raw.hosts, &path.key("hosts"))?,
        path_prefix: url_path(
            raw.path_prefix.unwrap_or_else(|| "/".to_owned()),
            &path.key("path_prefix"),
        )?,
        matching,
        target,
        split_fallback,
        name,
        rewrite_prefix,
        reverse_rewrite,
        preserve_host: raw.preserve_host.unwrap_or(true),
        forwarded_headers: raw.forwarded_headers.unwrap_or(true),
        upgrades: upgrades(raw.upgrades, &path.key("upgrades"))?,
        filters,
        trace_sampling,
    })
}

/// Most protocols one route may allow (the request path keeps the offered ones as bits).
const MAX_UPGRADES: usize = 64;

/// `upgrades`: protocol names (tokens, no version), lower-cased, no duplicates, none that
/// would carry HTTP itself past Weir's routes.
fn upgrades(raw: Option<Vec<String>>, path: &FieldPath) -> Result<Vec<String>, Issue> {
    let Some(raw) = raw else {
        return Ok(vec!["websocket".to_owned()]);
    };
    if raw.len() > MAX_UPGRADES {
        return Err(Issue::new(
            path,
            format!("more than {MAX_UPGRADES} upgrade protocols"),
            "list only the protocols the route's servers speak",
        ));
    }
    let mut names: Vec<String> = Vec::with_capacity(raw.len());
    for (i, text) in raw.iter().enumerate() {
        let name = text.to_ascii_lowercase();
        let at = path.index(i);
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(Issue::new(
                &at,
                format!("upgrade protocol \"{text}\" is not a protocol name"),
                r#"write the name alone, without a version or spaces, such as "websocket""#,
            ));
        }
        if matches!(name.as_str(), "h2c" | "h2" | "http") {
            return Err(Issue::new(
                &at,
                format!(
                    "upgrade protocol \"{text}\" would tunnel HTTP past Weir: the client could \
                     then send any request to the server, outside the routes"
                ),
                format!("remove \"{text}\" from upgrades (HTTP/2 to clients is a listener matter, not an upgrade)"),
            ));
        }
        if names.contains(&name) {
            return Err(Issue::new(
                &at,
                format!("upgrade protocol \"{text}\" is listed twice"),
                "list each protocol once",
            ));
        }
        names.push(name);
    }
    Ok(names)
}

/// A `tchar` of RFC 9110 5.6.2 (a token character).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// `path_prefix` and `rewrite_prefix`: start with `/`, no whitespace, query or fragment.
fn url_path(text: String, path: &FieldPath) -> Result<String, Issue> {
    let key = path.last_key();
    if !text.starts_with('/') {
        return Err(Issue::new(
            path,
            format!("{key} \"{text}\" must start with '/'"),
            format!("write it as \"/{text}\""),
        ));
    }
    if text
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '?' || c == '#')
    {
        return Err(Issue::new(
            path,
            format!("{key} \"{text}\" contains whitespace, '?' or '#'"),
            "use only the path part of a URL; percent-encode special characters",
        ));
    }
    Ok(text)
}

fn upstream_index(
    raw: Option<String>,
    path: &FieldPath,
    upstreams: &[String],
) -> Result<usize, Issue> {
    let Some(name) = raw else {
        let fix = if upstreams.is_empty() {
            r#"add upstream = "NAME" and define [upstreams.NAME] with servers = [{ addr = "host:port" }]"#
                .to_owned()
        } else {
            format!(
                "add upstream = \"...\" naming one of: {}",
                upstreams.join(", ")
            )
        };
        return Err(Issue::new(path, "the route has no upstream", fix));
    };
    let table = FieldPath::default().key("upstreams").key(&name);
    let fix = if upstreams.is_empty() {
        format!("define [{table}] with servers = [{{ addr = \"host:port\" }}]")
    } else {
        format!("define [{table}] or use one of: {}", upstreams.join(", "))
    };
    upstreams
        .binary_search(&name)
        .map_err(|_| Issue::new(path, format!("unknown upstream \"{name}\""), fix))
}

fn hosts(raw: Option<Vec<String>>, path: &FieldPath) -> Result<Vec<HostPattern>, Issue> {
    let Some(raw) = raw else {
        return Ok(vec![HostPattern::Any]);
    };
    if raw.is_empty() {
        return Err(Issue::new(
            path,
            "hosts is empty, so the route could never match",
            r#"list at least one host, or use hosts = ["*"] for any host"#,
        ));
    }
    raw.iter()
        .enumerate()
        .map(|(i, text)| {
            host_pattern(text).map_err(|(message, fix)| Issue::new(&path.index(i), message, fix))
        })
        .collect()
}

/// `"*"`, `"*.example.com"` or an exact host name; an error is `(message, fix)`.
fn host_pattern(text: &str) -> Result<HostPattern, (String, String)> {
    let lower = text.to_ascii_lowercase();
    if lower == "*" {
        return Ok(HostPattern::Any);
    }
    match lower.strip_prefix("*.") {
        Some(rest) => host_name(text, rest).map(|()| HostPattern::Suffix(format!(".{rest}"))),
        None => host_name(text, &lower).map(|()| HostPattern::Exact(lower.clone())),
    }
}

/// Checks the host-name part `name` of the pattern `text`.
fn host_name(text: &str, name: &str) -> Result<(), (String, String)> {
    let err = |message: String, fix: &str| Err((message, fix.to_owned()));
    if name.contains('*') {
        return err(
            format!("host \"{text}\": '*' may only stand alone or start a pattern as \"*.\""),
            r#"use "*" for any host or "*.example.com" for its subdomains"#,
        );
    }
    if let Some(inner) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        if inner.parse::<Ipv6Addr>().is_ok() {
            return Ok(());
        }
    }
    if name.contains(':') {
        return err(
            format!("host \"{text}\" includes a port; host patterns match the host name only"),
            "remove the \":PORT\" part (the listener's bind address decides the port)",
        );
    }
    let valid_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if name.is_empty() || !valid_chars || name.split('.').any(str::is_empty) {
        return err(
            format!("\"{text}\" is not a valid host name"),
            "use labels of letters, digits, '-' and '_' separated by single dots \
             (internationalized names in punycode, xn--...)",
        );
    }
    Ok(())
}

// ---------------------------------------------------------------- [upstreams.NAME]

fn upstream(name: String, mut raw: RawUpstream, path: &FieldPath) -> Result<Upstream, Issue> {
    check_name(&name, path, "upstream")?;
    let raw_policy = pool::RawPolicy::take(&mut raw);
    let protocol = upstream_protocol::protocol(&raw, path)?;
    let discover = discover::discover(raw.discover.take(), raw.servers.is_some(), path)?;
    let servers = match discover {
        Some(_) => Vec::new(),
        None => servers(&name, raw.servers.take(), &path.key("servers"))?,
    };
    let policy = pool::policy(raw_policy, &servers, path)?;
    grpc_check_needs_h2(policy.health_check.as_ref(), protocol, path)?;
    Ok(Upstream {
        connect_timeout: duration(
            raw.connect_timeout,
            "2s",
            &path.key("connect_timeout"),
            true,
        )?,
        response_timeout: duration(
            raw.response_timeout,
            "60s",
            &path.key("response_timeout"),
            true,
        )?,
        idle_timeout: duration(raw.idle_timeout, "60s", &path.key("idle_timeout"), false)?,
        max_idle: int_in(raw.max_idle, 256, 0..=i64::MAX, &path.key("max_idle"))?,
        name,
        servers,
        lb: policy.lb,
        health_check: policy.health_check,
        passive: policy.passive,
        retry: policy.retry,
        tls: upstream_tls::upstream_tls(raw.tls, &path.key("tls"))?,
        protocol,
        max_concurrent_streams: int_in(
            raw.max_concurrent_streams,
            100,
            1..=65_535,
            &path.key("max_concurrent_streams"),
        )?,
        max_header_list_size: http2::header_list_size(
            raw.max_header_list_size,
            &path.key("max_header_list_size"),
        )?,
        discover,
    })
}

/// The `servers` of a pool without `discover`: at least one.
fn servers(
    name: &str,
    raw: Option<Vec<RawUpstreamServer>>,
    path: &FieldPath,
) -> Result<Vec<UpstreamServer>, Issue> {
    let raw = raw.filter(|s| !s.is_empty()).ok_or_else(|| {
        Issue::new(
            path,
            format!("upstream \"{name}\" has no servers"),
            r#"add servers = [{ addr = "127.0.0.1:8081" }], or discover = { dns = "NAME:PORT" }"#,
        )
    })?;
    raw.into_iter()
        .enumerate()
        .map(|(i, s)| upstream_server(s, &path.index(i)))
        .collect()
}

/// A `kind = "grpc"` health check speaks HTTP/2: the upstream must say so.
fn grpc_check_needs_h2(
    check: Option<&crate::model::HealthCheck>,
    protocol: crate::model::UpstreamProtocol,
    path: &FieldPath,
) -> Result<(), Issue> {
    use crate::model::UpstreamProtocol;
    let grpc = check.is_some_and(|c| matches!(c.kind, crate::model::HealthCheckKind::Grpc { .. }));
    if grpc && !matches!(protocol, UpstreamProtocol::H2 | UpstreamProtocol::H2c) {
        return Err(Issue::new(
            &path.key("health_check").key("kind"),
            "kind = \"grpc\" health checks speak HTTP/2 (gRPC servers speak nothing else), but the upstream's protocol is not \"h2\" or \"h2c\"",
            r#"set protocol = "h2c" on the upstream (or "h2" with tls), or use kind = "tcp""#,
        ));
    }
    Ok(())
}

/// Resolves `addr` (`ip:port` or `host:port`) to its first socket address; `path` is the
/// server's entry in `servers`.
fn upstream_server(
    raw: RawUpstreamServer,
    server_path: &FieldPath,
) -> Result<UpstreamServer, Issue> {
    let (weight, max_connections, backup) = pool::server_options(&raw, server_path)?;
    let path = &server_path.key("addr");
    let Some(name) = raw.addr else {
        return Err(Issue::new(
            path,
            "the server has no addr",
            r#"write { addr = "host:port" }"#,
        ));
    };
    check_host_port(&name, path)?;
    let addr = resolve(&name, path)?;
    Ok(UpstreamServer {
        name,
        addr,
        weight,
        max_connections,
        backup,
        drain: raw.drain.unwrap_or(false),
    })
}

/// `name` must be `host:port`, with a port other than 0 and IPv6 addresses in brackets.
fn check_host_port(name: &str, path: &FieldPath) -> Result<(), Issue> {
    let Some((host, port)) = name
        .rsplit_once(':')
        .filter(|(_, p)| p.parse::<u16>().is_ok())
    else {
        return Err(Issue::new(
            path,
            format!("server address \"{name}\" has no port"),
            format!("write it as \"host:port\", such as \"{name}:80\""),
        ));
    };
    if port.parse::<u16>() == Ok(0) {
        return Err(Issue::new(
            path,
            format!("server address \"{name}\" has port 0"),
            "use the port the server listens on",
        ));
    }
    if host.contains(':') && !host.starts_with('[') {
        return Err(Issue::new(
            path,
            format!("IPv6 address \"{host}\" needs brackets"),
            format!("write it as \"[{host}]:{port}\""),
        ));
    }
    Ok(())
}

/// The first socket address `name` resolves to (no lookup for `ip:port`).
fn resolve(name: &str, path: &FieldPath) -> Result<SocketAddr, Issue> {
    let fix = "check the host name, or use an IP address";
    match name.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| Issue::new(path, format!("\"{name}\" resolved to no address"), fix)),
        Err(e) => Err(Issue::new(
            path,
            format!("cannot resolve \"{name}\": {e}"),
            fix,
        )),
    }
}

// ---------------------------------------------------------------- values

/// Listener and upstream names: required, `[A-Za-z0-9_.-]+`.
fn name(raw: Option<String>, path: &FieldPath, what: &str) -> Result<String, Issue> {
    let name = raw.ok_or_else(|| {
        Issue::new(
            path,
            format!("the {what} has no name"),
            format!("add name = \"...\" ({NAME_CHARS})"),
        )
    })?;
    check_name(&name, path, what)?;
    Ok(name)
}

fn check_name(name: &str, path: &FieldPath, what: &str) -> Result<(), Issue> {
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if name.is_empty() || !name.chars().all(valid) {
        return Err(Issue::new(
            path,
            format!("invalid {what} name \"{name}\": it may contain only {NAME_CHARS}"),
            format!("rename the {what}, e.g. \"{}\"", suggest_name(name)),
        ));
    }
    Ok(())
}

/// `name` with every invalid character replaced by `-` (or `"main"` if empty).
fn suggest_name(name: &str) -> String {
    let fixed: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    if fixed.trim_matches('-').is_empty() {
        "main".to_owned()
    } else {
        fixed
    }
}

/// An integer in `range` (default `default`), converted to the model's type.
fn int_in<T: TryFrom<i64>>(
    raw: Option<i64>,
    default: i64,
    range: RangeInclusive<i64>,
    path: &FieldPath,
) -> Result<T, Issue> {
    let key = path.last_key();
    let value = raw.unwrap_or(default);
    let (min, max) = (*range.start(), *range.end());
    let wanted = if max == i64::MAX {
        format!("at least {min}")
    } else {
        format!("between {min} and {max}")
    };
    if !range.contains(&value) {
        return Err(Issue::new(
            path,
            format!("{key} must be {wanted}, not {value}"),
            format!("set {key} to a number {wanted} (default {default})"),
        ));
    }
    T::try_from(value).map_err(|_| {
        Issue::new(
            path,
            format!("{key} = {value} is too large for this platform"),
            format!("use a smaller {key}"),
        )
    })
}

/// The least a relay's unsent queues must drain to count as progress (`min_progress`,
/// `tunnel_min_progress`): 16 KiB by default, between 1 byte (any drain counts, as
/// HAProxy does) and 16 MiB (more than any socket buffer: only Weir's own transfers
/// count).
/// `min_body_rate` (a size a second, 240 bytes by default as Kestrel's; `0` turns it off)
/// and `min_body_rate_grace` (5 s).
fn min_body_rate(
    rate: Option<StrOrInt>,
    grace: Option<String>,
    key: &dyn Fn(&str) -> FieldPath,
) -> Result<Option<MinBodyRate>, Issue> {
    let bytes_per_second = size(rate, 240, &key("min_body_rate"))?;
    let grace = duration(grace, "5s", &key("min_body_rate_grace"), false)?;
    Ok((bytes_per_second > 0).then_some(MinBodyRate {
        bytes_per_second,
        grace,
    }))
}

fn min_progress(raw: Option<StrOrInt>, path: &FieldPath) -> Result<u64, Issue> {
    let value = size(raw, 16 * 1024, path)?;
    if !(1..=16 * 1024 * 1024).contains(&value) {
        let key = path.last_key();
        return Err(Issue::new(
            path,
            format!("{key} must be between 1 byte and 16MiB, not {value} bytes"),
            format!("set {key} to a size such as \"16KiB\" (the default)"),
        ));
    }
    Ok(value)
}

/// A half-close bound (`tunnel_fin_timeout`, TCP `fin_timeout`): left out, it is the
/// idle bound `idle` (named `idle_key`), as HAProxy's `timeout client-fin` falls back to
/// the idle timeout, so a half-closed tail lives as long as a quiet open tunnel; set, it
/// must be positive and at most `idle` (a longer one would outlive the tunnel's own
/// bound, which is surely a mistake, so it is refused rather than clamped).
fn fin_bound(
    raw: Option<String>,
    idle: Duration,
    idle_key: &str,
    path: &FieldPath,
) -> Result<Duration, Issue> {
    let Some(text) = raw else {
        return Ok(idle);
    };
    let key = path.last_key();
    let fin = duration(Some(text.clone()), "30s", path, true)?;
    if fin > idle {
        return Err(Issue::new(
            path,
            // Debug prints "300ms" or "2s": sub-second bounds do not show as "0s".
            format!("{key} = \"{text}\" is longer than {idle_key} ({idle:?})"),
            format!("set {key} at most {idle_key}, or leave it out (it then equals {idle_key})"),
        ));
    }
    Ok(fin)
}

/// A duration (default `default`); with `positive`, zero is rejected.
pub(crate) fn duration(
    raw: Option<String>,
    default: &str,
    path: &FieldPath,
    positive: bool,
) -> Result<Duration, Issue> {
    let key = path.last_key();
    let text = raw.as_deref().unwrap_or(default);
    let value = parse_duration(text).map_err(|e| {
        Issue::new(
            path,
            e,
            format!("write {key} as a duration such as \"{default}\""),
        )
    })?;
    if positive && value.is_zero() {
        return Err(Issue::new(
            path,
            format!("{key} must be greater than 0"),
            format!("set a positive duration such as \"{default}\" (the default)"),
        ));
    }
    Ok(value)
}

/// A size in bytes: a string with a unit, or a plain integer count of bytes.
pub(crate) fn size(raw: Option<StrOrInt>, default: u64, path: &FieldPath) -> Result<u64, Issue> {
    let key = path.last_key();
    let fix = format!("write {key} as a size such as \"16KiB\" or \"10MB\"");
    match raw {
        None => Ok(default),
        Some(StrOrInt::Str(text)) => parse_size(&text).map_err(|e| Issue::new(path, e, fix)),
        Some(StrOrInt::Int(n)) => u64::try_from(n)
            .map_err(|_| Issue::new(path, format!("{key} must not be negative"), fix)),
    }
}

mod admin_hosts;
mod binds;
mod cache;
mod cluster;
mod compression;
mod discover;
mod files;
mod htpasswd;
mod http2;
mod http3;
mod path;
mod policy;
mod pool;
mod route_match;
pub(crate) mod tcp;
mod tls;
mod tracing;
mod upstream_protocol;
mod upstream_tls;
pub(crate) use upstream_tls::{cert_key, certificates};

#[cfg(test)]
pub(crate) mod tests;
