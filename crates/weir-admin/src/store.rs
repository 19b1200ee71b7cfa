//! The running config as the admin plane sees it: its TOML text, its version, and the one
//! way to change it.
//!
//! Every change (SIGHUP, `PUT /api/v1/config`, an object edit) becomes a full config text,
//! is validated exactly like the file (`weir_config::parse_str`), and is applied through
//! `Proxy::apply`. API changes are written to the config file first (`config_file`: atomic,
//! refused if the file was edited since it was loaded), so a restart keeps them. A lock serializes changes;
//! each success bumps the version that `If-Match` is checked against, is logged (`config
//! changed`, with who asked) and is kept in a short history (`GET /api/v1/history`,
//! `weir ctl history`, the dashboard's diff view), with the keys it edited.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use hyper::StatusCode;
use weir_config::diff::{diff, Change};
use weir_config::field_diff::{field_changes, FieldChange};
use weir_config::Config;
use weir_core::Proxy;

use crate::api::error::ApiError;
use crate::config_file::ConfigFile;
use crate::shared::{Shared, SharedError};

pub struct Store {
    proxy: Arc<Proxy>,
    /// The config file changes are persisted to (`None`: not persisted, as in tests).
    path: Option<PathBuf>,
    state: Mutex<State>,
    /// `[admin] token_file`, as last read (see `api::auth`).
    pub(crate) token: crate::api::auth::TokenCache,
    /// Set on a fleet member: API writes go to the fleet's shared objects.
    shared: OnceLock<Arc<dyn Shared>>,
    /// The dashboard's samples of the proxy's metrics (`crate::stats`).
    pub(crate) stats: crate::stats::Stats,
    /// The running config's version, sent on every change: an idle dashboard sampler
    /// waits on it instead of waking up to check the setting.
    changed: tokio::sync::watch::Sender<u64>,
    /// Runs between validation and apply: tests hold a change there to see what the admin
    /// listener does meanwhile.
    #[cfg(test)]
    pub(crate) before_apply: Mutex<Option<Box<dyn FnMut() + Send>>>,
}

struct State {
    version: u64,
    text: String,
    /// The last [`HISTORY`] versions, oldest first.
    history: VecDeque<Version>,
    /// Set while a binary upgrade hands over: the new process reads the file, so a write
    /// now could be lost.
    frozen: bool,
}

/// How many versions [`Store::history`] remembers.
pub const HISTORY: usize = 50;

/// How many edited keys a version of the history keeps (a whole new config can edit
/// thousands); the rest are counted in `fields_omitted`.
pub const HISTORY_FIELDS: usize = 200;

/// One version of the running config, as the history lists it.
#[derive(Debug, Clone)]
pub struct Version {
    pub version: u64,
    /// When it became the running config, in Unix seconds.
    pub at: u64,
    /// Who made it: `start`, `SIGHUP`, or `api 127.0.0.1:PORT` (`with token` when the
    /// admin API has a token file).
    pub by: String,
    /// What changed from the version before, as `Change` displays it.
    pub changes: Vec<String>,
    /// The keys edited from the version before, old and new value as written (the first
    /// [`HISTORY_FIELDS`]).
    pub fields: Vec<FieldChange>,
    /// Edited keys beyond [`HISTORY_FIELDS`], not kept.
    pub fields_omitted: usize,
}

impl Version {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "version": self.version,
            "at": self.at,
            "at_utc": weir_core::tls::facts::format_utc(i64::try_from(self.at).unwrap_or(0)),
            "by": self.by,
            "changes": self.changes,
            "fields": fields_json(&self.fields),
            "fields_omitted": self.fields_omitted,
        })
    }
}

/// Edited keys as JSON: `[{"path", "old", "new"}]` (`null`: absent).
pub fn fields_json(fields: &[FieldChange]) -> serde_json::Value {
    fields
        .iter()
        .map(|f| serde_json::json!({"path": f.path, "old": f.old, "new": f.new}))
        .collect()
}

/// Who asks for a change, and the name its text goes by in error positions.
#[derive(Debug, Clone)]
pub struct Origin {
    pub by: String,
    /// For a whole config sent to the API (`weir ctl apply -f FILE` sends FILE): errors
    /// then point into it, not into the running config's file. `None`: the config file.
    pub source: Option<String>,
}

impl Origin {
    pub fn new(by: impl Into<String>) -> Origin {
        Origin {
            by: by.into(),
            source: None,
        }
    }
}

