//! The object API under `/api/v1`: read and change the running config, object by object.
//!
//! Reads come from the running snapshot and config text; every write goes through
//! [`Store`] (validate like the file, apply, persist). Responses are JSON; errors carry the
//! field and the fix. The version of the running config is in every response's `ETag`, and
//! a write with `If-Match` fails with 409 when the config has moved on since.
//!
//! The token is checked and the body read on the admin thread; the rest of a request runs
//! on tokio's blocking pool, because validation resolves server names, a write applies and
//! persists, and a read waits for a write in progress (the store's lock). The admin thread
//! stays free for `/live`, `/ready` and `/metrics` meanwhile.

pub(crate) mod auth;
mod cache;
pub(crate) mod convert;
mod edit;
pub mod error;
pub(crate) mod guard;
pub(crate) mod views;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE, ETAG, IF_MATCH};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value as Json};

use crate::store::{Applied, Origin, Store, WriteMode};
use convert::Format;
use error::ApiError;

/// The largest request body accepted (a whole config fits many times over).
pub const MAX_BODY: usize = 1 << 20;

/// Serves one `/api/v1/...` request from `peer`; its body must arrive within
/// `body_timeout` (408). `busy` marks the connection as handling it once the body has
/// arrived, and says `None` when the API's share of the admin connections is taken: 503.
pub async fn handle<B: Send + 'static>(
    req: Request<Incoming>,
    store: Arc<Store>,
    peer: SocketAddr,
    body_timeout: Duration,
    busy: impl FnOnce() -> Option<B>,
) -> Response<Full<Bytes>> {
    match serve(req, store, peer, body_timeout, busy).await {
        Ok(response) => response,
        Err(e) => json_response(e.status, &e.to_json(), None),
    }
}

async fn serve<B: Send + 'static>(
    req: Request<Incoming>,
    store: Arc<Store>,
    peer: SocketAddr,
    body_timeout: Duration,
    busy: impl FnOnce() -> Option<B>,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let write = req.method() != Method::GET && req.method() != Method::HEAD;
    let admin = &store.proxy().config().admin;
    auth::check(admin, &store.token, req.headers(), write).await?;
    let empty_body = hyper::body::Body::is_end_stream(req.body());
    guard::content_type(req.method(), req.headers(), empty_body)?;
    let by = match admin.token_file {
        Some(_) => format!("api {peer} with token"),
        None => format!("api {peer}"),
    };
    let call = tokio::time::timeout(body_timeout, read_call(req, by))
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!("the request body did not arrive within {body_timeout:?}"),
                "send the whole body at once; [admin] header_timeout sets the limit",
            )
        })??;
    // Held by the blocking task itself: a client that hangs up drops this future, not
    // the work, which must keep its share until it ends.
    let busy = busy().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many admin API requests are in progress",
            "retry shortly; at most three quarters of [admin] max_connections handle API requests at once",
        )
    })?;
    tokio::task::spawn_blocking(move || {
        let _busy = busy;
        route(call, &store)
    })
    .await
    .map_err(|e| {
        tracing::error!(error = %e, "admin API handler failed");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the request failed inside weir",
            "see weir's log; the running config is unchanged unless a GET shows otherwise",
        )
    })?
}

/// A request reduced to what the handlers need, body read and size-checked.
struct Call {
    method: Method,
    segments: Vec<String>,
    /// The query string, as sent.
    query: String,
    mode: WriteMode,
    origin: Origin,
    format: Format,
    wants_toml: bool,
    body: Bytes,
}

