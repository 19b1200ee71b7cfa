//! Validation of a listener's `http3`: on only with TLS on an HTTP listener, each QUIC
//! setting with its default and a range quinn and RFC 9000 accept.

use super::http2::bytes;
use super::{duration, int_in, ListenerKind};
use crate::error::{FieldPath, Issue};
use crate::model::{HeaderRule, HeaderRules, Http3, Listener, Template, TemplatePart};
use crate::raw::{RawHttp3, Switch};

/// The largest QUIC flow-control window Weir takes (quinn's `VarInt` allows more; a
/// gigabyte ahead per stream is already more than any client needs).
const MAX_WINDOW: u64 = 1 << 30;

/// `http3` of a listener of kind `kind`.
pub(super) fn http3(
    raw: Option<RawHttp3>,
    kind: ListenerKind,
    path: &FieldPath,
) -> Result<Option<Http3>, Issue> {
    let table = match raw {
        None | Some(Switch::Switch(false)) => return Ok(None),
        Some(Switch::Switch(true)) => Default::default(),
        Some(Switch::Table(t)) if t.enabled == Some(false) => return Ok(None),
        Some(Switch::Table(t)) => t,
    };
    if kind.tcp || !kind.tls {
        return Err(Issue::new(
            path,
            "http3 needs an HTTP listener with [listeners.tls] (QUIC always runs TLS 1.3)",
            "add a [listeners.tls] section with the listener's certificates, or remove http3",
        ));
    }
    let d = Http3::default();
    let key = |k: &str| path.key(k);
    Ok(Some(Http3 {
        max_concurrent_streams: int_in(
            table.max_concurrent_streams,
            i64::from(d.max_concurrent_streams),
            1..=10_000,
            &key("max_concurrent_streams"),
        )?,
        stream_window: bytes(
            table.stream_window,
            d.stream_window,
            1024..=MAX_WINDOW,
            &key("stream_window"),
        )?,
        connection_window: bytes(
            table.connection_window,
            d.connection_window,
            16 * 1024..=MAX_WINDOW,
            &key("connection_window"),
        )?,
        idle_timeout: duration(table.idle_timeout, "30s", &key("idle_timeout"), true)?,
        max_field_section_size: bytes(
            table.max_field_section_size,
            d.max_field_section_size,
            1024..=16 * 1024 * 1024,
            &key("max_field_section_size"),
        )?,
        alt_svc_max_age: duration(table.alt_svc_max_age, "24h", &key("alt_svc_max_age"), false)?,
        retry_threshold: int_in(
            table.retry_threshold,
            i64::from(d.retry_threshold),
            0..=1_000_000,
            &key("retry_threshold"),
        )?,
        early_data: table.early_data.unwrap_or(d.early_data),
    }))
}

/// `early_data` (0-RTT) resumes a session from a ticket the listener keeps, and serves
/// requests before the client could show a certificate: it needs
/// `tls.session_resumption` and no `tls.client_auth`.
pub(super) fn check_early_data(listener: &Listener, path: &FieldPath) -> Result<(), Issue> {
    let early = listener.http3.as_ref().is_some_and(|h| h.early_data);
    let Some(tls) = listener.tls.as_ref().filter(|_| early) else {
        return Ok(());
    };
    let problem = match (tls.session_resumption, tls.client_auth.is_some()) {
        (false, _) => "early_data (0-RTT) resumes a TLS session: it needs tls.session_resumption",
        (_, true) => {
            "early_data (0-RTT) serves requests before a client certificate is checked: it \
             cannot be used with tls.client_auth"
        }
        _ => return Ok(()),
    };
    Err(Issue::new(
        path,
        problem,
        "remove early_data (0-RTT stays off), or turn session_resumption on / drop client_auth",
    ))
}

/// With `http3` on, every route of the listener sets `Alt-Svc: h3=":PORT"; ma=N` on its
/// responses, as a `response_headers` rule (so a listener without `http3` pays nothing,
/// and the header rides the rule path HTTP/1.1 and HTTP/2 responses already take). PORT is
/// the first TLS bind's: every TLS bind has an HTTP/3 endpoint. A route whose own rules
/// name `Alt-Svc` keeps them; a listener bound to port 0 advertises nothing (its port is
/// known only once bound).
pub(super) fn advertise(listener: &mut Listener) {
    let Some(http3) = &listener.http3 else {
        return;
    };
    let tls_port = listener
        .binds
        .iter()
        .find(|b| !b.plain_http && b.addr.port() != 0);
    let Some(port) = tls_port.map(|b| b.addr.port()) else {
        return;
    };
    let value = format!("h3=\":{port}\"; ma={}", http3.alt_svc_max_age.as_secs());
    let named = |r: &HeaderRule| r.name.eq_ignore_ascii_case("alt-svc");
    for route in &mut listener.routes {
        let rules = route
            .filters
            .response_headers
            .get_or_insert_with(HeaderRules::default);
        if rules.set.iter().any(named) || rules.add.iter().any(named) {
            continue;
        }
        if rules.drop.iter().any(|d| d == "alt-svc") {
            continue;
        }
        rules.set.push(HeaderRule {
            name: "Alt-Svc".into(),
            value: Template(vec![TemplatePart::Text(value.clone())]),
        });
        rules.drop.push("alt-svc".into());
    }
}
