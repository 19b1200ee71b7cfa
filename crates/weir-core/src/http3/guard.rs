//! The QUIC connection the h3 server runs on, watched for the abuse HTTP/2's glitch budget
//! answers there (`http2::budget`): unidirectional streams past the three HTTP/3 needs
//! (control and QPACK's two; more are reserved or unknown types, which h3 stops and
//! forgets, so a client could open them without end), and frames on the control stream
//! after its SETTINGS (GOAWAY, MAX_PUSH_ID, CANCEL_PUSH and unknown types, which h3
//! ignores; not PRIORITY_UPDATE, which browsers send). Each is a glitch of the connection (`Conn::glitch`). A control-stream frame
//! longer than [`MAX_CONTROL_FRAME`] closes the connection at once (`Conn::overload`):
//! h3 buffers a frame's whole payload before it decodes it, so one frame declaring 2^40
//! bytes would grow its buffer at line rate for the connection's life. Request streams
//! pass untouched: the watch costs nothing per request.

use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId};

use super::conn::Conn;

/// Unidirectional streams a client needs (RFC 9114 6.2: control, QPACK encoder and
/// decoder).
const NEEDED_UNI_STREAMS: u32 = 3;

/// `h3_quinn`'s connection, its unidirectional streams watched.
pub(super) struct Guarded {
    inner: h3_quinn::Connection,
    conn: Rc<Conn>,
    /// Unidirectional streams the client opened so far.
    uni: u32,
}

impl Guarded {
    pub fn new(inner: h3_quinn::Connection, conn: Rc<Conn>) -> Guarded {
        Guarded {
            inner,
            conn,
            uni: 0,
        }
    }
}

impl quic::Connection<Bytes> for Guarded {
    type RecvStream = Watched;
    type OpenStreams = h3_quinn::OpenStreams;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Watched, ConnectionErrorIncoming>> {
        let accepted = <h3_quinn::Connection as quic::Connection<Bytes>>::poll_accept_recv(
            &mut self.inner,
            cx,
        );
        accepted.map_ok(|inner| {
            self.uni = self.uni.saturating_add(1);
            if self.uni > NEEDED_UNI_STREAMS {
                self.conn.glitch();
            }
            Watched {
                inner,
                conn: self.conn.clone(),
                frames: Frames::default(),
            }
        })
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, ConnectionErrorIncoming>> {
        quic::Connection::<Bytes>::poll_accept_bidi(&mut self.inner, cx)
    }

    fn opener(&self) -> h3_quinn::OpenStreams {
        quic::Connection::<Bytes>::opener(&self.inner)
    }
}

impl quic::OpenStreams<Bytes> for Guarded {
    type BidiStream = h3_quinn::BidiStream<Bytes>;
    type SendStream = h3_quinn::SendStream<Bytes>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, StreamErrorIncoming>> {
        self.inner.poll_open_bidi(cx)
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
        self.inner.poll_open_send(cx)
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        quic::OpenStreams::<Bytes>::close(&mut self.inner, code, reason);
    }
}

/// A client's unidirectional stream; on the control stream, each frame after the first
/// (SETTINGS) is a glitch.
pub(super) struct Watched {
    inner: h3_quinn::RecvStream,
    conn: Rc<Conn>,
    frames: Frames,
}

impl quic::RecvStream for Watched {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        let polled = self.inner.poll_data(cx);
        if let Poll::Ready(Ok(Some(data))) = &polled {
            match self.frames.feed(data.chunk()) {
                Ok(frames) => (0..frames).for_each(|_| self.conn.glitch()),
                // h3 is handed this chunk still; the closed connection ends the stream.
                Err(TooLong) => self.conn.overload(b"control frame too large"),
            }
        }
        polled
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.inner.stop_sending(error_code);
    }

    fn recv_id(&self) -> StreamId {
        self.inner.recv_id()
    }
}

/// Where a unidirectional stream's bytes are (RFC 9114 6.2, 7.1): its type, then on the
/// control stream frames (type, length, payload). h3 parses them too; this only counts
/// the frames' headers as the bytes pass.
#[derive(Default)]
struct Frames {
    step: Step,
    varint: Varint,
    /// Frames seen on the control stream.
    seen: u64,
}

#[derive(Default, Clone, Copy)]
enum Step {
    #[default]
    StreamType,
    FrameType,
    FrameLength,
    Payload(u64),
    /// Not the control stream: nothing to count.
    Other,
}

/// The control stream's type (RFC 9114 6.2.1).
const CONTROL_STREAM: u64 = 0x00;

/// PRIORITY_UPDATE frames (RFC 9218 7.1, 7.2: for a request and for a push stream):
/// h3 ignores them, but they carry no abuse.
const PRIORITY_UPDATE: [u64; 2] = [0xf0700, 0xf0701];

/// The longest control-stream frame a client may send, in bytes. What HTTP/3 puts there
/// is small (a SETTINGS frame of a few dozen parameters, GOAWAY and MAX_PUSH_ID one
/// integer, PRIORITY_UPDATE a short field value); h3 buffers a frame's whole payload, so
/// this bounds the control stream's memory.
pub(super) const MAX_CONTROL_FRAME: u64 = 16 * 1024;

/// A control-stream frame declared longer than [`MAX_CONTROL_FRAME`].
#[derive(Debug, PartialEq)]
struct TooLong;

