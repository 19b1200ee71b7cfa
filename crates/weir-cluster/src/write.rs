//! Writes through any instance: the admin API's changes become etcd transactions, each
//! conditioned on the `mod_revision` of every object it writes, so two operators racing
//! on two instances cannot lose an update: one transaction wins, the other finds the
//! object moved (and gets 412 when it said `If-Match`, or is edited again on the newer
//! objects when it did not).

use std::time::Duration;

use http::StatusCode;
use weir_admin::api::error::ApiError;
use weir_admin::{Shared, SharedError};
use weir_config::cluster::objects::{self, ObjectKey, Objects};
use weir_config::Config;

use crate::etcd::{Compare, EtcdError, Op};
use crate::fleet::Fleet;
use crate::view::{View, VERSION_KEY};

/// Operations per transaction: under etcd's default `--max-txn-ops` (128), with the
/// version key and [`PENDING_KEY`].
pub const TXN_OPS: usize = 100;

/// What one change weighs in a transaction: its key twice (the compare and the op), its
/// value, and room for the framing of both.
fn weight(full_key: &str, value: Option<&String>) -> usize {
    2 * full_key.len() + value.map_or(0, String::len) + 64
}

/// What to do about an object [`too_large`] refuses.
pub const TOO_LARGE_FIX: &str = "make the object smaller: e.g. serve a large inline body from a file (or raise [cluster] etcd.max_txn_bytes, with etcd's --max-request-bytes above it)";

/// The first of `changes` too large for a transaction of `max_bytes`, told (the fix:
/// [`TOO_LARGE_FIX`]): alone, it would still be near etcd's request limit.
fn too_large(
    changes: &[Change],
    key_name: &dyn Fn(&str) -> String,
    max_bytes: usize,
) -> Option<String> {
    let (key, value, weight) = changes.iter().find_map(|(key, value)| {
        let w = weight(&key_name(key), value.as_ref());
        (w > max_bytes).then_some((key, value, w))
    })?;
    let size = value.as_ref().map_or(0, String::len);
    Some(format!(
        "{}: {weight} bytes to write (a value of {size} bytes, the key twice, framing), over the {max_bytes} bytes one etcd transaction may have (max_txn_bytes)",
        key_name(key)
    ))
}

/// The key (under `PREFIX/config/`) that exists while a write of several transactions is
/// under way, under the writer's lease: instances apply nothing while it is there, so they
/// never run a half-written change, and no other write starts (its first transaction
/// requires the key absent). The last transaction deletes it; a writer that dies leaves it
/// to its lease, and the instances then try what was written, as any change: applied if it
/// validates, else rejected and reported (see [`changes`] for the order that makes most
/// steps valid).
pub const PENDING_KEY: &str = ".pending";

/// How long a write waits for this instance to apply it.
const APPLY_WAIT: Duration = Duration::from_secs(10);

/// One object to write: its relative key and new value (`None`: delete).
pub type Change = (String, Option<String>);

/// The objects that differ between `old` and `new`: upstreams, listeners, routes written
/// first, then routes, listeners, upstreams deleted, so that no step refers to an object
/// not there yet. Not every step need be valid (a listener moved to another's `bind`, a
/// route renamed at the same place collide until the old one is deleted).
pub fn changes(old: &Objects, new: &Objects) -> Vec<Change> {
    let rank = |key: &str, delete: bool| {
        let kind = match ObjectKey::parse(key) {
            Some(ObjectKey::Upstream(_)) => 0,
            Some(ObjectKey::Listener(_)) => 1,
            _ => 2,
        };
        if delete {
            5 - kind
        } else {
            kind
        }
    };
    let mut out: Vec<(u8, Change)> = Vec::new();
    for (key, value) in new {
        if !old.get(key).is_some_and(|o| objects::same_value(o, value)) {
            out.push((rank(key, false), (key.clone(), Some(value.clone()))));
        }
    }
    let gone = old
        .keys()
        .filter(|k| ObjectKey::parse(k).is_some() && !new.contains_key(*k));
    for key in gone {
        out.push((rank(key, true), (key.clone(), None)));
    }
    out.sort_by_key(|(r, _)| *r);
    out.into_iter().map(|(_, c)| c).collect()
}

