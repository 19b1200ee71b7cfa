//! The fleet's automatic certificates in etcd (`[cluster] key_file`): weir-core's
//! `shared::Store` on etcd, and the watch that installs what other instances wrote.
//!
//! Keys under `PREFIX/certs/` (docs/cluster.md):
//! - `files/NAME`: a file of the storage directory (`acme-...pem`, `acme-...key`,
//!   `account-....json`); private ones sealed with AES-256-GCM under the key of
//!   `key_file`, the etcd key as associated data (a value moved to another key does not
//!   open);
//! - `locks/STEM`: the order lock of a name set, put only if absent, under a lease of
//!   `lease_ttl` kept alive while the order runs; its revision is the fencing token the
//!   certificate and key are written with (one transaction, only if the lock key still
//!   has that revision);
//! - `challenges/http-01/TOKEN`, `challenges/tls-alpn-01/NAME`: the challenges of the
//!   order running, under the lock's lease (gone with it), answered by every instance.

use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use weir_config::cluster::FleetKey;
use weir_core::tls::auto::shared::{self, is_private, Challenge, Fence, File, Store, StoreFuture};

use crate::etcd::{prefix_end, Compare, Etcd, EtcdError, Event, Op, WatchMessage};

/// What a sealed value starts with (then the nonce, the ciphertext and its tag).
const SEALED: &[u8] = b"weir-aead-1:";

/// The fleet's certificate store in etcd.
pub struct EtcdStore {
    etcd: Arc<Etcd>,
    handle: tokio::runtime::Handle,
    /// `PREFIX/certs/`.
    root: String,
    node: String,
    lease_ttl: Duration,
    key: LessSafeKey,
}

impl EtcdStore {
    pub fn new(
        etcd: Arc<Etcd>,
        handle: tokio::runtime::Handle,
        settings: &weir_config::cluster::EtcdCluster,
        key: &FleetKey,
    ) -> Result<EtcdStore, String> {
        let unbound = UnboundKey::new(&AES_256_GCM, &key.bytes)
            .map_err(|_| format!("{}: not a usable AES-256 key", key.path.display()))?;
        Ok(EtcdStore {
            etcd,
            handle,
            root: format!("{}/certs/", settings.prefix),
            node: settings.node.clone(),
            lease_ttl: settings.lease_ttl,
            key: LessSafeKey::new(unbound),
        })
    }

    fn file_key(&self, name: &str) -> String {
        format!("{}files/{name}", self.root)
    }

    fn lock_key(&self, item: &str) -> String {
        format!("{}locks/{item}", self.root)
    }

