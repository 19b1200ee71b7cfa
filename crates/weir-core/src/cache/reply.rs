//! A response from the store as the reply a request gets: a `files::Reply`, which every
//! client adapter sends as it sends an upstream's response (the route's
//! `response_headers` and compression on the head, the one relay for the body). The
//! stored head goes out with its `Age`, a `Content-Length` and `Cache-Status`, its body
//! from memory or from the entry's file (a sealed memfd, a disk entry's: sendfile(2) to
//! plain-TCP HTTP/1.1 clients, `files::reply`); the
//! request's `If-None-Match` / `If-Modified-Since` (a `304` from the stored validators)
//! and `Range` (`206`, `multipart/byteranges`, `416`; with `If-Range`) are weighed as for
//! a static file (`files::http::evaluate`). `If-Match` and `If-Unmodified-Since` are not a
//! cache's to weigh (RFC 9111 4.3.2): such requests are forwarded ([`super::lookup`]).

use http::header::{self, HeaderName};
use http::HeaderMap;

use super::Hit;
use crate::codec::http1::write::{push_header, push_status_line};
use crate::codec::Fields;
use crate::error::reason_phrase;
use crate::files::head::{end, multipart, push_content_range};
use crate::files::http::{evaluate, parse_date, Validate, Verdict};
use crate::files::{Body, Data, Part, Reply};

/// A body from a cache entry goes out with sendfile(2) when it is in a file (only entries
/// of at least their store's `sendfile_min_size` are, and disk entries whose file is over
/// 64 KiB: `store`) and what is sent is at least this long: a short range of a large
/// entry goes out in one write with its head (two system calls and two segments
/// otherwise).
const SENDFILE_FLOOR: u64 = 16 << 10;

/// The fields a `304` carries from the stored response (RFC 9110 15.4.5), and its age.
const NOT_MODIFIED_FIELDS: [HeaderName; 8] = [
    header::CACHE_CONTROL,
    header::CONTENT_LOCATION,
    header::DATE,
    header::ETAG,
    header::EXPIRES,
    header::VARY,
    header::LAST_MODIFIED,
    header::AGE,
];

impl Hit {
    /// The reply to a request with the fields `request` (a `HEAD`: `is_head`).
    pub(super) fn reply(self, request: &HeaderMap, is_head: bool) -> Reply {
        let stored = Stored::of(&self.head.headers, self.length);
        // Conditions and ranges select a representation: only a 200 has one to select.
        let verdict = match self.head.status {
            http::StatusCode::OK => {
                let encoded = self.head.headers.get(header::CONTENT_ENCODING);
                let encoded = encoded.is_some_and(|v| v.as_bytes() != b"identity");
                evaluate(Fields::Http2(request), &stored, !is_head).for_coding(encoded)
            }
            _ => Verdict::Full,
        };
        let reply = match verdict {
            Verdict::Full => self.all(),
            Verdict::NotModified => {
                let mut head = self.head(304, |name| NOT_MODIFIED_FIELDS.contains(name));
                end(&mut head, None);
                // Its ETag and Vary are the 200's: the route's compression plans it as
                // that 200 (`Reply::plan`).
                let planned_as = Some(self.full_head().into_boxed_slice());
                Reply {
                    planned_as,
                    ..self.with(head, Body::Empty)
                }
            }
            Verdict::Partial(ranges) => self.partial(&ranges),
            Verdict::PreconditionFailed => Reply::text(412, b"", SENDFILE_FLOOR),
            Verdict::Unsatisfiable => {
                let line = format!("Content-Range: bytes */{}\r\n", self.length);
                Reply::text(416, line.as_bytes(), SENDFILE_FLOOR)
            }
        };
        Reply {
            cache: Some(self.label.served.result()),
            ..reply
        }
        .for_method(is_head)
    }

