//! Active health checks: one thread for the whole process (not one per worker), with its
//! own single-threaded runtime and one task per checked server.
//!
//! Each task probes its server every `interval` (the first probe right away), counts
//! results with [`RiseFall`], and on a transition stores the verdict in the server's
//! shared [`ServerState`] (a relaxed atomic store every worker sees on its next pick) and
//! logs it with the reason. Servers start up; a server goes down after `fall` failed
//! checks in a row and comes back after `rise` successful ones, with slow start.
//!
//! The tasks follow the published snapshot: when its generation changes (a reload, or
//! the admin API replacing an upstream), the tasks are restarted for the new pool plans,
//! whose server states carry over the verdicts of servers that stayed.

pub mod counter;
mod grpc;
pub mod probe;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;
use weir_config::{HealthCheck, UpstreamServer};

pub use counter::RiseFall;

use super::state::{now_ms, Passive, ServerState};
use crate::connector::TlsUpstream;
use crate::worker::Shared;

/// How often the health thread looks for a new snapshot.
const SNAPSHOT_POLL: Duration = Duration::from_millis(200);

/// Starts the health-check thread; it ends when `shared.shutdown` turns true.
pub fn spawn(shared: Arc<Shared>) -> std::io::Result<JoinHandle<()>> {
    crate::server::spawn_with_runtime("weir-health", move || supervise(shared))
}

/// Runs the checks of the current snapshot until shutdown, restarting them on a new one.
async fn supervise(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        let generation = shared.generation.load(Ordering::Acquire);
        let mut tasks = spawn_checks(&shared);
        loop {
            if *shutdown.borrow_and_update() {
                return;
            }
            tokio::select! {
                changed = shutdown.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(SNAPSHOT_POLL) => {}
            }
            if shared.generation.load(Ordering::Acquire) != generation {
                break;
            }
        }
        tasks.abort_all();
    }
}

/// One task per server of every upstream that has a health check.
fn spawn_checks(shared: &Shared) -> JoinSet<()> {
    let snapshot = shared.snapshot.load_full();
    let mut tasks = JoinSet::new();
    for (upstream, plan) in snapshot.config.upstreams.iter().zip(&snapshot.upstreams) {
        let Some(check) = &upstream.health_check else {
            continue;
        };
        for (server, state) in upstream.servers.iter().zip(plan.servers.iter()) {
            tasks.spawn(check_server(Target {
                check: check.clone(),
                upstream: upstream.name.clone(),
                server: server.clone(),
                state: state.clone(),
                passive: plan.passive,
                tls: plan.tls.clone(),
                http2: matches!(
                    upstream.protocol,
                    weir_config::UpstreamProtocol::H2 | weir_config::UpstreamProtocol::H2c
                ),
            }));
        }
    }
    tasks
}

/// What one check task needs.
struct Target {
    check: HealthCheck,
    upstream: String,
    server: UpstreamServer,
    state: Arc<ServerState>,
    passive: Passive,
    /// The upstream's TLS client: checks go over TLS too.
    tls: Option<Arc<TlsUpstream>>,
    /// The upstream speaks HTTP/2 only: HTTP checks are HTTP/2 requests.
    http2: bool,
}

async fn check_server(t: Target) {
    let mut counter = RiseFall::new(t.check.rise, t.check.fall, t.state.is_up());
    let mut tick = tokio::time::interval(t.check.interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let tls = t.tls.as_deref().map(|c| (c, &t.server));
        let result = probe::probe(&t.check, t.server.addr, &t.server.name, tls, t.http2).await;
        t.state
            .record_check(result.as_ref().err().map(ToString::to_string));
        let Some(up) = counter.record(result.is_ok()) else {
            continue;
        };
        t.state.set_up(up, now_ms(), &t.passive);
        match result {
            Ok(()) => tracing::info!(
                upstream = %t.upstream,
                server = %t.server.name,
                reason = %format!("{} successful check(s) in a row", t.check.rise),
                "server is up"
            ),
            Err(reason) => tracing::warn!(
                upstream = %t.upstream,
                server = %t.server.name,
                %reason,
                fall = t.check.fall,
                "server is down"
            ),
        }
    }
}