    /// `value` sealed for etcd key `key`.
    fn seal(&self, key: &str, value: &[u8]) -> Result<Vec<u8>, String> {
        let mut nonce = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut nonce).map_err(|_| "no randomness".to_owned())?;
        let mut data = value.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(key.as_bytes()),
                &mut data,
            )
            .map_err(|_| format!("{key}: cannot encrypt"))?;
        Ok([SEALED, &nonce, &data].concat())
    }

    /// The plaintext of a value read at `key`. A private file ([`is_private`], as the
    /// writer seals) must be sealed: one put there in plaintext (by hand, or by a writer
    /// without the fleet's key) is refused, as one that does not open is, rather than used.
    fn open(&self, key: &str, value: Vec<u8>) -> Result<Vec<u8>, String> {
        let Some(rest) = value.strip_prefix(SEALED) else {
            if !is_private(key) {
                return Ok(value);
            }
            return Err(format!(
                "{key}: a private value stored unsealed (not written by an instance with the \
                 fleet's [cluster] key_file); not used (fix: delete etcd key {key} (etcdctl del \
                 {key}): the next instance to order or issue that certificate writes it sealed)"
            ));
        };
        let (nonce, sealed) = rest.split_at(NONCE_LEN.min(rest.len()));
        let nonce = Nonce::try_assume_unique_for_key(nonce)
            .map_err(|_| format!("{key}: truncated sealed value"))?;
        let mut data = sealed.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(key.as_bytes()), &mut data)
            .map_err(|_| {
                format!(
                    "{key}: cannot decrypt it: this instance's [cluster] key_file is not the key \
                     of the instance that wrote it (give every instance the same key_file)"
                )
            })?;
        Ok(plain.to_vec())
    }

    /// Runs `f` on the fleet's runtime (the etcd client lives there), awaited from any.
    fn run<T, F>(self: &Arc<Self>, f: impl FnOnce(Arc<Self>) -> F) -> StoreFuture<T>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, String>> + Send + 'static,
    {
        let task = self.handle.spawn(f(self.clone()));
        Box::pin(async move { task.await.map_err(|e| format!("etcd task: {e}"))? })
    }

    async fn take_lock(self: Arc<Self>, item: String) -> Result<Option<Fence>, String> {
        let key = self.lock_key(&item);
        let lease = self.etcd.lease_grant(self.lease_ttl).await.map_err(text)?;
        let put = Op::Put {
            key: key.clone(),
            value: self.node.clone().into_bytes(),
            lease,
        };
        let taken = self.etcd.txn(&[Compare::Absent(key)], &[put]).await;
        let (true, revision) = taken.map_err(text)? else {
            let _ = self.etcd.lease_revoke(lease).await;
            return Ok(None);
        };
        let keeper = self.handle.spawn(keep_alive(self.clone(), lease));
        let (etcd, handle) = (self.etcd.clone(), self.handle.clone());
        let release = Box::new(move || {
            keeper.abort();
            handle.spawn(async move { etcd.lease_revoke(lease).await });
        });
        tracing::info!(item, fence = revision, "fleet certificate lock taken");
        Ok(Some(Fence::new(item, revision, lease, release)))
    }

    async fn read_files(
        self: Arc<Self>,
        names: Vec<String>,
    ) -> Result<Vec<Option<Vec<u8>>>, String> {
        // One range over what the names share: a certificate and its key are read at one
        // revision, never one from before a write and one from after it.
        let keys: Vec<String> = names.iter().map(|n| self.file_key(n)).collect();
        let common = common_prefix(&keys);
        let (_, kvs) = self
            .etcd
            .range(&common, &prefix_end(&common))
            .await
            .map_err(text)?;
        let mut out = Vec::with_capacity(keys.len());
        for key in &keys {
            let value = kvs
                .iter()
                .find(|kv| &kv.key == key)
                .map(|kv| kv.value.clone());
            out.push(value.map(|v| self.open(key, v)).transpose()?);
        }
        Ok(out)
    }

    async fn write_files(
        self: Arc<Self>,
        fence: Option<(String, i64)>,
        files: Vec<File>,
    ) -> Result<bool, String> {
        let mut ops = Vec::with_capacity(files.len());
        for file in files {
            let key = self.file_key(&file.name);
            let value = match is_private(&file.name) {
                true => self.seal(&key, &file.contents)?,
                false => file.contents,
            };
            ops.push(Op::Put {
                key,
                value,
                lease: 0,
            });
        }
        let compare: Vec<Compare> = fence
            .iter()
            .map(|(item, token)| Compare::ModRevision(self.lock_key(item), *token))
            .collect();
        let (written, _) = self.etcd.txn(&compare, &ops).await.map_err(text)?;
        Ok(written)
    }

    fn challenge_key(&self, challenge: &Challenge) -> (String, Vec<u8>) {
        match challenge {
            Challenge::Http01 {
                token,
                key_authorization,
            } => (
                format!("{}challenges/http-01/{token}", self.root),
                key_authorization.clone().into_bytes(),
            ),
            Challenge::TlsAlpn01 { name, digest } => (
                format!("{}challenges/tls-alpn-01/{name}", self.root),
                digest.clone(),
            ),
        }
    }
}

/// The store as weir-core's certificates see it.
pub struct FleetCerts(pub Arc<EtcdStore>);

impl Store for FleetCerts {
    fn lock(&self, item: &str) -> StoreFuture<Option<Fence>> {
        let item = item.to_owned();
        self.0.run(move |s| s.take_lock(item))
    }

    fn read(&self, names: &[String]) -> StoreFuture<Vec<Option<Vec<u8>>>> {
        let names = names.to_vec();
        self.0.run(move |s| s.read_files(names))
    }

    fn write(&self, fence: Option<&Fence>, files: Vec<File>) -> StoreFuture<bool> {
        let fence = fence.map(|f| (f.item.clone(), f.token));
        self.0.run(move |s| s.write_files(fence, files))
    }

    fn challenge(&self, fence: &Fence, challenge: Challenge) -> StoreFuture<()> {
        let lease = fence.lease;
        self.0.run(move |s| async move {
            let (key, value) = s.challenge_key(&challenge);
            let put = Op::Put { key, value, lease };
            s.etcd.txn(&[], &[put]).await.map_err(text).map(drop)
        })
    }
}

/// Renews the lock's lease every third of its TTL until the lock is released (the task
/// is aborted) or the lease is gone (then the fenced write fails).
async fn keep_alive(store: Arc<EtcdStore>, lease: i64) {
    loop {
        tokio::time::sleep(store.lease_ttl / 3).await;
        if let Ok(false) = store.etcd.lease_keepalive(lease).await {
            tracing::warn!(lease, "fleet certificate lock lease expired while ordering");
            return;
        }
    }
}

