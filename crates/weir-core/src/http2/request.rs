//! An HTTP/2 request as an HTTP/1.1 head (RFC 9113 section 8.2, RFC 9110 section 7.6.1).
//!
//! The head is written once and then parsed by the HTTP/1.1 codec, so an h2 request meets
//! the same checks, router, filters and `forward::request_head` as an HTTP/1.1 one. Names
//! stay lower-case (fine for HTTP/1.1). `Host` comes from `:authority`; `TE` is dropped
//! (only `trailers` is allowed in h2, which an HTTP/1.1 upstream cannot use); split
//! `cookie` fields are joined with "; " (RFC 9113 section 8.2.3); a body without
//! `content-length` is sent chunked.

use http::request::Parts;
use http::{header, HeaderName, Method};

/// Why a request is malformed (answered with RST_STREAM PROTOCOL_ERROR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

/// Connection-specific fields, which make an h2 request malformed (RFC 9113 8.2.2).
fn connection_specific(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// Appends the HTTP/1.1 head of the request to `out`. `end_of_stream`: the request has
/// no body (its HEADERS frame ended the stream).
pub fn write_head(out: &mut Vec<u8>, parts: &Parts, end_of_stream: bool) -> Result<(), Malformed> {
    let content_length = request_line_and_fields(out, parts.method.as_str(), parts)?;
    framing(out, &parts.method, content_length, end_of_stream)?;
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// Appends the HTTP/1.1 Upgrade request an extended CONNECT (RFC 8441) stands for: `GET`
/// with the CONNECT's `:path` and fields, `Connection: upgrade`, `Upgrade` with the
/// `:protocol`, and `key` as `Sec-WebSocket-Key` (a client's own is dropped: HTTP/2
/// WebSocket has none). A CONNECT must carry no `content-length`.
pub fn write_upgrade_head(
    out: &mut Vec<u8>,
    parts: &Parts,
    protocol: &[u8],
    key: &[u8],
) -> Result<(), Malformed> {
    if request_line_and_fields(out, "GET", parts)?.is_some() {
        return Err(Malformed("content-length on an extended CONNECT"));
    }
    out.extend_from_slice(b"connection: upgrade\r\n");
    push(out, b"upgrade", protocol);
    push(out, b"sec-websocket-key", key);
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// The request line (`method`, `:path`), `host` and the fields; returns the value of
/// `content-length`, if any.
fn request_line_and_fields<'p>(
    out: &mut Vec<u8>,
    method: &str,
    parts: &'p Parts,
) -> Result<Option<&'p [u8]>, Malformed> {
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .filter(|p| !p.is_empty())
        .ok_or(Malformed(":path missing"))?;
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let authority = parts.uri.authority().map(|a| a.as_str().as_bytes());
    if let Some(a) = authority {
        push(out, b"host", a);
    }
    let mut content_length = None;
    let mut cookies = 0;
    for (name, value) in &parts.headers {
        if connection_specific(name) {
            return Err(Malformed("connection-specific header field"));
        }
        if name == header::TE {
            if value.as_bytes() != b"trailers" {
                return Err(Malformed("te other than trailers"));
            }
            continue;
        }
        if name == header::HOST && authority.is_some() {
            continue;
        }
        if name == header::COOKIE {
            cookies += 1;
            continue;
        }
        if name == header::SEC_WEBSOCKET_KEY {
            continue;
        }
        if name == header::CONTENT_LENGTH {
            content_length = Some(value.as_bytes());
        }
        push(out, name.as_str().as_bytes(), value.as_bytes());
    }
    if cookies > 0 {
        push_cookies(out, parts);
    }
    Ok(content_length)
}

/// Body framing for the HTTP/1.1 upstream.
fn framing(
    out: &mut Vec<u8>,
    method: &Method,
    content_length: Option<&[u8]>,
    end_of_stream: bool,
) -> Result<(), Malformed> {
    match (content_length, end_of_stream) {
        (Some(v), true) if v != b"0" => Err(Malformed("content-length without DATA")),
        (Some(_), _) => Ok(()),
        (None, false) => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            Ok(())
        }
        // An HTTP/1.1 server may want a length for these (411 otherwise).
        (None, true) if [Method::POST, Method::PUT, Method::PATCH].contains(method) => {
            out.extend_from_slice(b"content-length: 0\r\n");
            Ok(())
        }
        (None, true) => Ok(()),
    }
}

/// One `cookie` line from every cookie field, joined with "; ".
fn push_cookies(out: &mut Vec<u8>, parts: &Parts) {
    out.extend_from_slice(b"cookie: ");
    for (i, v) in parts.headers.get_all(header::COOKIE).iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b"; ");
        }
        out.extend_from_slice(v.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
}

fn push(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(req: http::Request<()>, eos: bool) -> Result<String, Malformed> {
        let (parts, ()) = req.into_parts();
        let mut out = Vec::new();
        write_head(&mut out, &parts, eos).map(|()| String::from_utf8(out).unwrap_or_default())
    }

    #[test]
    fn translates_pseudo_headers_cookies_and_framing() {
        let req = http::Request::post("http://example.com:8080/a?b=1")
            .header("cookie", "a=1")
            .header("te", "trailers")
            .header("x-y", "z")
            .header("cookie", "b=2")
            .body(())
            .unwrap_or_default();
        let h = head(req, false).unwrap_or_default();
        assert_eq!(
            h,
            "POST /a?b=1 HTTP/1.1\r\nhost: example.com:8080\r\nx-y: z\r\n\
             cookie: a=1; b=2\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        let req = http::Request::post("http://e/")
            .body(())
            .unwrap_or_default();
        assert!(head(req, true)
            .unwrap_or_default()
            .contains("content-length: 0\r\n"));
        let req = http::Request::get("http://e/").header("content-length", "3");
        let req = req.body(()).unwrap_or_default();
        assert_eq!(
            head(req, true),
            Err(Malformed("content-length without DATA"))
        );
    }

    #[test]
    fn extended_connect_becomes_an_upgrade_get() {
        let req = http::Request::connect("http://example.com/chat?x=1")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "client-sent")
            .body(())
            .unwrap_or_default();
        let (parts, ()) = req.into_parts();
        let mut out = Vec::new();
        assert_eq!(
            write_upgrade_head(&mut out, &parts, b"websocket", b"a2V5"),
            Ok(())
        );
        assert_eq!(
            String::from_utf8_lossy(&out),
            "GET /chat?x=1 HTTP/1.1\r\nhost: example.com\r\nsec-websocket-version: 13\r\n\
             connection: upgrade\r\nupgrade: websocket\r\nsec-websocket-key: a2V5\r\n\r\n"
        );
    }

    #[test]
    fn refuses_connection_specific_fields() {
        for (name, value) in [
            ("connection", "close"),
            ("keep-alive", "1"),
            ("upgrade", "h2c"),
            ("transfer-encoding", "chunked"),
            ("te", "gzip"),
        ] {
            let req = http::Request::get("http://e/").header(name, value).body(());
            assert!(head(req.unwrap_or_default(), true).is_err(), "{name}");
        }
    }
}
