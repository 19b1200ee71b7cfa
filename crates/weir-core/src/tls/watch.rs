//! Reloading certificates when their files change on disk, without SIGHUP.
//!
//! Every snapshot records the stamps (length, modification and change times, inode) of
//! its listeners' certificate, key and CA files, taken just before they were read. One
//! thread per process stamps those files again every `cert_check_interval`; when the
//! stamps differ from the running snapshot's, the TLS setups are rebuilt from the files and
//! a snapshot with the same config and the new certificates is published; handshakes in
//! flight finish on the old ones. Comparing with what the running snapshot read (not with
//! the previous look) means a change made before the first look, or just after a reload
//! (SIGHUP, admin API) read the files, is not missed. A file that cannot be used is logged
//! with its path and the reason, and the running certificates stay until the files change
//! again.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use weir_config::Config;

use crate::snapshot::{Snapshot, TlsPlans};
use crate::worker::Shared;

/// What is known of one file: its path, and its length, mtime, inode and ctime if it could
/// be read. The inode tells a file replaced by a rename within one tick of the (coarse) file
/// clock from the one before it; the ctime, a file made readable (`chmod`, `chown`).
pub type FileStamp = (PathBuf, Option<(u64, SystemTime, u64, (i64, i64))>);

/// Starts the watcher thread; it ends at shutdown.
pub fn spawn(shared: Arc<Shared>) -> std::io::Result<JoinHandle<()>> {
    crate::server::spawn_with_runtime("weir-cert-watch", move || run(shared))
}

async fn run(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    // The stamps of files that could not be used: not read again until they change.
    let mut refused: Option<Vec<FileStamp>> = None;
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
        if interval.is_zero() {
            continue;
        }
        let snapshot = shared.snapshot.load_full();
        let now = stamps(&snapshot.config);
        if now == snapshot.tls_files || refused.as_ref() == Some(&now) {
            continue;
        }
        refused = (!reload(&shared, snapshot)).then_some(now);
    }
}

/// The stamps of every TLS file of `config`, in config order.
pub fn stamps(config: &Config) -> Vec<FileStamp> {
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
            let stamp = meta.and_then(|m| {
                let changed = (m.ctime(), m.ctime_nsec());
                Some((m.len(), m.modified().ok()?, m.ino(), changed))
            });
            (path, stamp)
        })
        .collect()
}

/// Rebuilds the TLS setups of `old`'s config and publishes them, unless a newer snapshot
/// was published meanwhile (the watcher then compares with that one). False when the files
/// cannot be used.
fn reload(shared: &Shared, old: Arc<Snapshot>) -> bool {
    let tls = match TlsPlans::build(&old.config, Some(&old)) {
        Ok(tls) => tls,
        Err(e) => {
            tracing::error!(
                listener = %e.listener,
                file = %e.error.file.display(),
                reason = %e.error.reason,
                "certificate files changed but cannot be used; the running certificates stay"
            );
            return false;
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
    true
}
