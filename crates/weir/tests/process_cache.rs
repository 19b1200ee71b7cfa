//! The HTTP cache through a running `weir`: `weir ctl cache stats` and `weir ctl cache
//! purge` (by URL, by prefix) over the admin API, and the access log's cache field.

mod support_process;

use std::process::{Command, Output};

use support_process::{Weir, WEIR};
use weir_testkit::{Backend, BlockingClient};

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
