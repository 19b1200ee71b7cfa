//! [`RedisServer`]: a `redis-server` process (Debian package `redis-server`) on a free
//! port of 127.0.0.1, without persistence, killed when dropped; it can be stopped and
//! started again on the same port (a Redis outage).
//!
//! Where the binary is missing, [`RedisServer::start`] says the test was skipped and
//! returns `None`, unless `WEIR_REQUIRE_REDIS` is set (`.ci/run` sets it once Redis is
//! installed): then it panics. `WEIR_REDIS_SERVER` names another binary.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct RedisServer {
    pub addr: SocketAddr,
    binary: PathBuf,
    child: Option<Child>,
}

impl RedisServer {
    /// A running server, or `None` (the test is skipped) where `redis-server` is missing.
    pub fn start() -> Option<RedisServer> {
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
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("testkit: free port")
            .port();
        let mut server = RedisServer {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
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

    /// Kills the server (its data is gone: it keeps none on disk).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port; returns once it answers PING.
    pub fn resume(&mut self) {
        let child = Command::new(&self.binary)
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &self.addr.port().to_string(),
            ])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
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

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
