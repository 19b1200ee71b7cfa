//! Weir as a system service, through the real binary: the systemd notification protocol
//! (`Type=notify`, contrib/systemd/weir.service) heard on a `NOTIFY_SOCKET` of the test's
//! own (READY and MAINPID at start, RELOADING then READY around SIGHUP, the new main pid
//! across a `weir upgrade`, STOPPING on SIGTERM), and SIGUSR1 reopening every access log
//! after logrotate moved them (contrib/logrotate/weir), and a binary upgrade of a listener
//! with a TLS bind and an `http_bind`.

mod support_process;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;

use support_process::{get, signal_pid, TempDir, Weir, START_WAIT, WEIR};
use weir_testkit::wait_until;

/// A service manager's end of the notification socket.
struct Manager {
    socket: UnixDatagram,
}

impl Manager {
    fn bind(path: &Path) -> Manager {
        let socket = UnixDatagram::bind(path).expect("bind the notify socket");
        socket
            .set_read_timeout(Some(START_WAIT))
            .expect("read timeout");
        Manager { socket }
    }

    /// The next notification, as its `KEY=VALUE` lines.
    fn next(&self) -> Vec<String> {
        let mut buf = [0u8; 4096];
        let n = self
            .socket
            .recv(&mut buf)
            .expect("a notification within the start wait");
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Reads notifications until one holds `line`; returns it.
    fn until(&self, line: &str) -> Vec<String> {
        loop {
            let message = self.next();
            if message.iter().any(|l| l == line) {
                return message;
            }
        }
    }
}

fn main_pid(message: &[String]) -> u32 {
    message
        .iter()
        .find_map(|l| l.strip_prefix("MAINPID="))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no MAINPID in {message:?}"))
}

/// Gone or a zombie (an orphan waiting for init to reap it).
fn has_exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

const CONFIG: &str = "[server]\nworkers = 1\ndrain_timeout = \"1s\"\n[admin]\nbind = \"off\"\n\
     [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\
     [[listeners.routes]]\nname = \"all\"\nrespond = { status = 200, body = \"ok\\n\" }\n";

#[test]
fn notify_socket_follows_start_reload_upgrade_and_stop() {
    let dir = TempDir::new("notify");
    let manager = Manager::bind(&dir.path().join("notify.sock"));
    let config = dir.write("weir.toml", CONFIG);
    let mut cmd = Command::new(WEIR);
    cmd.arg("run").arg("-c").arg(&config);
    cmd.env("NOTIFY_SOCKET", dir.path().join("notify.sock"));
    let weir = Weir::spawn(cmd);

    let ready = manager.until("READY=1");
    assert_eq!(main_pid(&ready), weir.pid());
    let (head, _) = get(weir.addr, "/").expect("served once ready");
    assert_eq!(head.status, 200);

    weir.signal(libc::SIGHUP);
    let reloading = manager.next();
    assert!(
        reloading.contains(&"RELOADING=1".to_owned()),
        "{reloading:?}"
    );
    assert!(
        reloading.iter().any(|l| l.starts_with("MONOTONIC_USEC=")),
        "{reloading:?}"
    );
    assert_eq!(main_pid(&manager.until("READY=1")), weir.pid());

    // The upgrade: the new process names itself the main one before the old one drains,
    // and the old one's exit says nothing (no STOPPING=1: the service goes on).
    weir.signal(libc::SIGUSR2);
    assert!(manager.next().contains(&"RELOADING=1".to_owned()));
    let upgraded = manager.until("READY=1");
    let new_pid = main_pid(&upgraded);
    assert_ne!(new_pid, weir.pid(), "the main pid moved to the new process");
    assert!(
        wait_until(START_WAIT, || has_exited(weir.pid())),
        "the old process drained and exited"
    );
    manager.socket.set_nonblocking(true).expect("non-blocking");
    let mut buf = [0u8; 4096];
    assert!(
        manager.socket.recv(&mut buf).is_err(),
        "nothing more from the old process: {:?}",
        String::from_utf8_lossy(&buf)
    );
    let (head, _) = get(weir.addr, "/").expect("the new process serves");
    assert_eq!(head.status, 200);

    manager.socket.set_nonblocking(false).expect("blocking");
    signal_pid(new_pid, libc::SIGTERM);
    manager.until("STOPPING=1");
    assert!(
        wait_until(START_WAIT, || has_exited(new_pid)),
        "the new process stopped"
    );
}

#[test]
fn sigusr1_reopens_every_access_log() {
    let dir = TempDir::new("logrotate");
    let log = |name: &str| dir.path().join(name);
    let config = format!(
        "[server]\nworkers = 1\n[admin]\nbind = \"off\"\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\
         access_log = {{ format = \"common\", path = {:?} }}\n\
         [[listeners.routes]]\nname = \"all\"\nrespond = {{ status = 200 }}\n\
         [[listeners]]\nname = \"other\"\nbind = \"127.0.0.1:0\"\n\
         access_log = {{ format = \"common\", path = {:?} }}\n\
         [[listeners.routes]]\nname = \"all\"\nrespond = {{ status = 200 }}\n",
        log("web.log").display().to_string(),
        log("other.log").display().to_string(),
    );
    let weir = Weir::start(&config);
    let other = weir
        .log
        .listening("other", "listening", START_WAIT)
        .expect("listener other");
    let lines = |path: &Path| {
        std::fs::read_to_string(path).map_or(0, |t| t.lines().filter(|l| !l.is_empty()).count())
    };
    let request_both = || {
        get(weir.addr, "/a").expect("web");
        get(other, "/b").expect("other");
    };
    request_both();
    assert!(wait_until(START_WAIT, || {
        lines(&log("web.log")) == 1 && lines(&log("other.log")) == 1
    }));

    // What logrotate does without copytruncate: move the files, then signal.
    for name in ["web.log", "other.log"] {
        std::fs::rename(log(name), log(&format!("{name}.1"))).expect("rotate");
    }
    weir.signal(libc::SIGUSR1);
    assert!(weir
        .log
        .wait_for("SIGUSR1: reopening access logs", START_WAIT));
    request_both();
    assert!(
        wait_until(START_WAIT, || {
            lines(&log("web.log")) == 1 && lines(&log("other.log")) == 1
        }),
        "both logs reopened: web.log {} line(s), other.log {} line(s)",
        lines(&log("web.log")),
        lines(&log("other.log"))
    );
    assert_eq!(
        lines(&log("web.log.1")),
        1,
        "nothing more in the moved file"
    );
    assert_eq!(
        lines(&log("other.log.1")),
        1,
        "nothing more in the moved file"
    );
}

/// Whether a TLS handshake completes on `addr` (any certificate accepted).
fn handshakes(addr: std::net::SocketAddr) -> bool {
    use std::sync::Arc;
    let config = rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(weir_testkit::certs::AcceptAnyServerCert))
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("site.test").unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let Ok(mut tcp) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    tcp.set_read_timeout(Some(START_WAIT)).unwrap();
    while conn.is_handshaking() {
        if conn.complete_io(&mut tcp).is_err() {
            return false;
        }
    }
    true
}

