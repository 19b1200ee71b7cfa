//! A fleet of `weir run` processes sharing their config through a real 3-member etcd
//! cluster started here (etcd_support; skipped without etcd): a change made once reaches
//! every instance; a write racing on two instances gets one winner and one 412; a change
//! one instance cannot apply is rejected there only, and reported; losing an etcd member,
//! a compaction while an instance was behind (a deletion missed then included), and losing
//! all of etcd (serving goes on, a restart comes up from the snapshot) are survived; a
//! SIGHUP re-reads a shared route's users file, and a rejected one leaves the running local
//! file; nothing is applied, started from or written while a write's `.pending` marker is
//! there; an instance on an empty prefix is not ready and says why, and `push --dry-run`
//! writes nothing; a push over etcd's request limit is split, an object over it refused; a
//! stale `If-Match` cannot re-create an object deleted while an instance was cut off; the
//! snapshot keeps what was applied, not a change rejected meanwhile; a write that finds its
//! object moved answers without waiting out the timeout; a revision rejected is not tried
//! again by a re-list. And a member reaches
//! etcd over TLS with a client certificate and a password.

mod etcd_support;
mod support_process;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use etcd_support::{etcd_and_etcdctl, etcd_bin, ClientTls, Etcd, Gate};
use support_process::{call, get, TempDir, Weir, WEIR};
use weir_testkit::certs::TestCa;

/// How long a propagation may take before the test fails (the goal is well under 1 s;
/// this bound only catches a change that never arrives, on a loaded CI machine).
const WAIT: Duration = Duration::from_secs(20);

const SHARED: &str = r#"
[[listeners]]
name = "web"
bind = "127.0.0.1:0"

[[listeners.routes]]
name = "all"
respond = { status = 200, body = "v1" }
"#;

/// A fleet member's local file in `dir`.
fn local(
    dir: &TempDir,
    node: &str,
    endpoints: &str,
    prefix: &str,
    extra: &str,
) -> std::path::PathBuf {
    local_with(
        dir,
        node,
        &format!("endpoints = {endpoints}"),
        prefix,
        extra,
    )
}

/// A fleet member's local file in `dir`, with `etcd_keys` (`endpoints = [...]` and any
/// other key of `etcd`) in its `etcd` table.
fn local_with(
    dir: &TempDir,
    node: &str,
    etcd_keys: &str,
    prefix: &str,
    extra: &str,
) -> std::path::PathBuf {
    let snapshot = dir.path().join(format!("{node}.snapshot.json"));
    let text = format!(
        "[server]\nworkers = 1\n[admin]\nbind = \"127.0.0.1:0\"\n[cluster]\nnode = \"{node}\"\n\
         etcd = {{ {etcd_keys}, prefix = \"{prefix}\", snapshot = \"{}\", lease_ttl = \"3s\", timeout = \"1s\" }}\n{extra}",
        snapshot.display()
    );
    dir.write(&format!("{node}.toml"), &text)
}

/// `weir ctl -c LOCAL cluster ARGS...`: its stdout; fails the test when it fails.
fn ctl(local: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(WEIR)
        .arg("ctl")
        .arg("-c")
        .arg(local)
        .arg("cluster")
        .args(args)
        .output()
        .expect("run weir ctl");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "weir ctl cluster {args:?} failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn push(dir: &TempDir, local: &std::path::Path, shared: &str) -> String {
    let file = dir.write("shared.toml", shared);
    ctl(local, &["push", "-f", file.to_str().expect("utf-8 path")])
}

/// The body of `GET /` on `addr` (empty when it fails).
fn body(addr: SocketAddr) -> String {
    get(addr, "/").map_or_else(
        |_| String::new(),
        |(_, b)| String::from_utf8_lossy(&b).into_owned(),
    )
}

fn wait_body(weir: &Weir, want: &str) {
    let ok = weir_testkit::wait_until(WAIT, || body(weir.addr) == want);
    assert!(
        ok,
        "never served {want:?} (serves {:?}); log:\n{}",
        body(weir.addr),
        weir.log.text()
    );
}

/// `/ready` of `weir`: status and body.
fn ready(weir: &Weir) -> (u16, String) {
    let (head, body) = call(weir.admin_addr(), "GET", "/ready", &[], "").expect("ready");
    (head.status, body)
}

