//! Encoding the PROXY header sent to an upstream server. The header lives on the stack:
//! no allocation per connection.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};

use weir_config::ProxyVersion;

use super::{Addresses, V1_MAX, V2_SIGNATURE};

/// An encoded header: `bytes[..len]`.
pub struct Header {
    bytes: [u8; V1_MAX],
    len: usize,
}

impl Header {
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The header for `addresses`; `None` for [`ProxyVersion::Off`]. When the two addresses
/// are of different families the IPv4 one is written in its IPv4-mapped IPv6 form (both
/// versions need one family).
pub fn encode(version: ProxyVersion, addresses: Addresses) -> Option<Header> {
    let (source, destination) = same_family(addresses.source, addresses.destination);
    let mut header = Header {
        bytes: [0; V1_MAX],
        len: 0,
    };
    match version {
        ProxyVersion::Off => return None,
        ProxyVersion::V1 => {
            let family = if source.is_ipv4() { "TCP4" } else { "TCP6" };
            let mut cursor = std::io::Cursor::new(&mut header.bytes[..]);
            // 107 bytes hold the longest v1 line (two full IPv6 addresses and ports).
            let _ = write!(
                cursor,
                "PROXY {family} {} {} {} {}\r\n",
                source.ip(),
                destination.ip(),
                source.port(),
                destination.port()
            );
            header.len = cursor.position() as usize;
        }
        ProxyVersion::V2 => header.len = encode_v2(&mut header.bytes, source, destination),
    }
    Some(header)
}

/// Writes a v2 PROXY command over TCP; returns its length (28 for IPv4, 52 for IPv6).
fn encode_v2(out: &mut [u8; V1_MAX], source: SocketAddr, destination: SocketAddr) -> usize {
    out[..12].copy_from_slice(&V2_SIGNATURE);
    out[12] = 0x21; // version 2, command PROXY
    let body = match (source.ip(), destination.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            out[13] = 0x11; // AF_INET, STREAM
            out[16..20].copy_from_slice(&s.octets());
            out[20..24].copy_from_slice(&d.octets());
            12
        }
        (s, d) => {
            out[13] = 0x21; // AF_INET6, STREAM
            out[16..32].copy_from_slice(&v6(s).octets());
            out[32..48].copy_from_slice(&v6(d).octets());
            36
        }
    };
    let ports = 16 + body - 4;
    out[ports..ports + 2].copy_from_slice(&source.port().to_be_bytes());
    out[ports + 2..ports + 4].copy_from_slice(&destination.port().to_be_bytes());
    out[14..16].copy_from_slice(&(body as u16).to_be_bytes());
    16 + body
}

fn v6(ip: IpAddr) -> std::net::Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

fn same_family(a: SocketAddr, b: SocketAddr) -> (SocketAddr, SocketAddr) {
    if a.is_ipv4() == b.is_ipv4() {
        return (a, b);
    }
    let map = |s: SocketAddr| SocketAddr::new(IpAddr::V6(v6(s.ip())), s.port());
    (map(a), map(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(source: &str, destination: &str) -> Addresses {
        Addresses {
            source: source.parse().unwrap(),
            destination: destination.parse().unwrap(),
        }
    }

    fn bytes(version: ProxyVersion, a: Addresses) -> Vec<u8> {
        encode(version, a).expect("on").as_bytes().to_vec()
    }

    /// The v1 examples of the spec (sections 2.1 and 2.2), byte for byte.
    #[test]
    fn v1_matches_the_spec_examples() {
        let a = addrs("192.168.0.1:56324", "192.168.0.11:443");
        assert_eq!(
            bytes(ProxyVersion::V1, a),
            b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n"
        );
        let worst4 = addrs("255.255.255.255:65535", "255.255.255.255:65535");
        assert_eq!(
            bytes(ProxyVersion::V1, worst4),
            b"PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n"
        );
        let f = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535";
        let worst6 = bytes(ProxyVersion::V1, addrs(f, f));
        assert_eq!(
            worst6,
            &b"PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff \
               ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n"[..]
        );
        assert_eq!(
            worst6.len(),
            V1_MAX - 3,
            "the spec's 104-byte TCP6 worst case"
        );
        assert!(encode(ProxyVersion::Off, a).is_none());
    }

    /// v2 laid out by hand from spec section 2.2: signature, 0x21, family, length, addresses.
    #[test]
    fn v2_matches_the_spec_layout() {
        let a = addrs("192.168.0.1:56324", "192.168.0.11:443");
        let mut want = V2_SIGNATURE.to_vec();
        want.extend_from_slice(&[0x21, 0x11, 0x00, 0x0C]);
        want.extend_from_slice(&[192, 168, 0, 1, 192, 168, 0, 11]);
        want.extend_from_slice(&[0xDC, 0x04, 0x01, 0xBB]); // 56324, 443
        assert_eq!(bytes(ProxyVersion::V2, a), want);

        let b = addrs("[2001:db8::1]:1234", "[::1]:80");
        let mut want = V2_SIGNATURE.to_vec();
        want.extend_from_slice(&[0x21, 0x21, 0x00, 0x24]);
        want.extend_from_slice(&[0x20, 0x01, 0x0D, 0xB8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        want.extend_from_slice(&[0x04, 0xD2, 0x00, 0x50]);
        assert_eq!(bytes(ProxyVersion::V2, b), want);
    }

    #[test]
    fn mixed_families_use_mapped_v6() {
        let a = addrs("10.0.0.1:5", "[::1]:80");
        assert_eq!(
            bytes(ProxyVersion::V1, a),
            b"PROXY TCP6 ::ffff:10.0.0.1 ::1 5 80\r\n"
        );
        assert_eq!(bytes(ProxyVersion::V2, a)[13], 0x21);
    }

    #[test]
    fn encoded_headers_parse_back() {
        for a in [
            addrs("1.2.3.4:1", "5.6.7.8:65535"),
            addrs("[fe80::1]:9", "[2001:db8::2]:10"),
        ] {
            for v in [ProxyVersion::V1, ProxyVersion::V2] {
                let b = bytes(v, a);
                let parsed = super::super::parse(&b).expect("valid");
                assert_eq!(
                    parsed,
                    super::super::Parsed::Header {
                        len: b.len(),
                        addresses: Some(a)
                    }
                );
            }
        }
    }
}
