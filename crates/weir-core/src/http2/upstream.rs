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
//!
//! The sender is generic over the client's side ([`ClientSide`], [`ClientBody`]): an
//! HTTP/3 client's stream (`http3::upstream`) and an HTTP/1.x client's connection
//! (`http2::from_http1`) take the same tries; each writes the response head its own way.
//! So does a cache's background revalidation, with no client at all (`ForStore`,
//! `http2::filling`).

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::header::HeaderMap;
use http::request::Parts;
use http::uri::Scheme;
use weir_config::UpstreamServer;

use super::exchange::StreamRequest;
use super::filling::mark;
use super::interim::ClientStream;
use super::respond::{head_from_h2, ResponseStream, Sinking};
use super::upstream_request::{h1_head_to_h2, upstream_request, Upstream};
use crate::cache::Fetched;
use crate::error::ProxyError;
use crate::forward::driver::{drive, Attempt, Miss, Sender, Tries};
use crate::forward::h1::Interim;
use crate::forward::h2::{final_head, open, plan_h2, relay_while_uploading, HeadBounds, Upload};
use crate::forward::head::{Edits, ForClient};
use crate::forward::relay::{relay, Broke, Coding, H2Source, H2Upload, Peer, Recording, Source};
use crate::forward::request_head::{with_client_facts, HeadNames};
use crate::forward::{Failure, Timeouts};
use crate::request::LastTry;
use crate::request::Trace;

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
        let (relayed, body) = {
            let mut client = ClientStream::new(self, respond, body.is_some());
            let (parts, out) = (Some(parts), &mut Vec::new());
            self.drive_h2(facts, parts, body, &mut client, out, trace)
                .await
        };
        match relayed {
            // An `auto` server chose HTTP/1.1: the stream goes there as HTTP/1.1.
            Ok(Relayed::Http1) => self.forward(body, respond, trace).await,
            Ok(Relayed::Over(result)) => result,
            Ok(Relayed::Stored(reply)) => self.reply_from_store(respond, *reply, trace).await,
            Err(failure) => Err(failure),
        }
    }

    /// The tries of the request to an HTTP/2 upstream (`forward::driver`) for a client
    /// of any protocol (`client`, its request `parts`, if it came as HTTP/2 fields, and
    /// its `body`), the response relayed to it; `out`: room for the HTTP/1.1 head a try's
    /// request is made from (and the client's head, for an HTTP/1.x client). Returns how
    /// the try that answered ended, and the body (for an `auto` server that chose
    /// HTTP/1.1).
    pub(crate) async fn drive_h2<C: ClientSide, B: ClientBody>(
        &self,
        facts: &H2Facts,
        parts: Option<Parts>,
        body: Option<B>,
        client: &mut C,
        out: &mut Vec<u8>,
        trace: &mut Trace,
    ) -> (Result<Relayed, Failure>, Option<B>) {
        let x = self.exchange_of();
        let mut last_try = LastTry::default();
        let mut sender = H2Sender {
            r: self,
            facts,
            parts,
            body,
            consumed: Cell::new(0),
            client,
            out,
            trace: &mut *trace,
            lines: self.response_lines.take(),
        };
        let relayed = drive(&x, &mut sender, self.request.started, &mut last_try).await;
        sender.trace.body_in = sender.consumed.get();
        let body = sender.body;
        self.response_lines.set(sender.lines);
        trace.last_try = last_try;
        (relayed.map(|(sent, _)| sent), body)
    }

    /// The upstream request: made from the client's request `client` when given (an
    /// HTTP/2 or HTTP/3 client's first one sent), else from the HTTP/1.1 head every
    /// request gets (written into `out`), as HTTP/2 fields. An upgrade (an HTTP/1.1
    /// client's WebSocket) cannot be carried to an HTTP/2-only server: 501.
    fn upstream_request(
        &self,
        facts: &H2Facts,
        server: &UpstreamServer,
        client: Option<Parts>,
        out: &mut Vec<u8>,
    ) -> Result<http::Request<()>, ProxyError> {
        let scheme = match self.target.upstream.tls {
            Some(_) => Scheme::HTTPS,
            None => Scheme::HTTP,
        };
        let id = self.target.listener.policy.request_id.as_ref();
        let unindexed = id.map(|i| i.header.as_bytes());
        let Some(parts) = client else {
            out.clear();
            // The head's length: an HTTP/1.x client's buffer also holds its body and any
            // pipelined request (`out` is the connection's, kept at its largest).
            out.reserve(self.request.req.head_len + 256);
            // The head carries a cache miss's conditions (`write_head`).
            if !self.write_head(out, server).is_empty() {
                return Err(ProxyError::NotImplemented(
                    "upgrade to an HTTP/2-only upstream",
                ));
            }
            return h1_head_to_h2(out, scheme, facts.te_trailers, unindexed);
        };
        let mut request = with_client_facts(&self.request, self.path, &self.target, |client| {
            let u = Upstream {
                buf: self.request.buf,
                req: self.request.req,
                path: self.path,
                route: self.target.route,
                server,
                client,
                scheme,
                te_trailers: facts.te_trailers,
            };
            upstream_request(parts, &u, &self.worker.h2_scratch)
        })?;
        // A cache miss's conditions (none: nothing to revalidate).
        self.with_fill(|fill| fill.push_conditional_fields(request.headers_mut()));
        Ok(request)
    }
}

