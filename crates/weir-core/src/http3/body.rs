//! The two body halves of an HTTP/3 request stream, for the one relay (`forward::relay`):
//! the request's DATA as a [`Source`] ([`H3Source`]) and the response's DATA and trailers
//! as a [`Sink`] ([`H3Sink`]), and the stream as the `ResponseStream` a static-file reply
//! goes to. QUIC gives a stream's flow-control credit back as its data
//! is read, so reading one piece at a time, only when the sink took the last, keeps the
//! client at the upstream's pace (as `H2Source` does by releasing capacity).

use std::cell::Cell;
use std::time::Duration;

use bytes::{Buf, Bytes};
use h3::server::RequestStream;

use super::send::client_error;
pub(crate) use super::send::SendHalf;

use crate::error::ProxyError;
use crate::forward::head::Edits;
use crate::forward::relay::{relay, Broke, Coding, Piece, Sink, Source, Trailers};
use crate::forward::Failure;
use crate::http2::respond::{ResponseStream, Sinking};
use crate::request::Trace;
use crate::time::{paced, with_timeout, Pace, Waited};

/// The receiving half of a request stream.
pub(crate) type RecvHalf = RequestStream<super::guard::RequestRecv, Bytes>;

/// Reads the next non-empty DATA payload within `timeout` (and `pace`, the listener's
/// `min_body_rate`, when given); `None`: the body ended.
pub(crate) async fn next_data(
    body: &mut RecvHalf,
    timeout: Duration,
    mut pace: Option<&mut Pace>,
) -> Result<Option<Bytes>, ProxyError> {
    loop {
        match paced(pace.as_deref_mut(), timeout, body.recv_data()).await {
            Err(Waited::TooSlow) => return Err(ProxyError::BodyTooSlow),
            Err(Waited::Timeout) => return Err(ProxyError::ClientTimeout),
            Ok(Err(e)) => return Err(client_error(e)),
            Ok(Ok(None)) => return Ok(None),
            Ok(Ok(Some(mut data))) => {
                let data = data.copy_to_bytes(data.remaining());
                if let Some(pace) = pace.as_deref_mut() {
                    pace.add(data.len());
                }
                if !data.is_empty() {
                    return Ok(Some(data));
                }
            }
        }
    }
}

/// A request body's DATA (its first payload possibly read already, `first`), at most
/// `limit` bytes (`max_body_size`), counted in `total`.
pub(crate) struct H3Source<'b> {
    pub body: &'b mut RecvHalf,
    pub first: Option<Bytes>,
    /// For each payload.
    pub timeout: Duration,
    /// The listener's `min_body_rate`.
    pub pace: Option<Pace>,
    pub total: &'b Cell<u64>,
    pub limit: Option<u64>,
    /// The request's `content-length`: DATA past it or ending short of it is malformed
    /// (RFC 9114 4.1.2), and nothing past it is passed on.
    pub length: Option<u64>,
}

impl Source for H3Source<'_> {
    async fn next(&mut self) -> Result<Option<(Piece<'_>, bool)>, ProxyError> {
        let data = match self.first.take() {
            Some(first) => first,
            None => match next_data(self.body, self.timeout, self.pace.as_mut()).await? {
                Some(data) => data,
                None if self.length.is_some_and(|n| self.total.get() < n) => {
                    return Err(ProxyError::BadRequest(
                        "body shorter than its content-length",
                    ));
                }
                None => return Ok(None),
            },
        };
        self.total.set(self.total.get() + data.len() as u64);
        if self.length.is_some_and(|n| self.total.get() > n) {
            return Err(ProxyError::BadRequest(
                "body longer than its content-length",
            ));
        }
        if self.limit.is_some_and(|max| self.total.get() > max) {
            return Err(ProxyError::BodyTooLarge);
        }
        // Whether more follows is only known by reading on: never `last` here.
        Ok(Some((Piece::Bytes(data), false)))
    }

    fn taken(&mut self) {}

    async fn trailers(&mut self) -> Result<Trailers<'_>, ProxyError> {
        match with_timeout(self.timeout, self.body.recv_trailers()).await {
            Err(_) => Err(ProxyError::ClientTimeout),
            Ok(Err(e)) => Err(client_error(e)),
            // The h3 crate does not check trailer fields as the h2 one does: what HTTP/2
            // forbids (connection-specific fields) would fail an HTTP/2 upstream's stream,
            // and what may not be a trailer (RFC 9110 6.5.1) is not passed on.
            Ok(Ok(Some(fields))) => Ok(crate::http2::trailers::keep(fields, u32::MAX, |_| false)
                .map_or(Trailers::None, Trailers::Fields)),
            Ok(Ok(None)) => Ok(Trailers::None),
        }
    }
}

