//! Reloading certificates when their files change on disk, without SIGHUP.
//!
//! One thread per process looks at the size and modification time of every certificate,
//! key and CA file of the running config every `cert_check_interval`. When one changed, the
//! TLS setups are rebuilt from the files and a snapshot with the same config and the new
//! certificates is published; handshakes in flight finish on the old ones. A file that
//! cannot be used is logged with its path and the reason, and the running certificates
//! stay until the files change again. A config published meanwhile (SIGHUP, admin API) has
//! read the files itself: the watcher then only takes note of them.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use weir_config::Config;

use crate::snapshot::{Snapshot, TlsPlans};
use crate::worker::Shared;

/// What is known of one file: its path, and its length and mtime if it could be read.
type Stamp = (PathBuf, Option<(u64, SystemTime)>);

/// Starts the watcher thread; it ends at shutdown.
pub fn spawn(shared: Arc<Shared>) -> std::io::Result<JoinHandle<()>> {
    crate::server::spawn_with_runtime("weir-cert-watch", move || run(shared))
}

async fn run(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    let mut seen = (u64::MAX, Vec::new());
    loop {
        let interval = shared.snapshot.load().config.server.cert_check_interval;
        // Zero turns checking off; look again now and then in case a reload turns it on.
        let wait = if interval.is_zero() {
            Duration::from_secs(60)
        } else {
            interval
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            changed = shutdown.changed() => if changed.is_err() { return },
        }
        if *shutdown.borrow() {
            return;
        }
        let generation = shared.generation.load(Ordering::Acquire);
        let snapshot = shared.snapshot.load_full();
        let stamps = stamps(&snapshot.config);
        let changed = generation == seen.0 && stamps != seen.1;
        seen = (generation, stamps);
        if changed && !interval.is_zero() {
            reload(&shared, snapshot);
            seen.0 = shared.generation.load(Ordering::Acquire);
        }
    }
}

/// The stamps of every TLS file of `config`, in config order.
fn stamps(config: &Config) -> Vec<Stamp> {
    let mut files = Vec::new();
    for tls in config.listeners.iter().filter_map(|l| l.tls.as_ref()) {
        for pair in &tls.certs {
            files.push(pair.cert.clone());
            files.push(pair.key.clone());
        }
        files.extend(tls.client_auth.as_ref().map(|a| a.ca.clone()));
    }
    files
        .into_iter()
        .map(|path| {
            let meta = std::fs::metadata(&path).ok();
            let stamp = meta.and_then(|m| Some((m.len(), m.modified().ok()?)));
            (path, stamp)
        })
        .collect()
}

/// Rebuilds the TLS setups of `old`'s config and publishes them, unless a newer snapshot
/// was published meanwhile.
fn reload(shared: &Shared, old: Arc<Snapshot>) {
    let tls = match TlsPlans::build(&old.config, Some(&old)) {
        Ok(tls) => tls,
        Err(e) => {
            tracing::error!(
                listener = %e.listener,
                file = %e.error.file.display(),
                reason = %e.error.reason,
                "certificate files changed but cannot be used; the running certificates stay"
            );
            return;
        }
    };
    // Same config: the upstreams keep their TLS clients.
    let upstream_tls = old.upstreams.iter().map(|u| u.tls.clone()).collect();
    let new = Snapshot::with_previous(
        old.config.clone(),
        old.slots.clone(),
        &old,
        tls,
        upstream_tls,
    );
    if shared.publish_if(&old, new) {
        tracing::info!("certificate files changed: certificates reloaded");
    }
}
