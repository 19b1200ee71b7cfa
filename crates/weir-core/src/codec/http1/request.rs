//! Request-head parsing with strict RFC 9112 framing.
//!
//! `httparse` does the tokenising; this module adds what a proxy must decide before it
//! forwards anything: the body framing (refusing every ambiguous combination), the target
//! form, the host, and the connection options. A request whose framing is ambiguous never
//! leaves this module as `Ok`.

use std::mem::MaybeUninit;
use std::ops::Range;

use super::header::{
    apply_connection_tokens, offset_in, parse_content_length, set_line_ends, trim,
    ConnectionOptions, HeaderKind, HeaderSpan,
};
use crate::error::ProxyError;

/// How the body of a message is delimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BodyFraming {
    #[default]
    None,
    Length(u64),
    Chunked,
    /// Responses only: the body ends when the upstream closes.
    UntilClose,
}

impl BodyFraming {
    /// The body's length when the head states it.
    pub fn length(self) -> Option<u64> {
        match self {
            BodyFraming::Length(n) => Some(n),
            _ => None,
        }
    }
}

/// Limits applied while parsing a request head.
#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    pub max_header_size: usize,
    pub max_headers: usize,
}

impl HeadLimits {
    /// A listener's: the same for a request head whatever protocol brought it.
    pub fn of(listener: &weir_config::Listener) -> HeadLimits {
        HeadLimits {
            max_header_size: listener.max_header_size,
            max_headers: listener.max_headers,
        }
    }
}

/// A parsed request head; ranges index the buffer it was parsed from.
#[derive(Debug, Default, Clone)]
pub struct RequestHead {
    pub method: Range<usize>,
    /// Origin-form path and query (`/a?b`), or `*`.
    pub path: Range<usize>,
    /// The authority of an absolute-form target, which overrides `Host`.
    pub target_authority: Option<Range<usize>>,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    pub headers: Vec<HeaderSpan>,
    /// Length of the head including the final CRLF; the body starts here.
    pub head_len: usize,
    pub framing: BodyFraming,
    /// Host header value, or the absolute-form authority.
    pub host: Option<Range<usize>>,
    pub connection: ConnectionOptions,
    pub expect_continue: bool,
    /// `Connection: upgrade` with an `Upgrade` header.
    pub upgrade: bool,
    pub idempotent: bool,
    pub is_head: bool,
}

const STACK_HEADERS: usize = 128;

/// Parses a request head from the start of `buf` into `head` (reusing its allocations).
///
/// `Ok(false)`: incomplete, read more. `Ok(true)`: `head` is filled. `Err`: the status to answer.
pub fn parse_request(
    buf: &[u8],
    limits: HeadLimits,
    head: &mut RequestHead,
) -> Result<bool, ProxyError> {
    let max = limits.max_headers;
    let mut stack = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; STACK_HEADERS];
    let mut heap = Vec::new();
    let slots: &mut [MaybeUninit<httparse::Header<'_>>] = if max <= STACK_HEADERS {
        &mut stack[..max]
    } else {
        heap.resize_with(max, MaybeUninit::uninit);
        &mut heap[..]
    };
    let mut req = httparse::Request::new(&mut []);
    let status = match req.parse_with_uninit_headers(buf, slots) {
        Ok(s) => s,
        Err(httparse::Error::TooManyHeaders) => return Err(ProxyError::HeadTooLarge),
        Err(httparse::Error::Version) => return Err(version_error(buf)),
        Err(e) => return Err(ProxyError::BadRequest(parse_error_reason(e))),
    };
    let head_len = match status {
        httparse::Status::Complete(n) if n <= limits.max_header_size => n,
        httparse::Status::Complete(_) => return Err(ProxyError::HeadTooLarge),
        httparse::Status::Partial if buf.len() >= limits.max_header_size => {
            return Err(ProxyError::HeadTooLarge)
        }
        httparse::Status::Partial => return Ok(false),
    };
    fill_head(buf, &req, head_len, head)?;
    Ok(true)
}

