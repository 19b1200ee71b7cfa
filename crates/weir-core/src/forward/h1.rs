//! The upstream side over an HTTP/1.1 connection, for every client protocol: a pooled or
//! new connection (`obtain_for`), the request head and the body at hand in one write
//! (`send_whole`) or the body streamed while the response head is awaited
//! (`send_streaming`), the final head read with 1xx heads relayed to the client
//! (`read_final_head`, through an [`Interim`] sink), and the connection pooled again once
//! the exchange left it clean (`Accepted::reuse`).
//!
//! A pooled connection found closed before any response byte ([`no_head`]: closed, or an
//! I/O error such as a reset; never a timeout, after which the server may be working on
//! the request) did not process an idempotent request: the try is [`Miss::unprocessed`]
//! and the driver sends it again on a new connection.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use weir_config::{Encoding, Listener};

use super::body;
use super::driver::{Accepted, Attempt, Exchange, Miss};
use super::head::{push_fields, reason, write_from_http1, Edits};
use super::relay::{Broke, Peer};
use super::{Failure, Reached};
use crate::buffer::Buffer;
use crate::codec::http1::write::push_status_line;
use crate::codec::http1::{parse_response, BodyFraming, ResponseHead};
use crate::connector::{connect_server, PoolKey, UpstreamStream, WriteHalf};
use crate::error::ProxyError;
use crate::filters::upgrade::Offered;
use crate::time::{Continued, LazyTimer};

/// What the exchange needs to remember about the request once its head is consumed.
#[derive(Clone, Copy)]
pub(crate) struct RequestMeta {
    pub is_head: bool,
    /// 1xx responses are not relayed (also set for an RFC 8441 tunnel, whose client
    /// waits for the 101 only).
    pub http10: bool,
    /// The upgrade protocols offered upstream (empty: not an upgrade).
    pub upgrade: Offered,
    /// The coding the route's `compression` negotiated with the client (`None`: identity,
    /// or no compression on the route).
    pub accepted: Option<Encoding>,
    /// 1xx heads read before the final one, at most (the listener's `max_informational`
    /// for HTTP/1.1 clients; for HTTP/2 clients the larger of it and
    /// `http2.max_informational`, their stream dropping those past its own bounds in
    /// `http2::interim`); one more fails the response.
    pub max_informational: u32,
}

/// Where a try reads its response head into, and its bounds.
pub(crate) struct Reading<'b> {
    pub up_buf: &'b mut Buffer,
    pub resp: &'b mut ResponseHead,
    /// The wait for the final head (`response_timeout`).
    pub timer: &'b mut LazyTimer,
    pub meta: RequestMeta,
}

/// A request whose body is all at hand (none, or all of it buffered): `head` and `body`
/// in one write, then the final head. Its connection is returned with the head in
/// `rd.resp` (parsed from `rd.up_buf`), and that the whole body went up (as
/// [`send_streaming`] returns it).
pub(crate) async fn send_whole<I: Interim>(
    x: &Exchange<'_>,
    a: &Attempt<'_>,
    head: &[u8],
    body: &[u8],
    rd: &mut Reading<'_>,
    interim: &mut I,
) -> Result<(UpstreamStream, bool), Miss> {
    rd.up_buf.clear();
    let upstream = x.target.upstream;
    let (mut stream, reused) = match obtain_for(x, a) {
        Obtained::Pooled(stream) => (stream, true),
        Obtained::Connect(connect) => (connect.await?, false),
    };
    let timeout = upstream.response_timeout;
    let head = match body::write_parts(&mut stream, [head, body], timeout).await {
        Ok(()) => {
            // response_timeout counts from the end of the request. On a pooled connection
            // the send completes at once, so that is when the try started (no clock read);
            // after a connect it is now.
            let sent_at = reused.then_some(a.started);
            let sent_at = sent_at.unwrap_or_else(std::time::Instant::now);
            rd.timer.set(Instant::from_std(sent_at) + timeout);
            read_final_head(&mut stream, rd, interim, true).await
        }
        Err(e) => Err(no_head(Peer::Upstream.error(e), false, false)),
    };
    head.map(|()| (stream, true)).map_err(|miss| Miss {
        unprocessed: miss.unprocessed && reused && x.idempotent,
        ..miss
    })
}

