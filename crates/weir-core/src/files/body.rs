//! A reply's body as a `forward::relay::Source`: a short text, or parts of a file (one
//! range, or the ranges of a `multipart/byteranges` body between their part heads), read
//! in large pieces with pread(2) into `Bytes` that an HTTP/2 stream sends on without a
//! copy. A body that fits in one piece is read whole, so it goes out with its head in one
//! write. Plain-TCP HTTP/1.1 bodies of one range skip this for sendfile(2) (`reply`).

use std::fs::File;
use std::os::unix::fs::FileExt;

use bytes::BytesMut;

use super::Opened;
use crate::error::ProxyError;
use crate::forward::relay::{Piece, Source, Trailers};

/// Most bytes read from a file at once.
pub(crate) const PIECE: u64 = 128 * 1024;

/// What a reply sends after its head.
pub(crate) enum Body {
    /// Nothing (HEAD, 304).
    Empty,
    Text(Vec<u8>),
    /// `parts` of `file`, the `Text` parts in `text`.
    File {
        file: Opened,
        parts: Vec<Part>,
        text: Vec<u8>,
    },
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
    pub fn file(file: Opened, parts: Vec<Part>, text: Vec<u8>) -> Body {
        Body::File { file, parts, text }
    }

    /// The file and its one range, when that is the whole body (sendfile's case).
    pub fn single_range(&self) -> Option<(&File, u64, u64)> {
        match self {
            Body::File { file, parts, .. } => match parts.as_slice() {
                [Part::Bytes(first, end)] => Some((&file.file, *first, *end)),
                _ => None,
            },
            _ => None,
        }
    }
}

/// A body handed out piece by piece.
pub(crate) struct BodySource<'b> {
    body: &'b Body,
    /// The part being sent, and the next byte of it.
    part: usize,
    at: u64,
}

impl<'b> BodySource<'b> {
    pub fn new(body: &'b Body) -> Self {
        BodySource {
            body,
            part: 0,
            at: 0,
        }
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
            Body::File { file, parts, text } => self.next_part(&file.file, parts, text),
        }
    }

    fn taken(&mut self) {}

    async fn trailers(&mut self) -> Result<Trailers<'_>, ProxyError> {
        Ok(Trailers::None)
    }

    fn whole(&mut self) -> Option<Piece<'_>> {
        let Body::File { file, parts, text } = self.body else {
            return match self.body {
                Body::Text(text) if self.part == 0 => {
                    self.part = 1;
                    Some(Piece::Slice(text))
                }
                _ => None,
            };
        };
        let total: u64 = parts.iter().map(|p| part_len(*p)).sum();
        if total > PIECE || self.part > 0 {
            return None;
        }
        let mut out = BytesMut::zeroed(total as usize);
        let mut at = 0;
        for p in parts {
            let n = part_len(*p) as usize;
            match *p {
                Part::Text(s, e) => out[at..at + n].copy_from_slice(&text[s..e]),
                Part::Bytes(first, _) => {
                    file.file.read_exact_at(&mut out[at..at + n], first).ok()?
                }
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
        file: &File,
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
                let n = (end - from).min(PIECE);
                let mut out = BytesMut::zeroed(n as usize);
                // A file that shrank under the reply fails it (the response is cut short).
                let read = file.read_exact_at(&mut out, from);
                read.map_err(|e| ProxyError::UpstreamIo(e.kind()))?;
                self.at += n;
                let done = from + n == end;
                if done {
                    (self.part, self.at) = (self.part + 1, 0);
                }
                Ok(Some((Piece::Bytes(out.freeze()), done && last_part)))
            }
        }
    }
}

fn part_len(p: Part) -> u64 {
    match p {
        Part::Text(s, e) => (e - s) as u64,
        Part::Bytes(first, end) => end - first,
    }
}
