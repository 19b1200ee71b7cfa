//! An HTTP/1.x request body (Content-Length or chunked) as the DATA of an HTTP/2 stream.
//!
//! A body that is already complete in the client buffer when the request is forwarded
//! (the usual small POST) is decoded once into `Bytes`, so a refused stream or a retry on
//! another server sends it again without reading the client. A longer body is streamed
//! through the one relay (`forward::relay`): decoded from the client buffer piece by piece,
//! each piece sent within the upstream stream's window before the next read, so Weir holds
//! at most one client buffer plus one window's worth per request. Chunk extensions are
//! dropped (HTTP/2 has no place for them); a chunked body's trailer fields end the stream
//! as a trailing HEADERS frame, filtered as on every path (`forward::trailer`), whole
//! bodies' (kept with them for another try) and streamed ones' alike.

use std::cell::Cell;

use bytes::Bytes;
use h2::SendStream;
use tokio::io::AsyncRead;

use crate::buffer::Buffer;
use crate::codec::http1::{BodyFraming, RequestHead};
use crate::error::ProxyError;
use crate::forward::body::BodyState;
use crate::forward::relay::{relay, Broke, H2Upload, Http1Source, Peer};
use crate::forward::request_head::HeadNames;
use crate::forward::trailer::connection_listed;
use crate::forward::Timeouts;

/// The request body of one request, for every try.
pub(crate) struct RequestBody {
    framing: BodyFraming,
    limit: Option<u64>,
    /// The whole body, decoded, when it was complete in the buffer (sent again as it is
    /// on another try).
    pub whole: Option<Bytes>,
    /// Bytes at the start of the client's buffer the request takes (its head, and the
    /// whole body): consumed by the caller once answered (none once a streamed body
    /// consumed them).
    pub skip: usize,
    /// A streamed body was read to its end.
    read: bool,
    /// A [`Self::whole`] body's trailer field lines, less those its head's `Connection`
    /// lists (`None`: it has none).
    pub trailers: Option<Bytes>,
    /// A streamed body's head's `Connection` values that name fields
    /// (`trailer::connection_listed`): its trailer fields of those names stay out.
    listed: Vec<u8>,
}

impl RequestBody {
    /// The body of `req`, whose head starts `buf` (nothing consumed here).
    pub(crate) fn new(
        req: &RequestHead,
        limit: Option<u64>,
        buf: &[u8],
    ) -> Result<RequestBody, ProxyError> {
        let (framing, head_len) = (req.framing, req.head_len);
        let mut state = BodyState::new(framing, true, limit).keeping_trailers();
        let mut body = RequestBody {
            framing,
            limit,
            whole: Some(Bytes::new()),
            skip: head_len,
            read: false,
            trailers: None,
            listed: Vec::new(),
        };
        if state.is_done() {
            return Ok(body);
        }
        // Decoded on a copy: the client's bytes stay as they came until answered.
        let mut copy = buf[head_len..].to_vec();
        let taken = state.take(&mut copy);
        let (forward, used) = taken.map_err(|e| Peer::Client.error(e))?;
        let listed = || connection_listed(buf, &req.headers, framing);
        if !state.is_done() {
            body.whole = None;
            body.listed = listed();
            return Ok(body);
        }
        copy.truncate(forward);
        body.whole = Some(Bytes::from(copy));
        body.skip += used;
        if !state.trailers().is_empty() {
            state.drop_listed(&listed());
            body.trailers = Some(Bytes::copy_from_slice(state.trailers()));
        }
        Ok(body)
    }

    /// The whole body was taken from the client (whole in its buffer, or streamed to its
    /// end): the buffer starts at the client's next request once `skip` is consumed.
    pub(crate) fn is_read(&self) -> bool {
        self.whole.is_some() || self.read
    }

    /// No DATA and no trailers: the HEADERS frame ends the stream.
    pub(crate) fn is_empty(&self) -> bool {
        self.whole.as_ref().is_some_and(Bytes::is_empty) && self.trailers.is_none()
    }

    /// Sends a body that is not [`Self::whole`] as DATA within the upstream's window,
    /// then its trailer fields the request head would carry (`names`) or the end of the
    /// stream, read from the client (`src`, `buf`). `consumed` is above zero once body
    /// bytes are taken from the client (the body cannot be sent again then): set before
    /// the first of them is framed.
    pub(crate) async fn stream<R: AsyncRead + Unpin>(
        &mut self,
        src: &mut R,
        buf: &mut Buffer,
        up: &mut SendStream<Bytes>,
        consumed: &Cell<u64>,
        timeouts: Timeouts,
        names: HeadNames<'_>,
    ) -> Result<(), Broke> {
        // The head goes (the caller keeps a copy for another try); the body's bytes stay
        // as they came until the first of them is framed: until then a refused stream
        // or a retried status sends the request again as it was.
        buf.consume(std::mem::take(&mut self.skip));
        let state = BodyState::new(self.framing, true, self.limit).keeping_trailers();
        let mut source = Http1Source::new(src, buf, state, timeouts.client, Peer::Client)
            .paced(timeouts.min_body_rate, None);
        source.listed = self.listed.clone();
        source.arrival().await.map_err(Broke::Source)?;
        consumed.set(1);
        let mut sink = H2Upload {
            send: up,
            timeout: timeouts.upstream,
            first: false,
            names,
        };
        let relayed = relay(&mut source, &mut sink, None).await;
        self.read = relayed.is_ok();
        relayed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::body::PumpError;

    /// Decodes `input` fed in two parts split at `cut`, as reads would deliver it.
    fn decode_split(framing: BodyFraming, input: &[u8], cut: usize) -> (Vec<u8>, usize) {
        let mut state = BodyState::new(framing, true, None);
        let mut out = Vec::new();
        let mut pending = input[..cut].to_vec();
        let mut fed = cut;
        let mut used_total = 0;
        loop {
            let (forward, used) = state.take(&mut pending).expect("valid body");
            out.extend_from_slice(&pending[..forward]);
            pending.drain(..used);
            used_total += used;
            if state.is_done() {
                return (out, used_total);
            }
            assert!(fed < input.len(), "ran out of input");
            pending.extend_from_slice(&input[fed..]);
            fed = input.len();
        }
    }

    #[test]
    fn decodes_chunked_and_length_bodies_split_at_every_byte() {
        let chunked = b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nx-trailer: 1\r\n\r\nGET /next";
        let body_len = chunked.len() - b"GET /next".len();
        for cut in 0..=body_len {
            let (out, used) = decode_split(BodyFraming::Chunked, chunked, cut);
            assert_eq!(out, b"abcde", "cut {cut}");
            assert_eq!(used, body_len, "cut {cut}");
        }
        let plain = b"hello worldGET";
        for cut in 0..=11 {
            let (out, used) = decode_split(BodyFraming::Length(11), plain, cut);
            assert_eq!(out, b"hello world", "cut {cut}");
            assert_eq!(used, 11);
        }
    }

    #[test]
    fn chunked_limit_and_bad_framing_are_errors() {
        let mut framed = BodyState::new(BodyFraming::Chunked, true, Some(2));
        assert_eq!(
            framed.take(&mut b"3\r\nabc\r\n".to_vec()),
            Err(PumpError::TooLarge)
        );
        let mut framed = BodyState::new(BodyFraming::Chunked, true, None);
        assert!(matches!(
            framed.take(&mut b"zz\r\n".to_vec()),
            Err(PumpError::Framing(_))
        ));
    }
}
