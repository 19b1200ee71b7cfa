//! The dashboard's data and page through the real binary, without a browser
//! (`dashboard_browser.rs` drives one): `GET /api/v1/stats` counts requests, 5xx answers
//! and latency per route and server, its series follow `?since=`; the page is served
//! without the token with its CSP while the data needs the token; `dashboard = false`
//! turns both off, and a reload turns them on again; off, the admin thread does not wake
//! up for it.

mod support_process;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use support_process::{call, get, TempDir, Weir};
use weir_testkit::{wait_until, Backend};

const WAIT: Duration = Duration::from_secs(20);

fn config(ok: &Backend, bad: &Backend, admin_extra: &str) -> String {
    format!(
        "[server]\nworkers = 2\n\n[admin]\nbind = \"127.0.0.1:0\"\ndashboard_interval = \"1s\"\n\
         {admin_extra}\n\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n\
         [[listeners.routes]]\nname = \"failing\"\npath_prefix = \"/bad/\"\nupstream = \"bad\"\n\n\
         [[listeners.routes]]\nname = \"fine\"\nupstream = \"ok\"\n\n\
         [upstreams.ok]\nservers = [{{ addr = \"{}\" }}]\n\n\
         [upstreams.bad]\nservers = [{{ addr = \"{}\" }}]\n\
         [upstreams.bad.passive]\nfail_timeout = \"10m\"\n\
         [upstreams.bad.retry]\non = [\"503\"]\n",
        ok.addr(),
        bad.addr()
    )
}

/// The backends of `config`: upstream `ok` answers 200, `bad` 503.
fn backends() -> (Backend, Backend) {
    (
        Backend::fixed(200, &[], "fine"),
        Backend::fixed(503, &[], "no"),
    )
}

/// `GET /api/v1/stats?since=N` with optional headers: status and JSON body.
fn stats(admin: SocketAddr, since: u64, headers: &[(&str, &str)]) -> (u16, Value) {
    let path = format!("/api/v1/stats?since={since}");
    let (head, text) = call(admin, "GET", &path, headers, "").expect("admin call");
    (
        head.status,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

fn route<'a>(data: &'a Value, name: &str) -> &'a Value {
    let routes = data["listeners"][0]["routes"].as_array().expect("routes");
    routes.iter().find(|r| r["name"] == name).expect("route")
}

#[test]
fn stats_count_requests_errors_and_latency_and_follow_since() {
    let (ok, bad) = backends();
    let weir = Weir::start(&config(&ok, &bad, ""));
    let admin = weir.admin_addr();
    // The first sample is the baseline rates start from: send after it.
    let first = wait_until(WAIT, || {
        stats(admin, 0, &[]).1["data"]["seq"].as_u64() >= Some(1)
    });
    assert!(first, "{}", stats(admin, 0, &[]).1);
    for _ in 0..20 {
        assert_eq!(get(weir.addr, "/").expect("response").0.status, 200);
    }
    for _ in 0..5 {
        assert_eq!(get(weir.addr, "/bad/x").expect("response").0.status, 503);
    }
    // Totals are as of the last sample: wait for the one that saw them all.
    let mut data = Value::Null;
    let counted = wait_until(WAIT, || {
        data = stats(admin, 0, &[]).1["data"].clone();
        route(&data, "fine")["requests"] == 20 && route(&data, "failing")["requests"] == 5
    });
    assert!(counted, "{data}");
    let (fine, failing) = (route(&data, "fine"), route(&data, "failing"));
    assert_eq!(
        (&fine["errors"], &failing["errors"]),
        (&0.into(), &5.into())
    );
    assert_eq!(failing["now"]["error_rate"], 1.0, "{failing}");
    assert_eq!(fine["now"]["error_rate"], 0.0, "{fine}");
    assert!(
        fine["now"]["rps"].as_f64().is_some_and(|r| r > 0.0),
        "{fine}"
    );
    assert!(
        fine["now"]["p50_ms"].as_f64().is_some_and(|p| p > 0.0),
        "{fine}"
    );
    assert_eq!(fine["target"], "ok");
    let routes = data["listeners"][0]["routes"].as_array().expect("routes");
    let unrouted = routes.iter().find(|r| r["name"].is_null());
    assert_eq!(unrouted.map(|r| &r["requests"]), Some(&0.into()), "{data}");
    let listener = &data["listeners"][0];
    assert_eq!(
        (&listener["name"], &listener["kind"]),
        (&"web".into(), &"http".into())
    );
    assert_eq!(listener["requests"], 25);
    assert_eq!(listener["addr"], weir.addr.to_string());
    assert_eq!(listener["http2"]["streams"], 0);
    let upstreams = data["upstreams"].as_array().expect("upstreams");
    let bad_upstream = upstreams.iter().find(|u| u["name"] == "bad").expect("bad");
    let bad_server = &bad_upstream["servers"][0];
    assert_eq!(bad_server["addr"], bad.addr().to_string());
    // 503s (retried, so failures): passive health took it out (for 10 minutes), as
    // /health says.
    let health = call(admin, "GET", "/api/v1/upstreams/bad/health", &[], "").expect("health");
    let health: Value = serde_json::from_str(&health.1).expect("json");
    assert_eq!(bad_server["state"], health["data"]["servers"][0]["state"]);
    assert_eq!(
        (&bad_server["state"], &bad_server["in_flight"]),
        (&"ejected".into(), &0.into())
    );
    assert_eq!(
        (&bad_server["requests"], &bad_server["errors"]),
        (&5.into(), &5.into())
    );
    // Every sample since start is in the series (the first one only set the baseline).
    let seq = data["seq"].as_u64().expect("seq");
    assert_eq!(data["from"], 1);
    let rps = listener["series"]["rps"].as_array().expect("series");
    assert_eq!(rps.len() as u64, seq, "{listener}");
    // ?since=SEQ: only the samples after it.
    let mut later = Value::Null;
    assert!(wait_until(WAIT, || {
        later = stats(admin, seq, &[]).1["data"].clone();
        later["seq"].as_u64() > Some(seq)
    }));
    let newer = later["seq"].as_u64().unwrap() - seq;
    assert_eq!(later["from"], seq + 1);
    let rps = later["listeners"][0]["series"]["rps"]
        .as_array()
        .expect("series");
    assert_eq!(rps.len() as u64, newer, "{later}");
    let (status, body) = stats(admin, 0, &[]);
    assert_eq!(status, 200);
    assert_eq!(body["version"], 1);
}

