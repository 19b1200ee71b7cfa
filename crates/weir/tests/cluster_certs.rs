//! Certificates across a fleet: two `weir run` processes sharing their config and their
//! automatic certificates through a real etcd (etcd_support), ordering from a real pebble
//! (pebble_support); skipped without either. One order reaches pebble for a name and
//! both instances serve its certificate; the private keys in etcd are sealed, not PEM;
//! an instance killed while it holds the order lock holds it no longer than its lease,
//! and the other then orders. The internal CA is the fleet's one, and so is its leaf. And
//! the store alone: a holder whose lease was lost writes nothing (the fencing token).
//!
//! Pebble validates HTTP-01 through a balancer in front of both instances (a round-robin
//! TCP forwarder, as a fleet runs behind one), so the instance that did not order answers
//! the challenge as often as the one that did.

mod etcd_support;
mod pebble_support;
mod support_process;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use etcd_support::{etcd_and_etcdctl, Etcd};
use pebble_support::{free_port, pebble_dir, presented_at, wait_for, PebbleSetup};
use support_process::{call, TempDir, Weir, WEIR};

const NAME: &str = "a.weir.test";

/// A TCP forwarder handing each connection to the next of its targets in turn; while
/// `hold` is on, new connections wait (a server that does not answer yet) and are
/// forwarded once it is off.
struct Balancer {
    addr: SocketAddr,
    targets: Arc<Mutex<Vec<SocketAddr>>>,
    held: Arc<AtomicBool>,
}

impl Balancer {
    fn start(targets: Vec<SocketAddr>) -> Balancer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind balancer");
        let addr = listener.local_addr().expect("addr");
        let targets = Arc::new(Mutex::new(targets));
        let held = Arc::new(AtomicBool::new(false));
        let (list, hold) = (targets.clone(), held.clone());
        std::thread::spawn(move || {
            let next = Arc::new(AtomicUsize::new(0));
            for client in listener.incoming().flatten() {
                let (list, hold, next) = (list.clone(), hold.clone(), next.clone());
                std::thread::spawn(move || {
                    // A forwarder's wait, not a test's: the test flips `hold` when it is ready.
                    while hold.load(Ordering::SeqCst) {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    let to = {
                        let list = list.lock().unwrap();
                        match list.len() {
                            0 => return, // no target: the connection is closed
                            n => list[next.fetch_add(1, Ordering::Relaxed) % n],
                        }
                    };
                    if let Ok(server) = TcpStream::connect(to) {
                        pipe(
                            client.try_clone().expect("clone"),
                            server.try_clone().expect("clone"),
                        );
                        pipe(server, client);
                    }
                });
            }
        });
        Balancer {
            addr,
            targets,
            held,
        }
    }

    fn set(&self, targets: Vec<SocketAddr>) {
        *self.targets.lock().unwrap() = targets;
    }

