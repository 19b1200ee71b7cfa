//! Automatic certificates shared by a fleet (`[cluster] key_file`, docs/cluster.md): the
//! interface of the shared store (etcd, implemented in weir-cluster) and what this module
//! does with it.
//!
//! The storage directory stays each instance's own copy, loaded and installed as always;
//! the shared store is where the fleet agrees. An order takes the store's lock of its
//! name set first (held by one instance at a time, released by lease expiry if that
//! instance dies), first takes a certificate another instance wrote, and writes its result
//! fenced by the lock: the certificate and key land together, or not at all when the lock
//! was lost meanwhile. The challenges of an order are published too, so whichever instance
//! the ACME server reaches answers them. Other instances install what the store announces
//! ([`fleet_wrote`]) through the same path a local renewal takes ([`AutoCerts::installed`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::{storage, AutoCerts};

/// A future the store runs on its own runtime; awaited from the certificate manager's.
pub type StoreFuture<T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send>>;

/// A file of the storage directory, by name (`acme-....pem`, `account-....json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    pub name: String,
    pub contents: Vec<u8>,
}

/// Whether the stored file `name` is private (a key, or an account holding one): every
/// file but a certificate (`.pem`). The store encrypts those it writes and refuses those
/// it reads unencrypted, both by this.
pub fn is_private(name: &str) -> bool {
    !name.ends_with(".pem")
}

