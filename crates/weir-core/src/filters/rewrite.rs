//! Path prefix rewriting on the way to the upstream (Apache `ProxyPass /cgi/ http://b/`).

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
}