#[test]
fn the_page_needs_no_token_its_data_does_and_a_setting_turns_both_off() {
    let (ok, bad) = backends();
    let dir = TempDir::new("dash-token");
    let token = dir.write("token", "s3cret-t0ken\n");
    let token_line = format!("token_file = \"{}\"", token.display());
    let weir = Weir::start(&config(&ok, &bad, &token_line));
    let admin = weir.admin_addr();
    let (head, page) = call(admin, "GET", "/ui/", &[], "").expect("page");
    assert_eq!(head.status, 200, "{page}");
    let csp = head.header("content-security-policy").unwrap_or("");
    assert!(
        csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
        "{csp}"
    );
    assert!(page.contains("<script src=\"app.js\""), "{page}");
    assert!(!page.contains("s3cret"), "no secret in the page");
    let (head, _) = call(admin, "GET", "/ui/app.js", &[], "").expect("script");
    assert_eq!(
        head.header("content-type"),
        Some("text/javascript; charset=utf-8")
    );
    assert_eq!(stats(admin, 0, &[]).0, 401, "no data without the token");
    let bearer = [("Authorization", "Bearer s3cret-t0ken")];
    assert_eq!(stats(admin, 0, &bearer).0, 200);

    // Off through the API (a reload): the page and its data answer 404.
    let put = |extra: &str| {
        let text = config(&ok, &bad, &format!("{token_line}\n{extra}"));
        let headers = [bearer[0], ("Content-Type", "application/toml")];
        let (head, body) = call(admin, "PUT", "/api/v1/config", &headers, &text).expect("put");
        assert_eq!(head.status, 200, "{body}");
    };
    put("dashboard = false");
    let (head, body) = call(admin, "GET", "/ui/", &[], "").expect("page");
    assert_eq!(head.status, 404);
    assert!(body.contains("dashboard = true"), "{body}");
    let (status, body) = stats(admin, 0, &bearer);
    assert_eq!(status, 404);
    assert!(
        body["fix"]
            .as_str()
            .unwrap_or("")
            .contains("dashboard = true"),
        "{body}"
    );
    put("dashboard = true");
    assert_eq!(
        call(admin, "GET", "/ui/", &[], "").expect("page").0.status,
        200
    );
    // Sampling starts again: the first interval after the reload gives sample 1.
    let sampled = wait_until(WAIT, || stats(admin, 0, &bearer).1["data"]["seq"] == 1);
    assert!(sampled, "{}", stats(admin, 0, &bearer).1);
}

/// Voluntary context switches of the process's thread named `name` (its `comm`), from
/// /proc: how often it went to sleep, so how often it woke up.
fn wake_ups(pid: u32, name: &str) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("/proc task dir");
    let task = tasks
        .filter_map(Result::ok)
        .find(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .unwrap_or_else(|| panic!("no thread {name}"));
    let status = std::fs::read_to_string(task.path().join("status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("voluntary_ctxt_switches")
}

/// `dashboard = false` costs nothing: the admin thread does not wake up to sample (it used
/// to wake every second to check the setting, and hand each check to a blocking thread).
#[test]
fn an_idle_admin_listener_without_the_dashboard_sleeps() {
    let (ok, bad) = backends();
    let weir = Weir::start(&config(&ok, &bad, "dashboard = false"));
    let admin = weir.admin_addr();
    assert_eq!(get(admin, "/ready").expect("ready").0.status, 200);
    let before = wake_ups(weir.pid(), "weir-admin");
    // Absence of work can only be watched for a while: four times what the old loop took.
    std::thread::sleep(Duration::from_secs(4));
    let woke = wake_ups(weir.pid(), "weir-admin") - before;
    assert!(woke <= 1, "the admin thread woke {woke} times in 4 s");
}
