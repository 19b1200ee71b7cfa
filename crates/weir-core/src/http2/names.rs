//! Header names for the h2 response head, and for the fields Weir adds to an h2
//! upstream request, without `HeaderName::from_bytes` for the common ones.
//! `from_bytes` lower-cases the name into a scratch array, then searches the
//! standard names: about a hundred instructions per field, every field of every
//! response. The names most responses carry are matched here (any case, as HTTP/1.1
//! sends them) to the same standard `HeaderName`s; any other name takes `from_bytes`.

use http::header::{self, HeaderName, InvalidHeaderName};

use crate::codec::http1::header::token_eq_lower;

/// The `HeaderName` for a name as the upstream wrote it.
pub fn response_name(raw: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
    // Arms, not a table: a table of `HeaderName`s would be built and dropped per call.
    // The spellings servers send (`Content-Type`, `content-type`) are compared whole
    // first, a few word compares; any other case takes the byte-by-byte fold. (Not
    // `token_eq_lower`: trailer names reach here unchecked, and its fold would take a
    // CR for a `-`.)
    let is = |lower: &[u8], title: &[u8]| {
        raw == title || raw == lower || raw.eq_ignore_ascii_case(lower)
    };
    Ok(match raw.len() {
        4 if is(b"date", b"Date") => header::DATE,
        4 if is(b"etag", b"ETag") => header::ETAG,
        4 if is(b"vary", b"Vary") => header::VARY,
        6 if is(b"server", b"Server") => header::SERVER,
        7 if is(b"expires", b"Expires") => header::EXPIRES,
        10 if is(b"set-cookie", b"Set-Cookie") => header::SET_COOKIE,
        12 if is(b"content-type", b"Content-Type") => header::CONTENT_TYPE,
        13 if is(b"cache-control", b"Cache-Control") => header::CACHE_CONTROL,
        13 if is(b"last-modified", b"Last-Modified") => header::LAST_MODIFIED,
        13 if is(b"accept-ranges", b"Accept-Ranges") => header::ACCEPT_RANGES,
        14 if is(b"content-length", b"Content-Length") => header::CONTENT_LENGTH,
        16 if is(b"content-encoding", b"Content-Encoding") => header::CONTENT_ENCODING,
        _ => return HeaderName::from_bytes(raw),
    })
}

/// The `HeaderName` for a field Weir adds to an upstream request (`upstream_request`):
/// the request id and the forwarded headers by default, as static names (`from_bytes`
/// allocates a name that is not a standard one); any other name takes `from_bytes`.
pub fn added_name(raw: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
    // Built at compile time: `from_static` checks its name each time it runs.
    const fn named(name: &'static str) -> (&'static str, HeaderName) {
        (name, HeaderName::from_static(name))
    }
    const ADDED: [(&str, HeaderName); 5] = [
        named("x-request-id"),
        named("x-real-ip"),
        named("x-forwarded-for"),
        named("x-forwarded-proto"),
        named("x-forwarded-host"),
    ];
    match ADDED
        .iter()
        .find(|(n, _)| token_eq_lower(raw, n.as_bytes()))
    {
        Some((_, name)) => Ok(name.clone()),
        None => HeaderName::from_bytes(raw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_names_are_the_names_from_bytes_gives() {
        for raw in [
            &b"Date"[..],
            b"ETAG",
            b"vary",
            b"Server",
            b"Expires",
            b"Set-Cookie",
            b"Content-Type",
            b"Cache-Control",
            b"Last-Modified",
            b"Accept-Ranges",
            b"Content-Length",
            b"Content-Encoding",
            b"X-Custom",
            b"content-typf",
            b"CONTENT-LENGTH",
            b"content-length",
            b"Content-Length",
            b"cOnTeNt-TyPe",
            b"content\rtype",
            b"Content_Type",
        ] {
            assert_eq!(
                response_name(raw).ok(),
                HeaderName::from_bytes(raw).ok(),
                "{raw:?}"
            );
        }
        for raw in [
            &b"X-Request-Id"[..],
            b"X-Real-IP",
            b"X-Forwarded-For",
            b"x-forwarded-proto",
            b"X-Forwarded-Host",
            b"X-Client-Cert",
        ] {
            assert_eq!(added_name(raw).ok(), HeaderName::from_bytes(raw).ok());
        }
        assert!(added_name(b"bad name").is_err());
        assert!(response_name(b"bad name").is_err());
        assert!(response_name(b"").is_err());
    }
}
