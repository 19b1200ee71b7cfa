//! Request-head parser tests. Every accepted head is also fed at every byte boundary: each
//! strict prefix must be reported incomplete, never accepted or rejected early.

use super::*;

const LIMITS: HeadLimits = HeadLimits {
    max_header_size: 16 * 1024,
    max_headers: 100,
};

fn parse(raw: &[u8]) -> Result<RequestHead, ProxyError> {
    let mut head = RequestHead::default();
    assert!(
        parse_request(raw, LIMITS, &mut head)?,
        "incomplete: {:?}",
        String::from_utf8_lossy(raw)
    );
    for cut in 0..head.head_len {
        let mut partial = RequestHead::default();
        assert_eq!(
            parse_request(&raw[..cut], LIMITS, &mut partial),
            Ok(false),
            "prefix {cut}"
        );
    }
    Ok(head)
}

#[test]
fn simple_get() {
    let raw = b"GET /a?b=1 HTTP/1.1\r\nHost: Example.com:8080\r\nAccept: */*\r\n\r\n";
    let head = parse(raw).unwrap();
    assert_eq!(&raw[head.method.clone()], b"GET");
    assert_eq!(&raw[head.path.clone()], b"/a?b=1");
    assert_eq!(head.host_name(raw), b"Example.com");
    assert_eq!(head.framing, BodyFraming::None);
    assert_eq!(head.head_len, raw.len());
    assert!(head.idempotent);
}

