//! Redirects: a route's `redirect = { to, status }` and the listener's `redirect_https`.
//!
//! The `to` template was split into literal and variable parts when the config was loaded;
//! rendering appends those parts into the connection's reusable output buffer, so a
//! redirect allocates nothing once the buffer has grown.

use weir_config::{Redirect, Template, TemplatePart, TemplateVar};

use crate::codec::http1::write::{push_status_line, Persistence};
use crate::error::reason_phrase;

/// The values a template's variables take for one request.
pub struct Vars<'a> {
    pub scheme: &'a [u8],
    /// Host name without the port.
    pub host: &'a [u8],
    /// The request target: path and query.
    pub uri: &'a [u8],
    pub client_ip: &'a [u8],
}

impl Vars<'_> {
    fn get(&self, var: TemplateVar) -> &[u8] {
        let split = self.uri.iter().position(|b| *b == b'?');
        match var {
            TemplateVar::Scheme => self.scheme,
            TemplateVar::Host => self.host,
            TemplateVar::Uri => self.uri,
            TemplateVar::Path => split.map_or(self.uri, |q| &self.uri[..q]),
            TemplateVar::Query => split.map_or(&b""[..], |q| &self.uri[q + 1..]),
            TemplateVar::ClientIp => self.client_ip,
        }
    }
}

/// Appends `template` rendered with `vars`.
pub fn push_template(out: &mut Vec<u8>, template: &Template, vars: &Vars<'_>) {
    for part in &template.parts {
        match part {
            TemplatePart::Literal(text) => out.extend_from_slice(text.as_bytes()),
            TemplatePart::Var(var) => out.extend_from_slice(vars.get(*var)),
        }
    }
}

/// Appends the whole redirect response: no body, so a HEAD request gets the same bytes.
pub fn push_redirect(out: &mut Vec<u8>, r: &Redirect, vars: &Vars<'_>, persistence: Persistence) {
    push_status_line(out, r.status, reason_phrase(r.status).as_bytes());
    out.extend_from_slice(b"Server: weir\r\nLocation: ");
    push_template(out, &r.to, vars);
    out.extend_from_slice(b"\r\nContent-Length: 0\r\n");
    persistence.push_header(out);
    out.extend_from_slice(b"\r\n");
}

/// `redirect_https = true`: every request to `https://{host}{uri}` with 308.
pub fn https_redirect() -> Redirect {
    Redirect {
        status: 308,
        to: Template {
            parts: vec![
                TemplatePart::Literal("https://".to_owned()),
                TemplatePart::Var(TemplateVar::Host),
                TemplatePart::Var(TemplateVar::Uri),
            ],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(uri: &'static [u8]) -> Vars<'static> {
        Vars {
            scheme: b"http",
            host: b"example.com",
            uri,
            client_ip: b"10.0.0.1",
        }
    }

    #[test]
    fn every_variable() {
        let all = Template {
            parts: TemplateVar::ALL
                .iter()
                .flat_map(|(_, v)| [TemplatePart::Var(*v), TemplatePart::Literal("|".into())])
                .collect(),
        };
        let mut out = Vec::new();
        push_template(&mut out, &all, &vars(b"/a/b?x=1&y"));
        assert_eq!(out, b"http|example.com|/a/b?x=1&y|/a/b|x=1&y|10.0.0.1|");
        out.clear();
        push_template(&mut out, &all, &vars(b"/a"));
        assert_eq!(out, b"http|example.com|/a|/a||10.0.0.1|");
    }

    #[test]
    fn https_redirect_response() {
        let mut out = Vec::new();
        push_redirect(
            &mut out,
            &https_redirect(),
            &vars(b"/x?y"),
            Persistence::KeepAlive10,
        );
        assert_eq!(
            out,
            b"HTTP/1.1 308 Permanent Redirect\r\nServer: weir\r\nLocation: https://example.com/x?y\r\n\
              Content-Length: 0\r\nConnection: keep-alive\r\n\r\n"
                .as_slice()
        );
    }
}
