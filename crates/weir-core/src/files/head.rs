//! A reply's head, written as HTTP/1.1 as an upstream would send it (the adapters apply
//! the route's edits to it as to any response): a file's (200, 206 with one range or
//! `multipart/byteranges`, 304), or a short answer (404, 405, 412, 416, the 301 to a
//! directory's `/`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use weir_config::{Encoding, Files};

use super::body::{Body, Data, Part};
use super::http::{self, Verdict};
use super::{FileServer, Opened, Reply};
use crate::codec::http1::write::{push_decimal, push_status_line};
use crate::error::reason_phrase;
use crate::request::Request;

impl Reply {
    /// A short answer with `status`, its reason phrase as the body, `lines` (each ending
    /// in CRLF) among its fields.
    pub(super) fn status(status: u16, lines: &[u8], cfg: &Files) -> Reply {
        Reply::text(status, lines, cfg.sendfile_min_size)
    }

    /// [`Reply::status`] for any source (`sendfile_min_size`: as for [`Reply`]).
    pub(crate) fn text(status: u16, lines: &[u8], sendfile_min_size: u64) -> Reply {
        let text = format!("{}\n", reason_phrase(status)).into_bytes();
        let mut head = start(status);
        head.extend_from_slice(lines);
        head.extend_from_slice(b"Content-Type: text/plain; charset=utf-8\r\n");
        end(&mut head, Some(text.len() as u64));
        Reply {
            head,
            body: Body::Text(text),
            sendfile_min_size,
            cache: None,
            planned_as: None,
        }
    }

    /// 301 to the directory `routed` names, with its `/` (the query kept).
    pub(super) fn slash(routed: &[u8], cfg: &Files) -> Reply {
        let (path, query) = match routed.iter().position(|b| *b == b'?') {
            Some(q) => routed.split_at(q),
            None => (routed, &[][..]),
        };
        // One leading `/`: `//name/` would be a protocol-relative URL, a redirect to the
        // host `name` (the path is as sent when merge_slashes is off).
        let leading = path.iter().take_while(|b| **b == b'/').count();
        let path = &path[leading.saturating_sub(1)..];
        let mut location = b"Location: ".to_vec();
        location.extend_from_slice(path);
        location.push(b'/');
        location.extend_from_slice(query);
        location.extend_from_slice(b"\r\n");
        Reply::status(301, &location, cfg)
    }

    /// Whether `body` goes out for a HEAD request: never.
    pub(crate) fn for_method(mut self, is_head: bool) -> Reply {
        if is_head {
            self.body = Body::Empty;
        }
        self
    }
}

impl FileServer {
    /// The reply to `r` for `file`, or its precompressed `sibling` (sent instead, with
    /// `file`'s type): its conditions and range weighed.
    pub(super) fn reply(
        &self,
        r: &Request<'_>,
        file: &Opened,
        sibling: Option<(Opened, Encoding)>,
    ) -> Reply {
        let cfg = &self.config;
        let (sent, coding) = match sibling {
            Some((s, c)) => (s, Some(c)),
            None => (file.clone(), None),
        };
        let v = sent.validators;
        let fields = crate::codec::Fields::Http1 {
            buf: r.buf,
            headers: &r.req.headers,
        };
        let is_head = r.req.is_head;
        let verdict = http::evaluate(fields, &v, !is_head).for_coding(coding.is_some());
        let status = match &verdict {
            Verdict::Full => 200,
            Verdict::Partial(_) => 206,
            Verdict::NotModified => 304,
            Verdict::PreconditionFailed => return Reply::status(412, b"", cfg),
            Verdict::Unsatisfiable => {
                let line = format!("Content-Range: bytes */{}\r\n", v.len);
                return Reply::status(416, line.as_bytes(), cfg);
            }
        };
        let mut head = start(status);
        self.push_validators(&mut head, &sent);
        if status == 304 {
            end(&mut head, None);
            // Planned (compression, the ETag's strength) as the 200 it stands for.
            let planned_as = Some(self.full_head(&sent, coding, file).into_boxed_slice());
            return Reply {
                planned_as,
                ..self.done(head, Body::Empty)
            };
        }
        push_entity(&mut head, coding);
        let body = match verdict {
            Verdict::Partial(ranges) if ranges.len() > 1 => {
                let len = sent.validators.len;
                multipart(
                    &mut head,
                    Data::File(sent),
                    len,
                    &ranges,
                    file.content_type.as_bytes(),
                )
            }
            Verdict::Partial(ranges) => {
                let (first, last) = ranges[0];
                push_line(&mut head, b"Content-Type: ", file.content_type.as_bytes());
                push_content_range(&mut head, first, last, v.len);
                end(&mut head, Some(last + 1 - first));
                Body::parts(
                    Data::File(sent),
                    vec![Part::Bytes(first, last + 1)],
                    Vec::new(),
                )
            }
            _ => {
                push_line(&mut head, b"Content-Type: ", file.content_type.as_bytes());
                end(&mut head, Some(v.len));
                Body::parts(Data::File(sent), vec![Part::Bytes(0, v.len)], Vec::new())
            }
        };
        self.done(head, body)
    }

