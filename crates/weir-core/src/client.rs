//! The client side of one connection: its socket, read buffer and request-head reading.
//!
//! Between requests the connection waits `keepalive_timeout` for the first byte of the next
//! head, and once the head has started it must be complete within `header_timeout`; a
//! connection's first head must be complete within `header_timeout` of its accept.
//! Pipelined requests already in the buffer are parsed without touching the socket. While
//! its read for a first byte waits, and only then, the connection's seat among its worker's
//! idle connections rests (`places`): a newcomer at the listener's `max_connections` may
//! take its place (`listener::reclaim`).

use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;

use std::future::{poll_fn, Future};
use std::task::Poll;

use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::time::{timeout, timeout_at, Instant};
use weir_config::Listener;

use crate::access_log::RequestFields;
use crate::buffer::Buffer;
use crate::client_stream::ClientStream;
use crate::codec::http1::{parse_request, HeadLimits, RequestHead};
use crate::error::ProxyError;
use crate::filters::forwarded::ClientIp;
use crate::filters::request_id::RequestId;
use crate::metrics::shard::Protocol;
use crate::places::IdlePlace;
use crate::request::Trace;
use crate::request::{Origin, Request};
use crate::router::RoutedPath;
use crate::time::{with_timeout, LazyTimer};
use crate::worker::Worker;

/// How long an idle connection waits for a request once its worker drains.
const DRAIN_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// The smallest client read buffer; larger when `max_header_size` needs it.
const MIN_CLIENT_BUFFER: usize = 16 * 1024;

/// One client connection: its socket, buffers and timers, and (`current`) what its request
/// in progress leaves for its answer and its log line.
pub struct ClientConn {
    worker: Rc<Worker>,
    /// The connection's seat among its worker's idle connections (`places`): evictable
    /// while it waits for a request. HTTP/2 takes it over (`http2::conn`).
    pub idle: IdlePlace,
    pub stream: ClientStream,
    pub buf: Buffer,
    /// Scratch space for serialising heads; reused across requests.
    pub out: Vec<u8>,
    pub ip: ClientIp,
    /// The peer's address (after a PROXY header): `ip` as an address.
    pub peer_ip: IpAddr,
    /// The current request's host, kept after its head is consumed (for ProxyPassReverse);
    /// its buffer is reused.
    pub host: Vec<u8>,
    /// The current request's normalised path (routed and forwarded); its buffer is reused.
    pub path: RoutedPath,
    /// The current route's `response_headers` lines, rendered from the request; reused.
    /// Lent to the HTTP/2 sender while it forwards the request (`StreamRequest::
    /// response_lines`, in `http2::from_http1`), empty meanwhile.
    pub resp_lines: Vec<u8>,
    /// Requests read on this connection so far.
    pub served: u64,
    /// Bytes written to the client so far.
    pub sent: u64,
    /// Answer this request with `Connection: close` and close: a reload removed the
    /// listener, or the request came just as a newcomer took the connection's idle place.
    pub last_request: bool,
    /// When the connection last became idle: accepted, or its last response finished.
    pub idle_since: std::time::Instant,
    /// The wait for the next request (`header_timeout`, then `keepalive_timeout`).
    idle_timer: LazyTimer,
    /// The wait for a response head (`response_timeout`).
    pub upstream_timer: LazyTimer,
    /// What the TLS handshake settled (`None`: a plain connection).
    pub tls: Option<Box<crate::tls::session::TlsSession>>,
    /// The request in progress.
    pub current: Current,
    /// The request's trace, when sampled (`otel::begin`, once routed): set only then, and
    /// taken when the request is recorded (outside `Current`, so that a connection
    /// without tracing does not reset it per request).
    pub trace: Option<std::rc::Rc<crate::otel::RequestTrace>>,
    /// The route cache's miss this request fills, while `proxy::forward::forward_filling` forwards
    /// it (`None` otherwise): kept here, not passed down the exchange, so that a route
    /// without `cache` carries none of it.
    pub fill: Option<Box<crate::cache::Fill>>,
}

/// Where a connection's request comes from (`current`: the request in progress).
#[inline]
pub(crate) fn origin<'a>(
    peer: &'a ClientIp,
    peer_ip: IpAddr,
    current: &'a Current,
    tls: Option<&'a crate::tls::session::TlsSession>,
) -> Origin<'a> {
    Origin {
        peer,
        peer_ip,
        behind: current.real_client.as_ref().map(|(ip, text)| (*ip, text)),
        tls,
        request_id: current.request_id.as_bytes(),
    }
}