impl Frames {
    /// Reads `bytes`; returns how many frames past the first began in them, or `TooLong`
    /// once a frame's length passes [`MAX_CONTROL_FRAME`] (the stream is not read on).
    fn feed(&mut self, mut bytes: &[u8]) -> Result<u64, TooLong> {
        let before = self.seen.max(1);
        while !bytes.is_empty() {
            match self.step {
                Step::Other => break,
                Step::Payload(left) => {
                    let n = left.min(bytes.len() as u64);
                    bytes = &bytes[n as usize..];
                    self.step = match left - n {
                        0 => Step::FrameType,
                        rest => Step::Payload(rest),
                    };
                }
                step => {
                    let Some(value) = self.varint.push(&mut bytes) else {
                        break;
                    };
                    self.step = match step {
                        Step::StreamType if value == CONTROL_STREAM => Step::FrameType,
                        Step::StreamType => Step::Other,
                        Step::FrameType => {
                            // Browsers send PRIORITY_UPDATE (RFC 9218) as they please.
                            if !PRIORITY_UPDATE.contains(&value) {
                                self.seen += 1;
                            }
                            Step::FrameLength
                        }
                        _ if value > MAX_CONTROL_FRAME => {
                            self.step = Step::Other;
                            return Err(TooLong);
                        }
                        _ => Step::Payload(value),
                    };
                    if let Step::Payload(0) = self.step {
                        self.step = Step::FrameType;
                    }
                }
            }
        }
        Ok(self.seen.max(1) - before)
    }
}

/// A QUIC variable-length integer (RFC 9000 16) read across chunks.
#[derive(Default)]
struct Varint {
    bytes: [u8; 8],
    have: usize,
}

impl Varint {
    /// Takes bytes of the integer from the front of `bytes`; its value once complete.
    fn push(&mut self, bytes: &mut &[u8]) -> Option<u64> {
        while let Some((&b, rest)) = bytes.split_first() {
            *bytes = rest;
            self.bytes[self.have] = b;
            self.have += 1;
            let len = 1 << (self.bytes[0] >> 6);
            if self.have == len {
                let first = u64::from(self.bytes[0] & 0x3f);
                let value = self.bytes[1..len]
                    .iter()
                    .fold(first, |v, &b| (v << 8) | u64::from(b));
                self.have = 0;
                return Some(value);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_after_the_control_streams_settings_are_counted_across_chunks() {
        // Control stream: type 0, SETTINGS (type 4, 2 bytes), then a reserved frame type
        // 0x21 (two-byte varint 0x40 0x21) with 3 bytes, then GOAWAY (7) with 1 byte.
        let bytes = [
            0x00, 0x04, 0x02, 0x01, 0x02, 0x40, 0x21, 0x03, 9, 9, 9, 0x07, 0x01, 0,
        ];
        let mut whole = Frames::default();
        assert_eq!(whole.feed(&bytes), Ok(2));
        for cut in 1..bytes.len() {
            let mut split = Frames::default();
            let n = split.feed(&bytes[..cut]).unwrap() + split.feed(&bytes[cut..]).unwrap();
            assert_eq!(n, 2, "cut at {cut}");
        }
        // One byte at a time, with an empty frame in the middle.
        let mut bytewise = Frames::default();
        let more = [0x00, 0x04, 0x00, 0x21, 0x00, 0x21, 0x00];
        let n: u64 = more.iter().map(|b| bytewise.feed(&[*b]).unwrap()).sum();
        assert_eq!(n, 2);
    }

    #[test]
    fn a_control_frame_longer_than_the_bound_is_refused_at_its_length() {
        // SETTINGS, then a reserved frame (0x21) declaring 2^40 bytes (an 8-byte varint).
        let huge = [0x00, 0x04, 0x00, 0x21, 0xc0, 0, 0, 0x01, 0, 0, 0, 0];
        for cut in 1..huge.len() {
            let mut split = Frames::default();
            let fed = split
                .feed(&huge[..cut])
                .and_then(|_| split.feed(&huge[cut..]));
            assert_eq!(fed, Err(TooLong), "cut at {cut}");
        }
        // At the bound: read on.
        let mut at = Frames::default();
        assert_eq!(at.feed(&[0x00, 0x04, 0x00, 0x21, 0x80, 0, 0x40, 0]), Ok(1));
        assert_eq!(at.feed(&[0; MAX_CONTROL_FRAME as usize]), Ok(0));
        assert_eq!(at.feed(&[0x21, 0x80, 0, 0x40, 1]), Err(TooLong));
    }

    #[test]
    fn priority_updates_are_no_glitches() {
        // SETTINGS, then PRIORITY_UPDATE (0xf0700, a 4-byte varint) with 3 bytes, twice.
        let update = [0x80, 0x0f, 0x07, 0x00, 0x03, 0x00, b'u', b'1'];
        let mut frames = Frames::default();
        assert_eq!(frames.feed(&[0x00, 0x04, 0x00]), Ok(0));
        assert_eq!(frames.feed(&update), Ok(0));
        assert_eq!(frames.feed(&update), Ok(0));
        assert_eq!(frames.feed(&[0x21, 0x00]), Ok(1));
    }

    #[test]
    fn other_streams_are_not_read() {
        let mut qpack = Frames::default();
        assert_eq!(qpack.feed(&[0x02, 0x00, 0x04, 0x00, 0x04, 0x00]), Ok(0));
        let mut grease = Frames::default();
        assert_eq!(grease.feed(&[0x40, 0x21, 0x00, 0x04, 0x00]), Ok(0));
    }
}
