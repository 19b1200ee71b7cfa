//! A route cache's miss on an HTTP/2 or HTTP/3 client's stream, as for HTTP/1.x clients
//! (`proxy::forward::forward_filling`): answered from the entry another request is
//! fetching (collapsed forwarding) or a large disk entry read first; else forwarded, the
//! [`Fill`] in `StreamRequest::fill` for the exchange with the upstream, HTTP/1.1 or
//! HTTP/2 (its conditions in the upstream request, the response stored beside the
//! client's relay, or a stored entry answering instead of a `304` or a 5xx), and a stale
//! entry answering for a failure nothing was sent for. Every answer from the store is a
//! `files::Reply`, sent on the stream as a static file's (`respond_stream`). The same
//! exchange, with no client, revalidates a stale entry in the background
//! ([`StreamRequest::fetch_for_store`], `proxy::revalidate`).

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use h2::RecvStream;

use crate::buffer::Buffer;
use crate::cache::{CacheResult, Fetched, Fill, Recorder};
use crate::codec::http1::ResponseHead;
use crate::connector::UpstreamStream;
use crate::error::ProxyError;
use crate::files::{BodySource, Reply, Under};
use crate::forward::body::BodyState;
use crate::forward::driver::{drive, Accepted, Exchange};
use crate::forward::filling::stale_answer;
use crate::forward::h1::{Interim, NoInterim};
use crate::forward::head::ForClient;
use crate::forward::relay::{
    relay, Broke, Coding, Http1Source, Peer, Piece, Recording, Sink, Source, Trailers,
};
use crate::forward::{carrier, Carrier, Failure};
use crate::metrics::shard::Protocol;
use crate::request::LastTry;
use crate::time::LazyTimer;
use crate::worker::UPSTREAM_BUFFER;

use super::exchange::{StreamRequest, StreamSender};
use super::files::respond_stream;
use super::respond::ResponseStream;
use super::upstream::{Answer, ClientSide, H2Facts, Relayed};
use crate::request::Trace;

