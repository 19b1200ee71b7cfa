//! Body streaming: deciding which bytes of a buffer belong to a message body, and pumping
//! a body from one socket to another through a bounded buffer.
//!
//! The same `BodyState` frames request bodies (client -> upstream) and response bodies
//! (upstream -> client). Chunked bodies pass through byte for byte after validation, or are
//! de-chunked in place for HTTP/1.0 clients.

use std::io::{self, IoSlice};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::time::with_timeout;

use crate::buffer::Buffer;
use crate::codec::http1::{BodyFraming, ChunkedDecoder};
use crate::filters::compression::Encoder;

pub enum BodyState {
    Length(u64),
    Chunked {
        decoder: ChunkedDecoder,
        dechunk: bool,
        limit: Option<u64>,
        /// The trailer section's field lines, when kept ([`BodyState::keeping_trailers`]):
        /// an HTTP/2 client gets them as a HEADERS frame. Allocated only when a response
        /// has trailers; at most the decoder's trailer limit.
        trailers: Option<Vec<u8>>,
    },
    UntilClose {
        done: bool,
    },
    Done,
}

/// Why a pump stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PumpError {
    Read(io::ErrorKind),
    ReadTimeout,
    /// The source ended before the body did.
    Truncated,
    Write(io::ErrorKind),
    WriteTimeout,
    Framing(&'static str),
    TooLarge,
}

impl BodyState {
    pub fn new(framing: BodyFraming, dechunk: bool, limit: Option<u64>) -> BodyState {
        match framing {
            BodyFraming::None | BodyFraming::Length(0) => BodyState::Done,
            BodyFraming::Length(n) => BodyState::Length(n),
            BodyFraming::Chunked => BodyState::Chunked {
                decoder: ChunkedDecoder::new(),
                dechunk,
                limit,
                trailers: None,
            },
            BodyFraming::UntilClose => BodyState::UntilClose { done: false },
        }
    }

    /// The same state, keeping a chunked body's trailer fields for [`BodyState::trailers`]
    /// (by default they pass through with the chunks, or are dropped when de-chunking).
    pub fn keeping_trailers(mut self) -> BodyState {
        if let BodyState::Chunked { trailers, .. } = &mut self {
            *trailers = Some(Vec::new());
        }
        self
    }

    /// The trailer field lines kept so far (each ending in CRLF; empty: none).
    pub fn trailers(&self) -> &[u8] {
        match self {
            BodyState::Chunked {
                trailers: Some(t), ..
            } => t,
            _ => &[],
        }
    }

    pub fn is_done(&self) -> bool {
        match self {
            BodyState::Length(_) => false,
            BodyState::Chunked { decoder, .. } => decoder.is_done(),
            BodyState::UntilClose { done } => *done,
            BodyState::Done => true,
        }
    }

    /// Takes the body bytes at the start of `data`. Returns `(forward, consumed)`: after the
    /// call `data[..forward]` is what to send on, and `consumed` bytes of `data` are used up.
    pub fn take(&mut self, data: &mut [u8]) -> Result<(usize, usize), PumpError> {
        match self {
            BodyState::Done => Ok((0, 0)),
            BodyState::UntilClose { .. } => Ok((data.len(), data.len())),
            BodyState::Length(remaining) => {
                let n = (*remaining).min(data.len() as u64) as usize;
                *remaining -= n as u64;
                if *remaining == 0 {
                    *self = BodyState::Done;
                }
                Ok((n, n))
            }
            BodyState::Chunked {
                decoder,
                dechunk,
                limit,
                trailers,
            } => {
                let r = take_chunked(decoder, (*dechunk, trailers.as_mut()), data)?;
                if limit.is_some_and(|max| decoder.body_len() > max) {
                    return Err(PumpError::TooLarge);
                }
                Ok(r)
            }
        }
    }

    /// The source reached EOF; true if that ends the body cleanly.
    pub fn on_eof(&mut self) -> bool {
        match self {
            BodyState::UntilClose { done } => {
                *done = true;
                true
            }
            BodyState::Done => true,
            _ => false,
        }
    }
}

/// `trailers`: where the trailer field lines go, if they are kept.
fn take_chunked(
    decoder: &mut ChunkedDecoder,
    (dechunk, mut trailers): (bool, Option<&mut Vec<u8>>),
    data: &mut [u8],
) -> Result<(usize, usize), PumpError> {
    let mut pos = 0;
    let mut out = 0;
    while pos < data.len() && !decoder.is_done() {
        let d = decoder
            .decode(&data[pos..])
            .map_err(|e| PumpError::Framing(e.0))?;
        if let Some(r) = d.data.filter(|_| dechunk) {
            let len = r.len();
            data.copy_within(pos + r.start..pos + r.end, out);
            out += len;
        }
        if let Some(t) = trailers.as_deref_mut().filter(|_| !d.trailers.is_empty()) {
            t.extend_from_slice(&data[pos + d.trailers.start..pos + d.trailers.end]);
        }
        pos += d.consumed;
        if d.consumed == 0 {
            break;
        }
    }
    Ok((if dechunk { out } else { pos }, pos))
}