/// The outcome of a change (or of a dry run, which changes nothing).
#[derive(Debug)]
pub struct Applied {
    pub version: u64,
    pub changes: Vec<Change>,
    /// The keys edited, old and new value as written (dry runs only).
    pub fields: Vec<weir_config::field_diff::FieldChange>,
}

/// How a write is made.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteMode {
    /// The version the client started from (`If-Match`); stale: 409.
    pub expect: Option<u64>,
    /// Validate and diff only.
    pub dry_run: bool,
}

impl Store {
    /// `text` is the text the running config was parsed from (the file at `path`).
    pub fn new(proxy: Arc<Proxy>, path: Option<PathBuf>, text: String) -> Store {
        Store {
            proxy,
            path,
            state: Mutex::new(State {
                version: 1,
                text,
                history: VecDeque::from([Version {
                    version: 1,
                    at: unix_now(),
                    by: "start".to_string(),
                    changes: Vec::new(),
                    fields: Vec::new(),
                    fields_omitted: 0,
                }]),
                frozen: false,
            }),
            token: Default::default(),
            shared: OnceLock::new(),
            stats: Default::default(),
            changed: tokio::sync::watch::Sender::new(1),
            #[cfg(test)]
            before_apply: Mutex::new(None),
        }
    }

    /// Makes this instance's API write to the fleet's `shared` objects; `version`: that of
    /// the running config (an etcd revision).
    pub fn set_shared(&self, shared: Arc<dyn Shared>, version: u64) {
        let mut state = self.lock();
        state.version = version;
        for v in state.history.iter_mut() {
            v.version = version;
        }
        let _ = self.shared.set(shared);
    }

    /// The fleet's shared objects, on a fleet member.
    pub fn shared(&self) -> Option<&Arc<dyn Shared>> {
        self.shared.get()
    }

    /// The config file changes persist to.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }

    /// The running config's version and text.
    pub fn current(&self) -> (u64, String) {
        let state = self.lock();
        (state.version, self.text(&state))
    }

    /// The running config's text: on a fleet member, assembled when asked from the
    /// objects it runs (a change among 10,000 objects does not assemble it).
    fn text(&self, state: &State) -> String {
        match self.shared() {
            Some(shared) => shared.text(),
            None => state.text.clone(),
        }
    }

    /// Sees every new version of the running config.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The versions remembered, oldest first.
    pub fn history(&self) -> Vec<Version> {
        self.lock().history.iter().cloned().collect()
    }