/// The value of the metric line starting with `series` (0 when absent).
fn metric(weir: &Weir, series: &str) -> f64 {
    let (_, text) = call(weir.admin_addr(), "GET", "/metrics", &[], "").expect("metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn put_route(weir: &Weir, body: &str, if_match: Option<&str>) -> (u16, String) {
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(v) = if_match {
        headers.push(("If-Match", v));
    }
    let json = format!("{{\"respond\": {{\"status\": 200, \"body\": \"{body}\"}}}}");
    let (head, reply) = call(
        weir.admin_addr(),
        "PUT",
        "/api/v1/listeners/web/routes/all",
        &headers,
        &json,
    )
    .expect("PUT route");
    (head.status, reply)
}

/// `shared` with `n` more routes of listener `web`: route `rNNNN` at `/rN/` answers
/// `body(N)`.
fn with_routes(shared: &str, n: usize, body: impl Fn(usize) -> String) -> String {
    let mut out = shared.to_owned();
    for i in 0..n {
        out += &format!(
            "\n[[listeners.routes]]\nname = \"r{i:04}\"\npath_prefix = \"/r{i}/\"\n\
             respond = {{ status = 200, body = \"{}\" }}\n",
            body(i)
        );
    }
    out
}

fn etag(weir: &Weir) -> String {
    let (head, _) = call(weir.admin_addr(), "GET", "/api/v1/config", &[], "").expect("GET config");
    head.header("etag").expect("an ETag").to_owned()
}

#[test]
fn a_change_made_once_reaches_every_instance_and_a_racing_write_gets_412() {
    let Some(bin) = etcd_bin() else { return };
    let etcd = Etcd::start(bin, 3);
    let dir = TempDir::new("fleet");
    let endpoints = etcd.endpoints(&etcd.all());
    let files: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|n| local(&dir, n, &endpoints, "/t/propagate", ""))
        .collect();
    let pushed = push(&dir, &files[0], SHARED);
    assert!(pushed.contains("added listener web"), "{pushed}");
    let fleet: Vec<Weir> = files.iter().map(|f| Weir::start_file(f)).collect();
    for w in &fleet {
        wait_body(w, "v1");
        let (status, text) = ready(w);
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("cluster: in sync at revision"), "{text}");
    }

    // Once, on one instance: everywhere.
    let (status, reply) = put_route(&fleet[1], "v2", None);
    assert_eq!(status, 200, "{reply}");
    for w in &fleet {
        wait_body(w, "v2");
    }
    // Applied from the one object that changed, each instance tells it as a file's change:
    // the key edited (old and new value) in its history, and the config text with it.
    for w in &fleet {
        let ok = weir_testkit::wait_until(WAIT, || {
            let (_, history) = call(w.admin_addr(), "GET", "/api/v1/history", &[], "").unwrap();
            history.contains("listeners[web].routes[all].respond.body")
        });
        let (_, history) = call(w.admin_addr(), "GET", "/api/v1/history", &[], "").unwrap();
        assert!(ok, "{history}");
        assert!(
            history.contains(r#"\"v1\""#) && history.contains(r#"\"v2\""#),
            "{history}"
        );
        let (_, text) = call(w.admin_addr(), "GET", "/api/v1/config", &[], "").unwrap();
        assert!(
            text.contains(r#""body":"v2""#) && text.contains(r#""cluster":"#),
            "{text}"
        );
    }

    // Two operators start from the same version on two instances: one wins, one 412.
    let version = etag(&fleet[0]);
    let (first, reply) = put_route(&fleet[0], "v3", Some(&version));
    assert_eq!(first, 200, "{reply}");
    let (second, reply) = put_route(&fleet[2], "v4", Some(&version));
    assert_eq!(second, 412, "{reply}");
    for w in &fleet {
        wait_body(w, "v3");
    }
    // At the same time, from the same version: exactly one of the two.
    let version = etag(&fleet[0]);
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let a = s.spawn(|| put_route(&fleet[0], "v5", Some(&version)).0);
        let b = s.spawn(|| put_route(&fleet[1], "v6", Some(&version)).0);
        vec![a.join().unwrap(), b.join().unwrap()]
    });
    let mut sorted = statuses.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, [200, 412], "{statuses:?}");

    // Every instance is registered, at the same revision.
    let ok = weir_testkit::wait_until(WAIT, || {
        let status = ctl(&files[0], &["status", "-o", "json"]);
        let v: serde_json::Value = serde_json::from_str(&status).unwrap_or_default();
        let revision = v["revision"].clone();
        let instances = v["instances"].as_array().cloned().unwrap_or_default();
        instances.len() == 3 && instances.iter().all(|i| i["applied"] == revision)
    });
    assert!(ok, "{}", ctl(&files[0], &["status"]));
    assert!(ctl(&files[0], &["pull"]).contains("name = \"all\""));
}

/// A write whose transaction finds its object moved (the instance's view is behind: its
/// watch is waiting to retry after losing etcd) answers 412 as soon as the view has the
/// change, not after `timeout` (5 s here), although etcd's revision has moved past the
/// change with a key the view does not watch.
/// `file` (written by `local`) with `etcd.timeout = timeout` instead of 1 s.
fn with_etcd_timeout(file: std::path::PathBuf, timeout: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(&file).unwrap();
    let text = text.replace("timeout = \"1s\"", &format!("timeout = \"{timeout}\""));
    std::fs::write(&file, text).unwrap();
    file
}

