//! One relay loop for every body, each way: a request's from the client to the upstream, a
//! response's back. A body comes from an HTTP/1.1 message over a socket and its buffer
//! ([`Http1Source`]: its framing kept, or decoded), from HTTP/2 DATA ([`H2Source`]), from
//! HTTP/3 DATA (`http3::body::H3Source`) or from a file or a cache entry
//! (`files::body::BodySource`), and goes to an HTTP/1.1 writer ([`Http1Sink`]: as it came,
//! or chunked), out as HTTP/2 DATA (`http2::send` for a client's stream, [`H2Upload`] for
//! an upstream's) or as HTTP/3 DATA (`http3::body::H3Sink`); a cache miss's copy is kept
//! beside the client's sink ([`Recording`]). A response may be compressed on the way
//! ([`relay`] with an `Encoder`).
//!
//! A source hands out one piece at a time and releases it only once the sink took it (an
//! HTTP/1.1 buffer is consumed, an HTTP/2 window given back), so a slow sink slows the
//! source and nothing else waits in Weir. Trailer fields follow the body where both sides
//! carry them ([`Trailers`]).

use std::future::{poll_fn, Future};
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http::HeaderMap;
use tokio::io::{AsyncRead, AsyncWrite};

use super::body::{self, BodyState, ChunkLine, PumpError};
use super::request_head::HeadNames;
use super::trailer;
use crate::buffer::Buffer;
use crate::cache::Recorder;
use crate::codec::http1::{BodyFraming, ResponseHead};
use crate::connector::h2::h2_error;
use crate::error::ProxyError;
use crate::filters::compression::{Compressed, Encoder};
use crate::time::{paced, with_timeout, Continued, Pace, Waited};
use weir_config::MinBodyRate;

/// A piece of a body: bytes in a buffer, or an HTTP/2 DATA payload (sent on without a copy).
pub(crate) enum Piece<'a> {
    Slice(&'a [u8]),
    Bytes(Bytes),
}

impl Piece<'_> {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Piece::Slice(s) => s,
            Piece::Bytes(b) => b,
        }
    }

    /// The piece as `Bytes`: a DATA payload as it is, buffer bytes copied.
    pub fn into_bytes(self) -> Bytes {
        match self {
            Piece::Slice(s) => Bytes::copy_from_slice(s),
            Piece::Bytes(b) => b,
        }
    }
}

/// What follows a body.
pub(crate) enum Trailers<'a> {
    None,
    /// An HTTP/1.1 chunked body's trailer field lines (each ending in CRLF).
    Lines(&'a [u8]),
    /// An HTTP/2 trailing HEADERS frame.
    Fields(HeaderMap),
}

/// A side of the exchange, the one a body comes from or goes to: says what its failures
/// are (a read's, or a write's to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peer {
    Client,
    Upstream,
}

impl Peer {
    /// `e` as this side's error. Out of line: only a failure calls it, and the writers'
    /// usual path costs about 15 fewer of Weir's own instructions per proxied HTTP/1.1
    /// request than with a mapping inlined in each (`bench/instructions.sh`).
    #[cold]
    #[inline(never)]
    pub fn error(self, e: PumpError) -> ProxyError {
        use PumpError::*;
        match (self, e) {
            (Peer::Client, ReadTimeout | WriteTimeout) => ProxyError::ClientTimeout,
            (Peer::Client, Framing(reason)) => ProxyError::BadRequest(reason),
            (Peer::Client, TooLarge) => ProxyError::BodyTooLarge,
            (Peer::Client, Read(kind)) => ProxyError::ClientIo(kind),
            (Peer::Client, Truncated | Write(_)) => ProxyError::ClientClosed,
            (Peer::Upstream, ReadTimeout | WriteTimeout) => ProxyError::UpstreamTimeout,
            (Peer::Upstream, Framing(reason)) => ProxyError::UpstreamMalformed(reason),
            (Peer::Upstream, TooLarge) => ProxyError::UpstreamMalformed("body too large"),
            (Peer::Upstream, Read(kind)) => ProxyError::UpstreamIo(kind),
            (Peer::Upstream, Write(kind)) => ProxyError::upstream_io(kind.into()),
            (Peer::Upstream, Truncated) => ProxyError::UpstreamClosed,
        }
    }
}

