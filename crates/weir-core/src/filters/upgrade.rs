//! Protocol upgrades (`Upgrade`, then `101 Switching Protocols` and a tunnel): which of the
//! protocols a client offers the route lets through, and whether an upstream's 101 switches
//! to one of them.
//!
//! After a 101 Weir relays raw bytes both ways: whatever the new protocol carries reaches
//! the server unseen by the routes. So only the protocols a route lists (`upgrades`, by
//! default `["websocket"]`) are offered upstream; the client's other protocols are stripped,
//! and a request left with none is forwarded as a plain request. `h2c` is never among them
//! (config validation refuses it): an HTTP/2 connection tunnelled that way could send any
//! request for any path. An HTTP/1.0 request's `Upgrade` is ignored (RFC 9110 7.8).

use crate::codec::http1::header::tokens;
use crate::codec::http1::{HeaderKind, HeaderSpan, RequestHead};

/// The protocols offered upstream: bit `i` for the route's `upgrades[i]` (validation keeps
/// that list within 64). Empty: the request is not an upgrade.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offered(u64);

impl Offered {
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// Appends `Connection: upgrade` and an `Upgrade` header listing the protocols of `req`
/// (parsed from `buf`) that `allowed` names, as the client wrote them. Appends nothing and
/// returns an empty set when there are none.
pub fn push_offer(out: &mut Vec<u8>, buf: &[u8], req: &RequestHead, allowed: &[String]) -> Offered {
    if !req.upgrade || req.minor_version == 0 || allowed.is_empty() {
        return Offered::default();
    }
    let start = out.len();
    out.extend_from_slice(b"Connection: upgrade\r\nUpgrade: ");
    let mut offered = 0u64;
    for token in protocols(&req.headers, buf) {
        let Some(i) = allowed_index(allowed, token) else {
            continue;
        };
        if offered != 0 {
            out.extend_from_slice(b", ");
        }
        offered |= 1 << i;
        out.extend_from_slice(token);
    }
    if offered == 0 {
        out.truncate(start);
    } else {
        out.extend_from_slice(b"\r\n");
    }
    Offered(offered)
}

/// Whether a 101 with `headers` (parsed from `buf`) switches to protocols that were all
/// offered: its `Upgrade` names at least one protocol, and only offered ones (RFC 9110 7.8:
/// a server must not switch to a protocol the client did not ask for).
pub fn switch_allowed(
    headers: &[HeaderSpan],
    buf: &[u8],
    allowed: &[String],
    offered: Offered,
) -> bool {
    let mut any = false;
    for token in protocols(headers, buf) {
        match allowed_index(allowed, token) {
            Some(i) if offered.0 & (1 << i) != 0 => any = true,
            _ => return false,
        }
    }
    any
}

/// The protocol tokens of every `Upgrade` header.
fn protocols<'a>(headers: &'a [HeaderSpan], buf: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
    headers
        .iter()
        .filter(|h| h.kind == HeaderKind::Upgrade)
        .flat_map(move |h| tokens(&buf[h.value.clone()]))
}

/// The position in `allowed` (lower-case names) of `token`, a protocol `name[/version]`.
fn allowed_index(allowed: &[String], token: &[u8]) -> Option<usize> {
    let name = token.split(|b| *b == b'/').next().unwrap_or(token);
    allowed
        .iter()
        .take(64)
        .position(|p| p.as_bytes().eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::http1::{parse_request, parse_response, HeadLimits, ResponseHead};

    fn request(raw: &[u8]) -> RequestHead {
        let limits = HeadLimits {
            max_header_size: 4096,
            max_headers: 32,
        };
        let mut head = RequestHead::default();
        assert!(parse_request(raw, limits, &mut head).unwrap());
        head
    }

    fn offer(raw: &[u8], allowed: &[&str]) -> (String, Offered) {
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        let mut out = b"X: 1\r\n".to_vec();
        let offered = push_offer(&mut out, raw, &request(raw), &allowed);
        (String::from_utf8(out).unwrap(), offered)
    }

    const WS: &[u8] =
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: WebSocket\r\n\r\n";
    const H2C: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\n\
                         Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n";

    #[test]
    fn offers_only_allowed_protocols_as_the_client_wrote_them() {
        let (out, offered) = offer(WS, &["websocket"]);
        assert_eq!(out, "X: 1\r\nConnection: upgrade\r\nUpgrade: WebSocket\r\n");
        assert!(!offered.is_empty());
        let (out, offered) = offer(H2C, &["websocket"]);
        assert_eq!((out.as_str(), offered), ("X: 1\r\n", Offered::default()));
        let mixed = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\n\
                      Upgrade: h2c, foo/2\r\nUpgrade: websocket\r\n\r\n";
        let (out, offered) = offer(mixed, &["websocket", "foo"]);
        assert_eq!(
            out,
            "X: 1\r\nConnection: upgrade\r\nUpgrade: foo/2, websocket\r\n"
        );
        assert_eq!(offered, Offered(0b11));
        let (out, _) = offer(WS, &[]);
        assert_eq!(out, "X: 1\r\n");
        let http10 = b"GET / HTTP/1.0\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n";
        assert_eq!(offer(http10, &["websocket"]).1, Offered::default());
    }

    fn switch(raw: &[u8], allowed: &[&str], offered: u64) -> bool {
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        let mut head = ResponseHead::default();
        assert!(parse_response(raw, 4096, false, &mut head).unwrap());
        switch_allowed(&head.headers, raw, &allowed, Offered(offered))
    }

    #[test]
    fn a_switch_must_be_to_an_offered_protocol() {
        let ws = b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n";
        assert!(switch(ws, &["websocket"], 1));
        assert!(!switch(ws, &["websocket"], 0));
        assert!(!switch(ws, &["foo", "websocket"], 1));
        let h2c =
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n";
        assert!(!switch(h2c, &["websocket"], 1));
        let none = b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n\r\n";
        assert!(!switch(none, &["websocket"], 1));
        let two = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket, h2c\r\n\r\n";
        assert!(!switch(two, &["websocket"], 1));
    }
}
