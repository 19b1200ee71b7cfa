//! The HTTP cache through a running `weir`: `weir ctl cache stats` and `weir ctl cache
//! purge` (by URL, by prefix) over the admin API; a disk store (`kind = "disk"`) across
//! restarts and `kill -9`, with torn, truncated and corrupted files, eviction by size and
//! purge on its files.

mod support_process;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use support_process::{TempDir, Weir, WEIR};
use weir_testkit::{pattern_vec, wait_until, Backend, BlockingClient, Response};

fn file(backend: &Backend) -> String {
    format!(
        "[server]\nworkers = 1\ndrain_timeout = \"1s\"\n\n[admin]\nbind = \"127.0.0.1:0\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n\
         [[listeners.routes]]\nname = \"all\"\nupstream = \"app\"\ncache = {{ store = \"main\" }}\n\n\
         [upstreams.app]\nservers = [{{ addr = \"{}\" }}]\n\n\
         [caches.main]\nkind = \"memory\"\nmax_size = \"16MiB\"\n",
        backend.addr()
    )
}

fn ctl(weir: &Weir, args: &[&str]) -> String {
    let out: Output = Command::new(WEIR)
        .arg("ctl")
        .arg("--admin")
        .arg(format!("http://{}", weir.admin_addr()))
        .args(args)
        .output()
        .expect("weir ctl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "weir ctl {args:?} failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// GETs `path` on host `h`; returns its `Cache-Status`.
fn fetch(weir: &Weir, path: &str) -> String {
    let mut c = BlockingClient::connect(weir.addr).expect("connect");
    let r = c.get(path, "h").expect("response");
    assert_eq!(r.status, 200);
    r.header("Cache-Status").unwrap_or("").to_string()
}

#[test]
fn ctl_purges_by_url_and_by_prefix_and_shows_stats() {
    let b = Backend::fixed(200, &[("Cache-Control", "max-age=600")], "cached");
    let weir = Weir::start(&file(&b));
    for path in ["/img/a", "/img/b", "/page"] {
        assert_eq!(fetch(&weir, path), "weir; fwd=uri-miss");
        assert_eq!(fetch(&weir, path), "weir; hit");
    }
    let stats = ctl(&weir, &["-o", "json", "cache", "stats"]);
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("json");
    assert_eq!(stats[0]["name"], "main");
    assert_eq!(stats[0]["entries"], 3);
    assert_eq!(stats[0]["hits"], 3);
    assert_eq!(stats[0]["misses"], 3);
    let table = ctl(&weir, &["cache", "stats"]);
    assert!(
        table.starts_with("STORE") && table.contains("main"),
        "{table}"
    );

    let out = ctl(&weir, &["cache", "purge", "http://h/page"]);
    assert!(out.contains("purged 1 entries"), "{out}");
    assert_eq!(fetch(&weir, "/page"), "weir; fwd=uri-miss");
    assert_eq!(fetch(&weir, "/img/a"), "weir; hit");
    let out = ctl(&weir, &["cache", "purge", "http://h/img/*"]);
    assert!(out.contains("purged 2 entries"), "{out}");
    assert_eq!(fetch(&weir, "/img/a"), "weir; fwd=uri-miss");
    assert_eq!(fetch(&weir, "/img/b"), "weir; fwd=uri-miss");
    assert_eq!(fetch(&weir, "/page"), "weir; hit");
    assert_eq!(b.requests_served(), 6);
}

#[test]
fn a_purge_naming_an_unknown_store_is_refused_with_the_known_ones() {
    let b = Backend::fixed(200, &[], "x");
    let weir = Weir::start(&file(&b));
    let out = Command::new(WEIR)
        .arg("ctl")
        .arg("--admin")
        .arg(format!("http://{}", weir.admin_addr()))
        .args(["cache", "purge", "http://h/", "--store", "nope"])
        .output()
        .expect("weir ctl");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no cache store") && stderr.contains("main"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------------------
// Disk stores
// ---------------------------------------------------------------------------------------

/// How long a condition a test polls for may take (a bound against a hang only: the
/// machine running the tests may be loaded).
const WAIT: Duration = Duration::from_secs(30);

/// A config with a disk store `disk` at `dir` (`store_keys`: more of its keys) and one
/// caching route per `(prefix, backend)`, named after its prefix.
fn disk_config(dir: &Path, routes: &[(&str, SocketAddr)], store_keys: &str) -> String {
    let mut text = String::from(
        "[server]\nworkers = 2\ndrain_timeout = \"1s\"\n\n[admin]\nbind = \"127.0.0.1:0\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n",
    );
    for (prefix, addr) in routes {
        let name = prefix.trim_matches('/');
        text += &format!(
            "[[listeners.routes]]\nname = \"{name}\"\npath_prefix = \"{prefix}\"\n\
             upstream = \"{name}\"\ncache = {{ store = \"disk\" }}\n\n\
             [upstreams.{name}]\nservers = [{{ addr = \"{addr}\" }}]\n\n"
        );
    }
    text + &format!(
        "[caches.disk]\nkind = \"disk\"\npath = \"{}\"\n{store_keys}\n",
        dir.display()
    )
}

/// The first store's stats (`weir ctl cache stats`).
fn stats(weir: &Weir) -> Value {
    let text = ctl(weir, &["-o", "json", "cache", "stats"]);
    let all: Value = serde_json::from_str(&text).expect("json");
    all[0].clone()
}

/// Polls the stats until `ok` holds of them; returns them.
fn stats_until(weir: &Weir, ok: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    let held = wait_until(WAIT, || {
        last = stats(weir);
        ok(&last)
    });
    assert!(held, "the stats never got there: {last}");
    last
}

/// The store's entry files (not temporary ones) under `dir`, with their lengths.
fn entry_files(dir: &Path) -> Vec<(PathBuf, u64)> {
    let Ok(subdirs) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let files = subdirs
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten());
    files
        .flatten()
        .filter(|f| !f.file_name().to_string_lossy().ends_with(".tmp"))
        .map(|f| (f.path(), f.metadata().map_or(0, |m| m.len())))
        .collect()
}

/// The entry file holding `key`.
fn file_of(dir: &Path, key: &str) -> PathBuf {
    let holds = |p: &Path| {
        let bytes = std::fs::read(p).unwrap_or_default();
        bytes.windows(key.len()).any(|w| w == key.as_bytes())
    };
    let found = entry_files(dir).into_iter().find(|(p, _)| holds(p));
    found.unwrap_or_else(|| panic!("no file holds {key}")).0
}

fn get(weir: &Weir, path: &str) -> Response {
    let mut c = BlockingClient::connect(weir.addr).expect("connect");
    c.get(path, "h").expect("response")
}

/// Kills Weir as a crash would (`kill -9`) and waits for it to be gone.
fn crash(mut weir: Weir) {
    weir.signal(libc::SIGKILL);
    assert!(weir.wait_exit(WAIT).is_some(), "weir survived SIGKILL");
}

/// Starts Weir again on the same config and waits for its store's scan to finish.
fn restart(config: &Path) -> Weir {
    let weir = Weir::start_file(config);
    stats_until(&weir, |s| s["loading"] == false);
    weir
}

/// A disk store with two caching routes: `/s` to an upstream with a small body, `/l` to
/// one with a body of `large_len` bytes (both fresh for ten minutes).
struct TwoSizes {
    small: Backend,
    large: Backend,
    large_body: String,
    store: PathBuf,
    config: PathBuf,
    _dir: TempDir,
}

impl TwoSizes {
    fn new(tag: &str, large_len: usize) -> TwoSizes {
        let fresh = [("Cache-Control", "max-age=600")];
        let small = Backend::fixed(200, &fresh, "small body");
        let large_body = String::from_utf8(vec![b'L'; large_len]).expect("ascii");
        let large = Backend::fixed(200, &fresh, &large_body);
        let dir = TempDir::new(tag);
        let store = dir.path().join("store");
        let routes = [("/s", small.addr()), ("/l", large.addr())];
        let text = disk_config(&store, &routes, "max_size = \"16MiB\"");
        TwoSizes {
            config: dir.write("weir.toml", &text),
            small,
            large,
            large_body,
            store,
            _dir: dir,
        }
    }
}

/// A directory holding more than the store's bounds now allow (smaller sizes, or a store
/// from before `index_size`) loses entries at load, and the log says so and what to raise.
#[test]
fn entries_dropped_at_load_are_logged_with_the_bound_to_raise() {
    let t = TwoSizes::new("disk-shrunk", 300 << 10);
    let weir = restart(&t.config);
    get(&weir, "/s/a");
    get(&weir, "/l/a");
    stats_until(&weir, |s| s["stored"] == 2);
    crash(weir);
    let text = std::fs::read_to_string(&t.config).expect("config");
    let smaller = "max_size = \"128KiB\"\nmax_object_size = \"64KiB\"";
    std::fs::write(&t.config, text.replace("max_size = \"16MiB\"", smaller)).expect("write");
    let weir = restart(&t.config);
    assert!(
        weir.log.wait_for("raise index_size", WAIT),
        "{}",
        weir.log.text()
    );
    assert_eq!(stats(&weir)["entries"].as_u64(), Some(1));
}

#[test]
fn a_disk_entry_is_served_after_a_restart_and_purge_removes_its_files() {
    let t = TwoSizes::new("disk-restart", 300 << 10);
    let weir = restart(&t.config);
    for path in ["/s/a", "/l/a"] {
        assert_eq!(
            get(&weir, path).header("Cache-Status"),
            Some("weir; fwd=uri-miss")
        );
    }
    // Stored once the files are written (after the responses went out).
    stats_until(&weir, |s| s["stored"] == 2);
    crash(weir);

    let weir = restart(&t.config);
    let s = stats(&weir);
    assert_eq!(
        (s["kind"].as_str(), s["entries"].as_u64()),
        (Some("disk"), Some(2)),
        "{s}"
    );
    let hit = get(&weir, "/s/a");
    assert_eq!(hit.header("Cache-Status"), Some("weir; hit"));
    assert_eq!(hit.body, b"small body");
    // A body past 64 KiB is read on the blocking pool, not where the hit is looked up.
    let hit = get(&weir, "/l/a");
    assert_eq!(hit.header("Cache-Status"), Some("weir; hit"));
    assert_eq!(hit.body.len(), t.large_body.len());
    assert!(
        hit.body == t.large_body.as_bytes(),
        "the large body is the stored one"
    );
    let mut c = BlockingClient::connect(weir.addr).expect("connect");
    let head = c
        .request("HEAD", "/l/a", &[("Host", "h")], b"")
        .expect("HEAD");
    assert_eq!(head.header("Cache-Status"), Some("weir; hit"));
    assert_eq!(head.header("Content-Length"), Some("307200"));
    assert_eq!(
        (t.small.requests_served(), t.large.requests_served()),
        (1, 1)
    );

    assert_eq!(entry_files(&t.store).len(), 2);
    let out = ctl(&weir, &["cache", "purge", "http://h/*"]);
    assert!(out.contains("purged 2 entries"), "{out}");
    assert!(entry_files(&t.store).is_empty(), "purge removes the files");
    assert_eq!(
        get(&weir, "/s/a").header("Cache-Status"),
        Some("weir; fwd=uri-miss")
    );
    assert_eq!(t.small.requests_served(), 2);
}

/// An upstream sending `body` with `max-age=600`; the first request gets half of it and
/// then nothing until `gate` is dropped (then the connection is dropped); later requests
/// get all of it. Counts requests.
struct Gated {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    /// Sends `()` once the first response's half is out.
    half_sent: mpsc::Receiver<()>,
    _gate: mpsc::Sender<()>,
}

impl Gated {
    fn start(body: Vec<u8>) -> Gated {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let requests = Arc::new(AtomicUsize::new(0));
        let (half_tx, half_sent) = mpsc::channel();
        let (gate, gate_rx) = mpsc::channel::<()>();
        let gate_rx = Arc::new(Mutex::new(gate_rx));
        let count = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (count, body, half_tx, gate_rx) = (
                    count.clone(),
                    body.clone(),
                    half_tx.clone(),
                    gate_rx.clone(),
                );
                std::thread::spawn(move || serve_gated(stream, &count, &body, &half_tx, &gate_rx));
            }
        });
        Gated {
            addr,
            requests,
            half_sent,
            _gate: gate,
        }
    }
}