#[test]
fn a_write_that_finds_its_object_moved_answers_without_waiting_out_the_timeout() {
    let Some(bin) = etcd_bin() else { return };
    let etcd = Etcd::start(bin, 1);
    let gate = Gate::to(&etcd, 0);
    let dir = TempDir::new("fleet-moved");
    let prefix = "/t/moved";
    let file = with_etcd_timeout(local(&dir, "gated", &gate.endpoints(), prefix, ""), "5s");
    push(&dir, &file, SHARED);
    let weir = Weir::start_file(&file);
    wait_body(&weir, "v1");
    let before = etag(&weir);

    gate.close();
    let route = "respond = { status = 200, body = \"v2\" }\n";
    etcd.put(0, &format!("{prefix}/config/routes/web/all"), route);
    etcd.put(0, &format!("{prefix}/elsewhere"), "x");
    // The watch has failed often enough to wait 1.6 s before its next try.
    let lost = || weir.log.text().matches("etcd watch lost").count();
    assert!(
        weir_testkit::wait_until(WAIT, || lost() >= 5),
        "{}",
        weir.log.text()
    );
    gate.open();
    let start = std::time::Instant::now();
    let (status, reply) = put_route(&weir, "v3", Some(&before));
    let took = start.elapsed();
    assert_eq!(status, 412, "{reply}");
    // Well under the 5 s a wait for nothing takes; generous for a loaded machine.
    assert!(took < Duration::from_secs(4), "answered after {took:?}");
    wait_body(&weir, "v2");
}

/// `weir ctl cluster push` of more objects than one etcd transaction takes (etcd's
/// `--max-txn-ops`): the instance running applies the push whole, never a part of it.
#[test]
fn a_push_of_several_transactions_is_applied_whole() {
    let Some(bin) = etcd_bin() else { return };
    let etcd = Etcd::start(bin, 1);
    let dir = TempDir::new("fleet-push");
    let file = local(&dir, "a", &etcd.endpoints(&etcd.all()), "/t/push", "");
    push(&dir, &file, SHARED);
    let weir = Weir::start_file(&file);
    wait_body(&weir, "v1");

    // The changed route and 250 new ones: three transactions, the changed route in the first.
    let shared = with_routes(&SHARED.replace("v1", "v2"), 250, |i| format!("r{i}"));
    push(&dir, &file, &shared);
    let last = || get(weir.addr, "/r249/").map(|(_, b)| b == b"r249".as_slice());
    assert!(weir_testkit::wait_until(WAIT, || last().unwrap_or(false)));
    assert_eq!(body(weir.addr), "v2");
    let (_, history) = call(weir.admin_addr(), "GET", "/api/v1/history", &[], "").unwrap();
    let history: serde_json::Value = serde_json::from_str(&history).unwrap();
    let versions = history["data"].as_array().cloned().unwrap_or_default();
    let changes: Vec<usize> = versions
        .iter()
        .map(|v| v["changes"].as_array().map_or(0, Vec::len))
        .filter(|n| *n > 0)
        .collect();
    // The push in one version (250 routes added, 1 changed), not one per transaction.
    assert_eq!(changes, [251], "changes per version");
}

/// 100 routes of 16 KiB each (1.6 MB: one request by count, over etcd's request limit)
/// are pushed in several transactions and applied; one object over the limit is refused by
/// name before anything is written, and written once `max_txn_bytes` is raised.
#[test]
fn a_push_over_etcd_request_limit_is_split_and_an_oversized_object_refused() {
    let Some(bin) = etcd_bin() else { return };
    let etcd = Etcd::start(bin, 1);
    let dir = TempDir::new("fleet-bytes");
    let file = local(&dir, "a", &etcd.endpoints(&etcd.all()), "/t/bytes", "");
    let body_of = |i: usize| format!("{i:03}").repeat(16 * 1024 / 3);
    let shared = with_routes(SHARED, 100, body_of);
    push(&dir, &file, &shared);
    let weir = Weir::start_file(&file);
    let (_, last) = get(weir.addr, "/r99/").expect("GET");
    assert_eq!(String::from_utf8_lossy(&last), body_of(99));

    let before = ctl(&file, &["pull"]);
    let huge = "x".repeat(1024 * 1024 + 1);
    let refused = shared.replacen("body = \"v1\"", &format!("body = \"{huge}\""), 1);
    let path = dir.write("huge.toml", &refused);
    let out = Command::new(WEIR)
        .args(["ctl", "-c"])
        .arg(&file)
        .args(["cluster", "push", "-f"])
        .arg(&path)
        .output()
        .expect("run weir ctl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("/t/bytes/config/routes/web/all: 1048") && stderr.contains("fix:"),
        "{stderr}"
    );
    assert_eq!(ctl(&file, &["pull"]), before, "nothing written");

    // With max_txn_bytes raised (still under etcd's request limit), the object is written.
    let etcd_keys = format!(
        "endpoints = {}, max_txn_bytes = \"1400KiB\"",
        etcd.endpoints(&etcd.all())
    );
    let raised = local_with(&dir, "b", &etcd_keys, "/t/bytes", "");
    ctl(&raised, &["push", "-f", path.to_str().expect("utf-8 path")]);
    let served = weir_testkit::wait_until(WAIT, || body(weir.addr) == huge);
    assert!(served, "{}", weir.log.text());
}

