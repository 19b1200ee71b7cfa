//! HTTP/1.1 chunked transfer coding (RFC 9112 §7.1) for the testkit.
//!
//! [`ChunkedDecoder`] is an incremental, sans-IO decoder: feed it whatever bytes
//! have arrived, it emits decoded body data through a callback and reports how
//! many input bytes it consumed. It stops consuming exactly at the end of the
//! message (after the trailer section), so pipelined bytes that follow are left
//! for the caller. It is deliberately strict about framing (CRLF line endings,
//! hex sizes, well-formed trailers) because the testkit is used to check what
//! Weir puts on the wire; chunk extensions are accepted and ignored.
//!
//! [`encode`] builds a complete chunked body for tests that send one.

use std::fmt;
use std::io;

/// Upper bound on the total size of the trailer section.
const MAX_TRAILER_BYTES: usize = 64 * 1024;

/// A framing error in a chunked body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkedError(&'static str);

impl fmt::Display for ChunkedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid chunked body: {}", self.0)
    }
}

impl std::error::Error for ChunkedError {}

impl From<ChunkedError> for io::Error {
    fn from(e: ChunkedError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading the hex chunk size.
    Size,
    /// Skipping a chunk extension (or whitespace) up to CR.
    Ext,
    /// Expecting the LF that ends the chunk-size line.
    SizeLf,
    /// Inside chunk data.
    Data,
    /// Expecting CR after chunk data.
    DataCr,
    /// Expecting LF after chunk data.
    DataLf,
    /// Reading a trailer line (or the final empty line).
    Trailer,
    /// Expecting the LF that ends a trailer line.
    TrailerLf,
    /// The message is complete.
    Done,
}

/// Incremental decoder for one chunked message body.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    size: u64,
    digits: usize,
    remaining: u64,
    line: Vec<u8>,
    trailer_bytes: usize,
    trailers: Vec<(String, String)>,
    body_len: u64,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    /// A decoder positioned at the start of a chunked body.
    pub fn new() -> Self {
        ChunkedDecoder {
            state: State::Size,
            size: 0,
            digits: 0,
            remaining: 0,
            line: Vec::new(),
            trailer_bytes: 0,
            trailers: Vec::new(),
            body_len: 0,
        }
    }

    /// Decodes as much of `input` as possible, passing body data to `out`.
    ///
    /// Returns the number of bytes consumed. All of `input` is consumed unless
    /// the message ends inside it, in which case the bytes after the final CRLF
    /// are left unconsumed and [`is_done`](Self::is_done) becomes true.
    pub fn decode(
        &mut self,
        input: &[u8],
        out: &mut impl FnMut(&[u8]),
    ) -> Result<usize, ChunkedError> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            match self.state {
                State::Size => {
                    if let Some(v) = hex_value(b) {
                        self.size = self
                            .size
                            .checked_mul(16)
                            .and_then(|s| s.checked_add(u64::from(v)))
                            .ok_or(ChunkedError("chunk size overflows u64"))?;
                        self.digits += 1;
                    } else if self.digits == 0 {
                        return Err(ChunkedError("missing chunk size"));
                    } else {
                        match b {
                            b'\r' => self.state = State::SizeLf,
                            b';' | b' ' | b'\t' => self.state = State::Ext,
                            _ => return Err(ChunkedError("invalid character in chunk size")),
                        }
                    }
                    i += 1;
                }
                State::Ext => {
                    match b {
                        b'\r' => self.state = State::SizeLf,
                        b'\t' => {}
                        0..=31 | 127 => {
                            return Err(ChunkedError("control character in chunk extension"))
                        }
                        _ => {}
                    }
                    i += 1;
                }
                State::SizeLf => {
                    if b != b'\n' {
                        return Err(ChunkedError("chunk size line not ended by CRLF"));
                    }
                    i += 1;
                    if self.size == 0 {
                        self.state = State::Trailer;
                        self.line.clear();
                    } else {
                        self.remaining = self.size;
                        self.state = State::Data;
                    }
                    self.size = 0;
                    self.digits = 0;
                }
                State::Data => {
                    let avail = (input.len() - i) as u64;
                    let n = self.remaining.min(avail) as usize;
                    out(&input[i..i + n]);
                    i += n;
                    self.remaining -= n as u64;
                    self.body_len += n as u64;
                    if self.remaining == 0 {
                        self.state = State::DataCr;
                    }
                }
                State::DataCr => {
                    if b != b'\r' {
                        return Err(ChunkedError("chunk data not followed by CRLF"));
                    }
                    self.state = State::DataLf;
                    i += 1;
                }
                State::DataLf => {
                    if b != b'\n' {
                        return Err(ChunkedError("chunk data not followed by CRLF"));
                    }
                    self.state = State::Size;
                    i += 1;
                }
                State::Trailer => {
                    match b {
                        b'\r' => self.state = State::TrailerLf,
                        b'\n' => return Err(ChunkedError("bare LF in trailer section")),
                        _ => {
                            self.trailer_bytes += 1;
                            if self.trailer_bytes > MAX_TRAILER_BYTES {
                                return Err(ChunkedError("trailer section too large"));
                            }
                            self.line.push(b);
                        }
                    }
                    i += 1;
                }
                State::TrailerLf => {
                    if b != b'\n' {
                        return Err(ChunkedError("trailer line not ended by CRLF"));
                    }
                    i += 1;
                    if self.line.is_empty() {
                        self.state = State::Done;
                        return Ok(i);
                    }
                    let field = parse_field(&self.line)?;
                    self.trailers.push(field);
                    self.line.clear();
                    self.state = State::Trailer;
                }
                State::Done => return Ok(i),
            }
        }
        Ok(i)
    }

    /// True once the last chunk and the trailer section have been decoded.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Trailer fields decoded so far, in order.
    pub fn trailers(&self) -> &[(String, String)] {
        &self.trailers
    }

    /// Consumes the decoder, returning its trailer fields.
    pub fn into_trailers(self) -> Vec<(String, String)> {
        self.trailers
    }

    /// Number of body (chunk data) bytes decoded so far.
    pub fn body_len(&self) -> u64 {
        self.body_len
    }
}