fn serve_gated(
    stream: std::net::TcpStream,
    count: &AtomicUsize,
    body: &[u8],
    half_tx: &mpsc::Sender<()>,
    gate: &Mutex<mpsc::Receiver<()>>,
) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut out = stream;
    loop {
        let mut line = String::new();
        while line != "\r\n" {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
        }
        let n = count.fetch_add(1, Ordering::SeqCst);
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: max-age=600\r\n\r\n",
            body.len()
        );
        let _ = out.write_all(head.as_bytes());
        if n == 0 {
            let _ = out.write_all(&body[..body.len() / 2]);
            let _ = half_tx.send(());
            // Blocks until the test lets go of the gate.
            let _ = gate.lock().map(|rx| rx.recv());
            return;
        }
        if out.write_all(body).is_err() {
            return;
        }
    }
}

#[test]
fn kill_9_during_a_fill_never_leaves_a_torn_entry() {
    let body = pattern_vec(4 << 20);
    let up = Gated::start(body.clone());
    let dir = TempDir::new("disk-crash");
    let store = dir.path().join("store");
    let keys = "max_size = \"64MiB\"\nmax_object_size = \"8MiB\"";
    let config = dir.write(
        "weir.toml",
        &disk_config(&store, &[("/big", up.addr)], keys),
    );
    let weir = restart(&config);

    // Killed while the body is on its way: half of it relayed, the fill under way.
    let addr = weir.addr;
    let client = std::thread::spawn(move || {
        let mut c = BlockingClient::connect(addr).expect("connect");
        c.get("/big", "h")
    });
    up.half_sent
        .recv_timeout(WAIT)
        .expect("the first half went out");
    crash(weir);
    let cut = client.join().expect("client thread");
    assert!(cut.map_or(true, |r| r.body != body), "the response was cut");

    // (A fill writes nothing before its response is complete: nothing to check on disk.)
    let weir = restart(&config);
    let again = get(&weir, "/big");
    assert_eq!(again.header("Cache-Status"), Some("weir; fwd=uri-miss"));
    assert!(again.body == body, "the whole body, from the upstream");
    assert_eq!(up.requests.load(Ordering::SeqCst), 2);

    // Killed right after a complete response, while its file may be being written:
    // after the restart the entry is whole (a hit) or absent (a miss), never torn.
    stats_until(&weir, |s| s["stored"] == 1);
    assert_eq!(get(&weir, "/big").header("Cache-Status"), Some("weir; hit"));
    let purged = ctl(&weir, &["cache", "purge", "http://h/big"]);
    assert!(purged.contains("purged 1 entries"), "{purged}");
    let refill = get(&weir, "/big");
    assert!(refill.body == body);
    crash(weir);
    let weir = restart(&config);
    let before = up.requests.load(Ordering::SeqCst);
    let last = get(&weir, "/big");
    assert!(last.body == body, "a complete, correct body");
    let asked = up.requests.load(Ordering::SeqCst) - before;
    let expected = if asked == 0 {
        "weir; hit"
    } else {
        "weir; fwd=uri-miss"
    };
    assert_eq!(last.header("Cache-Status"), Some(expected));
    let temps = std::fs::read_dir(&store).into_iter().flatten().flatten();
    let temps = temps.flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten());
    let left: Vec<_> = temps
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(
        left.is_empty(),
        "abandoned writes are removed at start: {left:?}"
    );

    // A finished file whose head part is garbled while Weir is down: a miss after the
    // restart, the upstream asked again, never the garbled head served.
    let stored = if asked == 0 { 0 } else { 1 };
    stats_until(&weir, |s| s["stored"] == stored && s["entries"] == 1);
    crash(weir);
    let path = file_of(&store, "http://h/big");
    let mut bytes = std::fs::read(&path).expect("read");
    let key_at = bytes
        .windows(12)
        .position(|w| w == b"http://h/big")
        .expect("key");
    // The first byte after the key: the variant's or the policy's, in the head part.
    bytes[key_at + 12] ^= 0x01;
    std::fs::write(&path, &bytes).expect("write");
    let weir = restart(&config);
    let s = stats(&weir);
    assert_eq!(
        (s["entries"].as_u64(), s["errors"].as_u64()),
        (Some(0), Some(1)),
        "{s}"
    );
    let before = up.requests.load(Ordering::SeqCst);
    let garbled = get(&weir, "/big");
    assert_eq!(garbled.header("Cache-Status"), Some("weir; fwd=uri-miss"));
    assert!(garbled.body == body, "the whole body, from the upstream");
    assert_eq!(up.requests.load(Ordering::SeqCst), before + 1);
}

