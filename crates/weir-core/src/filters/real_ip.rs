//! The client address behind trusted proxies (`trusted_proxies` of a listener; nginx
//! `set_real_ip_from` + `real_ip_header X-Forwarded-For` + `real_ip_recursive on`).
//!
//! When the peer (after PROXY protocol) is trusted, the `X-Forwarded-For` entries are read
//! right to left, skipping trusted addresses: the first untrusted one is the client. Only
//! entries a trusted proxy appended are believed, so a client cannot choose its address by
//! sending its own header. An entry that is not an address stops the walk at the last
//! address read; a chain of trusted addresses only gives its leftmost one.

use std::net::IpAddr;

use weir_config::Cidr;

use crate::codec::http1::header::trim;
use crate::codec::http1::{HeaderKind, HeaderSpan};

/// The client address for a request from `peer` with `headers` (parsed from `buf`), or
/// `None` when it is the peer itself.
pub fn client_behind(
    peer: IpAddr,
    trusted: &[Cidr],
    buf: &[u8],
    headers: &[HeaderSpan],
) -> Option<IpAddr> {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return None;
    }
    let mut last = peer;
    let lines = headers
        .iter()
        .rev()
        .filter(|h| h.kind == HeaderKind::XForwardedFor);
    for h in lines {
        for entry in buf[h.value.clone()].rsplit(|b| *b == b',').map(trim) {
            if entry.is_empty() {
                continue;
            }
            let Some(ip) = parse_entry(entry) else {
                return Some(last).filter(|ip| *ip != peer);
            };
            if !is_trusted(ip) {
                return Some(ip);
            }
            last = ip;
        }
    }
    Some(last).filter(|ip| *ip != peer)
}

/// An `X-Forwarded-For` entry: an address, `v4:port`, `[v6]` or `[v6]:port`; an
/// IPv4-mapped IPv6 address in its IPv4 form, as the peer's is, so that every consumer
/// (rate-limit keys, access lists, `X-Real-IP`, logs) sees one client in one spelling.
fn parse_entry(entry: &[u8]) -> Option<IpAddr> {
    parse_address(entry).map(|ip| ip.to_canonical())
}

fn parse_address(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry).ok()?;
    if let Ok(ip) = text.parse() {
        return Some(ip);
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        return (after.is_empty() || after.starts_with(':'))
            .then(|| v6.parse().ok())
            .flatten();
    }
    let (v4, port) = text.split_once(':')?;
    port.parse::<u16>().ok()?;
    v4.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::http1::{parse_request, HeadLimits, RequestHead};

    fn cidr(text: &str) -> Cidr {
        let (ip, bits) = text.split_once('/').unwrap();
        Cidr {
            addr: ip.parse().unwrap(),
            prefix: bits.parse().unwrap(),
        }
    }

    fn client(peer: &str, xff: &[&str]) -> Option<IpAddr> {
        let mut raw = String::from("GET / HTTP/1.1\r\nHost: a\r\n");
        for v in xff {
            raw.push_str(&format!("X-Forwarded-For: {v}\r\n"));
        }
        raw.push_str("\r\n");
        let mut head = RequestHead::default();
        let limits = HeadLimits {
            max_header_size: 8192,
            max_headers: 100,
        };
        assert!(parse_request(raw.as_bytes(), limits, &mut head).unwrap());
        let trusted = [cidr("10.0.0.0/8"), cidr("fd00::/8")];
        client_behind(
            peer.parse().unwrap(),
            &trusted,
            raw.as_bytes(),
            &head.headers,
        )
    }

    fn ip(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    #[test]
    fn rightmost_untrusted_entry_is_the_client() {
        assert_eq!(client("10.0.0.1", &["203.0.113.9"]), ip("203.0.113.9"));
        // The client's own (forged) entries stay to the left of the one the proxy added.
        assert_eq!(
            client("10.0.0.1", &["1.1.1.1, 203.0.113.9, 10.0.0.2"]),
            ip("203.0.113.9")
        );
        assert_eq!(
            client("10.0.0.1", &["1.1.1.1", "203.0.113.9:4711", "10.1.1.1"]),
            ip("203.0.113.9")
        );
        assert_eq!(client("fd00::1", &["[2001:db8::7]:443"]), ip("2001:db8::7"));
        assert_eq!(client("10.0.0.1", &["2001:db8::8"]), ip("2001:db8::8"));
        // One client, one spelling: the rate limiter's key, access lists and logs agree.
        for mapped in ["::ffff:198.51.100.7", "[::ffff:198.51.100.7]:80"] {
            assert_eq!(
                client("10.0.0.1", &[mapped]),
                ip("198.51.100.7"),
                "{mapped}"
            );
        }
        // A mapped trusted proxy is skipped as its IPv4 form is.
        assert_eq!(
            client("10.0.0.1", &["203.0.113.9, ::ffff:10.0.0.2"]),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn untrusted_peer_or_nothing_usable_keeps_the_peer() {
        assert_eq!(client("192.0.2.1", &["203.0.113.9"]), None);
        assert_eq!(client("10.0.0.1", &[]), None);
        assert_eq!(client("10.0.0.1", &["garbage"]), None);
        // Garbage left of a trusted hop: the last address read.
        assert_eq!(client("10.0.0.1", &["nope, 10.0.0.9"]), ip("10.0.0.9"));
        // Only trusted addresses: the leftmost.
        assert_eq!(client("10.0.0.1", &["10.0.0.3, 10.0.0.2"]), ip("10.0.0.3"));
    }
}
