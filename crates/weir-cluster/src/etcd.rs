//! An etcd v3 client over etcd's JSON gateway (`POST /v3/kv/range`, `/v3/kv/txn`,
//! `/v3/watch`, `/v3/lease/...`; served by every etcd member since 3.4 on its client port).
//!
//! The gateway is etcd's own mapping of its gRPC API to HTTP/JSON: the same requests and
//! responses, keys and values in base64, 64-bit numbers as strings. Using it keeps a gRPC
//! stack and its build-time code generator (protoc) out of the build; hyper and rustls are
//! already in the tree. Each request goes to the member that answered last, and on to the
//! next one when it cannot be reached (connection refused, timeout, no leader), so losing a
//! member costs one timeout at most.

pub mod watch;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use serde_json::{json, Value as Json};
use weir_config::cluster::EtcdCluster;

pub use watch::{Event, Watch, WatchMessage};

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

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

/// A client of one etcd cluster.
pub struct Etcd {
    endpoints: Vec<String>,
    client: Client<Connector, Full<Bytes>>,
    /// The member that answered last.
    preferred: AtomicUsize,
    timeout: Duration,
    /// `user` and the password from `password_file`.
    auth: Option<(String, String)>,
    token: Mutex<Option<String>>,
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

impl Etcd {
    /// A client of the members of `settings` (nothing is sent yet).
    pub fn new(settings: &EtcdCluster) -> Result<Etcd, EtcdError> {
        let tls = tls_config(settings).map_err(EtcdError::Refused)?;
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        let auth = match (&settings.user, &settings.password_file) {
            (Some(user), Some(file)) => {
                let password = std::fs::read_to_string(file).map_err(|e| {
                    EtcdError::Refused(format!("cannot read {}: {e}", file.display()))
                })?;
                Some((
                    user.clone(),
                    password.trim_end_matches(['\r', '\n']).to_owned(),
                ))
            }
            _ => None,
        };
        Ok(Etcd {
            endpoints: settings.endpoints.clone(),
            client,
            preferred: AtomicUsize::new(0),
            timeout: settings.timeout,
            auth,
            token: Mutex::new(None),
        })
    }

    /// The keys in `[key, range_end)` (`range_end` from [`prefix_end`]) and the revision
    /// they were read at.
    pub async fn range(&self, key: &str, range_end: &str) -> Result<(i64, Vec<Kv>), EtcdError> {
        let reply = self
            .call(
                "/v3/kv/range",
                &json!({"key": b64(key), "range_end": b64(range_end)}),
            )
            .await?;
        let kvs = reply["kvs"].as_array().into_iter().flatten();
        Ok((header_revision(&reply), kvs.filter_map(kv).collect()))
    }

    /// Runs `ops` if every `compare` holds; returns whether they did and the revision.
    pub async fn txn(&self, compare: &[Compare], ops: &[Op]) -> Result<(bool, i64), EtcdError> {
        let compare: Vec<Json> = compare.iter().map(Compare::to_json).collect();
        let success: Vec<Json> = ops.iter().map(Op::to_json).collect();
        let reply = self
            .call(
                "/v3/kv/txn",
                &json!({"compare": compare, "success": success}),
            )
            .await?;
        let ok = reply["succeeded"].as_bool().unwrap_or(false);
        Ok((ok, header_revision(&reply)))
    }

    /// A lease of `ttl`; its id.
    pub async fn lease_grant(&self, ttl: Duration) -> Result<i64, EtcdError> {
        let reply = self
            .call(
                "/v3/lease/grant",
                &json!({"TTL": ttl.as_secs().to_string()}),
            )
            .await?;
        Ok(num(&reply["ID"]))
    }

    /// Renews lease `id`; `false` when it has expired.
    pub async fn lease_keepalive(&self, id: i64) -> Result<bool, EtcdError> {
        let reply = self
            .call("/v3/lease/keepalive", &json!({"ID": id.to_string()}))
            .await?;
        Ok(num(&reply["result"]["TTL"]) > 0)
    }