    /// SIGHUP: re-reads the config file and applies it (nothing to persist).
    pub fn reload_file(&self) -> Result<Applied, ApiError> {
        let Some(path) = &self.path else {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "no config file to reload",
                "start weir with -c FILE",
            ));
        };
        // The same message and fix as `weir check` gives for this file (not UTF-8, a FIFO).
        let read = || {
            weir_config::read_config(path).map_err(|e| {
                let e = weir_config::ConfigError::io(&path.display().to_string(), &e);
                let status = StatusCode::INTERNAL_SERVER_ERROR;
                let at = Some(e.file);
                ApiError {
                    at,
                    ..ApiError::new(status, e.message, e.fix)
                }
            })
        };
        if let Some(shared) = self.shared() {
            shared.reload_local(read()?)?;
            return Ok(self.unchanged());
        }
        // Read under the lock: read before it, the text could predate an API change that
        // held the lock meanwhile, and applying it would undo that acknowledged change.
        let mut state = self.lock();
        let text = read()?;
        let origin = Origin::new("SIGHUP");
        self.commit(&mut state, text, WriteMode::default(), &origin, false)
    }

    /// Replaces the whole config with `text`.
    pub fn replace(
        &self,
        text: String,
        mode: WriteMode,
        origin: &Origin,
    ) -> Result<Applied, ApiError> {
        if let Some(shared) = self.shared() {
            return self.write_shared(shared, mode, origin, |_| Ok(text.clone()));
        }
        let mut state = self.lock();
        check_version(&state, mode)?;
        self.commit(&mut state, text, mode, origin, true)
    }

    /// Changes the config document with `edit` (one object), then applies it.
    pub fn edit(
        &self,
        mode: WriteMode,
        origin: &Origin,
        edit: impl Fn(&mut toml_edit::DocumentMut) -> Result<(), ApiError>,
    ) -> Result<Applied, ApiError> {
        let edited = |text: &str| {
            let mut doc: toml_edit::DocumentMut = text.parse().map_err(|_| {
                ApiError::new(
                    StatusCode::CONFLICT,
                    "the running config text cannot be edited",
                    "replace the whole config with PUT /api/v1/config",
                )
            })?;
            edit(&mut doc)?;
            Ok(doc.to_string())
        };
        if let Some(shared) = self.shared() {
            return self.write_shared(shared, mode, origin, edited);
        }
        let mut state = self.lock();
        check_version(&state, mode)?;
        let text = edited(&state.text)?;
        self.commit(&mut state, text, mode, origin, true)
    }

    /// A fleet member's write: `make` gives the new text from the running one; its objects
    /// are written to the fleet, and this returns once this instance applied them. Edited
    /// again on the newer text when another change came in between (no If-Match lost).
    fn write_shared(
        &self,
        shared: &Arc<dyn Shared>,
        mode: WriteMode,
        origin: &Origin,
        make: impl Fn(&str) -> Result<String, ApiError>,
    ) -> Result<Applied, ApiError> {
        for _ in 0..MOVED_RETRIES {
            let (base_version, base) = {
                let state = self.lock();
                check_frozen(&state)?;
                (state.version, self.text(&state))
            };
            let (config, text) = shared.parse(&make(&base)?)?;
            let running = self.proxy.config();
            check_admin_unchanged(&running, &config)?;
            let changes = diff(&running, &config);
            if mode.dry_run {
                let fields = weir_config::field_diff::field_changes(&base, &text);
                return Ok(Applied {
                    version: base_version,
                    changes,
                    fields,
                });
            }
            match shared.write(&base, base_version, &text, mode.expect) {
                Ok(version) => {
                    shared.wait_applied(version)?;
                    let shown: Vec<String> = changes.iter().map(ToString::to_string).collect();
                    tracing::info!(by = %origin.by, version, changes = ?shown, "shared config written");
                    return Ok(Applied {
                        version,
                        changes,
                        fields: Vec::new(),
                    });
                }
                Err(SharedError::Moved) => continue,
                Err(SharedError::Failed(e)) => return Err(e),
            }
        }
        Err(ApiError::new(
            StatusCode::CONFLICT,
            "the shared objects kept changing while this change was being written",
            "retry the request",
        ))
    }

    /// The running version, as the outcome of a change applied elsewhere (the fleet's).
    fn unchanged(&self) -> Applied {
        Applied {
            version: self.lock().version,
            changes: Vec::new(),
            fields: Vec::new(),
        }
    }

    /// Applies a config the fleet built from its shared objects (validated already) as
    /// `version`; `by` says who changed them, `fields` the keys they edited. Nothing is
    /// persisted here: the fleet keeps its own snapshot of the objects (and the text).
    pub fn apply_shared(
        &self,
        config: Config,
        fields: Vec<FieldChange>,
        version: u64,
        by: &str,
    ) -> Result<Vec<Change>, ApiError> {
        let mut state = self.lock();
        check_admin_unchanged(&self.proxy.config(), &config)?;
        let changes = self.proxy.apply(config).map_err(ApiError::from)?;
        let from = state.version;
        state.version = version;
        record(&mut state, from, &Origin::new(by), &changes, fields);
        self.changed.send_replace(state.version);
        Ok(changes)
    }

    fn commit(
        &self,
        state: &mut State,
        text: String,
        mode: WriteMode,
        origin: &Origin,
        persist: bool,
    ) -> Result<Applied, ApiError> {
        let name = origin.source.clone().unwrap_or_else(|| {
            self.path
                .as_deref()
                .map_or_else(|| "api".to_string(), |p| p.display().to_string())
        });
        let base = self.path.as_deref().map(weir_config::config_dir);
        let config = weir_config::parse_in(&text, &name, base.as_deref())?;
        #[cfg(test)]
        if let Some(hook) = self.before_apply.lock().unwrap().as_mut() {
            hook();
        }
        let running = self.proxy.config();
        check_admin_unchanged(&running, &config)?;
        if mode.dry_run {
            // Compared as it would run: discovered pools with the servers DNS gave them.
            let config = self.proxy.with_discovered(config);
            return Ok(Applied {
                version: state.version,
                changes: diff(&running, &config),
                fields: field_changes(&state.text, &text),
            });
        }
        // Written first, then applied, what the file held written back if either fails:
        // the running config and the file never disagree once this returns
        // (`config_file`). A file that already holds `text` (the operator's edit, applied
        // with `weir ctl apply -f`) is not written, nor set back.
        let file = match self.path.as_deref().filter(|_| persist) {
            Some(path) => Some(ConfigFile::at(path)?),
            None => None,
        };
        let mut held = None;
        if let Some(file) = &file {
            let before = file.holding(&state.text, &text)?;
            if before.as_deref() != Some(text.as_bytes()) {
                let before = before.unwrap_or_else(|| state.text.clone().into_bytes());
                if let Err(e) = file.write(text.as_bytes()) {
                    undo(file, &before);
                    return Err(e);
                }
                held = Some(before);
            }
        }
        let changes = match self.proxy.apply(config) {
            Ok(changes) => changes,
            Err(e) => {
                if let (Some(file), Some(before)) = (&file, &held) {
                    undo(file, before);
                }
                return Err(located(e, &name, &text));
            }
        };
        state.version += 1;
        let fields = field_changes(&state.text, &text);
        state.text = text;
        record(state, state.version - 1, origin, &changes, fields);
        self.changed.send_replace(state.version);
        Ok(Applied {
            version: state.version,
            changes,
            fields: Vec::new(),
        })
    }

    /// Refuses (503) or accepts writes again; see `State::frozen`.
    pub fn set_frozen(&self, frozen: bool) {
        self.lock().frozen = frozen;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Writes `before` back over the config file after a change that did not run.
fn undo(file: &ConfigFile<'_>, before: &[u8]) {
    if let Err(e) = file.write(before) {
        tracing::error!(error = %e.message,
            "config file may hold a change that did not run: check it before a restart");
    }
}

/// An apply error, with the position of its field in `text` (a certificate file that
/// cannot be read is reported at the key that names it).
fn located(e: weir_core::ApplyError, name: &str, text: &str) -> ApiError {
    let field = e.field();
    let mut error = ApiError::from(e);
    if !field.is_empty() {
        let at = weir_config::ConfigError::at_field(name, text, &field, "", "");
        error.at = Some(format!("{}:{}:{}", at.file, at.line, at.column));
    }
    error
}

/// Logs the change from version `from` that made `state.version` and remembers it, with
/// the keys it edited.
fn record(
    state: &mut State,
    from: u64,
    origin: &Origin,
    changes: &[Change],
    mut fields: Vec<FieldChange>,
) {
    let changes: Vec<String> = changes.iter().map(ToString::to_string).collect();
    tracing::info!(
        by = %origin.by,
        from,
        version = state.version,
        changes = ?changes,
        "config changed"
    );
    if state.history.len() == HISTORY {
        state.history.pop_front();
    }
    let fields_omitted = fields.len().saturating_sub(HISTORY_FIELDS);
    fields.truncate(HISTORY_FIELDS);
    state.history.push_back(Version {
        version: state.version,
        at: unix_now(),
        by: origin.by.clone(),
        changes,
        fields,
        fields_omitted,
    });
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How often a fleet member edits again when other changes keep coming in between.
const MOVED_RETRIES: usize = 5;

fn check_frozen(state: &State) -> Result<(), ApiError> {
    if state.frozen {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "a binary upgrade is in progress",
            "retry in a moment; the new process takes the change",
        ));
    }
    Ok(())
}

