//! Validation of the HTTP cache (issue 27): the stores (`[caches.NAME]`: kind and sizes)
//! and a route's `cache = { store, key, status_header }`, whose store must exist.

use std::collections::BTreeMap;

use crate::error::{FieldPath, Issue};
use crate::model::{CacheKeyPart, CacheKind, CacheStore, Listener, RouteCache, StaleOn};
use crate::raw::{RawCacheStore, RawRouteCache};

/// Default `max_size` of a store.
const DEFAULT_MAX_SIZE: u64 = 256 << 20;
/// Default `max_object_size`: larger responses stream through uncached.
const DEFAULT_MAX_OBJECT_SIZE: u64 = 8 << 20;

/// Default `lock_timeout`: nginx's `proxy_cache_lock_timeout`.
const DEFAULT_LOCK_TIMEOUT: &str = "5s";

/// The `[caches.NAME]` tables, sorted by name.
pub(super) fn stores(
    raw: Option<BTreeMap<String, RawCacheStore>>,
    path: &FieldPath,
) -> Result<Vec<CacheStore>, Issue> {
    let mut out = Vec::new();
    for (name, raw) in raw.unwrap_or_default() {
        let at = path.key(&name);
        super::check_name(&name, &at, "cache store")?;
        out.push(store(name, raw, &at)?);
    }
    Ok(out)
}

fn store(name: String, raw: RawCacheStore, path: &FieldPath) -> Result<CacheStore, Issue> {
    let kind = match raw.kind.as_deref() {
        Some("memory") => CacheKind::Memory,
        Some(other) => {
            return Err(Issue::new(
                &path.key("kind"),
                format!("unknown cache kind \"{other}\""),
                "use kind = \"memory\"",
            ))
        }
        None => {
            return Err(Issue::new(
                &path.key("kind"),
                "the cache store has no kind",
                "add kind = \"memory\"",
            ))
        }
    };
    let max_size = super::size(raw.max_size, DEFAULT_MAX_SIZE, &path.key("max_size"))?;
    let object_path = path.key("max_object_size");
    let default_object = DEFAULT_MAX_OBJECT_SIZE.min(max_size);
    let max_object_size = super::size(raw.max_object_size, default_object, &object_path)?;
    if max_size == 0 {
        return Err(Issue::new(
            &path.key("max_size"),
            "max_size is 0, so nothing could be cached",
            "set a size such as \"256MiB\"",
        ));
    }
    if max_object_size > max_size {
        return Err(Issue::new(
            &object_path,
            format!("max_object_size ({max_object_size} bytes) is larger than max_size ({max_size} bytes)"),
            "make max_object_size at most max_size",
        ));
    }
    Ok(CacheStore {
        name,
        kind,
        max_size,
        max_object_size,
    })
}

/// A route's `cache`; its store is resolved by [`resolve_refs`] once the stores are read.
pub(super) fn route_cache(raw: RawRouteCache, path: &FieldPath) -> Result<RouteCache, Issue> {
    let store_name = raw.store.ok_or_else(|| {
        Issue::new(
            &path.key("store"),
            "the route's cache names no store",
            "add store = \"NAME\" and define [caches.NAME] with kind = \"memory\"",
        )
    })?;
    Ok(RouteCache {
        store_name,
        store: usize::MAX,
        key: key(raw.key, &path.key("key"))?,
        status_header: raw.status_header.unwrap_or(true),
        lock_timeout: super::duration(
            raw.lock_timeout,
            DEFAULT_LOCK_TIMEOUT,
            &path.key("lock_timeout"),
            false,
        )?,
        serve_stale_on: stale_on(raw.serve_stale_on, &path.key("serve_stale_on"))?,
    })
}

/// `serve_stale_on`: `"error"`, `"timeout"`, `"5xx"`, each at most once; default none.
fn stale_on(raw: Option<Vec<String>>, path: &FieldPath) -> Result<StaleOn, Issue> {
    let mut out = StaleOn::default();
    for (i, text) in raw.unwrap_or_default().iter().enumerate() {
        let flag = match text.as_str() {
            "error" => &mut out.error,
            "timeout" => &mut out.timeout,
            "5xx" => &mut out.status_5xx,
            _ => {
                return Err(Issue::new(
                    &path.index(i),
                    format!("\"{text}\" is not a failure a stale entry can answer for"),
                    "use any of \"error\", \"timeout\", \"5xx\"",
                ))
            }
        };
        *flag = true;
    }
    Ok(out)
}

/// `key`: parts from [`CacheKeyPart::ALL`], once each; default scheme, host, path, query.
fn key(raw: Option<Vec<String>>, path: &FieldPath) -> Result<Vec<CacheKeyPart>, Issue> {
    use CacheKeyPart::*;
    let Some(raw) = raw else {
        return Ok(vec![Scheme, Host, Path, Query]);
    };
    let names: Vec<&str> = CacheKeyPart::ALL.iter().map(|p| p.name()).collect();
    let mut out = Vec::with_capacity(raw.len());
    for (i, text) in raw.iter().enumerate() {
        let at = path.index(i);
        let part = CacheKeyPart::ALL.into_iter().find(|p| p.name() == text);
        let Some(part) = part.filter(|p| !out.contains(p)) else {
            return Err(Issue::new(
                &at,
                format!("\"{text}\" is not a cache key part, or is listed twice"),
                format!("list each of {} at most once", names.join(", ")),
            ));
        };
        out.push(part);
    }
    if !out.contains(&Path) {
        return Err(Issue::new(
            path,
            "the cache key has no \"path\", so every path would share one entry",
            "include \"path\" in key, or leave key out for scheme, host, path and query",
        ));
    }
    Ok(out)
}

/// Points every route's cache at its store; a store that does not exist is an error.
pub(super) fn resolve_refs(
    listeners: &mut [Listener],
    stores: &[CacheStore],
    path: &FieldPath,
) -> Result<(), Issue> {
    for (li, listener) in listeners.iter_mut().enumerate() {
        for (ri, route) in listener.routes.iter_mut().enumerate() {
            let Some(cache) = &mut route.filters.cache else {
                continue;
            };
            let found = stores.iter().position(|s| s.name == cache.store_name);
            cache.store = found.ok_or_else(|| {
                let at = path.index(li).key("routes").index(ri).key("cache");
                let known: Vec<&str> = stores.iter().map(|s| s.name.as_str()).collect();
                let fix = match known.is_empty() {
                    true => format!(
                        "add [caches.{}] with kind = \"memory\" and max_size = \"256MiB\"",
                        cache.store_name
                    ),
                    false => format!("use one of: {}", known.join(", ")),
                };
                Issue::new(
                    &at.key("store"),
                    format!("no [caches.{}] table", cache.store_name),
                    fix,
                )
            })?;
        }
    }
    Ok(())
}
