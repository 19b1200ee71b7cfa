//! A reply's body as a `forward::relay::Source`: a short text, or parts of a file or of a
//! cache entry's bytes (one range, or the ranges of a `multipart/byteranges` body between
//! their part heads). A file is read in large pieces with pread(2) into `Bytes` that an
//! HTTP/2 stream sends on without a copy; a body that fits in one piece is read whole, so
//! it goes out with its head in one write. A cache entry's bytes in memory are shared,
//! never copied (one range is one piece); a disk entry's file is read as a static file is.
//! An HTTP/2 stream bounds each piece by its client's window before it is read
//! ([`BodySource::bound`], `http2::files`), so a stream that gets no window holds no piece.
//! Plain-TCP HTTP/1.1 bodies of one range of a file (a static file, a cache entry's
//! sealed memfd or file) skip this for sendfile(2) (`reply`).

use std::fs::File;
use std::os::unix::fs::FileExt;

use bytes::{Bytes, BytesMut};

use super::Opened;
use crate::cache::Held;
use crate::error::ProxyError;
use crate::forward::relay::{Piece, Source, Trailers};

/// Most bytes read from a file at once.
pub(crate) const PIECE: u64 = 128 * 1024;

/// What a reply sends after its head.
pub(crate) enum Body {
    /// Nothing (HEAD, 304).
    Empty,
    Text(Vec<u8>),
    /// `parts` of `data`, the `Text` parts in `text`.
    Parts {
        data: Data,
        parts: Vec<Part>,
        text: Vec<u8>,
    },
}

/// What a body's byte parts are taken from.
pub(crate) enum Data {
    /// An open file.
    File(Opened),
    /// A cache entry's body.
    Entry(Held),
}

impl Data {
    /// Its bytes, if they are in memory.
    fn memory(&self) -> Option<&Bytes> {
        match self {
            Data::Entry(Held::Memory(b) | Held::Sealed(b, _)) => Some(b),
            Data::File(_) | Data::Entry(Held::File(..)) => None,
        }
    }

    /// The file its bytes are in, and where byte 0 of them is in it, if they are in one.
    fn file(&self) -> Option<(&File, u64)> {
        match self {
            Data::File(opened) => Some((&opened.file, 0)),
            Data::Entry(Held::Sealed(_, memfd)) => Some((&memfd.file, 0)),
            Data::Entry(Held::File(file, at, _)) => Some((file, *at)),
            Data::Entry(Held::Memory(_)) => None,
        }
    }
}

/// A part of a file body.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Part {
    /// `text[start..end]`.
    Text(usize, usize),
    /// The file's bytes `first..end`.
    Bytes(u64, u64),
}

impl Body {
    pub fn parts(data: Data, parts: Vec<Part>, text: Vec<u8>) -> Body {
        Body::Parts { data, parts, text }
    }

    /// The one range, when that is the whole body: the file its bytes are in
    /// (sendfile's case), if they are in one, and where they are, `first..end` (in that
    /// file, if there is one).
    pub fn single_range(&self) -> Option<(Option<&File>, u64, u64)> {
        let Body::Parts { data, parts, .. } = self else {
            return None;
        };
        let [Part::Bytes(first, end)] = parts.as_slice() else {
            return None;
        };
        Some(match data.file() {
            Some((file, at)) => (Some(file), at + first, at + end),
            None => (None, *first, *end),
        })
    }
}

/// A body handed out piece by piece.
pub(crate) struct BodySource<'b> {
    body: &'b Body,
    /// The part being sent, and the next byte of it.
    part: usize,
    at: u64,
    /// Most bytes of the next piece (and of [`Source::whole`]'s, read from a file):
    /// [`PIECE`], or what the sink has room for ([`BodySource::bound`]).
    room: u64,
}

impl<'b> BodySource<'b> {
    pub fn new(body: &'b Body) -> Self {
        BodySource {
            body,
            part: 0,
            at: 0,
            room: PIECE,
        }
    }

    /// Makes the next piece at most `room` bytes (at least one): an HTTP/2 stream reads
    /// no more of a file than its client's window takes (`http2::files`). A text part
    /// (a multipart head) goes whole.
    pub fn bound(&mut self, room: u64) {
        self.room = room.clamp(1, PIECE);
    }