/// An instance started on an empty prefix serves nothing and says why (`/ready` 503); a
/// `push --dry-run` shows the changes and writes nothing; the push itself brings the
/// listener up.
#[test]
fn an_empty_prefix_is_not_ready_and_a_dry_run_writes_nothing() {
    let Some(bin) = etcd_bin() else { return };
    let etcd = Etcd::start(bin, 1);
    let dir = TempDir::new("fleet-empty");
    let file = local(&dir, "a", &etcd.endpoints(&etcd.all()), "/t/empty", "");
    let mut cmd = Command::new(WEIR);
    cmd.arg("run").arg("-c").arg(&file);
    let weir = Weir::spawn_no_wait(cmd);
    let (status, text) = ready(&weir);
    assert_eq!(status, 503, "{text}");
    assert!(
        text.contains("no listeners under /t/empty/config/ yet"),
        "{text}"
    );

    let shared = dir.write("shared.toml", SHARED);
    let path = shared.to_str().expect("utf-8 path");
    let shown = ctl(&file, &["push", "-f", path, "--dry-run"]);
    assert!(shown.contains("added listener web"), "{shown}");
    let pulled = ctl(&file, &["pull"]);
    assert!(
        !pulled.contains("[[listeners]]"),
        "nothing written:\n{pulled}"
    );
    let (status, text) = ready(&weir);
    assert!(
        status == 503 && text.contains("no listeners under"),
        "{text}"
    );

    ctl(&file, &["push", "-f", path]);
    let addr = weir.log.listening("web", "listening", WAIT);
    let addr = addr.unwrap_or_else(|| panic!("web never listened:\n{}", weir.log.text()));
    assert_eq!(body(addr), "v1");
    let up = weir_testkit::wait_until(WAIT, || ready(&weir).0 == 200);
    assert!(up, "{:?}", ready(&weir));
}

/// A SIGHUP's apply (3,000 routes make it take a while), and meanwhile a change this
/// instance rejects arrives by the watch: the snapshot keeps the objects applied, not the
/// view as the watch left it, so a restart without etcd serves them. (A race: should the
/// change arrive before the SIGHUP's apply starts, that apply is rejected and the snapshot
/// stays as it was, so the test passes either way; saving the live view, it failed 4 runs
/// of 4.)
#[test]
fn the_snapshot_keeps_what_was_applied_not_a_change_rejected_meanwhile() {
    let Some(bin) = etcd_bin() else { return };
    let etcd = Etcd::start(bin, 1);
    let gate = Gate::to(&etcd, 0);
    let dir = TempDir::new("fleet-snapshot");
    let prefix = "/t/snap";
    let file = local(&dir, "a", &gate.endpoints(), prefix, "");
    let shared = with_routes(SHARED, 3000, |i| format!("r{i}"));
    push(&dir, &file, &shared);
    let weir = Weir::start_file(&file);
    let route = format!("{prefix}/config/routes/web/all");
    etcd.put(0, &route, "respond = { status = 200, body = \"v2\" }\n");
    wait_body(&weir, "v2");

    weir.signal(libc::SIGHUP);
    let bad = format!("{prefix}/config/routes/web/bad");
    etcd.put(0, &bad, "path_prefix = \"/bad\"\nupstream = \"nope\"\n");
    let rejected = weir_testkit::wait_until(WAIT, || ready(&weir).1.contains("rejected here"));
    assert!(rejected, "{:?}", ready(&weir));
    let snapshot = std::fs::read_to_string(dir.path().join("a.snapshot.json")).expect("snapshot");
    assert!(
        !snapshot.contains("routes/web/bad"),
        "the rejected change was saved"
    );

    gate.close();
    drop(weir);
    let weir = Weir::start_file(&file);
    assert_eq!(body(weir.addr), "v2", "{}", weir.log.text());
}

