//! W3C Trace Context (https://www.w3.org/TR/trace-context/): reading a request's
//! `traceparent` / `tracestate` and writing the ones sent upstream.

use crate::codec::http1::RequestHead;

/// A parent span as a `traceparent` header names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

/// The `traceparent` and `tracestate` values of `req` (in `buf`); the parent `None` when
/// absent, repeated or malformed (the trace then starts anew, as the spec says).
pub fn incoming<'a>(buf: &'a [u8], req: &RequestHead) -> (Option<Parent>, Option<&'a [u8]>) {
    let (mut parent, mut state, mut parents) = (None, None, 0);
    for h in &req.headers {
        let name = &buf[h.name.clone()];
        if name.len() == 11 && name.eq_ignore_ascii_case(b"traceparent") {
            parents += 1;
            parent = parse_traceparent(&buf[h.value.clone()]);
        } else if name.len() == 10 && name.eq_ignore_ascii_case(b"tracestate") {
            // Several lines are one list; only the first is carried on (as most do).
            state = state.or(Some(&buf[h.value.clone()]));
        }
    }
    match parent.filter(|_| parents == 1) {
        Some(p) => (Some(p), state.filter(|s| valid_state(s))),
        None => (None, None),
    }
}

/// `version-traceid-parentid-flags`, lower-case hex; version `ff` and all-zero ids are
/// invalid. A later version may append fields after a `-`.
pub fn parse_traceparent(v: &[u8]) -> Option<Parent> {
    if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let version = hex_byte(&v[0..2])?;
    if version == 0xff || (version == 0 && v.len() != 55) || (v.len() > 55 && v[55] != b'-') {
        return None;
    }
    let mut trace_id = [0u8; 16];
    let mut span_id = [0u8; 8];
    for (i, b) in trace_id.iter_mut().enumerate() {
        *b = hex_byte(&v[3 + 2 * i..5 + 2 * i])?;
    }
    for (i, b) in span_id.iter_mut().enumerate() {
        *b = hex_byte(&v[36 + 2 * i..38 + 2 * i])?;
    }
    let flags = hex_byte(&v[53..55])?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

/// A tracestate worth carrying on: bounded (the spec's 32 members of at most 256
/// characters) and visible ASCII.
fn valid_state(s: &[u8]) -> bool {
    !s.is_empty() && s.len() <= 8192 && s.iter().all(|b| (b' '..=b'~').contains(b))
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(two[0])? << 4 | digit(two[1])?)
}

/// Appends `bytes` as lower-case hex (at most 16 bytes).
pub fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut text = [0u8; 32];
    hex_into(&mut text, bytes);
    out.extend_from_slice(&text[..2 * bytes.len()]);
}

fn hex_into(text: &mut [u8], bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in text.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 15)];
    }
}

/// `00-trace-span-01`: a sampled span as the parent of the next hop.
pub fn push_traceparent(out: &mut Vec<u8>, trace_id: &[u8; 16], span_id: &[u8; 8]) {
    let mut v = *b"00-00000000000000000000000000000000-0000000000000000-01";
    hex_into(&mut v[3..35], trace_id);
    hex_into(&mut v[36..52], span_id);
    out.extend_from_slice(&v);
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &[u8] = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn a_valid_traceparent_is_read_and_written_back_alike() {
        let p = parse_traceparent(VALID).unwrap();
        assert!(p.sampled);
        let mut out = Vec::new();
        push_traceparent(&mut out, &p.trace_id, &p.span_id);
        assert_eq!(out, VALID);
        let unsampled = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
        assert!(!parse_traceparent(unsampled).unwrap().sampled);
        // A later version with more fields is read by its first four.
        assert!(
            parse_traceparent(b"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-xyz")
                .is_some()
        );
    }

    #[test]
    fn malformed_traceparents_are_ignored() {
        for bad in [
            &b"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"[..],
            b"00-00000000000000000000000000000000-b7ad6b7169203331-01",
            b"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            b"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-",
            b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333",
            b"",
        ] {
            assert_eq!(
                parse_traceparent(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