    /// Ends lease `id` and deletes its keys.
    pub async fn lease_revoke(&self, id: i64) -> Result<(), EtcdError> {
        self.call("/v3/lease/revoke", &json!({"ID": id.to_string()}))
            .await
            .map(drop)
    }

    /// Forgets the history before `revision` (what etcd's auto-compaction does).
    pub async fn compact(&self, revision: i64) -> Result<(), EtcdError> {
        self.call(
            "/v3/kv/compaction",
            &json!({"revision": revision.to_string()}),
        )
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
        let body = json!({"create_request": {
            "key": b64(key), "range_end": b64(range_end),
            "start_revision": start_revision.to_string(),
        }});
        let mut last = String::new();
        for i in self.order() {
            match tokio::time::timeout(self.timeout, self.open(i, "/v3/watch", &body)).await {
                Ok(Ok(response)) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    return Ok(Watch::new(response.into_body(), self.endpoints[i].clone()));
                }
                Ok(Err(e)) => last = e,
                Err(_) => {
                    last = format!("{}: no answer within {:?}", self.endpoints[i], self.timeout)
                }
            }
        }
        Err(EtcdError::Unreachable(last))
    }

    /// POSTs `body` to `path` on the preferred member, then the others; the reply's JSON.
    async fn call(&self, path: &str, body: &Json) -> Result<Json, EtcdError> {
        match self.call_once(path, body).await {
            Err(EtcdError::Refused(m)) if self.auth.is_some() && m.contains("auth token") => {
                *self.token.lock().unwrap_or_else(|e| e.into_inner()) = None;
                self.call_once(path, body).await
            }
            other => other,
        }
    }

    async fn call_once(&self, path: &str, body: &Json) -> Result<Json, EtcdError> {
        let mut last = String::new();
        for i in self.order() {
            let answer = tokio::time::timeout(self.timeout, self.exchange(i, path, body)).await;
            match answer {
                Ok(Ok(reply)) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    return Ok(reply);
                }
                Ok(Err(Failure::Refused(m))) => return Err(EtcdError::Refused(m)),
                Ok(Err(Failure::TryNext(m))) => last = m,
                Err(_) => {
                    last = format!("{}: no answer within {:?}", self.endpoints[i], self.timeout)
                }
            }
        }
        Err(EtcdError::Unreachable(last))
    }

    /// The member indices, the preferred one first.
    fn order(&self) -> impl Iterator<Item = usize> {
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed);
        (0..n).map(move |i| (first + i) % n)
    }

    async fn exchange(&self, i: usize, path: &str, body: &Json) -> Result<Json, Failure> {
        let response = self.open(i, path, body).await.map_err(Failure::TryNext)?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| Failure::TryNext(format!("{}: {e}", self.endpoints[i])))?
            .to_bytes();
        let reply: Json = serde_json::from_slice(&bytes).unwrap_or(Json::Null);
        if status.is_success() && reply.get("error").is_none() {
            return Ok(reply);
        }
        let message = reply["message"]
            .as_str()
            .or_else(|| reply["error"]["message"].as_str())
            .unwrap_or("no message")
            .to_owned();
        // 14 Unavailable, 4 DeadlineExceeded: this member cannot serve it now.
        let code = reply["code"]
            .as_i64()
            .or_else(|| reply["error"]["code"].as_i64());
        match code {
            Some(14 | 4) => Err(Failure::TryNext(format!(
                "{}: {message}",
                self.endpoints[i]
            ))),
            _ => Err(Failure::Refused(format!("{message} (HTTP {status})"))),
        }
    }

    /// Sends one request to member `i`; the response head.
    async fn open(
        &self,
        i: usize,
        path: &str,
        body: &Json,
    ) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let endpoint = &self.endpoints[i];
        let token = self.token(i).await?;
        let mut request = hyper::Request::post(format!("{endpoint}{path}"))
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if let Some(token) = token {
            request = request.header(hyper::header::AUTHORIZATION, token);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| format!("{endpoint}: {e}"))?;
        self.client
            .request(request)
            .await
            .map_err(|e| format!("{endpoint}: {}", error_chain(&e)))
    }

    /// The auth token (authenticating first when there is none yet).
    async fn token(&self, i: usize) -> Result<Option<String>, String> {
        let Some((user, password)) = &self.auth else {
            return Ok(None);
        };
        if let Some(t) = self.token.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(Some(t));
        }
        let endpoint = &self.endpoints[i];
        let body = json!({"name": user, "password": password}).to_string();
        let request = hyper::Request::post(format!("{endpoint}/v3/auth/authenticate"))
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| format!("{endpoint}: {}", error_chain(&e)))?;
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let reply: Json = serde_json::from_slice(&bytes).unwrap_or(Json::Null);
        let token = reply["token"]
            .as_str()
            .ok_or_else(|| format!("{endpoint}: authentication as {user} failed: {reply}"))?
            .to_owned();
        *self.token.lock().unwrap_or_else(|e| e.into_inner()) = Some(token.clone());
        Ok(Some(token))
    }
}

