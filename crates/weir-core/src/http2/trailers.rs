//! The trailer section of an HTTP/1.1 chunked body (an upstream's response, a client's
//! request), made into the field map of the trailing HEADERS frame an HTTP/2 peer gets
//! (RFC 9113 8.1), and an HTTP/2 peer's trailers checked for one.
//!
//! What the chunked decoder kept (field lines, validated byte by byte) is split here into
//! fields. A field that may not be a trailer is dropped: the one filter every path uses
//! ([`trailer::relayed`]: what RFC 9110 6.5.1 forbids, hop-by-hop fields, names that are
//! not tokens), and so is what the route's `response_headers` rules and compression took
//! out of the head (the caller's `edited_out`). Fields past the listener's
//! `max_header_list_size` (counted as HTTP/2 does: name + value + 32 each) are dropped
//! too; none of this fails the response.

use http::{HeaderMap, HeaderName, HeaderValue};

use super::names::response_name;
use crate::forward::trailer;

/// The fields of `lines` (trailer field lines, each ending in CRLF) that may go to an
/// HTTP/2 client, at most `max_list_size` of them as HTTP/2 counts, less the names
/// `edited_out` says the head lost (lower case); `None` when none may.
pub fn to_h2(
    lines: &[u8],
    max_list_size: u32,
    edited_out: impl Fn(&[u8]) -> bool,
) -> Option<HeaderMap> {
    // The usual chunked body has no trailers: no map is built.
    if lines.is_empty() {
        return None;
    }
    let (mut fields, mut size, mut dropped) = (HeaderMap::new(), 0, 0usize);
    for field in trailer::fields(lines) {
        let field = field.and_then(|(_, raw, value)| {
            Some((
                response_name(raw).ok()?,
                HeaderValue::from_bytes(value).ok()?,
            ))
        });
        match field.filter(|(n, v)| passes(n, v, &mut size, max_list_size, &edited_out)) {
            Some((name, value)) => _ = fields.append(name, value),
            None => dropped += 1,
        }
    }
    if dropped > 0 {
        tracing::debug!(dropped, "trailer fields not relayed over HTTP/2");
    }
    (!fields.is_empty()).then_some(fields)
}

/// An HTTP/2 upstream's trailers `fields`, less those that may not go to the client (the
/// same rules as [`to_h2`]); `None` when none may.
pub fn keep(
    fields: HeaderMap,
    max_list_size: u32,
    edited_out: impl Fn(&[u8]) -> bool,
) -> Option<HeaderMap> {
    let mut size = 0;
    // The usual gRPC trailers (`grpc-status`, `grpc-message`) all pass: no new map.
    if fields
        .iter()
        .all(|(n, v)| passes(n, v, &mut size, max_list_size, &edited_out))
    {
        return (!fields.is_empty()).then_some(fields);
    }
    let mut size = 0;
    let out: HeaderMap = fields
        .iter()
        .filter(|(n, v)| passes(n, v, &mut size, max_list_size, &edited_out))
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    (!out.is_empty()).then_some(out)
}

/// Whether the field `name: value` may be a trailer for the client ([`trailer::relayed`],
/// not `edited_out`) within `max_list_size` with the fields before it (`size`, counted as
/// HTTP/2 does: name + value + 32 each; a field that passes adds to it).
fn passes(
    name: &HeaderName,
    value: &HeaderValue,
    size: &mut usize,
    max_list_size: u32,
    edited_out: &impl Fn(&[u8]) -> bool,
) -> bool {
    let name = name.as_str().as_bytes();
    let cost = name.len() + value.len() + 32;
    let pass =
        trailer::relayed(name) && !edited_out(name) && *size + cost <= max_list_size as usize;
    *size += if pass { cost } else { 0 };
    pass
}

#[cfg(test)]
mod tests {
    use super::to_h2;

    fn keep(_: &[u8]) -> bool {
        false
    }

    #[test]
    fn end_to_end_fields_pass_and_forbidden_ones_do_not() {
        let lines = b"X-Checksum: abc\r\nContent-Length: 5\r\nHost: evil\r\nConnection: close\r\n\
            Transfer-Encoding: chunked\r\nGrpc-Status:  0 \r\nx-checksum: def\r\nbad name: 1\r\n";
        let fields = to_h2(lines, 64 * 1024, keep).expect("fields");
        let names: Vec<_> = fields.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["x-checksum", "grpc-status"]);
        let sums: Vec<_> = fields.get_all("x-checksum").iter().collect();
        assert_eq!(sums, ["abc", "def"]);
        assert_eq!(fields["grpc-status"], "0");
        assert!(to_h2(b"Content-Length: 5\r\n", 1024, keep).is_none());
        assert!(to_h2(b"", 1024, keep).is_none());
    }

    #[test]
    fn fields_past_the_list_size_are_dropped_not_the_rest() {
        // `x-big` costs 5 + 200 + 32; `x-small` 7 + 1 + 32 = 40.
        let big = "v".repeat(200);
        let lines = format!("X-Big: {big}\r\nX-Small: 1\r\n");
        let fields = to_h2(lines.as_bytes(), 100, keep).expect("fields");
        assert!(!fields.contains_key("x-big"));
        assert_eq!(fields["x-small"], "1");
        assert_eq!(to_h2(b"X-Small: 1\r\n", 39, keep), None);
        assert!(to_h2(b"X-Small: 1\r\n", 40, keep).is_some());
    }

    #[test]
    fn an_h2_upstreams_trailers_keep_what_may_go_within_the_list_size() {
        let map = |fields: &[(&'static str, &'static str)]| {
            let mut map = http::HeaderMap::new();
            for (name, value) in fields {
                map.append(*name, http::HeaderValue::from_static(value));
            }
            map
        };
        let grpc = map(&[("grpc-status", "0"), ("grpc-message", "ok")]);
        assert_eq!(super::keep(grpc.clone(), 1024, keep), Some(grpc));
        let mixed = map(&[
            ("x-a", "1"),
            ("content-length", "5"),
            ("x-secret", "2"),
            ("x-a", "3"),
            ("x-big", "vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv"),
            ("x-b", "4"),
        ]);
        // `x-a` costs 3 + 1 + 32 = 36 each, `x-b` as much: 108 fit, `x-big` (75) does not.
        let kept = super::keep(mixed, 110, |n: &[u8]| n == b"x-secret").expect("kept");
        assert_eq!(kept, map(&[("x-a", "1"), ("x-a", "3"), ("x-b", "4")]));
        assert_eq!(super::keep(map(&[("te", "trailers")]), 1024, keep), None);
        assert_eq!(super::keep(http::HeaderMap::new(), 1024, keep), None);
    }

    #[test]
    fn names_the_caller_drops_are_dropped() {
        let lines = b"Content-Digest: sha-256=:AAAA=:\r\nX-Secret: 1\r\nX-Kept: 2\r\n";
        let dropped = |n: &[u8]| n == b"content-digest" || n == b"x-secret";
        let fields = to_h2(lines, 1024, dropped).expect("fields");
        let names: Vec<_> = fields.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["x-kept"]);
    }
}
