//! Validation of the HTTP cache (issue 27): the stores (`[caches.NAME]`: kind, a disk
//! store's directory, sizes) and a route's `cache = { store, key, status_header }`, whose
//! store must exist.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{FieldPath, Issue};
use crate::model::{CacheKeyPart, CacheKind, CacheStore, Listener, RouteCache, StaleOn};
use crate::raw::{RawCacheStore, RawRouteCache, StrOrInt};

/// Default `max_size` of a store.
const DEFAULT_MAX_SIZE: u64 = 256 << 20;
/// Default `max_object_size`: larger responses stream through uncached.
const DEFAULT_MAX_OBJECT_SIZE: u64 = 8 << 20;

/// Default `sendfile_min_size`: a body this long costs more to copy into the socket than a
/// sendfile(2) call and (a memory store) a file descriptor and a mapping per entry.
const DEFAULT_SENDFILE_MIN_SIZE: u64 = 64 << 10;

/// The default `max_fill_memory` is at most this (a quarter of `max_size` below it).
const FILL_MEMORY_CAP: u64 = 256 << 20;

/// Default `index_size` of a disk store: nginx's `keys_zone` bounds its index the same way.
const DEFAULT_INDEX_SIZE: u64 = 128 << 20;

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
        let store = store(name, raw, &at)?;
        if let Some(other) = out.iter().find(|o: &&CacheStore| shares_dir(o, &store)) {
            return Err(Issue::new(
                &at.key("path"),
                format!("[caches.{}] has this path too", other.name),
                "give each disk store a directory of its own",
            ));
        }
        out.push(store);
    }
    Ok(out)
}

/// Whether two disk stores were given one directory (each would remove the other's files).
fn shares_dir(a: &CacheStore, b: &CacheStore) -> bool {
    match (&a.kind, &b.kind) {
        (CacheKind::Disk { path: p }, CacheKind::Disk { path: q }) => p == q,
        _ => false,
    }
}

fn store(name: String, raw: RawCacheStore, path: &FieldPath) -> Result<CacheStore, Issue> {
    let kind = kind(raw.kind.as_deref(), raw.path, path)?;
    if matches!(kind, CacheKind::Disk { .. }) && raw.max_size.is_none() {
        return Err(Issue::new(
            &path.key("max_size"),
            "a disk cache store has no max_size",
            "add max_size = \"10GiB\" (what the store's files may take together)",
        ));
    }
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
    let sendfile_path = path.key("sendfile_min_size");
    let sendfile_min_size = super::size(
        raw.sendfile_min_size,
        DEFAULT_SENDFILE_MIN_SIZE,
        &sendfile_path,
    )?;
    let max_fill_memory = fill_memory(raw.max_fill_memory, max_size, max_object_size, path)?;
    let index_size = index_size(raw.index_size, &kind, path)?;
    Ok(CacheStore {
        name,
        kind,
        max_size,
        max_object_size,
        sendfile_min_size,
        max_fill_memory,
        index_size,
    })
}

/// `max_fill_memory`: by default a quarter of `max_size` (a memory store's fills add at
/// most that to its entries), at most [`FILL_MEMORY_CAP`] (a disk store's `max_size` is
/// disk, not memory), and never under `max_object_size` (one fill of the largest object
/// always fits).
fn fill_memory(
    raw: Option<StrOrInt>,
    max_size: u64,
    max_object_size: u64,
    path: &FieldPath,
) -> Result<u64, Issue> {
    let at = path.key("max_fill_memory");
    let default = (max_size / 4).min(FILL_MEMORY_CAP).max(max_object_size);
    let value = super::size(raw, default, &at)?;
    if value < max_object_size {
        return Err(Issue::new(
            &at,
            format!("max_fill_memory ({value} bytes) is smaller than max_object_size ({max_object_size} bytes)"),
            "make max_fill_memory at least max_object_size, or leave it out",
        ));
    }
    Ok(value)
}

/// `index_size`: a disk store's (default [`DEFAULT_INDEX_SIZE`]); a memory store has none
/// (its entries' heads and keys count in `max_size`).
fn index_size(raw: Option<StrOrInt>, kind: &CacheKind, path: &FieldPath) -> Result<u64, Issue> {
    let at = path.key("index_size");
    match (kind, raw) {
        (CacheKind::Memory, None) => Ok(u64::MAX),
        (CacheKind::Memory, Some(_)) => Err(Issue::new(
            &at,
            "a memory cache store has no index_size",
            "remove index_size: a memory store counts its keys and heads in max_size",
        )),
        (CacheKind::Disk { .. }, raw_size) => {
            let value = super::size(raw_size, DEFAULT_INDEX_SIZE, &at)?;
            match value {
                0 => Err(Issue::new(
                    &at,
                    "index_size is 0, so nothing could be cached",
                    "set a size such as \"128MiB\"",
                )),
                _ => Ok(value),
            }
        }
    }
}

