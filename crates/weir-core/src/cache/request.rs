//! The request as the cache reads it: its key (the route's `key` parts), and its fields
//! as the `http-cache-semantics` policy sees them (`Accept-Encoding` normalised to the
//! coding that picks a variant, `Cache-Control` without `max-stale`, repeated fields
//! joined) and as a stored entry's policy keeps them (only the fields it weighs later).

use http::{HeaderMap, HeaderName, HeaderValue};
use weir_config::{CacheKeyPart, RouteCache};

use crate::request::Request;

/// The request's cache key: its `key` parts, as `scheme://host/path?query` by default.
pub(super) fn key(r: &Request<'_>, routed: &[u8], cache: &RouteCache) -> Vec<u8> {
    let (path, query) = split_query(routed);
    let mut key = Vec::with_capacity(routed.len() + 32);
    for part in &cache.key {
        match part {
            CacheKeyPart::Scheme => {
                key.extend_from_slice(r.origin.scheme());
                key.extend_from_slice(b"://");
            }
            CacheKeyPart::Host => {
                let host = r.req.host.as_ref().map_or(&[][..], |h| &r.buf[h.clone()]);
                key.extend(host.iter().map(u8::to_ascii_lowercase));
            }
            CacheKeyPart::Path => key.extend_from_slice(path),
            CacheKeyPart::Query => {
                if let Some(q) = query {
                    key.push(b'?');
                    key.extend_from_slice(q);
                }
            }
        }
    }
    key
}

fn split_query(routed: &[u8]) -> (&[u8], Option<&[u8]>) {
    match routed.iter().position(|&b| b == b'?') {
        Some(i) => (&routed[..i], Some(&routed[i + 1..])),
        None => (routed, None),
    }
}

/// The request as the policy reads it: GET (a HEAD is served from a GET's entry), its
/// path, its end-to-end fields with `Accept-Encoding` normalised and `Cache-Control`
/// without `max-stale` (its directive names lower-cased: `directives`), and the client-certificate field (`cert_header`) as the upstream
/// gets it: the session's, never the client's own copy, so a response that varies on it
/// goes to no other client (nor to one that forges it). `None`: a field that is not valid
/// HTTP (the request is forwarded, not cached).
pub(super) fn request_parts(
    r: &Request<'_>,
    routed: &[u8],
    cert_header: Option<&str>,
) -> Option<http::request::Parts> {
    let uri = http::Uri::try_from(routed).ok()?;
    let mut headers = HeaderMap::with_capacity(r.req.headers.len());
    let weirs = |name: &[u8]| {
        cert_header
            .is_some_and(|c| crate::forward::request_head::same_header_name(name, c.as_bytes()))
    };
    // What the upstream saw: no hop-by-hop field, none the client listed in `Connection`
    // (else `Connection: Accept-Language` stores the default page under `fr`).
    let forwarded =
        |h: &&crate::codec::http1::HeaderSpan| !h.kind.is_hop_by_hop() && !h.connection_listed;
    for h in r.req.headers.iter().filter(forwarded) {
        if weirs(&r.buf[h.name.clone()]) {
            continue;
        }
        let name = HeaderName::from_bytes(&r.buf[h.name.clone()]).ok()?;
        let value = &r.buf[h.value.clone()];
        let value = match name == http::header::CACHE_CONTROL {
            true => match without_max_stale(value) {
                Some(kept) => kept,
                None => continue,
            },
            false => HeaderValue::from_bytes(value).ok()?,
        };
        combine(&mut headers, name, value)?;
    }
    normalise_accept_encoding(&mut headers);
    super::directives::normalise(&mut headers);
    if let Some(line) = r.origin.tls.and_then(|t| t.cert_header_line.as_deref()) {
        let (name, value) = split_line(line)?;
        headers.insert(name, value);
    }
    let (mut parts, ()) = http::Request::get(uri).body(()).ok()?.into_parts();
    parts.headers = headers;
    Some(parts)
}

/// The name and value of a rendered `Name: value\r\n` line.
fn split_line(line: &[u8]) -> Option<(HeaderName, HeaderValue)> {
    let colon = line.iter().position(|&b| b == b':')?;
    let value = line[colon + 1..].trim_ascii();
    let name = HeaderName::from_bytes(&line[..colon]).ok()?;
    Some((name, HeaderValue::from_bytes(value).ok()?))
}

/// Adds the field `name: value` to `headers`, joined to an earlier line of the same name
/// with a comma (RFC 9110 5.3): the policy compares a `Vary`-listed field by its one value,
/// so two lines must not match a request that sends only the first. `None`: the joined
/// value is not a valid one.
fn combine(headers: &mut HeaderMap, name: HeaderName, value: HeaderValue) -> Option<()> {
    match headers.entry(name) {
        http::header::Entry::Vacant(line) => {
            line.insert(value);
        }
        http::header::Entry::Occupied(mut line) => {
            let joined = [line.get().as_bytes(), b", ", value.as_bytes()].concat();
            line.insert(HeaderValue::from_bytes(&joined).ok()?);
        }
    }
    Some(())
}

