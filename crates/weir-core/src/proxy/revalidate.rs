//! A stale cache entry's revalidation in the background (`stale-while-revalidate`, RFC
//! 5861): the request that found the entry is answered from it at once
//! (`cache::Lookup::Stale`), and one exchange with no client attached asks the upstream
//! again (`StreamRequest::fetch_for_store`, over HTTP/1.1 or HTTP/2 as an HTTP/1.x
//! client's request would go: the entry's conditional request, a `304` refreshing it or a
//! new response stored). It is a task of the worker, made from a copy of the request's
//! head and who sent it, on the snapshot the request was routed on; it holds the key's fetch ([`Fill`] leading: at most one per key, other misses of the key
//! wait for it as for any fetch) and its tries are the driver's, under the upstream's
//! limits (`max_connections`, health, retries), counted as any try is.
//!
//! Bounded, since no client waits for it and it holds its key and its snapshot: the whole
//! fetch (its body included) ends within the upstream's `response_timeout` (which alone
//! bounds each read), its relay stops as soon as the body is over `max_object_size`, a
//! worker runs at most `[server] background_revalidations` at a time (past them the
//! request is answered stale and starts nothing: the entry is revalidated by a later
//! request), and they are aborted when the worker drains.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

use crate::cache::Fill;
use crate::http2::exchange::StreamRequest;
use crate::http2::interim::Relayed;
use crate::request::{Origin, Request};
use crate::router::RoutedPath;
use crate::snapshot::Snapshot;

use super::route::Routing;

/// Starts the revalidation `fill` of the stale entry `r` was answered from (`r` routed by
/// `routing` to `route` and `upstream`) as a task of this worker, which keeps a copy of
/// the request's head and who sent it. Nothing is started when the worker's snapshot is no
/// longer the one `r` was routed on (the entry is revalidated by a later request), nor when
/// the worker drains or runs `[server] background_revalidations` already (the fill is let
/// go).
pub(crate) fn start(
    routing: &Routing<'_>,
    r: &Request<'_>,
    route: usize,
    upstream: usize,
    fill: Box<Fill>,
) {
    let Some(worker) = routing.worker.me.upgrade() else {
        return;
    };
    let snapshot = Arc::clone(&worker.snapshot());
    if !std::ptr::eq::<Snapshot>(&*snapshot, routing.snapshot) || worker.is_draining() {
        return;
    }
    let mut running = worker.revalidations.borrow_mut();
    while running.try_join_next().is_some() {}
    if running.len() >= snapshot.config.server.background_revalidations {
        return;
    }
    let (origin, listener, protocol) = (&r.origin, routing.listener, r.protocol);
    let head = r.buf[..r.req.head_len].to_vec();
    let mut req = r.req.clone();
    // The entry's own validators make the request conditional, not the client's.
    req.headers
        .retain(|h| !crate::cache::is_condition(&head[h.name.clone()]));
    let (peer, peer_ip, tls) = (*origin.peer, origin.peer_ip, origin.tls.cloned());
    let behind = origin.behind.map(|(ip, text)| (ip, *text));
    let request_id = origin.request_id.to_vec();
    let owner = worker.clone();
    running.spawn_local(async move {
        let routing = Routing {
            worker: &owner,
            snapshot: &snapshot,
            listener,
        };
        let listener = routing.listener();
        let target = routing.target(&listener.routes[route], upstream);
        let mut path = RoutedPath::default();
        let Ok(_) = path.normalize(req.path(&head), &listener.path_normalization) else {
            return;
        };
        let origin = Origin {
            peer: &peer,
            peer_ip,
            behind: behind.as_ref().map(|(ip, text)| (*ip, text)),
            tls: tls.as_ref(),
            request_id: &request_id,
        };
        fill.count_revalidation();
        let spare = Cell::new(http::HeaderMap::new());
        let r = StreamRequest {
            worker: &owner,
            target,
            request: Request {
                buf: &head,
                req: &req,
                origin,
                started: Instant::now(),
                protocol,
                trace: None,
            },
            path: &path,
            spare: &spare,
            relayed: Relayed::default(),
            fill: Cell::new(Some(fill)),
            response_lines: Cell::default(),
        };
        let deadline = r.target.upstream.response_timeout;
        if tokio::time::timeout(deadline, r.fetch_for_store())
            .await
            .is_err()
        {
            tracing::debug!(
                "cache: background revalidation cut at the upstream's response_timeout"
            );
        }
    });
}
