//! Local responses rendered once per snapshot: the listener's default response and a
//! route's `respond = { status, body, headers }`.
//!
//! Each is kept ready to write in the three `Persistence` forms (`Connection: close`,
//! nothing for HTTP/1.1 keep-alive, `Connection: keep-alive` for HTTP/1.0 keep-alive), so
//! answering costs one slice lookup; a HEAD request gets the same bytes without the body.

use weir_config::LocalResponse;

use crate::codec::http1::write::{
    push_decimal, push_header, push_simple_response, push_status_line, Persistence,
};
use crate::error::reason_phrase;

/// A complete response in each `Persistence` form.
#[derive(Debug, Clone)]
pub struct Canned {
    /// Indexed by `Persistence as usize`.
    variants: [Box<[u8]>; Persistence::COUNT],
    /// Length of the body at the end of each (left out for HEAD requests).
    body_len: usize,
    pub status: u16,
}

impl Canned {
    /// `render(persistence, out)` writes the whole response, ending with its `body_len`
    /// body bytes.
    fn render(status: u16, body_len: usize, render: impl Fn(Persistence, &mut Vec<u8>)) -> Canned {
        // In declaration order: `bytes` indexes by discriminant.
        let variants = [
            Persistence::Close,
            Persistence::KeepAlive,
            Persistence::KeepAlive10,
        ]
        .map(|p| {
            let mut out = Vec::new();
            render(p, &mut out);
            out.into_boxed_slice()
        });
        Canned {
            variants,
            body_len,
            status,
        }
    }

    /// The listener's default response (seed 002's default backend).
    pub fn default_response(d: &weir_config::DefaultResponse) -> Canned {
        Canned::render(d.status, d.body.len(), |p, out| {
            push_simple_response(out, d.status, &d.content_type, d.body.as_bytes(), p)
        })
    }

    /// A route's `respond`: `Server`, the configured headers (a `Content-Type` of
    /// `text/plain` when a body has none), `Content-Length` (none for 204 and 304).
    pub fn respond(r: &LocalResponse) -> Canned {
        let typed = r
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("content-type"));
        let no_length = matches!(r.status, 204 | 304);
        Canned::render(r.status, r.body.len(), |p, out| {
            push_status_line(out, r.status, reason_phrase(r.status).as_bytes());
            push_header(out, b"Server", b"weir");
            for (name, value) in &r.headers {
                push_header(out, name.as_bytes(), value.as_bytes());
            }
            if !typed && !r.body.is_empty() {
                push_header(out, b"Content-Type", b"text/plain");
            }
            if !no_length {
                out.extend_from_slice(b"Content-Length: ");
                push_decimal(out, r.body.len() as u64);
                out.extend_from_slice(b"\r\n");
            }
            p.push_header(out);
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(r.body.as_bytes());
        })
    }

    /// The bytes to write; without the body for a HEAD request.
    #[inline]
    pub fn bytes(&self, persistence: Persistence, is_head: bool) -> &[u8] {
        let full = &self.variants[persistence as usize];
        if is_head {
            &full[..full.len() - self.body_len]
        } else {
            full
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn respond_in_each_form() {
        let c = Canned::respond(&LocalResponse {
            status: 503,
            body: "down\n".into(),
            headers: vec![("Retry-After".into(), "5".into())],
        });
        let head = "HTTP/1.1 503 Service Unavailable\r\nServer: weir\r\nRetry-After: 5\r\n\
                    Content-Type: text/plain\r\nContent-Length: 5\r\n";
        let text = |p, is_head| String::from_utf8(c.bytes(p, is_head).to_vec()).expect("ascii");
        assert_eq!(
            text(Persistence::KeepAlive, false),
            format!("{head}\r\ndown\n")
        );
        assert_eq!(
            text(Persistence::Close, false),
            format!("{head}Connection: close\r\n\r\ndown\n")
        );
        assert_eq!(
            text(Persistence::KeepAlive10, true),
            format!("{head}Connection: keep-alive\r\n\r\n")
        );
    }

    #[test]
    fn no_content_has_no_length_and_typed_bodies_keep_their_type() {
        let c = Canned::respond(&LocalResponse {
            status: 204,
            body: String::new(),
            headers: vec![],
        });
        assert_eq!(
            c.bytes(Persistence::KeepAlive, false),
            b"HTTP/1.1 204 No Content\r\nServer: weir\r\n\r\n"
        );
        let c = Canned::respond(&LocalResponse {
            status: 200,
            body: "{}".into(),
            headers: vec![("content-type".into(), "application/json".into())],
        });
        let text = String::from_utf8(c.bytes(Persistence::KeepAlive, false).to_vec()).unwrap();
        assert_eq!(text.matches("ontent-").count(), 2, "{text}");
    }
}
