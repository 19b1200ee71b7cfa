//! Validation of a listener's protocol (`"http"` or `"tcp"` with its own keys) and of its
//! `proxy_protocol` table, including the `trusted` address ranges.
//!
//! Keys that only make sense for the other protocol are rejected by name, so a TCP listener
//! with `routes` (or an HTTP one with `upstream`) is an error that says what to remove.

use std::net::IpAddr;

use super::{duration, size, upstream_index};
use crate::error::{FieldPath, Issue};
use crate::model::{Cidr, Protocol, ProxyProtocol, ProxyVersion, SpliceMode, TcpSettings};
use crate::raw::{RawListener, RawProxyProtocol};

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
    Ok(TcpSettings {
        upstream: upstream_index(raw.upstream.take(), &upstream_path, upstreams)?,
        idle_timeout: duration(
            raw.idle_timeout.take(),
            "300s",
            &path.key("idle_timeout"),
            true,
        )?,
        buffer_size: usize::try_from(buffer).unwrap_or(16 * 1024),
        splice: splice(raw.splice.as_deref(), &path.key("splice"))?,
    })
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

/// The HTTP-only keys present in `raw`.
fn http_only_keys(raw: &RawListener) -> Vec<&'static str> {
    let present = [
        ("keepalive_timeout", raw.keepalive_timeout.is_some()),
        ("keepalive_requests", raw.keepalive_requests.is_some()),
        ("header_timeout", raw.header_timeout.is_some()),
        ("client_timeout", raw.client_timeout.is_some()),
        ("max_body_size", raw.max_body_size.is_some()),
        ("max_header_size", raw.max_header_size.is_some()),
        ("max_headers", raw.max_headers.is_some()),
        ("default_response", raw.default_response.is_some()),
        ("access_log", raw.access_log.is_some()),
        ("routes", raw.routes.is_some()),
        ("request_id", raw.request_id.is_some()),
        ("trusted_proxies", raw.trusted_proxies.is_some()),
    ];
    present.iter().filter(|p| p.1).map(|p| p.0).collect()
}

/// The TCP-only keys present in `raw`.
fn tcp_only_keys(raw: &RawListener) -> Vec<&'static str> {
    let send = raw.proxy_protocol.as_ref().and_then(|p| p.send.as_deref());
    let present = [
        ("upstream", raw.upstream.is_some()),
        ("idle_timeout", raw.idle_timeout.is_some()),
        ("buffer_size", raw.buffer_size.is_some()),
        ("splice", raw.splice.is_some()),
        ("proxy_protocol.send", send.is_some_and(|s| s != "off")),
    ];
    present.iter().filter(|p| p.1).map(|p| p.0).collect()
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
    Ok(Cidr { addr, prefix })
}
