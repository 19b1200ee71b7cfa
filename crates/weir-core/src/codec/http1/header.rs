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
    /// `HTTP2-Settings`: only meaningful with `Upgrade: h2c`, which is never forwarded.
    Http2Settings,
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
    /// Classifies a header name (a token: httparse has checked it), ASCII case-insensitively.
    /// Every header of every head goes through here, so the length and the first letter
    /// pick the one known name it can be (or none), and that comparison is specialised to
    /// the name's length.
    pub fn of(name: &[u8]) -> HeaderKind {
        use HeaderKind::*;
        let Some(&first) = name.first() else {
            return Other;
        };
        // Bit 5 lower-cases a letter; a non-letter that lands on one fails the comparison.
        let is = |known: &[u8]| token_eq_lower(name, known);
        match (name.len(), first | 0x20) {
            (2, b't') if is(b"te") => Te,
            (3, b'u') if is(b"uri") => Uri,
            (4, b'h') if is(b"host") => Host,
            (6, b'e') if is(b"expect") => Expect,
            (7, b't') if is(b"trailer") => Trailer,
            (7, b'u') if is(b"upgrade") => Upgrade,
            (8, b'l') if is(b"location") => Location,
            (9, b'x') if is(b"x-real-ip") => XRealIp,
            (10, b'c') if is(b"connection") => Connection,
            (10, b'k') if is(b"keep-alive") => KeepAlive,
            (14, b'c') if is(b"content-length") => ContentLength,
            (14, b'h') if is(b"http2-settings") => Http2Settings,
            (15, b'x') if is(b"x-forwarded-for") => XForwardedFor,
            (16, b'p') if is(b"proxy-connection") => ProxyConnection,
            (16, b'x') if is(b"x-forwarded-host") => XForwardedHost,
            (16, b'c') if is(b"content-location") => ContentLocation,
            (17, b't') if is(b"transfer-encoding") => TransferEncoding,
            (17, b'x') if is(b"x-forwarded-proto") => XForwardedProto,
            _ => Other,
        }
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
                | HeaderKind::Http2Settings
                | HeaderKind::TransferEncoding
        )
    }
}

/// `tchar` (RFC 9110 5.6.2), per byte value: the token rule, in one table for every check
/// Weir makes itself. httparse applies exactly this rule to HTTP/1.1 field names and
/// methods; the HTTP/2 fields Weir writes into HTTP/1.1 heads (an HTTP/2 client's request,
/// an HTTP/2 upstream's response) must meet it too, and the `http` crate's HTTP/2 name
/// check (`HeaderName::from_lowercase`, which the `h2` crate decodes with) also takes `"`.
const TCHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    table
};

/// Whether `bytes` is a token (RFC 9110 5.6.2): one or more `tchar`s.
#[inline]
pub fn is_token(bytes: &[u8]) -> bool {
    !bytes.is_empty() && bytes.iter().all(|&b| TCHAR[usize::from(b)])
}

/// Whether `token` (a header name or a piece of a header value, as httparse has checked
/// them) equals `lower` (lower-case letters and `-`) ignoring ASCII case. Setting bit 5
/// lower-cases a letter and maps no other byte allowed there (`tchar`, VCHAR, SP, HTAB,
/// obs-text; never CR or LF) onto a lower-case letter or `-`, so one OR per word replaces a
/// per-byte case fold. The words are fixed-size loads that overlap to
/// cover any length, so there is neither a byte loop nor a variable-length copy.
#[inline]
pub(crate) fn token_eq_lower(token: &[u8], lower: &[u8]) -> bool {
    let n = token.len();
    if n != lower.len() {
        return false;
    }
    match n {
        0..=1 => token.eq_ignore_ascii_case(lower),
        2..=3 => folded_eq::<2>(token, lower, 0) && folded_eq::<2>(token, lower, n - 2),
        4..=7 => folded_eq::<4>(token, lower, 0) && folded_eq::<4>(token, lower, n - 4),
        _ => {
            (0..n - 8)
                .step_by(8)
                .all(|at| folded_eq::<8>(token, lower, at))
                && folded_eq::<8>(token, lower, n - 8)
        }
    }
}

/// `token[at..at + N]`, with bit 5 set in every byte, equals `lower[at..at + N]`.
#[inline]
fn folded_eq<const N: usize>(token: &[u8], lower: &[u8], at: usize) -> bool {
    let word = |s: &[u8]| {
        let bytes = s.get(at..at + N)?;
        let mut w = [0u8; 8];
        w[..N].copy_from_slice(bytes);
        Some(u64::from_le_bytes(w))
    };
    let bit5 = 0x2020_2020_2020_2020 & (u64::MAX >> (64 - 8 * N));
    matches!((word(token), word(lower)), (Some(t), Some(l)) if t | bit5 == l)
}

/// One header of a parsed head, as byte ranges into the buffer the head was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderSpan {
    pub name: Range<usize>,
    pub value: Range<usize>,
    /// Where the header's line ends (after its line terminator): `name.start..line_end`
    /// is the line as it arrived.
    pub line_end: usize,
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

