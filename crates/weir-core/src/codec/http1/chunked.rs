//! A streaming decoder for `Transfer-Encoding: chunked` (RFC 9112 section 7.1).
//!
//! It validates every byte of the framing (sizes, CRLFs, extensions, trailers) and reports
//! exactly where the message ends, so the proxy can either pass the chunked bytes through
//! unchanged or forward only the data (re-framing for HTTP/1.0 clients), and never forwards
//! a byte that belongs to the next pipelined message.

use std::ops::Range;

/// The chunked framing is invalid: the message is rejected (400 or 502).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkError(pub &'static str);

/// Longest chunk-size line (size + extensions) accepted.
const MAX_SIZE_LINE: usize = 4096;
/// Most trailer bytes accepted.
const MAX_TRAILERS: usize = 16 * 1024;
/// 16 hex digits fill a u64.
const MAX_SIZE_DIGITS: u8 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Size,
    SizeWhitespace,
    Extension(Ext),
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    /// A trailer field's name, up to its `:`.
    TrailerName,
    /// Its value, up to the CR.
    TrailerLine,
    TrailerLf,
    EndLf,
    Done,
}

/// Where in a chunk extension (RFC 9112 7.1.1: `*( BWS ";" BWS name [ BWS "=" BWS
/// value ] )`, a name a token, a value a token or a quoted string) the decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ext {
    /// After `;`: optional whitespace, then a name.
    NameStart,
    Name,
    /// Whitespace after a name: `=`, `;` or the line end follows.
    AfterName,
    /// After `=`: optional whitespace, then a value.
    ValueStart,
    Token,
    Quoted,
    /// After `\` in a quoted string.
    QuotedPair,
    /// After a value: whitespace, then `;` or the line end.
    AfterValue,
}

/// The outcome of one `decode` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// Bytes of the input that belong to this message and were consumed.
    pub consumed: usize,
    /// Chunk data found in the consumed bytes (at most one span per call).
    pub data: Option<Range<usize>>,
    /// Trailer-section bytes found in the consumed bytes: whole field lines, each with its
    /// CRLF, not the empty line that ends the message (empty: none). A trailer section
    /// split across reads comes in pieces, one per call.
    pub trailers: Range<usize>,
}