/// A request whose body is still arriving: `upload` writes the head and the body to the
/// connection's write half while the final head is read (it may come early, or be a
/// `100 Continue` the client waits for). Returns the connection and whether the whole
/// body went up.
pub(crate) async fn send_streaming<I: Interim>(
    x: &Exchange<'_>,
    a: &Attempt<'_>,
    rd: &mut Reading<'_>,
    interim: &mut I,
    upload: impl AsyncFnOnce(&mut WriteHalf<'_>) -> Result<(), Broke>,
) -> Result<(UpstreamStream, bool), Miss> {
    rd.up_buf.clear();
    let mut stream = match obtain_for(x, a) {
        Obtained::Pooled(stream) => stream,
        Obtained::Connect(connect) => connect.await?,
    };
    let mut state = Upload::Running;
    {
        let (mut ur, mut uw) = stream.split();
        let upload = std::pin::pin!(upload(&mut uw));
        let head = async {
            let head = read_final_head(&mut ur, rd, interim, false).await;
            head.map_err(|miss| miss.failure)
        };
        let timeout = Some(x.target.upstream.response_timeout);
        let gone = std::future::pending();
        upload_while_waiting(upload, &mut state, head, timeout, None, gone).await?;
    }
    Ok((stream, state == Upload::Done))
}

/// A connection for try `a`: a pooled one unless `a.fresh` (`Obtained::Pooled`), else
/// the connect that makes a new one. A plain function, not an `async fn`: the usual pooled
/// connection is taken without making and polling a future (78 instructions fewer per
/// proxied request, `bench/instructions.sh`); only a connect waits.
fn obtain_for<'a>(
    x: &'a Exchange<'_>,
    a: &Attempt<'a>,
) -> Obtained<impl Future<Output = Result<UpstreamStream, ProxyError>> + 'a> {
    let tls = x.target.pool.tls.as_deref();
    let upstream = x.target.upstream;
    if !a.fresh {
        // An idle connection to the server, checked against the try's start.
        let mut pool = x.worker.pool.borrow_mut();
        let key = PoolKey::new(a.server, tls);
        let (reused, idle) = pool.take(key, upstream.idle_timeout, a.started);
        if let Some(m) = a.metrics {
            m.pool_idle.set(idle as u64);
        }
        if let Some(stream) = reused {
            return Obtained::Pooled(stream);
        }
    }
    let (server, metrics) = (a.server, a.metrics);
    Obtained::Connect(async move {
        let started = std::time::Instant::now();
        let stream = connect_server(upstream, server, tls).await?;
        if let Some(m) = metrics {
            m.connect.observe(started.elapsed());
        }
        Ok(stream)
    })
}

/// A connection taken from the pool, or the connect that makes a new one.
enum Obtained<C> {
    Pooled(UpstreamStream),
    Connect(C),
}

/// An HTTP/1.1 upstream's response: its head (parsed from `buf`) and its connection.
pub(crate) struct Http1Response<'u> {
    pub stream: &'u mut UpstreamStream,
    pub buf: &'u mut Buffer,
    pub head: &'u ResponseHead,
}

impl Accepted<'_> {
    /// Pools the try's connection `stream` when the exchange left it clean: the response
    /// `resp` complete and keeping the connection, the whole request sent
    /// (`request_done`), nothing after the response in `up_buf`. `since_head`: idle since
    /// the final head came (the body came with it, or there is none: no clock read);
    /// otherwise from now.
    pub fn reuse(
        &self,
        stream: UpstreamStream,
        resp: &ResponseHead,
        up_buf: &Buffer,
        request_done: bool,
        since_head: bool,
    ) {
        if !(resp.keeps_alive() && request_done && up_buf.is_empty()) {
            return;
        }
        let idle_from = match since_head {
            true => self.head_at,
            false => std::time::Instant::now(),
        };
        let key = PoolKey::new(self.server, self.target.pool.tls.as_deref());
        let max_idle = self.target.upstream.max_idle;
        let idle = self
            .worker
            .pool
            .borrow_mut()
            .put(key, stream, max_idle, idle_from);
        if let Some(m) = self.metrics {
            m.pool_idle.set(idle as u64);
        }
    }

    /// After a cache's stored entry answered instead of the upstream's response `resp`
    /// (its head consumed here from `up_buf`): the try counts with `resp`'s status, and the
    /// connection is pooled when `resp` has no body (nothing of it is left to read).
    pub fn pool_after_answer(
        &self,
        stream: UpstreamStream,
        resp: &ResponseHead,
        up_buf: &mut Buffer,
        request_done: bool,
    ) {
        self.count(Ok(resp.status));
        up_buf.consume(resp.head_len);
        if matches!(resp.framing, BodyFraming::None | BodyFraming::Length(0)) {
            self.reuse(stream, resp, up_buf, request_done, true);
        }
    }
}