    /// The head of the whole of `sent`'s 200 (`file`'s type; `coding`: a sibling's).
    fn full_head(&self, sent: &Opened, coding: Option<Encoding>, file: &Opened) -> Vec<u8> {
        let mut head = start(200);
        self.push_validators(&mut head, sent);
        push_entity(&mut head, coding);
        push_line(&mut head, b"Content-Type: ", file.content_type.as_bytes());
        end(&mut head, Some(sent.validators.len));
        head
    }

    fn done(&self, head: Vec<u8>, body: Body) -> Reply {
        Reply {
            head,
            body,
            sendfile_min_size: self.config.sendfile_min_size,
            cache: None,
            planned_as: None,
        }
    }

    /// `ETag`, `Last-Modified`, and what the route adds to every file: `Cache-Control`,
    /// `Vary: Accept-Encoding` when siblings may be chosen by it.
    fn push_validators(&self, head: &mut Vec<u8>, sent: &Opened) {
        let v = sent.validators;
        head.extend_from_slice(b"ETag: ");
        v.push_etag(head);
        head.extend_from_slice(b"\r\nLast-Modified: ");
        v.push_last_modified(head);
        head.extend_from_slice(b"\r\n");
        if let Some(value) = &self.config.cache_control {
            push_line(head, b"Cache-Control: ", value.as_bytes());
        }
        if !self.config.precompressed.is_empty() {
            head.extend_from_slice(b"Vary: Accept-Encoding\r\n");
        }
    }
}

/// A `multipart/byteranges` body of `ranges` of `data` (`len` bytes long, of type `kind`;
/// RFC 9110 14.6), its type and length in `head`.
pub(crate) fn multipart(
    head: &mut Vec<u8>,
    data: Data,
    len: u64,
    ranges: &[(u64, u64)],
    kind: &[u8],
) -> Body {
    static BOUNDARIES: AtomicU64 = AtomicU64::new(0);
    let n = BOUNDARIES.fetch_add(1, Ordering::Relaxed);
    let boundary = format!("weir{n:020}");
    let (mut text, mut parts) = (Vec::new(), Vec::with_capacity(ranges.len() * 2 + 1));
    let mut total = 0;
    for &(first, last) in ranges {
        let at = text.len();
        text.extend_from_slice(b"\r\n--");
        text.extend_from_slice(boundary.as_bytes());
        text.extend_from_slice(b"\r\n");
        push_line(&mut text, b"Content-Type: ", kind);
        push_content_range(&mut text, first, last, len);
        text.extend_from_slice(b"\r\n");
        parts.push(Part::Text(at, text.len()));
        parts.push(Part::Bytes(first, last + 1));
        total += (text.len() - at) as u64 + last + 1 - first;
    }
    let at = text.len();
    text.extend_from_slice(b"\r\n--");
    text.extend_from_slice(boundary.as_bytes());
    text.extend_from_slice(b"--\r\n");
    parts.push(Part::Text(at, text.len()));
    total += (text.len() - at) as u64;
    let kind = format!("multipart/byteranges; boundary={boundary}");
    push_line(head, b"Content-Type: ", kind.as_bytes());
    end(head, Some(total));
    Body::parts(data, parts, text)
}

/// The status line and `Date`.
pub(crate) fn start(status: u16) -> Vec<u8> {
    let mut head = Vec::with_capacity(320);
    push_status_line(&mut head, status, reason_phrase(status).as_bytes());
    let now = httpdate::fmt_http_date(SystemTime::now());
    push_line(&mut head, b"Date: ", now.as_bytes());
    head
}

/// `Content-Length` (when the status has a body) and the blank line.
pub(crate) fn end(head: &mut Vec<u8>, length: Option<u64>) {
    if let Some(n) = length {
        head.extend_from_slice(b"Content-Length: ");
        push_decimal(head, n);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
}

/// `Accept-Ranges`, and the `Content-Encoding` of a precompressed sibling.
fn push_entity(head: &mut Vec<u8>, coding: Option<Encoding>) {
    head.extend_from_slice(b"Accept-Ranges: bytes\r\n");
    if let Some(coding) = coding {
        push_line(head, b"Content-Encoding: ", coding.token().as_bytes());
    }
}

pub(crate) fn push_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

pub(crate) fn push_content_range(out: &mut Vec<u8>, first: u64, last: u64, len: u64) {
    out.extend_from_slice(b"Content-Range: bytes ");
    push_decimal(out, first);
    out.push(b'-');
    push_decimal(out, last);
    out.push(b'/');
    push_decimal(out, len);
    out.extend_from_slice(b"\r\n");
}
