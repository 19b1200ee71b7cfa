//! Routing: host + path (+ method, header and query conditions) -> route index. Pure, no I/O.
//!
//! Precedence, decided once when a snapshot is built:
//! 1. the route's host pattern must match the request's host, and the most specific
//!    pattern comes first (exact name, then `*.suffix`, then `*`), whatever the paths: as
//!    nginx picks a `server` by name before its locations (and Caddy a site, Envoy a
//!    virtual host), a route written for a host is never passed over for a wildcard route
//!    with a longer prefix (which would skip the host's `deny` or `basic_auth`). A request
//!    falls through to less specific hosts only when no route of the more specific ones
//!    takes it;
//! 2. within a host tier, routes with `exact = true` whose path equals the request path
//!    (query left out) come before the prefix routes;
//! 3. then the longest matching `path_prefix`;
//! 4. then file order: the first route whose method, header and query conditions all
//!    hold wins. A route without conditions takes every request that reaches it (the
//!    catch-all of its place), so conditional routes go before it.
//!
//! Routes without conditions cost what they did before conditions existed: the query is
//! split off the path only when some route is `exact`, and conditions are looked at only
//! once host and path have matched (a `None` check for a plain route).
//!
//! The path matched is the normalised one (`normalize`), which is also the one forwarded.

mod conditions;

pub use conditions::{Conditions, RequestView};
use weir_config::{HostPattern, Route};

pub mod normalize;

pub use normalize::RoutedPath;

#[derive(Debug, Clone)]
pub struct Router {
    /// Every route, in match order (see the module doc).
    entries: Vec<Entry>,
    /// Some route is `exact`: the path's query must be split off for it.
    has_exact: bool,
}

#[derive(Debug, Clone)]
struct Entry {
    route: usize,
    hosts: Vec<HostPattern>,
    prefix: Box<[u8]>,
    exact: bool,
    specificity: u8,
    conditions: Option<Box<Conditions>>,
}

impl Entry {
    /// `path` is the request's path with its query, `bare` without it.
    #[inline]
    fn path_matches(&self, path: &[u8], bare: &[u8]) -> bool {
        if self.exact {
            *bare == *self.prefix
        } else {
            path.starts_with(&self.prefix)
        }
    }

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
        let mut entries: Vec<Entry> = routes
            .iter()
            .enumerate()
            .map(|(i, r)| Entry {
                route: i,
                hosts: r.hosts.clone(),
                prefix: r.path_prefix.as_bytes().into(),
                exact: r.matching.exact,
                specificity: specificity(&r.hosts),
                conditions: Conditions::new(&r.matching),
            })
            .collect();
        entries.sort_by(|a, b| {
            b.specificity
                .cmp(&a.specificity)
                .then(b.exact.cmp(&a.exact))
                .then(b.prefix.len().cmp(&a.prefix.len()))
                .then(a.route.cmp(&b.route))
        });
        let has_exact = entries.iter().any(|e| e.exact);
        Router { entries, has_exact }
    }

    /// The matching route's index in the listener's route list, if any.
    /// `host` is the request's host without port, in any case; `path` its path (a query
    /// after it only matters to prefix routes, as before); `req` what conditions read.
    #[inline]
    pub fn route(&self, host: &[u8], path: &[u8], req: &RequestView<'_>) -> Option<usize> {
        let bare = if self.has_exact {
            path.split(|b| *b == b'?').next().unwrap_or(path)
        } else {
            path
        };
        self.entries
            .iter()
            .find(|e| e.path_matches(path, bare) && e.takes(host, req))
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
