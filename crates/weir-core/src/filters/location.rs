//! Reverse mapping of `Location`, `Content-Location` and `URI` response headers
//! (Apache `ProxyPassReverse`): what the upstream says about its own URL space is mapped
//! back into the public prefix the client used.

/// What one response's headers are mapped with.
pub struct ReverseMap<'a> {
    /// The upstream server's authority as configured (`127.0.0.1:8081`).
    pub upstream_authority: &'a [u8],
    /// The authority the client addressed (its `Host`), if any.
    pub public_authority: Option<&'a [u8]>,
    /// The prefix the upstream sees (`rewrite_prefix`, e.g. `/`).
    pub upstream_prefix: &'a str,
    /// The public prefix (`path_prefix`, e.g. `/cgi/`).
    pub public_prefix: &'a str,
}

impl ReverseMap<'_> {
    /// Appends the mapped value to `out`; returns false (and appends nothing) when the
    /// value is not under the upstream's URL space and must pass unchanged.
    pub fn map_into(&self, value: &[u8], out: &mut Vec<u8>) -> bool {
        let (authority, path) = split_url(value);
        let ours = match authority {
            None => true,
            Some(a) => {
                a.eq_ignore_ascii_case(self.upstream_authority)
                    || self
                        .public_authority
                        .is_some_and(|p| a.eq_ignore_ascii_case(p))
            }
        };
        let Some(rest) = path.strip_prefix(self.upstream_prefix.as_bytes()) else {
            return false;
        };
        if !ours || (authority.is_none() && !path.starts_with(b"/")) {
            return false;
        }
        if authority.is_some() {
            out.extend_from_slice(b"http://");
            out.extend_from_slice(self.public_authority.unwrap_or(self.upstream_authority));
        }
        out.extend_from_slice(self.public_prefix.as_bytes());
        out.extend_from_slice(rest);
        true
    }
}

/// `http://host/path` -> (Some(host), /path); `/path` -> (None, /path).
fn split_url(value: &[u8]) -> (Option<&[u8]>, &[u8]) {
    const SCHEME: &[u8] = b"http://";
    if value.len() < SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return (None, value);
    }
    let rest = &value[SCHEME.len()..];
    let end = rest.iter().position(|b| *b == b'/').unwrap_or(rest.len());
    (
        Some(&rest[..end]),
        if end == rest.len() {
            b"/"
        } else {
            &rest[end..]
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(value: &str) -> Option<String> {
        let m = ReverseMap {
            upstream_authority: b"127.0.0.1:8081",
            public_authority: Some(b"proxy.example:8080"),
            upstream_prefix: "/",
            public_prefix: "/cgi/",
        };
        let mut out = Vec::new();
        m.map_into(value.as_bytes(), &mut out)
            .then(|| String::from_utf8(out).unwrap())
    }

    #[test]
    fn maps_upstream_urls_back() {
        assert_eq!(
            map("http://127.0.0.1:8081/login").as_deref(),
            Some("http://proxy.example:8080/cgi/login")
        );
        assert_eq!(
            map("http://127.0.0.1:8081").as_deref(),
            Some("http://proxy.example:8080/cgi/")
        );
        assert_eq!(map("/a/b?c").as_deref(), Some("/cgi/a/b?c"));
        assert_eq!(
            map("http://PROXY.example:8080/x").as_deref(),
            Some("http://proxy.example:8080/cgi/x")
        );
    }

    #[test]
    fn leaves_foreign_urls_alone() {
        assert_eq!(map("http://other.example/x"), None);
        assert_eq!(map("https://127.0.0.1:8081/x"), None);
        assert_eq!(map("relative/path"), None);
    }
}
