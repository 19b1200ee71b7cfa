//! The QUIC connection the h3 server runs on, watched for the abuse HTTP/2's glitch budget
//! answers there (`http2::budget`): unidirectional streams past the three HTTP/3 needs
//! (control and QPACK's two; more are reserved or unknown types, which h3 stops and
//! forgets, so a client could open them without end), and frames on the control stream
//! after its SETTINGS (GOAWAY, MAX_PUSH_ID, CANCEL_PUSH and unknown types, which h3
//! ignores; not PRIORITY_UPDATE, which browsers send). Each is a glitch of the connection (`Conn::glitch`). A control-stream frame
//! longer than [`MAX_CONTROL_FRAME`] closes the connection at once (`Conn::overload`):
//! h3 buffers a frame's whole payload before it decodes it, so one frame declaring 2^40
//! bytes would grow its buffer at line rate for the connection's life.
//!
//! On request streams h3 buffers every frame but DATA whole as well (HEADERS, trailers,
//! unknown types: attacker review, finding 6, 50 MB of unknown frames grew the process
//! by 47 MB). A request stream's non-DATA frame declared longer than its bound
//! ([`request_frame_bound`]: no HEADERS frame that long decodes within the listener's
//! `max_field_section_size`) ends the stream at its length, before its payload comes:
//! STOP_SENDING and RESET_STREAM with H3_EXCESSIVE_LOAD, a reset for the connection's
//! budget (`Conn::reset_by_client`). The watch reads frame headers only; a DATA frame's
//! payload is skipped whole, one step per chunk.

use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId};

use super::conn::Conn;

/// Unidirectional streams a client needs (RFC 9114 6.2: control, QPACK encoder and
/// decoder).
const NEEDED_UNI_STREAMS: u32 = 3;

/// `h3_quinn`'s connection, its unidirectional streams and its request streams' frame
/// lengths watched.
pub(super) struct Guarded {
    inner: h3_quinn::Connection,
    conn: Rc<Conn>,
    /// Unidirectional streams the client opened so far.
    uni: u32,
    /// The longest non-DATA frame of a request stream ([`request_frame_bound`]).
    request_bound: u64,
}

impl Guarded {
    /// `max_field_section_size`: the listener's (`http3`), which bounds request streams'
    /// frames.
    pub fn new(
        inner: h3_quinn::Connection,
        conn: Rc<Conn>,
        max_field_section_size: u64,
    ) -> Guarded {
        Guarded {
            inner,
            conn,
            uni: 0,
            request_bound: request_frame_bound(max_field_section_size),
        }
    }
}

/// The longest non-DATA frame a request stream may carry, for a listener's
/// `max_field_section_size`: a field line's encoding is never longer than its size as
/// that setting counts it (name, value and 32 bytes), so a HEADERS frame longer than the
/// setting and a field section's two-byte prefix cannot decode within it. The slack of
/// [`MAX_CONTROL_FRAME`] keeps a small setting from refusing short unknown frames
/// (reserved types a client sends to exercise the rule that they are ignored).
pub(super) fn request_frame_bound(max_field_section_size: u64) -> u64 {
    max_field_section_size.saturating_add(MAX_CONTROL_FRAME)
}

impl quic::Connection<Bytes> for Guarded {
    type RecvStream = Watched;
    type OpenStreams = Opener;

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
        let accepted = quic::Connection::<Bytes>::poll_accept_bidi(&mut self.inner, cx);
        let bound = self.request_bound;
        accepted.map_ok(|inner| RequestStream::new(inner, bound))
    }

    fn opener(&self) -> Opener {
        Opener {
            inner: quic::Connection::<Bytes>::opener(&self.inner),
            bound: self.request_bound,
        }
    }
}

/// `h3_quinn`'s stream opener, its bidirectional streams watched as accepted ones are.
#[derive(Clone)]
pub(super) struct Opener {
    inner: h3_quinn::OpenStreams,
    bound: u64,
}

