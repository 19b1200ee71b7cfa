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
    let start = out.len();
    render(out, &r.to, vars);
    keep_on_this_host(out, start, &r.to);
    out.extend_from_slice(b"\r\nContent-Length: 0\r\n");
    persistence.push_header(out);
    out.extend_from_slice(b"\r\n");
}

/// Keeps a Location (`out[start..]`) that begins with a path on this host when its leading
/// slashes come from the request: `//evil.com/x` (or `/\evil.com`, which browsers read the
/// same) is a protocol-relative URL to another site. The routed path resolves dot segments
/// but keeps an empty first segment (`//evil.com/x` is a path unless `merge_slashes` is
/// on), and a `to` such as `"/{path}"` doubles the slash, so the run of `/` and `\` at the
/// start is cut to one `/` unless the operator's own text wrote `//` there.
fn keep_on_this_host(out: &mut Vec<u8>, start: usize, to: &Template) {
    let is_slash = |b: &u8| matches!(b, b'/' | b'\\');
    let run = out[start..].iter().take_while(|b| is_slash(b)).count();
    if run < 2 {
        return;
    }
    let written = match to.0.first() {
        Some(TemplatePart::Text(text)) => text.bytes().take_while(is_slash).count(),
        _ => 0,
    };
    if written >= 2 {
        return;
    }
    out.drain(start + 1..start + run);
    out[start] = b'/';
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

    /// The Location `to` renders for a request whose routed target is `target`.
    fn location(to: Vec<TemplatePart>, target: &[u8]) -> String {
        let vars = Vars {
            target,
            ..Vars::default()
        };
        let r = Redirect {
            status: 302,
            to: Template(to),
        };
        let mut out = Vec::new();
        push_redirect(&mut out, &r, &vars, Persistence::Close);
        let text = String::from_utf8(out).unwrap();
        let line = text.lines().find(|l| l.starts_with("Location: ")).unwrap();
        line["Location: ".len()..].to_owned()
    }

    #[test]
    fn request_data_never_makes_a_protocol_relative_location() {
        let path = || TemplatePart::Var(Variable::Path);
        let text = |t: &str| TemplatePart::Text(t.to_owned());
        for (target, want) in [
            (&b"//evil.com/x"[..], "/evil.com/x/"),
            (b"/\\evil.com/x", "/evil.com/x/"),
            (b"/\\/evil.com", "/evil.com/"),
            (b"/ok", "/ok/"),
        ] {
            assert_eq!(location(vec![path(), text("/")], target), want);
        }
        assert_eq!(location(vec![text("/"), path()], b"/a"), "/a");
        assert_eq!(
            location(vec![text("/"), path()], b"//evil.com"),
            "/evil.com"
        );
        // The operator's own `//` stays.
        let cdn = vec![text("//cdn.example"), path()];
        assert_eq!(location(cdn, b"//x"), "//cdn.example//x");
        assert_eq!(location(vec![text("/x"), path()], b"//y"), "/x//y");
    }
}
