//! Validation: raw TOML structs to the validated [`crate::model`].
//!
//! One small function per section or value. Each fills in defaults, parses durations,
//! sizes and addresses, checks ranges and cross-references, and on the first problem
//! returns an [`Issue`] naming the key, what is wrong and how to fix it. Upstream server
//! addresses given as `host:port` are resolved here (the crate's only network access).

use std::net::{Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::ops::RangeInclusive;
use std::time::Duration;

use crate::error::{FieldPath, Issue};
use crate::model::{
    AdminSettings, Config, DefaultResponse, HostPattern, Listener, Protocol, Route,
    ServerSettings, Upstream, UpstreamServer, Workers,
};
use crate::raw::{
    RawAdmin, RawConfig, RawDefaultResponse, RawListener, RawRoute, RawServer, RawUpstream,
    RawUpstreamServer, StrOrInt,
};
use crate::units::{parse_duration, parse_size};

/// The admin listener's address when `[admin] bind` is not given.
const DEFAULT_ADMIN_BIND: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9901);

/// What names of listeners and upstreams may contain, for messages.
const NAME_CHARS: &str = "letters, digits, '_', '.' and '-'";

/// Validates a whole configuration.
pub(crate) fn config(raw: RawConfig) -> Result<Config, Issue> {
    let root = FieldPath::default();
    let upstream_names: Vec<String> = raw
        .upstreams
        .as_ref()
        .map(|u| u.keys().cloned().collect())
        .unwrap_or_default();
    let server = server(raw.server.unwrap_or_default(), &root.key("server"))?;
    let admin = admin(raw.admin.unwrap_or_default(), &root.key("admin"))?;
    let listeners = listeners(raw.listeners, &root.key("listeners"), &upstream_names)?;
    check_admin_conflict(&admin, &listeners, &root.key("listeners"))?;
    let mut upstreams = Vec::new();
    for (name, upstream_raw) in raw.upstreams.unwrap_or_default() {
        let path = root.key("upstreams").key(&name);
        upstreams.push(upstream(name, upstream_raw, &path)?);
    }
    Ok(Config {
        server,
        admin,
        listeners,
        upstreams,
    })
}

// ---------------------------------------------------------------- [server], [admin]

fn server(raw: RawServer, path: &FieldPath) -> Result<ServerSettings, Issue> {
    Ok(ServerSettings {
        workers: workers(raw.workers, &path.key("workers"))?,
        drain_timeout: duration(raw.drain_timeout, "30s", &path.key("drain_timeout"), false)?,
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
            format!("write workers = {} without quotes, or \"auto\"", text.trim()),
        )),
        Some(StrOrInt::Str(text)) => Err(Issue::new(
            path,
            format!("unknown workers value \"{text}\""),
            fix,
        )),
    }
}

fn admin(raw: RawAdmin, path: &FieldPath) -> Result<AdminSettings, Issue> {
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
    Ok(AdminSettings { bind })
}

/// The admin listener and a data-plane listener may not bind the same address.
fn check_admin_conflict(
    admin: &AdminSettings,
    listeners: &[Listener],
    path: &FieldPath,
) -> Result<(), Issue> {
    let Some(admin_bind) = admin.bind.filter(|a| a.port() != 0) else {
        return Ok(());
    };
    match listeners.iter().position(|l| l.bind == admin_bind) {
        None => Ok(()),
        Some(i) => Err(Issue::new(
            &path.index(i).key("bind"),
            format!("{admin_bind} is already used by the admin listener"),
            "use another address for this listener, or move the admin listener with \
             [admin] bind = \"...\" (or disable it with \"off\")",
        )),
    }
}

// ---------------------------------------------------------------- [[listeners]]

