//! Sending to the client within its flow-control window, and noticing its resets.
//!
//! Every wait of a stream (for the upstream, for window capacity) also polls the stream's
//! reset state, so a client RST_STREAM ends the wait at once: the exchange drops its
//! upstream connection instead of finishing (or pooling) a request nobody wants.

use std::future::{poll_fn, Future};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use h2::{Reason, SendStream};

use super::outbox;
use crate::error::ProxyError;
use crate::forward::head::Edits;
use crate::forward::relay::{Piece, Sink, Trailers};
use crate::request::Trace;
use crate::time::with_timeout;

/// Why a stream's wait ended early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The client reset the stream (a cancellation).
    Reset,
    /// The stream or connection failed otherwise; the error says how.
    Error(ProxyError),
}

impl From<ProxyError> for Stop {
    fn from(error: ProxyError) -> Stop {
        Stop::Error(error)
    }
}

impl Stop {
    /// The error a stream's wait ends with; a client reset (a cancelled request) is marked
    /// in `trace` (`Trace::reset`).
    pub fn noted(self, trace: &mut Trace) -> ProxyError {
        trace.reset |= self == Stop::Reset;
        self.into()
    }
}

impl From<Stop> for ProxyError {
    fn from(stop: Stop) -> ProxyError {
        match stop {
            Stop::Reset => ProxyError::ClientClosed,
            Stop::Error(e) => e,
        }
    }
}

fn stop_of(reset: Result<Reason, h2::Error>) -> Stop {
    match reset {
        Ok(_) => Stop::Reset,
        Err(_) => Stop::Error(ProxyError::ClientClosed),
    }
}

/// Runs `fut` to completion unless the client resets the stream first (`poll_reset`: the
/// `poll_reset` of either half of the stream's response).
pub async fn unless_reset<F: Future>(
    mut poll_reset: impl FnMut(&mut Context<'_>) -> Poll<Result<Reason, h2::Error>>,
    fut: F,
) -> Result<F::Output, Stop> {
    let mut fut = std::pin::pin!(fut);
    poll_fn(|cx| {
        if let Poll::Ready(r) = poll_reset(cx) {
            return Poll::Ready(Err(stop_of(r)));
        }
        fut.as_mut().poll(cx).map(Ok)
    })
    .await
}

/// Sends `data` (ending the stream after it when `end`) in slices of it, as the client's
/// window, the send buffer (`max_send_buffer`) and the connection's
/// (`max_connection_send_buffer`, `outbox`) allow. Waits at most `timeout` for each piece
/// of window: a client that stops reading gets its stream reset.
pub async fn send_bytes(
    send: &mut SendStream<Bytes>,
    mut data: Bytes,
    end: bool,
    timeout: Duration,
) -> Result<(), Stop> {
    let closed = |_| Stop::Error(ProxyError::ClientClosed);
    if data.is_empty() && end {
        return send.send_data(data, true).map_err(closed);
    }
    // Window granted and not yet used: the `h2` crate reports only increases of it.
    let mut credit = 0;
    while !data.is_empty() {
        if credit == 0 {
            credit = window(send, data.len(), timeout).await?;
            continue;
        }
        let n = outbox::within(send, credit, timeout).await?;
        let piece = data.split_to(n);
        credit -= n;
        send.send_data(piece, end && data.is_empty())
            .map_err(closed)?;
        outbox::handed(n);
    }
    Ok(())
}

/// Waits (at most `timeout`, or until the client resets the stream) for window to send
/// up to `want` bytes; returns how many may go now.
pub(super) async fn window(
    send: &mut SendStream<Bytes>,
    want: usize,
    timeout: Duration,
) -> Result<usize, Stop> {
    send.reserve_capacity(want);
    let window = poll_fn(|cx| {
        if let Poll::Ready(r) = send.poll_reset(cx) {
            return Poll::Ready(Err(stop_of(r)));
        }
        send.poll_capacity(cx).map(|n| {
            n.and_then(Result::ok)
                .ok_or(Stop::Error(ProxyError::ClientClosed))
        })
    });
    let n = with_timeout(timeout, window)
        .await
        .map_err(|_| Stop::Error(ProxyError::ClientTimeout))??;
    Ok(n.min(want))
}

/// A client's stream as the sink of a response body: DATA within the client's window
/// (`stall` for each wait), then the trailers as a trailing HEADERS frame, less what may
/// not be a trailer (`trailers`: what RFC 9110 6.5.1 forbids, connection-specific fields,
/// past `max_trailers`, and the names the route took out of the head). A reset of the
/// stream ends every wait of the relay (`trace.reset`).
pub(crate) struct StreamSink<'s> {
    pub send: &'s mut SendStream<Bytes>,
    pub sinking: Sinking<'s>,
}

impl Sink for StreamSink<'_> {
    async fn data(&mut self, piece: Piece<'_>, last: bool) -> Result<(), ProxyError> {
        let data = piece.into_bytes();
        let len = data.len() as u64;
        let sent = send_bytes(self.send, data, last, self.sinking.stall).await;
        sent.map_err(|stop| stop.noted(self.sinking.trace))?;
        self.sinking.trace.body_out += len;
        Ok(())
    }

    async fn end(&mut self, trailers: Trailers<'_>) -> Result<(), ProxyError> {
        let (edits, max_trailers) = (self.sinking.edits, self.sinking.max_trailers);
        let dropped = |name: &[u8]| edits.drops(name);
        let fields = match trailers {
            Trailers::None => None,
            Trailers::Lines(lines) => super::trailers::to_h2(lines, max_trailers, dropped),
            Trailers::Fields(fields) => super::trailers::keep(fields, max_trailers, dropped),
        };
        let Some(fields) = fields else {
            let ended = send_bytes(self.send, Bytes::new(), true, self.sinking.stall).await;
            return ended.map_err(|stop| stop.noted(self.sinking.trace));
        };
        let status = self.sinking.trace.grpc_status_in(&fields);
        self.send
            .send_trailers(fields)
            .map_err(|_| ProxyError::ClientClosed)?;
        self.sinking.trace.sent_grpc_status(status);
        Ok(())
    }

    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<ProxyError> {
        self.send
            .poll_reset(cx)
            .map(|r| stop_of(r).noted(self.sinking.trace))
    }
}

impl<'s> Sinking<'s> {
    /// A relay with the listener's HTTP/2 settings `http2` (its stall timeout, its
    /// trailers' size), no `grpc-status` to note.
    pub fn of(http2: &weir_config::Http2, edits: &'s Edits<'s>, trace: &'s mut Trace) -> Self {
        Sinking {
            edits,
            trace,
            stall: http2.stall_timeout,
            max_trailers: http2.max_header_list_size,
            grpc_status: None,
        }
    }
}

/// Where and how a body is relayed into a client's stream.
pub(crate) struct Sinking<'s> {
    /// What the route does to the head (the names it drops leave the trailers too).
    pub edits: &'s Edits<'s>,
    /// Body bytes sent, the `grpc-status` sent, the client's reset.
    pub trace: &'s mut Trace,
    /// How long the client's window may stay shut.
    pub stall: std::time::Duration,
    pub max_trailers: u32,
    /// The head's `grpc-status` (`Trace::grpc_status_in`), noted once the head went out.
    pub grpc_status: Option<u32>,
}
