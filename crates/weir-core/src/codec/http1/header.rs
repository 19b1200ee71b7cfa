//! Header classification shared by the request and response parsers.
//!
//! Each header is classified once, while the head is parsed, so later stages (framing,
//! hop-by-hop removal, forwarded headers, location rewriting) branch on an enum instead of
//! comparing names again.

use std::ops::Range;

/// The headers the proxy acts on; everything else is `Other` and passes through untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderKind {
    Host,
    ContentLength,
    TransferEncoding,
    Connection,
    KeepAlive,
    ProxyConnection,
    Te,
    Trailer,
    Upgrade,
    Expect,
    XForwardedFor,
    XRealIp,
    XForwardedProto,
    XForwardedHost,
    Location,
    ContentLocation,
    Uri,
    Other,
}

impl HeaderKind {
    /// Classifies a header name, ASCII case-insensitively.
    pub fn of(name: &[u8]) -> HeaderKind {
        const NAMES: &[(&[u8], HeaderKind)] = &[
            (b"host", HeaderKind::Host),
            (b"content-length", HeaderKind::ContentLength),
            (b"transfer-encoding", HeaderKind::TransferEncoding),
            (b"connection", HeaderKind::Connection),
            (b"keep-alive", HeaderKind::KeepAlive),
            (b"proxy-connection", HeaderKind::ProxyConnection),
            (b"te", HeaderKind::Te),
            (b"trailer", HeaderKind::Trailer),
            (b"upgrade", HeaderKind::Upgrade),
            (b"expect", HeaderKind::Expect),
            (b"x-forwarded-for", HeaderKind::XForwardedFor),
            (b"x-real-ip", HeaderKind::XRealIp),
            (b"x-forwarded-proto", HeaderKind::XForwardedProto),
            (b"x-forwarded-host", HeaderKind::XForwardedHost),
            (b"location", HeaderKind::Location),
            (b"content-location", HeaderKind::ContentLocation),
            (b"uri", HeaderKind::Uri),
        ];
        for (known, kind) in NAMES {
            if known.len() == name.len() && known.eq_ignore_ascii_case(name) {
                return *kind;
            }
        }
        HeaderKind::Other
    }

    /// Hop-by-hop headers (RFC 9110 7.6.1) never cross the proxy as they are.
    pub fn is_hop_by_hop(self) -> bool {
        matches!(
            self,
            HeaderKind::Connection
                | HeaderKind::KeepAlive
                | HeaderKind::ProxyConnection
                | HeaderKind::Te
                | HeaderKind::Trailer
                | HeaderKind::Upgrade
                | HeaderKind::TransferEncoding
        )
    }
}

/// One header of a parsed head, as byte ranges into the buffer the head was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderSpan {
    pub name: Range<usize>,
    pub value: Range<usize>,
    pub kind: HeaderKind,
    /// Named by a `Connection` header: removed like a hop-by-hop header.
    pub connection_listed: bool,
}

/// What the `Connection` header(s) of a message said.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionOptions {
    pub close: bool,
    pub keep_alive: bool,
    pub upgrade: bool,
}

/// Offset of `part` inside `buf`. httparse returns sub-slices of the buffer, except for
/// empty values, which may be a static `""` elsewhere: those become an empty range, and so
/// does anything else that is not inside `buf`.
pub(crate) fn offset_in(buf: &[u8], part: &[u8]) -> Range<usize> {
    let start = (part.as_ptr() as usize).wrapping_sub(buf.as_ptr() as usize);
    match start.checked_add(part.len()) {
        Some(end) if !part.is_empty() && end <= buf.len() => start..end,
        _ => 0..0,
    }
}

/// Iterates the comma-separated, trimmed, non-empty tokens of a header value.
pub fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(trim)
        .filter(|t| !t.is_empty())
}

/// Trims optional whitespace (SP / HTAB) on both sides.
pub fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// Reads the `Connection` tokens of all headers and marks the headers they name
/// (any number of them: a header hidden behind many tokens must still be removed).
pub(crate) fn apply_connection_tokens(buf: &[u8], headers: &mut [HeaderSpan]) -> ConnectionOptions {
    let mut opts = ConnectionOptions::default();
    let mut names_headers = false;
    for h in headers.iter().filter(|h| h.kind == HeaderKind::Connection) {
        for token in tokens(&buf[h.value.clone()]) {
            if token.eq_ignore_ascii_case(b"close") {
                opts.close = true;
            } else if token.eq_ignore_ascii_case(b"keep-alive") {
                opts.keep_alive = true;
            } else if token.eq_ignore_ascii_case(b"upgrade") {
                opts.upgrade = true;
            } else {
                names_headers = true;
            }
        }
    }
    if names_headers {
        mark_connection_listed(buf, headers);
    }
    opts
}

/// Marks every end-to-end header whose name a `Connection` header lists. Rare, so the
/// nested scan (no allocation) is fine.
fn mark_connection_listed(buf: &[u8], headers: &mut [HeaderSpan]) {
    for i in 0..headers.len() {
        if headers[i].kind != HeaderKind::Other {
            continue;
        }
        let name = &buf[headers[i].name.clone()];
        let listed = headers
            .iter()
            .filter(|h| h.kind == HeaderKind::Connection)
            .any(|h| tokens(&buf[h.value.clone()]).any(|t| t.eq_ignore_ascii_case(name)));
        headers[i].connection_listed = listed;
    }
}

/// Parses a Content-Length value strictly: ASCII digits only, no sign, no list, no overflow.
pub fn parse_content_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 19 {
        return None;
    }
    let mut n: u64 = 0;
    for &b in value {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_case_insensitively() {
        assert_eq!(HeaderKind::of(b"Content-LENGTH"), HeaderKind::ContentLength);
        assert_eq!(HeaderKind::of(b"x-real-ip"), HeaderKind::XRealIp);
        assert_eq!(HeaderKind::of(b"X-Custom"), HeaderKind::Other);
        assert_eq!(HeaderKind::of(b""), HeaderKind::Other);
    }

    #[test]
    fn content_length_is_strict() {
        assert_eq!(parse_content_length(b"0"), Some(0));
        assert_eq!(parse_content_length(b"615"), Some(615));
        assert_eq!(parse_content_length(b"+5"), None);
        assert_eq!(parse_content_length(b"5,5"), None);
        assert_eq!(parse_content_length(b" 5"), None);
        assert_eq!(parse_content_length(b""), None);
        assert_eq!(parse_content_length(b"99999999999999999999"), None);
        assert_eq!(parse_content_length(b"18446744073709551616"), None);
    }

    #[test]
    fn tokens_trim_and_skip_empty() {
        let t: Vec<&[u8]> = tokens(b" close ,, Upgrade\t").collect();
        assert_eq!(t, vec![&b"close"[..], &b"Upgrade"[..]]);
    }
}