/// How a relayed try ended.
pub(crate) enum Relayed {
    Over(Result<(), Failure>),
    /// A route cache's entry answers instead of the response (a `304` that refreshed it, a
    /// 5xx it answers for): the caller sends it.
    Stored(Box<crate::files::Reply>),
    /// `auto`, and the server chose HTTP/1.1 (ALPN).
    Http1,
}

/// A client's request body, uploaded to an HTTP/2 upstream: an HTTP/2 client's DATA, an
/// HTTP/3 client's (`http3::upstream`), an HTTP/1.x client's (`http2::from_http1`).
pub(crate) trait ClientBody {
    /// Sends the body up `up` (at most `limit` bytes), `consumed` above zero once any of
    /// it was taken from the client, and its trailer fields that the request head would
    /// carry (`names`; `forward::trailer`).
    fn upload(
        &mut self,
        up: &mut SendStream<Bytes>,
        consumed: &Cell<u64>,
        limit: Option<u64>,
        timeouts: Timeouts,
        names: HeadNames<'_>,
    ) -> impl Future<Output = Result<(), Broke>>;

    /// The whole body is at hand: it can be sent again whatever went.
    fn is_whole(&self) -> bool {
        false
    }
}

impl ClientBody for RecvStream {
    async fn upload(
        &mut self,
        up: &mut SendStream<Bytes>,
        consumed: &Cell<u64>,
        limit: Option<u64>,
        timeouts: Timeouts,
        names: HeadNames<'_>,
    ) -> Result<(), Broke> {
        let mut source = H2Source::new(self, timeouts.client, Peer::Client, consumed)
            .paced(timeouts.min_body_rate);
        source.limit = limit;
        upload(&mut source, up, timeouts.upstream, names).await
    }
}

/// A client while an HTTP/2 upstream answers it: an HTTP/2 client's stream
/// ([`ClientStream`]), an HTTP/3 client's (`http3::upstream`), an HTTP/1.x client's
/// connection (`http2::from_http1`), or none (`ForStore`: a background revalidation).
pub(crate) trait ClientSide {
    /// No client waits (a fetch for the store alone, `http2::filling::ForStore`): only a
    /// `304` that refreshes the entry answers instead of the response (a stale entry does
    /// not answer for a 5xx: nobody is answered), and the body is read only while the
    /// store takes it.
    const ALONE: bool = false;

    /// While the final head is awaited: where the upstream's 1xx heads go, and what ends
    /// when the client gives the request up (with the error the wait fails with).
    fn waiting(&mut self) -> (impl Interim + '_, impl Future<Output = ProxyError> + '_);

    /// Whether the wait ended as the client gave up (it reset the stream); a client that
    /// is not watched never does.
    fn was_reset(&self) -> bool {
        false
    }

    /// What the client asked that shapes the response's head (`end_stream`: the
    /// upstream's HEADERS ended its stream): an HTTP/2 or HTTP/3 client's by default.
    fn for_client(&self, r: &StreamRequest<'_>, end_stream: bool) -> ForClient {
        ForClient {
            is_head: r.request.req.is_head,
            http10: false,
            te_trailers: true,
            accepted: r.accepted(),
            end_stream,
            keep_alive: true,
        }
    }

    /// The bounds of the wait for the final head, from a stream's.
    fn bounds(&self, stream: HeadBounds) -> HeadBounds {
        stream
    }

    /// Edits the request before it goes (an `Expect` Weir answered itself is dropped).
    fn edit_request(&self, _request: &mut http::Request<()>) {}

    /// Once a server took the stream, before the body goes up.
    fn opened(&mut self) -> impl Future<Output = Result<(), ProxyError>> {
        std::future::ready(Ok(()))
    }

    /// The client has a 1xx head Weir sent itself (HTTP/1.x's `100 Continue`).
    fn responded(&self) -> bool {
        false
    }

    /// The client's stream, for an HTTP/2 or HTTP/3 client: the answer goes into it as
    /// any response does (`respond`). A side that writes the answer its own way (an
    /// HTTP/1.x client's connection, a fetch for the store) overrides `respond` and has
    /// none. `Err`: the stream cannot be answered any more.
    fn stream(&mut self) -> Result<&mut impl ResponseStream, Failure> {
        Err::<&mut SendResponse<Bytes>, _>(ProxyError::ClientClosed.into())
    }

