//! One health check of one server: a TCP connect, an HTTP `GET` whose status line is
//! checked, or a gRPC health call (`grpc`). The whole check, connect included, must finish within `timeout`. An error is
//! the reason, for the transition log line.

use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use weir_config::{HealthCheck, HealthCheckKind, StatusRange, UpstreamServer};

use crate::connector::{TlsUpstream, UpstreamStream};

/// Bytes read at most while looking for the status line.
const MAX_STATUS_LINE: usize = 1024;

/// Runs one check of `addr`; `host` is the `Host` header of an HTTP check. With `tls`
/// (the upstream's TLS client and the server) the check goes over TLS, and a failed
/// handshake fails it. `http2`: the upstream speaks HTTP/2 only (`h2`, `h2c`), so an
/// HTTP check is an HTTP/2 request, as a gRPC check always is.
pub async fn probe(
    check: &HealthCheck,
    addr: SocketAddr,
    host: &str,
    tls: Option<(&TlsUpstream, &UpstreamServer)>,
    http2: bool,
) -> Result<(), String> {
    let deadline = Instant::now() + check.timeout;
    let timed_out = || format!("no answer within {:?}", check.timeout);
    let tcp = match timeout_at(deadline, TcpStream::connect(addr)).await {
        Err(_) => return Err(timed_out()),
        Ok(Err(e)) => return Err(format!("connect: {e}")),
        Ok(Ok(s)) => s,
    };
    let http2 = http2 || matches!(check.kind, HealthCheckKind::Grpc { .. });
    let mut stream = match tls {
        None => UpstreamStream::Plain(tcp),
        // HTTP/2 over TLS: through ALPN h2, which the server must choose.
        Some((client, server)) if http2 => {
            let (stream, h2) = client
                .handshake_h2(server, tcp, deadline)
                .await
                .map_err(|e| format!("TLS: {e}"))?;
            if !h2 {
                return Err("TLS: the server did not agree to ALPN h2".into());
            }
            stream
        }
        Some((client, server)) => client
            .handshake(server, tcp, deadline)
            .await
            .map_err(|e| format!("TLS: {e}"))?,
    };
    let (path, expect_status) = match &check.kind {
        HealthCheckKind::Tcp => return Ok(()),
        HealthCheckKind::Grpc { service } => {
            let scheme = if tls.is_some() { "https" } else { "http" };
            let call = super::grpc::check(stream, scheme, host, service);
            return timeout_at(deadline, call)
                .await
                .unwrap_or_else(|_| Err(timed_out()));
        }
        HealthCheckKind::Http {
            path,
            expect_status,
        } => (path, expect_status),
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let asked = async move {
        if http2 {
            let uri = format!("{scheme}://{host}{path}");
            return super::grpc::over_h2(stream, |client| h2_get(client, uri)).await;
        }
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: weir-health-check\r\n\
             Connection: close\r\n\r\n"
        );
        exchange(&mut stream, request.as_bytes()).await
    };
    match timeout_at(deadline, asked).await {
        Err(_) => Err(timed_out()),
        Ok(Err(e)) => Err(e),
        Ok(Ok(status)) if expected(expect_status, status) => Ok(()),
        Ok(Ok(status)) => Err(format!("status {status} not in {}", ranges(expect_status))),
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    request: &[u8],
) -> Result<u16, String> {
    stream
        .write_all(request)
        .await
        .map_err(|e| format!("write: {e}"))?;
    // TLS: make sure the request's records have left.
    stream.flush().await.map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    loop {
        if let Some(end) = buf.windows(2).position(|w| w == b"\r\n") {
            return status_of(&buf[..end]);
        }
        if buf.len() > MAX_STATUS_LINE {
            return Err("status line too long".into());
        }
        match stream.read(&mut chunk).await {
            Ok(0) => return Err("closed before a status line".into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
}

/// The status of `GET uri` over HTTP/2 (`client`); the body is not read.
async fn h2_get(client: h2::client::SendRequest<bytes::Bytes>, uri: String) -> Result<u16, String> {
    let h2_error = |e: h2::Error| format!("HTTP/2: {e}");
    let request = http::Request::get(uri)
        .header("user-agent", "weir-health-check")
        .body(())
        .map_err(|e| format!("request: {e}"))?;
    let mut client = client.ready().await.map_err(h2_error)?;
    let (response, _) = client.send_request(request, true).map_err(h2_error)?;
    let head = response.await.map_err(h2_error)?;
    Ok(head.status().as_u16())
}

/// The status code of an `HTTP/1.x NNN reason` line.
pub fn status_of(line: &[u8]) -> Result<u16, String> {
    let malformed = || {
        format!(
            "malformed status line {:?}",
            String::from_utf8_lossy(&line[..line.len().min(64)])
        )
    };
    let rest = line
        .strip_prefix(b"HTTP/1.")
        .filter(|r| r.len() >= 5 && r[1] == b' ')
        .ok_or_else(malformed)?;
    let code = &rest[2..5];
    if !code.iter().all(u8::is_ascii_digit) || rest.get(5).is_some_and(|&b| b != b' ') {
        return Err(malformed());
    }
    std::str::from_utf8(code)
        .ok()
        .and_then(|c| c.parse().ok())
        .ok_or_else(malformed)
}

fn expected(ranges: &[StatusRange], status: u16) -> bool {
    ranges.iter().any(|r| r.contains(status))
}

fn ranges(ranges: &[StatusRange]) -> String {
    let parts: Vec<String> = ranges
        .iter()
        .map(|r| {
            if r.first == r.last {
                r.first.to_string()
            } else {
                format!("{}-{}", r.first, r.last)
            }
        })
        .collect();
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::net::TcpListener;

    #[test]
    fn status_lines() {
        assert_eq!(status_of(b"HTTP/1.1 200 OK"), Ok(200));
        assert_eq!(status_of(b"HTTP/1.0 503"), Ok(503));
        assert!(status_of(b"HTTP/2 200").is_err());
        assert!(status_of(b"HTTP/1.1 20").is_err());
        assert!(status_of(b"HTTP/1.1 2000 x").is_err());
        assert!(status_of(b"garbage").is_err());
    }

    fn http(expect: &[(u16, u16)]) -> HealthCheck {
        HealthCheck {
            kind: HealthCheckKind::Http {
                path: "/healthz".into(),
                expect_status: expect
                    .iter()
                    .map(|&(first, last)| StatusRange { first, last })
                    .collect(),
            },
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(2),
            rise: 1,
            fall: 1,
        }
    }

    /// A one-shot server answering `response` after reading the request head.
    async fn answer(response: &'static [u8]) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 1024];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    return;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert!(got.starts_with(b"GET /healthz HTTP/1.1\r\nHost: app:1\r\n"));
            s.write_all(response).await.unwrap();
        });
        addr
    }

    #[tokio::test]
    async fn http_checks_the_status() {
        let ok = answer(b"HTTP/1.1 204 No Content\r\n\r\n").await;
        assert_eq!(
            probe(&http(&[(200, 399)]), ok, "app:1", None, false).await,
            Ok(())
        );
        let bad = answer(b"HTTP/1.1 503 Service Unavailable\r\n\r\n").await;
        let err = probe(&http(&[(200, 299), (302, 302)]), bad, "app:1", None, false).await;
        assert_eq!(err, Err("status 503 not in 200-299,302".into()));
    }

    #[tokio::test]
    async fn tcp_and_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tcp = HealthCheck {
            kind: HealthCheckKind::Tcp,
            ..http(&[])
        };
        assert_eq!(probe(&tcp, addr, "x", None, false).await, Ok(()));
        drop(listener);
        let err = probe(&tcp, addr, "x", None, false).await.unwrap_err();
        assert!(err.starts_with("connect: "), "{err}");
    }
}
