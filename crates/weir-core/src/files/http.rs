//! What a request asks beyond the representation (RFC 9110 section 13): its validators
//! (a file's `ETag` from size and mtime as nginx makes it, and `Last-Modified`; a cache
//! entry's as it was stored: [`Validate`]), the preconditions in the RFC's order
//! (`If-Match`, `If-Unmodified-Since`, `If-None-Match`, `If-Modified-Since`), and the
//! `Range` with its `If-Range`. Static files and the HTTP cache's hits both answer
//! through [`evaluate`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::codec::Fields;

/// Most ranges one request may ask; with more, the whole file is sent (RFC 9110 14.2
/// lets a server ignore a Range; many small ranges are a known amplification).
pub(crate) const MAX_RANGES: usize = 32;

/// A file's validators.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Validators {
    pub len: u64,
    /// Whole seconds since the epoch (what `Last-Modified` can say).
    pub mtime: u64,
}

impl Validators {
    /// `"<mtime hex>-<size hex>"`, quoted: strong (a change within the same second at the
    /// same size goes unnoticed, as with nginx).
    pub fn push_etag(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        let _ = write!(out, "\"{:x}-{:x}\"", self.mtime, self.len);
    }

    pub fn push_last_modified(&self, out: &mut Vec<u8>) {
        let at = UNIX_EPOCH + Duration::from_secs(self.mtime);
        out.extend_from_slice(httpdate::fmt_http_date(at).as_bytes());
    }
}

/// A representation's validators, as the conditions weigh them.
pub(crate) trait Validate {
    /// Its length (what ranges are taken from).
    fn len(&self) -> u64;
    /// Its `Last-Modified`, in whole seconds since the epoch, if it has one.
    fn modified(&self) -> Option<u64>;
    /// Whether its entity tag is `tag` (an opaque tag, quotes included, without `W/`);
    /// `strong`: a weak tag of its own never matches.
    fn etag_matches(&self, tag: &[u8], strong: bool) -> bool;
}

impl Validate for Validators {
    fn len(&self) -> u64 {
        self.len
    }

    fn modified(&self) -> Option<u64> {
        Some(self.mtime)
    }

    fn etag_matches(&self, tag: &[u8], _: bool) -> bool {
        let mut mine = Vec::with_capacity(40);
        self.push_etag(&mut mine);
        tag == mine.as_slice()
    }
}

/// What the request's conditions make of the file.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The whole file, 200.
    Full,
    /// 304.
    NotModified,
    /// 412.
    PreconditionFailed,
    /// 206: these ranges (first and last byte, inclusive), in the order asked.
    Partial(Vec<(u64, u64)>),
    /// 416.
    Unsatisfiable,
}

impl Verdict {
    /// The verdict for a representation with a content coding (`encoded`): several ranges
    /// of it are answered whole, as RFC 9110 14.2 lets a server ignore `Range`, since a
    /// `multipart/byteranges` cannot say its parts are of an encoded representation (a
    /// `Content-Encoding` on it would say the multipart body is encoded).
    pub(crate) fn for_coding(self, encoded: bool) -> Verdict {
        match self {
            Verdict::Partial(ranges) if encoded && ranges.len() > 1 => Verdict::Full,
            other => other,
        }
    }
}

/// The values of every request field named `name` (lower case), in order, trimmed.
fn values<'a>(f: Fields<'a>, name: &'static [u8]) -> impl Iterator<Item = &'a [u8]> {
    let mut out = Vec::new();
    f.each(|n, v| {
        if n.eq_ignore_ascii_case(name) {
            out.push(v.trim_ascii());
        }
    });
    out.into_iter()
}

fn first<'a>(f: Fields<'a>, name: &'static [u8]) -> Option<&'a [u8]> {
    f.get(name).map(<[u8]>::trim_ascii)
}

/// The verdict for a GET (`ranged`: a Range may apply) or HEAD of a representation with
/// `v`, the request's fields `f`.
pub(crate) fn evaluate(f: Fields<'_>, v: &impl Validate, ranged: bool) -> Verdict {
    if let Some(verdict) = preconditions(f, v) {
        return verdict;
    }
    let Some(range) = first(f, b"range").filter(|_| ranged) else {
        return Verdict::Full;
    };
    if let Some(if_range) = first(f, b"if-range") {
        if !if_range_holds(if_range, v) {
            return Verdict::Full;
        }
    }
    match parse_ranges(range, v.len()) {
        None => Verdict::Full,
        Some(ranges) if ranges.is_empty() => Verdict::Unsatisfiable,
        Some(ranges) => Verdict::Partial(ranges),
    }
}

/// RFC 9110 13.2.2, steps 1 to 4 (the method is GET or HEAD).
/// A representation without `Last-Modified` is never modified since a date nor unmodified
/// since one: those conditions then hold and fail as if the field were absent.
fn preconditions(f: Fields<'_>, v: &impl Validate) -> Option<Verdict> {
    let mut if_match = values(f, b"if-match").peekable();
    if if_match.peek().is_some() {
        if !if_match.any(|list| list_matches(list, v, true)) {
            return Some(Verdict::PreconditionFailed);
        }
    } else if let Some(date) = first(f, b"if-unmodified-since").and_then(parse_date) {
        if v.modified().is_some_and(|m| m > date) {
            return Some(Verdict::PreconditionFailed);
        }
    }
    let mut if_none_match = values(f, b"if-none-match").peekable();
    if if_none_match.peek().is_some() {
        if if_none_match.any(|list| list_matches(list, v, false)) {
            return Some(Verdict::NotModified);
        }
    } else if let Some(date) = first(f, b"if-modified-since").and_then(parse_date) {
        if v.modified().is_some_and(|m| m <= date) {
            return Some(Verdict::NotModified);
        }
    }
    None
}

