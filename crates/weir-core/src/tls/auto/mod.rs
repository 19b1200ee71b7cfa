//! Automatic certificates: the internal CA and ACME. What each part owns:
//! - this module: [`AutoCerts`], the certificate of one name set (the current one, swapped
//!   in live, lock-free for handshakes), its status for `weir ctl get certs`, and the
//!   process registry that keeps one per storage and name set across config reloads;
//! - `storage`: the files (0600 keys, whole writes) and the storage lock;
//! - `internal`: the local CA and the leaves it issues;
//! - `challenge`: the HTTP-01 tokens and TLS-ALPN-01 certificates being validated;
//! - `acme`: one ACME order, from account to certificate;
//! - `manager`: the background thread that renews (two thirds into the lifetime) and
//!   retries with jittered exponential back-off.

pub mod acme;
pub mod challenge;
mod internal;
pub mod manager;
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
        let (cert, key) = storage::cert_files(&self.storage, &self.names);
        CertKey { cert, key }
    }

    /// Loads the stored certificate into use; `Err` when it is missing or unusable.
    fn load_stored(&self) -> Result<(), TlsError> {
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        let loaded = load(&self.files(), &provider, unix_now())?;
        let renew_at = renew_at(loaded.facts.not_before, loaded.facts.not_after);
        if !covers(&loaded.facts.names, &self.names) {
            return Err(TlsError::new(
                &loaded.file,
                "the stored certificate does not cover every configured name",
            ));
        }
        self.current.store(Some(Arc::new(loaded)));
        self.update(|s| s.renew_at = Some(renew_at));
        Ok(())
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
        self.load_stored()?;
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
    if let Err(e) = auto.load_stored() {
        if source == Source::Internal {
            internal::issue(&auto.storage, &auto.names, internal_lifetime(&auto))?;
            auto.load_stored()?;
        } else if auto.files().cert.exists() {
            tracing::warn!(error = %e, "stored ACME certificate unusable; ordering a new one");
        }
    }
    map.retain(|_, w| w.strong_count() > 0);
    map.insert(key, Arc::downgrade(&auto));
    Ok(Some(auto))
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