/// A fully decoded chunked message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The concatenated chunk data.
    pub body: Vec<u8>,
    /// Trailer fields, in order.
    pub trailers: Vec<(String, String)>,
    /// Number of input bytes the chunked encoding occupied.
    pub consumed: usize,
}

/// Decodes a complete chunked body held in memory.
///
/// Fails if `input` is malformed or ends before the message does; bytes after
/// the end of the message are ignored (see [`Decoded::consumed`]).
pub fn decode_all(input: &[u8]) -> Result<Decoded, ChunkedError> {
    let mut dec = ChunkedDecoder::new();
    let mut body = Vec::new();
    let consumed = dec.decode(input, &mut |d: &[u8]| body.extend_from_slice(d))?;
    if !dec.is_done() {
        return Err(ChunkedError("incomplete chunked body"));
    }
    Ok(Decoded {
        body,
        trailers: dec.into_trailers(),
        consumed,
    })
}

/// Encodes `chunks` (empty ones are skipped, since an empty chunk would end
/// the body) followed by the last chunk and the given trailer fields.
pub fn encode(chunks: &[&[u8]], trailers: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in chunks.iter().filter(|c| !c.is_empty()) {
        out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        out.extend_from_slice(chunk);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n");
    for (name, value) in trailers {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn parse_field(line: &[u8]) -> Result<(String, String), ChunkedError> {
    let colon = line
        .iter()
        .position(|&b| b == b':')
        .ok_or(ChunkedError("trailer field without colon"))?;
    let name = &line[..colon];
    let valid_name = !name.is_empty()
        && name
            .iter()
            .all(|&b| b.is_ascii_graphic() && !b"\"(),/:;<=>?@[\\]{}".contains(&b));
    if !valid_name {
        return Err(ChunkedError("invalid trailer field name"));
    }
    let value = String::from_utf8_lossy(&line[colon + 1..])
        .trim_matches(|c| c == ' ' || c == '\t')
        .to_string();
    Ok((String::from_utf8_lossy(name).into_owned(), value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_bytewise(input: &[u8]) -> Result<(Vec<u8>, ChunkedDecoder, usize), ChunkedError> {
        let mut dec = ChunkedDecoder::new();
        let mut body = Vec::new();
        let mut consumed = 0;
        for i in 0..input.len() {
            if dec.is_done() {
                break;
            }
            consumed += dec.decode(&input[i..i + 1], &mut |d: &[u8]| body.extend_from_slice(d))?;
        }
        Ok((body, dec, consumed))
    }

    #[test]
    fn decodes_whole_and_bytewise() {
        let wire =
            b"5\r\nhello\r\n1;ext=1\r\n \r\nA\r\n0123456789\r\n0\r\nX-T: a\r\nY:b \r\n\r\nNEXT";
        let d = decode_all(wire).unwrap();
        assert_eq!(d.body, b"hello 0123456789");
        assert_eq!(d.consumed, wire.len() - 4);
        assert_eq!(
            d.trailers,
            vec![("X-T".into(), "a".into()), ("Y".into(), "b".into())]
        );

        let (body, dec, consumed) = decode_bytewise(wire).unwrap();
        assert_eq!(body, b"hello 0123456789");
        assert!(dec.is_done());
        assert_eq!(dec.body_len(), 16);
        assert_eq!(consumed, wire.len() - 4);
    }

    #[test]
    fn round_trips_encode() {
        let wire = encode(&[b"abc", b"", b"defgh"], &[("X-Trailer", "done")]);
        assert_eq!(
            wire,
            b"3\r\nabc\r\n5\r\ndefgh\r\n0\r\nX-Trailer: done\r\n\r\n"
        );
        let d = decode_all(&wire).unwrap();
        assert_eq!(d.body, b"abcdefgh");
        assert_eq!(d.trailers, vec![("X-Trailer".into(), "done".into())]);
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            &b"\r\n"[..],
            b"g\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloX\r\n",
            b"0\r\nno-colon\r\n\r\n",
            b"0\r\n: empty\r\n\r\n",
            b"0\r\nX\n",
            b"11111111111111111\r\n",
        ] {
            assert!(
                decode_all(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(decode_all(b"5\r\nhel").is_err());
    }
}