/// The lock of one name set (`item`), held while this lives: `token` is the fencing
/// token (the revision the lock was taken at), `lease` what the store ties the lock and
/// the order's challenges to.
pub struct Fence {
    pub item: String,
    pub token: i64,
    pub lease: i64,
    release: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Fence {
    pub fn new(
        item: String,
        token: i64,
        lease: i64,
        release: Box<dyn FnOnce() + Send + Sync>,
    ) -> Fence {
        Fence {
            item,
            token,
            lease,
            release: Some(release),
        }
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// A challenge to publish for the fleet to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    /// HTTP-01: the token and its key authorization.
    Http01 {
        token: String,
        key_authorization: String,
    },
    /// TLS-ALPN-01: the name and the SHA-256 of its key authorization.
    TlsAlpn01 { name: String, digest: Vec<u8> },
}

/// Where the fleet's certificates are shared.
pub trait Store: Send + Sync {
    /// Takes the order lock of `item` (a name set's file stem), or `None` when another
    /// instance holds it.
    fn lock(&self, item: &str) -> StoreFuture<Option<Fence>>;
    /// The files named, each `None` when the store has none of that name.
    fn read(&self, names: &[String]) -> StoreFuture<Vec<Option<Vec<u8>>>>;
    /// Writes `files` in one transaction; with a fence, only while it still holds the
    /// lock (`Ok(false)` when it does not).
    fn write(&self, fence: Option<&Fence>, files: Vec<File>) -> StoreFuture<bool>;
    /// Publishes `challenge` for as long as `fence` lives.
    fn challenge(&self, fence: &Fence, challenge: Challenge) -> StoreFuture<()>;
}

static STORE: OnceLock<Arc<dyn Store>> = OnceLock::new();

/// Makes `store` the fleet's (once per process, before the first order).
pub fn set(store: Arc<dyn Store>) {
    let _ = STORE.set(store);
}

/// The fleet's store, when certificates are shared.
pub fn get() -> Option<&'static Arc<dyn Store>> {
    STORE.get()
}

/// Orders that found the lock held by another instance (`weir_acme_fleet_lock_waits_total`).
pub static LOCK_WAITS: AtomicU64 = AtomicU64::new(0);
/// Certificates installed from another instance's order or issue
/// (`weir_acme_fleet_installs_total`).
pub static INSTALLS: AtomicU64 = AtomicU64::new(0);

/// The shared certificate and key of `auto` written to its storage files and installed,
/// when the store has a pair different from the local one. `Ok(true)`: installed.
pub async fn pull(store: &dyn Store, auto: &AutoCerts) -> Result<bool, String> {
    let files = auto.files();
    let names = [file_name(&files.cert), file_name(&files.key)];
    let mut got = store.read(&names).await?.into_iter();
    let (Some(Some(chain)), Some(Some(key))) = (got.next(), got.next()) else {
        return Ok(false);
    };
    if read(&files.cert).is_ok_and(|local| local == chain) {
        return Ok(false);
    }
    if auto.source == super::Source::Internal {
        // The CA too, for clients to be given from any instance (`ca.pem`), there by the
        // time its certificate is served.
        adopt_ca(store, &auto.storage).await?;
    }
    storage::write_pair(&files.cert, &chain, &files.key, &key)
        .map_err(|e| format!("{}: {e}", files.cert.display()))?;
    auto.installed().map_err(|e| e.to_string())?;
    INSTALLS.fetch_add(1, Ordering::Relaxed);
    tracing::info!(names = %auto.names.join(","), "certificate installed from the fleet");
    Ok(true)
}

/// The fleet's lock of `auto`'s name set, after installing what another instance wrote;
/// `None` while another instance holds it (its result arrives through the store).
pub async fn lock(store: &dyn Store, auto: &AutoCerts) -> Result<Option<Fence>, String> {
    let item = storage::stem(&auto.names, auto.source.label());
    let fence = store.lock(&item).await?;
    if fence.is_none() {
        LOCK_WAITS.fetch_add(1, Ordering::Relaxed);
        tracing::info!(names = %auto.names.join(","), "another instance of the fleet is obtaining this certificate; waiting for it");
    }
    if let Err(e) = pull(store, auto).await {
        tracing::warn!(names = %auto.names.join(","), error = %e, "certificate from the fleet not installed");
    }
    Ok(fence)
}

/// Writes a new certificate and key: to the fleet's store first (one transaction, only
/// while `fence` still holds the lock), then to the storage files, and installs them.
pub async fn save(
    auto: &AutoCerts,
    fence: Option<&Fence>,
    chain: &[u8],
    key: &[u8],
) -> Result<(), String> {
    let files = auto.files();
    // This process's own write comes back by the watch, maybe before the files below are
    // written: it is no certificate from the fleet to install.
    let _saving = Saving::start(file_name(&files.cert));
    if let (Some(store), Some(fence)) = (get(), fence) {
        let pair = pair(&files.cert, chain.to_vec(), &files.key, key.to_vec());
        if !store.write(Some(fence), pair).await? {
            return Err(
                "the fleet's lock was lost (its lease expired: etcd unreachable too \
                        long) before the certificate was written; it is dropped"
                    .to_string(),
            );
        }
    }
    storage::write_pair(&files.cert, chain, &files.key, key)
        .map_err(|e| format!("certificate and key: {e}"))?;
    auto.installed().map_err(|e| e.to_string())
}

/// The certificate files this process is saving now, by name.
static SAVING: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A name in [`SAVING`] while this lives.
struct Saving(String);

impl Saving {
    fn start(name: String) -> Saving {
        SAVING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(name.clone());
        Saving(name)
    }

    fn has(name: &str) -> bool {
        SAVING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|n| n == name)
    }
}

impl Drop for Saving {
    fn drop(&mut self) {
        let mut saving = SAVING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = saving.iter().position(|n| *n == self.0) {
            saving.swap_remove(at);
        }
    }
}

/// Issues `auto`'s certificate from the fleet's internal CA: under the name set's lock,
/// unless another instance's is installed meanwhile; `Ok(false)`: not issued here.
pub async fn issue_internal(
    store: &dyn Store,
    auto: &AutoCerts,
    lifetime: std::time::Duration,
) -> Result<bool, String> {
    let Some(fence) = lock(store, auto).await? else {
        return Ok(false);
    };
    if auto.load_stored().is_ok() && !auto.needs_renewal(super::unix_now()) {
        return Ok(false);
    }
    if !fleet_ca(store, &auto.storage).await? {
        return Ok(false);
    }
    super::internal::issue(&auto.storage, &auto.names, lifetime).map_err(|e| e.to_string())?;
    let files = auto.files();
    let (chain, key) = (read(&files.cert)?, read(&files.key)?);
    save(auto, Some(&fence), &chain, &key).await?;
    Ok(true)
}

