//! What `weir check` adds below its summary about what the config implies and does not
//! say itself: every address a listener binds (the port-80 bind `acme` implies included,
//! with what it does) and where automatic certificates are kept when `storage` was left
//! to its default.

use weir_config::{Config, Listener};

/// One line per listener with more than its written `bind`, or automatic certificates.
pub fn implied(config: &Config) -> Vec<String> {
    let mut lines = Vec::new();
    for l in &config.listeners {
        if l.binds.len() > 1 || l.binds.iter().any(|b| b.implied) {
            lines.push(format!("listener {:?}: {}", l.name, binds(l)));
        }
        let Some(tls) = &l.tls else { continue };
        if let Some(acme) = &tls.acme {
            lines.push(format!(
                "listener {:?}: acme orders {} into {}",
                l.name,
                acme.domains.join(", "),
                acme.storage.display()
            ));
        }
        if let Some(ca) = &tls.internal_ca {
            lines.push(format!(
                "listener {:?}: the internal CA is kept in {}",
                l.name,
                ca.storage.display()
            ));
        }
    }
    lines
}

fn binds(l: &Listener) -> String {
    let redirect = match l.redirect_https {
        Some(443) => "redirects to https".to_owned(),
        Some(port) => format!("redirects to https on port {port}"),
        None => "serves the routes".to_owned(),
    };
    let described: Vec<String> = l
        .binds
        .iter()
        .map(|b| match (b.plain_http, b.implied, l.tls.is_some()) {
            (true, true, _) => format!(
                "{} (plain HTTP, implied by acme: answers HTTP-01, {redirect}; set http_bind to change it)",
                b.addr
            ),
            (true, false, _) => format!("{} (plain HTTP, {redirect})", b.addr),
            (false, _, true) => format!("{} (TLS)", b.addr),
            (false, _, false) => b.addr.to_string(),
        })
        .collect();
    described.join(", ")
}
