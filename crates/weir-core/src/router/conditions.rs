//! A route's method, header and query conditions, and the request facts they are checked
//! against. Pure: the request is read in place from its buffer, nothing is allocated.

use weir_config::{MatchValue, RouteMatch};

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

    /// Whether the query has parameter `key` with `value` (`None`: any value), compared as
    /// raw bytes: `a` and `a=` both have the empty value.
    fn has_param(&self, key: &[u8], value: Option<&[u8]>) -> bool {
        self.query().split(|b| *b == b'&').any(|pair| {
            let (k, v) = match pair.iter().position(|b| *b == b'=') {
                Some(eq) => (&pair[..eq], &pair[eq + 1..]),
                None => (pair, &b""[..]),
            };
            k == key && value.is_none_or(|want| v == want)
        })
    }
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

fn bytes(pairs: &[(String, MatchValue)]) -> Vec<Pair> {
    pairs
        .iter()
        .map(|(name, value)| {
            let value = match value {
                MatchValue::Present => None,
                MatchValue::Exact(v) => Some(v.as_bytes().into()),
            };
            (name.as_bytes().into(), value)
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
                headers: bytes(&m.headers),
                query: bytes(&m.query),
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