/// Where a body comes from.
pub(crate) trait Source {
    /// The next piece, and whether the body ends with it with no trailers after it;
    /// `None`: the body is over.
    fn next(&mut self) -> impl Future<Output = Result<Option<(Piece<'_>, bool)>, ProxyError>>;

    /// The sink took the last piece: its bytes are released.
    fn taken(&mut self);

    /// The trailer fields after the body.
    fn trailers(&mut self) -> impl Future<Output = Result<Trailers<'_>, ProxyError>>;

    /// The whole body as one last piece, when it is all at hand (`Http1Source::prime`
    /// found it) and no trailers follow ([`Source::taken`] once sent); `None` otherwise.
    fn whole(&mut self) -> Option<Piece<'_>> {
        None
    }
}

/// Where a body goes.
pub(crate) trait Sink {
    /// Sends `piece`; `last`: the body ends with it, no trailers follow.
    fn data(
        &mut self,
        piece: Piece<'_>,
        last: bool,
    ) -> impl Future<Output = Result<(), ProxyError>>;

    /// Ends the body, with its trailers where the sink carries them.
    fn end(&mut self, trailers: Trailers<'_>) -> impl Future<Output = Result<(), ProxyError>>;

    /// Ready when the sink's peer went away while the source is awaited (an HTTP/2
    /// client's reset); the others are not watched.
    fn poll_gone(&mut self, _: &mut Context<'_>) -> Poll<ProxyError> {
        Poll::Pending
    }
}

/// Why a relay stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Broke {
    /// Reading the body failed (or the compressor did).
    Source(ProxyError),
    /// Sending it on failed.
    Sink(ProxyError),
}

impl From<ProxyError> for Broke {
    /// A failure of the body's other half (an upload's, while a response is relayed).
    fn from(error: ProxyError) -> Broke {
        Broke::Source(error)
    }
}

/// A response's compression on the way: the encoder, its coding and byte counts.
pub(crate) struct Coding {
    pub encoder: Encoder,
    pub counts: Compressed,
}

/// A compressor that failed: the server's response cannot go out as planned (502).
pub(crate) const COMPRESSOR_FAILED: ProxyError = ProxyError::UpstreamMalformed("compressor failed");

/// Moves the body from `source` to `sink` until its end (and trailers), each piece through
/// `coding` when the response is compressed: encoded and flushed, so nothing waits for
/// more input.
pub(crate) async fn relay<S: Source, K: Sink>(
    source: &mut S,
    sink: &mut K,
    mut coding: Option<&mut Coding>,
) -> Result<(), Broke> {
    if coding.is_none() {
        // The usual small response, all of it at hand: one piece, without the rounds.
        if let Some(piece) = source.whole() {
            sink.data(piece, true).await.map_err(Broke::Sink)?;
            source.taken();
            return Ok(());
        }
    }
    loop {
        let next = {
            let mut next = std::pin::pin!(source.next());
            poll_fn(|cx| match sink.poll_gone(cx) {
                Poll::Ready(e) => Poll::Ready(Err(Broke::Sink(e))),
                Poll::Pending => next.as_mut().poll(cx).map(|r| r.map_err(Broke::Source)),
            })
            .await?
        };
        let Some((piece, last)) = next else {
            break;
        };
        match coding.as_deref_mut() {
            None => sink.data(piece, last).await.map_err(Broke::Sink)?,
            Some(c) => c.send(piece.as_slice(), last, sink).await?,
        }
        source.taken();
        if last {
            return Ok(());
        }
    }
    if let Some(c) = coding {
        c.send(&[], false, sink).await?;
    }
    let trailers = source.trailers().await.map_err(Broke::Source)?;
    sink.end(trailers).await.map_err(Broke::Sink)
}

impl Coding {
    /// Encodes `data` (the encoder's end too when `data` is the last or empty), and sends
    /// what came out.
    async fn send<K: Sink>(&mut self, data: &[u8], last: bool, sink: &mut K) -> Result<(), Broke> {
        let failed = |_| Broke::Source(COMPRESSOR_FAILED);
        if !data.is_empty() {
            self.encoder.feed(data).map_err(failed)?;
            self.counts.bytes_in += data.len() as u64;
        }
        if last || data.is_empty() {
            self.encoder.finish().map_err(failed)?;
        }
        let out = self.encoder.output();
        self.counts.bytes_out += out.len() as u64;
        let sent = match out.is_empty() && !last {
            true => Ok(()),
            false => sink.data(Piece::Slice(out), last).await,
        };
        self.encoder.output().clear();
        sent.map_err(Broke::Sink)
    }
}

