//! What the read endpoints return: lists of upstreams and listeners built from the running
//! config and snapshot, single objects as written in the config text, and server health.

use std::time::UNIX_EPOCH;

use serde_json::{json, Value as Json};
use weir_config::UpstreamServer;
use weir_core::upstream::state::{now_ms, ServerState};
use weir_core::Proxy;

use super::convert::config_json;
use super::error::ApiError;

pub fn upstreams(proxy: &Proxy) -> Json {
    let config = proxy.config();
    let list: Vec<Json> = config
        .upstreams
        .iter()
        .map(|u| {
            let servers: Vec<Json> = u
                .servers
                .iter()
                .map(|s| json!({"addr": s.name, "weight": s.weight, "backup": s.backup, "drain": s.drain}))
                .collect();
            json!({"name": u.name, "lb": u.lb.as_str(), "servers": servers})
        })
        .collect();
    json!(list)
}

pub fn listeners(proxy: &Proxy) -> Json {
    let config = proxy.config();
    let list: Vec<Json> = config
        .listeners
        .iter()
        .map(|l| {
            let routes: Vec<&str> = l.routes.iter().map(|r| r.name.as_str()).collect();
            let addr = proxy.listener_addr(&l.name).map(|a| a.to_string());
            json!({"name": l.name, "bind": l.first_addr().to_string(), "addr": addr, "binds": binds(proxy, l), "routes": routes})
        })
        .collect();
    json!(list)
}

/// Every address a listener bound: `{ "addr", "tls" }` (`tls`: the handshake is done
/// there; false on plain listeners and on a TLS listener's `http_bind` addresses).
fn binds(proxy: &Proxy, listener: &weir_config::Listener) -> Json {
    let tls = listener.tls.is_some();
    let list: Vec<Json> = proxy
        .listener_addrs(&listener.name)
        .into_iter()
        .map(|b| json!({"addr": b.addr.to_string(), "tls": tls && !b.plain_http}))
        .collect();
    json!(list)
}

/// Every certificate in use, listener by listener, as the running snapshot loaded it
/// (after any reload or file change): names, subject, issuer, expiry, days left and the
/// SHA-256 fingerprint of the leaf.
pub fn certs(proxy: &Proxy) -> Json {
    let snapshot = proxy.snapshot();
    let now = weir_core::tls::facts::unix_now();
    let mut list = Vec::new();
    for (listener, plan) in snapshot.config.listeners.iter().zip(&snapshot.listeners) {
        let Some(tls) = &plan.tls else { continue };
        let default = tls.store.choose(None);
        for (i, cert) in tls.store.certs().iter().enumerate() {
            let f = &cert.facts;
            list.push(json!({
                "listener": listener.name,
                "file": cert.file.display().to_string(),
                "names": f.names,
                "subject": f.subject,
                "issuer": f.issuer,
                "not_after": weir_core::tls::facts::format_utc(f.not_after),
                "not_after_unix": f.not_after,
                "days_left": (f.not_after - now).div_euclid(86_400),
                "sha256": f.sha256,
                "default": i == default,
                "source": "file",
            }));
        }
        if let Some(auto) = tls.store.auto() {
            list.push(auto_cert(&listener.name, auto, now));
        }
    }
    json!(list)
}

/// An automatic certificate (ACME or internal CA): the one in use, if any yet, with its
/// renewal time, the next retry and the last error.
fn auto_cert(listener: &str, auto: &weir_core::tls::auto::AutoCerts, now: i64) -> Json {
    use weir_core::tls::facts::format_utc;
    let status = auto.status();
    let current = auto.current();
    let f = current.as_ref().map(|c| &c.facts);
    json!({
        "listener": listener,
        "source": auto.source.label(),
        "file": current.as_ref().map(|c| c.file.display().to_string()),
        "names": f.map_or_else(|| auto.names.clone(), |f| f.names.clone()),
        "subject": f.map(|f| f.subject.clone()),
        "issuer": f.map(|f| f.issuer.clone()),
        "not_after": f.map(|f| format_utc(f.not_after)),
        "not_after_unix": f.map(|f| f.not_after),
        "days_left": f.map(|f| (f.not_after - now).div_euclid(86_400)),
        "sha256": f.map(|f| f.sha256.clone()),
        "renew_at": status.renew_at.map(format_utc),
        "retry_at": status.retry_at.map(format_utc),
        "last_error": status.last_error,
        "storage": auto.storage.display().to_string(),
        "default": false,
    })
}

/// `upstreams.NAME` as written in the config text.
pub fn upstream(text: &str, name: &str) -> Result<Json, ApiError> {
    config_json(text)["upstreams"]
        .get(name)
        .cloned()
        .ok_or_else(|| {
            ApiError::not_found(
                &format!("upstream {name}"),
                "GET /api/v1/upstreams lists them",
            )
        })
}

/// The listener `name` as written in the config text.
pub fn listener(text: &str, name: &str) -> Result<Json, ApiError> {
    named(&config_json(text)["listeners"], name).ok_or_else(|| {
        ApiError::not_found(
            &format!("listener {name}"),
            "GET /api/v1/listeners lists them",
        )
    })
}

pub fn route(text: &str, listener_name: &str, name: &str) -> Result<Json, ApiError> {
    let l = listener(text, listener_name)?;
    named(&l["routes"], name).ok_or_else(|| {
        ApiError::not_found(
            &format!("route {name} of listener {listener_name}"),
            "GET /api/v1/listeners/{name} lists its routes",
        )
    })
}

fn named(list: &Json, name: &str) -> Option<Json> {
    list.as_array()?.iter().find(|i| i["name"] == name).cloned()
}

/// A server's state: `draining` (set so), `down` (its active check fails), `ejected`
/// (passive checks took it out for a while) or `up`.
pub fn server_state(server: &UpstreamServer, state: &ServerState, now_ms: u64) -> &'static str {
    match () {
        _ if server.drain => "draining",
        _ if !state.up.load(std::sync::atomic::Ordering::Relaxed) => "down",
        _ if state.ejected_for(now_ms).is_some() => "ejected",
        _ => "up",
    }
}

/// Each server's state ([`server_state`]), up (active checks), ejected (passive), the last
/// check.
pub fn health(proxy: &Proxy, name: &str) -> Result<Json, ApiError> {
    let snapshot = proxy.snapshot();
    let Some(index) = snapshot
        .config
        .upstreams
        .iter()
        .position(|u| u.name == name)
    else {
        return Err(ApiError::not_found(
            &format!("upstream {name}"),
            "GET /api/v1/upstreams lists them",
        ));
    };
    let upstream = &snapshot.config.upstreams[index];
    let plan = &snapshot.upstreams[index];
    let now = now_ms();
    let servers: Vec<Json> = upstream
        .servers
        .iter()
        .zip(plan.servers.iter())
        .map(|(s, state)| {
            let up = state.up.load(std::sync::atomic::Ordering::Relaxed);
            let ejected = state.ejected_for(now);
            let last = state
                .last_check
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let last_check = last.map(|c| {
                let at = c.at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
                json!({"at": at, "ok": c.failure.is_none(), "reason": c.failure})
            });
            json!({
                "addr": s.name,
                "state": server_state(s, state, now),
                "up": up,
                "ejected_for_ms": ejected.map(|d| d.as_millis() as u64),
                "checked": upstream.health_check.is_some(),
                "last_check": last_check,
            })
        })
        .collect();
    Ok(json!({"upstream": name, "servers": servers}))
}