    /// Sends the answer's head and relays its body (from `source`) and trailers,
    /// compressed through `coding` when there is one, while the rest of the request body
    /// (`upload`, if still going) goes up. Whatever fails once the head went out is
    /// `Reached::Head`, and cuts the client's stream short.
    fn respond<S: Source, U: Future<Output = Result<(), Broke>>>(
        &mut self,
        answer: Answer<'_>,
        source: &mut S,
        upload: Option<Pin<&mut U>>,
        coding: Option<&mut Coding>,
        trace: &mut Trace,
    ) -> impl Future<Output = Result<(), Failure>> {
        async move {
            let stream = self.stream()?;
            let mut head = head_from_h2(answer.parts, answer.edits);
            mark(&mut head, answer.cache_status);
            let grpc_status = trace.grpc_status_in(head.headers());
            // A head that ended the stream is all: nothing to relay, nor to wait for.
            let empty = answer.client.end_stream;
            let (source, upload) = (Some(source).filter(|_| !empty), upload.filter(|_| !empty));
            let sinking = Sinking {
                grpc_status,
                ..Sinking::of(answer.http2, answer.edits, trace)
            };
            let relay = stream.send_relayed(head, source, sinking, coding, None);
            // The head went out: whatever fails now (the upload included: a body over
            // `max_body_size`, a silent client) cuts that response short.
            let relayed = relay_while_uploading(upload, relay).await;
            relayed.map(|_| ()).map_err(|f: Failure| {
                stream.cut();
                Failure::after_head(f.error)
            })
        }
    }
}

impl ClientSide for ClientStream<'_> {
    fn waiting(&mut self) -> (impl Interim + '_, impl Future<Output = ProxyError> + '_) {
        let stream = &*self;
        (stream, stream.gone())
    }

    fn was_reset(&self) -> bool {
        self.reset.get()
    }

    fn stream(&mut self) -> Result<&mut impl ResponseStream, Failure> {
        Ok(&mut **self.respond.get_mut())
    }
}

/// Sends a stream's request as HTTP/2 streams, and relays the response and its trailers.
struct H2Sender<'s, 'c, C, B> {
    r: &'s StreamRequest<'s>,
    facts: &'s H2Facts,
    /// The client's request: the first try's is made from it.
    parts: Option<Parts>,
    body: Option<B>,
    /// Request body bytes taken from the client.
    consumed: Cell<u64>,
    client: &'c mut C,
    /// Room for a try's HTTP/1.1 head (and an HTTP/1.x client's head).
    out: &'c mut Vec<u8>,
    trace: &'c mut Trace,
    /// Room for the route's `response_headers` lines (`StreamRequest::response_lines`).
    lines: Vec<u8>,
}

impl<C: ClientSide, B> H2Sender<'_, '_, C, B> {
    /// How long each wait may take: for the client, and for the upstream (its
    /// `response_timeout`, capped by the client's `grpc-timeout`); and how the final head
    /// is awaited: within those, its 1xx heads relayed up to the route's bound. A gRPC
    /// request's body has no `min_body_rate`: a streaming call sends a message when the
    /// application has one (a bidirectional stream may send one a minute), as ASP.NET
    /// Core's gRPC lifts Kestrel's.
    fn waits(&self) -> (Timeouts, HeadBounds) {
        let mut timeouts = Timeouts::of(&self.r.target);
        if let Some(t) = self.facts.grpc_timeout {
            timeouts.upstream = timeouts.upstream.min(t);
        }
        if self.facts.grpc {
            timeouts.min_body_rate = None;
        }
        let bounds = self.client.bounds(HeadBounds {
            timeout: timeouts.upstream,
            deadline: self.facts.grpc_timeout,
            max_informational: self.r.informational_bound(),
            relay: true,
            tokens: false,
        });
        (timeouts, bounds)
    }
}

impl<C: ClientSide, B: ClientBody> Sender for H2Sender<'_, '_, C, B> {
    type Sent = Relayed;

