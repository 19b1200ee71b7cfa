//! An HTTP/2 upstream's response for an HTTP/1.x client: its 1xx heads written as HTTP/1.1
//! ([`write_interim`]), and its fields as HTTP/1.1 lines ([`push_fields`]). The final head is written by `forward::head` (with the
//! route's edits), the body by the one relay (`forward::relay`).

use http::HeaderMap;

use super::is_connection_specific;
use crate::codec::http1::write::{push_header, push_status_line};
use crate::forward::head::reason;

/// Appends an HTTP/2 upstream's 1xx head as HTTP/1.1 (its connection-specific fields
/// dropped).
pub(crate) fn write_interim(out: &mut Vec<u8>, head: &http::Response<()>) {
    push_status_line(out, head.status().as_u16(), reason(head.status()));
    push_fields(out, head.headers(), |_| false);
    out.extend_from_slice(b"\r\n");
}

/// Appends the fields (lower-case names, as HTTP/2 has them) but connection-specific and
/// `dropped` ones.
pub(crate) fn push_fields(out: &mut Vec<u8>, fields: &HeaderMap, dropped: impl Fn(&str) -> bool) {
    for (name, value) in fields {
        if is_connection_specific(name) || dropped(name.as_str()) {
            continue;
        }
        push_header(out, name.as_str().as_bytes(), value.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use crate::forward::head::{write_from_h2, Edits, ForClient, Framing};

    fn parts(status: u16, fields: &[(&str, &str)]) -> http::response::Parts {
        let mut builder = http::Response::builder().status(status);
        for (n, v) in fields {
            builder = builder.header(*n, *v);
        }
        builder.body(()).expect("response").into_parts().0
    }

    fn head(ask: ForClient, end_stream: bool) -> ForClient {
        ForClient { end_stream, ..ask }
    }

    fn write_head(out: &mut Vec<u8>, p: &http::response::Parts, c: &ForClient) -> (Framing, bool) {
        write_from_h2(out, p, &Edits::default(), c)
    }

    const GET11: ForClient = ForClient {
        is_head: false,
        http10: false,
        te_trailers: false,
        accepted: None,
        end_stream: false,
        keep_alive: true,
    };

    #[test]
    fn head_framing_follows_length_status_and_client_version() {
        let mut out = Vec::new();
        let p = parts(200, &[("content-length", "5"), ("x-a", "1")]);
        assert_eq!(
            write_head(&mut out, &p, &head(GET11, false)),
            (Framing::Length, true)
        );
        assert_eq!(
            out,
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: 1\r\n\r\n"
        );
        out.clear();
        let p = parts(200, &[]);
        assert_eq!(
            write_head(&mut out, &p, &head(GET11, false)),
            (Framing::Chunked, true)
        );
        assert!(out.ends_with(b"Transfer-Encoding: chunked\r\n\r\n"));
        out.clear();
        assert_eq!(
            write_head(&mut out, &p, &head(GET11, true)),
            (Framing::Empty, true)
        );
        assert!(out.ends_with(b"Content-Length: 0\r\n\r\n"));
        out.clear();
        let http10 = ForClient {
            http10: true,
            ..GET11
        };
        assert_eq!(
            write_head(&mut out, &p, &head(http10, false)),
            (Framing::UntilClose, false)
        );
        assert!(out.ends_with(b"Connection: close\r\n\r\n"));
        out.clear();
        let head_req = ForClient {
            is_head: true,
            ..GET11
        };
        let p = parts(200, &[("content-length", "99")]);
        assert_eq!(
            write_head(&mut out, &p, &head(head_req, true)),
            (Framing::Empty, true)
        );
        assert!(out.ends_with(b"content-length: 99\r\n\r\n"));
        out.clear();
        let p = parts(204, &[]);
        assert_eq!(
            write_head(&mut out, &p, &head(GET11, false)),
            (Framing::Empty, true)
        );
        assert_eq!(out, b"HTTP/1.1 204 No Content\r\n\r\n");
    }
}