impl StreamRequest<'_> {
    /// Before a route cache's miss (`fill`, if the route has `cache`) is forwarded: the
    /// answer, if the store has one now (another request's fetch, a large disk entry
    /// read); else the fill is kept for the exchange with the upstream and `None`:
    /// forward it ([`StreamRequest::after_forward`] once it is over).
    pub(crate) async fn before_forward<R: ResponseStream>(
        &self,
        fill: Option<Box<Fill>>,
        respond: &mut R,
        trace: &mut Trace,
    ) -> Option<Result<(), Failure>> {
        let mut fill = fill?;
        // Boxed: a route without `cache` keeps the stream's state as before.
        Box::pin(async move {
            trace.cache = Some(CacheResult::Miss);
            let Some(reply) = fill.collapse().await else {
                self.fill.set(Some(fill));
                return None;
            };
            Some(self.reply_from_store(respond, reply, trace).await)
        })
        .await
    }

    /// Sends `reply`, an answer from the store, on the client's stream.
    pub(crate) async fn reply_from_store<R: ResponseStream>(
        &self,
        respond: &mut R,
        reply: Reply,
        trace: &mut Trace,
    ) -> Result<(), Failure> {
        let under = Under::of_target(&self.target);
        respond_stream(respond, &self.request, self.path, under, reply, trace).await
    }

    /// After the exchange (`result`) with a miss's fill still unused
    /// ([`StreamRequest::before_forward`]): a failure nothing was sent for is answered from
    /// the stale entry when it may be (`stale-if-error`, `serve_stale_on`).
    pub(crate) async fn after_forward<R: ResponseStream>(
        &self,
        result: Result<(), Failure>,
        respond: &mut R,
        trace: &mut Trace,
    ) -> Result<(), Failure> {
        // The fill (its key's lock) is held until the stale answer is sent.
        let fill = self.fill.take();
        match stale_answer(fill.as_deref(), &result) {
            // Boxed: a route without `cache` keeps the stream's state as before.
            Some(reply) => Box::pin(self.reply_from_store(respond, reply, trace)).await,
            None => result,
        }
    }

    /// Runs `f` on the miss's fill, if there is one, which stays the request's (its
    /// stale entry's conditions, for the upstream request).
    #[inline]
    pub(crate) fn with_fill(&self, f: impl FnOnce(&Fill)) {
        if let Some(fill) = self.fill.take() {
            f(&fill);
            self.fill.set(Some(fill));
        }
    }

    /// The stored entry that answers instead of the upstream's response `resp`, over
    /// either carrier (`Fill::answer_instead`: a `304` that refreshed it, a 5xx it answers
    /// for unless no client waits: `alone`). `None`: the response is relayed, the fill
    /// kept for it.
    pub(crate) fn answer_instead(&self, resp: Fetched<'_>, alone: bool) -> Option<Reply> {
        let fill = self.fill.take()?;
        let reply = fill.answer_instead(resp, alone);
        if reply.is_none() {
            self.fill.set(Some(fill));
        }
        reply
    }

    /// The `Cache-Status` value of the upstream's response `resp` (for the client's head:
    /// [`mark`]), and its recorder if the miss may store it.
    pub(crate) fn admission(
        &self,
        resp: Fetched<'_>,
    ) -> (Option<&'static str>, Option<Box<Recorder>>) {
        let Some(fill) = self.fill.take() else {
            return (None, None);
        };
        // A stream's body pieces come decoded (`BodyState::new(.., true, ..)`), an HTTP/2
        // upstream's as DATA.
        (fill.status_value(), fill.admit(resp, true))
    }

    /// Fetches the key of the fill for the store alone, no client waiting (a stale entry's
    /// revalidation in the background): the driver's tries to the upstream, over the
    /// carrier an HTTP/1.x client's request takes (`forward::carrier`: an HTTP/1.1
    /// connection, or an HTTP/2 stream through the one sender with no client,
    /// [`ForStore`]), then a `304` refreshes the entry, or the response is stored if it
    /// may be (its body read to its end); anything else leaves the entry as it is.
    pub(crate) async fn fetch_for_store(&self) {
        let fetched = match carrier(Protocol::Http1, self.target.upstream) {
            Carrier::Http1 => self.fetch_over_http1().await,
            Carrier::Http2 => self.fetch_over_h2().await,
        };
        if let Err(e) = fetched {
            tracing::debug!(error = %e, "cache: background revalidation failed");
        }
    }

    /// [`StreamRequest::fetch_for_store`] toward an HTTP/2 upstream: `http2::upstream`'s
    /// sender, its response relayed to [`ForStore`].
    async fn fetch_over_h2(&self) -> Result<(), ProxyError> {
        let (out, trace, store) = (&mut Vec::new(), &mut Trace::default(), &mut ForStore);
        let facts = H2Facts::default();
        let tried = self.drive_h2(&facts, None, None::<RecvStream>, store, out, trace);
        match tried.await.0 {
            Ok(Relayed::Over(relayed)) => relayed.map_err(|f| f.error),
            // A refreshed entry (nobody to answer with it); `auto` never comes here.
            Ok(Relayed::Stored(_) | Relayed::Http1) => Ok(()),
            Err(failure) => Err(failure.error),
        }
    }

    /// [`StreamRequest::fetch_for_store`] toward an HTTP/1.1 upstream.
    async fn fetch_over_http1(&self) -> Result<(), ProxyError> {
        let up_buf = &mut Buffer::new(UPSTREAM_BUFFER);
        let resp = &mut ResponseHead::default();
        let x = self.exchange_of();
        let (started, last_try) = (self.request.started, &mut LastTry::default());
        let tried = self.try_alone(&x, None, up_buf, resp, started, last_try);
        let (mut stream, request_done, accepted) = tried.await.map_err(|f| f.error)?;
        // A 304 refreshes the entry (a 5xx leaves it as it is: nobody is answered).
        let fetched = Fetched::Http1(up_buf.filled(), resp);
        if self.answer_instead(fetched, true).is_some() {
            accepted.pool_after_answer(stream, resp, up_buf, request_done);
            return Ok(());
        }
        let (_, Some(mut recorder)) = self.admission(Fetched::Http1(up_buf.filled(), resp)) else {
            return Ok(());
        };
        up_buf.consume(resp.head_len);
        let state = BodyState::new(resp.framing, true, None);
        let timeout = self.target.upstream.response_timeout;
        let mut source = Http1Source::new(&mut stream, up_buf, state, timeout, Peer::Upstream);
        // Nobody waits for the rest of a body the store does not take.
        let mut recording = Recording {
            inner: &mut source,
            recorder: Some(&mut recorder),
            stop_when_over: true,
        };
        discard(&mut recording).await?;
        recorder.finish();
        accepted.reuse(stream, resp, up_buf, request_done, false);
        Ok(())
    }

    /// The tries to an HTTP/1.1 upstream of a request with no body and no client stream
    /// waiting for 1xx heads (a WebSocket handshake, with its `websocket_key`; a background
    /// revalidation). Rare: its buffers and timer are its own. Counts the accepted try.
    pub(super) async fn try_alone<'x>(
        &'x self,
        x: &'x Exchange<'x>,
        websocket_key: Option<&[u8]>,
        up_buf: &mut Buffer,
        resp: &mut ResponseHead,
        started: Instant,
        last_try: &mut LastTry,
    ) -> Result<(UpstreamStream, bool, Accepted<'x>), Failure> {
        let mut timer = LazyTimer::new(tokio::time::Instant::now());
        let mut sender = StreamSender {
            r: self,
            body: None::<BodySource<'static>>,
            up_buf,
            out: &mut Vec::with_capacity(self.request.buf.len() + 256),
            resp,
            timer: &mut timer,
            interim: NoInterim,
            websocket_key,
        };
        let tried = drive(x, &mut sender, started, last_try).await?;
        let ((stream, request_done), accepted) = tried;
        accepted.count(Ok(sender.resp.status));
        Ok((stream, request_done, accepted))
    }
}