fn listeners(
    raw: Option<Vec<RawListener>>,
    path: &FieldPath,
    upstreams: &[String],
) -> Result<Vec<Listener>, Issue> {
    let raw = raw.filter(|l| !l.is_empty()).ok_or_else(|| {
        Issue::new(
            path,
            "no listeners are defined",
            "add a [[listeners]] table with at least name and bind, such as \
             name = \"web\" and bind = \"127.0.0.1:8080\"",
        )
    })?;
    let mut out: Vec<Listener> = Vec::with_capacity(raw.len());
    for (i, raw_listener) in raw.into_iter().enumerate() {
        let listener = listener(raw_listener, &path.index(i), upstreams)?;
        check_unique_listener(&out, &listener, &path.index(i))?;
        out.push(listener);
    }
    Ok(out)
}

/// Names must be unique; so must bind addresses, except port 0 (a fresh port each time).
fn check_unique_listener(
    earlier: &[Listener],
    listener: &Listener,
    path: &FieldPath,
) -> Result<(), Issue> {
    if let Some(i) = earlier.iter().position(|l| l.name == listener.name) {
        return Err(Issue::new(
            &path.key("name"),
            format!("duplicate listener name \"{}\" (also listeners[{i}])", listener.name),
            "give each listener a unique name",
        ));
    }
    let port_zero = listener.bind.port() == 0;
    match earlier.iter().position(|l| l.bind == listener.bind) {
        Some(i) if !port_zero => Err(Issue::new(
            &path.key("bind"),
            format!(
                "{} is already the bind address of listener \"{}\" (listeners[{i}])",
                listener.bind, earlier[i].name
            ),
            "use a different address or port for one of the two listeners",
        )),
        _ => Ok(()),
    }
}

fn listener(raw: RawListener, path: &FieldPath, upstreams: &[String]) -> Result<Listener, Issue> {
    let key = |k: &str| path.key(k);
    Ok(Listener {
        name: name(raw.name, &key("name"), "listener")?,
        bind: listener_bind(raw.bind, &key("bind"))?,
        protocol: protocol(raw.protocol, &key("protocol"))?,
        backlog: int_in(raw.backlog, 4096, 1..=65535, &key("backlog"))?,
        max_connections: int_in(raw.max_connections, 10_000, 1..=i64::MAX, &key("max_connections"))?,
        keepalive_timeout: duration(raw.keepalive_timeout, "5s", &key("keepalive_timeout"), false)?,
        keepalive_requests: int_in(raw.keepalive_requests, 500, 0..=i64::MAX, &key("keepalive_requests"))?,
        header_timeout: duration(raw.header_timeout, "10s", &key("header_timeout"), true)?,
        client_timeout: duration(raw.client_timeout, "60s", &key("client_timeout"), true)?,
        max_body_size: Some(size(raw.max_body_size, 0, &key("max_body_size"))?).filter(|n| *n > 0),
        max_header_size: max_header_size(raw.max_header_size, &key("max_header_size"))?,
        max_headers: int_in(raw.max_headers, 100, 1..=1000, &key("max_headers"))?,
        default_response: default_response(raw.default_response, &key("default_response"))?,
        routes: routes(raw.routes, &key("routes"), upstreams)?,
    })
}

fn listener_bind(raw: Option<String>, path: &FieldPath) -> Result<SocketAddr, Issue> {
    let fix = r#"write an IP address and a port, such as bind = "127.0.0.1:8080" or "[::]:8080""#;
    let text = raw.ok_or_else(|| Issue::new(path, "the listener has no bind address", fix))?;
    text.trim().parse().map_err(|_| {
        Issue::new(
            path,
            format!("invalid bind address \"{text}\": expected an IP address and a port"),
            fix,
        )
    })
}

fn protocol(raw: Option<String>, path: &FieldPath) -> Result<Protocol, Issue> {
    match raw.as_deref() {
        None | Some("http") => Ok(Protocol::Http),
        Some("tcp") => Err(Issue::new(
            path,
            "TCP listeners are not supported yet",
            r#"use protocol = "http", or remove the key"#,
        )),
        Some(other) => Err(Issue::new(
            path,
            format!("unknown protocol \"{other}\""),
            r#"use protocol = "http" (the only protocol supported), or remove the key"#,
        )),
    }
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
    usize::try_from(bytes).map_err(|_| Issue::new(path, "max_header_size is too large", "use at most \"1MiB\""))
}