/// After a restart, concurrent first hits of a large entry (its body's sum not checked in
/// this process yet) are all hits, whole: one of them checks the file, the others wait
/// for that check and send the file too (they each read the whole body into memory).
#[test]
fn concurrent_first_hits_after_a_restart_are_all_whole_hits() {
    let t = TwoSizes::new("disk-at-once", 300 << 10);
    let weir = restart(&t.config);
    get(&weir, "/l/a");
    stats_until(&weir, |s| s["stored"] == 1);
    crash(weir);
    let weir = restart(&t.config);
    let addr = weir.addr;
    let hits: Vec<Response> = std::thread::scope(|s| {
        let each = (0..8).map(|_| {
            s.spawn(move || {
                let mut c = BlockingClient::connect(addr).expect("connect");
                c.get("/l/a", "h").expect("response")
            })
        });
        let each: Vec<_> = each.collect();
        each.into_iter()
            .map(|h| h.join().expect("client"))
            .collect()
    });
    for hit in hits {
        assert_eq!(hit.header("Cache-Status"), Some("weir; hit"));
        assert!(
            hit.body == t.large_body.as_bytes(),
            "the stored body, whole"
        );
    }
    assert_eq!(t.large.requests_served(), 1);
    assert_eq!(stats(&weir)["errors"].as_u64(), Some(0));
}

