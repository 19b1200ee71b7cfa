//! A route cache's miss on an HTTP/2 or HTTP/3 client's stream, as for HTTP/1.x clients
//! (`forward::exchange::forward_filling`): answered from the entry another request is
//! fetching (collapsed forwarding) or a large disk entry read first; else forwarded, the
//! [`Fill`] in `StreamRequest::fill` for the exchange with an HTTP/1.1 upstream (its
//! conditional lines in the upstream head, the response stored beside the client's
//! relay, or a stored entry answering instead of a `304` or a 5xx), and a stale entry
//! answering for a failure nothing was sent for. Every answer from the store is a
//! `files::Reply`, sent on the stream as a static file's (`respond_stream`).

use crate::buffer::Buffer;
use crate::cache::{CacheResult, Cause, Fill, Recorder};
use crate::codec::http1::{BodyFraming, ResponseHead};
use crate::connector::UpstreamStream;
use crate::files::{Reply, Under};
use crate::forward::driver::{Accepted, Exchange};
use crate::forward::exchange::push_before_end;
use crate::forward::h1::reuse;
use crate::forward::{Carrier, Failure, Reached};

use super::exchange::{StreamRequest, Trace};
use super::files::respond_stream;
use super::respond::ResponseStream;

/// Forwards `r`, a route cache's miss (`fill`), with `forward` (the stream's exchange,
/// over `carrier`), answering from the store where it may.
pub(crate) async fn forward_filling<R: ResponseStream>(
    r: &StreamRequest<'_>,
    (mut fill, carrier): (Box<Fill>, Carrier),
    respond: &mut R,
    trace: &mut Trace,
    forward: impl AsyncFnOnce(&mut R, &mut Trace) -> Result<(), Failure>,
) -> Result<(), Failure> {
    trace.cache = Some(CacheResult::Miss);
    let under = Under::of_target(&r.target);
    if let Some(reply) = fill.collapse().await {
        return respond_stream(respond, &r.request, under, reply, trace).await;
    }
    // An HTTP/2 upstream's response is not stored yet: relayed uncached, the fill let go
    // now (requests waiting for it go upstream themselves).
    if carrier == Carrier::Http1 {
        r.fill.set(Some(fill));
    }
    let result = forward(respond, trace).await;
    let Some(fill) = r.fill.take() else {
        return result;
    };
    let failure = match result {
        Err(failure) if failure.reached == Reached::Nothing => failure,
        other => return other,
    };
    let stale = Cause::of(failure.error).and_then(|cause| fill.stale_answer(cause));
    match stale {
        Some(reply) => respond_stream(respond, &r.request, under, reply, trace).await,
        None => Err(failure),
    }
}

impl StreamRequest<'_> {
    /// The conditional lines of the miss's stale entry, for the upstream head (empty: none).
    pub(crate) fn push_conditions(&self, out: &mut Vec<u8>) {
        let Some(fill) = self.fill.take() else {
            return;
        };
        push_before_end(out, fill.conditional_lines());
        self.fill.set(Some(fill));
    }

    /// The stored entry that answers instead of the HTTP/1.1 upstream's response `resp`
    /// (its head in `up_buf`): a `304` that refreshed it, a 5xx it answers for. The try
    /// counts with the upstream's status; the connection (`sent`) is pooled only when
    /// `resp` has no body. `Err`: the response is relayed, `sent` given back.
    pub(crate) fn answer_from_store(
        &self,
        x: &Exchange<'_>,
        (up_buf, resp): (&mut Buffer, &ResponseHead),
        accepted: &Accepted<'_, ()>,
        sent: (UpstreamStream, bool),
    ) -> Result<Reply, (UpstreamStream, bool)> {
        let Some(fill) = self.fill.take() else {
            return Err(sent);
        };
        let Some(reply) = fill.answer_instead(up_buf.filled(), resp) else {
            self.fill.set(Some(fill));
            return Err(sent);
        };
        accepted.count(Ok(resp.status));
        up_buf.consume(resp.head_len);
        let (stream, request_done) = sent;
        let bodiless = matches!(resp.framing, BodyFraming::None | BodyFraming::Length(0));
        if resp.keeps_alive() && request_done && bodiless && up_buf.is_empty() {
            reuse(
                x,
                accepted.server,
                accepted.metrics,
                stream,
                accepted.head_at,
            );
        }
        Ok(reply)
    }

    /// The recorder of the HTTP/1.1 upstream's response `resp` (its head in `buf`), if
    /// the miss may store it; its `Cache-Status` goes into `head`, the client's.
    pub(crate) fn admit(
        &self,
        buf: &[u8],
        resp: &ResponseHead,
        head: &mut http::Response<()>,
    ) -> Option<Box<Recorder>> {
        let fill = self.fill.take()?;
        if let Some(value) = fill.status_value() {
            let value = http::HeaderValue::from_static(value);
            head.headers_mut().append("cache-status", value);
        }
        // A stream's body pieces come decoded (`BodyState::new(.., true, ..)`).
        fill.admit(buf, resp, true)
    }
}