/// httparse reports any bad third token as a version error: only a well-formed
/// `HTTP/d.d` that is not 1.0 / 1.1 is "version not supported"; the rest (a space inside the
/// target, garbage) is a bad request.
fn version_error(buf: &[u8]) -> ProxyError {
    let line_end = buf.iter().position(|b| *b == b'\n');
    let line = &buf[..line_end.unwrap_or(buf.len())];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut parts = line.split(|b| *b == b' ');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(_), Some(_), Some(v), None) if looks_like_version(v, line_end.is_none()) => {
            ProxyError::VersionNotSupported
        }
        _ => ProxyError::BadRequest("malformed request line"),
    }
}

/// `HTTP/d.d`; while the line is still arriving, a prefix of that shape also counts.
fn looks_like_version(v: &[u8], partial: bool) -> bool {
    const SHAPE: &[u8] = b"HTTP/0.0";
    let fits = |(i, b): (usize, &u8)| match SHAPE[i] {
        b'0' => b.is_ascii_digit(),
        c => c == *b,
    };
    v.len() <= SHAPE.len() && (partial || v.len() == SHAPE.len()) && v.iter().enumerate().all(fits)
}

fn parse_error_reason(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "invalid header name (whitespace before ':' or obs-fold?)",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine | httparse::Error::Status => "malformed request line",
        httparse::Error::Token => "invalid method",
        _ => "malformed request",
    }
}

fn fill_head(
    buf: &[u8],
    req: &httparse::Request<'_, '_>,
    head_len: usize,
    head: &mut RequestHead,
) -> Result<(), ProxyError> {
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(ProxyError::BadRequest("malformed request line"));
    };
    head.minor_version = version;
    head.head_len = head_len;
    head.headers.clear();
    head.headers.extend(req.headers.iter().map(|h| HeaderSpan {
        name: offset_in(buf, h.name.as_bytes()),
        value: offset_in(buf, h.value),
        line_end: 0,
        kind: HeaderKind::of(h.name.as_bytes()),
        connection_listed: false,
    }));
    set_line_ends(buf, head_len, &mut head.headers);
    let method = offset_in(buf, method.as_bytes());
    check_head(buf, method, offset_in(buf, target.as_bytes()), head)
}

/// Fills `head` from an HTTP/1.1 head Weir wrote itself (an HTTP/2 request's), without
/// tokenising it again: `buf` holds exactly the head, `method` and `target` index its
/// request line, and `head.headers` already lists every field line as the writer
/// recorded it (values trimmed as httparse trims them, `line_end` after each CRLF). The
/// writer owns what httparse would have checked of the bytes (token characters, field
/// values, CRLFs); every check after that is the one `parse_request` runs: the head's
/// size against `max_header_size` and its field count against `max_headers` (431, as an
/// HTTP/1.1 client's head over them gets: the same bound protects the upstream whatever
/// the client spoke), the method, the target form, framing, Host, Expect and Connection.
pub fn fill_written(
    buf: &[u8],
    method: Range<usize>,
    target: Range<usize>,
    limits: HeadLimits,
    head: &mut RequestHead,
) -> Result<(), ProxyError> {
    if buf.len() > limits.max_header_size || head.headers.len() > limits.max_headers {
        return Err(ProxyError::HeadTooLarge);
    }
    if !buf[target.clone()].iter().all(|&b| uri_byte(b)) {
        return Err(ProxyError::BadRequest("malformed request line"));
    }
    head.minor_version = 1;
    head.head_len = buf.len();
    check_head(buf, method, target, head)
}

/// What httparse accepts in a request-target: visible ASCII and obs-text.
fn uri_byte(b: u8) -> bool {
    matches!(b, b'!'..=0x7e | 0x80..=0xff)
}

/// The checks after tokenising: method, target form, connection options, framing, Host.
fn check_head(
    buf: &[u8],
    method: Range<usize>,
    target: Range<usize>,
    head: &mut RequestHead,
) -> Result<(), ProxyError> {
    let name = &buf[method.clone()];
    head.method = method;
    head.is_head = name == b"HEAD";
    head.idempotent = matches!(
        name,
        b"GET" | b"HEAD" | b"OPTIONS" | b"TRACE" | b"PUT" | b"DELETE"
    );
    if name == b"CONNECT" {
        return Err(ProxyError::MethodNotAllowed);
    }
    parse_target(buf, name, &buf[target], head)?;
    head.connection = apply_connection_tokens(buf, &mut head.headers);
    scan_headers(buf, head)
}