/// A client's stream as the sink of a response body: DATA (each write waiting at most
/// `stall` for the client's flow-control credit), then the trailers, less what may not be
/// a trailer (as for HTTP/2: `http2::trailers`), then the end of the stream.
struct H3Sink<'s> {
    send: &'s mut SendHalf,
    stall: Duration,
    max_trailers: u32,
    /// What the route does to the head (the names it drops leave the trailers too).
    edits: &'s Edits<'s>,
    /// Body bytes sent, the `grpc-status` sent.
    trace: &'s mut Trace,
}

impl H3Sink<'_> {
    async fn finish(&mut self) -> Result<(), ProxyError> {
        self.send.finish(self.stall).await
    }
}

impl Sink for H3Sink<'_> {
    async fn data(&mut self, piece: Piece<'_>, last: bool) -> Result<(), ProxyError> {
        let data = piece.into_bytes();
        let len = data.len() as u64;
        if len > 0 {
            self.send.send_data(data, self.stall).await?;
            self.trace.body_out += len;
        }
        if last {
            self.finish().await?;
        }
        Ok(())
    }

    async fn end(&mut self, trailers: Trailers<'_>) -> Result<(), ProxyError> {
        let dropped = |name: &[u8]| self.edits.drops(name);
        let fields = match trailers {
            Trailers::None => None,
            Trailers::Lines(lines) => {
                crate::http2::trailers::to_h2(lines, self.max_trailers, dropped)
            }
            Trailers::Fields(fields) => {
                crate::http2::trailers::keep(fields, self.max_trailers, dropped)
            }
        };
        if let Some(fields) = fields {
            let status = self.trace.grpc_status_in(&fields);
            self.send.send_trailers(fields, self.stall).await?;
            self.trace.sent_grpc_status(status);
        }
        self.finish().await
    }
}

impl SendHalf {
    /// Relays `source`'s body and trailers into the stream (its head sent) as `sinking`
    /// says, compressed through `coding` when there is one, or sends `whole` (the body,
    /// all at hand) or nothing (no `source`) as its one last DATA. The caller stops the
    /// stream on a failure (`Reached::Head`).
    pub(crate) async fn relay_body<S: Source>(
        &mut self,
        source: Option<&mut S>,
        sinking: Sinking<'_>,
        coding: Option<&mut Coding>,
        whole: Option<Bytes>,
    ) -> Result<(), Failure> {
        let mut sink = H3Sink {
            send: self,
            stall: sinking.stall,
            max_trailers: sinking.max_trailers,
            edits: sinking.edits,
            trace: sinking.trace,
        };
        let relayed = match (source, whole) {
            (Some(source), None) => relay(source, &mut sink, coding).await,
            (source, whole) => {
                // No body, or all of it at hand: one last DATA.
                let piece = whole.filter(|_| source.is_some()).map(Piece::Bytes);
                let piece = piece.unwrap_or(Piece::Slice(&[]));
                sink.data(piece, true).await.map_err(Broke::Sink)
            }
        };
        relayed.map_err(|(Broke::Source(e) | Broke::Sink(e))| Failure::after_head(e))
    }
}

/// A response Weir makes from a source of its own (a static file), as for HTTP/2 streams.
impl ResponseStream for SendHalf {
    async fn send_relayed<S: Source>(
        &mut self,
        head: http::Response<()>,
        source: Option<&mut S>,
        sinking: Sinking<'_>,
        coding: Option<&mut Coding>,
        whole: Option<Bytes>,
    ) -> Result<(), Failure> {
        let stall = sinking.stall;
        self.send_head(head, stall)
            .await
            .map_err(Failure::after_head)?;
        sinking.trace.sent_grpc_status(sinking.grpc_status);
        self.relay_body(source, sinking, coding, whole)
            .await
            .inspect_err(|_| self.cut())
    }

    async fn send_whole(
        &mut self,
        head: http::Response<()>,
        body: &[u8],
        stall: Duration,
        trace: &mut Trace,
        grpc_status: Option<u32>,
    ) -> Result<(), ProxyError> {
        self.send_head(head, stall).await?;
        trace.sent_grpc_status(grpc_status);
        if !body.is_empty() {
            self.send_data(Bytes::copy_from_slice(body), stall).await?;
            trace.body_out = body.len() as u64;
        }
        self.finish(stall).await
    }

    fn cancel(&mut self) {
        self.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
    }

    fn cut(&mut self) {
        self.stop_stream(h3::error::Code::H3_INTERNAL_ERROR);
    }
}
