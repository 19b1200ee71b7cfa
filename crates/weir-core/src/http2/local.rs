//! Weir's own answers on HTTP/2 and HTTP/3 streams (`answer::Answer`: the default
//! response, `respond`, redirects, refusals, failures): rendered as the HTTP/1.1 bytes an
//! HTTP/1.x client gets, and sent from those bytes without their hop-by-hop fields (on
//! either protocol's stream, `respond::ResponseStream`), so every protocol carries the
//! same status, headers and body. A gRPC request gets any of them but
//! a 2xx as a gRPC status instead (`grpc`).

use std::borrow::Cow;

use std::time::Duration;

use super::grpc;
use super::respond::ResponseStream;
use crate::answer::Answer;
use crate::codec::http1::write::Persistence;
use crate::codec::http1::{parse_response, ResponseHead};
use crate::error::{reason_phrase, ProxyError};
use crate::filters::forwarded::ClientIp;
use crate::filters::headers::Vars;
use crate::forward::{Failure, Reached};
use crate::request::Trace;

/// Sends `answer` on an HTTP/2 or HTTP/3 client's stream `respond` (its body left out
/// for a HEAD request, `is_head`; `vars`: the request's, for a redirect), as
/// [`stream_answer`] makes it, each write waiting at most `stall`. Notes its status, the
/// body bytes sent and the gRPC status in `trace`.
pub(crate) async fn send_answer<R: ResponseStream>(
    respond: &mut R,
    answer: &Answer<'_>,
    vars: &Vars<'_>,
    is_head: bool,
    stall: Duration,
    trace: &mut Trace,
) -> Result<(), ProxyError> {
    let mut out = Vec::new();
    let (response, body, grpc_status) = stream_answer(answer, vars, is_head, &mut out, trace)?;
    // A gRPC answer is its head alone (trailers-only).
    respond
        .send_whole(response, body, stall, trace, grpc_status)
        .await
}

/// Answers a failure nothing was sent for yet with its status (to a gRPC request, as a
/// gRPC status, each write waiting at most the `listener`'s `stall_timeout`), or ends
/// the stream with none when there is none to give or the client left (`499`). Returns
/// the status the request counts with. Every failure of `client`'s is logged
/// (`proxy::log_failure`), one cut short after its head too.
pub(crate) async fn answer_failure<R: ResponseStream>(
    respond: &mut R,
    result: &Result<(), Failure>,
    listener: &weir_config::Listener,
    client: &ClientIp,
    trace: &mut Trace,
) -> u16 {
    let failure = match result {
        Ok(()) => return trace.status,
        Err(f) => f,
    };
    crate::proxy::log_failure(failure, listener, client);
    if failure.reached == Reached::Head {
        return trace.status;
    }
    let Some(status) = failure.error.status().filter(|_| !trace.reset) else {
        respond.cancel();
        return 499;
    };
    let answer = Answer::Error(failure.error);
    let stall = listener.http2.stall_timeout;
    let _ = send_answer(respond, &answer, &Vars::default(), false, stall, trace).await;
    status
}

/// A response for a stream: its head, its body, and the `grpc-status` to note once the
/// head was sent (`ResponseStream::send_whole` notes it).
type StreamAnswer<'o> = (http::Response<()>, &'o [u8], Option<u32>);

/// `answer` as a stream's response (HTTP/2 or HTTP/3): rendered into `out` as the HTTP/1.1
/// bytes an HTTP/1.x client gets, its head without hop-by-hop fields, and its body (empty
/// for a HEAD request, `is_head`); to a gRPC request (`trace.grpc`), a status other than
/// 2xx as a gRPC status instead (`grpc`: a trailers-only head, no body). Notes the status
/// in `trace`; returns the head, the body, and the `grpc-status` to note once the head was
/// sent (`Trace::sent_grpc_status`). Not async: `send_answer`'s state holds none of this.
fn stream_answer<'o>(
    answer: &'o Answer<'_>,
    vars: &Vars<'_>,
    is_head: bool,
    out: &'o mut Vec<u8>,
    trace: &mut Trace,
) -> Result<StreamAnswer<'o>, ProxyError> {
    let rendered = answer.render(out, Persistence::KeepAlive, is_head, vars);
    let mut head = ResponseHead::default();
    // Weir rendered these bytes itself: they always parse.
    if !parse_response(rendered, rendered.len(), is_head, &mut head)? {
        return Err(ProxyError::UpstreamMalformed("incomplete local response"));
    }
    let mut response = super::respond::end_to_end_head(rendered, &head);
    let body = &rendered[head.head_len..];
    let status = response.status().as_u16();
    trace.status = status;
    if !(trace.grpc && grpc::translates(status)) {
        // A 2xx as the user wrote it: any `grpc-status` in it is what the client gets.
        let grpc_status = trace.grpc_status_in(response.headers());
        return Ok((response, body, grpc_status));
    }
    // The fields that say more than the status stay (WWW-Authenticate, Retry-After,
    // Location); the ones about the body do not, there is none.
    let mut extra = std::mem::take(response.headers_mut());
    extra.remove(http::header::CONTENT_TYPE);
    extra.remove(http::header::CONTENT_LENGTH);
    let code = match answer {
        Answer::Error(error) => grpc::code_for_error(*error, status),
        _ => grpc::code_for_status(status),
    };
    // The `grpc-message`: a failure's description (as Envoy's local replies give it), the
    // reason phrase for the default response (its body is for browsers), else the short
    // body.
    let message = match answer {
        Answer::Error(error) => Cow::Owned(error.to_string().into_bytes()),
        Answer::Default(_) => Cow::Borrowed(reason_phrase(status).as_bytes()),
        _ => Cow::Borrowed(grpc::message(status, body)),
    };
    let head = grpc::status_head(code, &message, extra);
    Ok((head, &[], Some(u32::from(code))))
}
