//! Wire codecs: HTTP/1.1, the PROXY protocol header of L4 and HTTP connections, and the
//! TLS ClientHello's server name (SNI routing on TCP listeners).

pub mod http1;
pub mod proxy_protocol;
pub mod tls_client_hello;

use http1::HeaderSpan;

/// The fields of a response head, whatever protocol it came in: an HTTP/1.1 head's lines
/// (parsed from `buf`), or an HTTP/2 field map.
#[derive(Clone, Copy)]
pub enum Fields<'a> {
    Http1 {
        buf: &'a [u8],
        headers: &'a [HeaderSpan],
    },
    Http2(&'a http::HeaderMap),
}

impl<'a> Fields<'a> {
    /// Calls `f` with each field's name and value, in order.
    pub fn each(&self, mut f: impl FnMut(&'a [u8], &'a [u8])) {
        match *self {
            Fields::Http1 { buf, headers } => {
                for h in headers {
                    f(&buf[h.name.clone()], &buf[h.value.clone()]);
                }
            }
            Fields::Http2(map) => {
                for (name, value) in map {
                    f(name.as_str().as_bytes(), value.as_bytes());
                }
            }
        }
    }

    /// The first value of the field `name` (any case).
    pub fn get(&self, name: &[u8]) -> Option<&'a [u8]> {
        let mut found = None;
        self.each(|n, v| {
            if found.is_none() && n.eq_ignore_ascii_case(name) {
                found = Some(v);
            }
        });
        found
    }
}