/// While `.pending` is there (a write of several transactions under way), a running
/// instance applies nothing, one starting does not start from etcd's half, no other write
/// starts (409), and a SIGHUP's local file waits; once it goes, both apply the write (and
/// the first its new local file).
#[test]
fn nothing_is_applied_or_written_while_the_pending_marker_exists() {
    let Some(bin) = etcd_bin() else { return };
    let etcd = Etcd::start(bin, 1);
    let dir = TempDir::new("fleet-pending");
    let (endpoints, prefix) = (etcd.endpoints(&etcd.all()), "/t/pending");
    let a_file = local(&dir, "a", &endpoints, prefix, "");
    push(&dir, &a_file, SHARED);
    let a = Weir::start_file(&a_file);
    wait_body(&a, "v1");

    let marker = format!("{prefix}/config/.pending");
    etcd.put(0, &marker, "");
    let route = format!("{prefix}/config/routes/web/all");
    let revision = etcd.put(0, &route, "respond = { status = 200, body = \"v2\" }\n");
    let waits = format!("under way in etcd: applied once whole revision={revision}");
    assert!(a.log.wait_for(&waits, WAIT), "{}", a.log.text());
    assert_eq!(
        body(a.addr),
        "v1",
        "nothing applied while the marker is there"
    );

    // An instance starting now does not serve the half write (it has no snapshot).
    let b_file = local(&dir, "b", &endpoints, prefix, "");
    let mut run_b = Command::new(WEIR);
    run_b.arg("run").arg("-c").arg(&b_file);
    let b = Weir::spawn_no_wait(run_b);
    assert!(
        b.log.wait_for("shared config loaded", WAIT),
        "{}",
        b.log.text()
    );
    assert!(
        b.log.contains("source=\"nothing\"") || b.log.contains("source=nothing"),
        "{}",
        b.log.text()
    );

    // No other write starts meanwhile: not through the admin API, not by a push.
    let (status, reply) = put_route(&a, "v3", None);
    assert_eq!(status, 409, "{reply}");
    assert!(reply.contains("under way"), "{reply}");
    let other = dir.write("other.toml", &SHARED.replace("v1", "v4"));
    let pushed = Command::new(WEIR)
        .args(["ctl", "-c"])
        .arg(&a_file)
        .args(["cluster", "push", "-f"])
        .arg(&other)
        .output()
        .expect("run weir ctl");
    let said = String::from_utf8_lossy(&pushed.stderr);
    assert!(
        !pushed.status.success() && said.contains("another push is under way"),
        "{said}"
    );

    // A SIGHUP meanwhile (the listener moved to another address) waits for the write,
    // then applies with it.
    let moved = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let binds = format!("binds = {{ web = \"{moved}\" }}\n");
    local(&dir, "a", &endpoints, prefix, &binds);
    a.signal(libc::SIGHUP);
    let held = "the local file is applied with it once it is whole";
    assert!(a.log.wait_for(held, WAIT), "{}", a.log.text());

    etcd.delete(0, &marker);
    let served = weir_testkit::wait_until(WAIT, || body(moved) == "v2");
    assert!(served, "the held SIGHUP's address; log:\n{}", a.log.text());
    let b_addr = b
        .log
        .listening("web", "listening", WAIT)
        .expect("b listens");
    assert_eq!(body(b_addr), "v2");
}

/// A SIGHUP whose local file cannot be applied (its `binds` address is taken) leaves the
/// running local file as it was: the config the admin API shows is not the rejected one.
#[test]
fn a_rejected_sighup_leaves_the_running_local_file() {
    let Some(bin) = etcd_bin() else { return };
    let etcd = Etcd::start(bin, 1);
    let dir = TempDir::new("fleet-hup");
    let endpoints = etcd.endpoints(&etcd.all());
    let file = local(&dir, "a", &endpoints, "/t/hup", "");
    push(&dir, &file, SHARED);
    let weir = Weir::start_file(&file);
    wait_body(&weir, "v1");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let binds = format!("binds = {{ web = \"{}\" }}\n", taken.local_addr().unwrap());
    local(&dir, "a", &endpoints, "/t/hup", &binds);
    weir.signal(libc::SIGHUP);
    assert!(
        weir.log.wait_for("SIGHUP: config rejected", WAIT),
        "{}",
        weir.log.text()
    );
    let (_, text) = call(weir.admin_addr(), "GET", "/api/v1/config", &[], "").expect("GET");
    assert!(
        !text.contains("binds"),
        "the rejected local file shown: {text}"
    );
    assert_eq!(body(weir.addr), "v1");
    // The file is at fault, not the shared revision, which still runs: was reported
    // "rejected here".
    let (_, line) = ready(&weir);
    assert!(line.contains("in sync at revision"), "{line}");
    assert_eq!(metric(&weir, "weir_cluster_rejected"), 0.0);
}

/// `USER:bcrypt(PASSWORD)` lines for an htpasswd file (cost 4: the test's, not a server's).
fn htpasswd(users: &[(&str, &str)]) -> String {
    let line = |(user, password): &(&str, &str)| {
        let hash = bcrypt::hash_with_salt(password, 4, [7u8; 16]).expect("bcrypt");
        format!(
            "{user}:{}\n",
            hash.format_for_version(bcrypt::Version::TwoY)
        )
    };
    users.iter().map(line).collect()
}

/// The status of `GET /` on `weir` as `credentials` (base64 of `user:password`).
fn status_as(weir: &Weir, credentials: &str) -> u16 {
    let auth = format!("Basic {credentials}");
    let (head, _) = call(weir.addr, "GET", "/", &[("Authorization", &auth)], "").expect("GET");
    head.status
}

/// A route validated before is taken as it was on the next change, but not one whose
/// checks read a file: a user removed from the users file is refused after a SIGHUP.
#[test]
fn a_sighup_rereads_the_users_file_of_a_shared_route() {
    let Some(bin) = etcd_bin() else { return };
    let etcd = Etcd::start(bin, 1);
    let dir = TempDir::new("fleet-auth");
    let users = dir.write(
        "htpasswd",
        &htpasswd(&[("alice", "secret"), ("bob", "hunter2")]),
    );
    let file = local(&dir, "a", &etcd.endpoints(&etcd.all()), "/t/auth", "");
    let shared = SHARED.replace(
        "respond =",
        &format!(
            "basic_auth = {{ users_file = \"{}\" }}\nrespond =",
            users.display()
        ),
    );
    push(&dir, &file, &shared);
    let weir = Weir::start_file(&file);
    const ALICE: &str = "YWxpY2U6c2VjcmV0"; // alice:secret
    const BOB: &str = "Ym9iOmh1bnRlcjI="; // bob:hunter2
    let admitted = weir_testkit::wait_until(WAIT, || status_as(&weir, BOB) == 200);
    assert!(admitted, "{}", weir.log.text());

    dir.write("htpasswd", &htpasswd(&[("alice", "secret")]));
    weir.signal(libc::SIGHUP);
    let refused = weir_testkit::wait_until(WAIT, || status_as(&weir, BOB) == 401);
    assert!(refused, "bob still admitted; log:\n{}", weir.log.text());
    assert_eq!(status_as(&weir, ALICE), 200);
}