/// The request `parts` as a stored entry's policy keeps it: only the fields the policy
/// weighs later (`Host`, `Cache-Control`, `Pragma`, `Authorization`, and those the
/// responses `heads` vary on). The policy keeps the request's fields with the entry:
/// all of them would let any client make its entries take far more room than the store
/// accounts for.
pub(super) fn stored_request(
    parts: &http::request::Parts,
    heads: &[&HeaderMap],
) -> http::request::Parts {
    let mut kept = http::Request::new(());
    *kept.method_mut() = parts.method.clone();
    *kept.uri_mut() = parts.uri.clone();
    let (mut kept, ()) = kept.into_parts();
    let always = [
        http::header::HOST,
        http::header::CACHE_CONTROL,
        http::header::PRAGMA,
        http::header::AUTHORIZATION,
    ];
    let varied: Vec<HeaderName> = heads
        .iter()
        .flat_map(|h| h.get_all(http::header::VARY))
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .filter_map(|n| HeaderName::from_bytes(n.trim_ascii()).ok())
        .collect();
    // The policy weighs whether the request had credentials, not which: unless the
    // responses vary on them, a placeholder is kept (a disk store writes the policy to
    // its files: no user's credentials at rest).
    let credentials_weighed = varied.contains(&http::header::AUTHORIZATION);
    for name in always.into_iter().chain(varied) {
        if let Some(value) = parts.headers.get(&name) {
            let value = match name == http::header::AUTHORIZATION && !credentials_weighed {
                true => HeaderValue::from_static("(present)"),
                false => value.clone(),
            };
            kept.headers.entry(name).or_insert(value);
        }
    }
    kept
}

/// `kept` without the request's own caching directives (`Cache-Control`, `Pragma`):
/// whether a response may be stored whatever this one request asked.
pub(super) fn without_directives(kept: &http::request::Parts) -> http::request::Parts {
    let mut neutral = http::Request::new(());
    *neutral.method_mut() = kept.method.clone();
    *neutral.uri_mut() = kept.uri.clone();
    let (mut neutral, ()) = neutral.into_parts();
    neutral.headers = kept.headers.clone();
    neutral.headers.remove(http::header::CACHE_CONTROL);
    neutral.headers.remove(http::header::PRAGMA);
    neutral
}

/// A request's `Cache-Control` value without its `max-stale` directives (`None`: nothing
/// is left). A shared cache does not let a client loosen freshness (as nginx and Varnish
/// do not): else any client could have an entry the origin wants revalidated (`no-cache`,
/// `s-maxage`, `proxy-revalidate`), stored for another client, without asking it (RFC 9111
/// 4.2.4).
fn without_max_stale(value: &[u8]) -> Option<HeaderValue> {
    let is_max_stale = |d: &&[u8]| {
        let name = d.split(|b| *b == b'=').next().unwrap_or_default();
        name.trim_ascii().eq_ignore_ascii_case(b"max-stale")
    };
    let directives = value.split(|b| *b == b',');
    if !directives.clone().any(|d| is_max_stale(&d)) {
        return HeaderValue::from_bytes(value).ok();
    }
    let kept: Vec<&[u8]> = directives
        .filter(|d| !is_max_stale(d) && !d.trim_ascii().is_empty())
        .map(<[u8]>::trim_ascii)
        .collect();
    (!kept.is_empty())
        .then(|| HeaderValue::from_bytes(&kept.join(&b", "[..])).ok())
        .flatten()
}

/// `Accept-Encoding` reduced to the one coding a cached variant is picked by (`br`, else
/// `gzip`, else none), so that clients' many spellings share a few variants.
fn normalise_accept_encoding(headers: &mut HeaderMap) {
    let Some(value) = headers.get(http::header::ACCEPT_ENCODING) else {
        return;
    };
    let text = value.to_str().unwrap_or("").to_ascii_lowercase();
    let offers = |coding: &str| {
        text.split(',').any(|item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| matches!(p.trim(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000"));
            name == coding && !refused
        })
    };
    let normal = ["br", "gzip"].into_iter().find(|c| offers(c));
    match normal {
        Some(c) => headers.insert(http::header::ACCEPT_ENCODING, HeaderValue::from_static(c)),
        None => headers.remove(http::header::ACCEPT_ENCODING),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_encoding_is_reduced_to_one_coding() {
        let mut h = HeaderMap::new();
        for (sent, normal) in [
            ("gzip, deflate, br", Some("br")),
            ("deflate, gzip;q=0.5", Some("gzip")),
            ("br;q=0, gzip", Some("gzip")),
            ("identity", None),
        ] {
            h.insert(
                http::header::ACCEPT_ENCODING,
                HeaderValue::from_static(sent),
            );
            normalise_accept_encoding(&mut h);
            let got = h
                .get(http::header::ACCEPT_ENCODING)
                .map(|v| v.to_str().unwrap());
            assert_eq!(got, normal, "{sent}");
        }
    }
}