/// Accepts origin-form (`/p`), absolute-form (`http://h/p`) and `*` for OPTIONS.
fn parse_target(
    buf: &[u8],
    method: &[u8],
    target: &[u8],
    head: &mut RequestHead,
) -> Result<(), ProxyError> {
    head.target_authority = None;
    // No request-target form has a fragment (RFC 9112 3.2), and httparse lets `#` through.
    // Refused outright: the normaliser ends the path only at `?`, so `/public/..#/admin`
    // would match `/public/` and reach a backend that drops the fragment, then resolves `..`.
    if target.contains(&b'#') {
        return Err(ProxyError::BadRequest("fragment in request-target"));
    }
    if target.first() == Some(&b'/') {
        head.path = offset_in(buf, target);
        return Ok(());
    }
    if target == b"*" && method == b"OPTIONS" {
        head.path = offset_in(buf, target);
        return Ok(());
    }
    let rest = strip_scheme(target).ok_or(ProxyError::BadRequest("invalid request-target"))?;
    let split = rest
        .iter()
        .position(|b| matches!(b, b'/' | b'?'))
        .unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    if authority.is_empty() || authority.contains(&b'@') {
        return Err(ProxyError::BadRequest("invalid request-target authority"));
    }
    head.target_authority = Some(offset_in(buf, authority));
    // An empty path in absolute form means "/": represented by an empty range, see `path_or_root`.
    head.path = offset_in(buf, path);
    if path.first() == Some(&b'?') {
        return Err(ProxyError::BadRequest("invalid request-target"));
    }
    Ok(())
}

fn strip_scheme(target: &[u8]) -> Option<&[u8]> {
    for scheme in [&b"http://"[..], &b"https://"[..]] {
        if target.len() > scheme.len() && target[..scheme.len()].eq_ignore_ascii_case(scheme) {
            return Some(&target[scheme.len()..]);
        }
    }
    None
}

/// Decides framing, host, expect and upgrade from the classified headers.
fn scan_headers(buf: &[u8], head: &mut RequestHead) -> Result<(), ProxyError> {
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut host: Option<Range<usize>> = None;
    let mut has_upgrade = false;
    head.expect_continue = false;
    for h in &head.headers {
        let value = &buf[h.value.clone()];
        match h.kind {
            HeaderKind::ContentLength => {
                if length.is_some() {
                    return Err(ProxyError::BadRequest("duplicate Content-Length"));
                }
                let n = parse_content_length(value)
                    .ok_or(ProxyError::BadRequest("malformed Content-Length"))?;
                length = Some(n);
            }
            HeaderKind::TransferEncoding => {
                if chunked {
                    return Err(ProxyError::BadRequest("duplicate Transfer-Encoding"));
                }
                if !trim(value).eq_ignore_ascii_case(b"chunked") {
                    return Err(ProxyError::NotImplemented(
                        "only Transfer-Encoding: chunked is supported",
                    ));
                }
                chunked = true;
            }
            HeaderKind::Host => {
                if host.is_some() {
                    return Err(ProxyError::BadRequest("duplicate Host"));
                }
                host = Some(h.value.clone());
            }
            HeaderKind::Expect => {
                if trim(value).eq_ignore_ascii_case(b"100-continue") {
                    head.expect_continue = true;
                } else {
                    return Err(ProxyError::ExpectationFailed);
                }
            }
            HeaderKind::Upgrade => has_upgrade = true,
            _ => {}
        }
    }
    head.framing = match (length, chunked) {
        (Some(_), true) => {
            return Err(ProxyError::BadRequest(
                "both Content-Length and Transfer-Encoding",
            ))
        }
        (_, true) if head.minor_version == 0 => {
            return Err(ProxyError::BadRequest(
                "Transfer-Encoding in an HTTP/1.0 request",
            ))
        }
        (_, true) => BodyFraming::Chunked,
        (Some(0) | None, false) => BodyFraming::None,
        (Some(n), false) => BodyFraming::Length(n),
    };
    if head.minor_version == 1 && host.is_none() {
        return Err(ProxyError::BadRequest("missing Host header"));
    }
    head.host = head.target_authority.clone().or(host);
    if let Some(h) = &head.host {
        validate_host(&buf[h.clone()])?;
    }
    head.upgrade = has_upgrade && head.connection.upgrade;
    Ok(())
}

