//! SNI routing on TCP listeners (`sni_routes`), without terminating TLS: the client's first
//! bytes are read until the ClientHello is whole (`codec::tls_client_hello`), its server
//! name picks the upstream, and the bytes read are sent to that upstream first.
//!
//! Bounded: at most the connection's buffer (`buffer_size`) is read, for at most
//! `preread_timeout`. A client with no SNI, an unknown name, a server name that is not a
//! host name (`example.com:443`: ignored, as nginx and HAProxy do), a ClientHello larger
//! than the buffer, or bytes that are not TLS at all goes to the listener's `upstream` (the
//! fallback, like HAProxy's `default_backend`); a client that sends no complete ClientHello
//! in time, or closes, is closed. Every outcome is counted in `weir_tcp_sni_total`.

use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use weir_config::{HostPattern, SniRoute, TcpSettings};

use crate::buffer::Buffer;
use crate::codec::tls_client_hello::{ClientHello, HelloError, HelloReader, Parsed};
use crate::router::host_matches;
use crate::tcp::io::read_some;

/// How a connection's SNI step ended; the label of `weir_tcp_sni_total{result}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SniResult {
    /// The server name matched an SNI route.
    Matched,
    /// A ClientHello without a server name (fallback).
    NoSni,
    /// A server name no route has (fallback).
    UnknownSni,
    /// A server name that is not a host name, such as `example.com:443` or `[::1]`
    /// (fallback, as without SNI).
    BadSni,
    /// The first bytes were not a TLS handshake (fallback).
    NotTls,
    /// A TLS record that is not a well-formed ClientHello (fallback).
    Malformed,
    /// The ClientHello did not fit the buffer (fallback).
    TooLarge,
    /// No complete ClientHello within `preread_timeout` (closed).
    Timeout,
    /// The client closed or failed before a complete ClientHello (closed).
    Closed,
}

impl SniResult {
    pub const ALL: [SniResult; 9] = [
        SniResult::Matched,
        SniResult::NoSni,
        SniResult::UnknownSni,
        SniResult::BadSni,
        SniResult::NotTls,
        SniResult::Malformed,
        SniResult::TooLarge,
        SniResult::Timeout,
        SniResult::Closed,
    ];

    pub fn label(self) -> &'static str {
        match self {
            SniResult::Matched => "matched",
            SniResult::NoSni => "no_sni",
            SniResult::UnknownSni => "unknown_sni",
            SniResult::BadSni => "bad_sni",
            SniResult::NotTls => "not_tls",
            SniResult::Malformed => "malformed",
            SniResult::TooLarge => "too_large",
            SniResult::Timeout => "timeout",
            SniResult::Closed => "closed",
        }
    }
}

/// Reads the ClientHello into `buf` (after what is there already) and chooses the
/// upstream: `(Some(index), result)`, or `(None, result)` when the connection must close.
pub async fn choose_upstream(
    stream: &TcpStream,
    tcp: &TcpSettings,
    buf: &mut Buffer,
) -> (Option<usize>, SniResult) {
    let result = read_hello(stream, buf, tcp.preread_timeout).await;
    let name = result
        .as_ref()
        .map(|h| (h.sni().map(HostName::new), h.bad_sni()))
        .map_err(|r| *r);
    match name {
        Ok((Some(name), _)) => match route(&tcp.sni_routes, name.as_bytes()) {
            Some(upstream) => (Some(upstream), SniResult::Matched),
            None => (Some(tcp.upstream), SniResult::UnknownSni),
        },
        Ok((None, true)) => (Some(tcp.upstream), SniResult::BadSni),
        Ok((None, false)) => (Some(tcp.upstream), SniResult::NoSni),
        Err(r @ (SniResult::Timeout | SniResult::Closed)) => (None, r),
        Err(r) => (Some(tcp.upstream), r),
    }
}

/// The ClientHello at the start of `buf`, reading as needed.
async fn read_hello(
    stream: &TcpStream,
    buf: &mut Buffer,
    timeout: Duration,
) -> Result<ClientHello, SniResult> {
    let deadline = Instant::now() + timeout;
    // Records already read are not parsed again when more arrive.
    let mut reader = HelloReader::default();
    loop {
        match reader.read(buf.filled()) {
            Ok(Parsed::Hello(hello)) => return Ok(hello),
            Err(HelloError::NotTls) => return Err(SniResult::NotTls),
            Err(HelloError::Malformed) => return Err(SniResult::Malformed),
            Ok(Parsed::Incomplete) if buf.spare_mut().is_empty() => {
                return Err(SniResult::TooLarge)
            }
            Ok(Parsed::Incomplete) => {}
        }
        match timeout_at(deadline, read_some(stream, buf)).await {
            Err(_) => return Err(SniResult::Timeout),
            Ok(Ok(0) | Err(_)) => return Err(SniResult::Closed),
            Ok(Ok(_)) => {}
        }
    }
}

/// A server name without its trailing dot (`a.example.com.` is `a.example.com`).
struct HostName<'a>(&'a [u8]);

impl<'a> HostName<'a> {
    fn new(name: &'a [u8]) -> HostName<'a> {
        HostName(name.strip_suffix(b".").unwrap_or(name))
    }

    fn as_bytes(&self) -> &'a [u8] {
        self.0
    }
}

/// The upstream of the SNI route for `name`: an exact name beats any wildcard, and a
/// longer `*.suffix` beats a shorter one (`*.b.example.com` over `*.example.com`).
pub fn route(routes: &[SniRoute], name: &[u8]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for route in routes {
        for pattern in &route.hosts {
            if !host_matches(pattern, name) {
                continue;
            }
            let rank = match pattern {
                HostPattern::Exact(_) => usize::MAX,
                HostPattern::Suffix(s) => s.len(),
                HostPattern::Any => 0,
            };
            if best.is_none_or(|(r, _)| rank > r) {
                best = Some((rank, route.upstream));
            }
        }
    }
    best.map(|(_, upstream)| upstream)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes() -> Vec<SniRoute> {
        let exact = |h: &str| HostPattern::Exact(h.into());
        let suffix = |h: &str| HostPattern::Suffix(h.into());
        vec![
            SniRoute {
                hosts: vec![suffix(".example.com")],
                upstream: 1,
            },
            SniRoute {
                hosts: vec![exact("a.example.com"), suffix(".b.example.com")],
                upstream: 2,
            },
        ]
    }

    #[test]
    fn exact_beats_wildcard_and_longer_suffix_beats_shorter() {
        let r = routes();
        assert_eq!(route(&r, b"a.example.com"), Some(2));
        assert_eq!(route(&r, b"A.EXAMPLE.COM"), Some(2));
        assert_eq!(route(&r, b"x.b.example.com"), Some(2));
        assert_eq!(route(&r, b"c.example.com"), Some(1));
        assert_eq!(route(&r, b"example.com"), None);
        assert_eq!(route(&r, b"other.org"), None);
    }

    #[test]
    fn a_trailing_dot_is_the_same_name() {
        assert_eq!(
            HostName::new(b"a.example.com.").as_bytes(),
            b"a.example.com"
        );
        assert_eq!(HostName::new(b"a.example.com").as_bytes(), b"a.example.com");
    }
}
