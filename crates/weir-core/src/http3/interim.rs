//! 1xx responses (103 Early Hints, 100, ...) relayed to an HTTP/3 client while its stream
//! waits for the upstream's final head, as informational HEADERS frames (RFC 9114 4.1),
//! within the same bounds as for HTTP/2 clients (`http2::interim`: the listener's
//! `max_informational` heads of `max_header_list_size` in all per response; no 101).
//!
//! The stream's sending half is shared between the wait and this relay: it is lent out
//! for each head ([`Lent`]) and given back when the send ends or is dropped (the wait may
//! end first: a timeout, the client gone), so no borrow is held across an await. A head
//! whose send failed or was dropped part-way leaves the stream reset, written no more
//! (`send`): no final head or error answer follows it.

use std::cell::Cell;
use std::time::Duration;

use http::Response;

use super::body::SendHalf;
use crate::codec::http1::ResponseHead;
use crate::error::ProxyError;
use crate::forward::h1::Interim;
use crate::http2::exchange::StreamRequest;
use crate::http2::interim::{Bounds, Relayed};
use crate::http2::respond::end_to_end_head;

/// A stream's sending half, shared by the wait for the final head and the 1xx relay.
pub(super) type Shared<'s> = Cell<Option<&'s mut SendHalf>>;

/// The client's stream as the place an upstream's 1xx heads go.
pub(super) struct H3Interim<'a, 's> {
    send: &'a Shared<'s>,
    relayed: &'a Relayed,
    bounds: Bounds,
    /// How long a head may wait for the client's flow-control credit.
    stall: Duration,
}

impl<'a, 's> H3Interim<'a, 's> {
    /// The 1xx relay of request `r`'s stream, whose sending half is in `send`.
    pub fn of(send: &'a Shared<'s>, r: &'a StreamRequest<'_>) -> H3Interim<'a, 's> {
        H3Interim {
            send,
            relayed: &r.relayed,
            // Weir sends HTTP/3 clients no 100 of its own: an upstream's goes through.
            bounds: r.interim_bounds(false),
            stall: r.target.listener.http2.stall_timeout,
        }
    }

    /// Sends `head` unless the bounds skip it, or the client's
    /// `SETTINGS_MAX_FIELD_SECTION_SIZE` does (h3 refuses such a head before writing any
    /// of it: the stream goes on). Returns whether it was sent; `Err`: the stream cannot
    /// be answered any more (`body::client_error`).
    async fn send(&mut self, head: Response<()>) -> Result<bool, ProxyError> {
        if !self.relayed.admit(self.bounds, &head) {
            return Ok(false);
        }
        let mut lent = Lent {
            from: self.send,
            send: self.send.take(),
        };
        // Never lent twice: the wait does not send while a 1xx head is sent.
        let Some(send) = lent.send.as_deref_mut() else {
            return Ok(false);
        };
        send.send_informational(head, self.stall).await
    }
}

impl Interim for H3Interim<'_, '_> {
    async fn relay(&mut self, head: &[u8], resp: &ResponseHead) -> Result<bool, ProxyError> {
        self.send(end_to_end_head(head, resp)).await
    }

    async fn relay_h2(&mut self, head: Response<()>) -> Result<bool, ProxyError> {
        // A failed send ends the wait: the stream is reset and takes no final head
        // (`send`).
        self.send(head).await
    }
}

/// The sending half lent out of its [`Shared`] place; back there when dropped.
struct Lent<'a, 's> {
    from: &'a Shared<'s>,
    send: Option<&'s mut SendHalf>,
}

impl Drop for Lent<'_, '_> {
    fn drop(&mut self) {
        self.from.set(self.send.take());
    }
}
