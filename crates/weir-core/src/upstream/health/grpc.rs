//! The gRPC health check (`kind = "grpc"`): one `grpc.health.v1.Health/Check` call over
//! HTTP/2 on the connection the probe opened (h2c, or h2 after TLS with ALPN).
//!
//! The two messages are tiny, so they are written and read here by hand:
//! `HealthCheckRequest { string service = 1; }` and
//! `HealthCheckResponse { ServingStatus status = 1; }` (`SERVING` = 1), each in one gRPC
//! length-prefixed frame (a zero compression flag, a 4-byte big-endian length).

use std::future::poll_fn;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};

/// The method's path.
const PATH: &str = "/grpc.health.v1.Health/Check";
/// `ServingStatus.SERVING`.
const SERVING: u64 = 1;
/// A response body larger than this is not a health answer.
const MAX_BODY: usize = 4096;

/// The request body: one frame holding `HealthCheckRequest { service }`.
pub fn request_body(service: &str) -> Bytes {
    let mut message = Vec::with_capacity(service.len() + 8);
    if !service.is_empty() {
        message.push(0x0a); // field 1, length-delimited
        push_varint(&mut message, service.len() as u64);
        message.extend_from_slice(service.as_bytes());
    }
    let mut frame = Vec::with_capacity(5 + message.len());
    frame.push(0);
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    Bytes::from(frame)
}

fn push_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Reads a varint at the start of `buf`: the value and its length.
fn varint(buf: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, b) in buf.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// The serving status in a response body (one frame); `UNKNOWN` (0) when the field is
/// absent, as proto3 defaults say.
pub fn serving_status(body: &[u8]) -> Result<u64, String> {
    let malformed = |what: &str| format!("malformed gRPC health response: {what}");
    let (&flag, rest) = body.split_first().ok_or_else(|| malformed("no message"))?;
    if flag != 0 {
        return Err(malformed("compressed message"));
    }
    let len = rest.get(..4).ok_or_else(|| malformed("short frame"))?;
    let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
    let mut message = rest
        .get(4..4 + len)
        .ok_or_else(|| malformed("short frame"))?;
    let mut status = 0;
    while !message.is_empty() {
        let (tag, n) = varint(message).ok_or_else(|| malformed("bad tag"))?;
        message = &message[n..];
        let skip = match tag & 7 {
            0 => {
                let (value, n) = varint(message).ok_or_else(|| malformed("bad varint"))?;
                if tag >> 3 == 1 {
                    status = value;
                }
                n
            }
            1 => 8,
            2 => {
                let (len, n) = varint(message).ok_or_else(|| malformed("bad length"))?;
                n.saturating_add(usize::try_from(len).unwrap_or(usize::MAX))
            }
            5 => 4,
            _ => return Err(malformed("unknown wire type")),
        };
        message = message
            .get(skip..)
            .ok_or_else(|| malformed("short field"))?;
    }
    Ok(status)
}

/// Makes the call on `io` (a connected transport) and checks the answer: HTTP 200,
/// `grpc-status` 0, and `SERVING`.
pub async fn check<T>(io: T, scheme: &str, authority: &str, service: &str) -> Result<(), String>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    over_h2(io, |client| call(client, scheme, authority, service)).await
}

/// Runs `call` on an HTTP/2 connection made on `io` (a connected transport): the HTTP/2
/// side of every check (gRPC's, and HTTP checks of `h2` / `h2c` upstreams).
pub async fn over_h2<T, R, F, Fut>(io: T, call: F) -> Result<R, String>
where
    T: AsyncRead + AsyncWrite + Unpin,
    F: FnOnce(h2::client::SendRequest<Bytes>) -> Fut,
    Fut: std::future::Future<Output = Result<R, String>>,
{
    let (client, connection) = h2::client::handshake(io)
        .await
        .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    let call = call(client);
    // The connection is driven here, in the probe's own future: nothing outlives it.
    tokio::pin!(connection);
    tokio::select! {
        result = call => result,
        ended = &mut connection => Err(match ended {
            Ok(()) => "connection closed".to_owned(),
            Err(e) => format!("HTTP/2: {e}"),
        }),
    }
}