#[test]
fn a_change_one_instance_cannot_apply_is_rejected_there_and_reported() {
    let Some(bin) = etcd_bin() else { return };
    let etcd = Etcd::start(bin, 3);
    let dir = TempDir::new("fleet-reject");
    let endpoints = etcd.endpoints(&etcd.all());
    let prefix = "/t/reject";
    // The address node b binds listener `extra` at is taken on its machine.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let binds = format!(
        "binds = {{ extra = \"{}\" }}\n",
        taken.local_addr().unwrap()
    );
    let a_file = local(&dir, "a", &endpoints, prefix, "");
    let b_file = local(&dir, "b", &endpoints, prefix, &binds);
    push(&dir, &a_file, SHARED);
    let (a, b) = (Weir::start_file(&a_file), Weir::start_file(&b_file));
    wait_body(&b, "v1");

    etcd.put(
        0,
        &format!("{prefix}/config/listeners/extra"),
        "bind = \"127.0.0.1:0\"\n",
    );
    assert!(
        a.log.wait_for("listening listener=extra", WAIT),
        "{}",
        a.log.text()
    );
    let rejected = weir_testkit::wait_until(WAIT, || ready(&b).1.contains("rejected here"));
    let (status, text) = ready(&b);
    assert!(rejected && status == 200, "{status} {text}");
    assert!(
        text.contains("b.toml:8:"),
        "the binds entry at fault is named: {text}"
    );
    assert!(text.contains("cluster.binds.extra"), "{text}");
    assert_eq!(metric(&b, "weir_cluster_rejected_total{} "), 1.0);
    assert_eq!(metric(&b, "weir_cluster_in_sync{} "), 0.0);
    assert_eq!(body(b.addr), "v1", "b keeps serving its last good config");

    // A value that is not valid for anyone: every instance names the key, line and column.
    let bad = format!("{prefix}/config/routes/web/bad");
    etcd.put(0, &bad, "path_prefix = \"/bad\"\nupstream = \"nope\"\n");
    let named = format!("{bad}:2:1: upstream: ");
    let ok = weir_testkit::wait_until(WAIT, || ready(&a).1.contains(&named));
    assert!(ok, "{}", ready(&a).1);
    assert_eq!(body(a.addr), "v1");

    // Both undone: every instance applies again.
    etcd.delete(0, &bad);
    etcd.delete(0, &format!("{prefix}/config/listeners/extra"));
    for w in [&a, &b] {
        let ok = weir_testkit::wait_until(WAIT, || ready(w).1.contains("in sync"));
        assert!(ok, "{}", ready(w).1);
    }
    assert_eq!(metric(&b, "weir_cluster_in_sync{} "), 1.0);
}

/// A revision rejected here is not built and rejected again when a re-list (after a
/// compaction) finds the same objects: one rejection counted, not one per listing.
#[test]
fn a_rejected_revision_is_not_tried_again_by_a_relist() {
    let Some(bin) = etcd_bin() else { return };
    let etcd = Etcd::start(bin, 1);
    let gate = Gate::to(&etcd, 0);
    let dir = TempDir::new("fleet-retry");
    let prefix = "/t/retry";
    let file = local(&dir, "gated", &gate.endpoints(), prefix, "");
    push(&dir, &file, SHARED);
    let weir = Weir::start_file(&file);
    wait_body(&weir, "v1");
    let bad = format!("{prefix}/config/routes/web/bad");
    etcd.put(0, &bad, "path_prefix = \"/bad\"\nupstream = \"nope\"\n");
    let ok = weir_testkit::wait_until(WAIT, || ready(&weir).1.contains("rejected here"));
    assert!(ok, "{}", ready(&weir).1);
    let relists = metric(&weir, "weir_cluster_relists_total{} ");

    gate.close();
    // Two revisions past the rejected one, compacted: the watch resumes just after the
    // rejected revision, below the compaction whatever else was written. With one put,
    // the compaction was at the watch's own start when this instance had not yet written
    // its registration (a revision outside the watched keys) after the rejection: the
    // watch found its start still there and never re-listed (a rare CI failure).
    etcd.put(0, &format!("{prefix}/elsewhere"), "x");
    let revision = etcd.put(0, &format!("{prefix}/elsewhere"), "y");
    etcd.compact(0, revision);
    gate.open();
    let relisted = weir_testkit::wait_until(WAIT, || {
        metric(&weir, "weir_cluster_relists_total{} ") > relists
    });
    assert!(relisted, "{}", weir.log.text());
    // Applies come in order: once the fix is applied, the re-list's turn has passed.
    etcd.delete(0, &bad);
    let ok = weir_testkit::wait_until(WAIT, || ready(&weir).1.contains("in sync"));
    assert!(ok, "{}", ready(&weir).1);
    assert_eq!(metric(&weir, "weir_cluster_rejected_total{} "), 1.0);
    assert_eq!(
        weir.log
            .text()
            .matches("shared config change rejected")
            .count(),
        1
    );
}