    /// The status line and the stored fields `keep` keeps (not its framing), and the
    /// `Cache-Status` line when the route adds it; not ended.
    fn head(&self, status: u16, keep: impl Fn(&HeaderName) -> bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        push_status_line(&mut out, status, reason_phrase(status).as_bytes());
        for (name, value) in &self.head.headers {
            let framing = name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING;
            if !framing && keep(name) {
                push_header(&mut out, name.as_str().as_bytes(), value.as_bytes());
            }
        }
        if self.label.status_header {
            out.extend_from_slice(self.label.served.line());
        }
        out
    }

    /// The whole stored response.
    fn all(&self) -> Reply {
        self.with(self.full_head(), self.range(0, self.length))
    }

    /// The whole stored response's head (a `204` has no `Content-Length`, RFC 9110 8.6).
    fn full_head(&self) -> Vec<u8> {
        let status = self.head.status;
        let mut head = self.head(status.as_u16(), |_| true);
        let length = (status != http::StatusCode::NO_CONTENT).then_some(self.length);
        end(&mut head, length);
        head
    }

    /// A `206` of `ranges` (first and last byte) of the stored body.
    fn partial(&self, ranges: &[(u64, u64)]) -> Reply {
        if let [(first, last)] = ranges {
            let mut head = self.head(206, |name| !is_whole(name));
            push_content_range(&mut head, *first, *last, self.length);
            end(&mut head, Some(last + 1 - first));
            return self.with(head, self.range(*first, last + 1));
        }
        let mut head = self.head(206, |name| name != header::CONTENT_TYPE && !is_whole(name));
        let kind = self.head.headers.get(header::CONTENT_TYPE);
        let kind = kind.map_or(&b"application/octet-stream"[..], |v| v.as_bytes());
        let data = Data::Entry(self.body.clone());
        let body = multipart(&mut head, data, self.length, ranges, kind);
        self.with(head, body)
    }

    /// The stored body's bytes `first..end`, shared.
    fn range(&self, first: u64, end: u64) -> Body {
        if self.body.is_empty() {
            return Body::Empty;
        }
        let parts = vec![Part::Bytes(first, end)];
        Body::parts(Data::Entry(self.body.clone()), parts, Vec::new())
    }

    fn with(&self, head: Vec<u8>, body: Body) -> Reply {
        Reply {
            head,
            body,
            sendfile_min_size: SENDFILE_FLOOR,
            cache: None,
            planned_as: None,
        }
    }
}

/// A stored field that describes the whole stored body, wrong on a `206` of a part of it:
/// a digest of it (`Content-Digest`, `Content-MD5`), or the stored response's own
/// `Content-Range` (the `206` says its own).
fn is_whole(name: &HeaderName) -> bool {
    name == "content-digest" || name == "content-md5" || name == header::CONTENT_RANGE
}

/// A stored response's validators: its `ETag` and `Last-Modified` as they were sent.
struct Stored<'a> {
    len: u64,
    etag: Option<&'a [u8]>,
    modified: Option<u64>,
}

impl<'a> Stored<'a> {
    fn of(headers: &'a HeaderMap, len: u64) -> Stored<'a> {
        let modified = headers.get(header::LAST_MODIFIED);
        Stored {
            len,
            etag: headers.get(header::ETAG).map(|v| v.as_bytes().trim_ascii()),
            modified: modified.and_then(|v| parse_date(v.as_bytes())),
        }
    }
}

impl Validate for Stored<'_> {
    fn len(&self) -> u64 {
        self.len
    }

    fn modified(&self) -> Option<u64> {
        self.modified
    }

    fn etag_matches(&self, tag: &[u8], strong: bool) -> bool {
        match self.etag.map(|mine| (mine.strip_prefix(b"W/"), mine)) {
            None => false,
            Some((Some(_), _)) if strong => false,
            Some((Some(opaque), _)) => opaque == tag,
            Some((None, mine)) => mine == tag,
        }
    }
}
