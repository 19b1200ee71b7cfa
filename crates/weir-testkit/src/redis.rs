//! [`RedisServer`]: a `redis-server` process (Debian package `redis-server`) on a free
//! port of 127.0.0.1, without persistence, killed when dropped; it can be stopped and
//! started again on the same port (a Redis outage). [`RedisServer::start_tls`] also
//! listens with TLS (`rediss://`) on a second port.
//!
//! Where the binary is missing, [`RedisServer::start`] says the test was skipped and
//! returns `None`, unless `WEIR_REQUIRE_REDIS` is set (`.ci/run` sets it once Redis is
//! installed): then it panics. `WEIR_REDIS_SERVER` names another binary.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct RedisServer {
    /// The plain port (the test kit's own commands use it, also with TLS).
    pub addr: SocketAddr,
    /// With [`RedisServer::start_tls`]: the TLS port and its certificate and key, and the
    /// CA clients' certificates must chain to.
    tls: Option<(SocketAddr, Tls)>,
    binary: PathBuf,
    child: Option<Child>,
}

impl RedisServer {
    /// A running server, or `None` (the test is skipped) where `redis-server` is missing.
    pub fn start() -> Option<RedisServer> {
        RedisServer::launch(None)
    }

    /// A running server that also takes TLS connections on a second port, with the
    /// certificate `leaf`, from clients with a certificate of `client_ca`; or `None` as
    /// [`RedisServer::start`].
    pub fn start_tls(leaf: &crate::certs::Leaf, client_ca: &Path) -> Option<RedisServer> {
        RedisServer::launch(Some(Tls {
            cert: leaf.cert_path.clone(),
            key: leaf.key_path.clone(),
            client_ca: client_ca.to_owned(),
        }))
    }

    fn launch(tls: Option<Tls>) -> Option<RedisServer> {
        let binary = std::env::var_os("WEIR_REDIS_SERVER")
            .map_or_else(|| PathBuf::from("/usr/bin/redis-server"), PathBuf::from);
        if !binary.is_file() {
            if std::env::var_os("WEIR_REQUIRE_REDIS").is_some() {
                panic!(
                    "WEIR_REQUIRE_REDIS is set but {} is missing",
                    binary.display()
                );
            }
            eprintln!(
                "SKIPPED: {} not found (apt-get install redis-server)",
                binary.display()
            );
            return None;
        }
        let mut server = RedisServer {
            addr: free_addr(),
            tls: tls.map(|tls| (free_addr(), tls)),
            binary,
            child: None,
        };
        server.resume();
        Some(server)
    }

    /// The URL Weir is configured with.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The `rediss://` URL of the TLS port, by the name `localhost` (the certificate's).
    pub fn tls_url(&self) -> Option<String> {
        let (addr, _) = self.tls.as_ref()?;
        Some(format!("rediss://localhost:{}", addr.port()))
    }

    /// Kills the server (its data is gone: it keeps none on disk).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port; returns once it answers PING.
    pub fn resume(&mut self) {
        let mut command = Command::new(&self.binary);
        command
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &self.addr.port().to_string(),
            ])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"]);
        if let Some((addr, tls)) = &self.tls {
            command
                .args(["--tls-port", &addr.port().to_string()])
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.client_ca)
                .args(["--tls-auth-clients", "yes"]);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("testkit: start redis-server");
        self.child = Some(child);
        let up = crate::wait_until(Duration::from_secs(10), || self.command("PING") == "+PONG");
        assert!(up, "testkit: redis-server on {} did not answer", self.addr);
    }

    /// Sends one inline command and returns the first line of the reply ("" on failure).
    pub fn command(&self, command: &str) -> String {
        let Ok(mut s) = TcpStream::connect_timeout(&self.addr, Duration::from_millis(500)) else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(format!("{command}\r\n").as_bytes()).is_err() {
            return String::new();
        }
        let mut reply = [0u8; 512];
        let n = s.read(&mut reply).unwrap_or(0);
        let text = String::from_utf8_lossy(&reply[..n]);
        text.lines().next().unwrap_or("").to_owned()
    }
}

/// The files of a TLS port (the test's, which outlive the server).
struct Tls {
    cert: PathBuf,
    key: PathBuf,
    client_ca: PathBuf,
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("testkit: free port")
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
