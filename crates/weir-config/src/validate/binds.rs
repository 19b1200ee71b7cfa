//! Where listeners accept, and what `redirect_https` means there.
//!
//! A listener serves one site on every address it binds, with one set of routes, as an
//! nginx `server` block with `listen 80; listen 443 ssl;` does: `bind` is one address or
//! a list (TLS on a listener with `tls`), `http_bind` the plain-HTTP addresses of a TLS
//! listener. A listener with `acme` and no `http_bind` also gets port 80 on each of its
//! addresses, answering the HTTP-01 challenge and redirecting to HTTPS as Caddy does,
//! unless some listener already binds that port there (`imply_http_binds`).
//! `redirect_https` redirects what arrives over plain HTTP: on a listener without `tls`,
//! everything; on a TLS listener, its plain binds (the default for the implied ones).
//!
//! No address may be bound twice, by one listener or two (port 0 excepted: a fresh port
//! each time), nor by a listener and the admin API.

use std::net::SocketAddr;

use super::ListenerKind;
use crate::error::{FieldPath, Issue};
use crate::model::{Bind, Listener};
use crate::raw::{RawListener, StrOrList};

/// A listener's addresses, each with the key it was written at (for errors).
pub(super) struct Binds {
    pub binds: Vec<(Bind, FieldPath)>,
    pub http_bind: HttpBind,
}

/// What `http_bind` said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HttpBind {
    /// Not written: implied on port 80 for an `acme` listener.
    Absent,
    Off,
    Written,
}

/// `bind` and `http_bind` of one listener of kind `kind`.
pub(super) fn binds(
    bind: Option<StrOrList>,
    http_bind: Option<StrOrList>,
    kind: ListenerKind,
    path: &FieldPath,
) -> Result<Binds, Issue> {
    let fix = r#"write an IP address and a port, such as bind = "127.0.0.1:8080", or a list: ["0.0.0.0:443", "[::]:443"]"#;
    let bind_path = path.key("bind");
    let bind =
        bind.ok_or_else(|| Issue::new(&bind_path, "the listener has no bind address", fix))?;
    let mut binds = addresses(bind, &bind_path, fix)?;
    let http_path = path.key("http_bind");
    let http =
        match http_bind {
            None => HttpBind::Absent,
            Some(StrOrList::One(off)) if off.trim() == "off" => HttpBind::Off,
            Some(_) if kind.tcp => {
                return Err(Issue::new(
                    &http_path,
                    "http_bind is for HTTP listeners: a tcp listener relays bytes",
                    "remove http_bind, or give the address a listener of its own",
                ))
            }
            Some(_) if !kind.tls => return Err(Issue::new(
                &http_path,
                "http_bind is the plain-HTTP address of a listener with tls, and this one has none",
                "put the address in bind (bind = [\"...\", \"...\"] takes several)",
            )),
            Some(list) => {
                let fix =
                    r#"write an IP address and a port, such as http_bind = "0.0.0.0:80", or "off""#;
                let plain = addresses(list, &http_path, fix)?;
                binds.extend(plain.into_iter().map(|(mut b, p)| {
                    b.plain_http = true;
                    (b, p)
                }));
                HttpBind::Written
            }
        };
    for (i, (bind, at)) in binds.iter().enumerate() {
        if let Some(twice) = binds[..i].iter().find(|(b, _)| same_fixed_addr(b, bind)) {
            return Err(Issue::new(
                at,
                format!("{} is listed twice (also at {})", bind.addr, twice.1),
                "list each address once",
            ));
        }
    }
    Ok(Binds {
        binds,
        http_bind: http,
    })
}

/// One address or a non-empty list, each with its key (`bind`, or `bind[i]` in a list).
fn addresses(raw: StrOrList, path: &FieldPath, fix: &str) -> Result<Vec<(Bind, FieldPath)>, Issue> {
    let written = match raw {
        StrOrList::One(one) => vec![(one, path.clone())],
        StrOrList::Many(many) if many.is_empty() => {
            return Err(Issue::new(path, "the list of addresses is empty", fix))
        }
        StrOrList::Many(many) => many
            .into_iter()
            .enumerate()
            .map(|(i, a)| (a, path.index(i)))
            .collect(),
    };
    written
        .into_iter()
        .map(|(text, at)| match text.trim().parse::<SocketAddr>() {
            Ok(addr) => Ok((Bind::new(addr), at)),
            Err(_) => Err(Issue::new(
                &at,
                format!("invalid address \"{text}\": expected an IP address and a port"),
                fix,
            )),
        })
        .collect()
}

/// Both the same address, and not port 0 (which binds a fresh port each time).
fn same_fixed_addr(a: &Bind, b: &Bind) -> bool {
    a.addr == b.addr && a.addr.port() != 0
}

