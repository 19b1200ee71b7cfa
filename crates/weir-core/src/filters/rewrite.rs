//! Path prefix rewriting on the way to the upstream (Apache `ProxyPass /cgi/ http://b/`).
//!
//! The rewrite is a plain text substitution, as in nginx and Apache. Where `path_prefix`
//! and `rewrite_prefix` disagree on a trailing `/`, the join can start a segment the client
//! never sent: `/api` -> `/v1/` turns the routed `/api../secret` into `/v1/../secret`,
//! which a server resolves to `/secret`, outside the route. [`check_join`] refuses exactly
//! those requests (400) instead of forwarding them.

use crate::error::ProxyError;

/// Splits the upstream path into (new prefix, rest): `/cgi/x` with prefix `/cgi/` rewritten
/// to `/` gives (`/`, `x`). Without a rewrite the prefix is empty and the path is unchanged.
pub fn upstream_path<'a>(
    path: &'a [u8],
    path_prefix: &str,
    rewrite_prefix: Option<&'a str>,
) -> (&'a [u8], &'a [u8]) {
    match rewrite_prefix {
        Some(to) if path.starts_with(path_prefix.as_bytes()) => {
            (to.as_bytes(), &path[path_prefix.len()..])
        }
        _ if path.is_empty() => (b"/", b""),
        _ => (b"", path),
    }
}

/// Refuses (400) a request whose rewritten path would hold a `.` or `..` segment at the
/// join of `rewrite_prefix` and the rest of `path` (the normalised path) that the routed
/// path did not hold there. Rewrites that keep segment boundaries never trip it.
pub fn check_join(
    path: &[u8],
    path_prefix: &str,
    rewrite_prefix: Option<&str>,
) -> Result<(), ProxyError> {
    let Some(to) = rewrite_prefix else {
        return Ok(());
    };
    let Some(rest) = path.strip_prefix(path_prefix.as_bytes()) else {
        return Ok(());
    };
    let first = &rest[..rest
        .iter()
        .position(|b| matches!(b, b'/' | b'?'))
        .unwrap_or(rest.len())];
    let made = is_dot_segment(last_segment(to.as_bytes()), first);
    if made && !is_dot_segment(last_segment(path_prefix.as_bytes()), first) {
        return Err(ProxyError::BadRequest(
            "rewrite_prefix would make a dot segment of this path",
        ));
    }
    Ok(())
}

fn last_segment(prefix: &[u8]) -> &[u8] {
    let slash = prefix.iter().rposition(|b| *b == b'/');
    &prefix[slash.map_or(0, |i| i + 1)..]
}

/// Whether the segment `head` + `tail` is `.` or `..` (also `%2e`, or with `;parameters`,
/// which servlet containers strip before resolving it).
fn is_dot_segment(head: &[u8], tail: &[u8]) -> bool {
    let mut dots = 0;
    let mut bytes = head.iter().chain(tail);
    while let Some(&b) = bytes.next() {
        match b {
            b';' => break,
            b'.' => dots += 1,
            b'%' => {
                let (hi, lo) = (bytes.next(), bytes.next());
                if hi != Some(&b'2') || !matches!(lo, Some(b'e' | b'E')) {
                    return false;
                }
                dots += 1;
            }
            _ => return false,
        }
        if dots > 2 {
            return false;
        }
    }
    dots > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(path: &str, from: &str, to: Option<&str>) -> String {
        let (a, b) = upstream_path(path.as_bytes(), from, to);
        format!(
            "{}{}",
            String::from_utf8_lossy(a),
            String::from_utf8_lossy(b)
        )
    }

    #[test]
    fn rewrites_prefix() {
        assert_eq!(
            joined("/cgi/cgi-bin/second.pl", "/cgi/", Some("/")),
            "/cgi-bin/second.pl"
        );
        assert_eq!(joined("/cgi/", "/cgi/", Some("/")), "/");
        assert_eq!(
            joined("/api/v1?q=1", "/api/", Some("/backend/")),
            "/backend/v1?q=1"
        );
        assert_eq!(joined("/cgi/x", "/cgi/", None), "/cgi/x");
        assert_eq!(joined("", "/", None), "/");
    }

    #[test]
    fn a_join_that_makes_a_dot_segment_is_refused() {
        let refused =
            |path: &str, from: &str, to: &str| check_join(path.as_bytes(), from, Some(to)).is_err();
        for path in [
            "/api..",
            "/api../secret",
            "/api.",
            "/api./x",
            "/api..?q",
            "/api..;x/y",
            "/api%2e%2E/x",
            "/api.%2e",
        ] {
            assert!(refused(path, "/api", "/v1/"), "{path}");
        }
        // The rewrite's own last segment ends the path: "/v1/." + "".
        assert!(refused("/api/", "/api/", "/v1/."));
        for path in [
            "/api",
            "/api/",
            "/api/x",
            "/api...",
            "/api..x",
            "/apix",
            "/api.x/..",
            "/api?..",
        ] {
            assert!(!refused(path, "/api", "/v1/"), "{path}");
        }
        // Matching trailing slashes keep every boundary; an unrewritten route is never checked.
        assert!(!refused("/api/x", "/api/", "/v1/"));
        assert!(!refused("/api..", "/api", "/v1"));
        assert!(check_join(b"/api../x", "/api", None).is_ok());
        // A dot segment the client sent (normalisation off) is not the rewrite's doing.
        assert!(!refused("/api/../x", "/api/", "/v1/"));
    }
}