/// The length of an uncompressed Content-Length body that is all in `up_buf` (after its
/// head), if it is one: nothing to frame, so nothing to check before it goes out.
pub(crate) fn at_hand(
    encoding: Option<weir_config::Encoding>,
    resp: &ResponseHead,
    up_buf: &Buffer,
) -> Option<usize> {
    match (encoding, resp.framing) {
        (None, BodyFraming::Length(n)) if n <= up_buf.len() as u64 => Some(n as usize),
        _ => None,
    }
}

/// A source whose pieces are also kept by a cache's recorder: the store's copy beside
/// the client's sink (a miss's response on its way to the client), or the only one (a
/// background revalidation's fetch). Without a recorder, the source as it is.
pub(crate) struct Recording<'r, S> {
    pub inner: &'r mut S,
    pub recorder: Option<&'r mut Recorder>,
    /// The body ends with an error once it passes what the store takes: no client waits
    /// for the rest (a fetch for the store alone drops the upstream connection then, not
    /// reading a body of any size to its end). Else the rest streams on, unrecorded.
    pub stop_when_over: bool,
}

/// The error a [`Recording`] that stops when over ends with (only logged: nobody is
/// answered).
const OVER_MAX_OBJECT_SIZE: ProxyError = ProxyError::UpstreamMalformed("body over max_object_size");

impl<S: Source> Source for Recording<'_, S> {
    async fn next(&mut self) -> Result<Option<(Piece<'_>, bool)>, ProxyError> {
        let next = self.inner.next().await?;
        if let (Some((piece, _)), Some(recorder)) = (&next, self.recorder.as_deref_mut()) {
            recorder.record(piece.as_slice());
            if self.stop_when_over && recorder.is_over() {
                return Err(OVER_MAX_OBJECT_SIZE);
            }
        }
        Ok(next)
    }

    fn taken(&mut self) {
        self.inner.taken();
    }

    async fn trailers(&mut self) -> Result<Trailers<'_>, ProxyError> {
        let trailers = self.inner.trailers().await?;
        if let (Trailers::Lines(_), Some(recorder)) = (&trailers, self.recorder.as_deref_mut()) {
            // A chunked body passed through stops before its trailer section (which is
            // not stored): the recorded one gets its end.
            recorder.end_chunks();
        }
        Ok(trailers)
    }

    fn whole(&mut self) -> Option<Piece<'_>> {
        let piece = self.inner.whole()?;
        if let Some(recorder) = self.recorder.as_deref_mut() {
            recorder.record(piece.as_slice());
        }
        Some(piece)
    }
}

/// An HTTP/1.1 message body over a socket (`stream`), read through `buf` (which may hold
/// body bytes already) as `state` frames it.
pub(crate) struct Http1Source<'b, R> {
    pub stream: &'b mut R,
    pub buf: &'b mut Buffer,
    pub state: BodyState,
    /// For each read.
    pub timeout: Duration,
    pub from: Peer,
    /// A client's request body: its `min_body_rate`.
    pace: Option<Pace>,
    /// Bytes of `buf` the last piece used, and sends on.
    used: usize,
    used_forward: usize,
    /// The last piece was handed out.
    ended: bool,
    /// A piece framed by `prime`, not handed out yet: its length.
    primed: Option<usize>,
    /// The head's `Connection` values that name fields, whose trailer fields are dropped
    /// (`trailer::connection_listed`; empty: none).
    pub listed: Vec<u8>,
    /// The first piece's bytes as `Bytes` (the copy of what arrived with the head), for a
    /// sink that takes `Bytes`; only for a body whose bytes are not decoded in place.
    pub first: Option<Bytes>,
}

impl<'b, R> Http1Source<'b, R> {
    pub fn new(
        stream: &'b mut R,
        buf: &'b mut Buffer,
        state: BodyState,
        timeout: Duration,
        from: Peer,
    ) -> Self {
        Http1Source {
            stream,
            buf,
            state,
            timeout,
            from,
            pace: None,
            used: 0,
            used_forward: 0,
            ended: false,
            primed: None,
            listed: Vec::new(),
            first: None,
        }
    }