/// The bytes a host name may have, per byte value (one lookup per byte: every request's
/// host is checked).
const NAME_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'_');
        b += 1;
    }
    table
};

/// A host is `name[:port]` or `[IPv6][:port]`, with no whitespace or delimiters, no
/// empty label (`a..b`, as nginx refuses it: one trailing dot is dropped for routing,
/// `RequestHead::host_name`, so `secret.example..` would miss `secret.example`'s routes),
/// and a port of digits only: Weir routes on what is before the port, and a backend that
/// cuts at the first colon (nginx, Express) must read the same host, so
/// `secret.example:80:80`, `secret.example:abc` and `[secret.example]` are refused.
fn validate_host(host: &[u8]) -> Result<(), ProxyError> {
    let ok = match host.first() {
        Some(b'[') => valid_ip_literal(host),
        Some(_) => valid_name_and_port(host),
        None => false,
    };
    if ok {
        Ok(())
    } else {
        Err(ProxyError::BadRequest("invalid Host header"))
    }
}

/// `name[:port]`, in one pass: name bytes without an empty label up to the first `:`,
/// then the port.
#[inline]
fn valid_name_and_port(host: &[u8]) -> bool {
    let mut after_dot = false;
    for (i, &b) in host.iter().enumerate() {
        if b == b':' {
            return i > 0 && valid_port(&host[i + 1..]);
        }
        let empty_label = after_dot && b == b'.';
        after_dot = b == b'.';
        if !NAME_BYTE[usize::from(b)] || empty_label {
            return false;
        }
    }
    true
}

/// `[IPv6]` and an optional `:port`: the brackets hold an IPv6 address, nothing else (an
/// IPvFuture or a zone is no host Weir routes). Rare: parsed with the standard library.
#[cold]
fn valid_ip_literal(host: &[u8]) -> bool {
    let Some(end) = host.iter().position(|b| *b == b']') else {
        return false;
    };
    let inside = std::str::from_utf8(&host[1..end]).ok();
    let is_v6 = inside.is_some_and(|s| s.parse::<std::net::Ipv6Addr>().is_ok());
    is_v6
        && match &host[end + 1..] {
            [] => true,
            [b':', port @ ..] => valid_port(port),
            _ => false,
        }
}

/// A port after the `:`: empty (RFC 3986 `port = *DIGIT`, the scheme's default), or 1 to
/// 65535 in at most 5 digits.
#[inline]
fn valid_port(port: &[u8]) -> bool {
    if port.is_empty() {
        return true;
    }
    let digits =
        |n: Option<u32>, b: &u8| Some(n? * 10 + u32::from(*b).checked_sub(48).filter(|d| *d < 10)?);
    port.len() <= 5
        && port
            .iter()
            .fold(Some(0), digits)
            .is_some_and(|n| (1..=65535).contains(&n))
}

impl RequestHead {
    /// The origin-form path; an absolute-form target with no path means `/` (RFC 9112 3.2.2).
    pub fn path<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        if self.path.is_empty() {
            b"/"
        } else {
            &buf[self.path.clone()]
        }
    }

    /// The host name without port, for routing (not lower-cased). A trailing dot goes too:
    /// `example.com.` names the same host as `example.com` (and is routed like it, as nginx
    /// does), so it must not slip past the routes written for that name.
    pub fn host_name<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        let Some(range) = &self.host else { return b"" };
        let host = strip_port(&buf[range.clone()]);
        host.strip_suffix(b".").unwrap_or(host)
    }
}

/// Removes a trailing `:port` (keeping IPv6 brackets intact).
pub fn strip_port(host: &[u8]) -> &[u8] {
    if host.first() == Some(&b'[') {
        return match host.iter().position(|b| *b == b']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    match host.iter().rposition(|b| *b == b':') {
        Some(colon) => &host[..colon],
        None => host,
    }
}

#[cfg(test)]
mod tests;