impl quic::OpenStreams<Bytes> for Opener {
    type BidiStream = RequestStream;
    type SendStream = h3_quinn::SendStream<Bytes>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, StreamErrorIncoming>> {
        // A server opens none; watched all the same.
        let bound = self.bound;
        self.inner
            .poll_open_bidi(cx)
            .map_ok(|inner| RequestStream::new(inner, bound))
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

/// The connection opens streams as its [`Opener`] does.
impl quic::OpenStreams<Bytes> for Guarded {
    type BidiStream = RequestStream;
    type SendStream = h3_quinn::SendStream<Bytes>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<RequestStream, StreamErrorIncoming>> {
        quic::Connection::<Bytes>::opener(self).poll_open_bidi(cx)
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
        quic::OpenStreams::<Bytes>::poll_open_send(&mut self.inner, cx)
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        quic::OpenStreams::<Bytes>::close(&mut self.inner, code, reason);
    }
}

/// A request stream: its receiving side's frame lengths watched ([`RequestRecv`]).
pub(super) struct RequestStream {
    send: h3_quinn::SendStream<Bytes>,
    recv: RequestRecv,
}

impl RequestStream {
    fn new(inner: h3_quinn::BidiStream<Bytes>, bound: u64) -> RequestStream {
        let (send, recv) = quic::BidiStream::split(inner);
        let frames = Frames::request(bound);
        RequestStream {
            send,
            recv: RequestRecv {
                inner: recv,
                frames,
            },
        }
    }
}

impl quic::BidiStream<Bytes> for RequestStream {
    type SendStream = h3_quinn::SendStream<Bytes>;
    type RecvStream = RequestRecv;

    fn split(self) -> (Self::SendStream, Self::RecvStream) {
        (self.send, self.recv)
    }
}

impl quic::RecvStream for RequestStream {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        let polled = self.recv.poll_data(cx);
        if self.recv.frames.refused() {
            // Not split yet (the head is being read): the response side ends too.
            quic::SendStream::<Bytes>::reset(&mut self.send, H3_EXCESSIVE_LOAD);
        }
        polled
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.recv.stop_sending(error_code);
    }

    fn recv_id(&self) -> StreamId {
        self.recv.recv_id()
    }
}

impl quic::SendStream<Bytes> for RequestStream {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_ready(cx)
    }

    fn send_data<D: Into<h3::quic::WriteBuf<Bytes>>>(
        &mut self,
        data: D,
    ) -> Result<(), StreamErrorIncoming> {
        self.send.send_data(data)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_finish(cx)
    }

    fn reset(&mut self, reset_code: u64) {
        self.send.reset(reset_code);
    }

    fn send_id(&self) -> StreamId {
        self.send.send_id()
    }
}

/// A request stream's receiving side: a non-DATA frame declared longer than its bound
/// fails the stream (STOP_SENDING H3_EXCESSIVE_LOAD) before h3 buffers its payload.
pub(crate) struct RequestRecv {
    inner: h3_quinn::RecvStream,
    frames: Frames,
}