fn default_response(
    raw: Option<RawDefaultResponse>,
    path: &FieldPath,
) -> Result<DefaultResponse, Issue> {
    let raw = raw.unwrap_or_default();
    let content_type = raw.content_type.unwrap_or_else(|| "text/plain".to_owned());
    let printable = content_type.chars().all(|c| c == '\t' || (' '..='~').contains(&c));
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

// ---------------------------------------------------------------- [[listeners.routes]]

fn routes(
    raw: Option<Vec<RawRoute>>,
    path: &FieldPath,
    upstreams: &[String],
) -> Result<Vec<Route>, Issue> {
    let mut out: Vec<Route> = Vec::new();
    for (i, raw_route) in raw.unwrap_or_default().into_iter().enumerate() {
        let route = route(raw_route, &path.index(i), upstreams)?;
        check_route_against_earlier(&out, &route, &path.index(i))?;
        out.push(route);
    }
    Ok(out)
}

/// Route names are unique per listener, and a route must be able to match something.
fn check_route_against_earlier(earlier: &[Route], route: &Route, path: &FieldPath) -> Result<(), Issue> {
    if let Some(i) = earlier.iter().position(|r| r.name == route.name) {
        return Err(Issue::new(
            &path.key("name"),
            format!("duplicate route name \"{}\" (also routes[{i}] of this listener)", route.name),
            "give each route of a listener a unique name",
        ));
    }
    let same = |r: &&Route| r.path_prefix == route.path_prefix && same_hosts(&r.hosts, &route.hosts);
    match earlier.iter().find(same) {
        None => Ok(()),
        Some(first) => Err(Issue::new(
            &path.key("path_prefix"),
            format!(
                "route \"{}\" has the same hosts and path_prefix \"{}\" as route \"{}\", so it could never match",
                route.name, route.path_prefix, first.name
            ),
            "change its hosts or path_prefix, or remove one of the two routes",
        )),
    }
}

fn same_hosts(a: &[HostPattern], b: &[HostPattern]) -> bool {
    a.iter().all(|h| b.contains(h)) && b.iter().all(|h| a.contains(h))
}

fn route(raw: RawRoute, path: &FieldPath, upstreams: &[String]) -> Result<Route, Issue> {
    let name = raw.name.filter(|n| !n.trim().is_empty()).ok_or_else(|| {
        Issue::new(&path.key("name"), "the route has no name", r#"add name = "..." to the route"#)
    })?;
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
    Ok(Route {
        hosts: hosts(raw.hosts, &path.key("hosts"))?,
        path_prefix: url_path(raw.path_prefix.unwrap_or_else(|| "/".to_owned()), &path.key("path_prefix"))?,
        upstream: upstream_index(raw.upstream, &path.key("upstream"), upstreams)?,
        name,
        rewrite_prefix,
        reverse_rewrite,
        preserve_host: raw.preserve_host.unwrap_or(true),
        forwarded_headers: raw.forwarded_headers.unwrap_or(true),
    })
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
    if text.chars().any(|c| c.is_whitespace() || c.is_control() || c == '?' || c == '#') {
        return Err(Issue::new(
            path,
            format!("{key} \"{text}\" contains whitespace, '?' or '#'"),
            "use only the path part of a URL; percent-encode special characters",
        ));
    }
    Ok(text)
}

fn upstream_index(raw: Option<String>, path: &FieldPath, upstreams: &[String]) -> Result<usize, Issue> {
    let wanted = raw.as_deref().unwrap_or("NAME");
    let table = FieldPath::default().key("upstreams").key(wanted);
    let fix = if upstreams.is_empty() {
        format!("define [{table}] with servers = [{{ addr = \"host:port\" }}]")
    } else {
        format!("define [{table}] or use one of: {}", upstreams.join(", "))
    };
    let Some(name) = raw else {
        return Err(Issue::new(path, "the route has no upstream", format!("add upstream = \"...\"; {fix}")));
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

fn upstream(name: String, raw: RawUpstream, path: &FieldPath) -> Result<Upstream, Issue> {
    check_name(&name, path, "upstream")?;
    let servers_path = path.key("servers");
    let raw_servers = raw.servers.filter(|s| !s.is_empty()).ok_or_else(|| {
        Issue::new(
            &servers_path,
            format!("upstream \"{name}\" has no servers"),
            r#"add servers = [{ addr = "127.0.0.1:8081" }]"#,
        )
    })?;
    let servers = raw_servers
        .into_iter()
        .enumerate()
        .map(|(i, s)| upstream_server(s, &servers_path.index(i).key("addr")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Upstream {
        connect_timeout: duration(raw.connect_timeout, "2s", &path.key("connect_timeout"), true)?,
        response_timeout: duration(raw.response_timeout, "60s", &path.key("response_timeout"), true)?,
        idle_timeout: duration(raw.idle_timeout, "60s", &path.key("idle_timeout"), false)?,
        max_idle: int_in(raw.max_idle, 256, 0..=i64::MAX, &path.key("max_idle"))?,
        name,
        servers,
    })
}

/// Resolves `addr` (`ip:port` or `host:port`) to its first socket address.
fn upstream_server(raw: RawUpstreamServer, path: &FieldPath) -> Result<UpstreamServer, Issue> {
    let Some(name) = raw.addr else {
        return Err(Issue::new(path, "the server has no addr", r#"write { addr = "host:port" }"#));
    };
    let Some((host, port)) = name.rsplit_once(':').filter(|(_, p)| p.parse::<u16>().is_ok()) else {
        return Err(Issue::new(
            path,
            format!("server address \"{name}\" has no port"),
            format!("write it as \"host:port\", such as \"{name}:80\""),
        ));
    };
    if host.contains(':') && !host.starts_with('[') {
        return Err(Issue::new(
            path,
            format!("IPv6 address \"{host}\" needs brackets"),
            format!("write it as \"[{host}]:{port}\""),
        ));
    }
    let first = name.to_socket_addrs().map(|mut addrs| addrs.next());
    let addr = match first {
        Ok(Some(addr)) => addr,
        Ok(None) => return Err(Issue::new(path, format!("\"{name}\" resolved to no address"), "check the host name, or use an IP address")),
        Err(e) => return Err(Issue::new(path, format!("cannot resolve \"{name}\": {e}"), "check the host name, or use an IP address")),
    };
    if addr.port() == 0 {
        return Err(Issue::new(path, format!("server address \"{name}\" has port 0"), "use the port the server listens on"));
    }
    Ok(UpstreamServer { name, addr })
}

// ---------------------------------------------------------------- values

/// Listener and upstream names: required, `[A-Za-z0-9_.-]+`.
fn name(raw: Option<String>, path: &FieldPath, what: &str) -> Result<String, Issue> {
    let name = raw.ok_or_else(|| {
        Issue::new(path, format!("the {what} has no name"), format!("add name = \"...\" ({NAME_CHARS})"))
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
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.') { c } else { '-' })
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
        Issue::new(path, format!("{key} = {value} is too large for this platform"), format!("use a smaller {key}"))
    })
}

/// A duration (default `default`); with `positive`, zero is rejected.
fn duration(raw: Option<String>, default: &str, path: &FieldPath, positive: bool) -> Result<Duration, Issue> {
    let key = path.last_key();
    let text = raw.as_deref().unwrap_or(default);
    let value = parse_duration(text)
        .map_err(|e| Issue::new(path, e, format!("write {key} as a duration such as \"{default}\"")))?;
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
fn size(raw: Option<StrOrInt>, default: u64, path: &FieldPath) -> Result<u64, Issue> {
    let key = path.last_key();
    let fix = format!("write {key} as a size such as \"16KiB\" or \"10MB\"");
    match raw {
        None => Ok(default),
        Some(StrOrInt::Str(text)) => parse_size(&text).map_err(|e| Issue::new(path, e, fix)),
        Some(StrOrInt::Int(n)) => {
            u64::try_from(n).map_err(|_| Issue::new(path, format!("{key} must not be negative"), fix))
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::fail;
    use crate::{parse_str, HostPattern};

    /// A valid listener on lines 1-3.
    const LISTENER: &str = "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\n";

    /// A valid listener (lines 1-3) with one route (lines 4-6) and upstream `cgi` (last 2 lines).
    fn with_route(route_lines: &str) -> String {
        format!(
            "{LISTENER}[[listeners.routes]]\nname = \"r\"\nupstream = \"cgi\"\n{route_lines}\
             [upstreams.cgi]\nservers = [{{ addr = \"127.0.0.1:8081\" }}]\n"
        )
    }

    /// A valid listener (lines 1-3) and upstream `u` (header on line 4).
    fn with_upstream(lines: &str) -> String {
        format!("{LISTENER}[upstreams.u]\n{lines}")
    }

    /// Asserts the error's field and line, and that message and fix say something useful.
    #[track_caller]
    fn check(source: &str, field: &str, line: usize, message: &str, fix: &str) {
        let e = fail(source);
        assert_eq!((e.field.as_str(), e.line), (field, line), "{e}");
        assert!(e.message.contains(message), "message of: {e}");
        assert!(e.fix.contains(fix), "fix of: {e}");
        assert!(!e.to_string().contains('\n'), "one line: {e}");
    }

    #[test]
    fn server_settings() {
        let w = "server.workers";
        check(&format!("[server]\nworkers = 0\n{LISTENER}"), w, 2, "from 1 to 1024, not 0", "\"auto\"");
        check(&format!("[server]\nworkers = 1025\n{LISTENER}"), w, 2, "not 1025", "1 to 1024");
        check(&format!("[server]\nworkers = \"4\"\n{LISTENER}"), w, 2, "is a string", "workers = 4 without quotes");
        check(&format!("[server]\nworkers = \"many\"\n{LISTENER}"), w, 2, "\"many\"", "\"auto\"");
        let d = "server.drain_timeout";
        check(&format!("[server]\ndrain_timeout = \"30\"\n{LISTENER}"), d, 2, "no unit", "\"30s\"");
        check(&format!("[server]\ndrain_timeout = \"1d\"\n{LISTENER}"), d, 2, "unit \"d\"", "duration");
    }

    #[test]
    fn admin_settings() {
        let source = format!("[admin]\nbind = \"localhost:9901\"\n{LISTENER}");
        check(&source, "admin.bind", 2, "invalid admin address", "\"off\"");
        let source = format!("{LISTENER}[[listeners]]\nname = \"b\"\nbind = \"127.0.0.1:9901\"\n");
        check(&source, "listeners[1].bind", 6, "already used by the admin listener", "\"off\"");
        let moved = format!("[admin]\nbind = \"127.0.0.1:9902\"\n{source}");
        assert!(parse_str(&moved, "weir.toml").is_ok());
    }

    #[test]
    fn listeners_are_required() {
        check("", "listeners", 1, "no listeners", "[[listeners]]");
        check("# no listeners\nlisteners = []\n[server]\nworkers = 2\n", "listeners", 2, "no listeners", "bind");
    }

    #[test]
    fn listener_names_and_binds() {
        let l = "listeners[0]";
        check("[[listeners]]\nbind = \"127.0.0.1:1\"\n", &format!("{l}.name"), 1, "no name", "name = ");
        check("[[listeners]]\nname = \"we b\"\nbind = \"127.0.0.1:1\"\n", &format!("{l}.name"), 2, "\"we b\"", "\"we-b\"");
        check("[[listeners]]\nname = \"web\"\n", &format!("{l}.bind"), 1, "no bind address", "127.0.0.1:8080");
        check("[[listeners]]\nname = \"w\"\nbind = \"localhost:80\"\n", &format!("{l}.bind"), 3, "\"localhost:80\"", "IP address");
        let twice = format!("{LISTENER}\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8081\"\n");
        check(&twice, "listeners[1].name", 6, "duplicate listener name \"web\"", "unique");
        let shared = format!("{LISTENER}[[listeners]]\nname = \"b\"\nbind = \"127.0.0.1:8080\"\n");
        check(&shared, "listeners[1].bind", 6, "listener \"web\"", "different address");
        let port_zero = "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:0\"\n\
                         [[listeners]]\nname = \"b\"\nbind = \"127.0.0.1:0\"\n";
        assert!(parse_str(port_zero, "weir.toml").is_ok(), "port 0 is a fresh port each time");
    }

    #[test]
    fn listener_protocol() {
        let p = "listeners[0].protocol";
        check(&format!("{LISTENER}protocol = \"tcp\"\n"), p, 4, "TCP listeners are not supported yet", "\"http\"");
        check(&format!("{LISTENER}protocol = \"udp\"\n"), p, 4, "unknown protocol \"udp\"", "\"http\"");
    }

    #[test]
    fn listener_limits() {
        let cases = [
            ("backlog = 0", "backlog", "between 1 and 65535, not 0", "default 4096"),
            ("backlog = 65536", "backlog", "not 65536", "between 1 and 65535"),
            ("max_connections = 0", "max_connections", "at least 1", "default 10000"),
            ("keepalive_requests = -1", "keepalive_requests", "at least 0", "default 500"),
            ("max_headers = 0", "max_headers", "between 1 and 1000", "default 100"),
            ("max_headers = 1001", "max_headers", "not 1001", "default 100"),
            ("max_header_size = \"512\"", "max_header_size", "not 512 bytes", "16KiB"),
            ("max_header_size = \"2MiB\"", "max_header_size", "between 1KiB and 1MiB", "16KiB"),
            ("max_header_size = \"16 kb\"", "max_header_size", "unknown size unit", "size such as"),
            ("max_body_size = \"1.5MB\"", "max_body_size", "expected a size", "size such as"),
            ("max_body_size = -1", "max_body_size", "negative", "size such as"),
            ("header_timeout = \"0s\"", "header_timeout", "greater than 0", "\"10s\""),
            ("client_timeout = \"0\"", "client_timeout", "greater than 0", "\"60s\""),
            ("keepalive_timeout = \"5 min\"", "keepalive_timeout", "unit \"min\"", "\"5s\""),
        ];
        for (line, key, message, fix) in cases {
            check(&format!("{LISTENER}{line}\n"), &format!("listeners[0].{key}"), 4, message, fix);
        }
    }

    #[test]
    fn default_response() {
        let d = "listeners[0].default_response";
        let source = |v: &str| format!("{LISTENER}default_response = {{ {v} }}\n");
        check(&source("status = 199"), &format!("{d}.status"), 4, "between 200 and 599", "default 404");
        check(&source("status = 600"), &format!("{d}.status"), 4, "not 600", "default 404");
        check(&source("content_type = \"\""), &format!("{d}.content_type"), 4, "non-empty", "text/plain");
        check(&source("content_type = \"a\\nb\""), &format!("{d}.content_type"), 4, "printable", "text/plain");
        let table = format!("{LISTENER}[listeners.default_response]\nstatus = 200\nbody = \"hi\"\n");
        let config = parse_str(&table, "weir.toml").expect("valid");
        let response = &config.listeners[0].default_response;
        assert_eq!((response.status, response.body.as_str(), response.content_type.as_str()), (200, "hi", "text/plain"));
    }

    #[test]
    fn route_names_and_upstreams() {
        let r = "listeners[0].routes[0]";
        let no_name = format!("{LISTENER}[[listeners.routes]]\nupstream = \"x\"\n");
        check(&no_name, &format!("{r}.name"), 4, "no name", "name = ");
        let no_upstream = format!("{LISTENER}[[listeners.routes]]\nname = \"r\"\n");
        check(&no_upstream, &format!("{r}.upstream"), 4, "no upstream", "define [upstreams.NAME]");
        let unknown = format!("{LISTENER}[[listeners.routes]]\nname = \"r\"\nupstream = \"x\"\n");
        check(&unknown, &format!("{r}.upstream"), 6, "unknown upstream \"x\"", "define [upstreams.x] with servers");
        let twice = format!("{}[[listeners.routes]]\nname = \"r\"\nupstream = \"cgi\"\npath_prefix = \"/b\"\n", with_route(""));
        check(&twice, "listeners[0].routes[1].name", 10, "duplicate route name \"r\"", "unique");
    }

    #[test]
    fn unknown_upstream_displays_as_documented() {
        let source = "[server]\nworkers = 2\n\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\n\n\
                      [upstreams.cgi]\nservers = [{ addr = \"127.0.0.1:8081\" }]\n\n\
                      [[listeners.routes]]\n    upstream = \"cgi2\"\n    name = \"r\"\n";
        assert_eq!(
            fail(source).to_string(),
            "weir.toml:12:5: listeners[0].routes[0].upstream: unknown upstream \"cgi2\" \
             (fix: define [upstreams.cgi2] or use one of: cgi)"
        );
    }

    #[test]
    fn route_hosts() {
        let h = "listeners[0].routes[0].hosts";
        check(&with_route("hosts = []\n"), h, 7, "could never match", "[\"*\"]");
        check(&with_route("hosts = [\"a.com\", \"a.com:80\"]\n"), &format!("{h}[1]"), 7, "includes a port", "\":PORT\"");
        check(&with_route("hosts = [\"a*.example.com\"]\n"), &format!("{h}[0]"), 7, "'*'", "\"*.example.com\"");
        check(&with_route("hosts = [\"*.*.com\"]\n"), &format!("{h}[0]"), 7, "'*'", "\"*\"");
        check(&with_route("hosts = [\"*.\"]\n"), &format!("{h}[0]"), 7, "not a valid host name", "dots");
        check(&with_route("hosts = [\"a..com\"]\n"), &format!("{h}[0]"), 7, "not a valid host name", "dots");
        check(&with_route("hosts = [\"a b\"]\n"), &format!("{h}[0]"), 7, "not a valid host name", "punycode");
        let config = parse_str(&with_route("hosts = [\"*\", \"WWW.A.com\", \"*.B.com\"]\n"), "f").expect("valid");
        let expected = [HostPattern::Any, HostPattern::Exact("www.a.com".into()), HostPattern::Suffix(".b.com".into())];
        assert_eq!(config.listeners[0].routes[0].hosts, expected);
    }

    #[test]
    fn route_prefixes() {
        let r = "listeners[0].routes[0]";
        check(&with_route("path_prefix = \"cgi/\"\n"), &format!("{r}.path_prefix"), 7, "must start with '/'", "\"/cgi/\"");
        check(&with_route("path_prefix = \"/a b\"\n"), &format!("{r}.path_prefix"), 7, "whitespace", "path part");
        check(&with_route("path_prefix = \"/a?b\"\n"), &format!("{r}.path_prefix"), 7, "'?'", "path part");
        check(&with_route("rewrite_prefix = \"x\"\n"), &format!("{r}.rewrite_prefix"), 7, "must start with '/'", "\"/x\"");
        check(&with_route("reverse_rewrite = true\n"), &format!("{r}.reverse_rewrite"), 7, "needs rewrite_prefix", "rewrite_prefix");
    }

    #[test]
    fn routes_that_could_never_match() {
        let second = |lines: &str| {
            format!("{}[[listeners.routes]]\nname = \"s\"\nupstream = \"cgi\"\n{lines}", with_route("hosts = [\"a.com\", \"b.com\"]\n"))
        };
        // Same host set in another order, same (default) path_prefix: reported at the route.
        let e = fail(&second("hosts = [\"B.com\", \"a.com\"]\n"));
        assert_eq!((e.field.as_str(), e.line), ("listeners[0].routes[1].path_prefix", 10), "{e}");
        assert!(e.message.contains("could never match") && e.message.contains("route \"r\""), "{e}");
        assert!(e.fix.contains("change its hosts or path_prefix"), "{e}");
        // Written path_prefix: reported at the key.
        let e = fail(&second("hosts = [\"a.com\", \"b.com\"]\npath_prefix = \"/\"\n"));
        assert_eq!(e.line, 14, "{e}");
        // Different hosts or prefix: fine.
        assert!(parse_str(&second("hosts = [\"a.com\"]\n"), "f").is_ok());
        assert!(parse_str(&second("hosts = [\"a.com\", \"b.com\"]\npath_prefix = \"/x\"\n"), "f").is_ok());
    }

    #[test]
    fn upstream_servers() {
        let s = "upstreams.u.servers";
        check(&with_upstream("connect_timeout = \"1s\"\n"), s, 4, "has no servers", "servers = [{ addr");
        check(&with_upstream("servers = []\n"), s, 5, "has no servers", "addr = ");
        check(&with_upstream("servers = [{}]\n"), &format!("{s}[0].addr"), 5, "no addr", "host:port");
        check(&with_upstream("servers = [{ addr = \"127.0.0.1\" }]\n"), &format!("{s}[0].addr"), 5, "has no port", "\"127.0.0.1:80\"");
        check(&with_upstream("servers = [{ addr = \"::1:80\" }]\n"), &format!("{s}[0].addr"), 5, "needs brackets", "\"[::1]:80\"");
        check(&with_upstream("servers = [{ addr = \"no-such-host.invalid:80\" }]\n"), &format!("{s}[0].addr"), 5, "cannot resolve", "IP address");
        check(&with_upstream("servers = [{ addr = \"10.0.0.1:0\" }]\n"), &format!("{s}[0].addr"), 5, "port 0", "port");
        let second = "servers = [\n  { addr = \"10.0.0.1:80\" },\n  { addr = \"10.0.0.2\" },\n]\n";
        check(&with_upstream(second), &format!("{s}[1].addr"), 7, "has no port", "host:port");
    }

    #[test]
    fn upstream_settings() {
        let servers = "servers = [{ addr = \"10.0.0.1:80\" }]\n";
        let cases = [
            ("connect_timeout = \"0s\"", "connect_timeout", "greater than 0", "\"2s\""),
            ("response_timeout = \"0ms\"", "response_timeout", "greater than 0", "\"60s\""),
            ("idle_timeout = \"x\"", "idle_timeout", "expected a duration", "\"60s\""),
            ("max_idle = -1", "max_idle", "at least 0", "default 256"),
        ];
        for (line, key, message, fix) in cases {
            check(&with_upstream(&format!("{servers}{line}\n")), &format!("upstreams.u.{key}"), 6, message, fix);
        }
        let bad_name = format!("{LISTENER}[upstreams.\"a b\"]\n{servers}");
        check(&bad_name, "upstreams.\"a b\"", 4, "invalid upstream name", "\"a-b\"");
        let unused = with_upstream(servers);
        assert_eq!(parse_str(&unused, "f").map(|c| c.upstreams.len()), Ok(1));
    }
}