/// `changes` in runs of at most [`TXN_OPS`] objects and `max_bytes` bytes (an object
/// heavier than that alone: see [`too_large`]).
fn chunks<'a>(
    changes: &'a [Change],
    key_name: &dyn Fn(&str) -> String,
    max_bytes: usize,
) -> Vec<&'a [Change]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, (key, value)) in changes.iter().enumerate() {
        let w = weight(&key_name(key), value.as_ref());
        if i > start && (i - start == TXN_OPS || bytes + w > max_bytes) {
            out.push(&changes[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += w;
    }
    if start < changes.len() {
        out.push(&changes[start..]);
    }
    out
}

/// One etcd transaction: its compares and its operations.
pub type Txn = (Vec<Compare>, Vec<Op>);

/// The transactions writing `changes`, each conditioned on its objects being as `view`
/// has them, each also writing the version key (with `by`), each of at most `max_bytes`
/// (`max_txn_bytes`: under etcd's `--max-request-bytes`, with the version key,
/// [`PENDING_KEY`] and framing). An object too large for one is refused, said by its key
/// (the fix: [`TOO_LARGE_FIX`]), before any is built.
pub fn transactions(
    view: &View,
    changes: &[Change],
    key_name: &dyn Fn(&str) -> String,
    by: &str,
    max_bytes: usize,
) -> Result<Vec<Txn>, String> {
    if let Some(e) = too_large(changes, key_name, max_bytes) {
        return Err(e);
    }
    let txns = chunks(changes, key_name, max_bytes)
        .into_iter()
        .map(|chunk| {
            let mut compares = Vec::new();
            let mut ops = Vec::new();
            for (key, value) in chunk {
                let full = key_name(key);
                compares.push(match view.mod_revisions.get(key) {
                    Some(rev) => Compare::ModRevision(full.clone(), *rev),
                    None => Compare::Absent(full.clone()),
                });
                ops.push(match value {
                    Some(v) => Op::Put {
                        key: full,
                        value: v.clone().into_bytes(),
                        lease: 0,
                    },
                    None => Op::Delete(full),
                });
            }
            ops.push(Op::Put {
                key: key_name(VERSION_KEY),
                value: by.as_bytes().to_vec(),
                lease: 0,
            });
            (compares, ops)
        })
        .collect();
    Ok(txns)
}

/// How a series of transactions ended.
pub enum Written {
    /// All written; the revision of the last.
    Done(i64),
    /// A transaction's objects had changed: it and the rest were not written.
    Moved(Moved),
    /// Another write of several transactions was under way ([`PENDING_KEY`] was there):
    /// nothing was written.
    Busy,
}

/// What a transaction found moved: the revision it failed at, and its compared keys as
/// they were then (full key -> mod revision; `None`: absent).
pub struct Moved {
    pub revision: i64,
    pub keys: Vec<(String, Option<i64>)>,
}

/// Writes `txns` in order, the first only if [`PENDING_KEY`] is absent. When there are
/// several, the first also puts it under a lease of `ttl` (kept alive meanwhile) and the
/// last deletes it; a write that stops half-way revokes the lease, so the instances apply
/// what was written.
pub async fn write_all(
    etcd: &crate::etcd::Etcd,
    mut txns: Vec<Txn>,
    pending_key: &str,
    ttl: Duration,
) -> Result<Written, EtcdError> {
    if let Some((compares, _)) = txns.first_mut() {
        compares.push(Compare::Absent(pending_key.to_owned()));
    }
    let lease = match txns.len() {
        0 | 1 => None,
        _ => Some(etcd.lease_grant(ttl).await?),
    };
    if let Some(lease) = lease {
        let key = pending_key.to_owned();
        if let Some((_, ops)) = txns.first_mut() {
            ops.push(Op::Put {
                key: key.clone(),
                value: Vec::new(),
                lease,
            });
        }
        if let Some((_, ops)) = txns.last_mut() {
            ops.push(Op::Delete(key));
        }
    }
    let outcome = write_in_order(etcd, &txns, lease, ttl, pending_key).await;
    if let (Some(lease), Ok(Written::Moved(_) | Written::Busy) | Err(_)) = (lease, &outcome) {
        let _ = etcd.lease_revoke(lease).await;
    }
    outcome
}

async fn write_in_order(
    etcd: &crate::etcd::Etcd,
    txns: &[Txn],
    lease: Option<i64>,
    ttl: Duration,
    pending_key: &str,
) -> Result<Written, EtcdError> {
    let mut revision = 0;
    let mut renewed = std::time::Instant::now();
    for (i, (compares, ops)) in txns.iter().enumerate() {
        if let Some(lease) = lease.filter(|_| renewed.elapsed() > ttl / 3) {
            etcd.lease_keepalive(lease).await?;
            renewed = std::time::Instant::now();
        }
        let keys: Vec<&str> = compares.iter().map(Compare::key).collect();
        let reply = etcd.txn_else_read(compares, ops, &keys).await?;
        if !reply.succeeded && i == 0 && !etcd.range(pending_key, "").await?.1.is_empty() {
            return Ok(Written::Busy);
        }
        if !reply.succeeded {
            let now = |key: &str| reply.read.iter().find(|kv| kv.key == key);
            let keys = keys
                .iter()
                .map(|k| (k.to_string(), now(k).map(|kv| kv.mod_revision)))
                .collect();
            let revision = reply.revision;
            return Ok(Written::Moved(Moved { revision, keys }));
        }
        revision = reply.revision;
    }
    Ok(Written::Done(revision))
}

impl Shared for Fleet {
    fn parse(&self, text: &str) -> Result<(Config, String), ApiError> {
        let (config, assembled) = self.parse_text(text)?;
        Ok((config, assembled.text))
    }

    fn write(
        &self,
        base: &str,
        base_version: u64,
        text: &str,
        expect: Option<u64>,
    ) -> Result<u64, SharedError> {
        let old = objects::split(base, "the running config").map_err(ApiError::from)?;
        let new = objects::split(text, "the request").map_err(ApiError::from)?;
        let changes = changes(&old, &new);
        if changes.is_empty() {
            return Ok(base_version);
        }
        let txns = {
            let view = self.lock_view();
            if view.objects.contains_key(PENDING_KEY) {
                return Err(SharedError::Failed(busy()));
            }
            if let Err(e) = check_unchanged(&view, &changes, base_version as i64, expect) {
                drop(view);
                self.wait_caught_up();
                return Err(e);
            }
            let key_name = |k: &str| self.key_name(k);
            let by = format!("api on {}", self.settings.node);
            let max_bytes = self.settings.max_txn_bytes;
            transactions(&view, &changes, &key_name, &by, max_bytes).map_err(|e| {
                let status = StatusCode::PAYLOAD_TOO_LARGE;
                SharedError::Failed(ApiError::new(status, e, TOO_LARGE_FIX))
            })?
        };
        let pending = self.key_name(PENDING_KEY);
        let written = write_all(&self.etcd, txns, &pending, self.settings.lease_ttl);
        match self.block_on(written).map_err(etcd_failed)? {
            Written::Done(revision) => Ok(revision as u64),
            Written::Busy => Err(SharedError::Failed(busy())),
            Written::Moved(moved) => {
                // Moved since this view: wait until the view has the newer objects.
                self.wait_view(&moved);
                self.wait_caught_up();
                Err(SharedError::Moved)
            }
        }
    }

    fn wait_applied(&self, version: u64) -> Result<(), ApiError> {
        let mut progress = self.progress.subscribe();
        let reached = self.block_on(async {
            tokio::time::timeout(APPLY_WAIT, progress.wait_for(|p| p.seen >= version as i64))
                .await
                .ok()
                .and_then(Result::ok)
                .map(|p| p.clone())
        });
        match reached {
            Some(p) if p.applied >= version as i64 => Ok(()),
            Some(p) => {
                let why = p.rejected.map(|(_, why)| why).unwrap_or_default();
                Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("written to etcd at revision {version}, but this instance did not apply it: {why}"),
                    "fix or revert the object; the other instances may have applied it (weir ctl cluster status)",
                ))
            }
            None => Err(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "written to etcd at revision {version}; not applied here within {APPLY_WAIT:?}"
                ),
                "check /ready and weir ctl cluster status",
            )),
        }
    }

    fn text(&self) -> String {
        self.running_text()
    }

    fn reload_local(&self, text: String) -> Result<(), ApiError> {
        self.set_local(text).map_err(|why| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                why,
                "fix the local file and send SIGHUP again; the running config stays",
            )
        })
    }

    fn readiness(&self) -> (bool, String) {
        self.readiness_line()
    }
}