/// One member lost (the instance watching it moves on; one cut off from etcd while its
/// history is compacted lists again), then all of etcd lost: serving goes on without a
/// failed request, and a restart comes up from the snapshot; etcd back: in sync again.
#[test]
fn losing_etcd_members_then_all_of_etcd_costs_no_request() {
    let Some(bin) = etcd_bin() else { return };
    let mut etcd = Etcd::start(bin, 3);
    let gate = Gate::to(&etcd, 1);
    let dir = TempDir::new("fleet-down");
    let prefix = "/t/down";
    let all = local(&dir, "all", &etcd.endpoints(&etcd.all()), prefix, "");
    let gated = local(&dir, "gated", &gate.endpoints(), prefix, "");
    push(&dir, &all, SHARED);
    let mut i1 = Weir::start_file(&all);
    let i2 = Weir::start_file(&gated);
    wait_body(&i2, "v1");
    let route = format!("{prefix}/config/routes/web/all");

    // i2 is cut off while the route changes and etcd compacts its history: back, it finds
    // its revision compacted, lists again and applies the change.
    gate.close();
    etcd.put(1, &route, "respond = { status = 200, body = \"v2\" }\n");
    // Compacted past the change, so i2's next revision is gone.
    let revision = etcd.put(1, &format!("{prefix}/elsewhere"), "x");
    etcd.compact(1, revision);
    wait_body(&i1, "v2");
    assert_eq!(body(i2.addr), "v1");
    gate.open();
    wait_body(&i2, "v2");
    assert!(
        metric(&i2, "weir_cluster_relists_total{} ") >= 2.0,
        "listed again after the compaction"
    );

    // The member i1 watches dies: it watches another and stays in sync.
    etcd.kill(0);
    etcd.put(1, &route, "respond = { status = 200, body = \"v3\" }\n");
    wait_body(&i1, "v3");
    wait_body(&i2, "v3");

    for m in etcd.all() {
        etcd.kill(m);
    }
    let mut failed = 0;
    for _ in 0..200 {
        if body(i1.addr) != "v3" {
            failed += 1;
        }
    }
    assert_eq!(failed, 0, "requests failed with etcd down");
    let stale = weir_testkit::wait_until(WAIT, || ready(&i1).1.contains("etcd unreachable"));
    let (status, text) = ready(&i1);
    assert!(stale && status == 200, "{status} {text}");

    // A restart while etcd is down comes up with the last applied objects.
    drop(i1);
    i1 = Weir::start_file(&all);
    assert_eq!(body(i1.addr), "v3");
    assert!(
        i1.log.contains("source=\"snapshot\"") || i1.log.contains("source=snapshot"),
        "{}",
        i1.log.text()
    );

    for m in etcd.all() {
        etcd.restart(m);
    }
    etcd.wait_healthy(0);
    etcd.put(0, &route, "respond = { status = 200, body = \"v4\" }\n");
    wait_body(&i1, "v4");
    wait_body(&i2, "v4");
}

/// Two routes; one deleted straight in etcd while an instance is cut off, and the history
/// compacted past the deletion: back, the instance lists again and drops the route, though
/// the highest revision of the keys left is the one it ran already; and a write with the
/// If-Match of before the deletion gets 412, not the route back.
#[test]
fn a_deletion_missed_while_cut_off_is_applied_and_a_stale_if_match_cannot_undo_it() {
    let Some(bin) = etcd_bin() else { return };
    let etcd = Etcd::start(bin, 1);
    let gate = Gate::to(&etcd, 0);
    let dir = TempDir::new("fleet-missed-delete");
    let prefix = "/t/missed";
    let file = local(&dir, "gated", &gate.endpoints(), prefix, "");
    let two_routes = r#"
[[listeners]]
name = "web"
bind = "127.0.0.1:0"

[[listeners.routes]]
name = "a"
path_prefix = "/a"
respond = { status = 200, body = "a" }

[[listeners.routes]]
name = "b"
path_prefix = "/b"
respond = { status = 200, body = "b" }
"#;
    push(&dir, &file, two_routes);
    let weir = Weir::start_file(&file);
    let status = |path: &str| get(weir.addr, path).map_or(0, |(head, _)| head.status);
    assert_eq!((status("/a"), status("/b")), (200, 200));
    let before = etag(&weir);

    gate.close();
    etcd.delete(0, &format!("{prefix}/config/routes/web/b"));
    let revision = etcd.put(0, &format!("{prefix}/elsewhere"), "x");
    etcd.compact(0, revision);
    gate.open();
    let gone = weir_testkit::wait_until(WAIT, || status("/b") == 404);
    assert!(gone, "route b still served:\n{}", weir.log.text());
    assert_eq!(status("/a"), 200);
    assert!(metric(&weir, "weir_cluster_relists_total{} ") >= 2.0);
    let (code, text) = ready(&weir);
    assert!(code == 200 && text.contains("in sync"), "{code} {text}");

    // The config is not the one of before: a write with the old If-Match cannot put the
    // deleted route back; one made on the config as it is now can.
    let now = etag(&weir);
    assert_ne!(now, before);
    let put_b = |if_match: &str| {
        let headers = [("Content-Type", "application/json"), ("If-Match", if_match)];
        let json = r#"{"path_prefix": "/b", "respond": {"status": 200, "body": "b2"}}"#;
        let path = "/api/v1/listeners/web/routes/b";
        let (head, reply) = call(weir.admin_addr(), "PUT", path, &headers, json).expect("PUT");
        (head.status, reply)
    };
    let (code, reply) = put_b(&before);
    assert_eq!(code, 412, "{reply}");
    assert_eq!(status("/b"), 404);
    let (code, reply) = put_b(&now);
    assert_eq!(code, 200, "{reply}");
    assert_eq!(status("/b"), 200);
}