    /// The body bytes not handed out yet.
    pub fn remaining(&self) -> u64 {
        let Body::Parts { parts, .. } = self.body else {
            return match self.body {
                Body::Text(text) if self.part == 0 => text.len() as u64,
                _ => 0,
            };
        };
        let rest = parts
            .iter()
            .skip(self.part)
            .map(|p| part_len(*p))
            .sum::<u64>();
        rest - self.at
    }
}

impl Source for BodySource<'_> {
    async fn next(&mut self) -> Result<Option<(Piece<'_>, bool)>, ProxyError> {
        match self.body {
            Body::Empty => Ok(None),
            Body::Text(text) => {
                let first = std::mem::replace(&mut self.part, 1) == 0;
                Ok(first.then_some((Piece::Slice(text), true)))
            }
            Body::Parts { data, parts, text } => self.next_part(data, parts, text),
        }
    }

    fn taken(&mut self) {}

    async fn trailers(&mut self) -> Result<Trailers<'_>, ProxyError> {
        Ok(Trailers::None)
    }

    fn whole(&mut self) -> Option<Piece<'_>> {
        let Body::Parts { data, parts, text } = self.body else {
            return match self.body {
                Body::Text(text) if self.part == 0 => {
                    self.part = 1;
                    Some(Piece::Slice(text))
                }
                _ => None,
            };
        };
        if self.part > 0 {
            return None;
        }
        // One range of shared bytes: itself, whatever its length, without a copy.
        if let Some(bytes) = data.memory() {
            let [Part::Bytes(first, end)] = parts.as_slice() else {
                return None;
            };
            self.part = 1;
            return Some(Piece::Bytes(bytes.slice(*first as usize..*end as usize)));
        }
        let (file, base) = data.file()?;
        let total: u64 = parts.iter().map(|p| part_len(*p)).sum();
        if total > self.room {
            return None;
        }
        let mut out = BytesMut::zeroed(total as usize);
        let mut at = 0;
        for p in parts {
            let n = part_len(*p) as usize;
            match *p {
                Part::Text(s, e) => out[at..at + n].copy_from_slice(&text[s..e]),
                Part::Bytes(first, _) => file
                    .read_exact_at(&mut out[at..at + n], base + first)
                    .ok()?,
            }
            at += n;
        }
        self.part = parts.len();
        Some(Piece::Bytes(out.freeze()))
    }
}

impl BodySource<'_> {
    fn next_part<'s>(
        &mut self,
        data: &Data,
        parts: &[Part],
        text: &'s [u8],
    ) -> Result<Option<(Piece<'s>, bool)>, ProxyError> {
        let Some(&part) = parts.get(self.part) else {
            return Ok(None);
        };
        let last_part = self.part + 1 == parts.len();
        match part {
            Part::Text(s, e) => {
                self.part += 1;
                Ok(Some((Piece::Slice(&text[s..e]), last_part)))
            }
            Part::Bytes(first, end) => {
                let from = first + self.at;
                let n = (end - from).min(self.room);
                let piece = match (data.memory(), data.file()) {
                    (Some(bytes), _) => bytes.slice(from as usize..(from + n) as usize),
                    (None, Some((file, base))) => read_piece(file, base + from, n)?,
                    (None, None) => return Ok(None),
                };
                self.at += n;
                let done = from + n == end;
                if done {
                    (self.part, self.at) = (self.part + 1, 0);
                }
                Ok(Some((Piece::Bytes(piece), done && last_part)))
            }
        }
    }
}

/// The file's `n` bytes from `from`; a file that shrank under the reply fails it (the
/// response is cut short).
fn read_piece(file: &File, from: u64, n: u64) -> Result<Bytes, ProxyError> {
    let mut out = BytesMut::zeroed(n as usize);
    let read = file.read_exact_at(&mut out, from);
    read.map_err(|e| ProxyError::UpstreamIo(e.kind()))?;
    Ok(out.freeze())
}

fn part_len(p: Part) -> u64 {
    match p {
        Part::Text(s, e) => (e - s) as u64,
        Part::Bytes(first, end) => end - first,
    }
}
