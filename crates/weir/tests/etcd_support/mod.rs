//! A real etcd cluster for the fleet tests: members started from the Debian package's
//! `/usr/bin/etcd` (`WEIR_ETCD_DIR` names another directory) on free ports of 127.0.0.1,
//! each in its own data directory, with short heartbeats so that losing a member settles
//! in a second. Without etcd each test prints that it was skipped and passes, unless
//! `WEIR_REQUIRE_ETCD` is set (`.ci/run` sets it once etcd is installed): then it fails.
//! Members are SIGKILLed when the cluster drops. Keys are read and written through etcd's
//! JSON gateway (`/v3/kv/...`), with plain `std::net` HTTP, not through Weir's client.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Value};

use crate::support_process::{call, TempDir};

/// The etcd binary, or `None` (the test is skipped) when it is not installed.
pub fn etcd_bin() -> Option<PathBuf> {
    installed("etcd", "etcd-server")
}

/// The etcd binary when `etcdctl` is beside it too (for tests that set etcd up with it).
pub fn etcd_and_etcdctl() -> Option<PathBuf> {
    installed("etcdctl", "etcd-client")?;
    etcd_bin()
}

/// `name` in the etcd directory, or `None` (the test is skipped, unless etcd is required).
fn installed(name: &str, package: &str) -> Option<PathBuf> {
    let dir =
        std::env::var_os("WEIR_ETCD_DIR").map_or_else(|| PathBuf::from("/usr/bin"), PathBuf::from);
    let bin = dir.join(name);
    let found = bin.is_file();
    if !found && std::env::var_os("WEIR_REQUIRE_ETCD").is_some() {
        panic!(
            "WEIR_REQUIRE_ETCD is set but there is no {name} in {}",
            dir.display()
        );
    }
    if !found {
        eprintln!(
            "SKIPPED: no {name} in {} (apt-get install {package})",
            dir.display()
        );
    }
    found.then_some(bin)
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

struct Member {
    name: String,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

/// A running etcd cluster; its members are killed on drop.
pub struct Etcd {
    bin: PathBuf,
    dir: TempDir,
    members: Vec<Member>,
    token: String,
    tls: Option<ClientTls>,
}

/// TLS on the members' client port: the server certificate and key, and the CA whose
/// client certificates they require (`--client-cert-auth`); `client` is one of those, for
/// `etcdctl`.
pub struct ClientTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
    pub client: (PathBuf, PathBuf),
}

impl Etcd {
    /// Starts `n` members and waits until the cluster has a leader.
    pub fn start(bin: PathBuf, n: usize) -> Etcd {
        Etcd::start_with(bin, n, None)
    }

    /// One member serving clients over TLS only, with client certificates required.
    pub fn start_tls(bin: PathBuf, tls: ClientTls) -> Etcd {
        Etcd::start_with(bin, 1, Some(tls))
    }

    fn start_with(bin: PathBuf, n: usize, tls: Option<ClientTls>) -> Etcd {
        let dir = TempDir::new("etcd");
        let members = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client: free_port(),
                peer: free_port(),
                child: None,
            })
            .collect();
        let token = dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let mut etcd = Etcd {
            bin,
            dir,
            members,
            token,
            tls,
        };
        for attempt in 1..=3 {
            for i in 0..n {
                etcd.spawn(i, "new");
            }
            let healthy = etcd.became_healthy(0);
            // Member 0 has a quorum without a member that exited: start them all again.
            if healthy && !etcd.exited() {
                return etcd;
            }
            // A port found free can be taken by another test's socket before etcd binds
            // it (the suite runs in parallel): a member that exited is started again, with
            // the others, on new ports and new data directories.
            let exited = etcd.exited();
            for i in 0..n {
                etcd.kill(i);
            }
            let logs = etcd.logs();
            assert!(exited && attempt < 3, "etcd did not become healthy: {logs}");
            for m in &mut etcd.members {
                (m.client, m.peer) = (free_port(), free_port());
            }
        }
        unreachable!("the third attempt returns or fails")
    }

    /// Whether member `i` becomes healthy within 30 s (`false` at once when a member
    /// exits).
    fn became_healthy(&mut self, i: usize) -> bool {
        let mut healthy = false;
        weir_testkit::wait_until(Duration::from_secs(30), || {
            healthy = self.is_healthy(i);
            healthy || self.exited()
        });
        healthy
    }

    /// Whether a member started has exited (etcd exits when its ports are taken).
    fn exited(&mut self) -> bool {
        let gone = |c: &mut Child| matches!(c.try_wait(), Ok(Some(_)));
        self.members
            .iter_mut()
            .any(|m| m.child.as_mut().is_some_and(gone))
    }

    /// What the members wrote to their standard error (errors only).
    fn logs(&self) -> String {
        let read = |m: &Member| std::fs::read_to_string(self.data_dir(m).with_extension("log"));
        let logs = self
            .members
            .iter()
            .map(|m| format!("{}: {}", m.name, read(m).unwrap_or_default()));
        logs.collect::<Vec<_>>().join("\n")
    }

    /// Member `m`'s data directory (one per set of ports: a new start takes a new one).
    fn data_dir(&self, m: &Member) -> PathBuf {
        self.dir.path().join(format!("{}-{}", m.name, m.client))
    }

    fn spawn(&mut self, i: usize, state: &str) {
        let cluster: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect();
        let m = &self.members[i];
        let client = self.url(i);
        let peer = format!("http://127.0.0.1:{}", m.peer);
        // Appended to: a restart keeps what the member said before.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data_dir(m).with_extension("log"))
            .expect("log");
        let mut command = Command::new(&self.bin);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        let child = command
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(self.data_dir(m))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &cluster.join(",")])
            .args([
                "--initial-cluster-state",
                state,
                "--initial-cluster-token",
                &self.token,
            ])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        self.members[i].child = Some(child);
    }

    /// Waits until member `i` serves a linearizable read (there is a leader).
    pub fn wait_healthy(&mut self, i: usize) {
        let healthy = self.became_healthy(i);
        assert!(
            healthy,
            "etcd member {i} did not become healthy: {}",
            self.logs()
        );
    }

    /// Whether member `i` serves a linearizable read now.
    fn is_healthy(&self, i: usize) -> bool {
        match self.tls {
            Some(_) => self.etcdctl(i, &["get", "/health-probe"]).is_ok(),
            None => self
                .request(
                    i,
                    "/v3/kv/range",
                    &json!({"key": B64.encode("/health-probe")}),
                )
                .is_some_and(|v| v.get("header").is_some()),
        }
    }

    /// The client URL of member `i`: `https://` with TLS.
    fn url(&self, i: usize) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.members[i].client)
    }

    /// `["http://127.0.0.1:P", ...]` of the members `which`, as TOML.
    pub fn endpoints(&self, which: &[usize]) -> String {
        let list: Vec<String> = which
            .iter()
            .map(|i| format!("\"{}\"", self.url(*i)))
            .collect();
        format!("[{}]", list.join(", "))
    }

    /// Runs `etcdctl ARGS` against member `i` (with the client certificate under TLS): its
    /// stdout, or its stderr when it fails. `etcdctl` is beside `etcd` (Debian package
    /// etcd-client).
    pub fn etcdctl(&self, i: usize, args: &[&str]) -> Result<String, String> {
        let mut command = Command::new(self.bin.with_file_name("etcdctl"));
        command
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(self.url(i));
        if let Some(tls) = &self.tls {
            command
                .arg("--cacert")
                .arg(&tls.ca)
                .arg("--cert")
                .arg(&tls.client.0)
                .arg("--key")
                .arg(&tls.client.1);
        }
        let out = command
            .args(args)
            .output()
            .map_err(|e| format!("etcdctl: {e}"))?;
        match out.status.success() {
            true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
            false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        }
    }

    pub fn all(&self) -> Vec<usize> {
        (0..self.members.len()).collect()
    }

    /// SIGKILLs member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) {
        self.spawn(i, "existing");
    }

    /// POSTs `body` to `path` on member `i`; the JSON reply (`None` when unreachable).
    pub fn request(&self, i: usize, path: &str, body: &Value) -> Option<Value> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.members[i].client));
        let (_, reply) = call(addr, "POST", path, &[], &body.to_string()).ok()?;
        serde_json::from_str(&reply).ok()
    }

    /// Puts `key` through member `i` (retried while the cluster elects a leader after a
    /// member was lost); the revision.
    pub fn put(&self, i: usize, key: &str, value: &str) -> i64 {
        let body = json!({"key": B64.encode(key), "value": B64.encode(value)});
        let mut done = None;
        weir_testkit::wait_until(Duration::from_secs(20), || {
            done = self
                .request(i, "/v3/kv/put", &body)
                .and_then(|r| revision(&r));
            done.is_some()
        });
        done.expect("put")
    }

    pub fn delete(&self, i: usize, key: &str) {
        self.request(i, "/v3/kv/deleterange", &json!({"key": B64.encode(key)}))
            .expect("delete");
    }

    /// Forgets the history before `revision`.
    pub fn compact(&self, i: usize, revision: i64) {
        let body = json!({"revision": revision.to_string(), "physical": true});
        self.request(i, "/v3/kv/compaction", &body)
            .expect("compact");
    }
}