/// Whether an entity-tag list (`*`, or tags separated by commas) holds the
/// representation's tag; `strong`: weak tags never match (If-Match), else they compare
/// without `W/`.
fn list_matches(list: &[u8], v: &impl Validate, strong: bool) -> bool {
    if list == b"*" {
        return true;
    }
    list.split(|b| *b == b',').any(|tag| {
        let tag = tag.trim_ascii();
        match tag.strip_prefix(b"W/") {
            Some(_) if strong => false,
            Some(weak) => v.etag_matches(weak, false),
            None => v.etag_matches(tag, strong),
        }
    })
}

/// `If-Range`: a strong tag equal to the representation's, or exactly its
/// `Last-Modified` date.
fn if_range_holds(value: &[u8], v: &impl Validate) -> bool {
    if value.starts_with(b"\"") {
        return v.etag_matches(value, true);
    }
    v.modified().is_some_and(|m| parse_date(value) == Some(m))
}

pub(crate) fn parse_date(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value).ok()?;
    let at: SystemTime = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(UNIX_EPOCH).ok()?.as_secs())
}

/// The satisfiable ranges of a `bytes=` Range over `len` bytes (empty: none is);
/// `None`: the field is malformed, of another unit, or asks too many (ignored: 200).
pub(crate) fn parse_ranges(value: &[u8], len: u64) -> Option<Vec<(u64, u64)>> {
    let specs = value
        .get(..6)
        .filter(|unit| unit.eq_ignore_ascii_case(b"bytes="))
        .map(|_| &value[6..])?;
    let mut out = Vec::new();
    let mut asked = 0;
    for spec in specs.split(|b| *b == b',') {
        let spec = spec.trim_ascii();
        if spec.is_empty() {
            continue;
        }
        asked += 1;
        if asked > MAX_RANGES {
            return None;
        }
        let dash = spec.iter().position(|b| *b == b'-')?;
        let (first, last) = (&spec[..dash], &spec[dash + 1..]);
        let range = if first.is_empty() {
            // The last `n` bytes.
            let n = number(last)?;
            (n > 0 && len > 0).then(|| (len - n.min(len), len - 1))
        } else {
            let start = number(first)?;
            let end = match last.is_empty() {
                true => u64::MAX,
                false => number(last)?,
            };
            if end < start {
                return None;
            }
            (start < len).then(|| (start, end.min(len - 1)))
        };
        out.extend(range);
    }
    // Ranges that overlap, or ask more than the file, are answered whole (as nginx does):
    // `bytes=0-,0-,...` must not make one request send the file 32 times.
    let asked_bytes = (out.iter()).fold(0u64, |sum, (a, b)| sum.saturating_add(b - a + 1));
    if out.len() > 1 && (asked_bytes > len || overlap(&out)) {
        return None;
    }
    (asked > 0).then_some(out)
}

/// Whether any two of `ranges` (first and last byte) share a byte: `bytes=0-0,0-0,...`
/// fits the sum check but would send the same byte in 32 parts.
fn overlap(ranges: &[(u64, u64)]) -> bool {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).any(|w| w[1].0 <= w[0].1)
}

fn number(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_read_as_rfc_9110_says() {
        let r = |s: &str| parse_ranges(s.as_bytes(), 100);
        assert_eq!(r("bytes=0-9"), Some(vec![(0, 9)]));
        assert_eq!(r("bytes=90-"), Some(vec![(90, 99)]));
        assert_eq!(r("bytes=-10"), Some(vec![(90, 99)]));
        assert_eq!(r("bytes=-1000"), Some(vec![(0, 99)]));
        assert_eq!(r("bytes=95-200"), Some(vec![(95, 99)]));
        assert_eq!(r("BYTES=0-0, 5-6"), Some(vec![(0, 0), (5, 6)]));
        assert_eq!(r("bytes=100-"), Some(vec![]));
        assert_eq!(r("bytes=-0"), Some(vec![]));
        assert_eq!(r("bytes=5-1"), None);
        assert_eq!(r("items=0-1"), None);
        assert_eq!(r("bytes=a-b"), None);
        assert_eq!(r("bytes="), None);
        let many = format!("bytes={}", vec!["0-0"; MAX_RANGES + 1].join(","));
        assert_eq!(r(&many), None);
        // Several ranges asking more than the file: the whole file, once.
        let again = format!("bytes={}", vec!["0-"; MAX_RANGES].join(","));
        assert_eq!(r(&again), None);
        assert_eq!(r("bytes=0-59,40-99"), None);
        assert_eq!(r("bytes=0-49,50-99"), Some(vec![(0, 49), (50, 99)]));
        // Overlapping ranges within the sum: the whole file too.
        let same = format!("bytes={}", vec!["0-0"; MAX_RANGES].join(","));
        assert_eq!(r(&same), None);
        assert_eq!(r("bytes=50-59,0-9,5-5"), None);
        assert_eq!(r("bytes=50-59,0-9"), Some(vec![(50, 59), (0, 9)]));
    }
}
