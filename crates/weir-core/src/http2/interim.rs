//! 1xx responses (103 Early Hints, 102, 100, ...) relayed to an HTTP/2 client while its
//! stream waits for the upstream's final head, as informational HEADERS frames (RFC 9113
//! 8.1).
//!
//! The stream's `SendResponse` is shared between the wait, which polls it for the client's
//! reset (`send::unless_reset`), and the relay of the 1xx heads that arrive meanwhile: both
//! run in the stream's task and neither holds it across an await, so a `RefCell` is enough.
//!
//! Bounds: at most `max_informational` heads per response, and at most the listener's
//! `max_header_list_size` of their fields together (counted as HTTP/2 does: name, value
//! and 32 per field); h2 queues HEADERS frames without flow control, so an upstream sending
//! 1xx in a loop must not grow that queue. Both are per response, not per try: the
//! [`Relayed`] count lives with the request, across the servers a retry goes to. A `100`
//! is dropped when Weir already sent its own for `expect: 100-continue` (the client gets
//! one); 101 is never relayed (HTTP/2 has no such upgrade). The final head's wait stays
//! bounded by the response timeout: the relay does not restart it.

use std::cell::{Cell, RefCell};
use std::task::{Context, Poll};

use bytes::Bytes;
use h2::server::SendResponse;
use h2::Reason;
use http::{Response, StatusCode};

use super::exchange::StreamRequest;
use super::respond::end_to_end_head;
use crate::codec::http1::ResponseHead;
use crate::error::ProxyError;
use crate::forward::h1::Interim;

/// The 1xx heads relayed for one response so far, whichever servers they came from.
#[derive(Debug, Default)]
pub struct Relayed {
    heads: Cell<u32>,
    /// Their fields' size as HTTP/2 counts it (name + value + 32 per field).
    bytes: Cell<u32>,
}

impl Relayed {
    /// Whether the client has a 1xx of this response: the request is not tried again on
    /// another server (`Replay::responded`).
    pub fn any(&self) -> bool {
        self.heads.get() > 0
    }

    /// Whether the informational `head` goes to the client within `bounds` (counted if
    /// so): not a 101, not a 100 when Weir sent its own, and within the count and size.
    pub(crate) fn admit(&self, bounds: Bounds, head: &Response<()>) -> bool {
        let status = head.status();
        let skip = !status.is_informational()
            || status == StatusCode::SWITCHING_PROTOCOLS
            || (status == StatusCode::CONTINUE && bounds.sent_continue)
            || self.heads.get() >= bounds.heads;
        if skip {
            return false;
        }
        let bytes = self.bytes.get().saturating_add(list_size(head));
        if bytes > bounds.bytes {
            return false;
        }
        self.heads.set(self.heads.get() + 1);
        self.bytes.set(bytes);
        true
    }
}

/// The bounds of one response's 1xx heads (the listener's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// `max_informational`.
    pub heads: u32,
    /// `max_header_list_size`: of all the heads together.
    pub bytes: u32,
    /// Weir answered `expect: 100-continue` itself: an upstream's 100 is not relayed.
    pub sent_continue: bool,
}

/// The client's stream while the upstream's final head is awaited.
pub(super) struct ClientStream<'a> {
    /// The stream's response half (the final head's, once the wait is over).
    pub respond: RefCell<&'a mut SendResponse<Bytes>>,
    relayed: &'a Relayed,
    bounds: Bounds,
    /// The client reset the stream (seen by `gone`).
    pub reset: Cell<bool>,
}

impl<'a> ClientStream<'a> {
    /// The stream `respond` of the request `r` (its 1xx heads: `interim_bounds`; `body`:
    /// the request has one).
    pub fn new(r: &'a StreamRequest<'_>, respond: &'a mut SendResponse<Bytes>, body: bool) -> Self {
        ClientStream {
            respond: RefCell::new(respond),
            relayed: &r.relayed,
            bounds: r.interim_bounds(body),
            reset: Cell::new(false),
        }
    }

    /// Ends when the client resets the stream (or its connection fails), with the error
    /// the wait fails with.
    pub async fn gone(&self) -> ProxyError {
        let _ = std::future::poll_fn(|cx| self.poll_reset(cx)).await;
        self.reset.set(true);
        ProxyError::ClientClosed
    }

    /// Polls for the client's reset of the stream (or its connection's failure).
    pub fn poll_reset(&self, cx: &mut Context<'_>) -> Poll<Result<Reason, h2::Error>> {
        self.respond.borrow_mut().poll_reset(cx)
    }

    /// Sends the informational `head` unless the bounds above skip it. Returns whether it
    /// was sent; `Err`: the stream is gone.
    pub fn send(&self, head: Response<()>) -> Result<bool, ()> {
        if !self.relayed.admit(self.bounds, &head) {
            return Ok(false);
        }
        let mut respond = self.respond.borrow_mut();
        respond.send_informational(head).map_err(|_| ())?;
        Ok(true)
    }
}

/// The size of `head`'s header list as HTTP/2 counts it (RFC 9113 6.5.2), `:status`
/// included.
fn list_size(head: &Response<()>) -> u32 {
    let fields = head.headers().iter();
    let size = fields.fold(":status".len() + 3 + 32, |n, (name, value)| {
        n + name.as_str().len() + value.len() + 32
    });
    u32::try_from(size).unwrap_or(u32::MAX)
}

/// The client's stream takes the upstream's 1xx heads: an HTTP/1.1 upstream's as
/// `respond::end_to_end_head` makes them (the route's `response_headers` rules are for the final
/// head only); an HTTP/2 upstream's as they came. A client gone ends the wait
/// through its reset (`gone`), not here.
impl Interim for &ClientStream<'_> {
    async fn relay(&mut self, head: &[u8], resp: &ResponseHead) -> Result<bool, ProxyError> {
        let response = end_to_end_head(head, resp);
        self.send(response).map_err(|()| ProxyError::ClientClosed)
    }

    async fn relay_h2(&mut self, head: Response<()>) -> Result<bool, ProxyError> {
        Ok(self.send(head).unwrap_or(false))
    }
}