/// Makes the fleet's CA this storage directory's: the one in the store, or (none there
/// yet) this directory's, made if missing, written to the store. Under the store's `ca`
/// lock, so two instances never make two CAs; `Ok(false)`: another instance holds it.
async fn fleet_ca(store: &dyn Store, dir: &std::path::Path) -> Result<bool, String> {
    let Some(fence) = store.lock("ca").await? else {
        return Ok(false);
    };
    if adopt_ca(store, dir).await? {
        return Ok(true);
    }
    let (cert, key) = (dir.join("ca.pem"), dir.join("ca.key"));
    super::internal::make_ca(dir).map_err(|e| e.to_string())?;
    let files = pair(&cert, read(&cert)?, &key, read(&key)?);
    store.write(Some(&fence), files).await
}

/// Writes the fleet's CA into `dir` (over another one there); `false`: the store has none.
async fn adopt_ca(store: &dyn Store, dir: &std::path::Path) -> Result<bool, String> {
    let (cert, key) = (dir.join("ca.pem"), dir.join("ca.key"));
    let names = [file_name(&cert), file_name(&key)];
    let mut got = store.read(&names).await?.into_iter();
    let (Some(Some(pem)), Some(Some(private))) = (got.next(), got.next()) else {
        return Ok(false);
    };
    if read(&cert).ok().as_ref() != Some(&pem) {
        storage::write_pair(&cert, &pem, &key, &private)
            .map_err(|e| format!("{}: {e}", cert.display()))?;
        tracing::info!(ca = %cert.display(), "the fleet's internal CA installed");
    }
    Ok(true)
}

/// A certificate and its (private) key as files of the store.
fn pair(cert: &std::path::Path, chain: Vec<u8>, key: &std::path::Path, pem: Vec<u8>) -> Vec<File> {
    vec![
        File {
            name: file_name(cert),
            contents: chain,
        },
        File {
            name: file_name(key),
            contents: pem,
        },
    ]
}

/// A storage file's bytes, through the checks of every file the config leads to
/// (a regular file, bounded); the error names the file.
fn read(path: &std::path::Path) -> Result<Vec<u8>, String> {
    super::super::pem::read(path).map_err(|e| format!("{}: {}", path.display(), e.reason))
}

/// A stored file's name in the store (its name in the storage directory).
pub fn file_name(path: &std::path::Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The store says it has a new `name` (a certificate file): each automatic certificate
/// of this process stored under that name installs it.
pub async fn fleet_wrote(name: &str) {
    let Some(store) = get() else { return };
    if Saving::has(name) {
        return;
    }
    for auto in super::live() {
        if file_name(&auto.files().cert) != name {
            continue;
        }
        if let Err(e) = pull(store.as_ref(), &auto).await {
            tracing::warn!(names = %auto.names.join(","), error = %e, "certificate from the fleet not installed");
        }
    }
}

/// Publishes a challenge of the order holding `fence`, or answers it locally only
/// (no fleet).
pub async fn publish(fence: Option<&Fence>, challenge: Challenge) -> Result<(), String> {
    match (get(), fence) {
        (Some(store), Some(fence)) => store.challenge(fence, challenge).await,
        _ => Ok(()),
    }
}

/// The fleet published a challenge (`Some`) or took it down (`None` value): answer it here.
pub fn fleet_challenge(challenge: Challenge, up: bool) {
    use super::challenge as local;
    match (challenge, up) {
        (
            Challenge::Http01 {
                token,
                key_authorization,
            },
            true,
        ) => local::add_http01(&token, &key_authorization),
        (Challenge::Http01 { token, .. }, false) => local::remove_http01(&token),
        (Challenge::TlsAlpn01 { name, digest }, true) => {
            if let Err(e) = local::add_tls_alpn01(&name, &digest) {
                tracing::warn!(name, error = %e, "fleet TLS-ALPN-01 challenge not set up");
            }
        }
        (Challenge::TlsAlpn01 { name, .. }, false) => local::remove_tls_alpn01(&name),
    }
}