/// What a connection's request in progress leaves for its answer and its log line. Each
/// request begins it anew (`Current::begin`): nothing of the last one is left.
pub struct Current {
    /// When the request's head was complete.
    pub started: std::time::Instant,
    /// Its client behind trusted proxies (`None`: the peer).
    pub real_client: Option<(IpAddr, ClientIp)>,
    /// Its id (empty when the listener has `request_id = false`).
    pub request_id: RequestId,
    /// Its access-log fields (filled only when the listener logs; the buffers are kept).
    pub log_fields: RequestFields,
    /// What the access log and metrics learn from its exchange, as for a stream's (the
    /// server it went to, what compression and the cache did).
    pub exchange: Trace,
    /// It failed before its response, and its head and whole body had been consumed from
    /// the buffer by then (which now starts at the next request): Weir's answer need not
    /// close the connection (`proxy::http1::answer`).
    pub read: bool,
}

impl Current {
    /// Begins the next request, whose head was complete at `started`: every field as
    /// `ClientConn::new` makes it, the log fields' buffers kept. Field by field (the pattern
    /// names every field, so a new one cannot be missed): a whole new `Current` zeroed the
    /// request id's 128-byte buffer and copied the struct in, per request.
    pub fn begin(&mut self, started: std::time::Instant) {
        let Current {
            started: at,
            real_client,
            request_id,
            log_fields,
            exchange,
            read,
        } = self;
        *at = started;
        *real_client = None;
        request_id.clear();
        log_fields.clear();
        *exchange = Trace::default();
        *read = false;
    }
}

/// What waiting for the next request produced.
pub enum NextRequest {
    /// `head` describes a complete request head at the start of `buf`.
    Ready,
    /// Close quietly: the client left, was idle too long, or the worker is draining.
    Close,
    /// The connection starts with the HTTP/2 preface (h2c with prior knowledge): `buf`
    /// holds it and whatever followed; `http2::serve` takes the connection over.
    Http2,
}

/// Whether `buf` contains an empty line (`\n\n` or `\n\r\n`), scanning only bytes not
/// scanned before (`scanned` remembers where the last scan stopped).
fn head_end_seen(buf: &[u8], scanned: &mut usize) -> bool {
    let from = scanned.saturating_sub(2);
    *scanned = buf.len();
    buf[from..]
        .windows(2)
        .enumerate()
        .any(|(i, w)| w == b"\n\n" || (w == b"\n\r" && buf.get(from + i + 2) == Some(&b'\n')))
}