/// Where a request body's upload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Upload {
    Running,
    /// The whole body went up.
    Done,
    /// The server stopped taking it.
    Stopped,
}

/// Runs a request body's `upload` (while `state` says it runs) and the wait for the
/// response `head` together, unless the client is `gone` (with the error to fail with),
/// for either upstream side. `timeout` counts from the end of the upload, however long the
/// body takes to arrive (nginx's proxy_read_timeout does the same; while it uploads, a
/// stalled upstream is caught by the upload's write timeout; `None`: no bound, a relay's
/// waits have their own); `deadline` from now.
pub(crate) async fn upload_while_waiting<U, H, G, T, E>(
    mut upload: Pin<&mut U>,
    state: &mut Upload,
    head: H,
    timeout: Option<Duration>,
    deadline: Option<Duration>,
    gone: G,
) -> Result<T, E>
where
    U: Future<Output = Result<(), Broke>>,
    H: Future<Output = Result<T, E>>,
    G: Future<Output = ProxyError>,
    E: From<ProxyError>,
{
    let running = *state == Upload::Running;
    let timer = tokio::time::sleep(timeout.filter(|_| !running).unwrap_or(Duration::MAX));
    let deadline = async {
        match deadline {
            Some(deadline) => tokio::time::sleep(deadline).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(head, timer, gone, deadline);
    loop {
        let running = *state == Upload::Running;
        tokio::select! {
            r = upload.as_mut(), if running => {
                if let Some(timeout) = timeout {
                    timer.as_mut().reset(Instant::now() + timeout);
                }
                *state = match r {
                    Ok(()) => Upload::Done,
                    // The upstream stopped taking the body; its response (if any) says why.
                    Err(Broke::Sink(_)) => Upload::Stopped,
                    Err(Broke::Source(e)) => return Err(e.into()),
                };
            }
            h = &mut head => return h,
            () = &mut timer, if !running && timeout.is_some() => {
                return Err(ProxyError::UpstreamTimeout.into())
            }
            () = &mut deadline => return Err(ProxyError::UpstreamTimeout.into()),
            e = &mut gone => return Err(e.into()),
        }
    }
}

/// The try's end when no final head was read: `error`, `received` (some response byte
/// came: the upstream processed the request), `interim_sent` (a 1xx was relayed: the
/// client has response bytes). A closed connection or an I/O error before any response
/// byte is [`Miss::unprocessed`]: on a pooled connection, the server closed it before it
/// read the request (`send_whole` keeps that for a pooled connection and an idempotent
/// request only, `send_streaming` never).
fn no_head(error: ProxyError, received: bool, interim_sent: bool) -> Miss {
    use ProxyError::{UpstreamClosed, UpstreamIo};
    let closed = matches!(error, UpstreamClosed | UpstreamIo(_));
    let reached = Reached::before_head(interim_sent);
    Miss {
        unprocessed: !received && closed,
        ..Miss::from(Failure { error, reached })
    }
}

/// An upstream sent more 1xx heads than the listener's `max_informational`.
pub(crate) const TOO_MANY_INFORMATIONAL: ProxyError =
    ProxyError::UpstreamMalformed("too many informational responses");

/// Where the 1xx heads read before the final one go: an HTTP/1.1 client's socket (any
/// writer), or an HTTP/2 or HTTP/3 client's stream (`http2::interim`, `http3::interim`).
/// Each relay returns whether the client got the head (a stream may skip one); `Err`: the
/// client cannot be answered any more, and why (`ClientClosed`: it left).
pub(crate) trait Interim {
    /// Relays an HTTP/1.1 upstream's 1xx head `resp`, whose bytes are `head`.
    fn relay(
        &mut self,
        _head: &[u8],
        _resp: &ResponseHead,
    ) -> impl std::future::Future<Output = Result<bool, ProxyError>> {
        std::future::ready(Ok(false))
    }

    /// Relays an HTTP/2 upstream's 1xx head.
    fn relay_h2(
        &mut self,
        _head: http::Response<()>,
    ) -> impl std::future::Future<Output = Result<bool, ProxyError>> {
        std::future::ready(Ok(false))
    }

    /// Whether the client waits for a 100 it has not had (it sent `Expect: 100-continue`
    /// and no body byte yet): only an HTTP/1.1 client toward an HTTP/1.1 upstream,
    /// the one cell where the upstream's 100 is relayed instead of Weir's sent at once.
    fn untold(&self) -> bool {
        false
    }

    /// Tells that client to go on with Weir's own `100 Continue` (`TELL_CONTINUE_AFTER`).
    fn tell(&mut self) -> impl std::future::Future<Output = Result<bool, ProxyError>> {
        std::future::ready(Ok(false))
    }
}

/// How long an upstream may be silent before Weir sends a waiting `Expect: 100-continue`
/// client its own 100. Many servers never send one and wait for the body, and RFC 9110
/// (10.1.1) lets a client wait for the 100 as long as it likes: without this the two wait
/// for each other until `response_timeout`. One second, as curl waits before it sends a
/// body anyway; the client's `min_body_rate` counts from then (`time::Continued`).
const TELL_CONTINUE_AFTER: Duration = Duration::from_secs(1);

/// An HTTP/1.1 client's socket: an upstream's 1xx head written as HTTP/1.1, its
/// end-to-end fields only (`client_timeout`, carried by the writer, bounds it).
pub(crate) struct Http1Interim<'w, W> {
    pub writer: &'w mut W,
    pub timeout: Duration,
    /// Set once a 1xx head goes out (part of one included): no other server then.
    pub informed: &'w mut bool,
    /// Marked once a 100 goes out to a client that waits for it (`time::Continued`).
    pub continued: Option<Rc<Continued>>,
}

impl<'w, W> Http1Interim<'w, W> {
    /// The sink for a client of `listener`, waiting for no 100 of its own.
    pub fn new(writer: &'w mut W, listener: &Listener, informed: &'w mut bool) -> Self {
        let timeout = listener.client_timeout;
        let continued = None;
        Http1Interim {
            writer,
            timeout,
            informed,
            continued,
        }
    }
}

impl<W: AsyncWrite + Unpin> Interim for Http1Interim<'_, W> {
    async fn relay(&mut self, head: &[u8], resp: &ResponseHead) -> Result<bool, ProxyError> {
        // An upstream's 100 after Weir's own: the client has one already.
        if resp.status == 100 && self.continued.as_ref().is_some_and(|c| c.told()) {
            return Ok(true);
        }
        // Its end-to-end lines, each ending in CRLF. Not as it came: a bare-LF line end, or
        // a hop-by-hop field, could make a stricter parser in front read it differently.
        let mut out = Vec::with_capacity(head.len());
        write_from_http1(&mut out, head, resp, &Edits::default(), &Default::default());
        self.send(&out, resp.status).await
    }

    async fn relay_h2(&mut self, head: http::Response<()>) -> Result<bool, ProxyError> {
        // Its connection-specific fields dropped.
        let (mut out, status) = (Vec::with_capacity(128), head.status());
        push_status_line(&mut out, status.as_u16(), reason(status));
        push_fields(&mut out, head.headers(), |_| false);
        out.extend_from_slice(b"\r\n");
        self.send(&out, status.as_u16()).await
    }

    fn untold(&self) -> bool {
        self.continued.as_ref().is_some_and(|c| c.waits())
    }

    async fn tell(&mut self) -> Result<bool, ProxyError> {
        self.send(b"HTTP/1.1 100 Continue\r\n\r\n", 100).await
    }
}

