//! One h2 stream's exchange with an HTTP/2 upstream (`protocol = "h2"`, `"h2c"`, `"auto"`
//! over TLS): h2 end to end, trailers both ways, as gRPC needs.
//!
//! The tries are the driver's (`forward::driver`), over `forward::h2` (a stream on the
//! worker's pool, the final head awaited while the body goes up, 1xx heads relayed by
//! `interim`). The first try's request is made from the client's own request
//! (`upstream_request`), a later one's from the HTTP/1.1 head written for its server
//! (`h1_head_to_h2`). Request DATA goes upstream within the upstream's window (the first
//! piece, up to `EAGER_FIRST_PIECE`, at once) and is released to the client's window only
//! once sent, so the client is paced by the upstream; the response streams back the same
//! way, then its trailers, while the upload goes on (bidirectional streaming).
//! `grpc-timeout` caps the response timeout. An `auto` server that chose HTTP/1.1 takes the
//! stream as HTTP/1.1 (`exchange`).

use std::cell::Cell;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::header::HeaderMap;
use http::request::Parts;
use http::uri::Scheme;
use weir_config::UpstreamServer;

use super::exchange::{cookie_value, StreamRequest, Trace};
use super::interim::ClientStream;
use super::send::{send_bytes, send_data, unless_reset, Stop};
use super::upstream_request::{upstream_request, Upstream};
use crate::connector::h2::h2_error;
use crate::error::ProxyError;
use crate::forward::driver::{drive, Attempt, LastTry, Miss, Sender, Tries};
use crate::forward::h2::{
    final_head, h1_head_to_h2, open, relay_while_uploading, send_windowed, HeadBounds, Upload,
    UploadError, EAGER_FIRST_PIECE,
};
use crate::forward::request_head::with_client_facts;
use crate::forward::{Failure, Timeouts};
use crate::time::with_timeout;

/// What the h2 path needs from the client's fields, read before they are dropped.
#[derive(Debug, Clone, Copy, Default)]
pub struct H2Facts {
    /// The client sent `te: trailers`.
    pub te_trailers: bool,
    /// `content-type: application/grpc` (or `+proto`, `;...`): failures are answered with a
    /// gRPC status.
    pub grpc: bool,
    /// The client's `grpc-timeout`.
    pub grpc_timeout: Option<Duration>,
}

impl H2Facts {
    /// One pass over the request's few fields rather than three hashed lookups; the
    /// first value of a name counts, as `HeaderMap::get` gives it.
    pub fn of(headers: &HeaderMap) -> H2Facts {
        let (mut content_type, mut te, mut timeout) = (None, None, None);
        for (name, value) in headers {
            let slot = if name == http::header::CONTENT_TYPE {
                &mut content_type
            } else if name == http::header::TE {
                &mut te
            } else if name.as_str() == "grpc-timeout" {
                &mut timeout
            } else {
                continue;
            };
            slot.get_or_insert(value.as_bytes());
        }
        H2Facts {
            te_trailers: te == Some(&b"trailers"[..]),
            grpc: content_type.is_some_and(is_grpc_content_type),
            grpc_timeout: timeout.and_then(grpc_timeout),
        }
    }
}

/// Whether a `content-type` is gRPC's: `application/grpc`, alone or followed by `+` (a
/// message format such as `+proto`) or `;` (parameters), in any case. gRPC-Web
/// (`application/grpc-web*`) is not: its clients read trailers from the body and take
/// an HTTP status as it is.
pub fn is_grpc_content_type(value: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    value.len() >= GRPC.len()
        && value[..GRPC.len()].eq_ignore_ascii_case(GRPC)
        && matches!(value.get(GRPC.len()), None | Some(b'+' | b';'))
}

/// Parses a `grpc-timeout` value: up to 8 digits and a unit (H, M, S, m, u, n).
pub fn grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