#[test]
fn truncated_and_corrupted_entry_files_are_discarded() {
    let t = TwoSizes::new("disk-corrupt", 100 << 10);
    let weir = restart(&t.config);
    for path in ["/s/a", "/s/b", "/l/a"] {
        get(&weir, path);
    }
    stats_until(&weir, |s| s["stored"] == 3);
    crash(weir);

    // Cut short while Weir is down: the scan at start drops it.
    let cut = file_of(&t.store, "http://h/s/a");
    let len = std::fs::metadata(&cut).expect("file").len();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&cut)
        .expect("open");
    file.set_len(len - 3).expect("truncate");
    let weir = restart(&t.config);
    let s = stats(&weir);
    assert_eq!(
        (s["entries"].as_u64(), s["errors"].as_u64()),
        (Some(2), Some(1)),
        "{s}"
    );
    assert!(!cut.exists(), "the truncated file is removed");

    // A body byte flipped under the running Weir: the read's sum refuses it, t.small or t.large.
    for key in ["http://h/s/b", "http://h/l/a"] {
        let path = file_of(&t.store, key);
        let mut bytes = std::fs::read(&path).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 0x20;
        std::fs::write(&path, &bytes).expect("write");
    }
    for (path, body) in [
        ("/s/a", "small body"),
        ("/s/b", "small body"),
        ("/l/a", &t.large_body),
    ] {
        let r = get(&weir, path);
        assert_eq!(
            r.header("Cache-Status"),
            Some("weir; fwd=uri-miss"),
            "{path}"
        );
        assert!(
            r.body == body.as_bytes(),
            "{path}: the upstream's body, whole"
        );
    }
    assert_eq!(
        (t.small.requests_served(), t.large.requests_served()),
        (4, 2)
    );
    stats_until(&weir, |s| s["errors"] == 3 && s["stored"] == 3);
}

