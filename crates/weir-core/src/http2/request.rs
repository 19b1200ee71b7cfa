//! An HTTP/2 request as an HTTP/1.1 head (RFC 9113 section 8.2, RFC 9110 section 7.6.1).
//!
//! The head is written once, recording each field line's spans as it goes, and
//! `codec::http1::fill_written` runs the HTTP/1.1 codec's checks on it without parsing it
//! again, so an h2 request meets the same checks, router, filters and
//! `forward::request_head` as an HTTP/1.1 one. What httparse checks of the bytes the `h2`
//! crate has checked already (field names are lower case, values have no control
//! characters, `:path` is a valid path, the method a token), but for two: a field name must
//! be a token here (the crate also takes `"`), and the target's characters are checked again
//! in `fill_written`. Names stay lower-case (fine for HTTP/1.1). `Host` comes from `:authority`; `TE` is dropped
//! (only `trailers` is allowed in h2, which an HTTP/1.1 upstream cannot use); split
//! `cookie` fields are joined with "; " (RFC 9113 section 8.2.3); a body without
//! `content-length` is sent chunked.

use std::ops::Range;

use http::request::Parts;
use http::{header, Method};

use super::upstream_request::append;
use crate::codec::http1::header::{is_token, offset_in, trim};
use crate::codec::http1::{HeaderKind, HeaderSpan};
use crate::forward::h2::is_connection_specific;

/// Why a request is malformed (answered with RST_STREAM PROTOCOL_ERROR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

/// Where the request line's method and target were written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub method: Range<usize>,
    pub target: Range<usize>,
}

/// Appends the HTTP/1.1 head of the request to `out` and records each field line it
/// writes in `fields` (cleared first), for `codec::http1::fill_written`. `end_of_stream`:
/// the request has no body (its HEADERS frame ended the stream).
pub fn write_head(
    out: &mut Vec<u8>,
    fields: &mut Vec<HeaderSpan>,
    parts: &Parts,
    end_of_stream: bool,
) -> Result<Line, Malformed> {
    let mut w = Writer { out, fields };
    let (line, content_length) = w.request_line_and_fields(parts.method.as_str(), parts)?;
    // Body framing for the HTTP/1.1 upstream.
    match (content_length, end_of_stream) {
        (Some(v), true) if v != b"0" => return Err(Malformed("content-length without DATA")),
        (None, false) => w.push(b"transfer-encoding", [b"chunked"]),
        // An HTTP/1.1 server may want a length for these (411 otherwise).
        (None, true) if [Method::POST, Method::PUT, Method::PATCH].contains(&parts.method) => {
            w.push(b"content-length", [b"0"]);
        }
        _ => {}
    }
    w.out.extend_from_slice(b"\r\n");
    Ok(line)
}

/// Appends the HTTP/1.1 Upgrade request an extended CONNECT (RFC 8441) stands for: `GET`
/// with the CONNECT's `:path` and fields, `Connection: upgrade`, `Upgrade` with the
/// `:protocol`, and `key` as `Sec-WebSocket-Key` (a client's own is dropped: HTTP/2
/// WebSocket has none). A CONNECT must carry no `content-length`. Records the field
/// lines in `fields` as `write_head` does.
pub fn write_upgrade_head(
    out: &mut Vec<u8>,
    fields: &mut Vec<HeaderSpan>,
    parts: &Parts,
    protocol: &[u8],
    key: &[u8],
) -> Result<Line, Malformed> {
    // The h2 crate checks only that `:protocol` is UTF-8, and the head is not parsed
    // again: anything but a token (CR, LF, spaces) must not reach the written head.
    if !is_token(protocol) {
        return Err(Malformed("bad :protocol"));
    }
    let mut w = Writer { out, fields };
    let (line, content_length) = w.request_line_and_fields("GET", parts)?;
    if content_length.is_some() {
        return Err(Malformed("content-length on an extended CONNECT"));
    }
    w.push(b"connection", [b"upgrade"]);
    w.push(b"upgrade", [protocol]);
    w.push(b"sec-websocket-key", [key]);
    w.out.extend_from_slice(b"\r\n");
    Ok(line)
}