impl StreamRequest<'_> {
    /// Forwards the request to an HTTP/2 upstream and relays the response and trailers.
    /// On `Err` with `Reached::Nothing` nothing was sent: the caller answers.
    pub async fn forward_h2(
        &self,
        facts: &H2Facts,
        parts: Parts,
        body: Option<RecvStream>,
        respond: &mut SendResponse<Bytes>,
        trace: &mut Trace,
    ) -> Result<(), Failure> {
        let x = self.exchange_of();
        let mut last_try = LastTry::default();
        let (relayed, body) = {
            let client = self.client_stream(respond, body.is_some());
            let mut sender = H2Sender {
                r: self,
                facts,
                parts: Some(parts),
                body,
                consumed: Cell::new(0),
                client: &client,
                trace: &mut *trace,
            };
            let relayed = drive(&x, &mut sender, self.request.started, &mut last_try).await;
            sender.trace.body_in = sender.consumed.get();
            (relayed.map(|accepted| accepted.take().0), sender.body)
        };
        trace.upstream_pick = last_try.upstream_pick;
        trace.upstream_time = last_try.upstream_time;
        match relayed {
            // An `auto` server chose HTTP/1.1: the stream goes there as HTTP/1.1.
            Ok(Relayed::Http1) => self.forward(body, respond, trace).await,
            Ok(Relayed::Over(result)) => result,
            Err(failure) => Err(failure),
        }
    }

    /// The upstream request: made from the client's request `client` when given (it is
    /// for the first one sent), else from the HTTP/1.1 head every request gets, as
    /// HTTP/2 fields.
    fn upstream_request(
        &self,
        facts: &H2Facts,
        server: &UpstreamServer,
        client: Option<Parts>,
    ) -> Result<http::Request<()>, ProxyError> {
        let tls = self.target.upstream.tls.is_some();
        let id = self.target.listener.policy.request_id.as_ref();
        let unindexed = id.map(|i| i.header.as_str());
        let Some(parts) = client else {
            let mut out = Vec::with_capacity(self.request.buf.len() + 256);
            self.write_head(&mut out, server);
            let scheme = if tls { "https" } else { "http" };
            return h1_head_to_h2(&out, scheme, facts.te_trailers, unindexed);
        };
        with_client_facts(&self.request, &self.target, |client| {
            let u = Upstream {
                buf: self.request.buf,
                req: self.request.req,
                path: self.path,
                route: self.target.route,
                server,
                client,
                scheme: if tls { Scheme::HTTPS } else { Scheme::HTTP },
                te_trailers: facts.te_trailers,
                unindexed,
            };
            upstream_request(parts, &u, &self.worker.h2_scratch)
        })
    }
}

/// How a relayed try ended.
enum Relayed {
    Over(Result<(), Failure>),
    /// `auto`, and the server chose HTTP/1.1 (ALPN).
    Http1,
}

/// Sends a stream's request as HTTP/2 streams, and relays the response and its trailers.
struct H2Sender<'s, 'c> {
    r: &'s StreamRequest<'s>,
    facts: &'s H2Facts,
    /// The client's request: the first try's is made from it.
    parts: Option<Parts>,
    body: Option<RecvStream>,
    /// Request body bytes taken from the client.
    consumed: Cell<u64>,
    client: &'c ClientStream<'c>,
    trace: &'c mut Trace,
}

impl Sender for H2Sender<'_, '_> {
    type Sent = Relayed;

    async fn send(&mut self, a: &Attempt<'_>, tries: &mut Tries<'_>) -> Result<Relayed, Miss> {
        let (r, client) = (self.r, self.client);
        let request = r.upstream_request(self.facts, a.server, self.parts.take())?;
        let end = self.body.is_none();
        let Some((pending, mut up_send)) = open(tries.exchange(), a, request, end).await? else {
            return Ok(Relayed::Http1);
        };
        // The client's `grpc-timeout` caps the response timeout.
        let upstream = r.target.upstream;
        let timeout = match self.facts.grpc_timeout {
            Some(t) => t.min(upstream.response_timeout),
            None => upstream.response_timeout,
        };
        let timeouts = Timeouts {
            client: r.target.listener.client_timeout,
            upstream: timeout,
        };
        let limit = r.target.listener.max_body_size;
        let (body, consumed) = (self.body.as_mut(), &self.consumed);
        let mut state = if end { Upload::Done } else { Upload::Running };
        let upload = async {
            match body {
                Some(b) => upload(b, &mut up_send, consumed, limit, timeouts).await,
                None => Ok(()),
            }
        };
        tokio::pin!(upload);
        let bounds = HeadBounds {
            timeout,
            max_informational: r.informational_bound(),
            relay: true,
            tokens: false,
        };
        let mut interim = client;
        let waited = final_head(
            pending,
            upload.as_mut(),
            &mut state,
            &mut interim,
            bounds,
            client.gone(),
        );
        let waited = waited.await;
        self.trace.reset |= client.was_reset();
        let (head, _lease) = waited?;
        let (parts, up_body) = head.into_parts();
        let status = parts.status.as_u16();
        let replayable = end || consumed.get() == 0;
        if !tries.relays(status, replayable, r.relayed.any()) {
            return Err(Miss::retried(status));
        }
        tries.count(a, Ok(status));
        self.trace.status = status;
        let mut head = http::Response::from_parts(parts, ());
        r.edit_response(head.headers_mut());
        if let Some(cookie) = tries.set_cookie().and_then(cookie_value) {
            head.headers_mut().append(http::header::SET_COOKIE, cookie);
        }
        let upload = (state == Upload::Running).then_some(upload);
        let timeouts = Timeouts {
            client: r.target.listener.http2.stall_timeout,
            upstream: timeout,
        };
        let relayed = respond(client, head, up_body, upload, timeouts, self.trace).await;
        Ok(Relayed::Over(relayed))
    }

