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
        /// an HTTP/2 client gets them as a HEADERS frame, an HTTP/1.1 peer re-written
        /// (`forward::trailer`). Allocated only when a message has trailers; at most the
        /// decoder's trailer limit (16 KiB).
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
    /// A body that passes through as it came then stops before its trailer section: what
    /// [`BodyState::take`] forwards ends with the last chunk's line when the message has
    /// trailers, and the section and the blank line that ends the message are the
    /// sink's to write (`relay::Http1Sink`), or [`BodyState::rewrite_trailers`]'s.
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

    /// Drops the kept trailer lines whose names the head's `Connection` values `listed`
    /// name (`trailer::connection_listed`), before the section is relayed.
    pub fn drop_listed(&mut self, listed: &[u8]) {
        if let BodyState::Chunked {
            trailers: Some(t), ..
        } = self
        {
            let mut kept = Vec::with_capacity(t.len());
            for line in t.split_inclusive(|b| *b == b'\n') {
                let name = line.split(|b| *b == b':').next().unwrap_or(line);
                if !super::trailer::listed_in(listed, name) {
                    kept.extend_from_slice(line);
                }
            }
            *t = kept;
        }
    }

    /// Writes the kept trailer section of a body that passed through as it came
    /// ([`BodyState::keeping_trailers`]), less what may not be relayed
    /// (`forward::trailer`) and the names `dropped` says, and the message's end into
    /// `data` (a whole message's bytes after the `forward` that [`BodyState::take`]
    /// returned, up to what it consumed: the section was in it, and its re-written form
    /// is never longer). Returns the new length to forward.
    pub fn rewrite_trailers(
        &self,
        data: &mut [u8],
        forward: usize,
        dropped: impl Fn(&[u8]) -> bool,
    ) -> Result<usize, PumpError> {
        let kept = self.trailers();
        if kept.is_empty() || !self.is_done() {
            return Ok(forward);
        }
        let mut section = Vec::with_capacity(kept.len() + 2);
        super::trailer::push_lines(&mut section, kept, dropped);
        section.extend_from_slice(b"\r\n");
        let end = forward + section.len();
        let room = data
            .get_mut(forward..end)
            .ok_or(PumpError::Framing("trailer section"))?;
        room.copy_from_slice(&section);
        Ok(end)
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
/// where the trailer field lines go, if they are kept (then a body passed through is
/// forwarded only up to its trailer section: see [`BodyState::keeping_trailers`]).
fn take_chunked(
    decoder: &mut ChunkedDecoder,
    dechunk: bool,
    mut trailers: Option<&mut Vec<u8>>,
    data: &mut [u8],
) -> Result<(usize, usize), PumpError> {
    let mut pos = 0;
    let mut out = 0;
    // Passed through: the bytes before the trailer section (none once it began).
    let mut before = match trailers.as_deref() {
        Some(t) if !t.is_empty() => Some(0),
        _ => None,
    };
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
            before.get_or_insert(pos + d.trailers.start);
        }
        pos += d.consumed;
        if d.consumed == 0 {
            break;
        }
    }
    Ok((if dechunk { out } else { before.unwrap_or(pos) }, pos))
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
    fn a_body_passed_through_stops_before_its_kept_trailers_at_every_split() {
        let msg = b"3\r\nabc\r\n0\r\nX-A: 1\r\nHost: h\r\n\r\nNEXT";
        let end = msg.len() - b"NEXT".len();
        for cut in 0..=end {
            let mut state = BodyState::new(BodyFraming::Chunked, false, None).keeping_trailers();
            let (mut forwarded, mut used) = (Vec::new(), 0);
            for part in [&msg[..cut], &msg[cut..]] {
                let mut data = part.to_vec();
                let (forward, consumed) = state.take(&mut data).unwrap();
                forwarded.extend_from_slice(&data[..forward]);
                used += consumed;
            }
            assert!(state.is_done(), "cut {cut}");
            assert_eq!(used, end, "cut {cut}");
            assert_eq!(forwarded, b"3\r\nabc\r\n0\r\n", "cut {cut}");
            assert_eq!(state.trailers(), b"X-A: 1\r\nHost: h\r\n", "cut {cut}");
        }
        // Without trailers, the whole message passes, as without keeping them.
        let mut state = BodyState::new(BodyFraming::Chunked, false, None).keeping_trailers();
        let mut data = b"3\r\nabc\r\n0\r\n\r\n".to_vec();
        assert_eq!(state.take(&mut data).unwrap(), (13, 13));
        assert_eq!(state.rewrite_trailers(&mut data, 13, |_| false), Ok(13));
    }

    #[test]
    fn a_whole_bodys_trailers_are_rewritten_in_place() {
        let msg = b"3\r\nabc\r\n0\r\nX-A: 1\r\nHost: h\r\nx-b: 2\r\nX-Gone: 3\r\n\r\nGET /";
        let mut data = msg.to_vec();
        let mut state = BodyState::new(BodyFraming::Chunked, false, None).keeping_trailers();
        let (forward, used) = state.take(&mut data).unwrap();
        let dropped = |name: &[u8]| name.eq_ignore_ascii_case(b"x-gone");
        let n = state.rewrite_trailers(&mut data[..used], forward, dropped);
        let n = n.unwrap();
        assert_eq!(&data[..n], b"3\r\nabc\r\n0\r\nX-A: 1\r\nx-b: 2\r\n\r\n");
        assert_eq!(&data[used..], b"GET /");
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