    /// Holds the body to the listener's `min_body_rate` (a client's request body); a
    /// client that waits for a 100 (the upstream's or Weir's, marked in `continued`) is
    /// not held to it before its first body byte (`Pace::after_continue`).
    pub fn paced(mut self, rate: Option<MinBodyRate>, continued: Option<Rc<Continued>>) -> Self {
        self.pace = rate.map(|rate| Pace::new(rate).after_continue(continued));
        self
    }
}

impl<R: AsyncRead + Unpin> Source for Http1Source<'_, R> {
    async fn next(&mut self) -> Result<Option<(Piece<'_>, bool)>, ProxyError> {
        if let Some(forward) = self.primed.take() {
            return Ok(Some(self.piece(forward)));
        }
        loop {
            if self.ended {
                return Ok(None);
            }
            if !self.buf.is_empty() && self.frame()? {
                return Ok(Some(self.piece(self.used_forward)));
            }
            if self.state.is_done() {
                return Ok(None);
            }
            // The bytes read next are not those `first` holds.
            self.first = None;
            if !self.read_more().await? {
                return Ok(None);
            }
        }
    }

    fn taken(&mut self) {
        self.buf.consume(std::mem::take(&mut self.used));
    }

    async fn trailers(&mut self) -> Result<Trailers<'_>, ProxyError> {
        if self.state.trailers().is_empty() {
            return Ok(Trailers::None);
        }
        if !self.listed.is_empty() {
            self.state.drop_listed(&self.listed);
        }
        // Lines even when none is left: a body passed through still needs its end.
        Ok(Trailers::Lines(self.state.trailers()))
    }

    fn whole(&mut self) -> Option<Piece<'_>> {
        if !self.ended || !self.state.trailers().is_empty() {
            return None;
        }
        let forward = self.primed.take()?;
        Some(self.piece(forward).0)
    }
}

impl<R: AsyncRead + Unpin> Http1Source<'_, R> {
    /// Frames the body bytes already at hand (a response's that came with its head), so
    /// that a framing error there is found before any of the response is sent. Returns
    /// whether the whole body is at hand.
    pub fn prime(&mut self) -> Result<bool, ProxyError> {
        if !self.buf.is_empty() && self.frame()? {
            self.primed = Some(self.used_forward);
        }
        Ok(self.state.is_done())
    }

    /// Waits until body bytes are at hand, reading once if the buffer has none: until
    /// then nothing of the body is framed or consumed (its request can still go again).
    pub async fn arrival(&mut self) -> Result<(), ProxyError> {
        if self.buf.is_empty() && !self.state.is_done() {
            self.read_more().await?;
        }
        Ok(())
    }

    /// Reads more of the body into `buf`. False: the body ended with the stream
    /// (`UntilClose`).
    async fn read_more(&mut self) -> Result<bool, ProxyError> {
        let read = paced(
            self.pace.as_mut(),
            self.timeout,
            self.buf.read_from(self.stream),
        )
        .await;
        let error = match read {
            Ok(Ok(n)) if n > 0 => {
                if let Some(pace) = &mut self.pace {
                    pace.add(n);
                }
                return Ok(true);
            }
            Err(Waited::TooSlow) => return Err(ProxyError::BodyTooSlow),
            Err(Waited::Timeout) => PumpError::ReadTimeout,
            Ok(Err(e)) => PumpError::Read(e.kind()),
            Ok(Ok(_)) if self.buf.is_full() => PumpError::Framing("chunk line too long"),
            Ok(Ok(_)) if self.state.on_eof() => return Ok(false),
            Ok(Ok(_)) => PumpError::Truncated,
        };
        Err(self.from.error(error))
    }
}

