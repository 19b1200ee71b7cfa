//! Response-head parsing: status, framing and connection options of an upstream response.
//!
//! Framing follows RFC 9112 section 6.3: responses to HEAD, 1xx, 204 and 304 carry no body;
//! chunked wins over nothing; conflicting or malformed lengths make the response invalid
//! (a 502 to the client), never a guess.

use std::mem::MaybeUninit;
use std::ops::Range;

use super::header::{
    apply_connection_tokens, offset_in, parse_content_length, set_line_ends, ConnectionOptions,
    HeaderKind, HeaderSpan,
};
use super::request::BodyFraming;
use crate::error::ProxyError;

/// A parsed response head; ranges index the buffer it was parsed from.
#[derive(Debug, Default, Clone)]
pub struct ResponseHead {
    pub status: u16,
    pub reason: Range<usize>,
    pub minor_version: u8,
    pub headers: Vec<HeaderSpan>,
    pub head_len: usize,
    pub framing: BodyFraming,
    pub connection: ConnectionOptions,
}

impl ResponseHead {
    /// 1xx other than 101: more heads follow before the final one.
    pub fn is_interim(&self) -> bool {
        (100..200).contains(&self.status) && self.status != 101
    }

    /// The upstream connection can carry another request after this response. Not after
    /// an HTTP/1.0 response with `Transfer-Encoding` (chunked): RFC 9112 6.1 makes its
    /// framing faulty, to be read and then closed, whatever `Connection` says.
    pub fn keeps_alive(&self) -> bool {
        let persistent = if self.minor_version == 0 {
            self.connection.keep_alive && self.framing != BodyFraming::Chunked
        } else {
            !self.connection.close
        };
        persistent && self.framing != BodyFraming::UntilClose
    }
}

/// Most fields a response head may have (an upstream's, or a reply Weir writes).
pub const MAX_RESPONSE_HEADERS: usize = 128;

/// Parses a response head at the start of `buf`. `Ok(false)`: incomplete.
pub fn parse_response(
    buf: &[u8],
    max_head: usize,
    request_is_head: bool,
    head: &mut ResponseHead,
) -> Result<bool, ProxyError> {
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_RESPONSE_HEADERS];
    let mut res = httparse::Response::new(&mut []);
    let status = httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut res, buf, &mut slots)
        .map_err(|e| match e {
            httparse::Error::TooManyHeaders => ProxyError::UpstreamHeadTooLarge,
            _ => ProxyError::UpstreamMalformed("malformed response head"),
        })?;
    let head_len = match status {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial if buf.len() >= max_head => {
            return Err(ProxyError::UpstreamHeadTooLarge)
        }
        httparse::Status::Partial => return Ok(false),
    };
    let (Some(code), Some(version)) = (res.code, res.version) else {
        return Err(ProxyError::UpstreamMalformed("malformed status line"));
    };
    if !(100..=999).contains(&code) {
        return Err(ProxyError::UpstreamMalformed("invalid status code"));
    }
    head.status = code;
    head.minor_version = version;
    head.head_len = head_len;
    head.reason = offset_in(buf, res.reason.unwrap_or("").as_bytes());
    head.headers.clear();
    head.headers.extend(res.headers.iter().map(|h| HeaderSpan {
        name: offset_in(buf, h.name.as_bytes()),
        value: offset_in(buf, h.value),
        line_end: 0,
        kind: HeaderKind::of(h.name.as_bytes()),
        connection_listed: false,
    }));
    set_line_ends(buf, head_len, &mut head.headers);
    head.connection = apply_connection_tokens(buf, &mut head.headers);
    head.framing = response_framing(buf, head, request_is_head)?;
    if head.status == 204 || head.is_interim() {
        drop_content_length(head);
    }
    Ok(true)
}

/// Keeps a `Content-Length` out of what is relayed (marked as if `Connection` listed
/// it): RFC 9110 8.6 forbids it in a 1xx or 204, which has no body whatever it says,
/// and HTTP/2 clients reset a stream whose 204 carries one (nginx drops it too).
fn drop_content_length(head: &mut ResponseHead) {
    for h in &mut head.headers {
        h.connection_listed |= h.kind == HeaderKind::ContentLength;
    }
}