/// Sets each header's `line_end`: the next header's start, and for the last one the start of
/// the empty line that ends the head (`head_len` bytes long, ending in CRLF or a bare LF).
pub(crate) fn set_line_ends(buf: &[u8], head_len: usize, headers: &mut [HeaderSpan]) {
    let empty_line = if buf[..head_len].ends_with(b"\r\n") {
        2
    } else {
        1
    };
    let mut next = head_len - empty_line;
    for h in headers.iter_mut().rev() {
        h.line_end = next;
        next = h.name.start;
    }
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
#[inline]
pub(crate) fn apply_connection_tokens(buf: &[u8], headers: &mut [HeaderSpan]) -> ConnectionOptions {
    let mut opts = ConnectionOptions::default();
    let mut names_headers = false;
    for h in headers.iter().filter(|h| h.kind == HeaderKind::Connection) {
        let value = &buf[h.value.clone()];
        // Most values are exactly one option (`keep-alive`, `close`): no list to split.
        if !connection_option(value, &mut opts) {
            names_headers |= connection_list(value, &mut opts);
        }
    }
    if names_headers {
        mark_connection_listed(buf, headers);
    }
    opts
}

/// Records the options of a `Connection` list in `opts`; true when it also names a
/// header.
#[inline(never)]
fn connection_list(value: &[u8], opts: &mut ConnectionOptions) -> bool {
    let mut names_headers = false;
    for token in tokens(value) {
        names_headers |= !connection_option(token, opts);
    }
    names_headers
}

/// Records `token` in `opts` when it is `close`, `upgrade` or `keep-alive`; false when it
/// is anything else (a header name). An empty token is nothing.
fn connection_option(token: &[u8], opts: &mut ConnectionOptions) -> bool {
    let option = match token.len() {
        0 => return true,
        5 if token_eq_lower(token, b"close") => &mut opts.close,
        7 if token_eq_lower(token, b"upgrade") => &mut opts.upgrade,
        10 if token_eq_lower(token, b"keep-alive") => &mut opts.keep_alive,
        _ => return false,
    };
    *option = true;
    true
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

/// The value of the first field named `name` (any case) among `headers`, spans of `buf`.
pub fn field<'a>(headers: &[HeaderSpan], buf: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|h| buf[h.name.clone()].eq_ignore_ascii_case(name))
        .map(|h| &buf[h.value.clone()])
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
    fn classifies_every_known_name_in_any_case() {
        use HeaderKind::*;
        let known = [
            ("Host", Host),
            ("Content-Length", ContentLength),
            ("Transfer-Encoding", TransferEncoding),
            ("Connection", Connection),
            ("Keep-Alive", KeepAlive),
            ("Proxy-Connection", ProxyConnection),
            ("TE", Te),
            ("Trailer", Trailer),
            ("Upgrade", Upgrade),
            ("HTTP2-Settings", Http2Settings),
            ("Expect", Expect),
            ("X-Forwarded-For", XForwardedFor),
            ("X-Real-IP", XRealIp),
            ("X-Forwarded-Proto", XForwardedProto),
            ("X-Forwarded-Host", XForwardedHost),
            ("Location", Location),
            ("Content-Location", ContentLocation),
            ("URI", Uri),
        ];
        for (name, kind) in known {
            assert_eq!(HeaderKind::of(name.as_bytes()), kind, "{name}");
            assert_eq!(HeaderKind::of(name.to_lowercase().as_bytes()), kind);
            assert_eq!(HeaderKind::of(name.to_uppercase().as_bytes()), kind);
            // Same length, one byte different: not the header.
            let mut other = name.as_bytes().to_vec();
            other[0] = b'z';
            assert_eq!(HeaderKind::of(&other), Other, "{name}");
        }
    }

    #[test]
    fn classifies_case_insensitively() {
        assert_eq!(HeaderKind::of(b"Content-LENGTH"), HeaderKind::ContentLength);
        assert_eq!(HeaderKind::of(b"x-real-ip"), HeaderKind::XRealIp);
        assert_eq!(HeaderKind::of(b"X-Custom"), HeaderKind::Other);
        // Other token characters do not fold onto letters or '-'.
        assert_eq!(HeaderKind::of(b"x_real_ip"), HeaderKind::Other);
        assert_eq!(HeaderKind::of(b"^e"), HeaderKind::Other);
        assert_eq!(HeaderKind::of(b"keep.alive"), HeaderKind::Other);
        assert_eq!(HeaderKind::of(b""), HeaderKind::Other);
    }

    /// Every byte value, alone and inside a name: `is_token` is RFC 9110's `tchar` (spelled
    /// out here apart from the table), the rule httparse applies to an HTTP/1.1 field name,
    /// and stricter than the `http` crate's HTTP/2 names only in `"`.
    #[test]
    fn is_token_is_the_tchar_rule_for_every_byte() {
        const SPECIALS: &[u8] = b"!#$%&'*+-.^_`|~";
        for b in 0..=255u8 {
            let tchar = b.is_ascii_digit() || b.is_ascii_alphabetic() || SPECIALS.contains(&b);
            assert_eq!(is_token(&[b]), tchar, "byte {b:#04x}");
            let name = [b'x', b, b'y'];
            assert_eq!(is_token(&name), tchar, "byte {b:#04x} inside a name");
            let mut head = b"GET / HTTP/1.1\r\n".to_vec();
            head.extend_from_slice(&name);
            head.extend_from_slice(b": 1\r\n\r\n");
            let mut fields = [httparse::EMPTY_HEADER; 2];
            let mut req = httparse::Request::new(&mut fields);
            let parsed = matches!(req.parse(&head), Ok(httparse::Status::Complete(_)))
                && req.headers.first().map(|h| h.name.as_bytes()) == Some(&name[..]);
            assert_eq!(parsed, tchar, "httparse, byte {b:#04x}");
            let lower = [b'x', b.to_ascii_lowercase(), b'y'];
            let h2 = http::HeaderName::from_lowercase(&lower).is_ok();
            assert_eq!(h2, tchar || b == b'"', "from_lowercase, byte {b:#04x}");
        }
        assert!(!is_token(b""));
        assert!(!is_token(b"\""));
        assert!(!is_token(b"x\"y"));
        assert!(is_token(b"X-Forwarded-For"));
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
