//! Following etcd: the watch on `PREFIX/config/` (re-listing when history was compacted
//! or nothing was read yet), and this instance's registration under `PREFIX/instances/`.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::etcd::{prefix_end, EtcdError, Event, Op, WatchMessage};
use crate::fleet::Fleet;
use crate::view::View;

/// The longest wait between two attempts to reach etcd.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// A full read of the shared objects.
pub(crate) async fn list(fleet: &Fleet) -> Result<View, EtcdError> {
    let view = list_view(&fleet.etcd, &fleet.settings.prefix).await?;
    fleet.metrics().contact();
    fleet.metrics().relists.fetch_add(1, Relaxed);
    Ok(view)
}

/// The objects under `fleet_prefix`/config/.
pub(crate) async fn list_view(
    etcd: &crate::etcd::Etcd,
    fleet_prefix: &str,
) -> Result<View, EtcdError> {
    let prefix = format!("{fleet_prefix}/config/");
    let (revision, kvs) = etcd.range(&prefix, &prefix_end(&prefix)).await?;
    let relative = kvs
        .into_iter()
        .filter_map(|kv| Some((kv.key.strip_prefix(&prefix)?.to_owned(), kv)))
        .collect();
    Ok(View::listed(revision, relative))
}

fn config_prefix(fleet: &Fleet) -> String {
    format!("{}/config/", fleet.settings.prefix)
}

/// Watches from the revision of the view on, for ever; lists again after a compaction,
/// and when the view was not read from etcd at all.
pub(crate) async fn watch_loop(fleet: Arc<Fleet>) {
    let prefix = config_prefix(&fleet);
    let end = prefix_end(&prefix);
    let mut backoff = Duration::from_millis(100);
    let mut must_list = fleet.lock_view().revision == 0;
    loop {
        let outcome = match must_list {
            true => relist(&fleet).await,
            false => follow(&fleet, &prefix, &end).await,
        };
        match outcome {
            Ok(Next::List) => must_list = true,
            Ok(Next::Watch) => {
                must_list = false;
                backoff = Duration::from_millis(100);
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "etcd watch lost; serving the last applied config");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// What the watch loop does next.
enum Next {
    List,
    Watch,
}

async fn relist(fleet: &Arc<Fleet>) -> Result<Next, EtcdError> {
    let mut view = list(fleet).await?;
    tracing::info!(
        revision = view.revision,
        objects = view.objects.len(),
        "shared objects listed"
    );
    {
        let mut current = fleet.lock_view();
        view.carry_deletions(&current);
        *current = view;
    }
    apply(fleet, false).await;
    Ok(Next::Watch)
}

/// Follows one watch until it breaks (an error) or history is gone (`List`).
async fn follow(fleet: &Arc<Fleet>, prefix: &str, end: &str) -> Result<Next, EtcdError> {
    let from = fleet.lock_view().revision + 1;
    let mut watch = fleet.etcd.watch(prefix, end, from).await?;
    loop {
        let message = watch.next().await?;
        fleet.metrics().contact();
        let mut batch = match message {
            WatchMessage::Created { .. } => continue,
            WatchMessage::Compacted { compact_revision } => {
                tracing::info!(
                    from,
                    compact_revision,
                    "etcd history compacted past this view: listing again"
                );
                return Ok(Next::List);
            }
            WatchMessage::Events(events) => vec![events],
        };
        // Whatever else has arrived already goes in the same apply.
        while let Some(Ok(WatchMessage::Events(events))) = watch.buffered() {
            batch.push(events);
        }
        {
            let mut view = fleet.lock_view();
            for events in batch {
                let relative = events
                    .into_iter()
                    .filter_map(|e| Some((relative_key(&e, prefix)?, e)))
                    .collect();
                view.apply(relative);
            }
        }
        apply(fleet, false).await;
    }
}

fn relative_key(e: &Event, prefix: &str) -> Option<String> {
    let key = match e {
        Event::Put(kv) => &kv.key,
        Event::Delete { key, .. } => key,
    };
    key.strip_prefix(prefix).map(str::to_owned)
}

/// Applies the view off the runtime's thread (validation and apply take a while).
async fn apply(fleet: &Arc<Fleet>, force: bool) {
    let fleet = fleet.clone();
    let _ = tokio::task::spawn_blocking(move || fleet.apply_view(force)).await;
}

/// Keeps `PREFIX/instances/NODE` (what `weir ctl cluster status` lists) under a lease
/// renewed every third of its TTL, and its value up to date with this instance's progress.
pub(crate) async fn register(fleet: Arc<Fleet>) {
    let key = format!(
        "{}/instances/{}",
        fleet.settings.prefix, fleet.settings.node
    );
    let ttl = fleet.settings.lease_ttl;
    let interval = ttl / 3;
    loop {
        let lease = match fleet.etcd.lease_grant(ttl).await {
            Ok(id) => id,
            Err(_) => {
                tokio::time::sleep(interval).await;
                continue;
            }
        };
        *fleet.lease.lock().unwrap_or_else(|e| e.into_inner()) = Some(lease);
        keep(&fleet, &key, lease, interval, ttl).await;
    }
}

/// Renews `lease` and rewrites the registration when it changes, until the lease is lost.
async fn keep(fleet: &Fleet, key: &str, lease: i64, interval: Duration, ttl: Duration) {
    let mut written = None;
    let mut renewed = Instant::now();
    let mut due = tokio::time::Instant::now() + interval;
    loop {
        let status = registration(fleet);
        if written.as_ref() != Some(&status) {
            let put = Op::Put {
                key: key.to_owned(),
                value: status.to_string().into_bytes(),
                lease,
            };
            if fleet.etcd.txn(&[], &[put]).await.is_ok() {
                fleet.metrics().contact();
                written = Some(status);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(due) => {}
            _ = fleet.changed.notified() => continue,
        }
        due = tokio::time::Instant::now() + interval;
        match fleet.etcd.lease_keepalive(lease).await {
            Ok(true) => {
                fleet.metrics().contact();
                renewed = Instant::now();
            }
            Ok(false) => return,
            Err(_) if renewed.elapsed() > ttl => return,
            Err(_) => {}
        }
    }
}

/// What an instance says about itself.
fn registration(fleet: &Fleet) -> serde_json::Value {
    let p = fleet.progress.borrow().clone();
    json!({
        "node": fleet.settings.node,
        "applied": p.applied,
        "seen": p.seen,
        "rejected": p.rejected.map(|(_, why)| why),
        "pid": std::process::id(),
    })
}
