//! An HTTP/1.x request body (Content-Length or chunked) as the DATA of an HTTP/2 stream.
//!
//! A body that is already complete in the client buffer when the request is forwarded
//! (the usual small POST) is collected once into `Bytes`, so a refused stream or a retry
//! on another server sends it again without reading the client. A longer body is
//! streamed: decoded from the client buffer piece by piece, each piece sent within the
//! upstream stream's window before the next read, so Weir holds at most one client buffer
//! plus one window's worth per request. Chunk extensions and request trailers are dropped
//! (HTTP/2 has no place for the former; the latter are rare and an HTTP/1 client cannot
//! know the upstream speaks HTTP/2).

use std::cell::Cell;
use std::ops::Range;
use std::time::Duration;

use bytes::Bytes;
use h2::SendStream;
use tokio::io::AsyncRead;

use super::{send_windowed, UploadError};
use crate::buffer::Buffer;
use crate::codec::http1::{BodyFraming, ChunkedDecoder};
use crate::error::ProxyError;
use crate::forward::body::PumpError;
use crate::forward::h1::client_pump_error;
use crate::forward::Timeouts;
use crate::time::with_timeout;

/// Where the client's body framing is.
enum Framed {
    Length(u64),
    Chunked {
        decoder: ChunkedDecoder,
        limit: Option<u64>,
    },
    Done,
}

impl Framed {
    fn new(framing: BodyFraming, limit: Option<u64>) -> Framed {
        match framing {
            BodyFraming::Length(0) | BodyFraming::None | BodyFraming::UntilClose => Framed::Done,
            BodyFraming::Length(n) => Framed::Length(n),
            BodyFraming::Chunked => Framed::Chunked {
                decoder: ChunkedDecoder::new(),
                limit,
            },
        }
    }

    fn is_done(&self) -> bool {
        matches!(self, Framed::Done)
    }

    /// Decodes from the start of `data`: the payload found (a range of `data`, if any) and
    /// how many bytes of `data` are used up. `(None, 0)`: more input is needed.
    fn next(&mut self, data: &[u8]) -> Result<(Option<Range<usize>>, usize), PumpError> {
        match self {
            Framed::Done => Ok((None, 0)),
            Framed::Length(remaining) => {
                let n = (*remaining).min(data.len() as u64) as usize;
                *remaining -= n as u64;
                if *remaining == 0 {
                    *self = Framed::Done;
                }
                Ok(((n > 0).then_some(0..n), n))
            }
            Framed::Chunked { decoder, limit } => {
                let d = decoder.decode(data).map_err(|e| PumpError::Framing(e.0))?;
                if limit.is_some_and(|max| decoder.body_len() > max) {
                    return Err(PumpError::TooLarge);
                }
                if decoder.is_done() {
                    *self = Framed::Done;
                }
                Ok((d.data.filter(|r| !r.is_empty()), d.consumed))
            }
        }
    }
}

/// The request body of one request, for every attempt.
pub(super) struct RequestBody {
    framed: Framed,
    /// The whole body, when it was complete in the buffer.
    whole: Option<Bytes>,
    /// The buffered start of a streamed body (sent by the first attempt).
    first: Bytes,
    /// Bytes at the start of the client's buffer to consume (the head, and the body bytes
    /// taken) before a streamed body reads on; their request can then not be sent again.
    skip: usize,
}

impl RequestBody {
    /// Takes the body bytes of `buf` after the head's `head_len` (consumed when the body
    /// is streamed, else by the caller).
    pub(super) fn new(
        framing: BodyFraming,
        limit: Option<u64>,
        buf: &[u8],
        head_len: usize,
    ) -> Result<RequestBody, ProxyError> {
        let mut framed = Framed::new(framing, limit);
        let mut collected = Vec::new();
        let mut at = head_len;
        while !framed.is_done() && at < buf.len() {
            let (piece, used) = framed.next(&buf[at..]).map_err(client_pump_error)?;
            if let Some(r) = piece {
                collected.extend_from_slice(&buf[at..][r]);
            }
            at += used;
            if used == 0 {
                break;
            }
        }
        let collected = Bytes::from(collected);
        let (whole, first) = match framed.is_done() {
            true => (Some(collected), Bytes::new()),
            false => (None, collected),
        };
        Ok(RequestBody {
            framed,
            whole,
            first,
            skip: at,
        })
    }