/// Adds the `Cache-Status` value `status` (if any) to the client's `head`.
#[inline]
pub(crate) fn mark(head: &mut http::Response<()>, status: Option<&'static str>) {
    if let Some(value) = status {
        let value = http::HeaderValue::from_static(value);
        head.headers_mut().append("cache-status", value);
    }
}

/// Reads `source` to its end into [`ForStore`] (a fetch for the store alone: its recorder
/// keeps the bytes).
async fn discard<S: Source>(source: &mut S) -> Result<(), ProxyError> {
    let relayed = relay(source, &mut ForStore, None).await;
    relayed.map_err(|(Broke::Source(e) | Broke::Sink(e))| e)
}

/// No client: the side an HTTP/2 upstream's response goes to when it is fetched for the
/// store alone (`StreamRequest::fetch_for_store`). It takes no 1xx, never goes away,
/// asks for no coding, and its body is read into nothing (this sink drops every piece)
/// through the fill's recorder.
pub(crate) struct ForStore;

impl Sink for ForStore {
    async fn data(&mut self, _: Piece<'_>, _: bool) -> Result<(), ProxyError> {
        Ok(())
    }

    async fn end(&mut self, _: Trailers<'_>) -> Result<(), ProxyError> {
        Ok(())
    }
}

impl ClientSide for ForStore {
    const ALONE: bool = true;

    fn waiting(&mut self) -> (impl Interim + '_, impl Future<Output = ProxyError> + '_) {
        (NoInterim, std::future::pending())
    }

    fn for_client(&self, _: &StreamRequest<'_>, end_stream: bool) -> ForClient {
        ForClient {
            is_head: false,
            http10: false,
            te_trailers: false,
            accepted: None,
            end_stream,
            keep_alive: true,
        }
    }

    async fn respond<S: Source, U: Future<Output = Result<(), Broke>>>(
        &mut self,
        _: Answer<'_>,
        source: &mut S,
        _: Option<Pin<&mut U>>,
        _: Option<&mut Coding>,
        _: &mut Trace,
    ) -> Result<(), Failure> {
        discard(source).await.map_err(Failure::after_head)
    }
}