/// Moves a body from `src` to `dst` through `buf` (which may already hold body bytes)
/// until `state` is done, adding the bytes written to `written`. Bytes after the body
/// stay in `buf`.
pub async fn pump<R, W>(
    src: &mut R,
    buf: &mut Buffer,
    (dst, written): (&mut W, &mut u64),
    state: &mut BodyState,
    (read_timeout, write_timeout): (Duration, Duration),
) -> Result<(), PumpError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        if !buf.is_empty() {
            let (forward, consumed) = state.take(buf.filled_mut())?;
            if forward > 0 {
                write_all(dst, &buf.filled()[..forward], &[], write_timeout).await?;
                *written += forward as u64;
            }
            buf.consume(consumed);
        }
        if state.is_done() {
            return Ok(());
        }
        match with_timeout(read_timeout, buf.read_from(src)).await {
            Err(_) => return Err(PumpError::ReadTimeout),
            Ok(Err(e)) => return Err(PumpError::Read(e.kind())),
            Ok(Ok(0)) if state.on_eof() => return Ok(()),
            Ok(Ok(0)) => return Err(PumpError::Truncated),
            Ok(Ok(_)) => {}
        }
    }
}

/// A body being compressed: the encoder, the upstream framing it is read with (chunked
/// bodies de-chunked) and the byte counts.
pub struct Compressing {
    pub encoder: Encoder,
    pub state: BodyState,
    /// Body bytes fed to the encoder.
    pub bytes_in: u64,
    /// Compressed bytes sent (without the chunk framing).
    pub bytes_out: u64,
}

/// As [`pump`], compressing: each read from `src` is encoded and flushed, and goes out as
/// one HTTP/1.1 chunk (nothing waits for more input, so streamed responses keep their
/// pace); the last chunk follows the end of the body. `head` (the response head, not yet
/// sent) goes out with the first chunk; it is left holding scratch bytes. Memory stays
/// bounded: the encoder's output is at most about one read of `buf` before it is written.
pub async fn pump_encoded<R, W>(
    src: &mut R,
    buf: &mut Buffer,
    (dst, written): (&mut W, &mut u64),
    (job, head): (&mut Compressing, &mut Vec<u8>),
    (read_timeout, write_timeout): (Duration, Duration),
) -> Result<(), PumpError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let failed = |_| PumpError::Framing("compression failed");
    loop {
        if !buf.is_empty() {
            let (forward, consumed) = job.state.take(buf.filled_mut())?;
            if forward > 0 {
                job.encoder.feed(&buf.filled()[..forward]).map_err(failed)?;
                job.bytes_in += forward as u64;
            }
            buf.consume(consumed);
        }
        let done = job.state.is_done();
        if done {
            job.encoder.finish().map_err(failed)?;
        }
        let out = job.encoder.output();
        job.bytes_out += out.len() as u64;
        if !out.is_empty() {
            push_chunk_size(head, out.len());
            out.extend_from_slice(b"\r\n");
        }
        if done {
            out.extend_from_slice(b"0\r\n\r\n");
        }
        if !head.is_empty() || !out.is_empty() {
            write_all(dst, head, out, write_timeout).await?;
            *written += (head.len() + out.len()) as u64;
            head.clear();
            out.clear();
        }
        if done {
            return Ok(());
        }
        match with_timeout(read_timeout, buf.read_from(src)).await {
            Err(_) => return Err(PumpError::ReadTimeout),
            Ok(Err(e)) => return Err(PumpError::Read(e.kind())),
            Ok(Ok(0)) if job.state.on_eof() => {}
            Ok(Ok(0)) => return Err(PumpError::Truncated),
            Ok(Ok(_)) => {}
        }
    }
}

/// Appends a chunk-size line (`{len:x}\r\n`) without `fmt`.
fn push_chunk_size(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(Chunks::default().prefix(len));
}

/// Writes `a` then `b` with as few syscalls as possible (one `writev` when both fit).
pub async fn write_all<W: AsyncWrite + Unpin>(
    dst: &mut W,
    mut a: &[u8],
    mut b: &[u8],
    write_timeout: Duration,
) -> Result<(), PumpError> {
    let write = async {
        while !a.is_empty() || !b.is_empty() {
            let n = if b.is_empty() {
                dst.write(a).await?
            } else if a.is_empty() {
                dst.write(b).await?
            } else {
                dst.write_vectored(&[IoSlice::new(a), IoSlice::new(b)])
                    .await?
            };
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::WriteZero));
            }
            let from_a = n.min(a.len());
            a = &a[from_a..];
            b = &b[n - from_a..];
        }
        // A TLS stream may hold the last records back when the socket was full; plain
        // TCP returns at once (no system call).
        dst.flush().await
    };
    match with_timeout(write_timeout, write).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(PumpError::Write(e.kind())),
        Err(_) => Err(PumpError::WriteTimeout),
    }
}

/// Chunk-size lines, with the CRLF that ends the previous chunk's data in front, so each
/// DATA frame is one write of two slices.
#[derive(Default)]
pub(crate) struct Chunks {
    line: [u8; 24],
    /// A chunk's data was written: its CRLF is still owed.
    open: bool,
}

