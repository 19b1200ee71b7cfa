//! A fleet member: its view of the shared objects, the config built from them with the
//! local file, and what it reports (`/ready`, metrics, its registration).
//!
//! Every change, from the watch or a SIGHUP of the local file, takes [`Fleet::apply_view`]:
//! the whole config is assembled and validated as the file is, then applied through the
//! admin store (`Store::apply_shared`, so the history and the log tell it as any change).
//! A change that fails here is not applied, and is reported until a later one succeeds.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use weir_admin::api::error::ApiError;
use weir_admin::Store;
use weir_config::cluster::objects::{self, Assembled, Local, Objects};
use weir_config::cluster::EtcdCluster;
use weir_config::{Config, ConfigError};
use weir_core::metrics::etcd::EtcdMetrics;

use crate::etcd::Etcd;
use crate::view::View;

/// How long the first listing may take at start before the snapshot is used instead.
const START_LIST_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Fleet {
    pub settings: EtcdCluster,
    pub etcd: Arc<Etcd>,
    /// The certificates shared through etcd (`key_file` set).
    certs: Option<Arc<crate::certs::EtcdStore>>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
    local: Mutex<LocalFile>,
    pub(crate) view: Mutex<View>,
    pub(crate) progress: tokio::sync::watch::Sender<Progress>,
    store: OnceLock<Arc<Store>>,
    metrics: Arc<EtcdMetrics>,
    proxy_metrics: OnceLock<Arc<EtcdMetrics>>,
    /// Wakes the registration when what it says changed.
    pub(crate) changed: tokio::sync::Notify,
    /// The registration lease, to revoke at stop.
    pub(crate) lease: Mutex<Option<i64>>,
}

/// The local file: per-node sections.
#[derive(Debug, Clone)]
struct LocalFile {
    text: String,
    path: Option<PathBuf>,
}

/// How far this instance got with the shared objects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// The config revision last tried (applied or rejected).
    pub seen: i64,
    /// The config revision running.
    pub applied: i64,
    /// The revision not applied, and why.
    pub rejected: Option<(i64, String)>,
    /// The running config has at least one listener.
    pub serving: bool,
}

/// The config to start with.
pub struct Initial {
    pub config: Config,
    pub text: String,
    pub version: u64,
}