/// `kind`, and a disk store's `path` (only a disk store has one).
fn kind(kind: Option<&str>, dir: Option<String>, path: &FieldPath) -> Result<CacheKind, Issue> {
    match (kind, dir) {
        (Some("memory"), None) => Ok(CacheKind::Memory),
        (Some("memory"), Some(_)) => Err(Issue::new(
            &path.key("path"),
            "a memory cache store has no path",
            "remove path, or use kind = \"disk\" to keep the entries in files",
        )),
        (Some("disk"), Some(dir)) => Ok(CacheKind::Disk {
            path: disk_path(&dir, &path.key("path"))?,
        }),
        (Some("disk"), None) => Err(Issue::new(
            &path.key("path"),
            "a disk cache store has no path",
            "add path = \"/var/cache/weir/NAME\" (a directory Weir may write, made if missing)",
        )),
        (Some(other), _) => Err(Issue::new(
            &path.key("kind"),
            format!("unknown cache kind \"{other}\""),
            "use kind = \"memory\" or kind = \"disk\"",
        )),
        (None, _) => Err(Issue::new(
            &path.key("kind"),
            "the cache store has no kind",
            "add kind = \"memory\" (or kind = \"disk\" with a path)",
        )),
    }
}

/// A disk store's directory: an existing directory Weir can write in, or one it can make
/// (its nearest existing ancestor is such a directory). Writing is tried, not guessed
/// from the mode bits: a probe file is made and removed.
fn disk_path(text: &str, path: &FieldPath) -> Result<PathBuf, Issue> {
    let dir = PathBuf::from(text.trim());
    if dir.as_os_str().is_empty() {
        return Err(Issue::new(
            path,
            "path is empty",
            "set path = \"/var/cache/weir/NAME\"",
        ));
    }
    use std::io::ErrorKind::{NotADirectory, NotFound};
    let mut existing = dir.as_path();
    let meta = loop {
        match std::fs::metadata(existing) {
            Ok(meta) => break meta,
            Err(e) if matches!(e.kind(), NotFound | NotADirectory) => match existing.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => existing = parent,
                _ => break std::fs::metadata(".").map_err(|e| unusable(&dir, e, path))?,
            },
            Err(e) => return Err(unusable(&dir, e, path)),
        }
    };
    if !meta.is_dir() {
        return Err(Issue::new(
            path,
            format!("{} is not a directory", existing.display()),
            "point path at a directory (or a path under one) for the store's files",
        ));
    }
    let probe = existing.join(format!(".weir-probe-{}", std::process::id()));
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe);
    match made {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(dir)
        }
        Err(e) => Err(unusable(&dir, e, path)),
    }
}

fn unusable(dir: &Path, e: std::io::Error, path: &FieldPath) -> Issue {
    Issue::new(
        path,
        format!("{} cannot hold the cache's files: {e}", dir.display()),
        "point path at a directory Weir may write in, or one it may create",
    )
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
        scope: std::sync::Arc::from(&[][..]),
        rewritten: std::sync::Arc::from(&[][..]),
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
            cache.scope = scope(&listener.name, &route.name);
            let id = listener
                .policy
                .request_id
                .as_ref()
                .map(|r| r.header.as_str());
            cache.rewritten = rewritten(
                route.forwarded_headers,
                route.filters.request_headers.as_ref(),
                id,
            );
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

/// A route's [`RouteCache::rewritten`]: the forwarded headers (when the route sets them),
/// the listener's request-id header, the names the route's `request_headers` rules `set`
/// or `add` with a `{variable}` (a constant, or a `remove`, forwards the same for every
/// client whose own copy is the same, so keying on the client's copy stores nothing that
/// another client would not get), and the trace context (Weir's when a request is sampled).
fn rewritten(
    forwarded: bool,
    rules: Option<&crate::model::HeaderRules>,
    request_id: Option<&str>,
) -> std::sync::Arc<[Box<str>]> {
    let mut names: Vec<&str> = vec!["traceparent", "tracestate"];
    if forwarded {
        names.extend([
            "x-real-ip",
            "x-forwarded-for",
            "x-forwarded-host",
            "x-forwarded-proto",
        ]);
    }
    names.extend(request_id);
    if let Some(rules) = rules {
        let per_request = |r: &&crate::model::HeaderRule| {
            (r.value.0.iter()).any(|p| matches!(p, crate::model::TemplatePart::Var(_)))
        };
        let names_rendered = rules.set.iter().chain(&rules.add).filter(per_request);
        names.extend(names_rendered.map(|r| r.name.as_str()));
    }
    let mut folded: Vec<Box<str>> = names
        .iter()
        .map(|n| {
            n.bytes()
                .map(|b| crate::model::fold_name_byte(b) as char)
                .collect()
        })
        .collect();
    folded.sort();
    folded.dedup();
    folded.into()
}

/// A route's [`RouteCache::scope`]: its listener's name and its own, each after its
/// length (route names are unique within a listener only), so that no two routes' scopes
/// begin alike.
fn scope(listener: &str, route: &str) -> std::sync::Arc<[u8]> {
    let mut out = Vec::with_capacity(8 + listener.len() + route.len());
    for name in [listener, route] {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
    }
    out.into()
}
