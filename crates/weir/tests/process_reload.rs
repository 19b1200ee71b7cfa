//! SIGHUP through the real binary: the config file is re-read and applied through the same
//! path as the admin API; a broken file is rejected with its `file:line` and the running
//! config stays.

mod support_process;

use std::time::Duration;

use support_process::{backend_of, refused, Weir, START_WAIT};
use weir_testkit::{wait_until, Backend};

/// The `config rejected` lines of the log so far.
fn rejections(weir: &Weir) -> Vec<String> {
    let lines = weir.log.lines().into_iter();
    lines.filter(|l| l.contains("config rejected")).collect()
}

/// Writes `text` over the config file, sends SIGHUP, and returns the `config rejected` line
/// that follows.
fn rejected(weir: &Weir, text: impl AsRef<[u8]>) -> String {
    let before = rejections(weir).len();
    let path = weir.config_path.as_ref().expect("path");
    std::fs::write(path, text).expect("write");
    weir.signal(libc::SIGHUP);
    let log = || weir.log.text();
    assert!(
        wait_until(START_WAIT, || rejections(weir).len() > before),
        "{}",
        log()
    );
    rejections(weir).pop().unwrap_or_default()
}

fn file(route_to: &str, a: &Backend, b: &Backend, extra: &str) -> String {
    format!(
        "[server]\nworkers = 1\ndrain_timeout = \"1s\"\n\n[admin]\nbind = \"off\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n\
         [[listeners.routes]]\nname = \"all\"\nupstream = \"{route_to}\"\n\n{extra}\n\
         [upstreams.a]\nservers = [{{ addr = \"{}\" }}]\n\n\
         [upstreams.b]\nservers = [{{ addr = \"{}\" }}]\n",
        a.addr(),
        b.addr()
    )
}

#[test]
fn sighup_applies_the_file_and_adds_and_removes_listeners() {
    let (a, b) = (Backend::echo("a"), Backend::echo("b"));
    let mut weir = Weir::start(&file("a", &a, &b, ""));
    let path = weir.config_path.clone().expect("path");
    assert_eq!(backend_of(weir.addr), "a");

    let second = "[[listeners]]\nname = \"second\"\nbind = \"127.0.0.1:0\"\n\
                  [[listeners.routes]]\nname = \"all\"\nupstream = \"a\"\n";
    std::fs::write(&path, file("b", &a, &b, second)).expect("write");
    weir.signal(libc::SIGHUP);
    assert!(
        weir.log.wait_for("listener=second", START_WAIT),
        "{}",
        weir.log.text()
    );
    assert!(weir
        .log
        .wait_for("changed route web/all", Duration::from_secs(5)));
    assert_eq!(backend_of(weir.addr), "b");
    let second_addr = weir
        .log
        .listening("second", "listening", Duration::from_secs(5))
        .expect("second listener logged");
    assert_eq!(backend_of(second_addr), "a");

    std::fs::write(&path, file("b", &a, &b, "")).expect("write");
    weir.signal(libc::SIGHUP);
    assert!(wait_until(START_WAIT, || refused(second_addr)));
    assert_eq!(backend_of(weir.addr), "b");
    assert!(!weir.exited());
}

#[test]
fn sighup_with_a_broken_file_keeps_the_running_config() {
    let (a, b) = (Backend::echo("a"), Backend::echo("b"));
    let mut weir = Weir::start(&file("a", &a, &b, ""));
    let path = weir.config_path.clone().expect("path");
    let line = rejected(&weir, file("nowhere", &a, &b, ""));
    assert!(
        line.contains("weir.toml:"),
        "names the file and line: {line}"
    );
    assert!(line.contains("nowhere"), "{line}");
    assert!(line.contains("fix="), "{line}");
    assert_eq!(backend_of(weir.addr), "a");
    // A fixed file is taken on the next SIGHUP.
    std::fs::write(&path, file("b", &a, &b, "")).expect("write");
    weir.signal(libc::SIGHUP);
    assert!(wait_until(START_WAIT, || backend_of(weir.addr) == "b"));
    assert!(weir.wait_exit(Duration::from_millis(1)).is_none());
}