/// Writes the head and records, per field line, the spans the HTTP/1.1 parser would
/// have found: the head is never parsed again.
struct Writer<'a> {
    out: &'a mut Vec<u8>,
    fields: &'a mut Vec<HeaderSpan>,
}

impl Writer<'_> {
    /// The request line (`method`, `:path`), `host` and the fields; returns where the
    /// line's parts are and the value of `content-length`, if any.
    fn request_line_and_fields<'p>(
        &mut self,
        method: &str,
        parts: &'p Parts,
    ) -> Result<(Line, Option<&'p [u8]>), Malformed> {
        let path = match parts.uri.path_and_query().map(|p| p.as_str()) {
            Some(path) if !path.is_empty() => path,
            // A plain CONNECT (RFC 9113 8.5: `:authority` only): its authority as the
            // authority-form target HTTP/1.1 gives it, so the checks after refuse it with
            // 405, as over HTTP/1.1, rather than a stream error.
            _ if method == "CONNECT" => parts
                .uri
                .authority()
                .map(|a| a.as_str())
                .filter(|a| !a.is_empty())
                .ok_or(Malformed(":authority missing"))?,
            _ => return Err(Malformed(":path missing")),
        };
        // A request-target of visible ASCII only, as an HTTP/1.1 request line must be
        // (RFC 9112 3.2; the `http` crate lets bytes past 0x7e through): the upstream
        // reads what the route matched.
        if !path.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Malformed("bad :path"));
        }
        self.fields.clear();
        // One allocation for the spans: the fields, `host`, and a framing field.
        self.fields.reserve(parts.headers.len() + 2);
        let line = Line {
            method: append(self.out, &[method.as_bytes()]),
            target: {
                self.out.push(b' ');
                append(self.out, &[path.as_bytes()])
            },
        };
        self.out.extend_from_slice(b" HTTP/1.1\r\n");
        let authority = parts.uri.authority().map(|a| a.as_str().as_bytes());
        if let Some(a) = authority {
            self.push(b"host", [a]);
        }
        let mut content_length = None;
        let mut cookies = 0;
        for (name, value) in &parts.headers {
            // The `h2` crate decodes any name `HeaderName::from_lowercase` takes, `"`
            // included; every name goes into an HTTP/1.1 head (a token there, RFC 9110
            // 5.1), so anything else is malformed here (RFC 9113 8.2.1).
            if !is_token(name.as_str().as_bytes()) {
                return Err(Malformed("field name is not a token"));
            }
            if name == header::TE {
                if value.as_bytes() != b"trailers" {
                    return Err(Malformed("te other than trailers"));
                }
                continue;
            }
            // Connection-specific fields make an h2 request malformed (RFC 9113 8.2.2).
            if is_connection_specific(name) {
                return Err(Malformed("connection-specific header field"));
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
            self.push(name.as_str().as_bytes(), [value]);
        }
        if cookies > 0 {
            self.push(b"cookie", parts.headers.get_all(header::COOKIE));
        }
        Ok((line, content_length))
    }

    /// Writes the field line `name: ` with its `values` joined with "; " (one, but for
    /// `cookie`: every cookie field in one line) and records it, the value trimmed of SP /
    /// HTAB as httparse trims it (an empty value is an empty range at 0, as
    /// `header::offset_in` gives it).
    fn push(&mut self, name: &[u8], values: impl IntoIterator<Item = impl AsRef<[u8]>>) {
        let start = self.out.len();
        self.out.extend_from_slice(name);
        self.out.extend_from_slice(b": ");
        let at = self.out.len();
        for (i, v) in values.into_iter().enumerate() {
            if i > 0 {
                self.out.extend_from_slice(b"; ");
            }
            self.out.extend_from_slice(v.as_ref());
        }
        let value = offset_in(self.out, trim(&self.out[at..]));
        self.out.extend_from_slice(b"\r\n");
        self.fields.push(HeaderSpan {
            name: start..start + name.len(),
            value,
            line_end: self.out.len(),
            kind: HeaderKind::of(name),
            connection_listed: false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::http1::{fill_written, parse_request, HeadLimits, RequestHead};
    use crate::error::ProxyError;

    /// `:protocol` goes into the written head as the `Upgrade` value: only a token may.
    #[test]
    fn an_extended_connect_protocol_must_be_a_token() {
        let req = http::Request::connect("http://a.test/chat").body(());
        let (parts, ()) = req.unwrap_or_default().into_parts();
        let upgrade = |protocol: &[u8]| {
            let mut out = Vec::new();
            write_upgrade_head(&mut out, &mut Vec::new(), &parts, protocol, b"k").map(|_| out)
        };
        let written = upgrade(b"websocket").unwrap_or_default();
        assert!(written.windows(18).any(|w| w == b"upgrade: websocket"));
        for bad in [&b"websocket\r\nx: 1"[..], b"web socket", b"", b"ws\0"] {
            assert!(upgrade(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    fn head(req: http::Request<()>, eos: bool) -> Result<String, Malformed> {
        let (parts, ()) = req.into_parts();
        let mut out = Vec::new();
        let written = write_head(&mut out, &mut Vec::new(), &parts, eos);
        written.map(|_| String::from_utf8(out).unwrap_or_default())
    }

    /// The head `fill_written` makes of the written bytes, and the one `parse_request`
    /// makes of the same bytes: they must agree in every field and span.
    fn both(req: http::Request<()>, max_headers: usize) -> [Result<String, ProxyError>; 2] {
        let (parts, ()) = req.into_parts();
        let (mut out, mut filled) = (Vec::new(), RequestHead::default());
        let line = write_head(&mut out, &mut filled.headers, &parts, false);
        assert!(line.is_ok(), "{parts:?}");
        let line = line.unwrap_or(Line {
            method: 0..0,
            target: 0..0,
        });
        let limits = HeadLimits {
            max_header_size: out.len(),
            max_headers,
        };
        let filled = fill_written(&out, line.method, line.target, limits, &mut filled)
            .map(|()| format!("{filled:?}"));
        let mut parsed = RequestHead::default();
        let parsed = match parse_request(&out, limits, &mut parsed) {
            Ok(true) => Ok(format!("{parsed:?}")),
            Ok(false) => Err(ProxyError::BadRequest("incomplete")),
            Err(e) => Err(e),
        };
        [filled, parsed]
    }

    #[test]
    fn filled_head_is_the_parsed_head() {
        let requests = [
            http::Request::get("http://example.com:8080/a?b=1")
                .header("cookie", "a=1")
                .header("x-y", " padded\t ")
                .header("x-empty", "")
                .header("cookie", "b=2")
                .header("expect", "100-continue")
                .header("content-length", "0"),
            http::Request::post("http://[::1]:80/p").header("x-forwarded-for", "1.2.3.4"),
            http::Request::options("http://e/x").header("x-real-ip", "10.0.0.1"),
            http::Request::head("http://e./").header("te", "trailers"),
            // Refused by the checks after tokenising, the same way by both.
            http::Request::get("http://e/").header("content-length", "0, 0"),
            http::Request::get("http://e/").header("expect", "other"),
            http::Request::get("http://a@e/"),
            http::Request::get("/no-authority"),
            http::Request::get("/two-hosts")
                .header("host", "a")
                .header("host", "b"),
            // host, x-a, x-b, transfer-encoding: one more than `max_headers`.
            http::Request::get("http://e/")
                .header("x-a", "1")
                .header("x-b", "2"),
        ];
        let last = requests.len() - 1;
        for (i, req) in requests.into_iter().enumerate() {
            let req = req.body(()).unwrap_or_default();
            let described = format!("{req:?}");
            let max_headers = if i == last { 3 } else { 8 };
            let [filled, parsed] = both(req, max_headers);
            assert_eq!(filled, parsed, "{described}");
        }
    }

    /// The edges: exactly `max_headers` fields, a value of only whitespace, bytes above
    /// ASCII in a value (obs-text), a `:path` that is only a query.
    #[test]
    fn filled_head_is_the_parsed_head_at_the_edges() {
        let obs_text = http::HeaderValue::from_bytes(b"caf\xc3\xa9")
            .unwrap_or(http::HeaderValue::from_static("x"));
        let requests = [
            // host, x-a, x-b, transfer-encoding: exactly `max_headers`.
            (
                http::Request::get("http://e/")
                    .header("x-a", "1")
                    .header("x-b", "2"),
                4,
            ),
            (http::Request::get("http://e/").header("x-ws", " \t"), 8),
            (http::Request::get("http://e/").header("x-o", obs_text), 8),
        ];
        for (req, max_headers) in requests {
            let req = req.body(()).unwrap_or_default();
            let described = format!("{req:?}");
            let [filled, parsed] = both(req, max_headers);
            assert!(filled.is_ok(), "{described}: {filled:?}");
            assert_eq!(filled, parsed, "{described}");
        }
        // Accepted or refused, the same way by both.
        let req = http::Request::get("http://e?q=1")
            .body(())
            .unwrap_or_default();
        let [filled, parsed] = both(req, 8);
        assert_eq!(filled, parsed);
    }

    #[test]
    fn target_bytes_httparse_refuses_are_refused() {
        // `http` refuses DEL in a `:path` already; `fill_written` refuses it on its own
        // too, as httparse does, should a writer ever let one through.
        let buf = b"GET /a\x7fb HTTP/1.1\r\nhost: e\r\n\r\n";
        let mut head = RequestHead::default();
        head.headers.push(HeaderSpan {
            name: 19..23,
            value: 25..26,
            line_end: 28,
            kind: HeaderKind::Host,
            connection_listed: false,
        });
        let limits = HeadLimits {
            max_header_size: buf.len(),
            max_headers: 8,
        };
        let filled = fill_written(buf, 0..3, 4..8, limits, &mut head);
        assert_eq!(
            filled,
            Err(ProxyError::BadRequest("malformed request line"))
        );
        assert!(parse_request(buf, limits, &mut RequestHead::default()).is_err());
        head.headers.truncate(1);
        let fine = b"GET /a_b HTTP/1.1\r\nhost: e\r\n\r\n";
        assert_eq!(fill_written(fine, 0..3, 4..8, limits, &mut head), Ok(()));
        // One byte over `max_header_size`: 431, as `parse_request` answers.
        let small = HeadLimits {
            max_header_size: fine.len() - 1,
            max_headers: 8,
        };
        let over = fill_written(fine, 0..3, 4..8, small, &mut head);
        assert_eq!(over, Err(ProxyError::HeadTooLarge));
        assert_eq!(
            parse_request(fine, small, &mut RequestHead::default()).err(),
            Some(ProxyError::HeadTooLarge)
        );
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
        let mut fields = Vec::new();
        let line = write_upgrade_head(&mut out, &mut fields, &parts, b"websocket", b"a2V5");
        assert_eq!(line.map(|l| l.target), Ok(4..13));
        assert_eq!(fields.len(), 5);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "GET /chat?x=1 HTTP/1.1\r\nhost: example.com\r\nsec-websocket-version: 13\r\n\
             connection: upgrade\r\nupgrade: websocket\r\nsec-websocket-key: a2V5\r\n\r\n"
        );
    }

    /// The `http` crate's HTTP/2 names take `"`; the written head must not.
    #[test]
    fn refuses_field_names_that_are_not_tokens() {
        for bad in [&b"x\"y"[..], b"\"", b"\"x", b"y\""] {
            let name = http::HeaderName::from_lowercase(bad);
            assert!(name.is_ok(), "{bad:?} is an http crate HTTP/2 name");
            let Ok(name) = name else { continue };
            let req = http::Request::get("http://e/").header(name, "1").body(());
            assert_eq!(
                head(req.unwrap_or_default(), true),
                Err(Malformed("field name is not a token"))
            );
        }
        let req = http::Request::get("http://e/").header("x-y!#$%&'*+.^_`|~09", "1");
        assert!(head(req.body(()).unwrap_or_default(), true).is_ok());
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
