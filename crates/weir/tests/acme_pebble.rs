//! ACME against a real pebble (the test ACME server Let's Encrypt maintains), with its
//! random rejection of good nonces left on: issuance by HTTP-01 and by TLS-ALPN-01,
//! renewal of short-lived certificates swapped in live, pebble down at start (Weir serves
//! its other names, counts the failure, retries, then gets the certificate), and a restart
//! that reuses the stored certificate without pebble.
//!
//! And the short form a newcomer writes (issue 30): `acme` with neither names nor storage
//! on a listener whose routes name the host, run by the real binary: the certificate is
//! ordered for the route host into the state directory, over HTTP-01 on the port-80 bind
//! `acme` implies, which redirects everything else to HTTPS.
//!
//! Runs when /usr/bin/pebble and /usr/bin/pebble-challtestsrv are there (Debian package
//! `pebble`; `WEIR_PEBBLE_DIR` names another directory holding both). Without them each
//! test prints that it was skipped and passes, unless `WEIR_REQUIRE_PEBBLE` is set (`.ci/run`
//! sets it once pebble is installed): then it fails. Pebble gets a JSON config and its own TLS
//! certificate made here in a temporary directory, free ports on 127.0.0.1, and
//! pebble-challtestsrv as its DNS server answering 127.0.0.1 for every name; its
//! validation ports (`httpPort`, `tlsPort`) are Weir's listeners.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use weir_core::tls::auto::AutoCerts;
use weir_core::Proxy;

mod pebble_support;
mod support_process;

use pebble_support::{pebble_dir, presented_at, wait_for, PebbleSetup, WAIT};

const NAME: &str = "a.weir.test";
const OTHER: &str = "other.weir.test";

/// Weir with a plain HTTP listener `http` and a TLS listener `https` whose ACME
/// certificate is for [`NAME`] and whose file certificate is for [`OTHER`].
fn weir(
    setup: &PebbleSetup,
    storage: &Path,
    challenge: &str,
    other: &weir_testkit::certs::Leaf,
) -> Proxy {
    let storage = storage.display().to_string();
    let fields = format!(
        r#"contact = "mailto:ops@weir.test", challenge = "{challenge}", storage = {storage:?}"#
    );
    let certs = format!(
        "certs = [{{ cert = {:?}, key = {:?} }}]\n",
        other.cert_path.display().to_string(),
        other.key_path.display().to_string(),
    );
    let listeners = setup.listeners("http", NAME, &setup.directory(), &fields, &certs);
    let toml = format!(
        "[server]\nworkers = 1\ndrain_timeout = \"0s\"\n[admin]\nbind = \"off\"\n{listeners}"
    );
    let config =
        weir_config::parse_str(&toml, "acme.toml").unwrap_or_else(|e| panic!("{e}\n{toml}"));
    Proxy::start(config, 1).expect("start weir")
}

fn ports(proxy: &Proxy) -> (u16, u16) {
    let port = |n| proxy.listener_addr(n).expect("listener").port();
    (port("http"), port("https"))
}

fn auto(proxy: &Proxy) -> Arc<AutoCerts> {
    proxy
        .snapshot()
        .listener_tls("https")
        .unwrap()
        .store
        .auto()
        .cloned()
        .unwrap()
}

/// The SHA-256 of the leaf presented for `name` on `port`, or `None` if the handshake
/// failed.
fn presented(port: u16, name: &str) -> Option<String> {
    presented_at(([127, 0, 0, 1], port).into(), name)
}

