//! Routing: host + path prefix -> route index. Pure, no I/O.
//!
//! Routes are sorted once, when a snapshot is built: longest path prefix first, then the most
//! specific host pattern (exact, then `*.suffix`, then `*`), then declaration order. A request
//! takes the first route whose host and prefix both match.

use weir_config::{HostPattern, Route};

#[derive(Debug, Clone)]
pub struct Router {
    /// (index into the listener's routes, host patterns, path prefix), in match order.
    entries: Vec<Entry>,
}

#[derive(Debug, Clone)]
struct Entry {
    route: usize,
    hosts: Vec<HostPattern>,
    prefix: Box<[u8]>,
    specificity: u8,
}

fn specificity(hosts: &[HostPattern]) -> u8 {
    hosts
        .iter()
        .map(|h| match h {
            HostPattern::Exact(_) => 2,
            HostPattern::Suffix(_) => 1,
            HostPattern::Any => 0,
        })
        .min()
        .unwrap_or(0)
}

impl Router {
    pub fn new(routes: &[Route]) -> Router {
        let mut entries: Vec<Entry> = routes
            .iter()
            .enumerate()
            .map(|(i, r)| Entry {
                route: i,
                hosts: r.hosts.clone(),
                prefix: r.path_prefix.as_bytes().into(),
                specificity: specificity(&r.hosts),
            })
            .collect();
        entries.sort_by(|a, b| {
            b.prefix
                .len()
                .cmp(&a.prefix.len())
                .then(b.specificity.cmp(&a.specificity))
                .then(a.route.cmp(&b.route))
        });
        Router { entries }
    }

    /// The matching route's index in the listener's route list, if any.
    /// `host` is the request's host without port, in any case.
    pub fn route(&self, host: &[u8], path: &[u8]) -> Option<usize> {
        self.entries
            .iter()
            .find(|e| path.starts_with(&e.prefix) && e.hosts.iter().any(|p| host_matches(p, host)))
            .map(|e| e.route)
    }
}

fn host_matches(pattern: &HostPattern, host: &[u8]) -> bool {
    match pattern {
        HostPattern::Any => true,
        HostPattern::Exact(name) => host.eq_ignore_ascii_case(name.as_bytes()),
        HostPattern::Suffix(suffix) => {
            host.len() > suffix.len()
                && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(name: &str, hosts: Vec<HostPattern>, prefix: &str) -> Route {
        Route {
            name: name.into(),
            hosts,
            path_prefix: prefix.into(),
            rewrite_prefix: None,
            reverse_rewrite: false,
            preserve_host: true,
            forwarded_headers: true,
            upgrades: vec![],
            upstream: 0,
            filters: Default::default(),
        }
    }

    #[test]
    fn longest_prefix_then_most_specific_host() {
        let routes = vec![
            route("any-root", vec![HostPattern::Any], "/"),
            route("any-api", vec![HostPattern::Any], "/api/"),
            route(
                "wild-api",
                vec![HostPattern::Suffix(".example.com".into())],
                "/api/",
            ),
            route(
                "exact-api",
                vec![HostPattern::Exact("a.example.com".into())],
                "/api/",
            ),
            route("cgi", vec![HostPattern::Any], "/cgi/"),
        ];
        let r = Router::new(&routes);
        assert_eq!(r.route(b"x", b"/index.html"), Some(0));
        assert_eq!(r.route(b"x", b"/api/v1"), Some(1));
        assert_eq!(r.route(b"b.EXAMPLE.com", b"/api/v1"), Some(2));
        assert_eq!(r.route(b"A.example.com", b"/api/v1"), Some(3));
        assert_eq!(r.route(b"example.com", b"/api/v1"), Some(1));
        assert_eq!(r.route(b"x", b"/cgi/x"), Some(4));
        assert_eq!(r.route(b"x", b"/cgi"), Some(0));
    }

    #[test]
    fn no_match_without_catch_all() {
        let r = Router::new(&[route("a", vec![HostPattern::Exact("a.test".into())], "/")]);
        assert_eq!(r.route(b"b.test", b"/"), None);
        assert_eq!(r.route(b"", b"/"), None);
        assert_eq!(Router::new(&[]).route(b"a", b"/"), None);
    }
}