/// Runs a request (blocking: see the module doc).
fn route(call: Call, store: &Store) -> Result<Response<Full<Bytes>>, ApiError> {
    let segs: Vec<&str> = call.segments.iter().map(String::as_str).collect();
    let (version, text) = store.current();
    let read = |value: Json| {
        Ok(json_response(
            StatusCode::OK,
            &json!({"version": version, "data": value}),
            Some(version),
        ))
    };
    match (&call.method, segs.as_slice()) {
        (&Method::GET, ["config"]) if call.wants_toml => Ok(toml_response(version, text)),
        (&Method::GET, ["config"]) => read(convert::config_json(&text)),
        (&Method::PUT, ["config"]) => {
            let text = convert::body_config_text(&call.body, call.format)?;
            written(store.replace(text, call.mode, &call.origin), call.mode)
        }
        (&Method::GET, ["history"]) => read(Json::Array(
            store.history().iter().map(|v| v.to_json()).collect(),
        )),
        (&Method::GET, ["stats"]) => read(stats(store, &call.query)?),
        (&Method::GET, ["caches"]) => read(cache::stores(store.proxy())),
        (&Method::POST, ["caches", "purge"]) => read(cache::purge(store.proxy(), &call)?),
        (&Method::GET, ["upstreams"]) => read(views::upstreams(store.proxy())),
        (&Method::GET, ["upstreams", name]) => read(views::upstream(&text, name)?),
        (&Method::GET, ["upstreams", name, "health"]) => read(views::health(store.proxy(), name)?),
        (&Method::PUT, ["upstreams", name]) => {
            let body = convert::body_table(&call.body, call.format)?;
            written(
                store.edit(call.mode, &call.origin, |doc| {
                    edit::put_upstream(doc, name, body.clone())
                }),
                call.mode,
            )
        }
        (&Method::DELETE, ["upstreams", name]) => written(
            store.edit(call.mode, &call.origin, |doc| {
                edit::delete_upstream(doc, name)
            }),
            call.mode,
        ),
        (method @ (&Method::PUT | &Method::PATCH), ["upstreams", name, "servers", addr]) => {
            let body = optional_table(&call)?;
            let how = if method == Method::PUT {
                edit::ServerEdit::AddOrChange
            } else {
                edit::ServerEdit::ChangeOnly
            };
            written(
                store.edit(call.mode, &call.origin, |doc| {
                    edit::put_server(doc, name, addr, &body, how)
                }),
                call.mode,
            )
        }
        (&Method::DELETE, ["upstreams", name, "servers", addr]) => written(
            store.edit(call.mode, &call.origin, |doc| {
                edit::delete_server(doc, name, addr)
            }),
            call.mode,
        ),
        (&Method::GET, ["listeners"]) => read(views::listeners(store.proxy())),
        (&Method::GET, ["certs"]) => read(views::certs(store.proxy())),
        (&Method::GET, ["listeners", name]) => read(views::listener(&text, name)?),
        (&Method::PUT, ["listeners", name]) => {
            let body = convert::body_table(&call.body, call.format)?;
            written(
                store.edit(call.mode, &call.origin, |doc| {
                    edit::put_listener(doc, name, body.clone())
                }),
                call.mode,
            )
        }
        (&Method::DELETE, ["listeners", name]) => written(
            store.edit(call.mode, &call.origin, |doc| {
                edit::delete_listener(doc, name)
            }),
            call.mode,
        ),
        (&Method::GET, ["listeners", l, "routes", r]) => read(views::route(&text, l, r)?),
        (&Method::PUT, ["listeners", l, "routes", r]) => {
            let body = convert::body_table(&call.body, call.format)?;
            written(
                store.edit(call.mode, &call.origin, |doc| {
                    edit::put_route(doc, l, r, body.clone())
                }),
                call.mode,
            )
        }
        (&Method::DELETE, ["listeners", l, "routes", r]) => written(
            store.edit(call.mode, &call.origin, |doc| edit::delete_route(doc, l, r)),
            call.mode,
        ),
        _ => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "no such endpoint: {} /api/v1/{}",
                call.method,
                call.segments.join("/")
            ),
            "see docs/operations.md for the endpoints",
        )),
    }
}

/// `GET /stats?since=SEQ` (see `crate::stats`).
fn stats(store: &Store, query: &str) -> Result<Json, ApiError> {
    let since = match query.split('&').find_map(|p| p.strip_prefix("since=")) {
        None => 0,
        Some(v) => v.parse().map_err(|_| {
            ApiError::bad_request(
                format!("since={v} is not a sample number"),
                "send the seq of the last stats response, or leave since out",
            )
            .field("since")
        })?,
    };
    store.stats.to_json(store.proxy(), since).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "the dashboard is off",
            "set [admin] dashboard = true (the default) to sample the metrics for it",
        )
    })
}

