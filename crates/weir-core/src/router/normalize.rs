//! Request-path normalisation: the path a request is routed on and forwarded with.
//!
//! A prefix route must not be escaped with `/public/../admin` (or `/public/%2e%2e/admin`):
//! the backend would resolve it to `/admin`, outside every route the operator wrote. So the
//! path is normalised first (RFC 3986 section 5.2.4 `remove_dot_segments`, on the path
//! only, the query untouched), refused with 400 when it climbs above the root (as nginx
//! does), and the normalised path is both what the router matches and what goes upstream.
//!
//! Besides dot segments: percent-encoded unreserved characters are decoded (`%7E` -> `~`,
//! `%2e` -> `.`, RFC 3986 6.2.2.2) and other escapes get upper-case hex, a malformed escape
//! is refused, `%2F` / `%5C` (and a raw `\`) follow `encoded_slash`, `//` may be merged,
//! and a dot segment with parameters (`..;`, which servlet containers resolve) is refused.
//!
//! An escaped control character (`%00`-`%1F`, `%7F`) is refused whatever the settings: a
//! server that decodes the path may cut it at a NUL (`/a/..%00/etc/passwd`) or write a CR
//! or LF into a log line or a header. The raw bytes never get this far: the HTTP/1.1
//! parser (and `codec::http1::fill_written` for HTTP/2's `:path`) refuses them.
//!
//! Cost: a path with no `%`, no `\`, no `.` or `..` segment (and no `//` when merging) is
//! already normal; one scan over its bytes finds that, and it is used in place. Only a path
//! that may change is written, once, into the connection's reusable scratch buffer. (Every
//! escape sends a path down that pass, which is where escaped controls are caught; with all
//! normalisation off, one scan for `%` looks for them instead.)

use weir_config::{EncodedSlash, PathNormalization};

use crate::error::ProxyError;

/// Why a path is refused (each is a 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    /// `..` segments climb above `/` (`/..`, `/a/../..`).
    ClimbsAboveRoot,
    /// `%2F`, `%5C` or `\` under `encoded_slash = "reject"`.
    EncodedSlash,
    /// `%` not followed by two hex digits.
    BadEscape,
    /// An escaped control character: `%00`-`%1F` or `%7F`.
    EncodedControl,
    /// A `.` or `..` segment with parameters (`/public/..;/admin`): Tomcat and Jetty drop
    /// the parameters and resolve the `..`, so it must neither pass as a name nor be
    /// guessed at.
    DotSegmentParameters,
}

impl From<PathError> for ProxyError {
    fn from(e: PathError) -> ProxyError {
        ProxyError::BadRequest(match e {
            PathError::ClimbsAboveRoot => "path climbs above the root",
            PathError::EncodedSlash => "encoded slash or backslash in path",
            PathError::BadEscape => "malformed percent-encoding in path",
            PathError::EncodedControl => "percent-encoded control character in path",
            PathError::DotSegmentParameters => "dot segment with parameters (..;) in path",
        })
    }
}

/// Normalises the path of `target` (origin form: `/path?query`) into `out`.
///
/// `Ok(false)`: `target` is already normal (or not a path, such as `*`); use it as it is
/// (`out` may have been written). `Ok(true)`: `out` holds the normalised path followed by
/// the original query.
pub fn normalize_into(
    target: &[u8],
    settings: &PathNormalization,
    out: &mut Vec<u8>,
) -> Result<bool, PathError> {
    if target.first() != Some(&b'/') {
        return Ok(false);
    }
    if settings.is_off() {
        return refuse_escaped_controls(target).map(|()| false);
    }
    if is_normal(target, settings) {
        return Ok(false);
    }
    let end = target
        .iter()
        .position(|b| *b == b'?')
        .unwrap_or(target.len());
    let (path, query) = target.split_at(end);
    out.clear();
    write_normalized(path, settings, out)?;
    if out.as_slice() == path {
        return Ok(false);
    }
    out.extend_from_slice(query);
    Ok(true)
}