/// The answer to a write made while another instance's write of several transactions is
/// under way: a conflict, as for an object that moved.
fn busy() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        format!("another write of several transactions is under way in etcd ({PENDING_KEY} is set); nothing was written"),
        "retry once it is done (if its writer died, its marker goes with its lease, within lease_ttl)",
    )
}

impl Fleet {
    /// Waits (briefly) until the view has the keys of `moved` as they were when the
    /// transaction failed. Not until the view's revision reaches the failure's: that is
    /// the store's, moved on by writes outside the config (each instance's registration)
    /// that the view never sees.
    fn wait_view(&self, moved: &Moved) {
        let prefix = self.key_name("");
        let seen = |view: &View| {
            moved.keys.iter().all(|(key, now)| {
                let Some(key) = key.strip_prefix(&prefix) else {
                    return true;
                };
                // Seen as it was then, or a later change of it.
                match now {
                    Some(rev) => view.last_change(key) >= *rev,
                    None => {
                        !view.objects.contains_key(key) || view.last_change(key) > moved.revision
                    }
                }
            })
        };
        let deadline = std::time::Instant::now() + self.settings.timeout;
        while !seen(&self.lock_view()) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits (briefly) until the running config is the view's (applied or rejected).
    fn wait_caught_up(&self) {
        let target = self.lock_view().config_revision;
        let mut progress = self.progress.subscribe();
        self.block_on(async {
            let _ = tokio::time::timeout(
                self.settings.timeout,
                progress.wait_for(|p| p.seen >= target),
            )
            .await;
        });
    }

    /// `/ready`'s verdict and line: serving (some listener) and how in sync.
    fn readiness_line(&self) -> (bool, String) {
        let p = self.progress.borrow().clone();
        let metrics = self.metrics();
        let age = metrics.contact_age();
        let stale = 3.0 * metrics.lease_interval_s().max(1.0);
        let mut line = match (&p.rejected, age) {
            (Some((rev, why)), _) => {
                format!(
                    "revision {rev} rejected here: {why}; serving revision {}",
                    p.applied
                )
            }
            (None, Some(age)) if age <= stale => format!("in sync at revision {}", p.applied),
            (None, Some(age)) => {
                format!(
                    "etcd unreachable for {age:.0}s; serving revision {}",
                    p.applied
                )
            }
            (None, None) => format!("etcd not reached yet; serving revision {}", p.applied),
        };
        if !p.serving {
            line.push_str(&format!(
                "; no listeners under {}/config/ yet",
                self.settings.prefix
            ));
        }
        (p.serving, line)
    }
}

/// The objects of `changes` as the edit saw them (`base`) are as etcd last told this view;
/// with `expect`, none changed after it either.
fn check_unchanged(
    view: &View,
    changes: &[Change],
    base: i64,
    expect: Option<u64>,
) -> Result<(), SharedError> {
    for (key, _) in changes {
        let last = view.last_change(key);
        if let Some(expect) = expect {
            if last > expect as i64 {
                return Err(SharedError::Failed(ApiError::new(
                    StatusCode::PRECONDITION_FAILED,
                    format!("{key} changed at revision {last}, after {expect} (If-Match)"),
                    "GET it again and retry with the new ETag",
                )));
            }
        }
        if last > base {
            return Err(SharedError::Moved);
        }
    }
    Ok(())
}

fn etcd_failed(e: EtcdError) -> SharedError {
    let status = match e {
        EtcdError::Unreachable(_) => StatusCode::SERVICE_UNAVAILABLE,
        EtcdError::Refused(_) => StatusCode::BAD_GATEWAY,
    };
    SharedError::Failed(ApiError::new(
        status,
        format!("the change was not written: {e}"),
        "retry when etcd is reachable; this instance keeps serving the last applied config",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(n: usize, size: usize) -> Vec<Change> {
        (0..n)
            .map(|i| (format!("routes/web/r{i:03}"), Some("x".repeat(size))))
            .collect()
    }

    fn key_name(key: &str) -> String {
        format!("/fleet/config/{key}")
    }

    const TXN_BYTES: usize = weir_config::cluster::DEFAULT_MAX_TXN_BYTES;

    /// 100 routes of 15 KiB (1.5 MiB in all, one transaction by count) are written in
    /// transactions each under etcd's request limit; one object over it is refused by name.
    #[test]
    fn transactions_stay_under_etcd_request_limit() {
        let changes = routes(100, 15 * 1024);
        let txns = transactions(&View::default(), &changes, &key_name, "push", TXN_BYTES).unwrap();
        assert!(txns.len() >= 2, "{} transaction(s)", txns.len());
        let written: usize = txns.iter().map(|(c, _)| c.len()).sum();
        assert_eq!(written, 100, "every object written once");
        for (_, ops) in &txns {
            let bytes: usize = ops
                .iter()
                .map(|op| match op {
                    Op::Put { key, value, .. } => key.len() + value.len(),
                    Op::Delete(key) => key.len(),
                })
                .sum();
            // The objects within the bound, plus the version key's put (26 bytes here).
            assert!(bytes <= TXN_BYTES + 64, "{bytes} bytes in one request");
        }
        assert!(too_large(&changes, &key_name, TXN_BYTES).is_none());
        assert_eq!(
            transactions(
                &View::default(),
                &routes(250, 10),
                &key_name,
                "p",
                TXN_BYTES
            )
            .unwrap()
            .len(),
            3
        );

        let mut big = routes(2, 10);
        big.push(("routes/web/huge".into(), Some("x".repeat(2 * 1024 * 1024))));
        let e =
            transactions(&View::default(), &big, &key_name, "p", TXN_BYTES).expect_err("refused");
        // What is compared: the value, the key twice and 64 bytes of framing.
        assert!(
            e.starts_with(
                "/fleet/config/routes/web/huge: 2097274 bytes to write (a value of 2097152 bytes"
            ),
            "{e}"
        );
        // Under the bound by its value alone, over it with its key and framing: the
        // message says the weight compared, not a value that reads as under the limit.
        let near = vec![(
            "routes/web/near".to_owned(),
            Some("x".repeat(TXN_BYTES - 100)),
        )];
        let e = too_large(&near, &key_name, TXN_BYTES).expect("refused");
        assert!(
            e.contains(": 1048598 bytes to write (a value of 1048476 bytes"),
            "{e}"
        );
    }
}