/// A TLS listener `tls` serving `cert` / `key`, for [`file`]'s `extra`.
fn tls_listener(cert: &std::path::Path, key: &std::path::Path) -> String {
    format!(
        "[[listeners]]\nname = \"tls\"\nbind = \"127.0.0.1:0\"\n\
         [listeners.tls]\ncerts = [{{ cert = \"{}\", key = \"{}\" }}]\n\
         [[listeners.routes]]\nname = \"all\"\nupstream = \"a\"\n",
        cert.display(),
        key.display()
    )
}

/// Was: a FIFO as certificate hung the reload for good, with the config store's lock held
/// (every API request hung, SIGTERM was not acted on); `/dev/zero` was read to about 1 GB,
/// kept afterwards. Now each is rejected at once, the log saying what the file is, and the
/// running config stays.
#[test]
fn sighup_with_a_certificate_that_is_a_fifo_or_a_device_keeps_the_running_config() {
    let (a, b) = (Backend::echo("a"), Backend::echo("b"));
    let leaf = weir_testkit::certs::TestCa::new("Reload CA").leaf(&["a.example.com"]);
    let mut weir = Weir::start(&file("a", &a, &b, ""));
    let path = weir.config_path.clone().expect("path");
    let fifo = path.with_file_name("cert.fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.expect("mkfifo").success());
    for (cert, what) in [
        (fifo.as_path(), "(a FIFO)"),
        (std::path::Path::new("/dev/zero"), "(a character device)"),
    ] {
        let extra = tls_listener(cert, &leaf.key_path);
        let line = rejected(&weir, file("b", &a, &b, &extra));
        assert!(
            line.contains("field=listeners[1].tls.certs[0].cert"),
            "{line}"
        );
        assert!(
            line.contains(&format!("is not a regular file {what}")),
            "{line}"
        );
        assert_eq!(backend_of(weir.addr), "a");
    }
    weir.signal(libc::SIGTERM);
    assert!(weir.wait_exit(START_WAIT).is_some(), "SIGTERM acted on");
}

/// Was: a listener whose `bind` is taken was reported at the first `[[listeners]]` line
/// (`field=listeners[extra].bind` could not be located by the listener's name).
#[test]
fn a_bind_failure_on_reload_is_located_at_that_bind() {
    let (a, b) = (Backend::echo("a"), Backend::echo("b"));
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken = held.local_addr().expect("addr");
    let weir = Weir::start(&file("a", &a, &b, ""));
    let extra = format!(
        "[[listeners]]\nname = \"extra\"\nbind = \"{}\"\n\
         [[listeners.routes]]\nname = \"all\"\nupstream = \"a\"\n",
        taken
    );
    let text = file("a", &a, &b, &extra);
    let line = rejected(&weir, &text);
    let bind_line = text
        .lines()
        .position(|l| l == format!("bind = \"{taken}\""))
        .expect("the extra bind")
        + 1;
    assert!(
        line.contains(&format!("weir.toml:{bind_line}:")),
        "line {bind_line}: {line}"
    );
    assert!(line.contains("field=listeners[extra].bind"), "{line}");
    assert!(line.contains("fix="), "{line}");
    assert_eq!(backend_of(weir.addr), "a");
}

/// Was: `at="" ... fix=check the file exists and is readable` for a file that is not UTF-8,
/// where `weir check` says to save it as UTF-8. Now the reload says what `weir check` says.
#[test]
fn sighup_with_a_file_that_is_not_utf8_says_so() {
    let (a, b) = (Backend::echo("a"), Backend::echo("b"));
    let weir = Weir::start(&file("a", &a, &b, ""));
    let mut bytes = file("b", &a, &b, "").into_bytes();
    bytes.extend_from_slice(b"# caf\xe9\n");
    let line = rejected(&weir, bytes);
    assert!(line.contains("fix=save the file as UTF-8"), "{line}");
    assert!(line.contains("weir.toml"), "names the file: {line}");
    assert_eq!(backend_of(weir.addr), "a");
}