impl Chunks {
    pub(crate) fn prefix(&mut self, len: usize) -> &[u8] {
        let mut n = 0;
        if self.open {
            self.line[..2].copy_from_slice(b"\r\n");
            n = 2;
        }
        let digits = (usize::BITS - len.leading_zeros()).div_ceil(4).max(1) as usize;
        for i in (0..digits).rev() {
            let nibble = (len >> (i * 4)) & 0xf;
            self.line[n] = b"0123456789abcdef"[nibble];
            n += 1;
        }
        self.line[n..n + 2].copy_from_slice(b"\r\n");
        self.open = true;
        &self.line[..n + 2]
    }

    /// The last chunk (trailer fields and the final CRLF follow).
    pub(crate) fn last(&self) -> &'static [u8] {
        if self.open {
            b"\r\n0\r\n"
        } else {
            b"0\r\n"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_takes_only_its_bytes() {
        let mut state = BodyState::new(BodyFraming::Length(3), false, None);
        let mut data = *b"abcGET";
        assert_eq!(state.take(&mut data).unwrap(), (3, 3));
        assert!(state.is_done());
    }

    #[test]
    fn dechunks_in_place() {
        let mut state = BodyState::new(BodyFraming::Chunked, true, None);
        let mut data = b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\nNEXT".to_vec();
        let (forward, consumed) = state.take(&mut data).unwrap();
        assert_eq!(&data[..forward], b"abcde");
        assert_eq!(consumed, data.len() - 4);
        assert!(state.is_done());
    }

    #[test]
    fn keeps_trailers_while_dechunking_at_every_split() {
        let msg = b"3\r\nabc\r\n0\r\nX-A: 1\r\nX-B: 2\r\n\r\n";
        for cut in 0..=msg.len() {
            let mut state = BodyState::new(BodyFraming::Chunked, true, None).keeping_trailers();
            let mut body = Vec::new();
            for part in [&msg[..cut], &msg[cut..]] {
                let mut data = part.to_vec();
                let (forward, consumed) = state.take(&mut data).unwrap();
                assert_eq!(consumed, part.len(), "cut {cut}");
                body.extend_from_slice(&data[..forward]);
            }
            assert!(state.is_done(), "cut {cut}");
            assert_eq!(body, b"abc", "cut {cut}");
            assert_eq!(state.trailers(), b"X-A: 1\r\nX-B: 2\r\n", "cut {cut}");
        }
        // Not kept unless asked for.
        let mut state = BodyState::new(BodyFraming::Chunked, true, None);
        state.take(&mut msg.to_vec()).unwrap();
        assert!(state.is_done() && state.trailers().is_empty());
    }

    #[test]
    fn passes_chunked_through() {
        let mut state = BodyState::new(BodyFraming::Chunked, false, None);
        let mut data = b"3\r\nabc\r\n0\r\n\r\n".to_vec();
        let len = data.len();
        assert_eq!(state.take(&mut data).unwrap(), (len, len));
    }

    #[test]
    fn chunked_limit() {
        let mut state = BodyState::new(BodyFraming::Chunked, false, Some(2));
        let mut data = b"3\r\nabc\r\n".to_vec();
        assert_eq!(state.take(&mut data), Err(PumpError::TooLarge));
    }

    #[test]
    fn chunk_sizes_are_hex() {
        for (len, text) in [(0, "0"), (1, "1"), (15, "f"), (16, "10"), (4096, "1000")] {
            let mut out = Vec::new();
            push_chunk_size(&mut out, len);
            assert_eq!(out, format!("{text}\r\n").as_bytes());
        }
    }

    #[test]
    fn chunk_lines_carry_the_previous_crlf() {
        let mut c = Chunks::default();
        assert_eq!(c.prefix(0x1a), b"1a\r\n");
        assert_eq!(c.prefix(1), b"\r\n1\r\n");
        assert_eq!(c.prefix(0x10000), b"\r\n10000\r\n");
        assert_eq!(c.last(), b"\r\n0\r\n");
        assert_eq!(Chunks::default().last(), b"0\r\n");
    }

    #[tokio::test]
    async fn pump_stops_at_body_end() {
        let mut src: &[u8] = b"llo world";
        let mut buf = Buffer::new(4);
        let mut dst = Vec::new();
        let mut state = BodyState::new(BodyFraming::Length(5), false, None);
        let t = (Duration::from_secs(1), Duration::from_secs(1));
        let mut written = 0;
        pump(&mut src, &mut buf, (&mut dst, &mut written), &mut state, t)
            .await
            .unwrap();
        assert_eq!(dst, b"llo w");
        assert_eq!(written, 5);
        let mut state = BodyState::new(BodyFraming::Length(50), false, None);
        let mut src: &[u8] = b"short";
        assert_eq!(
            pump(
                &mut src,
                &mut Buffer::new(4),
                (&mut dst, &mut written),
                &mut state,
                t
            )
            .await,
            Err(PumpError::Truncated)
        );
    }
}
