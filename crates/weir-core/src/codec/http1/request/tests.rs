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