impl<R> Http1Source<'_, R> {
    /// Frames the bytes at the start of `buf`. True: a piece is ready (`used_forward` of
    /// them to send, `used` to consume once taken); false: they were all framing, consumed.
    fn frame(&mut self) -> Result<bool, ProxyError> {
        let taken = self.state.take(self.buf.filled_mut());
        let (forward, used) = taken.map_err(|e| self.from.error(e))?;
        let done = self.state.is_done();
        if forward > 0 || done {
            (self.used, self.used_forward) = (used, forward);
            self.ended = done;
            return Ok(true);
        }
        self.buf.consume(used);
        Ok(false)
    }

    /// The framed piece of `forward` bytes, and whether it ends the body.
    #[inline]
    fn piece(&mut self, forward: usize) -> (Piece<'_>, bool) {
        let last = self.ended && self.state.trailers().is_empty();
        let piece = match self.first.take() {
            Some(first) => Piece::Bytes(first.slice(..forward)),
            None => Piece::Slice(&self.buf.filled()[..forward]),
        };
        (piece, last)
    }
}

/// HTTP/2 DATA of a stream, each payload's window given back once the sink took it.
pub(crate) struct H2Source<'b> {
    pub body: &'b mut RecvStream,
    /// For each DATA frame.
    pub timeout: Duration,
    pub from: Peer,
    /// Bytes taken so far (a client's body: at most `limit`).
    pub total: &'b std::cell::Cell<u64>,
    pub limit: Option<u64>,
    /// A client's request body: its `min_body_rate`.
    pace: Option<Pace>,
    /// The last payload's length, released once taken.
    held: usize,
}

impl<'b> H2Source<'b> {
    pub fn new(
        body: &'b mut RecvStream,
        timeout: Duration,
        from: Peer,
        total: &'b std::cell::Cell<u64>,
    ) -> Self {
        H2Source {
            body,
            timeout,
            from,
            total,
            limit: None,
            pace: None,
            held: 0,
        }
    }

    /// Holds the body to the listener's `min_body_rate` (a client's request body).
    pub fn paced(mut self, rate: Option<MinBodyRate>) -> Self {
        self.pace = rate.map(Pace::new);
        self
    }

    fn error(&self, e: h2::Error) -> ProxyError {
        match self.from {
            Peer::Client => ProxyError::ClientClosed,
            Peer::Upstream => h2_error(&e),
        }
    }
}

impl Source for H2Source<'_> {
    async fn next(&mut self) -> Result<Option<(Piece<'_>, bool)>, ProxyError> {
        loop {
            let data = match paced(self.pace.as_mut(), self.timeout, self.body.data()).await {
                Err(Waited::TooSlow) => return Err(ProxyError::BodyTooSlow),
                Err(Waited::Timeout) => return Err(self.from.error(PumpError::ReadTimeout)),
                Ok(None) => return Ok(None),
                Ok(Some(Err(e))) => return Err(self.error(e)),
                Ok(Some(Ok(data))) => data,
            };
            self.total.set(self.total.get() + data.len() as u64);
            if self.limit.is_some_and(|max| self.total.get() > max) {
                return Err(ProxyError::BodyTooLarge);
            }
            if let Some(pace) = &mut self.pace {
                pace.add(data.len());
            }
            let last = self.body.is_end_stream();
            // Never an empty piece but the last: it would end an HTTP/1.1 chunked body.
            if data.is_empty() && !last {
                continue;
            }
            self.held = data.len();
            return Ok(Some((Piece::Bytes(data), last)));
        }
    }

    fn taken(&mut self) {
        // Only now may the peer send more: its pace is the sink's.
        let _ = self.body.flow_control().release_capacity(self.held);
    }

    async fn trailers(&mut self) -> Result<Trailers<'_>, ProxyError> {
        match with_timeout(self.timeout, self.body.trailers()).await {
            Err(_) => Err(self.from.error(PumpError::ReadTimeout)),
            Ok(Err(e)) => Err(self.error(e)),
            Ok(Ok(Some(fields))) => Ok(Trailers::Fields(fields)),
            Ok(Ok(None)) => Ok(Trailers::None),
        }
    }
}