#[test]
fn eviction_keeps_a_disk_store_under_max_size() {
    let body = String::from_utf8(vec![b'e'; 10 << 10]).expect("ascii");
    let b = Backend::fixed(200, &[("Cache-Control", "max-age=600")], &body);
    let dir = TempDir::new("disk-evict");
    let store = dir.path().join("store");
    let keys = "max_size = \"64KiB\"\nmax_object_size = \"16KiB\"";
    let config = dir.write("weir.toml", &disk_config(&store, &[("/e", b.addr())], keys));
    let weir = restart(&config);
    for i in 0..20 {
        get(&weir, &format!("/e/{i}"));
        // One at a time, so that the use order is the request order.
        stats_until(&weir, |s| s["stored"] == i + 1);
    }
    let s = stats(&weir);
    let files = entry_files(&store);
    let bytes: u64 = files.iter().map(|(_, len)| len).sum();
    assert!(bytes <= 64 << 10, "{bytes} bytes on disk");
    assert_eq!(
        files.len() as u64,
        s["entries"].as_u64().unwrap_or(0),
        "{s}"
    );
    assert!(s["evictions"].as_u64() >= Some(14), "{s}");
    assert_eq!(
        get(&weir, "/e/19").header("Cache-Status"),
        Some("weir; hit")
    );
    assert_eq!(
        get(&weir, "/e/0").header("Cache-Status"),
        Some("weir; fwd=uri-miss")
    );
}
