//! One HTTP/3 request stream, one request: the HTTP/3 client adapter. Its fields become
//! the HTTP/1.1 head every protocol presents (`http2::request::write_head`, checked by
//! `codec::http1::fill_written`), then the same `request::Request`, routing decision,
//! driver, edits, relay and `proxy::record` as an HTTP/1.1 or HTTP/2 request; Weir's own
//! answers and failures are sent by the same functions as over HTTP/2
//! (`http2::local::send_answer`, `answer_failure`: a gRPC request gets a failure as a gRPC
//! status).

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h3::error::Code;

use super::body::{next_data, RecvHalf, SendHalf};
use super::conn::Conn;
use super::exchange::{forward, Body};
use super::send::H3Responder;
use super::upstream::forward_h2;
use crate::codec::http1::{fill_written, HeadLimits, RequestHead};
use crate::error::ProxyError;
use crate::forward::{carrier, Carrier, Failure};
use crate::http2::exchange::StreamRequest;
use crate::http2::files::respond_stream;
use crate::http2::interim::Relayed;
use crate::http2::local::{answer_failure, send_answer};
use crate::http2::request::write_head;
use crate::http2::scratch::RequestScratch;
use crate::http2::stream_log::{StreamConn, StreamLog};
use crate::http2::upstream::H2Facts;
use crate::metrics::shard::Protocol;
use crate::proxy::route::{Decision, Routing};
use crate::request::Request;
use crate::router::RoutedPath;
use crate::tls::early_data;

/// The request a stream resolved to, and the stream's two halves.
pub(super) struct Resolved {
    pub request: http::Request<()>,
    pub send: SendHalf,
    pub recv: RecvHalf,
}

/// Serves one request stream of the connection `conn`.
pub(super) async fn serve(conn: Rc<Conn>, resolved: Resolved) {
    let Resolved {
        request,
        mut send,
        mut recv,
    } = resolved;
    let started = Instant::now();
    let worker = &*conn.worker;
    let snapshot = worker.snapshot();
    let Some(index) = snapshot.serving_index(conn.slot, Some(&conn.tls)) else {
        // A reload removed the listener, or changed its client-auth policy: the
        // connection is going away.
        send.stop_stream(Code::H3_REQUEST_REJECTED);
        return;
    };
    let listener = &snapshot.config.listeners[index];
    let (mut parts, ()) = request.into_parts();
    // Before the handshake completes (0-RTT): marked for the upstream, or refused.
    let early = match conn.handshake.in_early_data() {
        true => early_data::admit(parts.method.as_str().as_bytes(), &mut parts.headers),
        false => Ok(()),
    };
    let start = body_start(&conn, &parts, &mut send, &mut recv, listener.client_timeout);
    let Some((length, first, ended)) = start.await else {
        return;
    };
    let scratch = worker.h2_scratch.requests.take();
    let (mut buf, mut req) = (scratch.head, scratch.req);
    buf.reserve(512);
    let Ok(line) = write_head(&mut buf, &mut req.headers, &parts, ended) else {
        // Malformed (RFC 9114 4.1.2): a stream error.
        send.stop_stream(Code::H3_MESSAGE_ERROR);
        worker
            .h2_scratch
            .requests
            .give(RequestScratch { head: buf, req });
        return conn.reset_by_client();
    };
    let facts = H2Facts::of(&parts.headers);
    let mut log = StreamLog::default();
    log.trace.grpc = facts.grpc;
    let limits = HeadLimits::of(listener);
    let filled = fill_written(&buf, line.method, line.target, limits, &mut req);
    let at = conn.stream_conn(&snapshot, index);
    let result = match filled {
        Ok(()) => {
            let body = (!ended).then_some(Body {
                recv: &mut recv,
                first,
                length,
            });
            let parsed = Parsed {
                buf: &buf,
                req: &req,
                facts: &facts,
                parts,
                started,
                early,
            };
            let mut to = H3Responder {
                send: &mut send,
                quic: conn.quic(),
            };
            run(&at, parsed, body, &mut to, &mut log).await
        }
        Err(e) => Err(e.into()),
    };
    if matches!(&result, Err(f) if f.error == ProxyError::ClientClosed) {
        conn.reset_by_client();
    }
    let status = answer_failure(&mut send, &result, listener, at.ip, &mut log.trace).await;
    log.record(&at, result, status, Instant::now() - started);
    worker
        .h2_scratch
        .requests
        .give(RequestScratch { head: buf, req });
}