/// An HTTP/1.1 writer: the body as it came (its framing is already in its bytes, or it
/// ends with the connection), or chunked. `head` goes out with the first bytes. A chunked
/// body that passes through as it came stops before its trailer section
/// ([`BodyState::keeping_trailers`]): the sink writes the section, re-written, and its end.
pub(crate) struct Http1Sink<'w, W> {
    pub writer: &'w mut W,
    /// For each write.
    pub timeout: Duration,
    /// Bytes written, the head's included.
    pub sent: &'w mut u64,
    /// Written before the body (with its first bytes); emptied once written.
    pub head: &'w [u8],
    /// The body is chunked here (each piece one chunk, whole: nothing waits for more).
    pub chunked: bool,
    /// Trailer fields go into the chunked body's trailer section, less those no trailer
    /// may carry (`forward::trailer`) and the names this says its peer's head lost: a
    /// response's `Edits::drops`, a request's `trailer::request_drops` (an HTTP/2
    /// or HTTP/3 client's: the names `HeadNames::forwards` does not) (`None`: none go).
    pub trailers: Option<Dropped<'w>>,
}

/// Which trailer field names (any case) stay out, besides those no trailer may carry.
pub(crate) type Dropped<'w> = &'w dyn Fn(&[u8]) -> bool;

impl<W: AsyncWrite + Unpin> Http1Sink<'_, W> {
    /// Writes `parts` after the head if it is still due.
    async fn write(&mut self, parts: [&[u8]; 3]) -> Result<(), ProxyError> {
        let head = std::mem::take(&mut self.head);
        let all = [head, parts[0], parts[1], parts[2]];
        let written = body::write_parts(self.writer, all, self.timeout);
        written.await.map_err(|e| Peer::Client.error(e))?;
        *self.sent += all.iter().map(|p| p.len() as u64).sum::<u64>();
        Ok(())
    }
}

impl<W: AsyncWrite + Unpin> Sink for Http1Sink<'_, W> {
    async fn data(&mut self, piece: Piece<'_>, last: bool) -> Result<(), ProxyError> {
        let data = piece.as_slice();
        if data.is_empty() {
            return match (last, self.head.is_empty()) {
                (true, _) => self.end(Trailers::None).await,
                (false, true) => Ok(()),
                // Nothing to send yet but the head: it goes now.
                (false, false) => self.write([&[], &[], &[]]).await,
            };
        }
        if !self.chunked {
            return self.write([data, &[], &[]]).await;
        }
        self.write([ChunkLine::new(data.len()).get(), data, b"\r\n"])
            .await?;
        match last {
            true => self.end(Trailers::None).await,
            false => Ok(()),
        }
    }

    async fn end(&mut self, trailers: Trailers<'_>) -> Result<(), ProxyError> {
        let chunked = std::mem::take(&mut self.chunked);
        // A chunked body passed through as it came: its section and end were held back.
        let held = !chunked && matches!(trailers, Trailers::Lines(_));
        if !chunked && !held {
            return match self.head.is_empty() {
                true => Ok(()),
                false => self.write([&[], &[], &[]]).await,
            };
        }
        let section = match trailers {
            Trailers::None => Vec::new(),
            _ => self.section(&trailers),
        };
        let last_chunk: &[u8] = if chunked { b"0\r\n" } else { b"" };
        self.write([last_chunk, &section, b"\r\n"]).await
    }
}

impl<W> Http1Sink<'_, W> {
    /// The trailer section this sink writes for `trailers`, as HTTP/1.1 field lines.
    #[cold]
    fn section(&self, trailers: &Trailers<'_>) -> Vec<u8> {
        let mut lines = Vec::new();
        let Some(drops) = self.trailers else {
            return lines;
        };
        match trailers {
            Trailers::None => {}
            Trailers::Lines(raw) => {
                trailer::push_lines(&mut lines, raw, drops);
            }
            Trailers::Fields(fields) => {
                let dropped =
                    |name: &str| !trailer::relayed(name.as_bytes()) || drops(name.as_bytes());
                super::head::push_fields(&mut lines, fields, dropped);
            }
        }
        lines
    }
}

/// The first DATA of a request up to this size goes upstream without waiting for the
/// stream's window ([`H2Upload`]). Small (a gRPC call's message usually fits), as it is
/// released to the client's window before h2 sent it: at most this much per stream (128
/// KiB per connection at the default `max_concurrent_streams`) waits in Weir beyond the
/// client's windows.
const EAGER_FIRST_PIECE: usize = 1024;

