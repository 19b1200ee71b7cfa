//! A route's method, header and query conditions, and the request facts they are checked
//! against. Pure: the request is read in place from its buffer, nothing is allocated.
//!
//! Query keys and values are compared form-decoded (`%XX` -> byte, `+` -> space), as
//! backends read them: a condition guarding `?admin=1` must also catch `?%61dmin=1`.

use weir_config::{MatchValue, RouteMatch};

use super::normalize::hex;
use crate::codec::http1::RequestHead;

/// What the conditions read of a request: its head and the buffer it was parsed from.
#[derive(Clone, Copy)]
pub struct RequestView<'a> {
    buf: &'a [u8],
    head: &'a RequestHead,
}

impl<'a> RequestView<'a> {
    pub fn new(buf: &'a [u8], head: &'a RequestHead) -> RequestView<'a> {
        RequestView { buf, head }
    }

    fn method(&self) -> &'a [u8] {
        &self.buf[self.head.method.clone()]
    }

    /// The query string without its `?` (empty when there is none).
    fn query(&self) -> &'a [u8] {
        let target = &self.buf[self.head.path.clone()];
        match target.iter().position(|b| *b == b'?') {
            Some(q) => &target[q + 1..],
            None => b"",
        }
    }

    /// Whether a header named `name` (lower-case) has `value` (`None`: any value).
    fn has_header(&self, name: &[u8], value: Option<&[u8]>) -> bool {
        self.head.headers.iter().any(|h| {
            self.buf[h.name.clone()].eq_ignore_ascii_case(name)
                && value.is_none_or(|v| self.buf[h.value.clone()] == *v)
        })
    }

    /// Whether the query has parameter `key` with `value` (`None`: any value), compared
    /// form-decoded (`form_eq`): `a` and `a=` both have the empty value.
    fn has_param(&self, key: &[u8], value: Option<&[u8]>) -> bool {
        self.query().split(|b| *b == b'&').any(|pair| {
            let (k, v) = match pair.iter().position(|b| *b == b'=') {
                Some(eq) => (&pair[..eq], &pair[eq + 1..]),
                None => (pair, &b""[..]),
            };
            form_eq(k, key) && value.is_none_or(|want| form_eq(v, want))
        })
    }
}

/// Whether `raw` (a query key or value as sent) decodes to `want`: `%XX` is the byte XX,
/// `+` a space. A malformed escape never matches. Decodes as it compares, allocating
/// nothing; without `%` or `+` it is a plain comparison.
#[inline]
fn form_eq(raw: &[u8], want: &[u8]) -> bool {
    if !raw.iter().any(|b| matches!(b, b'%' | b'+')) {
        return raw == want;
    }
    let mut want = want.iter();
    let mut i = 0;
    while i < raw.len() {
        let b = match raw[i] {
            b'%' => match (hex(raw.get(i + 1)), hex(raw.get(i + 2))) {
                (Some(hi), Some(lo)) => {
                    i += 2;
                    hi << 4 | lo
                }
                _ => return false,
            },
            b'+' => b' ',
            b => b,
        };
        i += 1;
        if want.next() != Some(&b) {
            return false;
        }
    }
    want.next().is_none()
}

/// A configured query key or value as the decoded bytes `form_eq` compares with: written
/// decoded (`a b`) or encoded as in a URL (`a+b`, `a%20b`); a `%` not starting a valid
/// escape is taken literally.
fn form_decoded(text: &str) -> Box<[u8]> {
    let raw = text.as_bytes();
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'%' => match (hex(raw.get(i + 1)), hex(raw.get(i + 2))) {
                (Some(hi), Some(lo)) => {
                    out.push(hi << 4 | lo);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    out.into()
}

/// A header or query condition: the name, and the value it must have (`None`: present).
type Pair = (Box<[u8]>, Option<Box<[u8]>>);

/// The conditions of one route, as bytes ready to compare. All must hold.
#[derive(Debug, Clone)]
pub struct Conditions {
    /// Empty: any method.
    methods: Vec<Box<[u8]>>,
    /// Lower-cased names; `None`: present with any value.
    headers: Vec<Pair>,
    query: Vec<Pair>,
}

/// `pairs` as bytes, each name and value passed through `convert`.
fn bytes(pairs: &[(String, MatchValue)], convert: fn(&str) -> Box<[u8]>) -> Vec<Pair> {
    pairs
        .iter()
        .map(|(name, value)| {
            let value = match value {
                MatchValue::Present => None,
                MatchValue::Exact(v) => Some(convert(v)),
            };
            (convert(name), value)
        })
        .collect()
}

impl Conditions {
    /// The conditions of `m`; `None` when it has none (the route is a catch-all at its
    /// place, and matching it costs nothing more than host and path).
    pub fn new(m: &RouteMatch) -> Option<Box<Conditions>> {
        m.has_conditions().then(|| {
            Box::new(Conditions {
                methods: m.methods.iter().map(|s| s.as_bytes().into()).collect(),
                headers: bytes(&m.headers, |s| s.as_bytes().into()),
                query: bytes(&m.query, form_decoded),
            })
        })
    }

    /// Out of line: the routing scan stays as small as it is for routes without conditions.
    #[inline(never)]
    pub fn hold(&self, req: &RequestView<'_>) -> bool {
        let method = req.method();
        (self.methods.is_empty() || self.methods.iter().any(|m| **m == *method))
            && self
                .headers
                .iter()
                .all(|(n, v)| req.has_header(n, v.as_deref()))
            && self
                .query
                .iter()
                .all(|(k, v)| req.has_param(k, v.as_deref()))
    }
}
