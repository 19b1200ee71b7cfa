//! The etcd v3 client a fleet member uses: the `etcd-client` crate (etcd's gRPC API), with
//! the few things a member needs on top of it.
//!
//! - One `etcd_client::Client` per member, each request to the member that answered last
//!   and on to the next when it cannot be reached (refused, timed out, no leader), so
//!   losing a member costs one `timeout` at most. (The crate's own balancing spreads
//!   requests over all members, a lost one included: its connections are lazy, and a
//!   request given to a member that cannot be reached fails rather than moving on.)
//! - Connections are made on first use, not at construction: an instance starts (from its
//!   snapshot) while etcd is down, and authenticates (`user`) once it reaches a member.
//! - Errors say whether etcd was unreachable or refused, which the admin API tells apart
//!   (503 / 502).

pub mod watch;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, CompareOp, ConnectOptions, GetOptions, Identity, PutOptions, TlsOptions,
    Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::OnceCell;
use weir_config::cluster::EtcdCluster;

pub use watch::{Event, Watch, WatchMessage};

/// Why a request to etcd failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EtcdError {
    /// No member answered (refused, timed out, or had no leader).
    #[error("etcd unreachable: {0}")]
    Unreachable(String),
    /// A member answered with an error (such as a revision that was compacted).
    #[error("etcd refused the request: {0}")]
    Refused(String),
}

/// One key and its value, as etcd returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    pub mod_revision: i64,
    pub create_revision: i64,
}

/// What [`Etcd::txn_else_read`] answered.
#[derive(Debug)]
pub struct TxnReply {
    /// Whether the compares held (and the ops ran).
    pub succeeded: bool,
    /// The store's revision after the transaction.
    pub revision: i64,
    /// When the compares failed: those of the keys read that exist.
    pub read: Vec<Kv>,
}

/// A condition of a transaction on one key.
#[derive(Debug, Clone)]
pub enum Compare {
    /// The key was last changed at this revision.
    ModRevision(String, i64),
    /// The key does not exist.
    Absent(String),
}

/// An operation of a transaction.
#[derive(Debug, Clone)]
pub enum Op {
    Put {
        key: String,
        value: Vec<u8>,
        lease: i64,
    },
    Delete(String),
}

/// A client of one etcd cluster.
pub struct Etcd {
    members: Vec<Member>,
    /// The member that answered last.
    preferred: AtomicUsize,
    timeout: Duration,
}

/// One etcd member: its endpoint and, once reached, its client.
struct Member {
    endpoint: String,
    options: ConnectOptions,
    client: OnceCell<Client>,
}

/// The largest reply taken (a listing, a watch response). gRPC's default, 4 MiB, would
/// cap a listing of every object near 15,000 small routes; etcd itself sends replies of
/// any size.
const MAX_REPLY: usize = 256 << 20;

/// etcd refuses HTTP/2 pings more often than every 5 s (`--grpc-keepalive-min-time`); a
/// little more than that finds a connection that went silent (the watch on it is then
/// opened again on another member).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(6);

