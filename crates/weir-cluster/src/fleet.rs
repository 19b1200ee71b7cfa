//! A fleet member: its view of the shared objects, the config built from them with the
//! local file, and what it reports (`/ready`, metrics, its registration).
//!
//! Every change, from the watch (the admin API's writes come back through it) or a SIGHUP
//! of the local file, takes [`Fleet::apply_view`]: the config is built from the objects
//! and validated as the file is, parsing again only the values that changed
//! ([`Parsed`]), then applied through the admin store (`Store::apply_shared`, so the
//! history and the log tell it as any change), which keeps the state of every unchanged
//! object (server health, pools, counters). A change that fails here is not applied, and
//! is reported until a later one succeeds.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use weir_admin::api::error::ApiError;
use weir_admin::Store;
use weir_config::cluster::objects::{self, Assembled, Local, Objects, Parsed};
use weir_config::cluster::EtcdCluster;
use weir_config::field_diff::FieldChange;
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
    /// Held for the whole of [`Fleet::apply_view`]: one apply at a time.
    applying: Mutex<()>,
    /// A SIGHUP's local file that came while a write of several transactions was under
    /// way: applied with that write once it is whole.
    held_local: Mutex<Option<String>>,
    /// The objects' values as last parsed, so that a change parses only what changed.
    parsed: Mutex<Parsed>,
    /// The objects of the running config (what `Shared::text` assembles).
    running: Mutex<Objects>,
    /// The config revision and [`digest`] of the objects last tried (applied or
    /// rejected): a re-list that finds them again needs no apply.
    tried: Mutex<Option<(i64, u64)>>,
    /// Their text once assembled, until the next change applied: every admin API request
    /// reads it, and assembling 10,000 objects takes a while.
    text: Mutex<Option<String>>,
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
            applying: Mutex::new(()),
            held_local: Mutex::new(None),
            parsed: Mutex::new(Parsed::default()),
            running: Mutex::new(Objects::new()),
            tried: Mutex::new(None),
            text: Mutex::new(None),
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
    /// does not build here, or that is half of a write under way, gives way to the
    /// snapshot, then to no shared objects.
    fn initial(&self) -> anyhow::Result<Initial> {
        let listed = self.block_on(async {
            tokio::time::timeout(START_LIST_TIMEOUT, crate::sync::list(self)).await
        });
        let mut candidates = Vec::new();
        match listed {
            // Half of a write of several transactions: not to be served, even at start.
            // The watch applies it once whole; meanwhile the snapshot serves.
            Ok(Ok(view)) if view.objects.contains_key(crate::write::PENDING_KEY) => {
                tracing::warn!(
                    revision = view.revision,
                    "a write of several transactions is under way in etcd: starting from the snapshot; the write is applied once whole"
                );
            }
            Ok(Ok(view)) => candidates.push(("etcd", view)),
            Ok(Err(e)) => tracing::warn!(error = %e, "etcd unreachable at start"),
            Err(_) => tracing::warn!("etcd did not answer within {START_LIST_TIMEOUT:?} at start"),
        }
        match crate::snapshot::load(&self.settings) {
            Ok(Some(view)) => {
                if let Some((_, listed)) = candidates.first_mut() {
                    listed.carry_deletions(&view);
                }
                candidates.push(("snapshot", view));
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "cannot read the cluster snapshot"),
        }
        candidates.push(("nothing", View::default()));
        let local = self.local_file().clone();
        for (source, view) in candidates {
            match self.config_of(&local, &view.objects) {
                Ok(config) => {
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
                    let text = self.assemble(&local, &view.objects);
                    *lock(&self.running) = view.objects.clone();
                    *lock(&self.tried) = Some((view.config_revision, digest(&view.objects)));
                    *self.lock_view() = view;
                    return Ok(Initial {
                        config,
                        text,
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

    /// The whole config text of `objects` with the local file, and its config.
    fn build(
        &self,
        local: &LocalFile,
        objects: &Objects,
    ) -> Result<(Config, Assembled), ConfigError> {
        let key_name = |k: &str| self.key_name(k);
        let assembled = objects::assemble(&local.text, objects, &key_name)?;
        let config = local.with(|l| objects::parse(l, &assembled, objects, &key_name))?;
        Ok((config, assembled))
    }

    /// The config of `objects` with the local file (as [`Fleet::build`] gives it), parsing
    /// only the values that changed since the last call.
    fn config_of(&self, local: &LocalFile, objects: &Objects) -> Result<Config, ConfigError> {
        let key_name = |k: &str| self.key_name(k);
        let mut parsed = lock(&self.parsed);
        local.with(|l| parsed.config(l, objects, &key_name))
    }

    /// The config text of `objects` (valid: they were applied) with the local file.
    fn assemble(&self, local: &LocalFile, objects: &Objects) -> String {
        let key_name = |k: &str| self.key_name(k);
        objects::assemble(&local.text, objects, &key_name)
            .map_or_else(|e| e.to_string(), |a| a.text)
    }

    /// The running config's text (the admin API's `GET /api/v1/config`, and what its
    /// edits start from).
    pub(crate) fn running_text(&self) -> String {
        let mut text = lock(&self.text);
        if let Some(text) = text.as_ref() {
            return text.clone();
        }
        let local = self.local_file().clone();
        let assembled = self.assemble(&local, &lock(&self.running));
        *text = Some(assembled.clone());
        assembled
    }

    /// The keys `objects` edits from the running config's objects (for the history).
    fn edited_fields(&self, objects: &Objects) -> Vec<FieldChange> {
        let running = lock(&self.running);
        let mut out = Vec::new();
        for (key, old) in running.iter() {
            let new = objects.get(key);
            if new != Some(old) {
                out.extend(objects::field_changes(
                    key,
                    Some(old),
                    new.map(String::as_str),
                ));
            }
        }
        for (key, new) in objects.iter().filter(|(k, _)| !running.contains_key(*k)) {
            out.extend(objects::field_changes(key, None, Some(new)));
        }
        out
    }

    /// Builds and applies the view (after a watch event, a re-list); `force`: even if it
    /// was tried already (see [`Fleet::tried`]). The outcome is what `/ready`, the metrics and the
    /// registration report.
    pub(crate) fn apply_view(&self, force: bool) -> Result<(), String> {
        self.apply_view_with(force, None)
    }

    /// [`Fleet::apply_view`] with `new_local` as the local file's text (a SIGHUP's), kept
    /// only if the change is applied. One apply at a time, from the view as it is once
    /// this one's turn comes: the watch and a SIGHUP applying at once could otherwise run
    /// an older view after a newer one.
    fn apply_view_with(&self, force: bool, new_local: Option<String>) -> Result<(), String> {
        let Some(store) = self.store.get() else {
            // Not running yet: nothing to apply it to; `run` starts from it.
            if let Some(text) = new_local {
                self.local_file().text = text;
            }
            return Ok(());
        };
        let _turn = lock(&self.applying);
        let signalled = new_local.is_some();
        let held = lock(&self.held_local).take();
        let new_local = new_local.or(held);
        let Some((view, tried)) = self.untried_view(!force && new_local.is_none()) else {
            return Ok(());
        };
        if view.objects.contains_key(crate::write::PENDING_KEY) {
            self.hold(new_local, signalled, view.config_revision);
            return Ok(());
        }
        let (objects, revision, by) = (&view.objects, view.config_revision, view.author());
        let running = self.local_file().clone();
        let apply = |local: &LocalFile| self.apply_objects(store, local, objects, revision, &by);
        // `file_error`: a SIGHUP's file rejected, told to the signal's caller; the revision
        // itself is judged with the running file (the shared objects are not at fault).
        let (outcome, file_error) = match new_local {
            None => (apply(&running), None),
            Some(text) => {
                let local = LocalFile {
                    text,
                    ..running.clone()
                };
                match apply(&local) {
                    Ok(serving) => {
                        self.local_file().text = local.text;
                        (Ok(serving), None)
                    }
                    // The revision runs already: it stays as it was, applied.
                    Err(e) if signalled && self.progress.borrow().applied == revision => {
                        return Err(e);
                    }
                    Err(e) => match apply(&running) {
                        Ok(serving) => {
                            if !signalled {
                                tracing::error!(error = %e, "the local file of a SIGHUP sent during a write in etcd is rejected; the write applies with the running file");
                            }
                            (Ok(serving), signalled.then_some(e))
                        }
                        // Held through a write that fails with the running file too: the
                        // write is at fault, and the held file waits on.
                        Err(shared_error) => {
                            if !signalled {
                                *lock(&self.held_local) = Some(local.text);
                            }
                            (Err(shared_error), signalled.then_some(e))
                        }
                    },
                }
            }
        };
        if outcome.is_ok() {
            // Told as it was applied (the history has it already), then kept on disk.
            let snapshot = view.to_json(&self.settings.prefix);
            *lock(&self.running) = view.objects;
            *lock(&self.text) = None;
            self.save_snapshot(&snapshot);
        }
        self.settle(revision, outcome.clone());
        *lock(&self.tried) = Some(tried);
        match file_error {
            Some(e) => Err(e),
            None => outcome.map(drop),
        }
    }

    /// A copy of the view to apply, and its revision and digest; `None` when `skip_tried`
    /// and those were tried last (applied or rejected: a rejected one is not built, failed
    /// and reported again on each re-list). The revision alone does not tell: a re-list
    /// after a compaction rebuilds it from the keys still there, so a deletion missed
    /// while the watch was down can leave it where it was, with an object fewer. A copy:
    /// the watch goes on updating the view meanwhile, and what is applied is what the
    /// snapshot keeps; made only once the check says to apply.
    fn untried_view(&self, skip_tried: bool) -> Option<(View, (i64, u64))> {
        let view = self.lock_view();
        let tried = (view.config_revision, digest(&view.objects));
        if skip_tried && *lock(&self.tried) == Some(tried) {
            return None;
        }
        Some((view.clone(), tried))
    }

    /// Builds the config of `local` and `objects` and applies it: whether it serves.
    fn apply_objects(
        &self,
        store: &Store,
        local: &LocalFile,
        objects: &Objects,
        revision: i64,
        by: &str,
    ) -> Result<bool, String> {
        let config = self.config_of(local, objects).map_err(|e| e.to_string())?;
        let serving = !config.listeners.is_empty();
        let fields = self.edited_fields(objects);
        store
            .apply_shared(config, fields, revision.max(0) as u64, by)
            .map(|_| serving)
            .map_err(|e| self.describe(local, objects, e))
    }

    /// While a write of several transactions is under way (its marker is in the view at
    /// `revision`), nothing is applied; a SIGHUP's local file waits for the write.
    fn hold(&self, local: Option<String>, signalled: bool, revision: i64) {
        if signalled {
            tracing::warn!(
                revision,
                "SIGHUP: a write of several transactions is under way in etcd: the local file is applied with it once it is whole"
            );
        } else {
            tracing::info!(
                revision,
                "a write of several transactions is under way in etcd: applied once whole"
            );
        }
        if local.is_some() {
            *lock(&self.held_local) = local;
        }
    }

    /// Writes `text`, the view as it was applied ([`View::to_json`]; not as the watch has
    /// it since: that may be a change rejected here), as the snapshot a start without etcd
    /// comes up from.
    fn save_snapshot(&self, text: &str) {
        if let Err(e) = crate::snapshot::save(&self.settings, text) {
            tracing::warn!(error = %e, path = %self.settings.snapshot.display(), "cannot write the cluster snapshot");
        }
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
    fn describe(&self, local: &LocalFile, objects: &Objects, e: ApiError) -> String {
        if e.field.is_empty() {
            return format!("{} (fix: {})", e.message, e.fix);
        }
        let key_name = |k: &str| self.key_name(k);
        let assembled = match objects::assemble(&local.text, objects, &key_name) {
            Ok(assembled) => assembled,
            Err(_) => return format!("{}: {} (fix: {})", e.field, e.message, e.fix),
        };
        local
            .with(|l| assembled.locate(l, objects, &key_name, &e.field, e.message, e.fix))
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
        self.apply_view_with(true, Some(text))
    }

    fn local_file(&self) -> MutexGuard<'_, LocalFile> {
        lock(&self.local)
    }

    pub(crate) fn lock_view(&self) -> MutexGuard<'_, View> {
        lock(&self.view)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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

    /// Runs `f` with this file as a [`Local`].
    fn with<R>(&self, f: impl FnOnce(&Local<'_>) -> R) -> R {
        let (file, base) = self.names();
        f(&Local {
            text: &self.text,
            file: &file,
            base: base.as_deref(),
        })
    }
}

/// A digest of `objects`: tells a view tried already without keeping a copy of it.
fn digest(objects: &Objects) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    objects.hash(&mut hasher);
    hasher.finish()
}