/// How one member failed a request.
enum Failure {
    TryNext(String),
    Refused(String),
}

impl Compare {
    fn to_json(&self) -> Json {
        match self {
            Compare::ModRevision(key, rev) => json!({
                "key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": rev.to_string(),
            }),
            Compare::Absent(key) => json!({
                "key": b64(key), "target": "VERSION", "result": "EQUAL", "version": "0",
            }),
        }
    }
}

impl Op {
    fn to_json(&self) -> Json {
        match self {
            Op::Put { key, value, lease } => json!({"request_put": {
                "key": b64(key), "value": B64.encode(value), "lease": lease.to_string(),
            }}),
            Op::Delete(key) => json!({"request_delete_range": {"key": b64(key)}}),
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

fn b64(text: &str) -> String {
    B64.encode(text.as_bytes())
}

/// A 64-bit number as the gateway writes it (a string), or a plain number; 0 if absent.
pub(crate) fn num(v: &Json) -> i64 {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_i64())
        .unwrap_or(0)
}

pub(crate) fn header_revision(reply: &Json) -> i64 {
    num(&reply["header"]["revision"])
}

pub(crate) fn kv(v: &Json) -> Option<Kv> {
    let key = B64.decode(v["key"].as_str()?).ok()?;
    let value = v["value"]
        .as_str()
        .map_or_else(|| Ok(Vec::new()), |s| B64.decode(s))
        .ok()?;
    Some(Kv {
        key: String::from_utf8(key).ok()?,
        value,
        mod_revision: num(&v["mod_revision"]),
        create_revision: num(&v["create_revision"]),
    })
}

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
fn tls_config(settings: &EtcdCluster) -> Result<rustls::ClientConfig, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    match &settings.ca {
        Some(ca) => {
            for cert in CertificateDer::pem_slice_iter(&ca.contents).flatten() {
                roots.add(cert).map_err(|e| format!("etcd ca: {e}"))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    match &settings.client_cert {
        None => Ok(builder.with_no_client_auth()),
        Some(pair) => {
            let chain: Vec<_> = CertificateDer::pem_slice_iter(&pair.cert.contents)
                .flatten()
                .collect();
            let key = PrivateKeyDer::from_pem_slice(&pair.key.contents)
                .map_err(|e| format!("etcd client_cert key: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("etcd client_cert: {e}"))
        }
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
    fn gateway_numbers_and_keys() {
        let v = json!({"key": "L3cvYQ==", "mod_revision": "3", "create_revision": "2", "value": "aGVsbG8="});
        let kv = kv(&v).unwrap();
        assert_eq!(
            (kv.key.as_str(), kv.value.as_slice(), kv.mod_revision),
            ("/w/a", &b"hello"[..], 3)
        );
        assert_eq!(num(&json!(7)), 7);
    }
}