/// Waits for the ACME certificate, checks it is pebble's for [`NAME`] and that a
/// handshake for the name gets it; its fingerprint.
fn issued(proxy: &Proxy) -> String {
    let auto = auto(proxy);
    let deadline = std::time::Instant::now() + WAIT;
    while auto.current().is_none() {
        let status = auto.status();
        assert!(
            std::time::Instant::now() < deadline,
            "no ACME certificate: {status:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let cert = auto.current().unwrap();
    assert_eq!(cert.facts.names, vec![NAME]);
    assert!(
        cert.facts.issuer.contains("Pebble"),
        "{}",
        cert.facts.issuer
    );
    let (_, https) = ports(proxy);
    assert_eq!(
        presented(https, NAME).as_deref(),
        Some(cert.facts.sha256.as_str())
    );
    cert.facts.sha256.clone()
}

fn issuance(challenge: &str) {
    let Some(bin) = pebble_dir() else { return };
    let setup = PebbleSetup::new(bin);
    let storage = setup.dir.path().join("acme");
    let other = setup.ca.leaf(&[OTHER]);
    let proxy = weir(&setup, &storage, challenge, &other);
    let (http, https) = ports(&proxy);
    let _pebble = setup.start(http, https, 3600);
    issued(&proxy);
    use std::os::unix::fs::PermissionsExt;
    let (_, key) = weir_core::tls::auto::storage::cert_files(&storage, &[NAME.to_owned()], "acme");
    assert_eq!(
        std::fs::metadata(key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let metrics = proxy.metrics_renderer()();
    assert!(
        metrics.contains("weir_acme_orders_total{result=\"valid\"}"),
        "{metrics}"
    );
    proxy.shutdown();
}

#[test]
fn issues_by_http01() {
    issuance("http-01");
}

#[test]
fn issues_by_tls_alpn01() {
    issuance("tls-alpn-01");
}

#[test]
fn renews_short_lived_certificates_live() {
    let Some(bin) = pebble_dir() else { return };
    let setup = PebbleSetup::new(bin);
    let storage = setup.dir.path().join("acme");
    let other = setup.ca.leaf(&[OTHER]);
    let proxy = weir(&setup, &storage, "tls-alpn-01", &other);
    let (http, https) = ports(&proxy);
    // 30 s certificates: renewed 20 s in, 10 s before expiry. With 12 s ones the renewal
    // (ACME order, challenge, issuance: about 2 s here under load) had 4 s to finish.
    let _pebble = setup.start(http, https, 30);
    let first = issued(&proxy);
    let renew_at = auto(&proxy).status().renew_at.expect("renewal time");
    assert!(
        renew_at > weir_core::tls::facts::unix_now(),
        "renewal is ahead"
    );
    let expiry = auto(&proxy).current().unwrap().facts.not_after;
    wait_for("a renewed certificate to be served", || {
        presented(https, NAME).is_some_and(|now| now != first)
    });
    let now = weir_core::tls::facts::unix_now();
    assert!(
        now < expiry,
        "renewed before the old certificate expired ({now} >= {expiry})"
    );
    proxy.shutdown();
}

#[test]
fn pebble_down_at_start_then_up_and_restart_reuses_the_certificate() {
    let Some(bin) = pebble_dir() else { return };
    let setup = PebbleSetup::new(bin);
    let storage = setup.dir.path().join("acme");
    let other = setup.ca.leaf(&[OTHER]);
    let proxy = weir(&setup, &storage, "http-01", &other);
    let (http, https) = ports(&proxy);
    let auto = auto(&proxy);
    wait_for("a failed attempt", || auto.status().failures >= 1);
    assert!(auto.status().last_error.is_some());
    // Meanwhile: the other name is served, the ACME name fails cleanly.
    let other_sha = weir_core::tls::facts::sha256_hex(&rustls::pki_types::CertificateDer::from(
        rustls::pki_types::pem::PemObject::from_pem_slice(other.cert_pem.as_bytes())
            .map(|c: CertificateDer<'static>| c.to_vec())
            .unwrap(),
    ));
    assert_eq!(presented(https, OTHER), Some(other_sha));
    assert_eq!(
        presented(https, NAME),
        None,
        "no certificate yet: the handshake fails"
    );
    let pebble = setup.start(http, https, 3600);
    let sha = issued(&proxy);
    assert_eq!(auto.status().last_error, None);
    proxy.shutdown();
    drop((auto, proxy, pebble));

    // Pebble is gone: the restarted Weir serves the stored certificate at once.
    let again = weir(&setup, &storage, "http-01", &other);
    let (_, https) = ports(&again);
    assert_eq!(presented(https, NAME), Some(sha));
    again.shutdown();
}

/// A loopback address of this test process's own, so its port 80 is free of other tests.
fn own_loopback_ip() -> &'static str {
    let n = std::process::id() % 250 + 2;
    Box::leak(format!("127.80.0.{n}").into_boxed_str())
}

#[test]
fn the_short_form_orders_for_the_route_host_over_the_implied_port_80() {
    let Some(bin) = pebble_dir() else { return };
    let mut setup = PebbleSetup::new(bin);
    setup.ip = own_loopback_ip();
    if let Err(e) = TcpListener::bind((setup.ip, 80)) {
        // Port 80 needs root or CAP_NET_BIND_SERVICE (CI runs as root).
        eprintln!("SKIPPED: cannot bind {}:80 ({e})", setup.ip);
        return;
    }
    let state = setup.dir.path().join("state");
    let config = format!(
        "[server]\nworkers = 1\ndrain_timeout = \"0s\"\n[admin]\nbind = \"off\"\n\
         [[listeners]]\nname = \"web\"\nbind = \"{}:0\"\n\
         tls = {{ acme = {{ directory = \"{}\", directory_ca = {:?}, challenge = \"http-01\", retry_initial = \"1s\" }} }}\n\
         [[listeners.routes]]\nname = \"app\"\nhosts = [\"{NAME}\"]\nrespond = {{ status = 200, body = \"secure\\n\" }}\n",
        setup.ip,
        setup.directory(),
        setup.ca.cert_path.display().to_string(),
    );
    let path = setup.dir.write("weir.toml", &config);
    let mut cmd = Command::new(support_process::WEIR);
    cmd.arg("run").arg("-c").arg(&path);
    cmd.env("STATE_DIRECTORY", &state);
    let weir = support_process::Weir::spawn(cmd);
    let https = weir.addr;
    assert!(
        weir.log.wait_for(&format!("addr={}:80", setup.ip), WAIT),
        "the implied port-80 bind is logged:\n{}",
        weir.log.text()
    );
    let _pebble = setup.start(80, https.port(), 3600);

    let storage = state.join("acme");
    let (cert, _) = weir_core::tls::auto::storage::cert_files(&storage, &[NAME.to_owned()], "acme");
    wait_for("the certificate in the state directory", || cert.is_file());
    wait_for("the ACME certificate to be served", || {
        presented_at(https, NAME).is_some()
    });
    let plain: SocketAddr = format!("{}:80", setup.ip).parse().unwrap();
    let (head, _) = support_process::get(plain, "/page?x=1").expect("plain HTTP on port 80");
    assert_eq!(head.status, 308);
    assert_eq!(
        head.header("location"),
        Some("https://test/page?x=1"),
        "everything but the challenge is redirected to HTTPS"
    );
}
