//! The fields the cache policy (`http-cache-semantics`) reads, put in the form it reads
//! them before it sees them, from the upstream and from the client alike:
//! - `Cache-Control` and `Pragma` directive names lower-cased. RFC 9111 5.2 makes them
//!   case-insensitive, but the crate compares them as written, so a response marked
//!   `Cache-Control: Private` or `No-Store` (classic ASP's spelling) was stored and served
//!   to every client.
//! - `Age` capped at 2^31 seconds (RFC 9111 1.2.2: a larger delta-seconds counts as 2^31).
//!   The crate adds the time an entry has been stored to it, which overflows (a panic, an
//!   abort in a release build) for `Age: 18446744073709551615`.
//!
//! A head is rewritten only when it needs it; a stored head read back from disk that does
//! not pass [`is_normal`] (one stored before these rules) is not loaded.

use http::header::{AGE, CACHE_CONTROL, PRAGMA};
use http::{HeaderMap, HeaderValue};

/// The largest `Age` the policy is given, in seconds (RFC 9111 1.2.2).
const MAX_AGE_FIELD: u64 = 1 << 31;

/// Puts `headers` (a request's or a response's) in the form the policy reads.
pub(super) fn normalise(headers: &mut HeaderMap) {
    for name in [CACHE_CONTROL, PRAGMA] {
        if headers
            .get_all(&name)
            .iter()
            .any(|v| names_need_lowering(v.as_bytes()))
        {
            let lowered: Vec<HeaderValue> =
                headers.get_all(&name).iter().map(lower_names).collect();
            headers.remove(&name);
            for value in lowered {
                headers.append(name.clone(), value);
            }
        }
    }
    if age_too_large(headers) {
        headers.insert(AGE, HeaderValue::from(MAX_AGE_FIELD));
    }
}

/// Whether `headers` are as [`normalise`] leaves them.
pub(super) fn is_normal(headers: &HeaderMap) -> bool {
    let lowered = |name| {
        !headers
            .get_all(name)
            .iter()
            .any(|v| names_need_lowering(v.as_bytes()))
    };
    lowered(CACHE_CONTROL) && lowered(PRAGMA) && !age_too_large(headers)
}

/// Whether the first `Age` (the one the policy reads) is, read as the policy reads it
/// (`str::parse::<u64>`, which takes `+18446744073709551615` too), over the cap. A value
/// it cannot read counts as 0 there, which overflows nothing.
fn age_too_large(headers: &HeaderMap) -> bool {
    let age = headers.get(AGE).and_then(|v| v.to_str().ok());
    age.and_then(|a| a.parse::<u64>().ok())
        .is_some_and(|n| n > MAX_AGE_FIELD)
}

/// The directive names of one field line: what precedes `=` in each comma-separated
/// part, as the crate splits them.
fn names(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(|part| part.split(|b| *b == b'=').next().unwrap_or_default())
}

fn names_need_lowering(value: &[u8]) -> bool {
    names(value).any(|n| n.iter().any(u8::is_ascii_uppercase))
}

/// `value` with each directive name lower-cased, its arguments as they were.
fn lower_names(value: &HeaderValue) -> HeaderValue {
    let mut out = Vec::with_capacity(value.len());
    for (i, part) in value.as_bytes().split(|b| *b == b',').enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let name_len = part.iter().position(|b| *b == b'=').unwrap_or(part.len());
        out.extend(part[..name_len].iter().map(u8::to_ascii_lowercase));
        out.extend_from_slice(&part[name_len..]);
    }
    // Lower-casing ASCII letters keeps a valid field value valid.
    HeaderValue::from_bytes(&out).unwrap_or_else(|_| value.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn directive_names_are_lowered_and_their_arguments_kept() {
        let mut h = map(&[
            ("cache-control", "max-age=600, PRIVATE=\"Set-Cookie\""),
            ("cache-control", "No-Store"),
            ("pragma", "No-Cache"),
            ("age", "18446744073709551615"),
        ]);
        assert!(!is_normal(&h));
        normalise(&mut h);
        let cc: Vec<_> = h.get_all("cache-control").iter().collect();
        assert_eq!(cc, ["max-age=600, private=\"Set-Cookie\"", "no-store"]);
        assert_eq!(h["pragma"], "no-cache");
        assert_eq!(h["age"], "2147483648");
        assert!(is_normal(&h));
    }

    #[test]
    fn normal_heads_are_left_alone() {
        let plain = map(&[("cache-control", "max-age=60, private"), ("age", "5")]);
        let mut h = plain.clone();
        normalise(&mut h);
        assert_eq!(h, plain);
        assert!(is_normal(&h));
        // What the policy cannot read as a u64 it reads as 0.
        assert!(is_normal(&map(&[("age", "99999999999999999999999")])));
        assert!(is_normal(&map(&[("age", "soon")])));
        // A sign is read (Rust's `parse`): the attacker review's bypass of the first cap.
        let mut signed = map(&[("age", "+18446744073709551615")]);
        assert!(!is_normal(&signed));
        normalise(&mut signed);
        assert_eq!(signed["age"], "2147483648");
    }
}
