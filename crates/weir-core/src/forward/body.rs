//! Body streaming: deciding which bytes of a buffer belong to a message body, and pumping
//! a body from one socket to another through a bounded buffer.
//!
//! The same `BodyState` frames request bodies (client -> upstream) and response bodies
//! (upstream -> client). Chunked bodies pass through byte for byte after validation, or are
//! de-chunked in place for HTTP/1.0 clients.

use std::io::{self, IoSlice};
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::time::with_timeout;

use crate::codec::http1::{BodyFraming, ChunkedDecoder};

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
                let r = take_chunked(decoder, *dechunk, trailers.as_mut(), data)?;
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

/// `dechunk`: the data is moved to the front of `data` without its framing; `trailers`:
/// where the trailer field lines go, if they are kept.
fn take_chunked(
    decoder: &mut ChunkedDecoder,
    dechunk: bool,
    mut trailers: Option<&mut Vec<u8>>,
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

/// Writes `a` then `b` with as few syscalls as possible (one `writev` when both fit).
pub async fn write_all<W: AsyncWrite + Unpin>(
    dst: &mut W,
    a: &[u8],
    b: &[u8],
    write_timeout: Duration,
) -> Result<(), PumpError> {
    write_parts(dst, [a, b], write_timeout).await
}

/// Writes `parts` in order with as few syscalls as possible (one `writev` when they fit;
/// a single non-empty part is a plain `write`).
pub async fn write_parts<W: AsyncWrite + Unpin, const N: usize>(
    dst: &mut W,
    mut parts: [&[u8]; N],
    write_timeout: Duration,
) -> Result<(), PumpError> {
    let write = async {
        loop {
            let mut slices = [IoSlice::new(&[]); N];
            let mut count = 0;
            for p in parts.iter().filter(|p| !p.is_empty()) {
                slices[count] = IoSlice::new(p);
                count += 1;
            }
            let n = match count {
                0 => break,
                1 => dst.write(&slices[0]).await?,
                _ => dst.write_vectored(&slices[..count]).await?,
            };
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::WriteZero));
            }
            let mut left = n;
            for p in parts.iter_mut() {
                let k = left.min(p.len());
                *p = &p[k..];
                left -= k;
            }
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

/// A chunk's size line (`{len:x}\r\n`), written without `fmt` on the stack.
pub(crate) struct ChunkLine {
    line: [u8; 18],
    len: usize,
}

impl ChunkLine {
    pub(crate) fn new(len: usize) -> ChunkLine {
        let mut line = [0u8; 18];
        let digits = (usize::BITS - len.leading_zeros()).div_ceil(4).max(1) as usize;
        for (i, slot) in line[..digits].iter_mut().enumerate() {
            let nibble = (len >> ((digits - 1 - i) * 4)) & 0xf;
            *slot = b"0123456789abcdef"[nibble];
        }
        line[digits..digits + 2].copy_from_slice(b"\r\n");
        ChunkLine {
            line,
            len: digits + 2,
        }
    }

    pub(crate) fn get(&self) -> &[u8] {
        &self.line[..self.len]
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
            let out = ChunkLine::new(len).get().to_vec();
            assert_eq!(out, format!("{text}\r\n").as_bytes());
        }
        assert_eq!(ChunkLine::new(0x10000).get(), b"10000\r\n");
        assert_eq!(ChunkLine::new(usize::MAX).get(), b"ffffffffffffffff\r\n");
    }
}
