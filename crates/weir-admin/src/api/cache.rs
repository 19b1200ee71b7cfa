//! The HTTP cache's endpoints: `GET /caches` (each store's size and counts) and
//! `POST /caches/purge` (entries removed by exact key or by key prefix). Keys are what a
//! route's `cache.key` makes of a request: `scheme://host/path?query` by default, so a
//! purge names the URL.

use std::sync::atomic::Ordering::Relaxed;

use serde_json::{json, Value as Json};
use weir_core::cache::Store;
use weir_core::Proxy;

use super::convert::Format;
use super::error::ApiError;

/// `GET /caches`: every store, with its settings, size and counts.
pub fn stores(proxy: &Proxy) -> Json {
    let snapshot = proxy.snapshot();
    Json::Array(snapshot.caches.iter().map(|s| store(s)).collect())
}

fn store(s: &Store) -> Json {
    let c = &s.counts;
    let path = match &s.config.kind {
        weir_config::CacheKind::Disk { path } => Some(path.display().to_string()),
        weir_config::CacheKind::Memory => None,
    };
    json!({
        "name": s.config.name,
        "kind": s.config.kind.name(),
        "path": path,
        "loading": s.loading(),
        "max_size": s.max_size(),
        "max_object_size": s.max_object_size(),
        "bytes": c.bytes.load(Relaxed),
        "entries": c.entries.load(Relaxed),
        "hits": c.hits.load(Relaxed),
        "misses": c.misses.load(Relaxed),
        "revalidations": c.revalidations.load(Relaxed),
        "collapsed_waits": c.collapsed.load(Relaxed),
        "stale": c.stale.load(Relaxed),
        "bypasses": c.bypasses.load(Relaxed),
        "stored": c.stores.load(Relaxed),
        "evictions": c.evictions.load(Relaxed),
        "errors": c.errors.load(Relaxed),
    })
}

/// `POST /caches/purge` with `{"url": "..."}` (that key) or `{"prefix": "..."}` (every key
/// starting with it), and optionally `"store": "NAME"` (default: every store). Returns
/// how many keys went (all their variants with them). A TOML body is a 415 (JSON only).
pub(super) fn purge(proxy: &Proxy, call: &super::Call) -> Result<Json, ApiError> {
    if call.format == Format::Toml {
        return Err(super::guard::unsupported(
            "application/toml (purge takes JSON)",
        ));
    }
    let fix = r#"send {"url": "http://host/path?query"} or {"prefix": "http://host/dir/"}, optionally with "store": "NAME""#;
    let request: Json = serde_json::from_slice(&call.body)
        .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}"), fix))?;
    let (key, prefix) = match (request["url"].as_str(), request["prefix"].as_str()) {
        (Some(url), None) => (url, false),
        (None, Some(prefix)) if !prefix.is_empty() => (prefix, true),
        _ => {
            return Err(ApiError::bad_request(
                "name either a url or a non-empty prefix",
                fix,
            ))
        }
    };
    let snapshot = proxy.snapshot();
    let name = request["store"].as_str();
    let chosen: Vec<_> = (snapshot.caches.iter())
        .filter(|s| name.is_none_or(|n| s.config.name == n))
        .collect();
    if let (Some(name), true) = (name, chosen.is_empty()) {
        let known: Vec<&str> = snapshot
            .caches
            .iter()
            .map(|s| s.config.name.as_str())
            .collect();
        return Err(ApiError::bad_request(
            format!("no cache store {name:?}"),
            format!("use one of: {}", known.join(", ")),
        )
        .field("store"));
    }
    let purged: u64 = chosen.iter().map(|s| s.purge(key.as_bytes(), prefix)).sum();
    tracing::info!(key, prefix, purged, "cache purge");
    Ok(json!({ "purged": purged }))
}