fn revision(reply: &Value) -> Option<i64> {
    reply["header"]["revision"].as_str()?.parse().ok()
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// A TCP forwarder to an etcd member that a test can cut: `close` drops every connection
/// through it and refuses new ones until `open`, so an instance loses etcd while the
/// member itself goes on (and can be written and compacted meanwhile).
pub struct Gate {
    pub addr: SocketAddr,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Gate {
    pub fn to(etcd: &Etcd, member: usize) -> Gate {
        use std::sync::atomic::Ordering;
        let target = SocketAddr::from(([127, 0, 0, 1], etcd.members[member].client));
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind gate");
        let addr = listener.local_addr().expect("addr");
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (is_open, list) = (open.clone(), conns.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = std::net::TcpStream::connect(target) else {
                    continue;
                };
                if !is_open.load(Ordering::SeqCst) {
                    continue; // dropped: the client sees the connection close
                }
                let mut held = list.lock().unwrap();
                held.push(client.try_clone().expect("clone"));
                held.push(server.try_clone().expect("clone"));
                pipe(
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                );
                pipe(server, client);
            }
        });
        Gate { addr, open, conns }
    }

    /// `["http://ADDR"]` as TOML.
    pub fn endpoints(&self) -> String {
        format!("[\"http://{}\"]", self.addr)
    }

    pub fn close(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn open(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn pipe(mut from: std::net::TcpStream, mut to: std::net::TcpStream) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
}