impl Etcd {
    /// A client of the members of `settings` (nothing is sent yet).
    pub fn new(settings: &EtcdCluster) -> Result<Etcd, EtcdError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(settings.timeout)
            .with_keep_alive(KEEPALIVE_INTERVAL, settings.timeout)
            .with_keep_alive_while_idle(false)
            // A member cut off from the others ends its watches ("no leader"), so the
            // watch moves to another member instead of staying open and never firing.
            .with_require_leader(true);
        if let (Some(user), Some(file)) = (&settings.user, &settings.password_file) {
            let secret = weir_config::named_file::MAX_SECRET_SIZE;
            let password = weir_config::named_file::read_to_string(file, secret)
                .map_err(|e| EtcdError::Refused(format!("cannot read {}: {e}", file.display())))?;
            options = options
                .with_user(user, password.trim_end_matches(['\r', '\n']))
                .with_auto_token_refresh(true);
        }
        let tls = tls_options(settings);
        let members = settings
            .endpoints
            .iter()
            .map(|endpoint| Member {
                options: match endpoint.starts_with("https://") {
                    true => options.clone().with_tls(tls.clone()),
                    false => options.clone(),
                },
                endpoint: endpoint.clone(),
                client: OnceCell::new(),
            })
            .collect();
        Ok(Etcd {
            members,
            preferred: AtomicUsize::new(0),
            timeout: settings.timeout,
        })
    }

    /// The keys in `[key, range_end)` (`range_end` from [`prefix_end`]) and the revision
    /// they were read at.
    pub async fn range(&self, key: &str, range_end: &str) -> Result<(i64, Vec<Kv>), EtcdError> {
        let options = GetOptions::new().with_range(range_end);
        let reply = self
            .call(|c| {
                let options = options.clone();
                let mut kv = c.kv_client().max_decoding_message_size(MAX_REPLY);
                async move { kv.get(key, Some(options)).await }
            })
            .await?;
        let revision = reply.header().map_or(0, |h| h.revision());
        Ok((revision, reply.kvs().iter().filter_map(kv).collect()))
    }

    /// Runs `ops` if every `compare` holds; returns whether they did and the revision.
    pub async fn txn(&self, compare: &[Compare], ops: &[Op]) -> Result<(bool, i64), EtcdError> {
        let reply = self.txn_else_read(compare, ops, &[]).await?;
        Ok((reply.succeeded, reply.revision))
    }

    /// Runs `ops` if every `compare` holds, else reads the keys `reads` in the same
    /// transaction: what they are at the revision the compares failed at.
    pub async fn txn_else_read(
        &self,
        compare: &[Compare],
        ops: &[Op],
        reads: &[&str],
    ) -> Result<TxnReply, EtcdError> {
        let txn = Txn::new()
            .when(compare.iter().map(Compare::to_etcd).collect::<Vec<_>>())
            .and_then(ops.iter().map(Op::to_etcd).collect::<Vec<_>>())
            .or_else(
                reads
                    .iter()
                    .map(|k| TxnOp::get(*k, None))
                    .collect::<Vec<_>>(),
            );
        let reply = self
            .call(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        let read = match reply.succeeded() || reads.is_empty() {
            true => Vec::new(),
            false => reply
                .op_responses()
                .iter()
                .filter_map(|r| match r {
                    TxnOpResponse::Get(get) => Some(get.kvs().iter().filter_map(kv)),
                    _ => None,
                })
                .flatten()
                .collect(),
        };
        Ok(TxnReply {
            succeeded: reply.succeeded(),
            revision: reply.header().map_or(0, |h| h.revision()),
            read,
        })
    }

    /// A lease of `ttl`; its id.
    pub async fn lease_grant(&self, ttl: Duration) -> Result<i64, EtcdError> {
        let ttl = ttl.as_secs() as i64;
        let reply = self
            .call(|mut c| async move { c.lease_grant(ttl, None).await })
            .await?;
        Ok(reply.id())
    }

    /// Renews lease `id`; `false` when it has expired.
    pub async fn lease_keepalive(&self, id: i64) -> Result<bool, EtcdError> {
        self.call(|mut c| async move {
            match c.lease_keep_alive(id).await {
                Ok(_) => Ok(true),
                // What the crate answers when etcd says the lease has no time left.
                Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// Ends lease `id` and deletes its keys.
    pub async fn lease_revoke(&self, id: i64) -> Result<(), EtcdError> {
        self.call(|mut c| async move { c.lease_revoke(id).await })
            .await
            .map(drop)
    }

    /// Watches `[key, range_end)` from `start_revision` on.
    pub async fn watch(
        &self,
        key: &str,
        range_end: &str,
        start_revision: i64,
    ) -> Result<Watch, EtcdError> {
        let options = WatchOptions::new()
            .with_range(range_end)
            .with_start_revision(start_revision);
        let stream = self
            .call(|c| {
                let options = options.clone();
                let mut watch = c.watch_client().max_decoding_message_size(MAX_REPLY);
                async move { watch.watch(key, Some(options)).await }
            })
            .await?;
        Ok(Watch::new(stream))
    }

    /// Runs `request` on the preferred member, then the others, each within `timeout`
    /// (connecting included).
    async fn call<T, F, Fut>(&self, request: F) -> Result<T, EtcdError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut last = String::new();
        for i in self.order() {
            let member = &self.members[i];
            let attempt = async { request(member.client().await?).await };
            match tokio::time::timeout(self.timeout, attempt).await {
                Ok(Ok(reply)) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    return Ok(reply);
                }
                Ok(Err(e)) if try_next(&e) => {
                    last = format!("{}: {}", member.endpoint, error_chain(&e))
                }
                Ok(Err(e)) => return Err(EtcdError::Refused(error_chain(&e))),
                Err(_) => {
                    last = format!("{}: no answer within {:?}", member.endpoint, self.timeout)
                }
            }
        }
        Err(EtcdError::Unreachable(last))
    }

    /// The member indices, the preferred one first.
    fn order(&self) -> impl Iterator<Item = usize> {
        let n = self.members.len();
        let first = self.preferred.load(Ordering::Relaxed);
        (0..n).map(move |i| (first + i) % n)
    }
}

impl Member {
    /// Its client, connecting (and authenticating) the first time; a failed attempt is made
    /// again on the next request.
    async fn client(&self) -> Result<Client, etcd_client::Error> {
        self.client
            .get_or_try_init(|| Client::connect([&self.endpoint], Some(self.options.clone())))
            .await
            .cloned()
    }
}

/// Whether `e` says this member cannot serve now (another may): the connection failed or
/// broke, or etcd answered Unavailable (no leader, leader changed, timed out).
fn try_next(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        // gRPC codes: 1 Cancelled, 2 Unknown (a broken stream), 4 DeadlineExceeded,
        // 13 Internal, 14 Unavailable. Others are etcd's answer to the request itself.
        E::GRpcStatus(status) => matches!(i32::from(status.code()), 1 | 2 | 4 | 13 | 14),
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) => true,
        _ => false,
    }
}