    fn hold(&self, on: bool) {
        self.held.store(on, Ordering::SeqCst);
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
}

/// The shared objects: `web` (plain HTTP, where pebble validates) and `https` with an
/// ACME certificate for [`NAME`] from `directory`, stored in `acme` beside each
/// instance's local file.
fn shared(setup: &PebbleSetup, directory: &str) -> String {
    let fields = r#"challenge = "http-01", storage = "acme""#;
    setup.listeners("web", NAME, directory, fields, "")
}

/// A fleet member's local file, in a directory of its own (its `acme` storage).
fn member(dir: &TempDir, node: &str, etcd: &Etcd, prefix: &str) -> std::path::PathBuf {
    let home = dir.path().join(node);
    std::fs::create_dir_all(&home).expect("member dir");
    let key = dir.path().join("cluster.key");
    if !key.exists() {
        std::fs::write(&key, "7f".repeat(32)).expect("key file");
    }
    let text = format!(
        "[server]\nworkers = 1\ndrain_timeout = \"0s\"\n[admin]\nbind = \"127.0.0.1:0\"\n\
         [cluster]\nnode = \"{node}\"\nkey_file = {:?}\n\
         etcd = {{ endpoints = {}, prefix = \"{prefix}\", snapshot = {:?}, lease_ttl = \"2s\", timeout = \"1s\" }}\n",
        key.display().to_string(),
        etcd.endpoints(&etcd.all()),
        home.join("snapshot.json").display().to_string(),
    );
    let path = home.join("weir.toml");
    std::fs::write(&path, text).expect("local file");
    path
}

/// `weir ctl -c LOCAL cluster push -f FILE` with `text` as FILE.
fn push(dir: &TempDir, local: &std::path::Path, text: &str) {
    let file = dir.write("shared.toml", text);
    let out = Command::new(WEIR)
        .args(["ctl", "-c"])
        .arg(local)
        .args(["cluster", "push", "-f"])
        .arg(&file)
        .output()
        .expect("run weir ctl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The value of the metric line starting with `series` (0 when absent).
fn metric(weir: &Weir, series: &str) -> f64 {
    let (_, text) = call(weir.admin_addr(), "GET", "/metrics", &[], "").expect("metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn valid_orders(weir: &Weir) -> f64 {
    metric(weir, "weir_acme_orders_total{result=\"valid\"}")
}

fn https(weir: &Weir) -> SocketAddr {
    weir.log
        .listening("https", "listening", pebble_support::WAIT)
        .expect("https listener")
}

/// The raw value of `key` (`etcdctl get --print-value-only`).
fn raw(etcd: &Etcd, key: &str) -> String {
    etcd.etcdctl(0, &["get", key, "--print-value-only"])
        .expect("etcdctl get")
}

/// Both instances of `fleet` serve one certificate for [`NAME`].
fn same_certificate(fleet: &[Weir]) {
    wait_for("both instances to serve the certificate", || {
        let got: Vec<Option<String>> = fleet.iter().map(|w| presented_at(https(w), NAME)).collect();
        got[0].is_some() && got[0] == got[1]
    });
}

/// The keys under `PREFIX/certs/files/`, after checking each private one is sealed.
fn files_in_etcd(etcd: &Etcd, prefix: &str) -> Vec<String> {
    let listing = etcd
        .etcdctl(
            0,
            &[
                "get",
                "--prefix",
                "--keys-only",
                &format!("{prefix}/certs/files/"),
            ],
        )
        .expect("etcdctl get");
    let keys: Vec<String> = listing
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    for key in &keys {
        let value = raw(etcd, key);
        if key.ends_with(".pem") {
            assert!(value.contains("BEGIN CERTIFICATE"), "{key}");
        } else {
            assert!(value.starts_with("weir-aead-1:"), "{key} is sealed");
            assert!(
                !value.contains("PRIVATE KEY") && !value.contains("\"n\""),
                "{key}"
            );
        }
    }
    keys
}

#[test]
fn the_internal_ca_and_its_certificate_are_the_fleets() {
    let Some(etcd) = etcd_and_etcdctl() else {
        return;
    };
    let etcd = Etcd::start(etcd, 1);
    let dir = TempDir::new("fleet-ca");
    let prefix = "/t/ca";
    let files = [
        member(&dir, "a", &etcd, prefix),
        member(&dir, "b", &etcd, prefix),
    ];
    let text = format!(
        "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\
         [[listeners.routes]]\nname = \"all\"\nrespond = {{ status = 200 }}\n\
         [[listeners]]\nname = \"https\"\nbind = \"127.0.0.1:0\"\nhttp_bind = \"off\"\n\
         tls = {{ internal_ca = {{ storage = \"ca\" }} }}\n\
         [[listeners.routes]]\nname = \"app\"\nhosts = [\"{NAME}\"]\nrespond = {{ status = 200 }}\n"
    );
    push(&dir, &files[0], &text);
    let fleet: Vec<Weir> = files.iter().map(|f| Weir::start_file(f)).collect();
    same_certificate(&fleet);
    let ca = |node: &str| std::fs::read(dir.path().join(node).join("ca/ca.pem")).expect("ca.pem");
    assert_eq!(ca("a"), ca("b"), "one CA for the fleet");
    let keys = files_in_etcd(&etcd, prefix);
    assert_eq!(
        keys.len(),
        4,
        "the CA and the certificate, each with its key: {keys:?}"
    );
    // Counted just after the certificate went into use.
    let installs = || -> f64 {
        fleet
            .iter()
            .map(|w| metric(w, "weir_acme_fleet_installs_total{}"))
            .sum()
    };
    wait_for("the install to be counted", || installs() >= 1.0);
    assert_eq!(
        installs(),
        1.0,
        "one instance issued, the other installed it"
    );
}

#[test]
fn one_order_for_the_fleet_both_serve_it_and_keys_in_etcd_are_sealed() {
    let (Some(pebble), Some(etcd)) = (pebble_dir(), etcd_and_etcdctl()) else {
        return;
    };
    let etcd = Etcd::start(etcd, 1);
    let setup = PebbleSetup::new(pebble);
    let balancer = Balancer::start(Vec::new());
    let _pebble = setup.start(balancer.addr.port(), free_port(), 3600);
    // The directory waits until both instances are up behind the balancer.
    let pebble_addr: SocketAddr = ([127, 0, 0, 1], setup.port).into();
    let directory = Balancer::start(vec![pebble_addr]);
    directory.hold(true);
    let dir = TempDir::new("fleet-acme");
    let prefix = "/t/acme";
    let files = [
        member(&dir, "a", &etcd, prefix),
        member(&dir, "b", &etcd, prefix),
    ];
    let url = format!("https://127.0.0.1:{}/dir", directory.addr.port());
    push(&dir, &files[0], &shared(&setup, &url));
    let fleet: Vec<Weir> = files.iter().map(|f| Weir::start_file(f)).collect();
    balancer.set(fleet.iter().map(|w| w.addr).collect());
    directory.hold(false);

    same_certificate(&fleet);
    // Counted once the order's task ends, just after the certificate went into use.
    let count = || -> Vec<f64> { fleet.iter().map(valid_orders).collect() };
    wait_for("the order to be counted", || {
        count().iter().sum::<f64>() >= 1.0
    });
    let orders = count();
    assert_eq!(
        orders.iter().sum::<f64>(),
        1.0,
        "one order for the fleet: {orders:?}"
    );
    let failed: f64 = fleet
        .iter()
        .map(|w| metric(w, "weir_acme_orders_total{result=\"failed\"}"))
        .sum();
    assert_eq!(
        failed,
        0.0,
        "no order failed (the challenge reached both):\n{}\n{}",
        fleet[0].log.text(),
        fleet[1].log.text()
    );
    let other = if orders[0] == 1.0 {
        &fleet[1]
    } else {
        &fleet[0]
    };
    assert!(
        metric(other, "weir_acme_fleet_installs_total{}") >= 1.0,
        "installed from the fleet:\n{}",
        other.log.text()
    );

    // In etcd: the certificate as PEM, its key and the account sealed.
    let keys = files_in_etcd(&etcd, prefix);
    assert_eq!(keys.len(), 3, "certificate, key and account: {keys:?}");
}

#[test]
fn an_instance_killed_holding_the_lock_holds_it_until_its_lease_expires() {
    let (Some(pebble), Some(etcd)) = (pebble_dir(), etcd_and_etcdctl()) else {
        return;
    };
    let etcd = Etcd::start(etcd, 1);
    let setup = PebbleSetup::new(pebble);
    let validation = Balancer::start(Vec::new());
    let _pebble = setup.start(validation.addr.port(), free_port(), 3600);
    // The ACME directory behind a forwarder that stops answering: an order hangs in it.
    let pebble_addr: SocketAddr = ([127, 0, 0, 1], setup.port).into();
    let directory = Balancer::start(vec![pebble_addr]);
    directory.hold(true);
    let dir = TempDir::new("fleet-acme-kill");
    let prefix = "/t/kill";
    let files = [
        member(&dir, "a", &etcd, prefix),
        member(&dir, "b", &etcd, prefix),
    ];
    let url = format!("https://127.0.0.1:{}/dir", directory.addr.port());
    push(&dir, &files[0], &shared(&setup, &url));

    let a = Weir::start_file(&files[0]);
    let lock = format!("{prefix}/certs/locks/");
    wait_for("a to hold the order lock", || {
        etcd.etcdctl(0, &["get", "--prefix", &lock, "--print-value-only"])
            .is_ok_and(|v| v.trim() == "a")
    });
    let b = Weir::start_file(&files[1]);
    validation.set(vec![b.addr]);
    wait_for("b to find the lock held", || {
        metric(&b, "weir_acme_fleet_lock_waits_total{}") >= 1.0
    });
    drop(a); // SIGKILL, mid-order: its lock stays until its lease expires
    directory.hold(false);
    wait_for("b to serve the certificate", || {
        presented_at(https(&b), NAME).is_some()
    });
    wait_for("b's order to be counted", || valid_orders(&b) >= 1.0);
    assert_eq!(valid_orders(&b), 1.0, "{}", b.log.text());
    let holder = etcd
        .etcdctl(0, &["get", "--prefix", &lock, "--print-value-only"])
        .expect("etcdctl");
    assert!(
        holder.trim().is_empty(),
        "no lock left after the order: {holder}"
    );
}

/// The store itself against etcd: the lock is one holder's at a time, and a holder whose
/// lease was lost (cut off from etcd past `lease_ttl`) writes nothing, while the next
/// holder writes a certificate and its key together.
#[test]
fn a_write_fenced_by_a_lost_lock_is_refused() {
    use weir_cluster::certs::{EtcdStore, FleetCerts};
    use weir_core::tls::auto::shared::{File, Store};
    let Some(etcd) = etcd_and_etcdctl() else {
        return;
    };
    let etcd = Etcd::start(etcd, 1);
    let dir = TempDir::new("fleet-fence");
    let local = member(&dir, "a", &etcd, "/t/fence");
    let text = std::fs::read_to_string(&local).expect("local file");
    let config = weir_config::parse_str(&text, "weir.toml").expect("local file parses");
    let settings = config.cluster.etcd.expect("etcd");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let client = Arc::new(weir_cluster::etcd::Etcd::new(&settings).expect("client"));
    let key = settings.cert_key.as_ref().expect("key_file");
    let store = EtcdStore::new(client, runtime.handle().clone(), &settings, key).expect("store");
    let store = FleetCerts(Arc::new(store));
    let pair = |v: &str| {
        let file = |name: &str| File {
            name: name.to_owned(),
            contents: format!("{v} {name}").into_bytes(),
        };
        vec![file("x.pem"), file("x.key")]
    };
    runtime.block_on(async {
        let first = store.lock("x").await.expect("lock").expect("free");
        assert!(store.lock("x").await.expect("lock").is_none(), "held");
        let lease = format!("{:x}", first.lease);
        etcd.etcdctl(0, &["lease", "revoke", &lease])
            .expect("revoke the holder's lease");
        let second = store
            .lock("x")
            .await
            .expect("lock")
            .expect("free once the lease is gone");
        assert!(second.token > first.token);
        let stale = store.write(Some(&first), pair("old")).await.expect("write");
        assert!(!stale, "the old holder's write is refused");
        assert!(store
            .write(Some(&second), pair("new"))
            .await
            .expect("write"));
        let names = ["x.pem".to_owned(), "x.key".to_owned()];
        let got = store.read(&names).await.expect("read");
        let want = |n: &str| Some(format!("new {n}").into_bytes());
        assert_eq!(got, vec![want("x.pem"), want("x.key")]);
    });
    let sealed = raw(&etcd, "/t/fence/certs/files/x.key");
    assert!(
        sealed.starts_with("weir-aead-1:") && !sealed.contains("new"),
        "{sealed}"
    );
}