impl Fleet {
    /// Reads the shared objects from etcd (at most [`START_LIST_TIMEOUT`]), else from the
    /// snapshot file, and builds the config to start with. `text` is the local file's.
    pub fn connect(
        settings: EtcdCluster,
        text: String,
        path: Option<PathBuf>,
    ) -> anyhow::Result<(Arc<Fleet>, Initial)> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("weir-etcd")
            .enable_all()
            .build()?;
        let etcd = Arc::new(Etcd::new(&settings).map_err(anyhow::Error::msg)?);
        let certs = cert_store(&etcd, runtime.handle(), &settings)?;
        let fleet = Arc::new(Fleet {
            etcd,
            certs,
            handle: runtime.handle().clone(),
            runtime: Mutex::new(Some(runtime)),
            local: Mutex::new(LocalFile { text, path }),
            view: Mutex::new(View::default()),
            progress: tokio::sync::watch::Sender::new(Progress::default()),
            store: OnceLock::new(),
            metrics: Arc::new(EtcdMetrics::default()),
            proxy_metrics: OnceLock::new(),
            changed: tokio::sync::Notify::new(),
            lease: Mutex::new(None),
            settings,
        });
        let initial = fleet.initial()?;
        Ok((fleet, initial))
    }

    /// The first view (etcd, else the snapshot, else nothing) and its config; a view that
    /// does not build here gives way to the snapshot, then to no shared objects.
    fn initial(&self) -> anyhow::Result<Initial> {
        let listed = self.block_on(async {
            tokio::time::timeout(START_LIST_TIMEOUT, crate::sync::list(self)).await
        });
        let mut candidates = Vec::new();
        match listed {
            Ok(Ok(view)) => candidates.push(("etcd", view)),
            Ok(Err(e)) => tracing::warn!(error = %e, "etcd unreachable at start"),
            Err(_) => tracing::warn!("etcd did not answer within {START_LIST_TIMEOUT:?} at start"),
        }
        match crate::snapshot::load(&self.settings) {
            Ok(Some(view)) => candidates.push(("snapshot", view)),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "cannot read the cluster snapshot"),
        }
        candidates.push(("nothing", View::default()));
        let local = self.local_file().clone();
        for (source, view) in candidates {
            match self.build(&local, &view.objects) {
                Ok((config, assembled)) => {
                    tracing::info!(
                        source,
                        revision = view.config_revision,
                        "shared config loaded"
                    );
                    let version = view.config_revision.max(0) as u64;
                    self.progress.send_modify(|p| {
                        p.seen = view.config_revision;
                        p.applied = view.config_revision;
                        p.serving = !config.listeners.is_empty();
                    });
                    *self.lock_view() = view;
                    return Ok(Initial {
                        config,
                        text: assembled.text,
                        version,
                    });
                }
                Err(e) if source == "nothing" => return Err(e.into()),
                Err(e) => tracing::error!(source, error = %e, "shared config rejected at start"),
            }
        }
        unreachable!("the empty view is the last candidate")
    }

    /// Starts following etcd: the watch, and this instance's registration.
    pub fn run(self: &Arc<Self>, store: Arc<Store>) {
        let version = self.progress.borrow().applied.max(0) as u64;
        let metrics = store.proxy().metrics().etcd.clone();
        self.copy_metrics_into(&metrics);
        let _ = self.proxy_metrics.set(metrics);
        store.set_shared(self.clone(), version);
        let _ = self.store.set(store);
        self.handle.spawn(crate::sync::watch_loop(self.clone()));
        self.handle.spawn(crate::sync::register(self.clone()));
        if let Some(certs) = &self.certs {
            self.handle.spawn(crate::certs::watch_loop(certs.clone()));
        }
    }

    /// Leaves the fleet: revokes the registration, stops the thread.
    pub fn stop(&self) {
        if let Some(lease) = *self.lease.lock().unwrap_or_else(|e| e.into_inner()) {
            let _ = self.block_on(async {
                tokio::time::timeout(self.settings.timeout, self.etcd.lease_revoke(lease)).await
            });
        }
        if let Some(runtime) = self
            .runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
    }

    pub(crate) fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.handle.block_on(f)
    }

    /// Carries what was counted before the proxy ran into its metrics.
    fn copy_metrics_into(&self, metrics: &Arc<EtcdMetrics>) {
        use std::sync::atomic::Ordering::Relaxed;
        let p = self.progress.borrow().clone();
        metrics.applied_revision.store(p.applied, Relaxed);
        metrics.seen_revision.store(p.seen, Relaxed);
        metrics
            .last_contact_ms
            .store(self.metrics.last_contact_ms.load(Relaxed), Relaxed);
        metrics
            .relists
            .store(self.metrics.relists.load(Relaxed), Relaxed);
        let interval = self.settings.lease_ttl.as_millis() as u64 / 3;
        metrics.lease_interval_ms.store(interval, Relaxed);
        metrics.enabled.store(true, Relaxed);
    }

    /// The metrics this fleet updates: the proxy's once running, its own before.
    pub(crate) fn metrics(&self) -> &EtcdMetrics {
        self.proxy_metrics.get().unwrap_or(&self.metrics)
    }

    /// The key of relative key `key` (under `PREFIX/config/`).
    pub(crate) fn key_name(&self, key: &str) -> String {
        format!("{}/config/{key}", self.settings.prefix)
    }

    fn build(
        &self,
        local: &LocalFile,
        objects: &Objects,
    ) -> Result<(Config, Assembled), ConfigError> {
        let key_name = |k: &str| self.key_name(k);
        let assembled = objects::assemble(&local.text, objects, &key_name)?;
        let (file, base) = local.names();
        let l = Local {
            text: &local.text,
            file: &file,
            base: base.as_deref(),
        };
        let config = objects::parse(&l, &assembled, objects, &key_name)?;
        Ok((config, assembled))
    }

    /// Builds and applies the view (after a watch event, a re-list, a SIGHUP); `force`:
    /// even if its revision was tried already. The outcome is what `/ready`, the metrics
    /// and the registration report.
    pub(crate) fn apply_view(&self, force: bool) -> Result<(), String> {
        let Some(store) = self.store.get() else {
            return Ok(());
        };
        let (objects, revision, by) = {
            let view = self.lock_view();
            (view.objects.clone(), view.config_revision, view.author())
        };
        if !force && self.progress.borrow().seen == revision {
            return Ok(());
        }
        let local = self.local_file().clone();
        let outcome = match self.build(&local, &objects) {
            Err(e) => Err(e.to_string()),
            Ok((config, assembled)) => {
                let serving = !config.listeners.is_empty();
                let text = assembled.text.clone();
                store
                    .apply_shared(config, text, revision.max(0) as u64, &by)
                    .map(|_| serving)
                    .map_err(|e| self.describe(&local, &objects, &assembled, e))
            }
        };
        self.settle(revision, outcome.clone());
        outcome.map(drop)
    }

    /// Records the outcome of trying `revision`.
    fn settle(&self, revision: i64, outcome: Result<bool, String>) {
        use std::sync::atomic::Ordering::Relaxed;
        let metrics = self.metrics();
        metrics.seen_revision.store(revision, Relaxed);
        match &outcome {
            Ok(serving) => {
                metrics.applied_revision.store(revision, Relaxed);
                self.progress.send_modify(|p| {
                    (p.seen, p.applied, p.rejected, p.serving) =
                        (revision, revision, None, *serving)
                });
                let json = self.lock_view().to_json(&self.settings.prefix);
                if let Err(e) = crate::snapshot::save(&self.settings, &json) {
                    tracing::warn!(error = %e, path = %self.settings.snapshot.display(), "cannot write the cluster snapshot");
                }
            }
            Err(e) => {
                metrics.rejected.fetch_add(1, Relaxed);
                tracing::error!(revision, error = %e, "shared config change rejected here; the running config stays");
                self.progress.send_modify(|p| {
                    (p.seen, p.rejected) = (revision, Some((revision, e.clone())))
                });
            }
        }
        self.changed.notify_one();
    }

    /// An apply error, told at the object's key when it names a field.
    fn describe(
        &self,
        local: &LocalFile,
        objects: &Objects,
        assembled: &Assembled,
        e: ApiError,
    ) -> String {
        if e.field.is_empty() {
            return format!("{} (fix: {})", e.message, e.fix);
        }
        let (file, base) = local.names();
        let l = Local {
            text: &local.text,
            file: &file,
            base: base.as_deref(),
        };
        let key_name = |k: &str| self.key_name(k);
        assembled
            .locate(&l, objects, &key_name, &e.field, e.message, e.fix)
            .to_string()
    }

    /// Validates `text`'s shared objects with the local file, as [`Fleet::apply_view`] would.
    pub(crate) fn parse_text(&self, text: &str) -> Result<(Config, Assembled), ConfigError> {
        let objects = objects::split(text, "the request")?;
        self.build(&self.local_file().clone(), &objects)
    }

    /// SIGHUP: the local file's new text, applied with the shared objects.
    pub(crate) fn set_local(&self, text: String) -> Result<(), String> {
        let (file, _) = self.local_file().names();
        weir_config::cluster::check_local_file(&text, &file).map_err(|e| e.to_string())?;
        self.local_file().text = text;
        self.apply_view(true)
    }

    fn local_file(&self) -> MutexGuard<'_, LocalFile> {
        self.local.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn lock_view(&self) -> MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The certificate store of a fleet with `key_file`, made the process's (`None`: each
/// instance keeps its certificates to itself).
fn cert_store(
    etcd: &Arc<Etcd>,
    handle: &tokio::runtime::Handle,
    settings: &EtcdCluster,
) -> anyhow::Result<Option<Arc<crate::certs::EtcdStore>>> {
    let Some(key) = &settings.cert_key else {
        tracing::info!("no [cluster] key_file: automatic certificates are not shared by the fleet");
        return Ok(None);
    };
    if key.group_or_world_readable {
        tracing::warn!(key_file = %key.path.display(), "the fleet's key_file can be read by other users: chmod 600 it");
    }
    let store = crate::certs::EtcdStore::new(etcd.clone(), handle.clone(), settings, key)
        .map_err(anyhow::Error::msg)?;
    let store = Arc::new(store);
    weir_core::tls::auto::shared::set(Arc::new(crate::certs::FleetCerts(store.clone())));
    Ok(Some(store))
}

impl LocalFile {
    /// Its name in errors, and the directory its relative paths resolve against.
    fn names(&self) -> (String, Option<PathBuf>) {
        match &self.path {
            Some(p) => (p.display().to_string(), Some(weir_config::config_dir(p))),
            None => ("local config".to_owned(), None),
        }
    }
}