impl quic::RecvStream for RequestRecv {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        if self.frames.refused() {
            return Poll::Ready(Err(too_long()));
        }
        let polled = self.inner.poll_data(cx);
        if let Poll::Ready(Ok(Some(data))) = &polled {
            if self.frames.feed(data.chunk()) == Err(TooLong) {
                self.inner.stop_sending(H3_EXCESSIVE_LOAD);
                return Poll::Ready(Err(too_long()));
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

/// HTTP/3's EXCESSIVE_LOAD code.
const H3_EXCESSIVE_LOAD: u64 = 0x107;

/// The error a refused request stream fails with (h3 takes it as the stream's end by the
/// peer: the head or body is not read on).
fn too_long() -> StreamErrorIncoming {
    StreamErrorIncoming::StreamTerminated {
        error_code: H3_EXCESSIVE_LOAD,
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

/// Where a stream's bytes are (RFC 9114 6.2, 7.1): a unidirectional stream's type, then
/// on the control stream (or a request stream, which has no type) frames (type, length,
/// payload). h3 parses them too; this only counts and bounds the frames' headers as the
/// bytes pass.
struct Frames {
    step: Step,
    varint: Varint,
    /// Frames seen on the control stream.
    seen: u64,
    /// The longest frame allowed (on a request stream, DATA frames are not bounded).
    bound: u64,
    /// A request stream: no frame is counted, DATA frames pass whatever their length.
    request: bool,
    /// The frame whose length comes next is a DATA frame.
    data: bool,
}

impl Default for Frames {
    /// A unidirectional stream's.
    fn default() -> Frames {
        Frames {
            step: Step::StreamType,
            varint: Varint::default(),
            seen: 0,
            bound: MAX_CONTROL_FRAME,
            request: false,
            data: false,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    StreamType,
    FrameType,
    FrameLength,
    Payload(u64),
    /// Not the control stream: nothing to count.
    Other,
    /// A frame over the bound: the stream is not read on.
    Refused,
}

/// DATA's frame type (RFC 9114 7.2.1).
const DATA: u64 = 0x00;

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

/// A frame declared longer than its stream's bound.
#[derive(Debug, PartialEq)]
struct TooLong;

impl Frames {
    /// A request stream's, non-DATA frames bounded by `bound`.
    fn request(bound: u64) -> Frames {
        Frames {
            step: Step::FrameType,
            bound,
            request: true,
            ..Frames::default()
        }
    }

    /// Whether a frame passed the bound.
    fn refused(&self) -> bool {
        self.step == Step::Refused
    }

    /// Reads `bytes`; returns how many control-stream frames past the first began in
    /// them, or `TooLong` once a frame's length passes the bound (the stream is not read
    /// on).
    fn feed(&mut self, mut bytes: &[u8]) -> Result<u64, TooLong> {
        let before = self.seen.max(1);
        while !bytes.is_empty() {
            match self.step {
                Step::Other => break,
                Step::Refused => return Err(TooLong),
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
                            self.data = value == DATA;
                            // Browsers send PRIORITY_UPDATE (RFC 9218) as they please.
                            if !self.request && !PRIORITY_UPDATE.contains(&value) {
                                self.seen += 1;
                            }
                            Step::FrameLength
                        }
                        _ if value > self.bound && !(self.request && self.data) => {
                            self.step = Step::Refused;
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
    fn a_request_streams_data_passes_and_other_frames_are_bounded() {
        let mut frames = Frames::request(100);
        // DATA declaring 2^40 bytes: its payload passes, whatever its length.
        assert_eq!(frames.feed(&[0x00, 0xc0, 0, 0, 0x01, 0, 0, 0, 0]), Ok(0));
        let mut frames = Frames::request(100);
        // HEADERS of 3 bytes, DATA of 2, a reserved frame (0x21) of 100: within.
        let within = [0x01, 0x03, 1, 2, 3, 0x00, 0x02, 9, 9, 0x21, 0x40, 100];
        assert_eq!(frames.feed(&within), Ok(0));
        assert_eq!(frames.feed(&[0; 100]), Ok(0));
        assert!(!frames.refused());
        // A HEADERS frame (trailers) of 101, cut anywhere: refused at its length.
        let over = [0x01, 0x40, 101];
        for cut in 1..over.len() {
            let mut split = Frames::request(100);
            let fed = split
                .feed(&over[..cut])
                .and_then(|_| split.feed(&over[cut..]));
            assert_eq!(fed, Err(TooLong), "cut at {cut}");
            assert!(split.refused());
            assert_eq!(split.feed(&[0]), Err(TooLong), "not read on");
        }
        let mut unknown = Frames::request(100);
        assert_eq!(unknown.feed(&[0x40, 0x21, 0x40, 101]), Err(TooLong));
        assert_eq!(request_frame_bound(64 * 1024), 80 * 1024);
    }

    #[test]
    fn other_streams_are_not_read() {
        let mut qpack = Frames::default();
        assert_eq!(qpack.feed(&[0x02, 0x00, 0x04, 0x00, 0x04, 0x00]), Ok(0));
        let mut grease = Frames::default();
        assert_eq!(grease.feed(&[0x40, 0x21, 0x00, 0x04, 0x00]), Ok(0));
    }
}
