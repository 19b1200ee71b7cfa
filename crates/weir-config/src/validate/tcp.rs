//! Validation of a listener's protocol (`"http"` or `"tcp"` with its own keys) and of its
//! `proxy_protocol` table, including the `trusted` address ranges.
//!
//! Keys that only make sense for the other protocol are rejected by name, so a TCP listener
//! with `routes` (or an HTTP one with `upstream`) is an error that says what to remove.

use std::net::IpAddr;

use super::{duration, fin_bound, host_pattern, min_progress, size, upstream_index};
use crate::error::{FieldPath, Issue};
use crate::model::{
    Cidr, HostPattern, Listener, Protocol, ProxyProtocol, ProxyVersion, SniRoute, SpliceMode,
    TcpSettings, Upstream,
};
use crate::raw::{RawListener, RawProxyProtocol, RawSniRoute};

/// `buffer_size` bounds: at least a page of a TCP segment, at most what a pipe can usefully hold.
const MIN_BUFFER: u64 = 1024;
const MAX_BUFFER: u64 = 16 * 1024 * 1024;

/// The listener's protocol, checking that no key of the other protocol is present.
pub(super) fn protocol(
    raw: &mut RawListener,
    path: &FieldPath,
    upstreams: &[String],
) -> Result<Protocol, Issue> {
    match raw.protocol.as_deref() {
        None | Some("http") => {
            reject_present(path, &tcp_only_keys(raw), "http", "tcp")?;
            Ok(Protocol::Http)
        }
        Some("tcp") => {
            reject_present(path, &http_only_keys(raw), "tcp", "http")?;
            tcp_settings(raw, path, upstreams).map(Protocol::Tcp)
        }
        Some(other) => Err(Issue::new(
            &path.key("protocol"),
            format!("unknown protocol \"{other}\""),
            r#"use protocol = "http" (the default) or "tcp""#,
        )),
    }
}

fn tcp_settings(
    raw: &mut RawListener,
    path: &FieldPath,
    upstreams: &[String],
) -> Result<TcpSettings, Issue> {
    let upstream_path = path.key("upstream");
    if raw.upstream.is_none() {
        return Err(Issue::new(
            &upstream_path,
            "a tcp listener needs an upstream",
            r#"add upstream = "NAME" naming an [upstreams.NAME] pool"#,
        ));
    }
    let buffer_path = path.key("buffer_size");
    let buffer = size(raw.buffer_size.take(), 16 * 1024, &buffer_path)?;
    if !(MIN_BUFFER..=MAX_BUFFER).contains(&buffer) {
        return Err(Issue::new(
            &buffer_path,
            format!("buffer_size must be between 1KiB and 16MiB, not {buffer} bytes"),
            r#"set buffer_size to a size such as "16KiB" (the default)"#,
        ));
    }
    let idle_timeout = duration(
        raw.idle_timeout.take(),
        "300s",
        &path.key("idle_timeout"),
        true,
    )?;
    Ok(TcpSettings {
        upstream: upstream_index(raw.upstream.take(), &upstream_path, upstreams)?,
        idle_timeout,
        fin_timeout: fin_bound(
            raw.fin_timeout.take(),
            idle_timeout,
            "idle_timeout",
            &path.key("fin_timeout"),
        )?,
        min_progress: min_progress(raw.min_progress.take(), &path.key("min_progress"))?,
        buffer_size: usize::try_from(buffer).unwrap_or(16 * 1024),
        splice: splice(raw.splice.as_deref(), &path.key("splice"))?,
        sni_routes: sni_routes(raw.sni_routes.take(), &path.key("sni_routes"), upstreams)?,
        preread_timeout: duration(
            raw.preread_timeout.take(),
            "5s",
            &path.key("preread_timeout"),
            true,
        )?,
    })
}

/// `sni_routes = [{ hosts = [...], upstream = "..." }]`: each host an exact name or
/// `*.suffix`, each name at most once across the list, each upstream defined.
fn sni_routes(
    raw: Option<Vec<RawSniRoute>>,
    path: &FieldPath,
    upstreams: &[String],
) -> Result<Vec<SniRoute>, Issue> {
    let mut out: Vec<SniRoute> = Vec::new();
    for (i, route) in raw.unwrap_or_default().into_iter().enumerate() {
        let at = path.index(i);
        let hosts_path = at.key("hosts");
        let raw_hosts = route.hosts.filter(|h| !h.is_empty()).ok_or_else(|| {
            Issue::new(
                &hosts_path,
                "an SNI route needs at least one host",
                r#"write hosts = ["a.example.com", "*.b.example.com"]"#,
            )
        })?;
        let mut hosts = Vec::with_capacity(raw_hosts.len());
        for (j, text) in raw_hosts.iter().enumerate() {
            let host_path = hosts_path.index(j);
            let host = sni_host(text, &host_path)?;
            if out.iter().any(|r| r.hosts.contains(&host)) || hosts.contains(&host) {
                return Err(Issue::new(
                    &host_path,
                    format!("host \"{text}\" appears in more than one SNI route"),
                    "list each host in one SNI route only",
                ));
            }
            hosts.push(host);
        }
        let upstream = upstream_index(route.upstream, &at.key("upstream"), upstreams)?;
        out.push(SniRoute { hosts, upstream });
    }
    Ok(out)
}

