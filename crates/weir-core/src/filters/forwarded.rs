//! Forwarded headers as nginx users set them: `X-Real-IP`, `X-Forwarded-For` (appended),
//! `X-Forwarded-Proto` and `X-Forwarded-Host`.

use std::io::Write;
use std::net::IpAddr;

use crate::codec::http1::write::push_header;

/// The client address rendered once per connection, so requests reuse the bytes.
#[derive(Debug, Clone, Copy)]
pub struct ClientIp {
    text: [u8; 46],
    len: u8,
}

impl ClientIp {
    pub fn new(ip: IpAddr) -> ClientIp {
        let mut text = [0u8; 46];
        let IpAddr::V4(v4) = ip else {
            let mut cursor = std::io::Cursor::new(&mut text[..]);
            // 46 bytes hold the longest IPv6 text form; a failure would only shorten it.
            let _ = write!(cursor, "{ip}");
            let len = cursor.position() as u8;
            return ClientIp { text, len };
        };
        // Every new connection renders its address: by hand, an IPv4 address costs a few
        // dozen instructions, where `fmt` took about a thousand.
        let mut len = 0;
        for (i, octet) in v4.octets().into_iter().enumerate() {
            if i > 0 {
                text[len] = b'.';
                len += 1;
            }
            let digits = [octet / 100, octet / 10 % 10, octet % 10];
            let skip = if octet >= 100 {
                0
            } else if octet >= 10 {
                1
            } else {
                2
            };
            for d in &digits[skip..] {
                text[len] = b'0' + d;
                len += 1;
            }
        }
        ClientIp {
            text,
            len: len as u8,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.text[..usize::from(self.len)]
    }
}

/// Appends the four forwarded headers. `prior_xff` are the values of the client's own
/// `X-Forwarded-For` headers, in order; the peer address is appended to them. `client` is
/// the client (`X-Real-IP`): the peer, or the address behind trusted proxies. `https`: the
/// request came over TLS (`X-Forwarded-Proto: https`).
pub fn push_forwarded<'a>(
    out: &mut Vec<u8>,
    client: &ClientIp,
    peer: &ClientIp,
    host: Option<&[u8]>,
    prior_xff: impl Iterator<Item = &'a [u8]>,
    https: bool,
) {
    // The fixed text between the values goes out in as few pieces as it can: each piece
    // is a bounds check and a copy.
    out.extend_from_slice(b"X-Real-IP: ");
    out.extend_from_slice(client.as_bytes());
    out.extend_from_slice(b"\r\nX-Forwarded-For: ");
    for value in prior_xff {
        out.extend_from_slice(value);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(peer.as_bytes());
    let proto: &[u8] = if https {
        b"\r\nX-Forwarded-Proto: https\r\n"
    } else {
        b"\r\nX-Forwarded-Proto: http\r\n"
    };
    out.extend_from_slice(proto);
    if let Some(host) = host {
        push_header(out, b"X-Forwarded-Host", host);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_to_prior_chain() {
        let ip = ClientIp::new("10.0.0.7".parse().unwrap());
        let mut out = Vec::new();
        push_forwarded(
            &mut out,
            &ip,
            &ip,
            Some(b"example.com"),
            [&b"1.1.1.1"[..], b"2.2.2.2"].into_iter(),
            false,
        );
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "X-Real-IP: 10.0.0.7\r\nX-Forwarded-For: 1.1.1.1, 2.2.2.2, 10.0.0.7\r\n\
             X-Forwarded-Proto: http\r\nX-Forwarded-Host: example.com\r\n"
        );
    }

    #[test]
    fn proto_is_https_over_tls() {
        let ip = ClientIp::new("10.0.0.7".parse().unwrap());
        let mut out = Vec::new();
        push_forwarded(&mut out, &ip, &ip, None, std::iter::empty(), true);
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with("X-Forwarded-Proto: https\r\n"), "{text}");
    }

    #[test]
    fn renders_v6() {
        let ip = ClientIp::new("::1".parse().unwrap());
        assert_eq!(ip.as_bytes(), b"::1");
        let long: IpAddr = "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255"
            .parse()
            .unwrap();
        assert_eq!(ClientIp::new(long).as_bytes(), long.to_string().as_bytes());
    }

    #[test]
    fn renders_v4_as_display_does() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.30.40",
            "255.255.255.255",
            "1.99.100.9",
            "192.168.0.255",
        ] {
            let addr: IpAddr = ip.parse().unwrap();
            assert_eq!(ClientIp::new(addr).as_bytes(), ip.as_bytes());
        }
    }
}