/// The path as sent, when nothing is normalised: only an escaped control character in it
/// (before the query) is refused.
fn refuse_escaped_controls(target: &[u8]) -> Result<(), PathError> {
    let mut rest = target;
    while let Some(at) = rest.iter().position(|b| matches!(b, b'%' | b'?')) {
        if rest[at] == b'?' {
            break;
        }
        if unescape(&rest[at..]).is_some_and(is_control) {
            return Err(PathError::EncodedControl);
        }
        rest = &rest[at + 1..];
    }
    Ok(())
}

/// The fast path: one scan of the path (up to the query) for anything normalisation could
/// change.
fn is_normal(target: &[u8], s: &PathNormalization) -> bool {
    let slashes = s.encoded_slash != EncodedSlash::Keep;
    let mut prev = 0;
    for (i, &b) in target.iter().enumerate() {
        let suspect = match b {
            b'?' => return true,
            b'%' => true,
            b'\\' => slashes,
            b'.' => prev == b'/' && s.dot_segments && starts_dot_segment(&target[i..]),
            b'/' => prev == b'/' && s.merge_slashes,
            _ => false,
        };
        if suspect {
            return false;
        }
        prev = b;
    }
    true
}

/// Whether `rest` (starting with `.`, just after a `/`) is a `.` or `..` segment, perhaps
/// with parameters.
fn starts_dot_segment(rest: &[u8]) -> bool {
    match rest.get(1) {
        None | Some(b'/' | b'?' | b';') => true,
        Some(b'.') => matches!(rest.get(2), None | Some(b'/' | b'?' | b';')),
        _ => false,
    }
}

/// One unit of the path as normalisation sees it: a byte, an escape or a separator.
enum Unit {
    /// A segment separator: `/`, or a decoded `%2F` / `%5C` / `\`.
    Separator,
    /// Bytes that belong to the current segment (a decoded or kept-encoded character).
    Bytes([u8; 3], usize),
}

/// Writes `path` (starting with `/`, no query) in normal form into the empty `out`.
///
/// `out` always holds `/` followed by the finished segments, each ending with `/` once the
/// next one starts; a segment is judged (`.`, `..`, empty) when its end is reached.
fn write_normalized(
    path: &[u8],
    s: &PathNormalization,
    out: &mut Vec<u8>,
) -> Result<(), PathError> {
    out.push(b'/');
    let mut i = 1;
    let mut start = out.len();
    loop {
        // Plain bytes are copied as one run.
        let rest = &path[i..];
        let run = rest
            .iter()
            .position(|b| matches!(b, b'/' | b'%' | b'\\'))
            .unwrap_or(rest.len());
        out.extend_from_slice(&rest[..run]);
        i += run;
        let (unit, len) = match path.get(i) {
            Some(_) => read_unit(&path[i..], s)?,
            None => return end_segment(out, start, s, true),
        };
        i += len;
        match unit {
            Unit::Bytes(bytes, n) => out.extend_from_slice(&bytes[..n]),
            Unit::Separator => {
                end_segment(out, start, s, false)?;
                start = out.len();
            }
        }
    }
}

/// Reads one unit at the start of `rest`; returns it and the input bytes it took.
fn read_unit(rest: &[u8], s: &PathNormalization) -> Result<(Unit, usize), PathError> {
    match rest[0] {
        b'/' => Ok((Unit::Separator, 1)),
        b'\\' => slash(s, Unit::Bytes([b'\\', 0, 0], 1), 1),
        b'%' => {
            let value = unescape(rest).ok_or(PathError::BadEscape)?;
            let escape = Unit::Bytes([b'%', upper(rest[1]), upper(rest[2])], 3);
            match value {
                v if is_control(v) => Err(PathError::EncodedControl),
                b'/' | b'\\' => slash(s, escape, 3),
                v if is_unreserved(v) => Ok((Unit::Bytes([v, 0, 0], 1), 3)),
                _ => Ok((escape, 3)),
            }
        }
        b => Ok((Unit::Bytes([b, 0, 0], 1), 1)),
    }
}