/// etcd over TLS requiring a client certificate, with authentication on: an instance with
/// `ca`, `client_cert`, `user` and `password_file` follows the shared objects, writes
/// through etcd and registers (a lease); a wrong password is refused, and said so.
#[test]
fn a_member_reaches_etcd_over_tls_with_a_client_certificate_and_a_password() {
    let Some(bin) = etcd_and_etcdctl() else {
        return;
    };
    let ca = TestCa::new("etcd test CA");
    let server = ca.leaf(&["127.0.0.1"]);
    // Without a token etcd takes a client certificate's common name as the user: this one
    // names no user, so only the password lets a request in.
    let client = ca.client("no-such-user");
    let tls = ClientTls {
        cert: server.cert_path.clone(),
        key: server.key_path.clone(),
        ca: ca.cert_path.clone(),
        client: (client.cert_path.clone(), client.key_path.clone()),
    };
    let etcd = Etcd::start_tls(bin, tls);
    let setup: [&[&str]; 3] = [
        &["user", "add", "root:s3cret"],
        &["user", "grant-role", "root", "root"],
        &["auth", "enable"],
    ];
    for args in setup {
        etcd.etcdctl(0, args).expect("set up etcd authentication");
    }
    let dir = TempDir::new("fleet-tls");
    let etcd_keys = |password: &str| {
        let file = dir.write(&format!("{password}.password"), &format!("{password}\n"));
        format!(
            "endpoints = {}, ca = \"{}\", client_cert = {{ cert = \"{}\", key = \"{}\" }}, user = \"root\", password_file = \"{}\"",
            etcd.endpoints(&[0]),
            ca.cert_path.display(),
            client.cert_path.display(),
            client.key_path.display(),
            file.display()
        )
    };
    // A TLS handshake and etcd's password check (bcrypt) can take over the 1 s the other
    // tests allow on a loaded machine: give these members 10 s (a wrong password is
    // refused at once all the same).
    let relaxed = |file| with_etcd_timeout(file, "10s");
    let file = relaxed(local_with(&dir, "a", &etcd_keys("s3cret"), "/t/tls", ""));
    push(&dir, &file, SHARED);
    let weir = Weir::start_file(&file);
    wait_body(&weir, "v1");
    let (status, reply) = put_route(&weir, "v2", None);
    assert_eq!(status, 200, "{reply}");
    wait_body(&weir, "v2");
    let registered = weir_testkit::wait_until(WAIT, || {
        let status = ctl(&file, &["status", "-o", "json"]);
        let v: serde_json::Value = serde_json::from_str(&status).unwrap_or_default();
        v["instances"][0]["node"] == "a"
    });
    assert!(registered, "{}", ctl(&file, &["status"]));

    let wrong = relaxed(local_with(&dir, "b", &etcd_keys("wrong"), "/t/tls", ""));
    let out = Command::new(WEIR)
        .arg("ctl")
        .arg("-c")
        .arg(&wrong)
        .args(["cluster", "pull"])
        .output()
        .expect("run weir ctl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("authentication failed"), "{stderr}");
}

/// A listing bigger than gRPC's default message limit (4 MiB) is read whole: a fleet of
/// many routes starts. The bulk here is keys under `config/` that are no object (ignored,
/// as a newer instance's kinds would be), which the listing carries all the same.
#[test]
fn a_listing_over_four_mebibytes_is_read() {
    let Some(bin) = etcd_bin() else { return };
    let etcd = Etcd::start(bin, 1);
    let dir = TempDir::new("fleet-big");
    let prefix = "/t/big";
    let file = local(&dir, "a", &etcd.endpoints(&[0]), prefix, "");
    push(&dir, &file, SHARED);
    let filler = "x".repeat(1 << 20);
    for i in 0..5 {
        etcd.put(0, &format!("{prefix}/config/filler/{i}"), &filler);
    }
    let weir = Weir::start_file(&file);
    wait_body(&weir, "v1");
    assert!(ctl(&file, &["pull"]).contains("name = \"all\""));
}
