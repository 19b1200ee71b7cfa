//! TLS 1.3 early data (0-RTT) on the request path, RFC 8470: a request that arrives before
//! its connection's handshake completes may be a replay of another client's (an attacker
//! can resend the first flight), so only one that changes nothing when replayed is served,
//! and the upstream is told it came early (`Early-Data: 1`, which lets it answer 425 Too
//! Early itself); any other is answered 425 at once, and the client sends it again once
//! the handshake is done. HTTP/3 (QUIC 0-RTT, `http3.early_data`) is the one listener
//! kind that accepts early data so far; TLS over TCP does not (its `max_early_data_size`
//! is 0), and would take the same rule from here.

use http::{HeaderMap, HeaderValue};

use crate::error::ProxyError;

/// The field a request received in early data carries upstream (RFC 8470 5.1).
pub const FIELD: &str = "early-data";

/// Whether a request with `method` may be served from early data: a safe method (RFC 9110
/// 9.2.1: GET, HEAD, OPTIONS) changes nothing when replayed.
pub fn replay_safe(method: &[u8]) -> bool {
    matches!(method, b"GET" | b"HEAD" | b"OPTIONS")
}

/// Admits a request received in early data: marks its `headers` with `Early-Data: 1` for
/// the upstream, or refuses it with 425 when its `method` is not safe to replay.
pub fn admit(method: &[u8], headers: &mut HeaderMap) -> Result<(), ProxyError> {
    if !replay_safe(method) {
        return Err(ProxyError::TooEarly);
    }
    headers.insert(FIELD, HeaderValue::from_static("1"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_safe_methods_are_admitted_and_marked() {
        for method in ["GET", "HEAD", "OPTIONS"] {
            let mut headers = HeaderMap::new();
            assert_eq!(admit(method.as_bytes(), &mut headers), Ok(()), "{method}");
            assert_eq!(headers.get(FIELD).map(|v| v.as_bytes()), Some(&b"1"[..]));
        }
        for method in ["POST", "PUT", "DELETE", "PATCH", "CONNECT", "TRACE", "BREW"] {
            let mut headers = HeaderMap::new();
            let refused = admit(method.as_bytes(), &mut headers);
            assert_eq!(refused, Err(ProxyError::TooEarly), "{method}");
            assert!(headers.is_empty(), "{method}");
        }
        assert_eq!(ProxyError::TooEarly.status(), Some(425));
    }
}