/// A binary upgrade hands over each bind of a listener with its kind: after it, the TLS
/// bind still does TLS and the `http_bind` still answers plain HTTP, on the same ports.
#[test]
fn an_upgrade_keeps_a_listeners_tls_bind_and_http_bind_apart() {
    let ca = weir_testkit::certs::TestCa::new("upgrade CA");
    let leaf = ca.leaf(&["site.test"]);
    let config = format!(
        "[server]\nworkers = 1\ndrain_timeout = \"1s\"\n[admin]\nbind = \"off\"\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\nhttp_bind = \"127.0.0.1:0\"\n\
         [listeners.tls]\ncerts = [{{ cert = {:?}, key = {:?} }}]\n\
         [[listeners.routes]]\nname = \"all\"\nrespond = {{ status = 200 }}\n",
        leaf.cert_path.display().to_string(),
        leaf.key_path.display().to_string()
    );
    let weir = Weir::start(&config);
    let plain = weir
        .log
        .listening("web", "listening (http_bind)", START_WAIT)
        .expect("the http_bind address is logged");
    let check = || {
        assert!(handshakes(weir.addr), "TLS on the bind");
        assert!(!handshakes(plain), "no TLS on the http_bind");
        assert_eq!(get(plain, "/").expect("plain HTTP").0.status, 200);
    };
    check();
    weir.signal(libc::SIGUSR2);
    assert!(weir.log.wait_for("the new process is ready", START_WAIT));
    assert!(
        wait_until(START_WAIT, || has_exited(weir.pid())),
        "the old process drained and exited"
    );
    check();
    let new_pid = weir
        .log
        .lines()
        .iter()
        .find_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("new_pid="))
                .and_then(|p| p.parse::<u32>().ok())
        })
        .expect("new pid logged");
    signal_pid(new_pid, libc::SIGTERM);
    assert!(wait_until(START_WAIT, || has_exited(new_pid)));
}

/// `weir check` says what the short automatic-HTTPS form implies: the port-80 bind and
/// what it does, the names ordered, and the storage in the state directory.
#[test]
fn check_shows_the_implied_port_80_bind_and_the_acme_storage() {
    let dir = TempDir::new("check-implied");
    let config = dir.write(
        "weir.toml",
        "[[listeners]]\nname = \"site\"\nbind = \"127.0.0.1:443\"\ntls = { acme = {} }\n\
         [[listeners.routes]]\nname = \"app\"\nhosts = [\"example.com\"]\nrespond = { status = 200 }\n",
    );
    let out = Command::new(WEIR)
        .args(["check", "-c"])
        .arg(&config)
        .env("STATE_DIRECTORY", dir.path().join("state"))
        .output()
        .expect("weir check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(
            "127.0.0.1:80 (plain HTTP, implied by acme: answers HTTP-01, redirects to https"
        ),
        "{stdout}"
    );
    let storage = dir.path().join("state/acme");
    assert!(
        stdout.contains(&format!(
            "acme orders example.com into {}",
            storage.display()
        )),
        "{stdout}"
    );
    assert!(!storage.exists(), "check writes nothing");
}