/// Follows `PREFIX/certs/` for ever: certificates other instances wrote are installed,
/// challenges of their orders answered here too.
pub(crate) async fn watch_loop(store: Arc<EtcdStore>) {
    let end = prefix_end(&store.root);
    let mut backoff = Duration::from_millis(100);
    loop {
        match follow(&store, &end).await {
            Ok(()) => backoff = Duration::from_millis(100),
            Err(e) => {
                tracing::debug!(error = %e, "fleet certificate watch lost; watching again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// The challenges up now, answered here, then one watch from there on. A missed write of
/// a certificate is no loss: an instance whose certificate is due takes the lock and
/// installs the fleet's first. A missed challenge would fail an order, so they are listed.
async fn follow(store: &EtcdStore, end: &str) -> Result<(), EtcdError> {
    let challenges = format!("{}challenges/", store.root);
    let (revision, up) = store
        .etcd
        .range(&challenges, &prefix_end(&challenges))
        .await?;
    for kv in up {
        on_event(store, Event::Put(kv)).await;
    }
    let mut watch = store.etcd.watch(&store.root, end, revision + 1).await?;
    loop {
        let events = match watch.next().await? {
            WatchMessage::Events(events) => events,
            WatchMessage::Created { .. } => continue,
            WatchMessage::Compacted { .. } => return Ok(()),
        };
        for event in events {
            on_event(store, event).await;
        }
    }
}

async fn on_event(store: &EtcdStore, event: Event) {
    let (key, value, up) = match event {
        Event::Put(kv) => (kv.key, kv.value, true),
        Event::Delete { key, .. } => (key, Vec::new(), false),
    };
    let Some(rest) = key.strip_prefix(&store.root) else {
        return;
    };
    if let Some(name) = rest.strip_prefix("files/") {
        if up && name.ends_with(".pem") {
            shared::fleet_wrote(name).await;
        }
    } else if let Some(token) = rest.strip_prefix("challenges/http-01/") {
        let key_authorization = String::from_utf8_lossy(&value).into_owned();
        let token = token.to_owned();
        shared::fleet_challenge(
            Challenge::Http01 {
                token,
                key_authorization,
            },
            up,
        );
    } else if let Some(name) = rest.strip_prefix("challenges/tls-alpn-01/") {
        let name = name.to_owned();
        shared::fleet_challenge(
            Challenge::TlsAlpn01 {
                name,
                digest: value,
            },
            up,
        );
    }
}

/// The longest prefix all `keys` share.
fn common_prefix(keys: &[String]) -> String {
    let Some(first) = keys.first() else {
        return String::new();
    };
    let mut len = first.len();
    for key in &keys[1..] {
        len = first
            .bytes()
            .zip(key.bytes())
            .take(len)
            .take_while(|(a, b)| a == b)
            .count();
    }
    while !first.is_char_boundary(len) {
        len -= 1;
    }
    first[..len].to_owned()
}

fn text(e: EtcdError) -> String {
    e.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> EtcdStore {
        let settings = weir_config::parse_str(
            "[cluster]\nnode = \"a\"\netcd = { endpoints = [\"http://127.0.0.1:1\"], prefix = \"/w\" }\n",
            "t.toml",
        )
        .unwrap()
        .cluster
        .etcd
        .unwrap();
        let key = FleetKey {
            path: "k".into(),
            bytes: [7; 32],
            group_or_world_readable: false,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let etcd = Arc::new(Etcd::new(&settings).unwrap());
        EtcdStore::new(etcd, runtime.handle().clone(), &settings, &key).unwrap()
    }

    #[test]
    fn private_values_are_sealed_to_their_key() {
        let s = store();
        let sealed = s
            .seal("/w/certs/files/a.key", b"-----BEGIN PRIVATE KEY-----")
            .unwrap();
        assert!(sealed.starts_with(SEALED));
        assert!(!sealed.windows(5).any(|w| w == b"BEGIN"));
        let plain = s.open("/w/certs/files/a.key", sealed.clone()).unwrap();
        assert_eq!(plain, b"-----BEGIN PRIVATE KEY-----");
        let moved = s.open("/w/certs/files/b.key", sealed).unwrap_err();
        assert!(moved.contains("cannot decrypt"), "{moved}");
    }

    /// A key or account put into etcd in plaintext is refused, not used; a certificate
    /// (public) is read as it is.
    #[test]
    fn unsealed_private_values_are_refused() {
        let s = store();
        let pem = b"-----BEGIN PRIVATE KEY-----".to_vec();
        for key in ["/w/certs/files/a.key", "/w/certs/files/account-0123.json"] {
            let e = s.open(key, pem.clone()).unwrap_err();
            assert!(e.starts_with(key) && e.contains("unsealed"), "{e}");
            assert!(e.contains(&format!("(etcdctl del {key})")), "{e}");
        }
        let cert = b"-----BEGIN CERTIFICATE-----".to_vec();
        assert_eq!(s.open("/w/certs/files/a.pem", cert.clone()).unwrap(), cert);
    }

    #[test]
    fn a_pair_shares_a_prefix() {
        let keys = [
            "/w/certs/files/acme-1-a.pem".to_owned(),
            "/w/certs/files/acme-1-a.key".to_owned(),
        ];
        assert_eq!(common_prefix(&keys), "/w/certs/files/acme-1-a.");
        assert_eq!(common_prefix(&keys[..1]), keys[0]);
    }
}