fn response_framing(
    buf: &[u8],
    head: &ResponseHead,
    request_is_head: bool,
) -> Result<BodyFraming, ProxyError> {
    let mut length: Option<u64> = None;
    let mut chunked = false;
    for h in &head.headers {
        let value = &buf[h.value.clone()];
        match h.kind {
            HeaderKind::ContentLength => {
                let n = parse_content_length(value)
                    .ok_or(ProxyError::UpstreamMalformed("malformed Content-Length"))?;
                if length.is_some_and(|m| m != n) {
                    return Err(ProxyError::UpstreamMalformed("conflicting Content-Length"));
                }
                length = Some(n);
            }
            HeaderKind::TransferEncoding => {
                let last = super::header::tokens(value).last().unwrap_or(b"");
                if chunked || !last.eq_ignore_ascii_case(b"chunked") || value.contains(&b',') {
                    return Err(ProxyError::UpstreamMalformed(
                        "unsupported Transfer-Encoding",
                    ));
                }
                chunked = true;
            }
            _ => {}
        }
    }
    let no_body = request_is_head
        || (100..200).contains(&head.status)
        || head.status == 204
        || head.status == 304;
    Ok(match (no_body, length, chunked) {
        (true, _, _) => BodyFraming::None,
        (false, Some(_), true) => {
            return Err(ProxyError::UpstreamMalformed(
                "both Content-Length and Transfer-Encoding",
            ))
        }
        (false, _, true) => BodyFraming::Chunked,
        (false, Some(0), false) => BodyFraming::None,
        (false, Some(n), false) => BodyFraming::Length(n),
        (false, None, false) => BodyFraming::UntilClose,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `raw`; when it is valid, also checks that every shorter prefix of the head is
    /// reported incomplete (the parser must not decide on a partial head).
    fn parse(raw: &[u8], is_head: bool) -> Result<ResponseHead, ProxyError> {
        let mut head = ResponseHead::default();
        let complete = parse_response(raw, 64 * 1024, is_head, &mut head)?;
        assert!(complete);
        for cut in 0..head.head_len {
            let mut partial = ResponseHead::default();
            assert_eq!(
                parse_response(&raw[..cut], 64 * 1024, is_head, &mut partial),
                Ok(false),
                "prefix {cut}"
            );
        }
        Ok(head)
    }

    #[test]
    fn content_length_response() {
        let head = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false).unwrap();
        assert_eq!(head.status, 200);
        assert_eq!(head.framing, BodyFraming::Length(5));
        assert!(head.keeps_alive());
    }

    #[test]
    fn head_and_bodiless_statuses_have_no_body() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
        assert_eq!(parse(raw, true).unwrap().framing, BodyFraming::None);
        for status in ["204 No Content", "304 Not Modified", "100 Continue"] {
            let raw = format!("HTTP/1.1 {status}\r\nContent-Length: 5\r\n\r\n");
            assert_eq!(
                parse(raw.as_bytes(), false).unwrap().framing,
                BodyFraming::None
            );
        }
    }

    #[test]
    fn chunked_and_close_delimited() {
        let head = parse(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!(head.framing, BodyFraming::Chunked);
        let head = parse(b"HTTP/1.1 200 OK\r\nServer: x\r\n\r\n", false).unwrap();
        assert_eq!(head.framing, BodyFraming::UntilClose);
        assert!(!head.keeps_alive());
    }

    #[test]
    fn http10_needs_keep_alive_to_persist() {
        let head = parse(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", false).unwrap();
        assert!(!head.keeps_alive());
        let head = parse(
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
            false,
        )
        .unwrap();
        assert!(head.keeps_alive());
        let chunked_10 =
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n";
        let head = parse(chunked_10, false).unwrap();
        assert_eq!(head.framing, BodyFraming::Chunked);
        assert!(
            !head.keeps_alive(),
            "RFC 9112 6.1: faulty framing, closed after"
        );
        let head = parse(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            false,
        )
        .unwrap();
        assert!(!head.keeps_alive());
    }

    #[test]
    fn ambiguous_framing_is_malformed() {
        for raw in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"HTTX/1.1 200 OK\r\n\r\n",
        ] {
            assert!(
                parse(raw, false).is_err(),
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn identical_duplicate_lengths_are_accepted() {
        let head = parse(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!(head.framing, BodyFraming::Length(5));
    }
}