/// Refuses an address an earlier listener (or the admin API, `admin`) binds.
pub(super) fn check_free(
    earlier: &[Listener],
    admin: Option<SocketAddr>,
    binds: &Binds,
) -> Result<(), Issue> {
    for (bind, at) in &binds.binds {
        if admin.is_some_and(|a| a == bind.addr && a.port() != 0) {
            return Err(Issue::new(
                at,
                format!("{} is already used by the admin listener", bind.addr),
                "use another address for this listener, or move the admin listener with \
                 [admin] bind = \"...\" (or disable it with \"off\")",
            ));
        }
        let taken = earlier.iter().enumerate().find_map(|(i, l)| {
            l.binds
                .iter()
                .any(|b| same_fixed_addr(b, bind))
                .then_some((i, &l.name))
        });
        if let Some((i, name)) = taken {
            return Err(Issue::new(
                at,
                format!(
                    "{} is already an address of listener \"{name}\" (listeners[{i}])",
                    bind.addr
                ),
                "use a different address or port for one of the two listeners, or let one \
                 listener serve both sites (its routes can match on hosts)",
            ));
        }
    }
    Ok(())
}

/// The plain-HTTP port an `acme` listener listens on when `http_bind` is not written.
pub const IMPLIED_HTTP_PORT: u16 = 80;

/// Gives each listener in `wants` (one with `acme` and no `http_bind`) port 80 on each IP
/// address it binds, unless a listener already binds port 80 there (an explicit port-80
/// listener answers the HTTP-01 challenge for every listener already).
pub(super) fn imply_http_binds(listeners: &mut [Listener], wants: &[bool]) {
    for i in (0..listeners.len()).filter(|i| wants[*i]) {
        let ips: Vec<std::net::IpAddr> = listeners[i].binds.iter().map(|b| b.addr.ip()).collect();
        for ip in ips {
            let addr = SocketAddr::new(ip, IMPLIED_HTTP_PORT);
            let taken = listeners
                .iter()
                .flat_map(|l| &l.binds)
                .any(|b| overlaps(b.addr, addr));
            if !taken {
                listeners[i].binds.push(Bind {
                    addr,
                    plain_http: true,
                    implied: true,
                });
            }
        }
    }
}

/// Whether two binds would take the same connections: same port and family, and the same
/// IP or either one the unspecified address.
fn overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && a.is_ipv4() == b.is_ipv4()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// `redirect_https` and `redirect_https_port` of the listener `raw` at `path` (its
/// addresses: `binds`): the port redirects go to, `None` when off. The default port is
/// the listener's own first TLS port on a TLS listener, else `https_port`
/// ([`default_https_port`]).
pub(super) fn redirect_https(
    raw: &RawListener,
    binds: &Binds,
    path: &FieldPath,
    https_port: u16,
) -> Result<Option<u16>, Issue> {
    let tls = raw.tls.is_some();
    let acme = raw.tls.as_ref().is_some_and(|t| t.acme.is_some());
    let implied = acme && binds.http_bind == HttpBind::Absent;
    // The implied port-80 bind redirects by default, as Caddy's does; an http_bind that is
    // written serves the routes unless asked (nginx's `listen 80; listen 443 ssl;`).
    let on = raw.redirect_https.unwrap_or(implied);
    let at = path.key("redirect_https");
    if on && !tls && raw.routes.as_ref().is_some_and(|r| !r.is_empty()) {
        return Err(Issue::new(
            &at,
            "redirect_https = true redirects every request, so this listener's routes would never be used",
            "move the routes to the https listener, or remove redirect_https and add a route \
             with redirect = { to = \"https://{host}{uri}\", status = 308 } where you want it",
        ));
    }
    if on && tls && !implied && binds.http_bind != HttpBind::Written {
        // Every request, HTTPS ones included, would be sent to https: a redirect loop.
        return Err(Issue::new(
            &at,
            "redirect_https on a listener with tls and no http_bind redirects HTTPS requests to themselves",
            "add http_bind = \"0.0.0.0:80\" (its requests are the ones redirected), or put \
             redirect_https = true on the plain-HTTP listener",
        ));
    }
    let port_path = path.key("redirect_https_port");
    let own_tls_port = binds
        .binds
        .iter()
        .find(|(b, _)| tls && !b.plain_http && b.addr.port() != 0)
        .map(|(b, _)| b.addr.port());
    let port = match raw.redirect_https_port {
        Some(_) if !on => {
            return Err(Issue::new(
                &port_path,
                "redirect_https_port is set but redirect_https is not",
                "add redirect_https = true, or remove redirect_https_port",
            ))
        }
        Some(p) => u16::try_from(p).ok().filter(|p| *p > 0).ok_or_else(|| {
            Issue::new(
                &port_path,
                format!("redirect_https_port must be a port from 1 to 65535, not {p}"),
                "write the port clients reach HTTPS on, such as 443 or 8443",
            )
        })?,
        None => own_tls_port.unwrap_or(https_port),
    };
    Ok(on.then_some(port))
}

/// Where a plain listener's `redirect_https` sends clients by default: the port of the
/// first HTTP listener with `tls` (its first `bind`; a port 0 bind is not known before it
/// binds: 443 then), else 443.
pub(super) fn default_https_port(listeners: &[RawListener]) -> u16 {
    listeners
        .iter()
        .filter(|l| l.tls.is_some() && l.protocol.as_deref().unwrap_or("http") == "http")
        .find_map(|l| {
            let first = match l.bind.as_ref()? {
                StrOrList::One(one) => one,
                StrOrList::Many(many) => many.first()?,
            };
            first.trim().parse::<SocketAddr>().ok()
        })
        .map(|a| a.port())
        .filter(|p| *p != 0)
        .unwrap_or(443)
}

#[cfg(test)]
mod tests;