/// An encoded slash or a backslash (`kept`, `len` input bytes), per `encoded_slash`.
fn slash(s: &PathNormalization, kept: Unit, len: usize) -> Result<(Unit, usize), PathError> {
    match s.encoded_slash {
        EncodedSlash::Reject => Err(PathError::EncodedSlash),
        EncodedSlash::Decode => Ok((Unit::Separator, len)),
        EncodedSlash::Keep => Ok((kept, len)),
    }
}

/// Finishes the segment that starts at `out[start..]` (after its `/`): drops a `.`,
/// resolves a `..` against the previous segment, merges an empty one, or keeps it. Unless
/// the path ended, `out` then ends with the `/` that starts the next segment.
fn end_segment(
    out: &mut Vec<u8>,
    start: usize,
    s: &PathNormalization,
    last: bool,
) -> Result<(), PathError> {
    let segment = &out[start..];
    if s.dot_segments && is_dot_with_parameters(segment) {
        return Err(PathError::DotSegmentParameters);
    }
    if s.dot_segments && segment == b"." {
        out.truncate(start);
    } else if s.dot_segments && segment == b".." {
        // Drop "/..", then the previous segment (keeping the `/` before it).
        out.truncate(start - 1);
        let previous = out
            .iter()
            .rposition(|b| *b == b'/')
            .ok_or(PathError::ClimbsAboveRoot)?;
        out.truncate(previous + 1);
    } else if segment.is_empty() && s.merge_slashes {
        // `out` already ends with the `/` the next segment needs.
    } else if !last {
        out.push(b'/');
    }
    Ok(())
}

/// `.;x` or `..;x`: a dot segment once a servlet container strips its parameters.
fn is_dot_with_parameters(segment: &[u8]) -> bool {
    match segment.iter().position(|b| *b == b';') {
        Some(semicolon) => matches!(&segment[..semicolon], b"." | b".."),
        None => false,
    }
}

/// The byte the escape at the start of `escape` (`%` and two hex digits) stands for.
fn unescape(escape: &[u8]) -> Option<u8> {
    Some(hex(escape.get(1))? << 4 | hex(escape.get(2))?)
}

/// A C0 control character or DEL: never meant in a path, refused when escaped.
fn is_control(b: u8) -> bool {
    b < 0x20 || b == 0x7f
}

/// RFC 3986 unreserved: decoding these never changes what a path means.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The value of hex digit `b` (`None`: absent or not a hex digit).
pub(super) fn hex(b: Option<&u8>) -> Option<u8> {
    match b? {
        b @ b'0'..=b'9' => Some(b - b'0'),
        b @ b'a'..=b'f' => Some(b - b'a' + 10),
        b @ b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn upper(b: u8) -> u8 {
    b.to_ascii_uppercase()
}

/// The path a request is routed on and forwarded with, kept per client connection so that
/// its buffer is reused: [`RoutedPath::normalize`] once per request, before routing, then
/// [`RoutedPath::get`] wherever the path is needed for that request.
#[derive(Debug, Default)]
pub struct RoutedPath {
    scratch: Vec<u8>,
    /// The last normalised path differs from the request's: it is in `scratch`.
    changed: bool,
}

impl RoutedPath {
    /// Normalises the request's `raw` path (`RequestHead::path`) and returns the result.
    pub fn normalize<'a>(
        &'a mut self,
        raw: &'a [u8],
        settings: &PathNormalization,
    ) -> Result<&'a [u8], ProxyError> {
        self.changed = false;
        self.changed = normalize_into(raw, settings, &mut self.scratch)?;
        Ok(self.get(raw))
    }

    /// Forgets the last `normalize`: `get` returns the request's path as sent (a request
    /// answered before its path is normalised, such as `redirect_https`).
    pub fn forget(&mut self) {
        self.changed = false;
    }

    /// The path the last `normalize` produced for `raw`, the same request's path.
    pub fn get<'a>(&'a self, raw: &'a [u8]) -> &'a [u8] {
        if self.changed {
            &self.scratch
        } else {
            raw
        }
    }
}

#[cfg(test)]
mod tests;