    /// The bytes of the client's buffer the request still takes (its head, and the body
    /// bytes taken): none once a streamed body consumed them.
    pub(super) fn skip(&self) -> usize {
        self.skip
    }

    /// The whole body was taken from the client (whole in its buffer, or streamed to its
    /// end): the buffer starts at the client's next request once `skip` is consumed.
    pub(super) fn is_read(&self) -> bool {
        self.framed.is_done()
    }

    /// No DATA at all: the HEADERS frame ends the stream.
    pub(super) fn is_empty(&self) -> bool {
        self.whole.as_ref().is_some_and(Bytes::is_empty)
    }

    /// The whole body arrived with the head.
    pub(super) fn is_whole(&self) -> bool {
        self.whole.is_some()
    }

    /// Sends the body as DATA within the upstream's window, then the end of the stream.
    /// `consumed` counts the bytes taken from the client (a streamed body cannot be sent
    /// again once it is above zero).
    pub(super) async fn upload<R: AsyncRead + Unpin>(
        &mut self,
        src: &mut R,
        buf: &mut Buffer,
        up: &mut SendStream<Bytes>,
        consumed: &Cell<u64>,
        timeouts: Timeouts,
    ) -> Result<(), UploadError> {
        let (client_timeout, upstream_timeout) = (timeouts.client, timeouts.upstream);
        let upstream = |_| UploadError::Upstream;
        if let Some(whole) = &self.whole {
            let piece = whole.clone();
            return send_counted(up, piece, consumed, upstream_timeout, true)
                .await
                .map_err(upstream);
        }
        buf.consume(std::mem::take(&mut self.skip));
        let first = std::mem::take(&mut self.first);
        send_counted(up, first, consumed, upstream_timeout, false)
            .await
            .map_err(upstream)?;
        let client = |e: PumpError| UploadError::Client(client_pump_error(e));
        loop {
            if !buf.is_empty() {
                let (piece, used) = self.framed.next(buf.filled()).map_err(client)?;
                let piece = piece.map(|r| Bytes::copy_from_slice(&buf.filled()[r]));
                buf.consume(used);
                // END_STREAM rides on the body's last DATA (an empty one after a last
                // chunk that came alone).
                let last = self.framed.is_done();
                if piece.is_some() || last {
                    let piece = piece.unwrap_or_default();
                    send_counted(up, piece, consumed, upstream_timeout, last)
                        .await
                        .map_err(upstream)?;
                }
                if last {
                    return Ok(());
                }
                if used > 0 {
                    continue;
                }
            }
            match with_timeout(client_timeout, buf.read_from(src)).await {
                Err(_) => return Err(client(PumpError::ReadTimeout)),
                Ok(Err(e)) => return Err(client(PumpError::Read(e.kind()))),
                Ok(Ok(0)) => return Err(client(PumpError::Truncated)),
                Ok(Ok(_)) => {}
            }
        }
    }
}

/// Sends `piece` within the window (END_STREAM on its last frame when `end`), counting it
/// as taken from the client.
async fn send_counted(
    up: &mut SendStream<Bytes>,
    piece: Bytes,
    consumed: &Cell<u64>,
    upstream_timeout: Duration,
    end: bool,
) -> Result<(), ProxyError> {
    consumed.set(consumed.get() + piece.len() as u64);
    send_windowed(up, piece, upstream_timeout, None, end).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` fed in two parts split at `cut`, as reads would deliver it.
    fn decode_split(framing: BodyFraming, input: &[u8], cut: usize) -> (Vec<u8>, usize) {
        let mut framed = Framed::new(framing, None);
        let mut out = Vec::new();
        let mut pending = input[..cut].to_vec();
        let mut fed = cut;
        let mut used_total = 0;
        loop {
            let (piece, used) = framed.next(&pending).expect("valid body");
            if let Some(r) = piece {
                out.extend_from_slice(&pending[r]);
            }
            pending.drain(..used);
            used_total += used;
            if framed.is_done() {
                return (out, used_total);
            }
            if used == 0 {
                assert!(fed < input.len(), "ran out of input");
                pending.extend_from_slice(&input[fed..]);
                fed = input.len();
            }
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
        let mut framed = Framed::new(BodyFraming::Chunked, Some(2));
        assert_eq!(framed.next(b"3\r\nabc\r\n"), Err(PumpError::TooLarge));
        let mut framed = Framed::new(BodyFraming::Chunked, None);
        assert!(matches!(framed.next(b"zz\r\n"), Err(PumpError::Framing(_))));
    }
}
