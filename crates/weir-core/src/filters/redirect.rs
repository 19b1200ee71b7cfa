//! Redirects: a route's `redirect = { to, status }` and the listener's `redirect_https`.
//!
//! The `to` template was split into literal and variable parts when the config was loaded;
//! rendering appends those parts into the connection's reusable output buffer, so a
//! redirect allocates nothing once the buffer has grown.

use weir_config::{Redirect, Template, TemplatePart, Variable};

use super::headers::{render, Vars};
use crate::codec::http1::write::{push_status_line, Persistence};
use crate::error::reason_phrase;

/// Appends the whole redirect response: no body, so a HEAD request gets the same bytes.
pub fn push_redirect(out: &mut Vec<u8>, r: &Redirect, vars: &Vars<'_>, persistence: Persistence) {
    push_status_line(out, r.status, reason_phrase(r.status).as_bytes());
    out.extend_from_slice(b"Server: weir\r\nLocation: ");
    render(out, &r.to, vars);
    out.extend_from_slice(b"\r\nContent-Length: 0\r\n");
    persistence.push_header(out);
    out.extend_from_slice(b"\r\n");
}

/// `redirect_https = true`: every request to `https://{host}:{port}{uri}` with 308, the
/// port left out when it is 443. `{host}` is the request's host without its port: the
/// client's port is the plain-HTTP one.
pub fn https_redirect(port: u16) -> Redirect {
    let mut to = vec![
        TemplatePart::Text("https://".to_owned()),
        TemplatePart::Var(Variable::Host),
    ];
    if port != 443 {
        to.push(TemplatePart::Text(format!(":{port}")));
    }
    to.push(TemplatePart::Var(Variable::Uri));
    Redirect {
        status: 308,
        to: Template(to),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_redirect_response() {
        let vars = Vars {
            scheme: b"http",
            host: b"example.com",
            target: b"/x?y",
            client_ip: b"10.0.0.1",
            request_id: b"",
        };
        let mut out = Vec::new();
        push_redirect(
            &mut out,
            &https_redirect(443),
            &vars,
            Persistence::KeepAlive10,
        );
        assert_eq!(
            out,
            b"HTTP/1.1 308 Permanent Redirect\r\nServer: weir\r\nLocation: https://example.com/x?y\r\n\
              Content-Length: 0\r\nConnection: keep-alive\r\n\r\n"
                .as_slice()
        );
        out.clear();
        push_redirect(&mut out, &https_redirect(8443), &vars, Persistence::Close);
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.contains("\r\nLocation: https://example.com:8443/x?y\r\n"),
            "{text}"
        );
    }
}
