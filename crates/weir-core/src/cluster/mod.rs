//! What the instances of a fleet share (`[cluster]`, docs/cluster.md): rate limits counted
//! in Redis, and pools that follow DNS.
//!
//! - `shared_limit`: the worker side of shared rate limits (worker-local counts, the
//!   per-worker sync task)
//! - `redis_sync`: the process side (the Redis script, merging the fleet's counts back)
//! - `discovery`, `dns`: DNS service discovery of pools
//!
//! Both process sides run on one thread with its own runtime ("weir-cluster"), as the
//! health checks do: nothing here runs on a worker but the worker's sync task, which only
//! wakes while shared limits have counts to send. Without either feature the thread only
//! looks at the running config every 200 ms (as the health thread does), so a config that
//! adds one is picked up as it is applied.

pub mod discovery;
mod dns;
pub mod redis_sync;
pub mod shared_limit;

use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::mpsc;

pub use crate::metrics::cluster::ClusterMetrics;
use crate::reload::Applier;
use shared_limit::Batch;

/// Starts the cluster thread; it ends at shutdown. Returns it and a receiver that gets one
/// message per discovered pool of the running config once its first lookup is done.
pub(crate) fn spawn(
    applier: Applier,
    batches: mpsc::UnboundedReceiver<Vec<Batch>>,
) -> std::io::Result<(JoinHandle<()>, std::sync::mpsc::Receiver<()>)> {
    let (first_round, done) = std::sync::mpsc::channel();
    let thread = crate::server::spawn_with_runtime("weir-cluster", move || async move {
        let mut shutdown = applier.shared.shutdown.clone();
        let metrics = applier.metrics.cluster.clone();
        let work = async {
            tokio::join!(
                redis_sync::run(batches, metrics.clone()),
                discovery::supervise(applier.clone(), metrics, first_round)
            )
        };
        tokio::select! {
            _ = work => {}
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
    })?;
    Ok((thread, done))
}

/// Waits until each of the `pools` discovered pools of the config at start had its first
/// lookup (so `weir run` starts with their servers), at most `limit`.
pub(crate) fn wait_first_round(
    done: &std::sync::mpsc::Receiver<()>,
    pools: usize,
    limit: Duration,
) {
    let deadline = std::time::Instant::now() + limit;
    for _ in 0..pools {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if done.recv_timeout(left).is_err() {
            return;
        }
    }
}
