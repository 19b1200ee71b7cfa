//! Routing: host + path (+ method, header and query conditions) -> route index. Pure, no I/O.
//!
//! Precedence, decided once when a snapshot is built:
//! 1. the route's host pattern must match the request's host;
//! 2. routes with `exact = true` whose path equals the request path (query left out) come
//!    before every prefix route;
//! 3. then the longest matching `path_prefix`;
//! 4. among routes at the same path, the most specific host pattern (exact, then
//!    `*.suffix`, then `*`), then file order: the first route whose method, header and
//!    query conditions all hold wins. A route without conditions takes every request that
//!    reaches it (the catch-all of its place), so conditional routes go before it.
//!
//! Routes without conditions cost what they did before conditions existed: the exact list
//! is empty unless `exact` is used, and conditions are looked at only once host and path
//! have matched (a `None` check for a plain route).
//!
//! The path matched is the normalised one (`normalize`), which is also the one forwarded.

mod conditions;

pub use conditions::{Conditions, RequestView};
use weir_config::{HostPattern, Route};

pub mod normalize;

pub use normalize::RoutedPath;

#[derive(Debug, Clone)]
pub struct Router {
    /// `exact = true` routes, most specific host first, then file order.
    exact: Vec<Entry>,
    /// Prefix routes, in match order.
    entries: Vec<Entry>,
}

#[derive(Debug, Clone)]
struct Entry {
    route: usize,
    hosts: Vec<HostPattern>,
    prefix: Box<[u8]>,
    specificity: u8,
    conditions: Option<Box<Conditions>>,
}

impl Entry {
    #[inline]
    fn takes(&self, host: &[u8], req: &RequestView<'_>) -> bool {
        self.hosts.iter().any(|p| host_matches(p, host))
            && self.conditions.as_ref().is_none_or(|c| c.hold(req))
    }
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
        let (mut exact, mut entries): (Vec<Entry>, Vec<Entry>) = routes
            .iter()
            .enumerate()
            .map(|(i, r)| Entry {
                route: i,
                hosts: r.hosts.clone(),
                prefix: r.path_prefix.as_bytes().into(),
                specificity: specificity(&r.hosts),
                conditions: Conditions::new(&r.matching),
            })
            .partition(|e| routes[e.route].matching.exact);
        let order = |a: &Entry, b: &Entry| {
            b.prefix
                .len()
                .cmp(&a.prefix.len())
                .then(b.specificity.cmp(&a.specificity))
                .then(a.route.cmp(&b.route))
        };
        exact.sort_by(order);
        entries.sort_by(order);
        Router { exact, entries }
    }

    /// The matching route's index in the listener's route list, if any.
    /// `host` is the request's host without port, in any case; `path` its path (a query
    /// after it only matters to prefix routes, as before); `req` what conditions read.
    #[inline]
    pub fn route(&self, host: &[u8], path: &[u8], req: &RequestView<'_>) -> Option<usize> {
        if !self.exact.is_empty() {
            let bare = path.split(|b| *b == b'?').next().unwrap_or(path);
            let found = self
                .exact
                .iter()
                .find(|e| *bare == *e.prefix && e.takes(host, req));
            if let Some(e) = found {
                return Some(e.route);
            }
        }
        self.entries
            .iter()
            .find(|e| path.starts_with(&e.prefix) && e.takes(host, req))
            .map(|e| e.route)
    }
}

/// Whether `host` (any case) matches `pattern` (lower-cased by validation).
pub(crate) fn host_matches(pattern: &HostPattern, host: &[u8]) -> bool {
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
mod tests;