    async fn send(&mut self, a: &Attempt<'_>, tries: &mut Tries<'_>) -> Result<Relayed, Miss> {
        let r = self.r;
        // Refused before anything went out (not expressible in HTTP/2): not the server's try.
        let request = r.upstream_request(self.facts, a.server, self.parts.take(), self.out);
        let mut request = request.map_err(Miss::unsent)?;
        self.client.edit_request(&mut request);
        let end = self.body.is_none();
        let Some((pending, mut up_send)) = open(tries.x, a, request, end).await? else {
            return Ok(Relayed::Http1);
        };
        self.client.opened().await?;
        let (timeouts, bounds) = self.waits();
        let limit = r.target.listener.max_body_size;
        let whole = self.body.as_ref().is_some_and(ClientBody::is_whole);
        let (body, consumed, up) = (self.body.as_mut(), &self.consumed, &mut up_send);
        let state = &mut if end { Upload::Done } else { Upload::Running };
        let names = HeadNames::of(&r.target, r.request.trace.is_some());
        let upload = async {
            let Some(body) = body else { return Ok(()) };
            body.upload(up, consumed, limit, timeouts, names).await
        };
        tokio::pin!(upload);
        let (mut interim, gone) = self.client.waiting();
        let waited = final_head(pending, upload.as_mut(), state, &mut interim, bounds, gone);
        let waited = waited.await;
        drop(interim);
        self.trace.reset |= self.client.was_reset();
        let (head, _lease) = waited?;
        let (parts, mut up_body) = head.into_parts();
        let status = parts.status.as_u16();
        let replayable = end || whole || consumed.get() == 0;
        let responded = r.relayed.any() || self.client.responded();
        tries.relays(status, replayable, responded)?;
        if let Some(reply) = r.answer_instead(Fetched::Http2(&parts), C::ALONE) {
            tries.count(a, Ok(status));
            return Ok(Relayed::Stored(Box::new(reply)));
        }
        let mut edits = r.edits(&mut self.lines, a.server);
        edits.cookie = tries.set_cookie();
        let client = self.client.for_client(r, up_body.is_end_stream());
        let coding = plan_h2(r.target.route, &parts, &client, &mut edits);
        tries.count(a, coding.as_ref().map(|_| status).map_err(|e| *e));
        let mut coding = match coding {
            Ok(coding) => coding,
            // The fill is still the request's: a stale entry may answer for this failure.
            Err(e) => return Ok(Relayed::Over(Err(e.into()))),
        };
        let (cache_status, mut recorder) = r.admission(Fetched::Http2(&parts));
        self.trace.status = status;
        // Nobody waits for a body the store does not take.
        if C::ALONE && recorder.is_none() {
            return Ok(Relayed::Over(Ok(())));
        }
        let answer = Answer {
            parts,
            client,
            edits: &edits,
            cache_status,
            http2: &r.target.listener.http2,
            upload_stopped: *state == Upload::Stopped,
            out: &mut *self.out,
        };
        let upload = (*state == Upload::Running).then_some(upload);
        let received = Cell::new(0);
        let mut source = H2Source::new(&mut up_body, timeouts.upstream, Peer::Upstream, &received);
        let mut recording = Recording {
            inner: &mut source,
            recorder: recorder.as_deref_mut(),
            stop_when_over: C::ALONE,
        };
        let relayed = self
            .client
            .respond(answer, &mut recording, upload, coding.as_mut(), self.trace)
            .await;
        self.trace.compressed = coding.as_ref().map(|c| c.counts);
        if let (Ok(()), Some(recorder)) = (&relayed, recorder) {
            recorder.finish();
        }
        Ok(Relayed::Over(relayed))
    }

    fn replayable(&self) -> bool {
        let whole = self.body.as_ref().is_none_or(ClientBody::is_whole);
        whole || self.consumed.get() == 0
    }

    fn responded(&self) -> bool {
        self.r.relayed.any() || self.client.responded()
    }
}

/// An HTTP/2 upstream's response on its way to the client: its head as it came, which
/// the client side writes with `edits`; its body is the relay's source.
pub(crate) struct Answer<'e> {
    pub parts: http::response::Parts,
    /// What the client asked that shapes the head (`end_stream`: no body follows).
    pub client: ForClient,
    pub edits: &'e Edits<'e>,
    /// A cache miss's `Cache-Status` value, if the client gets one.
    pub cache_status: Option<&'static str>,
    /// The listener's HTTP/2 settings (the client's window, the trailers' size; HTTP/3
    /// streams take the same).
    pub http2: &'e weir_config::Http2,
    /// The server stopped taking the request body before its end.
    pub upload_stopped: bool,
    /// Room for the head, for a client side that writes it as bytes.
    pub out: &'e mut Vec<u8>,
}

/// Sends a client's request body (`source`, and its trailer fields the request head
/// would carry: `names`) upstream within the upstream's window, the first piece at once
/// (`H2Upload`), each piece released by the source (to an HTTP/2 client's window)
/// once sent (`forward::relay`).
pub(crate) async fn upload<S: Source>(
    source: &mut S,
    up: &mut SendStream<Bytes>,
    timeout: Duration,
    names: HeadNames<'_>,
) -> Result<(), Broke> {
    let mut sink = H2Upload {
        send: up,
        timeout,
        first: true,
        names,
    };
    relay(source, &mut sink, None).await
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
