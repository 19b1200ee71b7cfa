//! Automatic certificates: the internal CA and ACME. What each part owns:
//! - this module: [`AutoCerts`], the certificate of one name set (the current one, swapped
//!   in live, lock-free for handshakes), its status for `weir ctl get certs`, and the
//!   process registry that keeps one per storage and name set across config reloads;
//! - `storage`: the files (0600 keys, whole writes) and the storage lock;
//! - `shared`: the fleet's store (etcd) the files are shared through, its order lock;
//! - `internal`: the local CA and the leaves it issues;
//! - `challenge`: the HTTP-01 tokens and TLS-ALPN-01 certificates being validated;
//! - `acme`: one ACME order, from account to certificate;
//! - `manager`: the background thread that renews (two thirds into the lifetime) and
//!   retries with jittered exponential back-off.

pub mod acme;
pub mod challenge;
mod internal;
pub mod manager;
pub mod shared;
pub mod storage;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use arc_swap::ArcSwapOption;
use weir_config::{Acme, CertKey, Tls};

use super::facts::{format_utc, unix_now};
use super::store::{load, LoadedCert};
use super::TlsError;

/// Where a certificate comes from, as `weir ctl get certs` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    File,
    Acme,
    Internal,
}

impl Source {
    pub fn label(self) -> &'static str {
        match self {
            Source::File => "file",
            Source::Acme => "acme",
            Source::Internal => "internal",
        }
    }
}

/// How the certificate of an [`AutoCerts`] is obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    Internal { lifetime: std::time::Duration },
    Acme(Acme),
}

/// What is known of an automatic certificate beyond the certificate itself.
#[derive(Debug, Clone, Default)]
pub struct Status {
    /// The last failure of an order (or of an internal issue), until one succeeds.
    pub last_error: Option<String>,
    /// When the current certificate is due for renewal (Unix seconds).
    pub renew_at: Option<i64>,
    /// When the next attempt may start after failures (Unix seconds).
    pub retry_at: Option<i64>,
    /// Failures in a row (the back-off exponent).
    pub failures: u32,
    /// An order is in progress.
    pub running: bool,
}

/// The certificate of one name set, shared by every snapshot that has it.
#[derive(Debug)]
pub struct AutoCerts {
    pub source: Source,
    pub names: Vec<String>,
    pub storage: PathBuf,
    pub spec: Spec,
    current: ArcSwapOption<LoadedCert>,
    status: Mutex<Status>,
}

impl AutoCerts {
    /// The certificate in use, if there is one yet (a lock-free load: handshakes call it).
    #[inline]
    pub fn current(&self) -> Option<Arc<LoadedCert>> {
        self.current.load_full()
    }

