//! A real pebble (the test ACME server Let's Encrypt maintains) for the ACME tests: its
//! JSON config and its own TLS certificate made in a temporary directory, free ports on
//! 127.0.0.1, and pebble-challtestsrv as its DNS server answering one address for every
//! name; its validation ports (`httpPort`, `tlsPort`) are given by the test.
//!
//! Runs when /usr/bin/pebble and /usr/bin/pebble-challtestsrv are there (Debian package
//! `pebble`; `WEIR_PEBBLE_DIR` names another directory holding both). Without them each
//! test prints that it was skipped and passes, unless `WEIR_REQUIRE_PEBBLE` is set.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;

use weir_testkit::certs::{CertDir, TestCa};

/// How long a condition is polled (an order takes a few seconds with pebble).
pub const WAIT: Duration = Duration::from_secs(90);

pub fn pebble_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("WEIR_PEBBLE_DIR")
        .map_or_else(|| PathBuf::from("/usr/bin"), PathBuf::from);
    let found = dir.join("pebble").is_file() && dir.join("pebble-challtestsrv").is_file();
    if !found && std::env::var_os("WEIR_REQUIRE_PEBBLE").is_some() {
        panic!(
            "WEIR_REQUIRE_PEBBLE is set but pebble or pebble-challtestsrv is not in {}",
            dir.display()
        );
    }
    if !found {
        eprintln!(
            "SKIPPED: pebble or pebble-challtestsrv not found in {} (apt-get install pebble)",
            dir.display()
        );
    }
    found.then_some(dir)
}

pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().unwrap().port()
}

pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + WAIT;
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Pebble and its DNS server, stopped when dropped.
pub struct Pebble {
    children: Vec<Child>,
}

impl Drop for Pebble {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Everything a test needs to know about its pebble before it runs.
pub struct PebbleSetup {
    pub bin: PathBuf,
    pub dir: CertDir,
    pub ca: TestCa,
    pub port: u16,
    /// The address every name resolves to, where pebble validates.
    pub ip: &'static str,
}

impl PebbleSetup {
    pub fn new(bin: PathBuf) -> PebbleSetup {
        PebbleSetup {
            bin,
            dir: CertDir::new(),
            ca: TestCa::new("pebble server CA"),
            port: free_port(),
            ip: "127.0.0.1",
        }
    }

    pub fn directory(&self) -> String {
        format!("https://127.0.0.1:{}/dir", self.port)
    }

    /// The TOML of an ACME test's two listeners: `plain`, plain HTTP (where pebble validates
    /// HTTP-01; its route answers "plain\n"), and `https`, with an ACME certificate for
    /// `name` from `directory`, trusting pebble's CA and retried after 1 s, with the further
    /// `acme` fields `fields`, after the TLS lines `tls`; its route answers "secure\n".
    pub fn listeners(
        &self,
        plain: &str,
        name: &str,
        directory: &str,
        fields: &str,
        tls: &str,
    ) -> String {
        format!(
            r#"[[listeners]]
name = "{plain}"
bind = "127.0.0.1:0"
[[listeners.routes]]
name = "all"
respond = {{ status = 200, body = "plain\n" }}
[[listeners]]
name = "https"
bind = "127.0.0.1:0"
http_bind = "off"
[listeners.tls]
{tls}acme = {{ domains = ["{name}"], directory = "{directory}", directory_ca = {:?}, retry_initial = "1s", {fields} }}
[[listeners.routes]]
name = "all"
respond = {{ status = 200, body = "secure\n" }}
"#,
            self.ca.cert_path.display().to_string(),
        )
    }

    /// Starts pebble validating on `http_port` / `tls_port`, certificates valid for
    /// `validity` seconds; waits until it accepts connections.
    pub fn start(&self, http_port: u16, tls_port: u16, validity: u64) -> Pebble {
        let leaf = self.ca.leaf(&["127.0.0.1", "localhost"]);
        let config = format!(
            r#"{{"pebble": {{"listenAddress": "127.0.0.1:{}", "managementListenAddress": "127.0.0.1:{}",
            "certificate": "{}", "privateKey": "{}", "httpPort": {http_port}, "tlsPort": {tls_port},
            "ocspResponderURL": "", "externalAccountBindingRequired": false,
            "certificateValidityPeriod": {validity}}}}}"#,
            self.port,
            free_port(),
            leaf.cert_path.display(),
            leaf.key_path.display()
        );
        let config_path = self.dir.write("pebble.json", &config);
        let dns = free_port();
        let quiet = |c: &mut Command| {
            c.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
        };
        let mut challtest = Command::new(self.bin.join("pebble-challtestsrv"));
        challtest.args([
            "-dns01",
            &format!("127.0.0.1:{dns}"),
            "-defaultIPv4",
            self.ip,
        ]);
        challtest.args([
            "-defaultIPv6",
            "",
            "-http01",
            "",
            "-https01",
            "",
            "-tlsalpn01",
            "",
        ]);
        challtest.args(["-management", &format!("127.0.0.1:{}", free_port())]);
        quiet(&mut challtest);
        let mut pebble = Command::new(self.bin.join("pebble"));
        pebble.arg("-config").arg(&config_path);
        pebble.args(["-dnsserver", &format!("127.0.0.1:{dns}")]);
        // Validation at once (no random wait); nonce rejection stays at its default.
        pebble.env("PEBBLE_VA_NOSLEEP", "1");
        quiet(&mut pebble);
        let children = vec![
            challtest.spawn().expect("start pebble-challtestsrv"),
            pebble.spawn().expect("start pebble"),
        ];
        let running = Pebble { children };
        let addr: SocketAddr = ([127, 0, 0, 1], self.port).into();
        wait_for("pebble to listen", || TcpStream::connect(addr).is_ok());
        running
    }
}

/// The SHA-256 of the leaf presented for `name` at `addr`, or `None` if the handshake
/// failed.
pub fn presented_at(addr: SocketAddr, name: &str) -> Option<String> {
    let config = rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(weir_testkit::certs::AcceptAnyServerCert))
        .with_no_client_auth();
    let server = ServerName::try_from(name.to_owned()).ok()?;
    let mut conn = rustls::ClientConnection::new(Arc::new(config), server).ok()?;
    let mut tcp = TcpStream::connect(addr).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).ok()?;
    }
    let leaf = conn.peer_certificates()?.first()?;
    Some(weir_core::tls::facts::sha256_hex(leaf))
}