impl Compare {
    /// The key compared.
    pub fn key(&self) -> &str {
        match self {
            Compare::ModRevision(key, _) | Compare::Absent(key) => key,
        }
    }

    fn to_etcd(&self) -> etcd_client::Compare {
        match self {
            Compare::ModRevision(key, rev) => {
                etcd_client::Compare::mod_revision(key.as_str(), CompareOp::Equal, *rev)
            }
            Compare::Absent(key) => {
                etcd_client::Compare::version(key.as_str(), CompareOp::Equal, 0)
            }
        }
    }
}

impl Op {
    fn to_etcd(&self) -> TxnOp {
        match self {
            Op::Put { key, value, lease } => {
                let options = (*lease != 0).then(|| PutOptions::new().with_lease(*lease));
                TxnOp::put(key.as_str(), value.as_slice(), options)
            }
            Op::Delete(key) => TxnOp::delete(key.as_str(), None),
        }
    }
}

/// The end of the range of every key starting with `prefix`.
pub fn prefix_end(prefix: &str) -> String {
    let mut bytes = prefix.as_bytes().to_vec();
    while let Some(last) = bytes.pop() {
        if last < 0xff {
            bytes.push(last + 1);
            return String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    "\0".to_owned()
}

/// A key and value as [`Kv`]; `None` for a key that is not UTF-8 (no object's key).
pub(crate) fn kv(v: &etcd_client::KeyValue) -> Option<Kv> {
    Some(Kv {
        key: v.key_str().ok()?.to_owned(),
        value: v.value().to_vec(),
        mod_revision: v.mod_revision(),
        create_revision: v.create_revision(),
    })
}

/// `e` and its sources, which say what failed (the transport error alone does not).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// TLS for `https://` members: `ca` (else the system's roots) and the client certificate.
fn tls_options(settings: &EtcdCluster) -> TlsOptions {
    // etcd serves gRPC over HTTP/2 whether or not its TLS listener offers ALPN.
    let tls = TlsOptions::new().assume_http2(true);
    let tls = match &settings.ca {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(&ca.contents)),
        None => tls.with_native_roots(),
    };
    match &settings.client_cert {
        None => tls,
        Some(pair) => tls.identity(Identity::from_pem(&pair.cert.contents, &pair.key.contents)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end("/weir/a/"), "/weir/a0");
        assert_eq!(prefix_end("a"), "b");
    }

    #[test]
    fn unavailable_members_are_skipped_refusals_are_not() {
        use tonic::{Code, Status};
        let status = |code| etcd_client::Error::GRpcStatus(Status::new(code, "x"));
        assert!(try_next(&status(Code::Unavailable)));
        assert!(try_next(&status(Code::DeadlineExceeded)));
        assert!(!try_next(&status(Code::OutOfRange))); // a compacted revision
        assert!(!try_next(&status(Code::InvalidArgument))); // wrong password
        assert!(!try_next(&etcd_client::Error::InvalidArgs("x".into())));
    }
}