    pub fn status(&self) -> Status {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn update(&self, f: impl FnOnce(&mut Status)) {
        if let Ok(mut status) = self.status.lock() {
            f(&mut status);
        }
    }

    /// The stored certificate and key files.
    pub fn files(&self) -> CertKey {
        let (cert, key) = storage::cert_files(&self.storage, &self.names, self.source.label());
        CertKey { cert, key }
    }

    /// Loads the stored certificate into use; `Ok(false)`: what was installed covers only
    /// some of the names (it is due now, so a certificate for all of them is obtained
    /// while it keeps serving the names it has); `Err` when none is usable.
    fn load_stored(&self) -> Result<bool, TlsError> {
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        let now = unix_now();
        let files = self.files();
        // A crash between the two renames of a pair write leaves a mismatched pair: the
        // pair kept from before it is then the one to serve.
        let own = load(&files, &provider, now).or_else(|e| {
            let prev = CertKey {
                cert: storage::prev_path(&files.cert),
                key: storage::prev_path(&files.key),
            };
            if prev.cert.exists() {
                load(&prev, &provider, now).map_err(|_| e)
            } else {
                Err(e)
            }
        });
        let loaded = match own {
            Ok(loaded) if covers(&loaded.facts.names, &self.names) => {
                let renew_at = renew_at(loaded.facts.not_before, loaded.facts.not_after);
                self.current.store(Some(Arc::new(loaded)));
                self.update(|s| s.renew_at = Some(renew_at));
                return Ok(true);
            }
            Ok(loaded) => loaded,
            Err(e) => self.stored_partial(&provider, now).ok_or(e)?,
        };
        self.current.store(Some(Arc::new(loaded)));
        self.update(|s| s.renew_at = Some(now));
        Ok(false)
    }

    /// A stored, still valid certificate of this source serving some of the names (one
    /// issued for the name set before a reload changed it, or under the old file name).
    fn stored_partial(
        &self,
        provider: &rustls::crypto::CryptoProvider,
        now: i64,
    ) -> Option<LoadedCert> {
        let source = self.source.label();
        storage::other_cert_files(&self.storage, &self.names, source)
            .into_iter()
            .filter(|(cert, _)| cert.exists())
            .filter_map(|(cert, key)| load(&CertKey { cert, key }, provider, now).ok())
            .find(|loaded| serves_some(&loaded.facts.names, &self.names))
    }

    /// Whether an attempt to obtain a new certificate should start now: none is running,
    /// no back-off is being waited out, and there is no certificate or it is due.
    pub fn due(&self, now: i64) -> bool {
        let s = self.status();
        !s.running && s.retry_at.is_none_or(|t| now >= t) && self.needs_renewal(now)
    }

    /// There is no certificate, or it is two thirds into its lifetime.
    pub fn needs_renewal(&self, now: i64) -> bool {
        self.current.load().is_none() || self.status().renew_at.is_none_or(|t| now >= t)
    }

    /// Records a new certificate written to the storage files: loads it into use.
    pub fn installed(&self) -> Result<(), TlsError> {
        if !self.load_stored()? {
            return Err(TlsError::new(
                &self.files().cert,
                "the new certificate does not cover every configured name",
            ));
        }
        self.update(|s| {
            s.last_error = None;
            s.failures = 0;
            s.retry_at = None;
        });
        if let Some(cert) = self.current() {
            tracing::info!(names = %self.names.join(","), source = self.source.label(),
                expires = %format_utc(cert.facts.not_after), "certificate installed");
        }
        Ok(())
    }

    /// Records a failure; the next attempt waits `backoff` (jittered by the caller).
    pub fn failed(&self, error: String, backoff: std::time::Duration) {
        let retry_at = unix_now() + i64::try_from(backoff.as_secs()).unwrap_or(i64::MAX / 2);
        tracing::warn!(names = %self.names.join(","), error = %error, retry_at = %format_utc(retry_at),
            "automatic certificate not obtained; retrying later");
        RENEWAL_FAILURES.fetch_add(1, Ordering::Relaxed);
        self.update(|s| {
            s.last_error = Some(error);
            s.failures = s.failures.saturating_add(1);
            s.retry_at = Some(retry_at);
        });
    }

    /// Puts the next attempt off by `wait` without counting a failure.
    pub fn wait(&self, wait: std::time::Duration) {
        let at = unix_now() + i64::try_from(wait.as_secs()).unwrap_or(i64::MAX / 2);
        self.update(|s| s.retry_at = Some(at));
    }

    pub(crate) fn set_running(&self, running: bool) {
        self.update(|s| s.running = running);
    }
}

/// Two thirds into the validity period.
pub fn renew_at(not_before: i64, not_after: i64) -> i64 {
    not_before + (not_after - not_before).max(0) * 2 / 3
}

/// Whether a certificate with `have` names serves every name of `want`.
fn covers(have: &[String], want: &[String]) -> bool {
    want.iter()
        .filter(|w| w.parse::<std::net::IpAddr>().is_err())
        .all(|w| have.contains(w))
}

/// Whether a certificate with `have` names serves at least one DNS name of `want`.
fn serves_some(have: &[String], want: &[String]) -> bool {
    want.iter()
        .filter(|w| w.parse::<std::net::IpAddr>().is_err())
        .any(|w| have.contains(w))
}

/// ACME orders completed, by result (`weir_acme_orders_total{result}`): valid, failed.
pub static ORDERS_VALID: AtomicU64 = AtomicU64::new(0);
pub static ORDERS_FAILED: AtomicU64 = AtomicU64::new(0);
/// Failed attempts to obtain or renew an automatic certificate.
pub static RENEWAL_FAILURES: AtomicU64 = AtomicU64::new(0);

type Key = (PathBuf, Vec<String>, Source);

/// The live [`AutoCerts`] of the process, by storage, names and source.
fn registry() -> &'static Mutex<HashMap<Key, Weak<AutoCerts>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<Key, Weak<AutoCerts>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// The automatic certificates of the process in use (by any snapshot).
fn live() -> Vec<Arc<AutoCerts>> {
    registry()
        .lock()
        .map(|map| map.values().filter_map(Weak::upgrade).collect())
        .unwrap_or_default()
}

/// The automatic certificate of `tls`, if it has one: the one already in use for the same
/// storage and names (a reload keeps it), else one loaded from storage. The internal CA
/// issues a certificate at once when none is stored; an ACME one starts empty and the
/// manager orders it.
pub fn obtain(tls: &Tls) -> Result<Option<Arc<AutoCerts>>, TlsError> {
    let (source, storage, names, spec) = match (&tls.acme, &tls.internal_ca) {
        (Some(a), _) => (Source::Acme, &a.storage, &a.domains, Spec::Acme(a.clone())),
        (None, Some(ca)) => (
            Source::Internal,
            &ca.storage,
            &ca.names,
            Spec::Internal {
                lifetime: ca.lifetime,
            },
        ),
        (None, None) => return Ok(None),
    };
    // An unusable storage directory is a config error now, not a failed order later.
    storage::create_dir(storage)
        .map_err(|e| TlsError::new(storage, format!("cannot create the storage directory: {e}")))?;
    let key = (storage.clone(), names.clone(), source);
    let mut map = registry()
        .lock()
        .map_err(|_| TlsError::new(storage, "registry poisoned"))?;
    if let Some(live) = map.get(&key).and_then(Weak::upgrade) {
        if live.spec == spec {
            return Ok(Some(live));
        }
    }
    let auto = Arc::new(AutoCerts {
        source,
        names: names.clone(),
        storage: storage.clone(),
        spec,
        current: ArcSwapOption::empty(),
        status: Mutex::new(Status::default()),
    });
    let stored = auto.load_stored();
    // A fleet's instance issues from the fleet's CA, through the manager (a second later).
    let issue_now = source == Source::Internal && shared::get().is_none();
    if issue_now && stored.as_ref().is_ok_and(|all| !all) {
        // Issuing is local and cheap: a certificate for every name at once.
        internal::issue(&auto.storage, &auto.names, internal_lifetime(&auto))?;
        auto.load_stored()?;
    }
    if let Err(e) = stored {
        if issue_now {
            internal::issue(&auto.storage, &auto.names, internal_lifetime(&auto))?;
            auto.load_stored()?;
        } else if auto.files().cert.exists() {
            tracing::warn!(error = %e, "stored certificate unusable; obtaining a new one");
        }
    }
    map.retain(|_, w| w.strong_count() > 0);
    map.insert(key, Arc::downgrade(&auto));
    Ok(Some(auto))
}

/// `weir check`'s look at the automatic certificate of `tls`, writing nothing (no
/// directory made, no CA or certificate issued): the storage directory must be writable,
/// or the nearest existing directory above it (it would be created there). Returns the
/// stored certificate for the report when one is there and usable.
pub fn check(tls: &Tls) -> Result<Option<LoadedCert>, TlsError> {
    let (source, storage, names) = match (&tls.acme, &tls.internal_ca) {
        (Some(a), _) => (Source::Acme, &a.storage, &a.domains),
        (None, Some(ca)) => (Source::Internal, &ca.storage, &ca.names),
        (None, None) => return Ok(None),
    };
    storage::check_writable(storage)
        .map_err(|e| TlsError::new(storage, format!("unusable storage directory: {e}")))?;
    let (cert, key) = storage::cert_files(storage, names, source.label());
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    // An unusable stored certificate is no config error: a start obtains a new one.
    Ok(load(&CertKey { cert, key }, &provider, unix_now()).ok())
}

fn internal_lifetime(auto: &AutoCerts) -> std::time::Duration {
    match auto.spec {
        Spec::Internal { lifetime } => lifetime,
        Spec::Acme(_) => std::time::Duration::from_secs(7 * 86_400),
    }
}

/// Issues a new internal certificate for `auto` now (the manager's renewal).
pub fn renew_internal(auto: &AutoCerts) -> Result<(), TlsError> {
    internal::issue(&auto.storage, &auto.names, internal_lifetime(auto))?;
    auto.installed()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn auto(storage: &std::path::Path, names: &[&str]) -> AutoCerts {
        AutoCerts {
            source: Source::Internal,
            names: names.iter().map(|n| n.to_string()).collect(),
            storage: storage.to_owned(),
            spec: Spec::Internal {
                lifetime: std::time::Duration::from_secs(86_400),
            },
            current: ArcSwapOption::empty(),
            status: Mutex::new(Status::default()),
        }
    }

    #[test]
    fn a_stored_certificate_for_some_of_the_names_serves_them_and_is_due_now() {
        let dir = std::env::temp_dir().join(format!("weir-partial-{}", std::process::id()));
        let before = auto(&dir, &["a.test"]);
        internal::issue(&dir, &before.names, std::time::Duration::from_secs(86_400)).unwrap();
        assert!(
            before.load_stored().unwrap(),
            "its own certificate covers it"
        );
        let now = unix_now();
        assert!(!before.needs_renewal(now));
        // A reload adds a name: the old certificate keeps serving a.test until renewal.
        let after = auto(&dir, &["a.test", "b.test"]);
        assert!(
            !after.load_stored().unwrap(),
            "installed, not covering b.test"
        );
        let current = after.current().expect("the old certificate is in use");
        assert!(current.facts.names.contains(&"a.test".to_owned()));
        assert!(
            after.needs_renewal(now),
            "due now, so a new one is obtained"
        );
        assert!(
            after.installed().is_err(),
            "a partial certificate is no new one"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_mismatched_pair_left_by_a_crash_falls_back_to_the_previous_pair() {
        let dir = std::env::temp_dir().join(format!("weir-prev-{}", std::process::id()));
        let certs = auto(&dir, &["a.test"]);
        let lifetime = std::time::Duration::from_secs(86_400);
        internal::issue(&dir, &certs.names, lifetime).unwrap();
        let old_cert = std::fs::read(certs.files().cert).unwrap();
        internal::issue(&dir, &certs.names, lifetime).unwrap();
        // A crash after the key's rename, before the certificate's: new key, old chain.
        storage::write(&certs.files().cert, &old_cert, false).unwrap();
        assert!(certs.load_stored().unwrap(), "the .prev pair serves");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn file_names_differ_per_name_set_and_source() {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let a = storage::stem(&names(&["a.test", "b.test"]), "acme");
        assert_eq!(
            a,
            storage::stem(&names(&["a.test", "b.test", "a.test"]), "acme")
        );
        assert_ne!(a, storage::stem(&names(&["a.test", "c.test"]), "acme"));
        assert_ne!(a, storage::stem(&names(&["a.test", "b.test"]), "internal"));
    }
}