/// SNI routing without `[listeners.tls]` passes the client's TLS through, so the pools it
/// routes to (fallback included) must not originate TLS themselves: that would wrap it in
/// a second layer.
pub(super) fn check_passthrough(
    listeners: &[Listener],
    upstreams: &[Upstream],
    path: &FieldPath,
) -> Result<(), Issue> {
    for (i, listener) in listeners.iter().enumerate() {
        let Some(tcp) = listener.tcp().filter(|t| !t.sni_routes.is_empty()) else {
            continue;
        };
        if listener.tls.is_some() {
            // Terminated here: what goes upstream is plaintext, TLS to it is a single layer.
            continue;
        }
        let at = path.index(i);
        let routes = tcp.sni_routes.iter().enumerate();
        let targets = routes
            .map(|(j, r)| (at.key("sni_routes").index(j).key("upstream"), r.upstream))
            .chain([(at.key("upstream"), tcp.upstream)]);
        for (field, index) in targets {
            let upstream = &upstreams[index];
            if upstream.tls.is_some() {
                return Err(Issue::new(
                    &field,
                    format!(
                        "upstream \"{}\" has tls, but SNI routing passes the client's TLS \
                         through: it would be wrapped in a second TLS layer",
                        upstream.name
                    ),
                    format!(
                        "remove tls from [upstreams.{}], or route to a pool without tls",
                        upstream.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A host of an SNI route: an exact name or `*.suffix`; `"*"` is what `upstream` is for.
fn sni_host(text: &str, path: &FieldPath) -> Result<HostPattern, Issue> {
    match host_pattern(text) {
        Ok(HostPattern::Any) => Err(Issue::new(
            path,
            "\"*\" in an SNI route would match every connection",
            "remove it: connections no SNI route matches go to the listener's upstream",
        )),
        Ok(HostPattern::Exact(name)) if name.starts_with('[') => Err(Issue::new(
            path,
            format!("\"{text}\" is an IP address; TLS clients send host names only as SNI"),
            "use a DNS name such as \"a.example.com\"",
        )),
        Ok(host) => Ok(host),
        Err((message, fix)) => Err(Issue::new(path, message, fix)),
    }
}

fn splice(raw: Option<&str>, path: &FieldPath) -> Result<SpliceMode, Issue> {
    match raw {
        None | Some("auto") => Ok(SpliceMode::Auto),
        Some("on") => Ok(SpliceMode::Always),
        Some("off") => Ok(SpliceMode::Never),
        Some(other) => Err(Issue::new(
            path,
            format!("unknown splice mode \"{other}\""),
            r#"use splice = "auto" (the default), "on" or "off""#,
        )),
    }
}

/// Listener keys only HTTP listeners have (also used to leave them out of the keys an
/// unknown key's error lists for a TCP listener).
pub(crate) const HTTP_ONLY: [&str; 21] = [
    "keepalive_timeout",
    "keepalive_requests",
    "header_timeout",
    "client_timeout",
    "min_body_rate",
    "min_body_rate_grace",
    "tunnel_idle_timeout",
    "tunnel_fin_timeout",
    "tunnel_min_progress",
    "max_body_size",
    "max_header_size",
    "max_headers",
    "default_response",
    "access_log",
    "path_normalization",
    "routes",
    "http2",
    "redirect_https",
    "redirect_https_port",
    "request_id",
    "trusted_proxies",
];

/// Listener keys only TCP listeners have (`proxy_protocol.send` is checked on its own).
pub(crate) const TCP_ONLY: [&str; 8] = [
    "upstream",
    "idle_timeout",
    "fin_timeout",
    "min_progress",
    "buffer_size",
    "splice",
    "sni_routes",
    "preread_timeout",
];

/// The HTTP-only keys present in `raw`.
fn http_only_keys(raw: &RawListener) -> Vec<&'static str> {
    let present = [
        raw.keepalive_timeout.is_some(),
        raw.keepalive_requests.is_some(),
        raw.header_timeout.is_some(),
        raw.client_timeout.is_some(),
        raw.min_body_rate.is_some(),
        raw.min_body_rate_grace.is_some(),
        raw.tunnel_idle_timeout.is_some(),
        raw.tunnel_fin_timeout.is_some(),
        raw.tunnel_min_progress.is_some(),
        raw.max_body_size.is_some(),
        raw.max_header_size.is_some(),
        raw.max_headers.is_some(),
        raw.default_response.is_some(),
        raw.access_log.is_some(),
        raw.path_normalization.is_some(),
        raw.routes.is_some(),
        raw.http2.is_some(),
        raw.redirect_https.is_some(),
        raw.redirect_https_port.is_some(),
        raw.request_id.is_some(),
        raw.trusted_proxies.is_some(),
    ];
    HTTP_ONLY
        .into_iter()
        .zip(present)
        .filter(|p| p.1)
        .map(|p| p.0)
        .collect()
}

/// The TCP-only keys present in `raw`.
fn tcp_only_keys(raw: &RawListener) -> Vec<&'static str> {
    let send = raw.proxy_protocol.as_ref().and_then(|p| p.send.as_deref());
    let present = [
        raw.upstream.is_some(),
        raw.idle_timeout.is_some(),
        raw.fin_timeout.is_some(),
        raw.min_progress.is_some(),
        raw.buffer_size.is_some(),
        raw.splice.is_some(),
        raw.sni_routes.is_some(),
        raw.preread_timeout.is_some(),
    ];
    let mut keys: Vec<&str> = TCP_ONLY
        .into_iter()
        .zip(present)
        .filter(|p| p.1)
        .map(|p| p.0)
        .collect();
    if send.is_some_and(|s| s != "off") {
        keys.push("proxy_protocol.send");
    }
    keys
}

/// An error at the first of `keys`, which a `protocol` listener does not have.
fn reject_present(
    path: &FieldPath,
    keys: &[&str],
    protocol: &str,
    other: &str,
) -> Result<(), Issue> {
    let Some(first) = keys.first() else {
        return Ok(());
    };
    let field = first.split('.').fold(path.clone(), |p, k| p.key(k));
    Err(Issue::new(
        &field,
        format!("{first} applies only to protocol = \"{other}\" listeners, not \"{protocol}\""),
        format!(
            "remove {} from this listener, or set protocol = \"{other}\"",
            keys.join(", ")
        ),
    ))
}

/// `proxy_protocol = { accept, send, trusted }`.
pub(super) fn proxy_protocol(
    raw: Option<RawProxyProtocol>,
    path: &FieldPath,
) -> Result<ProxyProtocol, Issue> {
    let Some(raw) = raw else {
        return Ok(ProxyProtocol::default());
    };
    let send = match raw.send.as_deref() {
        None | Some("off") => ProxyVersion::Off,
        Some("v1") => ProxyVersion::V1,
        Some("v2") => ProxyVersion::V2,
        Some(other) => {
            return Err(Issue::new(
                &path.key("send"),
                format!("unknown PROXY protocol version \"{other}\""),
                r#"use send = "off" (the default), "v1" or "v2""#,
            ))
        }
    };
    let accept = raw.accept.unwrap_or(false);
    let trusted_path = path.key("trusted");
    let trusted = raw
        .trusted
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, t)| cidr(t, &trusted_path.index(i)))
        .collect::<Result<Vec<_>, _>>()?;
    if accept && trusted.is_empty() {
        return Err(Issue::new(
            &path.key("accept"),
            "accept = true needs the source ranges allowed to send PROXY headers",
            r#"add trusted = ["10.0.0.0/8"] (the addresses of your load balancers)"#,
        ));
    }
    if !accept && !trusted.is_empty() {
        return Err(Issue::new(
            &trusted_path,
            "trusted has no effect unless accept = true",
            "set accept = true, or remove trusted",
        ));
    }
    Ok(ProxyProtocol {
        accept,
        trusted,
        send,
    })
}

/// `"10.0.0.0/8"`, `"::1/128"` or a single address.
pub(super) fn cidr(text: &str, path: &FieldPath) -> Result<Cidr, Issue> {
    let fix = r#"write an address range such as "10.0.0.0/8", "192.168.1.7" or "fd00::/8""#;
    let bad = || Issue::new(path, format!("invalid address range \"{text}\""), fix);
    let (ip, prefix) = match text.trim().split_once('/') {
        Some((ip, bits)) => (ip, Some(bits)),
        None => (text.trim(), None),
    };
    let addr: IpAddr = ip.parse().map_err(|_| bad())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => max,
        Some(bits) => bits
            .parse::<u8>()
            .ok()
            .filter(|b| *b <= max)
            .ok_or_else(bad)?,
    };
    let mapped = match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
        IpAddr::V4(_) => false,
    };
    if mapped && prefix < 96 {
        // Wider than the mapped space: it names IPv6 clients that do not exist and none of
        // the IPv4 ones (compared in their IPv4 form), so it would silently never match.
        return Err(Issue::new(
            path,
            format!("\"{text}\" is an IPv4-mapped range shorter than /96, which no client matches"),
            "write the IPv4 range instead (\"0.0.0.0/0\"), or a prefix of /96 or longer",
        ));
    }
    Ok(ipv4_form(Cidr { addr, prefix }))
}

/// An IPv4-mapped range (`::ffff:127.0.0.1`, `::ffff:10.0.0.0/104`) in its IPv4 form
/// (`127.0.0.1/32`, `10.0.0.0/8`): client addresses are compared in their IPv4 form
/// (`Cidr::contains`), so the mapped form would never match anyone.
fn ipv4_form(cidr: Cidr) -> Cidr {
    match cidr.addr {
        IpAddr::V6(v6) if cidr.prefix >= 96 => match v6.to_ipv4_mapped() {
            Some(v4) => Cidr {
                addr: IpAddr::V4(v4),
                prefix: cidr.prefix - 96,
            },
            None => cidr,
        },
        _ => cidr,
    }
}