/// The token check for reads outside `/api` (`/metrics`).
pub async fn check_read(store: &Store, headers: &hyper::HeaderMap) -> Result<(), ApiError> {
    auth::check(&store.proxy().config().admin, &store.token, headers, false).await
}

/// `by` says who sends the request, for the change log.
async fn read_call(req: Request<Incoming>, by: String) -> Result<Call, ApiError> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().strip_prefix("/api/v1").unwrap_or("");
    let segments = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let query = parts.uri.query().unwrap_or("");
    let dry_run = query
        .split('&')
        .any(|p| p == "dry_run=true" || p == "dry_run=1");
    // `PUT /config?source=NAME`: errors in the body are reported as in NAME.
    let source = query
        .split('&')
        .find_map(|p| p.strip_prefix("source="))
        .map(percent_decode)
        .filter(|s| !s.is_empty());
    let header = |name| {
        parts
            .headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let expect = match header(IF_MATCH) {
        None => None,
        Some(v) => Some(v.trim().trim_matches('"').parse::<u64>().map_err(|_| {
            ApiError::bad_request(
                format!("If-Match {v:?} is not a config version"),
                "send the number from the ETag of a GET",
            )
            .field("If-Match")
        })?),
    };
    let format = Format::of_content_type(header(CONTENT_TYPE));
    let wants_toml = header(ACCEPT).is_some_and(|a| a.contains("toml"));
    // A read takes no body: one sent with it is left unread (hyper then closes the
    // connection after the response), so it cannot keep the connection.
    let body = match parts.method {
        Method::GET | Method::HEAD => Bytes::new(),
        _ => read_body(body).await?,
    };
    Ok(Call {
        query: query.to_string(),
        method: parts.method,
        segments,
        mode: WriteMode { expect, dry_run },
        origin: Origin { by, source },
        format,
        wants_toml,
        body,
    })
}

/// A write's body, at most [`MAX_BODY`] bytes.
async fn read_body(body: Incoming) -> Result<Bytes, ApiError> {
    let body = Limited::new(body, MAX_BODY).collect().await.map_err(|_| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is over {MAX_BODY} bytes (or could not be read)"),
            "send a smaller body",
        )
    })?;
    Ok(body.to_bytes())
}

/// A server's settings body, which may be empty (add with defaults).
fn optional_table(call: &Call) -> Result<toml_edit::Table, ApiError> {
    if call.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(toml_edit::Table::new());
    }
    convert::body_table(&call.body, call.format)
}

fn written(
    result: Result<Applied, ApiError>,
    mode: WriteMode,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let applied = result?;
    let changes: Vec<String> = applied.changes.iter().map(ToString::to_string).collect();
    let mut body = json!({"version": applied.version, "dry_run": mode.dry_run, "changes": changes});
    if mode.dry_run {
        body["fields"] = crate::store::fields_json(&applied.fields);
    }
    Ok(json_response(StatusCode::OK, &body, Some(applied.version)))
}

fn json_response(status: StatusCode, body: &Json, version: Option<u64>) -> Response<Full<Bytes>> {
    let mut text = body.to_string();
    text.push('\n');
    let mut response = Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(v) = version {
        set_etag(&mut response, v);
    }
    response
}

fn toml_response(version: u64, text: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text)));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/toml"));
    set_etag(&mut response, version);
    response
}

fn set_etag(response: &mut Response<Full<Bytes>>, version: u64) {
    if let Ok(v) = HeaderValue::from_str(&format!("\"{version}\"")) {
        response.headers_mut().insert(ETAG, v);
    }
}

/// Decodes `%XX` escapes (an IPv6 server address arrives as `%5B::1%5D:80`).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::percent_decode;

    #[test]
    fn decodes_escapes_and_keeps_the_rest() {
        assert_eq!(percent_decode("%5B%3A%3A1%5D:80"), "[::1]:80");
        assert_eq!(percent_decode("127.0.0.1:80"), "127.0.0.1:80");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