    fn replayable(&self) -> bool {
        self.body.is_none() || self.consumed.get() == 0
    }

    fn responded(&self) -> bool {
        self.r.relayed.any()
    }
}

/// Sends `head` on `client`'s stream and relays the body and trailers while the rest of
/// the request body (`upload`, if still going) goes up.
async fn respond<U>(
    client: &ClientStream<'_>,
    head: http::Response<()>,
    mut up_body: RecvStream,
    upload: Option<std::pin::Pin<&mut U>>,
    timeouts: Timeouts,
    trace: &mut Trace,
) -> Result<(), Failure>
where
    U: std::future::Future<Output = Result<(), UploadError>>,
{
    let grpc_status = trace.grpc_status_in(head.headers());
    let empty = up_body.is_end_stream();
    let Ok(mut send) = client.send_response(head, empty) else {
        return Err(Failure::after_head(ProxyError::ClientClosed));
    };
    trace.sent_grpc_status(grpc_status);
    if empty {
        return Ok(());
    }
    let relay = relay(&mut up_body, &mut send, trace, timeouts);
    let Err(stop) = relay_while_uploading(upload, relay).await else {
        return Ok(());
    };
    // Cut short: the client learns it from the reset (the upstream stream is reset when
    // its handles drop).
    send.send_reset(Reason::CANCEL);
    if stop == Stop::Reset {
        trace.reset = true;
    }
    Err(Failure::after_head(stop.into()))
}

/// Sends the request's DATA upstream within the upstream's window, releasing each piece
/// to the client's window once sent; then the client's trailers, or the end of stream.
async fn upload(
    body: &mut RecvStream,
    up: &mut SendStream<Bytes>,
    consumed: &Cell<u64>,
    limit: Option<u64>,
    timeouts: Timeouts,
) -> Result<(), UploadError> {
    let (client_timeout, upstream_timeout) = (timeouts.client, timeouts.upstream);
    let client = UploadError::Client;
    let up_error = |_: h2::Error| UploadError::Upstream;
    loop {
        let data = match with_timeout(client_timeout, body.data()).await {
            Err(_) => return Err(client(ProxyError::ClientTimeout)),
            Ok(None) => break,
            Ok(Some(Err(_))) => return Err(client(ProxyError::ClientClosed)),
            Ok(Some(Ok(data))) => data,
        };
        let len = data.len();
        let first = consumed.get() == 0;
        consumed.set(consumed.get() + len as u64);
        if limit.is_some_and(|max| consumed.get() > max) {
            return Err(client(ProxyError::BodyTooLarge));
        }
        // The client's last DATA (END_STREAM, no trailers): END_STREAM goes on ours too,
        // not on an extra empty frame.
        let last = body.is_end_stream();
        let eager = first.then_some(EAGER_FIRST_PIECE);
        send_windowed(up, data, upstream_timeout, eager, last)
            .await
            .map_err(|_| UploadError::Upstream)?;
        // Only now may the client send more: its pace is the upstream's.
        let _ = body.flow_control().release_capacity(len);
        if last {
            return Ok(());
        }
    }
    match with_timeout(client_timeout, body.trailers()).await {
        Err(_) => Err(client(ProxyError::ClientTimeout)),
        Ok(Err(_)) => Err(client(ProxyError::ClientClosed)),
        Ok(Ok(Some(trailers))) => up.send_trailers(trailers).map_err(up_error),
        Ok(Ok(None)) => up.send_data(Bytes::new(), true).map_err(up_error),
    }
}

