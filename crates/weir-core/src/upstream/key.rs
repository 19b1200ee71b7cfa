//! What a request contributes to choosing a server: the consistent-hash key's hash and the
//! sticky cookie's server id, read from the request head before it is consumed.

use weir_config::{HashKey, LbPolicy};

use super::lb::consistent_hash::hash_key;
use super::lb::sticky_cookie;
use crate::codec::http1::header::field;
use crate::codec::http1::RequestHead;
use crate::filters::forwarded::ClientIp;

/// The request's contribution to the pick; `Copy`, so retries reuse it after the head is
/// consumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestKey {
    /// `consistent_hash`: the hash of the configured key, if the request has it.
    pub hash: Option<u64>,
    /// `sticky_cookie`: the server id the request's cookie names, if any.
    pub sticky: Option<u64>,
}

impl RequestKey {
    /// Reads what `lb` needs from the head `req` parsed from `buf`, whose path normalised
    /// (`RoutedPath`) is `path`.
    #[inline]
    pub fn new(
        lb: &LbPolicy,
        buf: &[u8],
        req: &RequestHead,
        path: &[u8],
        client: &ClientIp,
    ) -> RequestKey {
        match lb {
            LbPolicy::ConsistentHash(_) | LbPolicy::StickyCookie { .. } => {
                RequestKey::read(lb, buf, req, path, client)
            }
            _ => RequestKey::default(),
        }
    }

    /// [`RequestKey::new`] for the policies that read the request: out of line, so that
    /// every other policy's requests pay one comparison, not a call.
    #[inline(never)]
    fn read(
        lb: &LbPolicy,
        buf: &[u8],
        req: &RequestHead,
        path: &[u8],
        client: &ClientIp,
    ) -> RequestKey {
        match lb {
            LbPolicy::ConsistentHash(key) => RequestKey {
                hash: key_bytes(key, buf, req, path, client).map(hash_key),
                sticky: None,
            },
            LbPolicy::StickyCookie { cookie } => RequestKey {
                hash: None,
                sticky: cookie_value(buf, req, cookie).and_then(sticky_cookie::parse_id),
            },
            _ => RequestKey::default(),
        }
    }
}

impl RequestKey {
    /// The key of a TCP (L4) connection: only the client address is known, so only
    /// `consistent_hash` on `client_ip` has a key (other policies need none; other hash
    /// keys and sticky cookies fall back to weighted round robin).
    pub fn for_connection(lb: &LbPolicy, client: &ClientIp) -> RequestKey {
        match lb {
            LbPolicy::ConsistentHash(HashKey::ClientIp) => RequestKey {
                hash: Some(hash_key(client.as_bytes())),
                sticky: None,
            },
            _ => RequestKey::default(),
        }
    }
}

/// The bytes `key` selects from the request, if present. The path is the normalised one
/// (without its query), so `/a/%7Ex`, `/a/./~x` and `/a/~x` (one resource for the routes
/// and the server) go to one server.
fn key_bytes<'a>(
    key: &HashKey,
    buf: &'a [u8],
    req: &RequestHead,
    path: &'a [u8],
    client: &'a ClientIp,
) -> Option<&'a [u8]> {
    match key {
        HashKey::ClientIp => Some(client.as_bytes()),
        HashKey::Path => {
            let end = path.iter().position(|&b| b == b'?').unwrap_or(path.len());
            Some(&path[..end])
        }
        HashKey::Header(name) => field(&req.headers, buf, name.as_bytes()),
        HashKey::Cookie(name) => cookie_value(buf, req, name),
    }
}

/// The value of cookie `name` in the request's `Cookie` header(s), quotes removed.
pub fn cookie_value<'a>(buf: &'a [u8], req: &RequestHead, name: &str) -> Option<&'a [u8]> {
    req.headers
        .iter()
        .filter(|h| buf[h.name.clone()].eq_ignore_ascii_case(b"cookie"))
        .find_map(|h| find_cookie(&buf[h.value.clone()], name.as_bytes()))
}

