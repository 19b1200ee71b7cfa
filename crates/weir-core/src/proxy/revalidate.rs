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
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use crate::cache::Fill;
use crate::codec::http1::RequestHead;
use crate::filters::forwarded::ClientIp;
use crate::http2::exchange::StreamRequest;
use crate::http2::interim::Relayed;
use crate::metrics::shard::Protocol;
use crate::request::{Origin, Request};
use crate::router::RoutedPath;
use crate::snapshot::Snapshot;
use crate::tls::session::TlsSession;
use crate::worker::Worker;

use super::route::Routing;

/// What a background revalidation keeps of the request that started it.
struct Job {
    snapshot: Arc<Snapshot>,
    listener: usize,
    /// The route's position in the listener's `routes`; its upstream's in the config's.
    route: usize,
    upstream: usize,
    /// The request's head (its bytes and the spans into them).
    head: Vec<u8>,
    req: RequestHead,
    peer: ClientIp,
    peer_ip: IpAddr,
    behind: Option<(IpAddr, ClientIp)>,
    tls: Option<TlsSession>,
    request_id: Vec<u8>,
    protocol: Protocol,
    fill: Box<Fill>,
}

/// Starts the revalidation `fill` of the stale entry `r` was answered from (`r` routed by
/// `routing` to `route` and `upstream`) as a task of this worker. Nothing is
/// started when the worker's snapshot is no longer the one `r` was routed on (the entry is
/// revalidated by a later request), nor when the worker drains or runs
/// `[server] background_revalidations` already (the fill is let go).
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
    let origin = &r.origin;
    let head = r.buf[..r.req.head_len].to_vec();
    let mut req = r.req.clone();
    // The entry's own validators make the request conditional, not the client's.
    req.headers
        .retain(|h| !crate::cache::is_condition(&head[h.name.clone()]));
    let job = Job {
        snapshot,
        listener: routing.listener,
        route,
        upstream,
        head,
        req,
        peer: *origin.peer,
        peer_ip: origin.peer_ip,
        behind: origin.behind.map(|(ip, text)| (ip, *text)),
        tls: origin.tls.cloned(),
        request_id: origin.request_id.to_vec(),
        protocol: r.protocol,
        fill,
    };
    running.spawn_local(run(worker.clone(), job));
}

/// The revalidation's exchange.
async fn run(worker: Rc<Worker>, job: Job) {
    let routing = Routing {
        worker: &worker,
        snapshot: &job.snapshot,
        listener: job.listener,
    };
    let listener = routing.listener();
    let target = routing.target(&listener.routes[job.route], job.upstream);
    let mut path = RoutedPath::default();
    let raw_path = job.req.path(&job.head);
    let Ok(_) = path.normalize(raw_path, &listener.path_normalization) else {
        return;
    };
    let origin = Origin {
        peer: &job.peer,
        peer_ip: job.peer_ip,
        behind: job.behind.as_ref().map(|(ip, text)| (*ip, text)),
        tls: job.tls.as_ref(),
        request_id: &job.request_id,
    };
    job.fill.count_revalidation();
    let spare = Cell::new(http::HeaderMap::new());
    let r = StreamRequest {
        worker: &worker,
        target,
        request: Request {
            buf: &job.head,
            req: &job.req,
            origin,
            started: Instant::now(),
            protocol: job.protocol,
            trace: None,
        },
        path: &path,
        spare: &spare,
        relayed: Relayed::default(),
        fill: Cell::new(Some(job.fill)),
        response_lines: Cell::default(),
    };
    let deadline = r.target.upstream.response_timeout;
    if tokio::time::timeout(deadline, r.fetch_for_store())
        .await
        .is_err()
    {
        tracing::debug!("cache: background revalidation cut at the upstream's response_timeout");
    }
}