/// Decoder state carried across reads.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    remaining: u64,
    digits: u8,
    line_len: usize,
    trailer_len: usize,
    body_len: u64,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    pub fn new() -> Self {
        ChunkedDecoder {
            state: State::Size,
            remaining: 0,
            digits: 0,
            line_len: 0,
            trailer_len: 0,
            body_len: 0,
        }
    }

    /// The last chunk and the trailers have been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Sum of the chunk sizes announced so far (for max_body_size).
    pub fn body_len(&self) -> u64 {
        self.body_len
    }

    /// Consumes framing bytes until a data span is found, the input ends, or the message ends.
    pub fn decode(&mut self, input: &[u8]) -> Result<Decoded, ChunkError> {
        let mut i = 0;
        let mut trailers = 0..0;
        while i < input.len() {
            match self.state {
                State::Done => break,
                State::Data => {
                    let n = self.remaining.min((input.len() - i) as u64) as usize;
                    self.remaining -= n as u64;
                    if self.remaining == 0 {
                        self.state = State::DataCr;
                    }
                    return Ok(Decoded {
                        consumed: i + n,
                        data: Some(i..i + n),
                        trailers,
                    });
                }
                _ => {
                    // Trailer field bytes are contiguous: from the first one to the LF
                    // that ends the last field line.
                    if self.in_trailer_field(input[i]) {
                        if trailers.is_empty() {
                            trailers.start = i;
                        }
                        trailers.end = i + 1;
                    }
                    self.step(input[i])?;
                    i += 1;
                }
            }
        }
        Ok(Decoded {
            consumed: i,
            data: None,
            trailers,
        })
    }

    /// Whether `b`, the next byte, belongs to a trailer field line (its CRLF included).
    fn in_trailer_field(&self, b: u8) -> bool {
        match self.state {
            State::TrailerName | State::TrailerLine | State::TrailerLf => true,
            State::TrailerStart => b != b'\r',
            _ => false,
        }
    }

    fn step(&mut self, b: u8) -> Result<(), ChunkError> {
        self.state = match self.state {
            State::Size => self.size_byte(b)?,
            State::SizeWhitespace => match b {
                b' ' | b'\t' => State::SizeWhitespace,
                b';' => State::Extension(Ext::NameStart),
                b'\r' => State::SizeLf,
                _ => return Err(ChunkError("invalid chunk size line")),
            },
            State::Extension(at) => self.extension_byte(at, b)?,
            State::SizeLf => self.end_of_size_line(b)?,
            State::DataCr => expect(b, b'\r', State::DataLf)?,
            State::DataLf => {
                self.digits = 0;
                self.line_len = 0;
                expect(b, b'\n', State::Size)?
            }
            // A field line as in a head (RFC 9112 5, 7.1.2): a token, `:`, a value without
            // control bytes. Trailers pass upstream as they came: a line that is not a field
            // (`GET /admin HTTP/1.1`) must not reach a server that would read it as a request.
            State::TrailerStart => match b {
                b'\r' => State::EndLf,
                _ if is_tchar(b) => self.trailer_byte(State::TrailerName)?,
                _ => return Err(ChunkError("invalid trailer field")),
            },
            State::TrailerName => match b {
                b':' => self.trailer_byte(State::TrailerLine)?,
                _ if is_tchar(b) => self.trailer_byte(State::TrailerName)?,
                _ => return Err(ChunkError("invalid trailer field name")),
            },
            State::TrailerLine => match b {
                b'\r' => State::TrailerLf,
                b'\t' => self.trailer_byte(State::TrailerLine)?,
                0..=0x1f | 0x7f => return Err(ChunkError("invalid trailer field")),
                _ => self.trailer_byte(State::TrailerLine)?,
            },
            State::TrailerLf => expect(b, b'\n', State::TrailerStart)?,
            State::EndLf => expect(b, b'\n', State::Done)?,
            State::Data | State::Done => self.state,
        };
        Ok(())
    }

    fn size_byte(&mut self, b: u8) -> Result<State, ChunkError> {
        if let Some(d) = (b as char).to_digit(16) {
            if self.digits == MAX_SIZE_DIGITS {
                return Err(ChunkError("chunk size too large"));
            }
            self.digits += 1;
            self.remaining = self.remaining * 16 + u64::from(d);
            return Ok(State::Size);
        }
        if self.digits == 0 {
            return Err(ChunkError("invalid chunk size"));
        }
        match b {
            b' ' | b'\t' => Ok(State::SizeWhitespace),
            b';' => Ok(State::Extension(Ext::NameStart)),
            b'\r' => Ok(State::SizeLf),
            _ => Err(ChunkError("invalid chunk size")),
        }
    }

    /// A byte of a chunk extension, checked against its grammar: extensions are passed on
    /// as they came, and one a recipient could frame differently (an unclosed quoted
    /// string it reads across the CRLF, "funky chunks") must not pass.
    fn extension_byte(&mut self, at: Ext, b: u8) -> Result<State, ChunkError> {
        self.line_len += 1;
        if self.line_len > MAX_SIZE_LINE {
            return Err(ChunkError("chunk extension too long"));
        }
        let blank = b == b' ' || b == b'\t';
        let next = match (at, b) {
            (Ext::Quoted, b'"') => Ext::AfterValue,
            (Ext::Quoted, b'\\') => Ext::QuotedPair,
            (Ext::Quoted | Ext::QuotedPair, _) if blank || (0x21..=0x7e).contains(&b) => {
                Ext::Quoted
            }
            (Ext::Quoted | Ext::QuotedPair, 0x80..) => Ext::Quoted,
            (Ext::Quoted | Ext::QuotedPair, _) => {
                return Err(ChunkError("invalid chunk extension"))
            }
            (Ext::Name | Ext::AfterName | Ext::Token | Ext::AfterValue, b'\r') => {
                return Ok(State::SizeLf)
            }
            (Ext::Name | Ext::AfterName | Ext::Token | Ext::AfterValue, b';') => Ext::NameStart,
            (Ext::Name | Ext::AfterName, b'=') => Ext::ValueStart,
            (Ext::NameStart | Ext::Name, _) if is_tchar(b) => Ext::Name,
            (Ext::ValueStart | Ext::Token, _) if is_tchar(b) => Ext::Token,
            (Ext::ValueStart, b'"') => Ext::Quoted,
            (Ext::NameStart | Ext::AfterName | Ext::ValueStart, _) if blank => at,
            (Ext::Name, _) if blank => Ext::AfterName,
            (Ext::Token | Ext::AfterValue, _) if blank => Ext::AfterValue,
            _ => return Err(ChunkError("invalid chunk extension")),
        };
        Ok(State::Extension(next))
    }

    fn end_of_size_line(&mut self, b: u8) -> Result<State, ChunkError> {
        if b != b'\n' {
            return Err(ChunkError("chunk size line not ended by CRLF"));
        }
        if self.remaining == 0 {
            return Ok(State::TrailerStart);
        }
        self.body_len = self
            .body_len
            .checked_add(self.remaining)
            .ok_or(ChunkError("body too large"))?;
        Ok(State::Data)
    }

    fn trailer_byte(&mut self, next: State) -> Result<State, ChunkError> {
        self.trailer_len += 1;
        if self.trailer_len > MAX_TRAILERS {
            return Err(ChunkError("trailers too large"));
        }
        Ok(next)
    }
}