async fn call(
    client: h2::client::SendRequest<Bytes>,
    scheme: &str,
    authority: &str,
    service: &str,
) -> Result<(), String> {
    let h2_error = |e: h2::Error| format!("HTTP/2: {e}");
    let request = http::Request::post(format!("{scheme}://{authority}{PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("user-agent", "weir-health-check")
        .body(())
        .map_err(|e| format!("request: {e}"))?;
    let mut client = client.ready().await.map_err(h2_error)?;
    let (response, mut send) = client.send_request(request, false).map_err(h2_error)?;
    send.send_data(request_body(service), true)
        .map_err(h2_error)?;
    let (head, mut body) = response.await.map_err(h2_error)?.into_parts();
    if head.status != http::StatusCode::OK {
        return Err(format!("HTTP status {}", head.status.as_u16()));
    }
    // A trailers-only answer carries grpc-status in the head.
    grpc_status(&head.headers)?;
    let mut collected = BytesMut::new();
    while let Some(data) = poll_fn(|cx| body.poll_data(cx)).await {
        let data = data.map_err(h2_error)?;
        let _ = body.flow_control().release_capacity(data.len());
        collected.extend_from_slice(&data);
        if collected.len() > MAX_BODY {
            return Err("gRPC health response too large".into());
        }
    }
    if let Some(trailers) = body.trailers().await.map_err(h2_error)? {
        grpc_status(&trailers)?;
    }
    match serving_status(&collected)? {
        SERVING => Ok(()),
        other => Err(format!("serving status {} ({other})", status_name(other))),
    }
}

/// A non-zero `grpc-status` is a failure (5 NOT_FOUND: unknown service; 12 UNIMPLEMENTED:
/// no health service).
fn grpc_status(fields: &http::HeaderMap) -> Result<(), String> {
    match fields.get("grpc-status").map(|v| v.as_bytes()) {
        None | Some(b"0") => Ok(()),
        Some(code) => {
            let message = fields
                .get("grpc-message")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            Err(format!(
                "grpc-status {} {message}",
                String::from_utf8_lossy(code)
            ))
        }
    }
}

fn status_name(status: u64) -> &'static str {
    match status {
        0 => "UNKNOWN",
        2 => "NOT_SERVING",
        3 => "SERVICE_UNKNOWN",
        _ => "unexpected",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_the_request() {
        assert_eq!(&request_body("")[..], &[0, 0, 0, 0, 0]);
        assert_eq!(
            &request_body("a.B")[..],
            &[0, 0, 0, 0, 5, 0x0a, 3, b'a', b'.', b'B']
        );
        let long = "s".repeat(200);
        let body = request_body(&long);
        assert_eq!(&body[5..8], &[0x0a, 0xc8, 0x01]);
        assert_eq!(body.len(), 5 + 3 + 200);
    }

    #[test]
    fn reads_the_serving_status() {
        assert_eq!(serving_status(&[0, 0, 0, 0, 2, 0x08, 1]), Ok(1));
        assert_eq!(serving_status(&[0, 0, 0, 0, 2, 0x08, 2]), Ok(2));
        // Absent field: UNKNOWN. Unknown fields before it are skipped.
        assert_eq!(serving_status(&[0, 0, 0, 0, 0]), Ok(0));
        let with_extra = [0, 0, 0, 0, 8, 0x12, 2, b'h', b'i', 0x18, 5, 0x08, 1];
        assert_eq!(serving_status(&with_extra), Ok(1));
        assert!(serving_status(&[]).is_err());
        assert!(serving_status(&[1, 0, 0, 0, 0]).is_err());
        assert!(serving_status(&[0, 0, 0, 0, 9, 0x08]).is_err());
        assert!(serving_status(&[0, 0, 0, 0, 1, 0x08]).is_err());
    }
}
