//! Answers Weir writes itself on HTTP/2 streams: a route's `respond` or `redirect` and the
//! listener's `redirect_https`. They are rendered as HTTP/1.1 bytes, as for HTTP/1 clients
//! (`filters::respond`, `filters::redirect`), and sent from those bytes, so both protocols
//! carry the same status, headers and body. A gRPC request gets any of them but a 2xx as
//! a gRPC status instead (`grpc`).

use bytes::Bytes;
use h2::server::SendResponse;

use super::exchange::Trace;
use super::grpc;
use super::send::send_data;
use crate::codec::http1::{parse_response, ResponseHead};
use crate::error::ProxyError;

/// Sends the HTTP/1.1 response `rendered` (head and body, complete) on `respond`, without
/// its hop-by-hop fields; to a gRPC request (`grpc`), a status other than 2xx goes as a
/// gRPC status (its body as `grpc-message`). Notes its status, the body bytes sent and
/// the gRPC status in `trace`.
pub async fn send_rendered(
    respond: &mut SendResponse<Bytes>,
    rendered: &[u8],
    (is_head, grpc): (bool, bool),
    timeout: std::time::Duration,
    trace: &mut Trace,
) -> Result<(), ProxyError> {
    let mut head = ResponseHead::default();
    // Weir rendered these bytes itself: they always parse.
    if !parse_response(rendered, rendered.len(), is_head, &mut head)? {
        return Err(ProxyError::UpstreamMalformed("incomplete local response"));
    }
    let body = if is_head {
        &[][..]
    } else {
        &rendered[head.head_len..]
    };
    trace.status = head.status;
    let grpc = grpc && grpc::translates(head.status);
    let mut response = http::Response::new(());
    *response.status_mut() =
        http::StatusCode::from_u16(head.status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    let headers = response.headers_mut();
    for h in head.headers.iter().filter(|h| !h.kind.is_hop_by_hop()) {
        let name = http::HeaderName::from_bytes(&rendered[h.name.clone()]);
        let value = http::HeaderValue::from_bytes(&rendered[h.value.clone()]);
        if let (Ok(name), Ok(value)) = (name, value) {
            headers.append(name, value);
        }
    }
    if grpc {
        // The fields that say more than the status stay (WWW-Authenticate, Retry-After,
        // Location); the ones about the body do not, there is none.
        let mut extra = std::mem::take(headers);
        extra.remove(http::header::CONTENT_TYPE);
        extra.remove(http::header::CONTENT_LENGTH);
        let (code, message) = (
            grpc::code_for_status(head.status),
            grpc::message(head.status, body),
        );
        grpc::send_status(respond, code, message, extra)?;
        trace.grpc_status = Some(u32::from(code));
        return Ok(());
    }
    // A 2xx as the user wrote it: any `grpc-status` in it is what the client gets.
    let grpc_status = trace.grpc_status_in(response.headers());
    let mut send = respond
        .send_response(response, body.is_empty())
        .map_err(|_| ProxyError::ClientClosed)?;
    trace.sent_grpc_status(grpc_status);
    if !body.is_empty() {
        send_data(&mut send, body, true, timeout)
            .await
            .map_err(|_| ProxyError::ClientClosed)?;
    }
    trace.body_out = body.len() as u64;
    Ok(())
}