/// An HTTP/2 upstream stream's request DATA, each piece sent within the stream's window
/// (h2 would buffer the rest, so waiting for the window is what bounds memory per
/// stream), then the client's trailer fields (an HTTP/1.1 client's chunked trailer
/// section made into fields).
///
/// The first piece, if no larger than [`EAGER_FIRST_PIECE`], is handed to h2 at once
/// (`first`). A new stream has no window before the connection task has sent its
/// HEADERS, so waiting for it cost every small request (a gRPC call) a timer and a
/// second poll of its task; h2 holds that one piece until the window opens, and the next
/// piece waits for window as usual (h2 counts what it holds), so a stream still holds at
/// most this much more than its window.
pub(crate) struct H2Upload<'s> {
    pub send: &'s mut SendStream<Bytes>,
    /// For each wait for window.
    pub timeout: Duration,
    /// Nothing sent yet.
    pub first: bool,
    /// The names the client's request head carries upstream: its trailer fields go on
    /// less the others and those no trailer may carry (`forward::trailer`).
    pub names: HeadNames<'s>,
}

impl Sink for H2Upload<'_> {
    async fn data(&mut self, piece: Piece<'_>, last: bool) -> Result<(), ProxyError> {
        let up_error = |_: h2::Error| ProxyError::UpstreamClosed;
        let mut rest = piece.into_bytes();
        let eager = std::mem::take(&mut self.first) && rest.len() <= EAGER_FIRST_PIECE;
        if (eager && !rest.is_empty()) || (rest.is_empty() && last) {
            return self.send.send_data(rest, last).map_err(up_error);
        }
        while !rest.is_empty() {
            self.send.reserve_capacity(rest.len());
            let window = with_timeout(self.timeout, poll_fn(|cx| self.send.poll_capacity(cx)));
            let n = match window.await {
                Err(_) => return Err(ProxyError::UpstreamTimeout),
                Ok(None) => return Err(ProxyError::UpstreamClosed),
                Ok(Some(r)) => r.map_err(up_error)?,
            };
            let piece = rest.split_to(n.min(rest.len()));
            self.send
                .send_data(piece, last && rest.is_empty())
                .map_err(up_error)?;
        }
        Ok(())
    }

    async fn end(&mut self, trailers: Trailers<'_>) -> Result<(), ProxyError> {
        let names = self.names;
        let edited_out = |name: &[u8]| !names.forwards(name);
        let fields = match trailers {
            Trailers::Fields(fields) => crate::http2::trailers::keep(fields, u32::MAX, edited_out),
            Trailers::Lines(lines) => crate::http2::trailers::to_h2(lines, u32::MAX, edited_out),
            Trailers::None => None,
        };
        let sent = match fields {
            Some(fields) => self.send.send_trailers(fields),
            None => self.send.send_data(Bytes::new(), true),
        };
        sent.map_err(|_| ProxyError::UpstreamClosed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::http1::BodyFraming;

    #[tokio::test]
    async fn a_relay_stops_at_the_body_end() {
        let mut src: &[u8] = b"llo world";
        let mut buf = Buffer::new(4);
        let mut dst = Vec::new();
        let state = BodyState::new(BodyFraming::Length(5), false, None);
        let t = Duration::from_secs(1);
        let mut written = 0;
        fn sink<'w>(writer: &'w mut Vec<u8>, sent: &'w mut u64) -> Http1Sink<'w, Vec<u8>> {
            let timeout = Duration::from_secs(1);
            let (head, chunked, trailers) = (&[][..], false, None);
            Http1Sink {
                writer,
                timeout,
                sent,
                head,
                chunked,
                trailers,
            }
        }
        let mut source = Http1Source::new(&mut src, &mut buf, state, t, Peer::Upstream);
        relay(&mut source, &mut sink(&mut dst, &mut written), None)
            .await
            .unwrap();
        assert_eq!(dst, b"llo w");
        assert_eq!(written, 5);
        let state = BodyState::new(BodyFraming::Length(50), false, None);
        let mut src: &[u8] = b"short";
        let mut buf = Buffer::new(4);
        let mut source = Http1Source::new(&mut src, &mut buf, state, t, Peer::Upstream);
        let mut sink = sink(&mut dst, &mut written);
        // Truncated: the upstream closed before the body's end.
        assert_eq!(
            relay(&mut source, &mut sink, None).await,
            Err(Broke::Source(ProxyError::UpstreamClosed))
        );
    }
}
