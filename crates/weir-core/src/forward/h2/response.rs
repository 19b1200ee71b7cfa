//! An HTTP/2 upstream response as an HTTP/1.1 response: 1xx heads, the final head with
//! the framing an HTTP/1.x client needs, then DATA (chunked when the server gave no
//! `content-length`) and, for a client that sent `TE: trailers`, the trailers as chunked
//! trailer fields.

use h2::RecvStream;
use http::{HeaderMap, StatusCode};
use tokio::io::AsyncWrite;

use super::{forbidden_in_trailer, is_connection_specific};
use crate::codec::http1::header::is_token;
use crate::codec::http1::write::{push_header, push_status_line, Persistence};
use crate::connector::h2::h2_error;
use crate::error::ProxyError;
use crate::forward::body::{write_all, Chunks};
use crate::forward::h1::client_write_error;
use crate::forward::Timeouts;
use crate::time::with_timeout;
use weir_config::HeaderRules;

/// What the client asked that shapes the response.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ask {
    pub is_head: bool,
    pub http10: bool,
    /// `TE: trailers`: the client takes trailer fields in a chunked body.
    pub te_trailers: bool,
}

/// How the response body goes to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// No body (HEAD, 204, 304, or an empty one: `Content-Length: 0`).
    Empty,
    /// The server's `content-length` (the `h2` crate checks the DATA against it).
    Length,
    Chunked,
    /// An HTTP/1.0 client and no length: the body ends with the connection.
    UntilClose,
}

/// Appends an HTTP/2 upstream's 1xx head as HTTP/1.1 (its connection-specific fields
/// dropped).
pub(crate) fn write_interim(out: &mut Vec<u8>, head: &http::Response<()>) {
    push_status_line(out, head.status().as_u16(), reason(head.status()));
    push_fields(out, head.headers(), |_| false);
    out.extend_from_slice(b"\r\n");
}

/// Everything the final head is written from.
pub(super) struct Head<'a> {
    pub ask: Ask,
    /// The response ends with its HEADERS frame.
    pub end_stream: bool,
    /// The client connection may stay open, as far as the request goes.
    pub keep_alive: bool,
    /// The route's `response_headers` rules and their rendered lines.
    pub edits: Option<(&'a HeaderRules, &'a [u8])>,
    /// A `Set-Cookie` line (sticky sessions), CRLF included.
    pub set_cookie: Option<&'a [u8]>,
}

/// Appends the HTTP/1.1 head for `parts` to `out`; returns the body framing and whether
/// the client connection stays open.
pub(super) fn write_head(
    out: &mut Vec<u8>,
    parts: &http::response::Parts,
    head: &Head<'_>,
) -> (Framing, bool) {
    let status = parts.status;
    push_status_line(out, status.as_u16(), reason(status));
    match head.edits {
        Some((rules, _)) => push_fields(out, &parts.headers, |n| rules.drops(n.as_bytes())),
        None => push_fields(out, &parts.headers, |_| false),
    }
    if let Some((_, lines)) = head.edits {
        out.extend_from_slice(lines);
    }
    if let Some(line) = head.set_cookie {
        out.extend_from_slice(line);
    }
    let ask = head.ask;
    let bodiless = ask.is_head || status == StatusCode::NO_CONTENT || status.as_u16() == 304;
    let framing = if bodiless {
        Framing::Empty
    } else if parts.headers.contains_key(http::header::CONTENT_LENGTH) {
        Framing::Length
    } else if head.end_stream {
        out.extend_from_slice(b"Content-Length: 0\r\n");
        Framing::Empty
    } else if ask.http10 {
        Framing::UntilClose
    } else {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
        Framing::Chunked
    };
    let keep_alive = head.keep_alive && framing != Framing::UntilClose;
    Persistence::of(keep_alive, ask.http10).push_header(out);
    out.extend_from_slice(b"\r\n");
    (framing, keep_alive)
}

fn reason(status: StatusCode) -> &'static [u8] {
    status.canonical_reason().unwrap_or("").as_bytes()
}

/// Appends the fields (lower-case names, as HTTP/2 has them) but connection-specific and
/// `dropped` ones.
fn push_fields(out: &mut Vec<u8>, fields: &HeaderMap, dropped: impl Fn(&str) -> bool) {
    for (name, value) in fields {
        if is_connection_specific(name) || dropped(name.as_str()) {
            continue;
        }
        push_header(out, name.as_str().as_bytes(), value.as_bytes());
    }
}

/// Streams the response DATA to the client in `framing`, releasing each piece to the
/// upstream's window only once the client took it (a slow client slows the server, not
/// Weir's memory); then the last chunk with the trailers when `trailers` is set. Adds the
/// bytes written to `sent`.
pub(super) async fn relay<W: AsyncWrite + Unpin>(
    up: &mut RecvStream,
    client: &mut W,
    framing: Framing,
    trailers: bool,
    sent: &mut u64,
    timeouts: Timeouts,
) -> Result<(), ProxyError> {
    let (client_timeout, upstream_timeout) = (timeouts.client, timeouts.upstream);
    let mut chunks = Chunks::default();
    loop {
        let data = match with_timeout(upstream_timeout, up.data()).await {
            Err(_) => return Err(ProxyError::UpstreamTimeout),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(h2_error(&e)),
            Ok(Some(Ok(data))) => data,
        };
        let len = data.len();
        // Never an empty chunk: a zero-size chunk would end the body.
        if len == 0 {
            continue;
        }
        let written = match framing {
            Framing::Chunked => {
                let prefix = chunks.prefix(len);
                write_all(client, prefix, &data, client_timeout).await
            }
            _ => write_all(client, &data, &[], client_timeout).await,
        };
        written.map_err(client_write_error)?;
        *sent += len as u64;
        let _ = up.flow_control().release_capacity(len);
    }
    if framing != Framing::Chunked {
        return Ok(());
    }
    let mut tail = Vec::with_capacity(64);
    tail.extend_from_slice(chunks.last());
    if trailers {
        match with_timeout(upstream_timeout, up.trailers()).await {
            Err(_) => return Err(ProxyError::UpstreamTimeout),
            Ok(Err(e)) => return Err(h2_error(&e)),
            // The head is out: a trailer field that may not be relayed is dropped, as
            // from an HTTP/1.1 upstream (`http2::trailers`).
            Ok(Ok(Some(fields))) => push_fields(&mut tail, &fields, |name| {
                forbidden_in_trailer(name) || !is_token(name.as_bytes())
            }),
            Ok(Ok(None)) => {}
        }
    }
    tail.extend_from_slice(b"\r\n");
    write_all(client, &tail, &[], client_timeout)
        .await
        .map_err(client_write_error)?;
    *sent += tail.len() as u64;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(status: u16, fields: &[(&str, &str)]) -> http::response::Parts {
        let mut builder = http::Response::builder().status(status);
        for (n, v) in fields {
            builder = builder.header(*n, *v);
        }
        builder.body(()).expect("response").into_parts().0
    }

    fn head(ask: Ask, end_stream: bool) -> Head<'static> {
        Head {
            ask,
            end_stream,
            keep_alive: true,
            edits: None,
            set_cookie: None,
        }
    }

    const GET11: Ask = Ask {
        is_head: false,
        http10: false,
        te_trailers: false,
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
        let http10 = Ask {
            http10: true,
            ..GET11
        };
        assert_eq!(
            write_head(&mut out, &p, &head(http10, false)),
            (Framing::UntilClose, false)
        );
        assert!(out.ends_with(b"Connection: close\r\n\r\n"));
        out.clear();
        let head_req = Ask {
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