/// Where the request's body starts: its declared length; when it declares none, its first
/// DATA (read within `timeout`), since only that says whether a body comes; and whether
/// there is none (a length of 0, or no length and the stream ended after the head).
/// `None`: the stream is over (a malformed length: stopped; the client gone or slow).
async fn body_start(
    conn: &Conn,
    parts: &http::request::Parts,
    send: &mut SendHalf,
    recv: &mut RecvHalf,
    timeout: Duration,
) -> Option<(Option<u64>, Option<Bytes>, bool)> {
    let Ok(length) = declared_length(parts) else {
        // Malformed (RFC 9114 4.1.2): a stream error.
        send.stop_stream(Code::H3_MESSAGE_ERROR);
        conn.reset_by_client();
        return None;
    };
    let declared = length.map(|n| n > 0);
    let first = match declared {
        Some(_) => None,
        None => match next_data(recv, timeout, None).await {
            Ok(first) => first,
            Err(e) => {
                if e == ProxyError::ClientClosed {
                    conn.reset_by_client();
                }
                return None;
            }
        },
    };
    let ended = !declared.unwrap_or(first.is_some());
    Some((length, first, ended))
}

/// The request's `content-length`: `None` when it has none (a body may follow, or the
/// stream end; the adapter reads on to find out). `Err`: malformed (not a number, or two
/// that differ), a stream error. The body is held to it (`H3Source`): the h3 crate does not
/// check DATA against it, and an HTTP/1.1 upstream would read what goes past it as another
/// request.
fn declared_length(parts: &http::request::Parts) -> Result<Option<u64>, ()> {
    let mut length = None;
    for value in parts.headers.get_all(http::header::CONTENT_LENGTH) {
        let text = value.to_str().map_err(|_| ())?;
        let n = match text.bytes().all(|b| b.is_ascii_digit()) {
            true => text.parse::<u64>().map_err(|_| ())?,
            false => return Err(()),
        };
        if length.is_some_and(|m| m != n) {
            return Err(());
        }
        length = Some(n);
    }
    Ok(length)
}

/// A stream's request, its HTTP/1.1 head written and checked.
struct Parsed<'a> {
    buf: &'a [u8],
    req: &'a RequestHead,
    /// The client's own request, for an HTTP/2 upstream's.
    facts: &'a H2Facts,
    parts: http::request::Parts,
    started: Instant,
    /// What early data allows the request (`tls::early_data::admit`).
    early: Result<(), ProxyError>,
}

/// Notes the request for the log (`StreamLog::note`), takes the routing decision and does
/// what it says, answering into the stream `to`.
async fn run(
    at: &StreamConn<'_>,
    parsed: Parsed<'_>,
    body: Option<Body<'_>>,
    to: &mut H3Responder<'_>,
    log: &mut StreamLog,
) -> Result<(), Failure> {
    let (worker, snapshot, index) = (at.worker, at.snapshot, at.listener);
    let listener = &snapshot.config.listeners[index];
    let req = parsed.req;
    log.note(at, parsed.buf, req);
    parsed.early?;
    let request = at.request(&log.who, parsed.buf, req, parsed.started);
    let routing = Routing {
        worker,
        snapshot,
        listener: index,
    };
    let mut path = RoutedPath::default();
    let (route, decided) = routing.decide(&request, &mut path);
    let decision = match decided {
        Ok(decision) => decision,
        Err(check) => Box::pin(routing.verified(&request, &path, check)).await,
    };
    // Sampled: the request carries its trace (server span, client spans per attempt).
    let request = match routing.trace(route, || request) {
        None => request,
        Some(trace) => Request {
            trace: Some(&**log.otel.insert(trace)),
            ..request
        },
    };
    log.route = route;
    let (target, fill) = match decision {
        Decision::Forward(target, fill) => (target, fill),
        Decision::Answer(answer) => {
            log.trace.local = answer.is_local();
            let vars = answer.vars(&request, &path);
            let stall = listener.http2.stall_timeout;
            let sent = send_answer(to.send, &answer, &vars, req.is_head, stall, &mut log.trace);
            return sent.await.map_err(Failure::after_head);
        }
        Decision::Refuse(error) => return Err(error.into()),
        Decision::Reply(reply) => {
            let under = crate::files::Under::of(listener, route);
            let sent = respond_stream(to.send, &request, &path, under, *reply, &mut log.trace);
            return Box::pin(sent).await;
        }
    };
    let spare = Cell::new(http::HeaderMap::new());
    let r = StreamRequest {
        worker,
        target,
        request,
        path: &path,
        spare: &spare,
        relayed: Relayed::default(),
        fill: Cell::new(None),
        response_lines: Cell::default(),
    };
    let carrier = carrier(Protocol::Http3, target.upstream);
    if let Some(answered) = r.before_forward(fill, to.send, &mut log.trace).await {
        return answered;
    }
    let result = match carrier == Carrier::Http2 {
        // Boxed, as for HTTP/2 clients: the stream task's future is as large as its
        // largest path.
        true => {
            let (facts, parts) = (parsed.facts, parsed.parts);
            Box::pin(forward_h2(&r, facts, parts, body, to, &mut log.trace)).await
        }
        false => forward(&r, body, to, &mut log.trace).await,
    };
    r.after_forward(result, to.send, &mut log.trace).await
}