fn check_version(state: &State, mode: WriteMode) -> Result<(), ApiError> {
    check_frozen(state)?;
    match mode.expect {
        Some(v) if v != state.version => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "the config changed: version {} is stale, the running version is {}",
                v, state.version
            ),
            "GET the object again and retry with its version in If-Match",
        )),
        _ => Ok(()),
    }
}

/// The admin listener itself is not rebound at run time.
fn check_admin_unchanged(running: &Config, new: &Config) -> Result<(), ApiError> {
    if running.admin.bind != new.admin.bind {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "the admin listener cannot move while running",
            "keep [admin] bind as it is, or restart (or `weir upgrade`) to change it",
        )
        .field("admin.bind"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_keeps_its_first_edited_keys() {
        let mut state = State {
            version: 2,
            text: String::new(),
            history: VecDeque::new(),
            frozen: false,
        };
        let field = |i: usize| FieldChange {
            path: format!("upstreams.u{i}.lb"),
            old: None,
            new: Some("\"random\"".into()),
        };
        let fields = (0..HISTORY_FIELDS + 7).map(field).collect();
        record(&mut state, 1, &Origin::new("test"), &[], fields);
        let v = &state.history[0];
        assert_eq!((v.fields.len(), v.fields_omitted), (HISTORY_FIELDS, 7));
        let json = v.to_json();
        assert_eq!(json["fields"][0]["path"], "upstreams.u0.lb");
        assert_eq!(json["fields"][0]["old"], serde_json::Value::Null);
        assert_eq!(json["fields_omitted"], 7);
    }

    const CONFIG: &str = "[server]\nworkers = 1\ndrain_timeout = \"0s\"\n\n\
                          [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n";

    /// A store on a running proxy whose config file (in a directory of its own) holds
    /// `CONFIG`.
    fn store_with_file(tag: &str) -> (Arc<Store>, PathBuf) {
        let dir = std::env::temp_dir().join(format!("weir-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("weir.toml");
        std::fs::write(&path, CONFIG).unwrap();
        let config = weir_config::parse_str(CONFIG, "test").unwrap();
        let proxy = Arc::new(Proxy::start(config, 1).unwrap());
        let store = Store::new(proxy, Some(path.clone()), CONFIG.to_string());
        (Arc::new(store), path)
    }

    fn with_upstream(text: &str, name: &str) -> String {
        format!("{text}\n[upstreams.{name}]\nservers = [{{ addr = \"127.0.0.1:9\" }}]\n")
    }

    /// Whether thread `tid` of this process sleeps (blocked on the store's lock).
    fn sleeping(tid: &str) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"));
        // The state follows the command's closing parenthesis.
        stat.ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('S')))
            .unwrap_or(false)
    }

    /// A SIGHUP that comes while an API change is being applied reloads the file as that
    /// change left it: read before the store's lock, it was the older text, and applying
    /// it undid the change the API had acknowledged.
    #[test]
    fn a_reload_during_an_api_change_keeps_the_change() {
        let (store, path) = store_with_file("hup");
        let (blocked_tx, blocked) = std::sync::mpsc::channel();
        let reloader = store.clone();
        *store.before_apply.lock().unwrap() = Some(Box::new(move || {
            let reloader = reloader.clone();
            let (tid_tx, tid) = std::sync::mpsc::channel();
            let reload = std::thread::spawn(move || {
                let me = std::fs::read_link("/proc/thread-self").unwrap();
                tid_tx
                    .send(me.file_name().unwrap().to_string_lossy().into_owned())
                    .unwrap();
                reloader.reload_file().map(|a| a.changes.len())
            });
            let tid = tid.recv().unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !sleeping(&tid) && std::time::Instant::now() < deadline {
                std::thread::yield_now();
            }
            blocked_tx.send(reload).unwrap();
        }));
        let changed = with_upstream(CONFIG, "u");
        store
            .replace(changed.clone(), WriteMode::default(), &Origin::new("test"))
            .unwrap();
        *store.before_apply.lock().unwrap() = None;
        let reload = blocked.recv().unwrap().join().unwrap().unwrap();
        assert_eq!(reload, 0, "the reload found the file as the change left it");
        assert!(store
            .proxy()
            .config()
            .upstreams
            .iter()
            .any(|u| u.name == "u"));
        assert_eq!(store.current().1, changed);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), changed);
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    /// An edit of the file not reloaded yet is not overwritten by an API change; a change
    /// that fails to apply leaves the file as it was.
    #[test]
    fn the_file_keeps_a_hand_edit_and_never_holds_a_change_that_failed() {
        let (store, path) = store_with_file("edit");
        let edited = format!("{CONFIG}# the operator's edit\n");
        std::fs::write(&path, &edited).unwrap();
        let origin = Origin::new("test");
        let refused = store
            .replace(with_upstream(CONFIG, "u"), WriteMode::default(), &origin)
            .unwrap_err();
        assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.message);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), edited);
        assert!(!store
            .proxy()
            .config()
            .upstreams
            .iter()
            .any(|u| u.name == "u"));

        store.reload_file().unwrap();
        // A port taken: valid, but the apply fails.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let failing = edited.replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
        let failed = store.replace(failing.clone(), WriteMode::default(), &origin);
        assert!(failed.is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), edited);
        // The operator's own edit, applied as the file holds it (`weir ctl apply -f`), stays
        // in the file when it fails to apply: the edit is theirs to fix.
        std::fs::write(&path, &failing).unwrap();
        assert!(store
            .replace(failing.clone(), WriteMode::default(), &origin)
            .is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), failing);
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
}