impl<W: AsyncWrite + Unpin> Http1Interim<'_, W> {
    /// Writes a 1xx head (`Ok(true)`: the client has it).
    async fn send(&mut self, head: &[u8], status: u16) -> Result<bool, ProxyError> {
        *self.informed = true;
        let sent = body::write_parts(self.writer, [head], self.timeout).await;
        sent.map_err(|_| ProxyError::ClientClosed)?;
        if let Some(continued) = self.continued.as_ref().filter(|_| status == 100) {
            continued.mark();
        }
        Ok(true)
    }
}

/// No client waits for 1xx heads (an RFC 8441 tunnel waits for its 101 only).
pub(crate) struct NoInterim;

impl Interim for NoInterim {}

/// Reads until a final (non-1xx) response head is parsed into `rd.resp`, relaying 1xx
/// heads to `client` (not to HTTP/1.0 clients: `meta.http10`); a 1xx past
/// `meta.max_informational` fails the response (502). With `timed`, the whole head must
/// arrive by the deadline set on `rd.timer` (the streaming path times the wait itself,
/// from the end of the upload).
pub(crate) async fn read_final_head<R, W>(
    up: &mut R,
    rd: &mut Reading<'_>,
    client: &mut W,
    timed: bool,
) -> Result<(), Miss>
where
    R: AsyncRead + Unpin,
    W: Interim,
{
    let meta = rd.meta;
    let mut received = !rd.up_buf.is_empty();
    let mut interim_sent = false;
    let mut informational = 0u32;
    let mut tell_at = None;
    loop {
        // Nothing read yet (the usual case right after sending): nothing to parse.
        let complete = !rd.up_buf.is_empty()
            && parse_response(
                rd.up_buf.filled(),
                crate::worker::UPSTREAM_BUFFER,
                meta.is_head,
                rd.resp,
            )
            .map_err(|e| no_head(e, true, interim_sent))?;
        if !complete {
            let read = rd.up_buf.read_from(up);
            let read = match timed {
                true => rd.timer.within(std::pin::pin!(read)).await,
                false => Some(
                    read_telling(read, client, &mut tell_at)
                        .await
                        .map_err(|e| no_head(e, received, true))?,
                ),
            };
            let error = match read {
                Some(Ok(n)) if n > 0 => {
                    received = true;
                    continue;
                }
                None => ProxyError::UpstreamTimeout,
                Some(Err(e)) => ProxyError::upstream_io(e),
                Some(Ok(_)) => ProxyError::UpstreamClosed,
            };
            return Err(no_head(error, received, interim_sent));
        }
        if !rd.resp.is_interim() {
            return Ok(());
        }
        // An upstream sending 1xx in a loop would keep the client waiting (and reading)
        // until the response timeout; the heads the client already has commit no status.
        informational = informational.saturating_add(1);
        if informational > meta.max_informational {
            return Err(no_head(TOO_MANY_INFORMATIONAL, true, interim_sent));
        }
        if !meta.http10 {
            let head = &rd.up_buf.filled()[..rd.resp.head_len];
            let relayed = client.relay(head, rd.resp).await;
            // Err: the HTTP/1.1 client may have part of the head (so, `interim_sent`).
            interim_sent |= relayed.map_err(|e| no_head(e, true, true))?;
        }
        rd.up_buf.consume(rd.resp.head_len);
    }
}

/// `read` from the upstream; meanwhile, a client still waiting for its 100
/// ([`Interim::untold`]) gets Weir's own at `tell_at`, set on the first such read to
/// [`TELL_CONTINUE_AFTER`] from then (so an upstream sending 103s or a head a byte at a
/// time does not put it off). `Err`: the client could not be told (it left).
async fn read_telling<W: Interim>(
    read: impl Future<Output = std::io::Result<usize>>,
    client: &mut W,
    tell_at: &mut Option<Instant>,
) -> Result<std::io::Result<usize>, ProxyError> {
    let mut read = std::pin::pin!(read);
    if client.untold() {
        let at = *tell_at.get_or_insert_with(|| Instant::now() + TELL_CONTINUE_AFTER);
        if let Ok(out) = tokio::time::timeout_at(at, read.as_mut()).await {
            return Ok(out);
        }
        // Unless its body began meanwhile.
        if client.untold() {
            client.tell().await?;
        }
    }
    Ok(read.await)
}