/// Finds `name=value` in a `Cookie` header value (`a=1; b=2`).
pub fn find_cookie<'a>(header: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    header.split(|&b| b == b';').find_map(|pair| {
        let pair = pair.trim_ascii();
        let eq = pair.iter().position(|&b| b == b'=')?;
        if pair[..eq].trim_ascii() != name {
            return None;
        }
        let value = pair[eq + 1..].trim_ascii();
        Some(
            value
                .strip_prefix(b"\"")
                .and_then(|v| v.strip_suffix(b"\""))
                .unwrap_or(value),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::http1::{parse_request, HeadLimits};

    fn head(text: &str) -> RequestHead {
        let mut req = RequestHead::default();
        let limits = HeadLimits {
            max_header_size: 8192,
            max_headers: 100,
        };
        assert_eq!(parse_request(text.as_bytes(), limits, &mut req), Ok(true));
        req
    }

    #[test]
    fn cookies_are_found_among_others() {
        assert_eq!(find_cookie(b"a=1; b=2", b"b"), Some(&b"2"[..]));
        assert_eq!(find_cookie(b"a=1;b=\"x y\"", b"b"), Some(&b"x y"[..]));
        assert_eq!(find_cookie(b"ab=1", b"a"), None);
        assert_eq!(find_cookie(b"", b"a"), None);
        let text = "GET / HTTP/1.1\r\nHost: x\r\nCookie: a=1\r\ncookie: s=2\r\n\r\n";
        assert_eq!(
            cookie_value(text.as_bytes(), &head(text), "s"),
            Some(&b"2"[..])
        );
    }

    #[test]
    fn hash_keys_read_the_request() {
        let text = "GET /a/b?q=1 HTTP/1.1\r\nHost: x\r\nX-User: alice\r\nCookie: sid=42\r\n\r\n";
        let (buf, req) = (text.as_bytes(), head(text));
        let ip = ClientIp::new("10.1.2.3".parse().unwrap());
        let path = req.path(buf);
        let key =
            |k: HashKey| RequestKey::new(&LbPolicy::ConsistentHash(k), buf, &req, path, &ip).hash;
        assert_eq!(key(HashKey::Path), Some(hash_key(b"/a/b")));
        assert_eq!(key(HashKey::ClientIp), Some(hash_key(b"10.1.2.3")));
        assert_eq!(
            key(HashKey::Header("x-user".into())),
            Some(hash_key(b"alice"))
        );
        assert_eq!(key(HashKey::Cookie("sid".into())), Some(hash_key(b"42")));
        assert_eq!(key(HashKey::Header("x-none".into())), None);
        let rr = RequestKey::new(&LbPolicy::RoundRobin, buf, &req, path, &ip);
        assert_eq!(rr, RequestKey::default());
    }

    /// The path key hashes the normalised path the caller gives, not the raw target.
    #[test]
    fn the_path_key_is_the_normalised_path() {
        let text = "GET /a/./%7Ex?q=1 HTTP/1.1\r\nHost: x\r\n\r\n";
        let (buf, req) = (text.as_bytes(), head(text));
        let ip = ClientIp::new("10.1.2.3".parse().unwrap());
        let lb = LbPolicy::ConsistentHash(HashKey::Path);
        let key = RequestKey::new(&lb, buf, &req, b"/a/~x?q=1", &ip);
        assert_eq!(key.hash, Some(hash_key(b"/a/~x")));
    }

    #[test]
    fn sticky_cookie_is_parsed() {
        let text = "GET / HTTP/1.1\r\nHost: x\r\nCookie: srv=00000000000000ff\r\n\r\n";
        let ip = ClientIp::new("10.1.2.3".parse().unwrap());
        let lb = LbPolicy::StickyCookie {
            cookie: "srv".into(),
        };
        let (buf, req) = (text.as_bytes(), head(text));
        let key = RequestKey::new(&lb, buf, &req, req.path(buf), &ip);
        assert_eq!(key.sticky, Some(255));
    }
}