#[test]
fn bodies() {
    let head = parse(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello").unwrap();
    assert_eq!(head.framing, BodyFraming::Length(5));
    let head = parse(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n").unwrap();
    assert_eq!(head.framing, BodyFraming::Chunked);
}

#[test]
fn absolute_form_overrides_host() {
    let raw = b"GET http://origin.test:81/x HTTP/1.1\r\nHost: other\r\n\r\n";
    let head = parse(raw).unwrap();
    assert_eq!(head.host_name(raw), b"origin.test");
    assert_eq!(&raw[head.path.clone()], b"/x");
}

// ---------------------------------------------------------------------------------------
// Strictness / request smuggling, table-driven.
// ---------------------------------------------------------------------------------------

/// What a malformed head must produce. `Bad(s)`: `BadRequest` whose reason contains `s`.
#[derive(Debug, Clone, Copy)]
enum Want {
    Bad(&'static str),
    Is(ProxyError),
}

impl Want {
    fn matches(self, got: ProxyError) -> bool {
        match (self, got) {
            (Want::Bad(part), ProxyError::BadRequest(reason)) => reason.contains(part),
            (Want::Is(want), got) => want == got,
            _ => false,
        }
    }
}

/// Parses a malformed head whole, then at every byte boundary: the whole head must give the
/// expected error, and no prefix may be accepted (each is incomplete or the same error).
fn reject(name: &str, raw: &[u8], limits: HeadLimits, want: Want) {
    let mut head = RequestHead::default();
    match parse_request(raw, limits, &mut head) {
        Err(got) if want.matches(got) => {}
        other => panic!(
            "{name}: want {want:?}, got {other:?} for {:?}",
            String::from_utf8_lossy(raw)
        ),
    }
    for cut in 0..raw.len() {
        let mut partial = RequestHead::default();
        match parse_request(&raw[..cut], limits, &mut partial) {
            Ok(false) => {}
            Err(got) if want.matches(got) => {}
            other => panic!("{name}: prefix {cut}: want incomplete or {want:?}, got {other:?}"),
        }
    }
}

const NOT_CHUNKED: ProxyError =
    ProxyError::NotImplemented("only Transfer-Encoding: chunked is supported");

/// Each malformed head and what it must be answered with.
const MALFORMED: &[(&str, &[u8], Want)] = &[
    // --- framing (RFC 9112 6.1-6.3) ---
    (
        "CL and TE",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        Want::Bad("both Content-Length and Transfer-Encoding"),
    ),
    (
        "TE and CL",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
        Want::Bad("both Content-Length and Transfer-Encoding"),
    ),
    (
        "CL 0 and TE",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n",
        Want::Bad("both Content-Length and Transfer-Encoding"),
    ),
    (
        "duplicate CL, equal",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
        Want::Bad("duplicate Content-Length"),
    ),
    (
        "duplicate CL, different",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        Want::Bad("duplicate Content-Length"),
    ),
    (
        "duplicate CL, different case of name",
        b"POST / HTTP/1.1\r\nHost: a\r\ncontent-length: 5\r\nCONTENT-LENGTH: 6\r\n\r\n",
        Want::Bad("duplicate Content-Length"),
    ),
    (
        "CL plus sign",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
        Want::Bad("malformed Content-Length"),
    ),
    (
        "CL minus sign",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -5\r\n\r\n",
        Want::Bad("malformed Content-Length"),
    ),
    (
        "CL list, equal values",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n",
        Want::Bad("malformed Content-Length"),
    ),
    (
        "CL list, different values",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5,6\r\n\r\n",
        Want::Bad("malformed Content-Length"),
    ),
    (
        "CL letters",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5a\r\n\r\n",
        Want::Bad("malformed Content-Length"),
    ),
    (
        "CL hex",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\n",
        Want::Bad("malformed Content-Length"),
    ),
    (
        "CL inner space",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1 2\r\n\r\n",
        Want::Bad("malformed Content-Length"),
    ),
    (
        "CL empty",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n\r\n",
        Want::Bad("malformed Content-Length"),
    ),
    (
        "CL u64 overflow",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551616\r\n\r\n",
        Want::Bad("malformed Content-Length"),
    ),
    (
        "CL 20 digits",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 00000000000000000005\r\n\r\n",
        Want::Bad("malformed Content-Length"),
    ),
    (
        "TE gzip",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n",
        Want::Is(NOT_CHUNKED),
    ),
    (
        "TE gzip, chunked",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        Want::Is(NOT_CHUNKED),
    ),
    (
        "TE chunked, identity",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
        Want::Is(NOT_CHUNKED),
    ),
    (
        "TE identity",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n",
        Want::Is(NOT_CHUNKED),
    ),
    (
        "TE chunked twice in one field",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
        Want::Is(NOT_CHUNKED),
    ),
    (
        "TE chunk (typo)",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunk\r\n\r\n",
        Want::Is(NOT_CHUNKED),
    ),
    (
        "TE with vertical tab (httparse refuses the control character)",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\x0b\r\n\r\n",
        Want::Bad("invalid header value"),
    ),
    (
        "CL u64::MAX (20 digits)",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551615\r\n\r\n",
        Want::Bad("malformed Content-Length"),
    ),
    (
        "TE chunked in two fields",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        Want::Bad("duplicate Transfer-Encoding"),
    ),
    (
        "TE in HTTP/1.0",
        b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        Want::Bad("Transfer-Encoding in an HTTP/1.0 request"),
    ),
    (
        "TE and CL in HTTP/1.0",
        b"POST / HTTP/1.0\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        Want::Bad("both Content-Length and Transfer-Encoding"),
    ),
    // --- field syntax ---
    (
        "obs-fold (SP)",
        b"GET / HTTP/1.1\r\nHost: a\r\nX-A: one\r\n two\r\n\r\n",
        Want::Bad("invalid header name"),
    ),
    (
        "obs-fold (HTAB) on Transfer-Encoding",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\tchunked\r\n\r\n",
        Want::Bad("invalid header name"),
    ),
    (
        "whitespace before colon",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length : 5\r\n\r\n",
        Want::Bad("invalid header name"),
    ),
    (
        "tab before colon",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding\t: chunked\r\n\r\n",
        Want::Bad("invalid header name"),
    ),
    (
        "leading whitespace on the first field line",
        b"GET / HTTP/1.1\r\n Host: a\r\n\r\n",
        Want::Bad("invalid header name"),
    ),
    (
        "empty field name",
        b"GET / HTTP/1.1\r\nHost: a\r\n: x\r\n\r\n",
        Want::Bad("invalid header name"),
    ),
    (
        "field line without colon",
        b"GET / HTTP/1.1\r\nHost: a\r\nX-A\r\n\r\n",
        Want::Bad("invalid header name"),
    ),
    (
        "NUL in a field value",
        b"GET / HTTP/1.1\r\nHost: a\r\nX-A: a\x00b\r\n\r\n",
        Want::Bad("invalid header value"),
    ),
    (
        "bare CR in a field value",
        b"GET / HTTP/1.1\r\nHost: a\r\nX-A: a\rb\r\n\r\n",
        Want::Bad("invalid header value"),
    ),
    // --- request line ---
    (
        "bad method token",
        b"G@T / HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Bad("invalid method"),
    ),
    (
        "method with a slash",
        b"GE/T / HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Bad("invalid method"),
    ),
    (
        "empty method",
        b" / HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Bad("invalid method"),
    ),
    // httparse reports the next two as token errors, hence the "invalid method" reason.
    (
        "two spaces after the method",
        b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Bad("invalid method"),
    ),
    (
        "missing version",
        b"GET /\r\nHost: a\r\n\r\n",
        Want::Bad("invalid method"),
    ),
    (
        "DEL in the target",
        b"GET /\x7f HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Bad("invalid method"),
    ),
    (
        "trailing space after the version",
        b"GET / HTTP/1.1 \r\nHost: a\r\n\r\n",
        Want::Bad("malformed request line"),
    ),
    (
        "bare CR after the request line",
        b"GET / HTTP/1.1\rHost: a\r\n\r\n",
        Want::Bad("malformed request line"),
    ),
    // httparse takes "b" for the version; Weir sees the request line has four parts: 400.
    (
        "space inside the target",
        b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Is(ProxyError::BadRequest("malformed request line")),
    ),
    (
        "target without a slash",
        b"GET foo HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Bad("invalid request-target"),
    ),
    (
        "target of another scheme",
        b"GET ftp://a/x HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Bad("invalid request-target"),
    ),
    (
        "absolute-form, empty authority",
        b"GET http:///x HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Bad("invalid request-target authority"),
    ),
    (
        "absolute-form, scheme only",
        b"GET http:// HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Bad("invalid request-target"),
    ),
    (
        "absolute-form with userinfo",
        b"GET http://user@a/x HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Bad("invalid request-target authority"),
    ),
    (
        "absolute-form, query without path",
        b"GET http://a?x=1 HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Bad("invalid request-target"),
    ),
    // --- fragment (RFC 9112 3.2: no target form has one) ---
    (
        "fragment after a dot segment",
        b"GET /public/..#/admin HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Is(ProxyError::BadRequest("fragment in request-target")),
    ),
    (
        "empty fragment",
        b"GET /public/.# HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Is(ProxyError::BadRequest("fragment in request-target")),
    ),
    (
        "fragment after the query",
        b"GET /a?b=1#c HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Is(ProxyError::BadRequest("fragment in request-target")),
    ),
    (
        "absolute-form with a fragment",
        b"GET http://a/public/..#/admin HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Is(ProxyError::BadRequest("fragment in request-target")),
    ),
    (
        "absolute-form, fragment in the authority",
        b"GET http://a#/x HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Is(ProxyError::BadRequest("fragment in request-target")),
    ),
    (
        "authority-form without CONNECT",
        b"GET a:80 HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Bad("invalid request-target"),
    ),
    (
        "asterisk with GET",
        b"GET * HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Bad("invalid request-target"),
    ),
    (
        "CONNECT",
        b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
        Want::Is(ProxyError::MethodNotAllowed),
    ),
    (
        "HTTP/2.0",
        b"GET / HTTP/2.0\r\nHost: a\r\n\r\n",
        Want::Is(ProxyError::VersionNotSupported),
    ),
    (
        "HTTP/1.2",
        b"GET / HTTP/1.2\r\nHost: a\r\n\r\n",
        Want::Is(ProxyError::VersionNotSupported),
    ),
    (
        "HTTP/0.9 style line",
        b"GET / HTTP/0.9\r\n\r\n",
        Want::Is(ProxyError::VersionNotSupported),
    ),
    (
        "lower-case protocol name",
        b"GET / http/1.1\r\nHost: a\r\n\r\n",
        Want::Is(ProxyError::BadRequest("malformed request line")),
    ),
    // --- Host ---
    (
        "missing Host in HTTP/1.1",
        b"GET / HTTP/1.1\r\nAccept: */*\r\n\r\n",
        Want::Bad("missing Host"),
    ),
    (
        "duplicate Host",
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        Want::Bad("duplicate Host"),
    ),
    (
        "duplicate Host, same value",
        b"GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n",
        Want::Bad("duplicate Host"),
    ),
    (
        "duplicate Host in HTTP/1.0",
        b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n",
        Want::Bad("duplicate Host"),
    ),
    (
        "Host with a space",
        b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
        Want::Bad("invalid Host"),
    ),
    (
        "Host with a slash",
        b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n",
        Want::Bad("invalid Host"),
    ),
    (
        "Host with userinfo",
        b"GET / HTTP/1.1\r\nHost: u@a\r\n\r\n",
        Want::Bad("invalid Host"),
    ),
    (
        "Host list",
        b"GET / HTTP/1.1\r\nHost: a,b\r\n\r\n",
        Want::Bad("invalid Host"),
    ),
    (
        "Host with an empty label",
        b"GET / HTTP/1.1\r\nHost: secret.example..\r\n\r\n",
        Want::Bad("invalid Host"),
    ),
    (
        "Host with non-ASCII",
        b"GET / HTTP/1.1\r\nHost: \xc3\xa9.test\r\n\r\n",
        Want::Bad("invalid Host"),
    ),
    (
        "empty Host (RFC 9112 allows it; Weir refuses)",
        b"GET / HTTP/1.1\r\nHost: \r\n\r\n",
        Want::Bad("invalid Host"),
    ),
    (
        "absolute-form authority with a bad character",
        b"GET http://a%2fb/x HTTP/1.1\r\nHost: a\r\n\r\n",
        Want::Bad("invalid Host"),
    ),
    // --- Expect ---
    (
        "Expect other than 100-continue",
        b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\nContent-Length: 1\r\n\r\n",
        Want::Is(ProxyError::ExpectationFailed),
    ),
    (
        "Expect with a parameter",
        b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue; x=1\r\nContent-Length: 1\r\n\r\n",
        Want::Is(ProxyError::ExpectationFailed),
    ),
];

#[test]
fn malformed_heads_get_the_right_error() {
    for &(name, raw, want) in MALFORMED {
        reject(name, raw, LIMITS, want);
    }
}

/// Every malformed head maps to a 4xx/5xx the client is told (never silently dropped).
#[test]
fn malformed_heads_map_to_statuses() {
    let mut seen = std::collections::BTreeSet::new();
    for &(name, raw, _) in MALFORMED {
        let mut head = RequestHead::default();
        let e = parse_request(raw, LIMITS, &mut head).expect_err(name);
        let status = e.status().expect("answerable");
        assert!((400..=505).contains(&status), "{name}: {status}");
        seen.insert(status);
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        [400, 405, 417, 501, 505]
    );
}

fn many_headers(n: usize) -> Vec<u8> {
    let mut raw = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
    for i in 1..n {
        raw.extend_from_slice(format!("X-H{i}: v\r\n").as_bytes());
    }
    raw.extend_from_slice(b"\r\n");
    raw
}

#[test]
fn header_count_limit() {
    let limits = HeadLimits {
        max_header_size: 64 * 1024,
        max_headers: 10,
    };
    // Exactly at the limit: accepted.
    let mut head = RequestHead::default();
    assert_eq!(
        parse_request(&many_headers(10), limits, &mut head),
        Ok(true)
    );
    assert_eq!(head.headers.len(), 10);
    // One more: 431.
    reject(
        "11 headers, limit 10",
        &many_headers(11),
        limits,
        Want::Is(ProxyError::HeadTooLarge),
    );
    // Above the on-stack slot count (the heap path of the parser).
    let limits = HeadLimits {
        max_header_size: 64 * 1024,
        max_headers: 200,
    };
    assert_eq!(
        parse_request(&many_headers(200), limits, &mut head),
        Ok(true)
    );
    assert_eq!(head.headers.len(), 200);
    let mut head = RequestHead::default();
    assert_eq!(
        parse_request(&many_headers(201), limits, &mut head),
        Err(ProxyError::HeadTooLarge)
    );
}

#[test]
fn head_size_limit() {
    let limits = HeadLimits {
        max_header_size: 256,
        max_headers: 100,
    };
    let fill = |len: usize| {
        let mut raw = b"GET / HTTP/1.1\r\nHost: a\r\nX-Pad: ".to_vec();
        let pad = len - raw.len() - 4;
        raw.extend(std::iter::repeat_n(b'p', pad));
        raw.extend_from_slice(b"\r\n\r\n");
        assert_eq!(raw.len(), len);
        raw
    };
    // A head of exactly max_header_size bytes is accepted, with a body after it.
    let mut raw = fill(256);
    raw.extend_from_slice(b"body bytes after the head");
    let mut head = RequestHead::default();
    assert_eq!(parse_request(&raw, limits, &mut head), Ok(true));
    assert_eq!(head.head_len, 256);
    // One byte more: 431 once complete ...
    reject(
        "257-byte head",
        &fill(257),
        limits,
        Want::Is(ProxyError::HeadTooLarge),
    );
    // ... and already while incomplete, as soon as the buffer reaches the limit.
    let endless = [
        b"GET / HTTP/1.1\r\nHost: a\r\nX-Pad: ".as_slice(),
        &[b'p'; 300],
    ]
    .concat();
    assert_eq!(parse_request(&endless[..255], limits, &mut head), Ok(false));
    assert_eq!(
        parse_request(&endless[..256], limits, &mut head),
        Err(ProxyError::HeadTooLarge)
    );
    // An over-long request line is a head too large as well.
    let long_line = [b"GET /".as_slice(), &[b'a'; 300]].concat();
    assert_eq!(
        parse_request(&long_line, limits, &mut head),
        Err(ProxyError::HeadTooLarge)
    );
}

/// httparse 1.10 accepts a bare LF as the line terminator (RFC 9112 2.2 allows a recipient to),
/// both in the request line and in field lines, mixed with CRLF. Weir accepts such heads; this
/// is safe for framing because the upstream head is re-serialised with CRLF
/// (forward/request_head.rs), so the upstream never sees the bare LFs.
#[test]
fn bare_lf_line_endings_are_accepted() {
    for raw in [
        &b"GET /lf HTTP/1.1\nHost: a\n\n"[..],
        b"GET /lf HTTP/1.1\r\nHost: a\n\r\n",
        b"GET /lf HTTP/1.1\nHost: a\r\n\n",
        b"POST /lf HTTP/1.1\nHost: a\nContent-Length: 2\n\nhi",
    ] {
        let head = parse(raw).unwrap();
        assert_eq!(&raw[head.path.clone()], b"/lf");
        assert_eq!(head.host_name(raw), b"a");
        assert_eq!(
            head.headers.len(),
            raw.iter().filter(|b| **b == b':').count()
        );
    }
    let raw = b"POST /lf HTTP/1.1\nHost: a\nContent-Length: 2\n\nhi";
    let head = parse(raw).unwrap();
    assert_eq!(head.framing, BodyFraming::Length(2));
    assert_eq!(&raw[head.head_len..], b"hi");
}

/// Empty lines before the request line are skipped (RFC 9112 2.2) and counted in head_len.
#[test]
fn leading_empty_lines_are_skipped() {
    let raw = b"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n";
    let mut head = RequestHead::default();
    assert_eq!(parse_request(raw, LIMITS, &mut head), Ok(true));
    assert_eq!(head.head_len, raw.len());
    assert_eq!(&raw[head.method.clone()], b"GET");
}

// ---------------------------------------------------------------------------------------
// Accepted heads: what the parser reports about them.
// ---------------------------------------------------------------------------------------

#[test]
fn connection_tokens() {
    let head = parse(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").unwrap();
    assert_eq!(
        head.connection,
        ConnectionOptions {
            close: true,
            keep_alive: false,
            upgrade: false
        }
    );
    let head = parse(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").unwrap();
    assert!(head.connection.keep_alive && !head.connection.close);
    // Several fields and lists, any case, optional whitespace and empty elements.
    let head = parse(
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive ,, UPGRADE\r\nConnection: Close\r\n\r\n",
    )
    .unwrap();
    assert_eq!(
        head.connection,
        ConnectionOptions {
            close: true,
            keep_alive: true,
            upgrade: true
        }
    );
    // Same length, not the same token: an ordinary (hop-by-hop) name, not an option.
    let head =
        parse(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep_alive, c1ose\r\n\r\n").unwrap();
    assert_eq!(head.connection, ConnectionOptions::default());
    // No Connection header: all false.
    let head = parse(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    assert_eq!(head.connection, ConnectionOptions::default());
}

#[test]
fn headers_named_by_connection_are_marked() {
    let raw = b"GET / HTTP/1.1\r\nHost: a\r\nX-Hop: 1\r\nConnection: x-hop, close\r\n\
                X-End: 2\r\nx-HOP2: 3\r\nConnection: X-Hop2\r\n\r\n";
    let head = parse(raw).unwrap();
    let listed: Vec<(&[u8], bool)> = head
        .headers
        .iter()
        .map(|h| (&raw[h.name.clone()], h.connection_listed))
        .collect();
    assert_eq!(
        listed,
        vec![
            (&b"Host"[..], false),
            (b"X-Hop", true),
            (b"Connection", false),
            (b"X-End", false),
            (b"x-HOP2", true),
            (b"Connection", false),
        ]
    );
    assert!(head.connection.close);
}

/// Headers the proxy itself relies on are never marked, even if Connection names them
/// (so a client cannot strip Host, Content-Length or the forwarded headers that way).
#[test]
fn connection_cannot_name_away_proxy_headers() {
    let raw = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nX-Forwarded-For: 1.2.3.4\r\n\
                Connection: host, content-length, x-forwarded-for\r\n\r\nx";
    let head = parse(raw).unwrap();
    assert!(head.headers.iter().all(|h| !h.connection_listed));
    assert_eq!(head.framing, BodyFraming::Length(1));
}

/// RFC 9110 7.6.1: every field named by Connection is hop-by-hop, however many it names
/// (regression: only the first 8 tokens used to be remembered, so a 9th was forwarded).
#[test]
fn more_than_eight_connection_tokens_are_all_marked() {
    let mut raw = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: ".to_vec();
    let names: Vec<String> = (1..=10).map(|i| format!("x-h{i}")).collect();
    raw.extend_from_slice(names.join(", ").as_bytes());
    raw.extend_from_slice(b"\r\n");
    for n in &names {
        raw.extend_from_slice(format!("{n}: v\r\n").as_bytes());
    }
    raw.extend_from_slice(b"\r\n");
    let head = parse(&raw).unwrap();
    for h in head.headers.iter().filter(|h| h.kind == HeaderKind::Other) {
        assert!(
            h.connection_listed,
            "{}",
            String::from_utf8_lossy(&raw[h.name.clone()])
        );
    }
}

#[test]
fn idempotency_and_head_flag() {
    for (method, idempotent) in [
        ("GET", true),
        ("HEAD", true),
        ("OPTIONS", true),
        ("TRACE", true),
        ("PUT", true),
        ("DELETE", true),
        ("POST", false),
        ("PATCH", false),
        ("PROPFIND", false),
        ("get", false),
    ] {
        let raw = format!("{method} / HTTP/1.1\r\nHost: a\r\n\r\n");
        let head = parse(raw.as_bytes()).unwrap();
        assert_eq!(head.idempotent, idempotent, "{method}");
        assert_eq!(head.is_head, method == "HEAD", "{method}");
        assert_eq!(&raw.as_bytes()[head.method.clone()], method.as_bytes());
    }
}

#[test]
fn asterisk_form_with_options() {
    let raw = b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n";
    let head = parse(raw).unwrap();
    assert_eq!(&raw[head.path.clone()], b"*");
    assert_eq!(head.target_authority, None);
}

#[test]
fn absolute_form_with_empty_path() {
    let raw = b"GET http://origin.test HTTP/1.1\r\nHost: other\r\n\r\n";
    let head = parse(raw).unwrap();
    assert!(head.path.is_empty(), "empty range stands for /");
    assert_eq!(head.path(raw), b"/");
    assert_eq!(head.host_name(raw), b"origin.test");
    assert_eq!(&raw[head.target_authority.clone().unwrap()], b"origin.test");
    // Scheme is case-insensitive, https is accepted too; the query stays with the path.
    let raw = b"GET HTTPS://origin.test:8443/p?q=1 HTTP/1.1\r\nHost: other\r\n\r\n";
    let head = parse(raw).unwrap();
    assert_eq!(&raw[head.path.clone()], b"/p?q=1");
    assert_eq!(&raw[head.host.clone().unwrap()], b"origin.test:8443");
    assert_eq!(head.host_name(raw), b"origin.test");
}

#[test]
fn ipv6_hosts() {
    let raw = b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n";
    let head = parse(raw).unwrap();
    assert_eq!(head.host_name(raw), b"[::1]");
    let raw = b"GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n";
    assert_eq!(parse(raw).unwrap().host_name(raw), b"[::1]");
    let raw = b"GET http://[2001:db8::1]:8080/x HTTP/1.1\r\nHost: a\r\n\r\n";
    let head = parse(raw).unwrap();
    assert_eq!(head.host_name(raw), b"[2001:db8::1]");
    assert_eq!(&raw[head.path.clone()], b"/x");
}

#[test]
fn host_name_drops_a_trailing_dot() {
    for (host, name) in [
        (&b"example.com."[..], &b"example.com"[..]),
        (b"Example.COM.:8080", b"Example.COM"),
        (b"example.com", b"example.com"),
        (b"[::1]:80", b"[::1]"),
    ] {
        let mut raw = b"GET / HTTP/1.1\r\nHost: ".to_vec();
        raw.extend_from_slice(host);
        raw.extend_from_slice(b"\r\n\r\n");
        let head = parse(&raw).unwrap();
        assert_eq!(
            head.host_name(&raw),
            name,
            "{}",
            String::from_utf8_lossy(host)
        );
    }
    let raw = b"GET http://a.test./x HTTP/1.1\r\nHost: b\r\n\r\n";
    assert_eq!(parse(raw).unwrap().host_name(raw), b"a.test");
}

#[test]
fn http10_without_host() {
    let raw = b"GET /old HTTP/1.0\r\n\r\n";
    let head = parse(raw).unwrap();
    assert_eq!(head.minor_version, 0);
    assert_eq!(head.host, None);
    assert_eq!(head.host_name(raw), b"");
    assert_eq!(head.framing, BodyFraming::None);
    // With a Host header it is used.
    let raw = b"GET /old HTTP/1.0\r\nHost: h:1\r\n\r\n";
    assert_eq!(parse(raw).unwrap().host_name(raw), b"h");
}

#[test]
fn framing_details() {
    // Content-Length 0 means no body; optional whitespace around the value is fine.
    let head = parse(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n").unwrap();
    assert_eq!(head.framing, BodyFraming::None);
    let head = parse(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length:   7  \r\n\r\n").unwrap();
    assert_eq!(head.framing, BodyFraming::Length(7));
    // Up to 19 digits are accepted (any 20-digit value, even u64::MAX, is refused).
    let head = parse(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9999999999999999999\r\n\r\n")
        .unwrap();
    assert_eq!(head.framing, BodyFraming::Length(9_999_999_999_999_999_999));
    // HTTP/1.0 with a Content-Length.
    let head = parse(b"POST / HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc").unwrap();
    assert_eq!(head.framing, BodyFraming::Length(3));
    // Transfer-Encoding value is case-insensitive and trimmed.
    let head =
        parse(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:  CHUNKED \r\n\r\n").unwrap();
    assert_eq!(head.framing, BodyFraming::Chunked);
    // A header merely resembling Transfer-Encoding is an ordinary header (framing by CL).
    let raw =
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer_Encoding: chunked\r\nContent-Length: 1\r\n\r\nx";
    let head = parse(raw).unwrap();
    assert_eq!(head.framing, BodyFraming::Length(1));
}

#[test]
fn expect_and_upgrade() {
    let head =
        parse(b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n")
            .unwrap();
    assert!(head.expect_continue);
    let head = parse(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    assert!(!head.expect_continue && !head.upgrade);
    // Upgrade needs both the Upgrade header and the Connection token.
    let head =
        parse(b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
            .unwrap();
    assert!(head.upgrade);
    let head = parse(b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n").unwrap();
    assert!(!head.upgrade);
    let head = parse(b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\n\r\n").unwrap();
    assert!(!head.upgrade);
}

/// A `RequestHead` reused across requests (as the client connection does) carries nothing over.
#[test]
fn reused_head_is_reset() {
    let mut head = RequestHead::default();
    let first = b"POST http://x/ HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\
                  Connection: upgrade\r\nUpgrade: ws\r\nContent-Length: 5\r\n\r\n";
    assert_eq!(parse_request(first, LIMITS, &mut head), Ok(true));
    assert!(head.expect_continue && head.upgrade && head.target_authority.is_some());
    let second = b"GET / HTTP/1.1\r\nHost: b\r\n\r\n";
    assert_eq!(parse_request(second, LIMITS, &mut head), Ok(true));
    assert!(!head.expect_continue && !head.upgrade);
    assert_eq!(head.target_authority, None);
    assert_eq!(head.framing, BodyFraming::None);
    assert_eq!(head.connection, ConnectionOptions::default());
    assert_eq!(head.headers.len(), 1);
    assert_eq!(head.host_name(second), b"b");
}

/// Pipelined requests: the head ends exactly where the next request starts.
#[test]
fn head_len_stops_at_the_next_request() {
    let raw = b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n";
    let head = parse(raw).unwrap();
    assert_eq!(&raw[head.head_len..], b"GET /2 HTTP/1.1\r\nHost: a\r\n\r\n");
    let mut second = RequestHead::default();
    assert_eq!(
        parse_request(&raw[head.head_len..], LIMITS, &mut second),
        Ok(true)
    );
    assert_eq!(&raw[head.head_len..][second.path.clone()], b"/2");
}

/// The name table is the rule it replaced, for every byte value.
#[test]
fn host_bytes_are_letters_digits_and_the_host_delimiters() {
    for b in 0..=255u8 {
        let rule = b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_');
        assert_eq!(super::validate_host(&[b]).is_ok(), rule, "byte {b:#04x}");
        let with_port = [b'a', b, b':', b'8'];
        assert_eq!(
            super::validate_host(&with_port).is_ok(),
            rule,
            "byte {b:#04x}"
        );
    }
}

/// Was: Weir cut the port at the last colon and took any bytes there, or brackets around
/// a name, while nginx and Express cut at the first (attacker review).
#[test]
fn a_host_has_one_port_of_digits_and_brackets_only_around_ipv6() {
    for ok in [
        "a",
        "a:",
        "a:1",
        "a:80",
        "a:0080",
        "a:65535",
        "[::1]",
        "[::1]:8080",
        "[::1]:",
        "[2001:db8::7]:443",
        "[::ffff:192.0.2.1]",
        "secret.example.",
        "1.2.3.4:5",
    ] {
        assert!(super::validate_host(ok.as_bytes()).is_ok(), "{ok}");
    }
    for bad in [
        "secret.example:80:80",
        "secret.example:abc",
        "[secret.example]",
        "a:0",
        "a:65536",
        "a:123456",
        "a:8a",
        ":80",
        "[::1",
        "[::1]x",
        "[::1]:80:80",
        "[::1]:a",
        "[]",
        "a:-1",
        "[v1.x]",
        "[fe80::1%25eth0]",
        "a::80",
        "a..b",
    ] {
        assert!(super::validate_host(bad.as_bytes()).is_err(), "{bad}");
    }
}