/// Streams the upstream's response DATA to the client, then its trailers.
async fn relay(
    up: &mut RecvStream,
    send: &mut SendStream<Bytes>,
    trace: &mut Trace,
    timeouts: Timeouts,
) -> Result<(), Stop> {
    // The relay waits for the client's window at most `stall_timeout` (`timeouts.client`).
    let (stall_timeout, upstream_timeout) = (timeouts.client, timeouts.upstream);
    let read_error = |e: h2::Error| Stop::Error(h2_error(&e));
    loop {
        let next = unless_reset(send, with_timeout(upstream_timeout, up.data())).await?;
        let data = match next {
            Err(_) => return Err(Stop::Error(ProxyError::UpstreamTimeout)),
            Ok(None) => break,
            Ok(Some(data)) => data.map_err(read_error)?,
        };
        let len = data.len();
        send_bytes(send, data, false, stall_timeout).await?;
        trace.body_out += len as u64;
        let _ = up.flow_control().release_capacity(len);
    }
    let trailers = unless_reset(send, with_timeout(upstream_timeout, up.trailers())).await?;
    match trailers {
        Err(_) => Err(Stop::Error(ProxyError::UpstreamTimeout)),
        Ok(Err(e)) => Err(read_error(e)),
        Ok(Ok(Some(t))) => {
            let grpc_status = trace.grpc_status_in(&t);
            send.send_trailers(t)
                .map_err(|_| Stop::Error(ProxyError::ClientClosed))?;
            trace.sent_grpc_status(grpc_status);
            Ok(())
        }
        Ok(Ok(None)) => send_data(send, &[], true, stall_timeout).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_content_types_are_grpc_and_its_lookalikes_are_not() {
        for yes in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC+json",
            "application/grpc;charset=utf-8",
        ] {
            assert!(is_grpc_content_type(yes.as_bytes()), "{yes}");
        }
        for no in [
            "application/grpc-web",
            "application/grpc-web-text+proto",
            "application/grpcfoo",
            "application/json",
            "application/grp",
            "",
        ] {
            assert!(!is_grpc_content_type(no.as_bytes()), "{no}");
        }
    }

    #[test]
    fn facts_take_the_first_value_of_each_field() {
        let req = http::Request::post("http://e/")
            .header("grpc-timeout", "150m")
            .header("content-type", "application/grpc+proto")
            .header("te", "trailers")
            .header("x-other", "1")
            .header("te", "gzip")
            .header("grpc-timeout", "1H")
            .header("content-type", "text/plain")
            .body(())
            .unwrap_or_default();
        let facts = H2Facts::of(req.headers());
        assert!(facts.te_trailers && facts.grpc);
        assert_eq!(facts.grpc_timeout, Some(Duration::from_millis(150)));
        let req = http::Request::get("http://e/")
            .header("content-type", "application/grpc-web")
            .header("te", "gzip")
            .body(())
            .unwrap_or_default();
        let facts = H2Facts::of(req.headers());
        assert!(!facts.te_trailers && !facts.grpc && facts.grpc_timeout.is_none());
    }

    #[test]
    fn parses_grpc_timeouts() {
        let ms = Duration::from_millis;
        assert_eq!(grpc_timeout(b"150m"), Some(ms(150)));
        assert_eq!(grpc_timeout(b"2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout(b"3M"), Some(Duration::from_secs(180)));
        assert_eq!(grpc_timeout(b"7u"), Some(Duration::from_micros(7)));
        assert_eq!(grpc_timeout(b"9n"), Some(Duration::from_nanos(9)));
        for bad in [
            &b""[..],
            b"m",
            b"10",
            b"10x",
            b"123456789m",
            b"-1m",
            b"1.5S",
        ] {
            assert_eq!(
                grpc_timeout(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