/// A byte of a token (RFC 9110 5.6.2), as a field name is.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn expect(b: u8, want: u8, next: State) -> Result<State, ChunkError> {
    if b == want {
        Ok(next)
    } else {
        Err(ChunkError("chunk data not followed by CRLF"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`decode_in_pieces`] found: (data, consumed, done, trailer bytes).
    type Pieces = (Vec<u8>, usize, bool, Vec<u8>);

    /// Decodes `input` fed in pieces of `piece` bytes.
    fn decode_in_pieces(input: &[u8], piece: usize) -> Result<Pieces, ChunkError> {
        let mut dec = ChunkedDecoder::new();
        let mut data = Vec::new();
        let mut trailers = Vec::new();
        let mut pos = 0;
        while pos < input.len() && !dec.is_done() {
            let end = (pos + piece).min(input.len());
            let mut part = &input[pos..end];
            while !part.is_empty() && !dec.is_done() {
                let d = dec.decode(part)?;
                if let Some(r) = d.data {
                    data.extend_from_slice(&part[r]);
                }
                trailers.extend_from_slice(&part[d.trailers]);
                pos += d.consumed;
                part = &part[d.consumed..];
                if d.consumed == 0 {
                    break;
                }
            }
        }
        Ok((data, pos, dec.is_done(), trailers))
    }

    #[test]
    fn decodes_at_every_split() {
        let msg = b"5;ext=1\r\nhello\r\nA \r\n0123456789\r\n0\r\nX-T: y\r\n\r\nGET /next";
        let end = msg.len() - b"GET /next".len();
        for piece in 1..=msg.len() {
            let (data, consumed, done, trailers) = decode_in_pieces(msg, piece).unwrap();
            assert_eq!(data, b"hello0123456789", "piece {piece}");
            assert_eq!(consumed, end, "piece {piece}");
            assert!(done);
            assert_eq!(trailers, b"X-T: y\r\n", "piece {piece}");
        }
    }

    #[test]
    fn reports_every_trailer_line_at_every_split() {
        let msg = b"2\r\nab\r\n0\r\nA: 1\r\nBb: two words\r\n\r\nnext";
        for piece in 1..=msg.len() {
            let (data, _, done, trailers) = decode_in_pieces(msg, piece).unwrap();
            assert_eq!((data.as_slice(), done), (&b"ab"[..], true), "piece {piece}");
            assert_eq!(trailers, b"A: 1\r\nBb: two words\r\n", "piece {piece}");
        }
        let (_, _, _, none) = decode_in_pieces(b"2\r\nab\r\n0\r\n\r\n", 1).unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn every_two_way_split_agrees() {
        let msg = b"3\r\nabc\r\n0\r\n\r\n";
        for cut in 0..=msg.len() {
            let mut dec = ChunkedDecoder::new();
            let mut data = Vec::new();
            for part in [&msg[..cut], &msg[cut..]] {
                let mut p = part;
                while !p.is_empty() {
                    let d = dec.decode(p).unwrap();
                    if let Some(r) = d.data {
                        data.extend_from_slice(&p[r]);
                    }
                    p = &p[d.consumed..];
                }
            }
            assert!(dec.is_done(), "cut {cut}");
            assert_eq!(data, b"abc");
        }
    }

    #[test]
    fn rejects_bad_framing() {
        for bad in [
            &b"x\r\n"[..],
            b"-1\r\n",
            b"\r\n",
            b"5\nhello\r\n",
            b"3\r\nabcX\r\n",
            b"11111111111111111\r\n",
            b"3 x\r\n",
            b"0\r\n folded\r\n\r\n",
            b"0\r\n\rX",
            b"3;a\x01\r\n",
            // Chunk extensions outside the grammar: an unclosed quoted string (a recipient
            // reading it across the CRLF would frame the rest differently), no name, a
            // name that is not a token, a value missing, a control byte in a quoted string.
            b"5;a=\"x\r\nhello\r\n0\r\n\r\n",
            b"5;\r\nhello\r\n0\r\n\r\n",
            b"5;a b\r\nhello\r\n0\r\n\r\n",
            b"5;a=\r\nhello\r\n0\r\n\r\n",
            b"5;a=\"x\x01\"\r\nhello\r\n0\r\n\r\n",
            b"5;a=\"x\"y\r\nhello\r\n0\r\n\r\n",
            // Trailer lines that are not fields: a request line, a name with a space,
            // no colon, a control byte in the value.
            b"0\r\nGET /admin HTTP/1.1\r\n\r\n",
            b"0\r\nX T: 1\r\n\r\n",
            b"0\r\nX-T 1\r\n\r\n",
            b"0\r\nX-T: a\x01b\r\n\r\n",
        ] {
            assert!(
                decode_in_pieces(bad, 1).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn accepts_extensions_of_the_grammar() {
        for good in [
            &b"5;a\r\nhello\r\n0\r\n\r\n"[..],
            b"5 ; a = b ; c\r\nhello\r\n0;last\r\n\r\n",
            b"5;a=\"q; \\\" \\\\ \xc3\xa9\"\t;b=1\r\nhello\r\n0\r\n\r\n",
        ] {
            let pieces = decode_in_pieces(good, 1);
            assert!(pieces.is_ok(), "{:?}", String::from_utf8_lossy(good));
        }
    }

    #[test]
    fn counts_body_length() {
        let mut dec = ChunkedDecoder::new();
        let mut input = &b"ffffffffffffffff\r\n"[..];
        while !input.is_empty() {
            let d = dec.decode(input).unwrap();
            input = &input[d.consumed..];
        }
        assert_eq!(dec.body_len(), u64::MAX);
    }
}
