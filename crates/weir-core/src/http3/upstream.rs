//! One HTTP/3 stream's exchange with an HTTP/2 upstream (`protocol = "h2"` / `"h2c"`, so
//! gRPC): the tries of an HTTP/2 client's stream (`http2::upstream`'s sender, generic
//! over the client's side), with the HTTP/3 stream as that side: its DATA and trailers
//! uploaded ([`H3Source`]) while the response's head, DATA and trailers go into the
//! stream as any response does (`ClientSide::respond`), both ways at once (bidirectional gRPC streaming); 1xx
//! heads go to the client before the final one (`interim`). A client whose connection closes while
//! the final head is awaited has the upstream's stream reset at once (`gone`); one that
//! only stops its stream is noticed by the relay.

use std::cell::Cell;
use std::future::Future;

use bytes::Bytes;
use h2::SendStream;
use http::request::Parts;

use super::body::H3Source;
use super::exchange::{forward, Body};
use super::interim::{H3Interim, Shared};
use super::send::H3Responder;
use crate::error::ProxyError;
use crate::forward::h1::Interim;
use crate::forward::relay::Broke;
use crate::forward::request_head::HeadNames;
use crate::forward::{Failure, Timeouts};
use crate::http2::exchange::StreamRequest;
use crate::http2::respond::ResponseStream;
use crate::http2::upstream::{upload, ClientBody, ClientSide, H2Facts, Relayed};
use crate::request::Trace;

/// Forwards the stream's request `r` (the client's `parts` with its `facts`, its `body`)
/// to an HTTP/2 upstream and relays the response into the stream `to`. On `Err` with `Reached::Nothing` the
/// caller answers.
pub(super) async fn forward_h2(
    r: &StreamRequest<'_>,
    facts: &H2Facts,
    parts: Parts,
    body: Option<Body<'_>>,
    to: &mut H3Responder<'_>,
    trace: &mut Trace,
) -> Result<(), Failure> {
    let mut client = H3Client {
        quic: to.quic,
        closed: Cell::new(false),
        send: Cell::new(Some(&mut *to.send)),
        r,
    };
    let (parts, out) = (Some(parts), &mut Vec::new());
    let (relayed, body) = r
        .drive_h2(facts, parts, body, &mut client, out, trace)
        .await;
    match relayed {
        // The server chose HTTP/1.1 (an `auto` one sharing the address): HTTP/1.1 then.
        Ok(Relayed::Http1) => forward(r, body, to, trace).await,
        Ok(Relayed::Over(result)) => result,
        Ok(Relayed::Stored(reply)) => r.reply_from_store(to.send, *reply, trace).await,
        Err(failure) => Err(failure),
    }
}

impl ClientBody for Body<'_> {
    async fn upload(
        &mut self,
        up: &mut SendStream<Bytes>,
        consumed: &Cell<u64>,
        limit: Option<u64>,
        timeouts: Timeouts,
        names: HeadNames<'_>,
    ) -> Result<(), Broke> {
        let mut source = H3Source {
            body: &mut *self.recv,
            first: self.first.take(),
            timeout: timeouts.client,
            pace: timeouts.min_body_rate.map(crate::time::Pace::new),
            total: consumed,
            limit,
            length: self.length,
        };
        upload(&mut source, up, timeouts.upstream, names).await
    }
}

/// An HTTP/3 client's stream as the side an HTTP/2 upstream's response goes to: its
/// sending half shared by the wait for the final head and the 1xx relay (`interim`).
struct H3Client<'a, 's> {
    /// The client's connection: when it closes, the upstream's stream is reset at once
    /// (`gone`), not left to its response timeout.
    quic: &'a quinn::Connection,
    /// `gone` saw it close.
    closed: Cell<bool>,
    send: Shared<'s>,
    r: &'a StreamRequest<'a>,
}

impl ClientSide for H3Client<'_, '_> {
    /// Gone: the client's connection closed (the client left, idled out, or a budget
    /// closed it). A stream the client stopped on an open connection is noticed by the
    /// relay once the head comes: the h3 crate does not report STOP_SENDING before a
    /// write.
    fn waiting(&mut self) -> (impl Interim + '_, impl Future<Output = ProxyError> + '_) {
        let client = &*self;
        let gone = async {
            client.quic.closed().await;
            client.closed.set(true);
            ProxyError::ClientClosed
        };
        (H3Interim::of(&client.send, client.r), gone)
    }

    fn was_reset(&self) -> bool {
        self.closed.get()
    }

    /// Always back in its place: a 1xx relay lends it only while it sends.
    fn stream(&mut self) -> Result<&mut impl ResponseStream, Failure> {
        let send = self.send.get_mut().as_deref_mut();
        send.ok_or(Failure::from(ProxyError::ClientClosed))
    }
}
