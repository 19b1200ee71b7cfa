//! Parsing a PROXY header (v1 text or v2 binary) at the start of a buffer.
//!
//! The parser is incremental in the simplest way: it is called on everything received so
//! far and answers `Incomplete` until the header is whole, so it can be fed any split of the
//! input. It never allocates and never reads past the header's end; the caller consumes
//! `len` bytes and keeps the rest (the start of the client's stream).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::{Addresses, V1_MAX, V2_SIGNATURE};

const V1_PREFIX: &[u8] = b"PROXY ";

/// What the start of a buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// Possibly a header, not complete yet.
    Incomplete,
    /// A whole header of `len` bytes. `addresses` is `None` for a v2 LOCAL command (health
    /// checks of the proxy itself), v1 `UNKNOWN` and address families Weir does not use
    /// (AF_UNIX, UNSPEC): the connection's own addresses apply.
    Header {
        len: usize,
        addresses: Option<Addresses>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProxyHeaderError {
    #[error("the connection does not start with a PROXY header")]
    Missing,
    #[error("malformed PROXY header: {0}")]
    Malformed(&'static str),
}

use ProxyHeaderError::Malformed;

/// Parses the header at the start of `buf`.
pub fn parse(buf: &[u8]) -> Result<Parsed, ProxyHeaderError> {
    if starts_like(buf, V1_PREFIX) {
        if buf.len() < V1_PREFIX.len() {
            return Ok(Parsed::Incomplete);
        }
        return parse_v1(buf);
    }
    if starts_like(buf, &V2_SIGNATURE) {
        return parse_v2(buf);
    }
    Err(ProxyHeaderError::Missing)
}

/// Whether `buf` and `prefix` agree on their common length.
fn starts_like(buf: &[u8], prefix: &[u8]) -> bool {
    let n = buf.len().min(prefix.len());
    buf[..n] == prefix[..n]
}

// ---------------------------------------------------------------- v1

fn parse_v1(buf: &[u8]) -> Result<Parsed, ProxyHeaderError> {
    let window = &buf[..buf.len().min(V1_MAX)];
    let Some(cr) = window.iter().position(|&b| b == b'\r' || b == b'\n') else {
        return if buf.len() >= V1_MAX {
            Err(Malformed("v1 line longer than 107 bytes"))
        } else {
            Ok(Parsed::Incomplete)
        };
    };
    if buf[cr] == b'\n' {
        return Err(Malformed("v1 line must end with CRLF"));
    }
    match buf.get(cr + 1) {
        None => return Ok(Parsed::Incomplete),
        Some(b'\n') => {}
        Some(_) => return Err(Malformed("v1 line must end with CRLF")),
    }
    let line = &buf[V1_PREFIX.len()..cr];
    let addresses = v1_fields(line)?;
    Ok(Parsed::Header {
        len: cr + 2,
        addresses,
    })
}

/// The fields after `PROXY `: `TCP4|TCP6 src dst sport dport`, or `UNKNOWN ...`.
fn v1_fields(line: &[u8]) -> Result<Option<Addresses>, ProxyHeaderError> {
    if line == b"UNKNOWN" || line.starts_with(b"UNKNOWN ") {
        return Ok(None);
    }
    let mut fields = line.split(|&b| b == b' ');
    let family = fields.next().unwrap_or_default();
    let mut next = || fields.next().ok_or(Malformed("v1 line has too few fields"));
    let (src, dst, sport, dport) = (next()?, next()?, next()?, next()?);
    if fields.next().is_some() {
        return Err(Malformed("v1 line has too many fields"));
    }
    let (source, destination) = match family {
        b"TCP4" => (
            IpAddr::V4(text::<Ipv4Addr>(src)?),
            IpAddr::V4(text::<Ipv4Addr>(dst)?),
        ),
        b"TCP6" => (
            IpAddr::V6(text::<Ipv6Addr>(src)?),
            IpAddr::V6(text::<Ipv6Addr>(dst)?),
        ),
        _ => return Err(Malformed("v1 protocol must be TCP4, TCP6 or UNKNOWN")),
    };
    Ok(Some(Addresses {
        source: SocketAddr::new(source, port(sport)?),
        destination: SocketAddr::new(destination, port(dport)?),
    }))
}

fn text<T: std::str::FromStr>(field: &[u8]) -> Result<T, ProxyHeaderError> {
    std::str::from_utf8(field)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(Malformed("v1 address is not valid for its family"))
}

/// A decimal port without sign or leading zeros.
fn port(field: &[u8]) -> Result<u16, ProxyHeaderError> {
    let canonical = field.len() == 1 || field.first() != Some(&b'0');
    let digits = !field.is_empty() && field.iter().all(u8::is_ascii_digit);
    if !(canonical && digits) {
        return Err(Malformed("v1 port is not a decimal number"));
    }
    text::<u16>(field).map_err(|_| Malformed("v1 port is out of range"))
}

// ---------------------------------------------------------------- v2

fn parse_v2(buf: &[u8]) -> Result<Parsed, ProxyHeaderError> {
    if buf.len() < 16 {
        return Ok(Parsed::Incomplete);
    }
    let (version, command) = (buf[12] >> 4, buf[12] & 0x0F);
    if version != 2 {
        return Err(Malformed("v2 version nibble is not 2"));
    }
    let len = 16 + usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if buf.len() < len {
        return Ok(Parsed::Incomplete);
    }
    let body = &buf[16..len];
    let addresses = match command {
        0x0 => None,
        0x1 => v2_addresses(buf[13], body)?,
        _ => return Err(Malformed("v2 command is neither LOCAL nor PROXY")),
    };
    Ok(Parsed::Header { len, addresses })
}

/// The addresses of a PROXY command; `None` for families Weir does not forward.
fn v2_addresses(family: u8, body: &[u8]) -> Result<Option<Addresses>, ProxyHeaderError> {
    let short = Malformed("v2 address block is shorter than its family needs");
    let at = |i: usize| u16::from_be_bytes([body[i], body[i + 1]]);
    match family {
        // AF_INET / AF_INET6 over STREAM or DGRAM (a TCP listener only sees STREAM).
        0x11 | 0x12 => {
            if body.len() < 12 {
                return Err(short);
            }
            let ip = |i: usize| IpAddr::from([body[i], body[i + 1], body[i + 2], body[i + 3]]);
            Ok(Some(Addresses {
                source: SocketAddr::new(ip(0), at(8)),
                destination: SocketAddr::new(ip(4), at(10)),
            }))
        }
        0x21 | 0x22 => {
            if body.len() < 36 {
                return Err(short);
            }
            let ip = |i: usize| {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&body[i..i + 16]);
                IpAddr::from(octets)
            };
            Ok(Some(Addresses {
                source: SocketAddr::new(ip(0), at(32)),
                destination: SocketAddr::new(ip(16), at(34)),
            }))
        }
        // UNSPEC and AF_UNIX: accepted, the connection's own addresses apply.
        0x00 | 0x31 | 0x32 => Ok(None),
        _ => Err(Malformed("v2 address family or transport is unknown")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(buf: &[u8]) -> Result<Parsed, ProxyHeaderError> {
        parse(buf)
    }

    /// Every strict prefix of `input[..len]` is `Incomplete`, the whole gives `want`,
    /// and bytes after the header are not part of it.
    #[track_caller]
    fn split_everywhere(input: &[u8], want: Option<Addresses>) {
        let len = match parse(input) {
            Ok(Parsed::Header { len, .. }) => len,
            other => panic!("{other:?}"),
        };
        for cut in 0..len {
            assert_eq!(parse(&input[..cut]), Ok(Parsed::Incomplete), "cut {cut}");
        }
        let mut with_payload = input[..len].to_vec();
        with_payload.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(
            parse(&with_payload),
            Ok(Parsed::Header {
                len,
                addresses: want
            })
        );
    }

    fn a(source: &str, destination: &str) -> Option<Addresses> {
        Some(Addresses {
            source: source.parse().unwrap(),
            destination: destination.parse().unwrap(),
        })
    }

    #[test]
    fn v1_at_every_split() {
        split_everywhere(
            b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n",
            a("192.168.0.1:56324", "192.168.0.11:443"),
        );
        split_everywhere(
            b"PROXY TCP6 2001:db8::1 ::1 1 65535\r\n",
            a("[2001:db8::1]:1", "[::1]:65535"),
        );
        split_everywhere(b"PROXY UNKNOWN\r\n", None);
        split_everywhere(b"PROXY UNKNOWN ffff::1 ::1 3 4\r\n", None);
    }

    #[test]
    fn v2_at_every_split() {
        let mut v4 = V2_SIGNATURE.to_vec();
        v4.extend_from_slice(&[
            0x21, 0x11, 0x00, 0x0C, 10, 0, 0, 1, 10, 0, 0, 2, 0, 80, 1, 0,
        ]);
        split_everywhere(&v4, a("10.0.0.1:80", "10.0.0.2:256"));
        // With a TLV after the addresses (length covers it): skipped.
        let mut tlv = V2_SIGNATURE.to_vec();
        tlv.extend_from_slice(&[0x21, 0x11, 0x00, 0x10, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 0, 2]);
        tlv.extend_from_slice(&[0x04, 0x00, 0x01, 0xAA]);
        split_everywhere(&tlv, a("1.2.3.4:1", "5.6.7.8:2"));
        let mut v6 = V2_SIGNATURE.to_vec();
        v6.extend_from_slice(&[0x21, 0x21, 0x00, 0x24]);
        v6.extend_from_slice(&[0; 15]);
        v6.push(1);
        v6.extend_from_slice(&[0; 15]);
        v6.push(2);
        v6.extend_from_slice(&[0, 7, 0, 8]);
        split_everywhere(&v6, a("[::1]:7", "[::2]:8"));
        let mut local = V2_SIGNATURE.to_vec();
        local.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]);
        split_everywhere(&local, None);
        let mut unix = V2_SIGNATURE.to_vec();
        unix.extend_from_slice(&[0x21, 0x31, 0x00, 0xD8]);
        unix.extend_from_slice(&[b'/'; 216]);
        split_everywhere(&unix, None);
    }

    #[test]
    fn rejects_malformed_headers() {
        let bad: &[&[u8]] = &[
            b"GET / HTTP/1.1\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
            b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n",
            b"PROXY TCP4 ::1 ::1 1 2\r\n",
            b"PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n",
            b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
            b"PROXY TCP4 1.2.3.256 5.6.7.8 1 2\r\n",
            b"proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n",
        ];
        for input in bad {
            assert!(
                header(input).is_err(),
                "{:?} accepted",
                String::from_utf8_lossy(input)
            );
        }
        let long = [b"PROXY ".as_slice(), &[b'1'; 120]].concat();
        assert!(header(&long).is_err(), "no CRLF within 107 bytes");
        let v2 = |ver_cmd: u8, fam: u8, len: u8| {
            let mut b = V2_SIGNATURE.to_vec();
            b.extend_from_slice(&[ver_cmd, fam, 0, len]);
            b.extend_from_slice(&vec![0; usize::from(len)]);
            b
        };
        assert!(header(&v2(0x11, 0x11, 12)).is_err(), "version 1 nibble");
        assert!(header(&v2(0x22, 0x11, 12)).is_err(), "command 2");
        assert!(header(&v2(0x21, 0x11, 11)).is_err(), "short v4 block");
        assert!(header(&v2(0x21, 0x21, 35)).is_err(), "short v6 block");
        assert!(header(&v2(0x21, 0x41, 12)).is_err(), "family 4");
        assert!(header(&v2(0x21, 0x13, 12)).is_err(), "transport 3");
        let mut not_sig = V2_SIGNATURE.to_vec();
        not_sig[11] = 0;
        assert_eq!(header(&not_sig), Err(ProxyHeaderError::Missing));
    }
}
