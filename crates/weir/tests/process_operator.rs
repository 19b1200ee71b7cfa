//! The operator's day with the real binary: a second Weir on the same ports, logs for a
//! service manager, relative paths. (`weir ctl` has its own file, process_ctl.rs.)

mod support_process;

use std::process::Command;
use std::time::Duration;

use support_process::{config, get, route_to, Weir, START_WAIT, WEIR};
use weir_testkit::Backend;

/// A config with listener `web` on `bind` (an address or `127.0.0.1:0`).
fn on(bind: &str, listener_keys: &str, backend: &Backend) -> String {
    config(
        "drain_timeout = \"0s\"",
        listener_keys,
        &route_to("app", "/", backend.addr()),
    )
    .replace("bind = \"127.0.0.1:0\"", &format!("bind = \"{bind}\""))
}

/// Was: listeners bind with SO_REUSEPORT, so a second `weir run` on a copy of the config
/// bound the same port without an error and took half of the new connections.
#[test]
fn a_second_weir_on_the_same_port_is_refused_naming_the_holder() {
    let backend = Backend::echo("app");
    let first = Weir::start(&on("127.0.0.1:0", "", &backend));
    let addr = first.addr.to_string();

    let dir = support_process::TempDir::new("second");
    let path = dir.write("copy.toml", &on(&addr, "", &backend));
    let mut cmd = Command::new(WEIR);
    cmd.arg("run").arg("-c").arg(&path);
    let mut second = Weir::spawn_no_wait(cmd);
    let status = second.wait_exit(START_WAIT);
    // The log is read by another thread: it may lag the exit.
    second.log.wait_for("cannot bind", START_WAIT);
    let log = second.log.text();
    assert!(
        status.is_some_and(|s| !s.success()),
        "the second weir must exit with an error, got {status:?}:\n{log}"
    );
    assert!(log.contains(&addr), "names the address: {log}");
    assert!(
        log.contains(&format!("process {} (weir)", first.pid())),
        "names the holder: {log}"
    );
    assert_eq!(
        get(first.addr, "/x").expect("first still serves").0.status,
        200
    );
}

/// Sends SIGHUP and waits for the change to be logged, not rejected.
fn sighup_applies(weir: &Weir) {
    weir.signal(libc::SIGHUP);
    let log = &weir.log;
    let changed = log.wait_for("config changed by=SIGHUP", Duration::from_secs(20));
    assert!(changed, "{}", log.text());
    assert!(!log.contains("rejected"), "{}", log.text());
}

/// Was: relative paths resolved against the working directory, so `weir run` from another
/// directory (a systemd unit runs in `/`) could not find the certificates.
#[test]
fn weir_run_from_another_directory_finds_relative_files() {
    let ca = weir_testkit::certs::TestCa::new("Run CA");
    let leaf = ca.leaf(&["localhost"]);
    let dir = support_process::TempDir::new("relative");
    std::fs::create_dir_all(dir.path().join("certs")).expect("mkdir");
    dir.write("certs/site.pem", &leaf.chain_pem);
    dir.write("certs/site.key", &leaf.key_pem);
    let backend = Backend::echo("app");
    let text = on("127.0.0.1:0", "", &backend).replace(
        "bind = \"127.0.0.1:0\"\n",
        "bind = \"127.0.0.1:0\"\ntls = { certs = [{ cert = \"certs/site.pem\", key = \"certs/site.key\" }] }\n",
    );
    let path = dir.write("weir.toml", &text);
    let mut cmd = Command::new(WEIR);
    cmd.arg("run").arg("-c").arg(&path).current_dir("/");
    let weir = Weir::spawn(cmd);
    // A reload through the file resolves them the same way.
    sighup_applies(&weir);
}

/// A reload that rebinds the address a listener already has (a new backlog needs new
/// sockets) is this process's own business: the check must not refuse it.
#[test]
fn a_reload_rebinding_its_own_address_still_works() {
    let backend = Backend::echo("app");
    let weir = Weir::start(&on("127.0.0.1:0", "", &backend));
    let path = weir.config_path.clone().expect("config path");
    let addr = weir.addr.to_string();
    std::fs::write(&path, on(&addr, "backlog = 64", &backend)).expect("rewrite");
    sighup_applies(&weir);
    assert_eq!(get(weir.addr, "/x").expect("serves").0.status, 200);
    let listening = || {
        let lines = weir.log.lines();
        lines
            .iter()
            .filter(|l| l.contains("listening listener=web"))
            .count()
    };
    assert_eq!(
        listening(),
        2,
        "bound at start and rebound: {}",
        weir.log.text()
    );
    // Was: a change that keeps the sockets logged `listening` as if it had bound anew.
    let keepalive = "backlog = 64\nkeepalive_timeout = \"7s\"";
    std::fs::write(&path, on(&addr, keepalive, &backend)).expect("rewrite");
    weir.signal(libc::SIGHUP);
    let changed = || {
        weir.log
            .lines()
            .iter()
            .filter(|l| l.contains("config changed"))
            .count()
    };
    assert!(weir_testkit::wait_until(
        Duration::from_secs(20),
        || changed() == 2
    ));
    assert_eq!(listening(), 2, "{}", weir.log.text());
}