/// Reads once from `stream` into `buf`. With a `pool` (take, give), `buf` holds storage
/// only while a read completes: storage is taken for each attempt and given back whenever
/// the read has to wait with nothing buffered. No byte is lost that way: a pending read
/// wrote nothing.
async fn read_lazily<S: AsyncRead + Unpin, T: FnMut() -> Buffer, G: FnMut(Buffer)>(
    buf: &mut Buffer,
    stream: &mut S,
    mut pool: Option<(T, G)>,
) -> std::io::Result<usize> {
    std::future::poll_fn(|cx| {
        if let Some((take, _)) = pool.as_mut().filter(|_| buf.capacity() == 0) {
            buf.restore(take());
        }
        let mut read = ReadBuf::new(buf.spare_mut());
        match std::pin::Pin::new(&mut *stream).poll_read(cx, &mut read) {
            Poll::Pending => {
                if let Some((_, give)) = pool.as_mut().filter(|_| buf.is_empty()) {
                    give(buf.lend());
                }
                Poll::Pending
            }
            Poll::Ready(Ok(())) => {
                let n = read.filled().len();
                buf.commit(n);
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        }
    })
    .await
}

impl ClientConn {
    /// The read buffer comes from `worker`'s spares (and goes back there on drop): a short
    /// connection would otherwise allocate and zero 16 KiB.
    pub fn new(
        worker: Rc<Worker>,
        slot: usize,
        stream: ClientStream,
        peer: SocketAddr,
        listener: &Listener,
    ) -> ClientConn {
        let buf = worker.take_buffer_sized(listener.max_header_size.max(MIN_CLIENT_BUFFER));
        let now = std::time::Instant::now();
        ClientConn {
            idle: IdlePlace::new(&worker.idle, slot, now),
            worker,
            stream,
            buf,
            out: Vec::with_capacity(1024),
            // A dual-stack socket's `::ffff:a.b.c.d` as `a.b.c.d`: one client, one spelling
            // for every consumer (rate keys, access lists, logs, X-Forwarded-For).
            ip: ClientIp::new(peer.ip().to_canonical()),
            peer_ip: peer.ip().to_canonical(),
            host: Vec::new(),
            path: RoutedPath::default(),
            resp_lines: Vec::new(),
            served: 0,
            sent: 0,
            last_request: false,
            idle_since: now,
            idle_timer: LazyTimer::new(Instant::from_std(now)),
            upstream_timer: LazyTimer::new(Instant::from_std(now)),
            tls: None,
            current: Current {
                started: now,
                real_client: None,
                request_id: RequestId::default(),
                log_fields: RequestFields::default(),
                exchange: Trace::default(),
                read: false,
            },
            trace: None,
            fill: None,
        }
    }

    /// Reads until `head` holds the next complete request head.
    pub async fn next_request(
        &mut self,
        listener: &Listener,
        head: &mut RequestHead,
        worker: &Worker,
    ) -> Result<NextRequest, ProxyError> {
        let limits = HeadLimits::of(listener);
        if self.buf.is_empty() && !self.wait_first_byte(listener, worker).await {
            return Ok(NextRequest::Close);
        }
        // HTTP/2 with prior knowledge on cleartext connections only: over TLS, HTTP/2 is
        // chosen by ALPN (and the stream path must carry the TLS facts). Decided on the
        // first byte for every HTTP/1 method but `PRI`; read as HTTP/1 once not the preface.
        let mut sniffing = self.served == 0 && self.tls.is_none();
        // Usually the whole head is there: parse at once. Otherwise re-parse only when an
        // end of head may have arrived (or the size limit is reached), so a client dribbling
        // a head byte by byte cannot make Weir re-parse it thousands of times.
        let (mut worth_parsing, mut scanned, mut deadline) = (true, 0, None);
        loop {
            if sniffing {
                match crate::http2::preface(self.buf.filled()) {
                    crate::http2::Preface::Complete => return Ok(NextRequest::Http2),
                    crate::http2::Preface::Not => sniffing = false,
                    crate::http2::Preface::Partial => {}
                }
            }
            // Parsed here, not in an `async fn` around `next_request`: that layer cost every
            // request a state of its own.
            if worth_parsing && !sniffing {
                match parse_request(self.buf.filled(), limits, head) {
                    Ok(true) => return Ok(NextRequest::Ready),
                    Ok(false) => {}
                    // Neither HTTP/1 nor the HTTP/2 preface: maybe an HTTP/2 client with a bad
                    // preface, which must see the connection closed (RFC 9113 3.4), not a 400.
                    Err(ProxyError::BadRequest(_))
                        if self.served == 0
                            && crate::http2::neither_protocol(self.buf.filled()) =>
                    {
                        tracing::debug!(
                            "first line is neither HTTP/1 nor the HTTP/2 preface; closing"
                        );
                        return Ok(NextRequest::Close);
                    }
                    Err(e) => return Err(e),
                }
            }
            // The head must be whole `header_timeout` after the accept (or the TLS handshake,
            // or the PROXY header) for a connection's first request, as nginx counts it, so a
            // head trickled from late in the wait for its first byte gets no second
            // `header_timeout`; after its first byte for a later one.
            let deadline = *deadline.get_or_insert_with(|| match self.served {
                0 => Instant::from_std(self.idle_since) + listener.header_timeout,
                _ => Instant::now() + listener.header_timeout,
            });
            match timeout_at(deadline, self.buf.read_from(&mut self.stream)).await {
                Err(_) => return Err(ProxyError::HeaderTimeout),
                Ok(Ok(0)) | Ok(Err(_)) => return Ok(NextRequest::Close),
                Ok(Ok(_)) => {}
            }
            let filled = self.buf.filled();
            worth_parsing = sniffing
                || head_end_seen(filled, &mut scanned)
                || filled.len() >= listener.max_header_size;
        }
    }

    /// Waits for the first byte of a request; false when the connection should close.
    async fn wait_first_byte(&mut self, listener: &Listener, worker: &Worker) -> bool {
        let idle = if self.served == 0 {
            listener.header_timeout
        } else {
            listener.keepalive_timeout
        };
        if idle.is_zero() {
            return false;
        }
        self.idle_timer
            .set(Instant::from_std(self.idle_since) + idle);
        // An idle connection holds no read buffer: the pooled one goes back to the worker
        // while the wait is pending and is taken again when bytes arrive (10,000 idle
        // keep-alive connections would otherwise pin 160 MiB). A buffer of another size
        // (a large `max_header_size`) is not pooled, so it stays.
        let lend = self.buf.capacity() == crate::worker::UPSTREAM_BUFFER;
        let pool = (|| worker.take_buffer(), |b| worker.give_buffer(b));
        let read = std::pin::pin!(read_lazily(
            &mut self.buf,
            &mut self.stream,
            lend.then_some(pool)
        ));
        let read = self.idle_timer.within(read);
        tokio::pin!(read);
        // Idle once the read waits: at the listener's max_connections a newcomer may take
        // this place (`listener::reclaim`). The drain wakes it too, as it wakes every idle
        // place. A request already there never rests.
        let (place, places, since) = (&self.idle, &worker.idle, self.idle_since);
        let read_or_drain = poll_fn(|cx| {
            if let Poll::Ready(r) = read.as_mut().poll(cx) {
                return Poll::Ready(Some(matches!(r, Some(Ok(n)) if n > 0)));
            }
            if worker.is_draining() {
                return Poll::Ready(None);
            }
            // Taken: close.
            place.poll_rest(places, since, cx).map(|()| Some(false))
        })
        .await;
        // Its place was taken as the request came: served, then closed.
        self.last_request |= !place.busy(places);
        if let Some(read) = read_or_drain {
            return read;
        }
        // Draining (a shutdown or a binary upgrade): a request the client already sent, or
        // a new connection's first one, cannot know about the drain. It gets a short grace
        // and an answer with `Connection: close`; a connection that stays quiet closes.
        matches!(timeout(DRAIN_GRACE, &mut read).await, Ok(Some(Ok(n))) if n > 0)
    }

    /// The current request's client address as text (after PROXY protocol and trusted
    /// proxies).
    #[inline]
    pub fn client_text(&self) -> &ClientIp {
        self.current
            .real_client
            .as_ref()
            .map_or(&self.ip, |(_, text)| text)
    }

    /// The request whose head is `req` (at the start of `buf`), as the routing decision
    /// and the exchange see it.
    pub fn request<'a>(&'a self, req: &'a RequestHead) -> Request<'a> {
        Request {
            buf: self.buf.filled(),
            req,
            origin: origin(&self.ip, self.peer_ip, &self.current, self.tls.as_deref()),
            started: self.current.started,
            protocol: Protocol::Http1,
            trace: self.trace.as_deref(),
        }
    }

    /// Writes bytes to the client within `client_timeout`.
    pub async fn write_all(&mut self, bytes: &[u8], listener: &Listener) -> Result<(), ProxyError> {
        match with_timeout(listener.client_timeout, self.stream.write_all(bytes)).await {
            Ok(Ok(())) => {
                self.sent += bytes.len() as u64;
                Ok(())
            }
            Ok(Err(e)) => Err(ProxyError::client_io(e)),
            Err(_) => Err(ProxyError::ClientTimeout),
        }
    }
}

impl Drop for ClientConn {
    fn drop(&mut self) {
        self.idle.close(&self.worker.idle);
        self.worker
            .give_buffer(std::mem::replace(&mut self.buf, Buffer::new(0)));
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use tokio::io::AsyncWriteExt;

    use super::{head_end_seen, read_lazily, Buffer};

    /// An idle connection gives its read buffer back while it waits, and takes one again
    /// when its next request arrives, with every byte (and the byte count) intact.
    #[tokio::test]
    async fn an_idle_read_holds_no_buffer() {
        let spare = RefCell::new(vec![Buffer::new(64)]);
        let pool = || {
            let take = || spare.borrow_mut().pop().unwrap_or_else(|| Buffer::new(64));
            (take, |b| spare.borrow_mut().push(b))
        };
        let (mut client, mut server) = tokio::io::duplex(1024);
        let mut buf = spare.borrow_mut().pop().unwrap();
        let mut read = Box::pin(read_lazily(&mut buf, &mut server, Some(pool())));
        assert!(
            futures_poll_once(read.as_mut()).is_none(),
            "nothing sent yet"
        );
        drop(read);
        assert_eq!(buf.capacity(), 0, "the waiting connection kept its buffer");
        assert_eq!(spare.borrow().len(), 1);
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let n = read_lazily(&mut buf, &mut server, Some(pool()))
            .await
            .unwrap();
        assert_eq!((n, buf.filled()), (16, &b"GET / HTTP/1.1\r\n"[..]));
        assert_eq!(spare.borrow().len(), 0);
        // Bytes already buffered: a pending read keeps them and the storage.
        let mut read = Box::pin(read_lazily(&mut buf, &mut server, Some(pool())));
        assert!(futures_poll_once(read.as_mut()).is_none());
        drop(read);
        assert_eq!(buf.len(), 16);
        buf.consume(16);
        assert_eq!(buf.consumed_total(), 16);
    }

    /// Polls `f` once with a no-op waker.
    fn futures_poll_once<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> Option<F::Output> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    #[test]
    fn finds_the_end_of_a_head_across_reads() {
        let head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        for cut in 0..head.len() {
            let mut scanned = 0;
            let first = head_end_seen(&head[..cut], &mut scanned);
            let second = head_end_seen(head, &mut scanned);
            assert!(!first, "cut {cut}");
            assert!(second, "cut {cut}");
        }
        let mut scanned = 0;
        assert!(head_end_seen(b"GET / HTTP/1.0\n\n", &mut scanned));
        assert!(!head_end_seen(b"GET / HTTP/1.1\r\nHost: a\r\n", &mut 0));
    }
}
