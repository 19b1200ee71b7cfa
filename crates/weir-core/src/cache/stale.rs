//! Serving a stale entry (RFC 5861): at once while it is revalidated in the background
//! (`stale-while-revalidate`), or when the upstream fails (`stale-if-error`, and a
//! route's `serve_stale_on`). What each entry allows, read from its response when it is
//! stored ([`Staleness`]), and which failures a stale entry answers ([`Cause`]).

use std::time::{Duration, SystemTime};

use http::HeaderMap;
use http_cache_semantics::CachePolicy;
use weir_config::StaleOn;

use crate::error::ProxyError;

/// How an entry may be served once stale.
#[derive(Debug, Clone, Copy)]
pub struct Staleness {
    /// When it stops being fresh.
    pub fresh_until: SystemTime,
    /// `stale-if-error=N`: how long past that it may answer for a failure.
    pub if_error: Option<Duration>,
    /// `stale-while-revalidate=N`: how long past that it may answer at once while it is
    /// revalidated in the background.
    pub while_revalidate: Option<Duration>,
    /// `must-revalidate`, `proxy-revalidate`, `no-cache`, `s-maxage` (which implies
    /// `proxy-revalidate` for a shared cache, RFC 9111 5.2.2.10): never served stale.
    pub forbidden: bool,
}

/// The longest an entry stays fresh: a `max-age` past it (`9223372036854775807`, Java's
/// "never expires") counts as this, as nginx and Varnish bound theirs. Unbounded, adding it
/// to `now` overflows `SystemTime`, a panic (an abort in a release build) that any upstream
/// of a cached route could cause.
const MAX_FRESH: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

impl Staleness {
    /// What the response `headers` (stored under `policy`) allow, at `now`.
    pub fn of(policy: &CachePolicy, headers: &HeaderMap, now: SystemTime) -> Staleness {
        let mut out = Staleness {
            fresh_until: now + policy.time_to_live(now).min(MAX_FRESH),
            if_error: None,
            while_revalidate: None,
            forbidden: false,
        };
        let directives = headers.get_all(http::header::CACHE_CONTROL).iter();
        let directives = directives
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','));
        for directive in directives {
            let (name, value) = match directive.split_once('=') {
                Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
                None => (directive.trim(), None),
            };
            let seconds = value.and_then(|v| v.parse().ok()).map(Duration::from_secs);
            match name.to_ascii_lowercase().as_str() {
                "stale-if-error" => out.if_error = seconds,
                "stale-while-revalidate" => out.while_revalidate = seconds,
                "must-revalidate" | "proxy-revalidate" | "no-cache" | "s-maxage" => {
                    out.forbidden = true
                }
                _ => {}
            }
        }
        out
    }

    /// Whether the entry may answer at `now` while it is revalidated in the background.
    pub fn while_revalidating(&self, now: SystemTime) -> bool {
        let stale_for = now.duration_since(self.fresh_until).unwrap_or_default();
        !self.forbidden
            && self
                .while_revalidate
                .is_some_and(|window| stale_for <= window)
    }

    /// Whether the entry may answer for `cause` at `now` (the route allowing it on `on`).
    pub fn answers(&self, cause: Cause, on: StaleOn, now: SystemTime) -> bool {
        if self.forbidden {
            return false;
        }
        let stale_for = now.duration_since(self.fresh_until).unwrap_or_default();
        let by_response = self.if_error.is_some_and(|window| stale_for <= window);
        let by_route = match cause {
            Cause::Error => on.error,
            Cause::Timeout => on.timeout,
            Cause::Status5xx => on.status_5xx,
        };
        by_response || by_route
    }
}

/// An upstream failure a stale entry may answer for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Unreachable, reset, closed early, malformed, no server (502, 503).
    Error,
    /// No connection or no answer in time (504).
    Timeout,
    /// A 5xx status from the upstream.
    Status5xx,
}

impl Cause {
    /// The cause of `error`, if it is the upstream's failure.
    pub fn of(error: ProxyError) -> Option<Cause> {
        match error {
            ProxyError::UpstreamConnectTimeout | ProxyError::UpstreamTimeout => {
                Some(Cause::Timeout)
            }
            e if e.side() == crate::error::Side::Upstream => Some(Cause::Error),
            ProxyError::NoServer => Some(Cause::Error),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a shared cache must revalidate is never served stale, whatever the response's
    /// `stale-*` windows or the route's `serve_stale_on` allow (RFC 9111 4.2.4; `s-maxage`
    /// implies `proxy-revalidate`, 5.2.2.10).
    #[test]
    fn what_a_shared_cache_must_revalidate_is_never_served_stale() {
        let now = SystemTime::now();
        let later = now + Duration::from_secs(2);
        let request = http::Request::get("/").body(()).unwrap();
        let every = StaleOn {
            error: true,
            timeout: true,
            status_5xx: true,
        };
        for cc in [
            "s-maxage=1",
            "max-age=1, proxy-revalidate",
            "max-age=1, must-revalidate",
            "no-cache",
        ] {
            let cc = format!("{cc}, stale-if-error=60, stale-while-revalidate=60");
            let response = http::Response::builder()
                .header("cache-control", &cc)
                .body(())
                .unwrap();
            let policy = CachePolicy::new(&request, &response);
            let staleness = Staleness::of(&policy, response.headers(), now);
            assert!(!staleness.while_revalidating(later), "{cc}");
            assert!(!staleness.answers(Cause::Error, every, later), "{cc}");
        }
    }
}