/// `weir run` with `env`, its raw stderr (not ANSI-stripped) up to the first line that
/// contains `listening`.
fn raw_log_until_listening(config: &str, env: &[(&str, &str)]) -> Vec<String> {
    use std::io::{BufRead, BufReader};
    let dir = support_process::TempDir::new("log");
    let path = dir.write("weir.toml", config);
    let mut child = Command::new(WEIR)
        .arg("run")
        .arg("-c")
        .arg(&path)
        .env_remove("NO_COLOR")
        .env_remove("WEIR_LOG_FORMAT")
        .env("WEIR_LOG", "info")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn weir");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    while let Ok(line) = rx.recv_timeout(START_WAIT) {
        let done = line.contains("listening");
        lines.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(lines.iter().any(|l| l.contains("listening")), "{lines:?}");
    lines
}

/// Was: ANSI colour codes in the log when stderr is not a terminal (journald showed them
/// raw), and no format a log collector could parse.
#[test]
fn logs_are_plain_off_a_terminal_and_json_on_request() {
    let backend = Backend::echo("app");
    let text = on("127.0.0.1:0", "", &backend);
    let plain = raw_log_until_listening(&text, &[]);
    assert!(
        plain.iter().all(|l| !l.contains('\u{1b}')),
        "no escape codes: {plain:?}"
    );
    let from_config = text.replace("[server]\n", "[server]\nlog_format = \"json\"\n");
    for (config, env) in [
        (&text, &[("WEIR_LOG_FORMAT", "json")][..]),
        (&from_config, &[]),
    ] {
        let lines = raw_log_until_listening(config, env);
        for line in &lines {
            let v: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            assert!(
                v["level"].is_string() && v["timestamp"].is_string(),
                "{line}"
            );
        }
        let last: serde_json::Value = serde_json::from_str(lines.last().expect("a line")).unwrap();
        assert_eq!(last["fields"]["message"], "listening", "{last}");
        assert_eq!(last["fields"]["listener"], "web", "{last}");
    }
}

/// Was: `cannot open access log: No such file or directory`: no file, no position, no fix.
#[test]
fn an_access_log_that_cannot_be_opened_is_located_with_a_fix() {
    let backend = Backend::echo("app");
    let dir = support_process::TempDir::new("access-log");
    let text = on(
        "127.0.0.1:0",
        "access_log = { path = \"logs/access.log\" }",
        &backend,
    );
    let path = dir.write("weir.toml", &text);
    let mut cmd = Command::new(WEIR);
    cmd.arg("run").arg("-c").arg(&path).current_dir("/");
    let mut weir = Weir::spawn_no_wait(cmd);
    let status = weir.wait_exit(START_WAIT);
    weir.log.wait_for("access log", START_WAIT);
    let log = weir.log.text();
    assert!(status.is_some_and(|s| !s.success()), "{log}");
    let line = text
        .lines()
        .position(|l| l.starts_with("access_log"))
        .expect("line")
        + 1;
    let logs = dir.path().join("logs");
    assert!(
        log.contains(&format!("{}:{line}:", path.display()))
            && log.contains("listeners[0].access_log.path")
            && log.contains(&format!(
                "{}: No such file",
                logs.join("access.log").display()
            ))
            && log.contains(&format!("(fix: create the directory {})", logs.display())),
        "{log}"
    );
}

/// Was: a request that failed upstream was logged (`request failed`, naming the error) only
/// when it came over HTTP/1.x; an HTTP/2 (or HTTP/3) client's got its 502 and left no line.
/// Every adapter now logs a failure where it becomes its answer (`proxy::log_failure`).
#[test]
fn an_upstream_failure_is_logged_for_an_http2_client_too() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let weir = Weir::start(&config(
        "drain_timeout = \"0s\"",
        "",
        &route_to("gone", "/", dead_addr),
    ));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let status = runtime.block_on(async {
        let tcp = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
        let (client, conn) = h2::client::handshake(tcp).await.expect("h2c handshake");
        tokio::spawn(conn);
        let mut client = client.ready().await.unwrap();
        let request = http::Request::get(format!("http://{}/x", weir.addr))
            .body(())
            .unwrap();
        let (response, _) = client.send_request(request, true).unwrap();
        response.await.expect("a response").status()
    });
    assert_eq!(status, 502);
    assert!(
        weir.log.wait_for("request failed", START_WAIT),
        "{}",
        weir.log.text()
    );
}
