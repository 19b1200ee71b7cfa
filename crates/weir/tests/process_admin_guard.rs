//! The admin API against DNS rebinding and cross-site requests, through the real binary:
//! a `Host` that does not name the admin listener is refused (reads too, with a token
//! too) and changes nothing; the listener's own address, with or without the port, and
//! `[admin] allowed_hosts` names are served; a foreign `Origin` is refused; a write that
//! does not declare a JSON (or TOML) body, as a form or a `text/plain` POST, is a 415 and
//! purges nothing; `/live` and `/ready` stay open to any probe.

mod support_process;

use std::net::SocketAddr;

use serde_json::Value;
use support_process::{call, TempDir, Weir};
use weir_testkit::{Backend, BlockingClient};

/// A listener whose one route caches in a memory store; `admin_extra` goes in `[admin]`.
fn file(backend: &Backend, admin_extra: &str) -> String {
    format!(
        "[server]\nworkers = 1\ndrain_timeout = \"1s\"\n\n\
         [admin]\nbind = \"127.0.0.1:0\"\n{admin_extra}\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n\
         [[listeners.routes]]\nname = \"all\"\nupstream = \"app\"\ncache = {{ store = \"main\" }}\n\n\
         [upstreams.app]\nservers = [{{ addr = \"{}\" }}]\n\n\
         [caches.main]\nkind = \"memory\"\nmax_size = \"16MiB\"\n",
        backend.addr()
    )
}

/// The route the attacker review put in through a rebinding name: every file of the host.
const PWN_ROUTE: &str = r#"{"name": "pwn", "hosts": ["pwn.local"], "files": {"root": "/"}}"#;

/// One admin request with `headers` (a `Host` among them replaces the listener's address);
/// the status and the JSON body (a string when it is not JSON).
fn admin(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    let (head, text) = call(addr, method, path, headers, body).expect("admin call");
    let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (head.status, json)
}

/// The route names of listener `web` in the running config (asked with the right Host).
fn route_names(addr: SocketAddr, token: Option<&str>) -> Vec<String> {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    let (status, config) = admin(addr, "GET", "/api/v1/config", &headers, "");
    assert_eq!(status, 200, "{config}");
    let routes = config["data"]["listeners"][0]["routes"].as_array().cloned();
    let name = |r: &Value| r["name"].as_str().unwrap_or("?").to_string();
    routes.unwrap_or_default().iter().map(name).collect()
}

/// Weir with `admin_extra` in `[admin]`, in front of a backend answering "app".
fn started(admin_extra: &str) -> (Backend, Weir, SocketAddr) {
    let b = Backend::fixed(200, &[], "app");
    let weir = Weir::start(&file(&b, admin_extra));
    let addr = weir.admin_addr();
    (b, weir, addr)
}

fn json(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let mut headers = vec![("Content-Type", "application/json")];
    headers.extend_from_slice(extra);
    headers
}

#[test]
fn a_foreign_host_is_refused_for_reads_and_writes_and_nothing_is_applied() {
    let (_b, weir, addr) = started("");
    let rebind = ("Host", "rebind.evil.com");
    let path = "/api/v1/listeners/web/routes/pwn";
    let (status, body) = admin(addr, "PUT", path, &json(&[rebind]), PWN_ROUTE);
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["field"], "Host");
    let fix = body["fix"].as_str().unwrap_or("");
    assert!(
        fix.contains("allowed_hosts") && fix.contains(&addr.to_string()),
        "{body}"
    );
    assert_eq!(route_names(addr, None), ["all"], "the route was not added");
    let mut c = BlockingClient::connect(weir.addr).expect("connect");
    let r = c.get("/etc/hostname", "pwn.local").expect("response");
    assert_eq!(
        r.body_str(),
        "app",
        "served by the app, not by a files route"
    );
    // Reads too: the config and the metrics hold what a page should not see.
    for path in ["/api/v1/config", "/api/v1/history", "/metrics", "/ui/"] {
        assert_eq!(admin(addr, "GET", path, &[rebind], "").0, 403, "{path}");
    }
    // The port is not the name: a rebinding page sends its own port, the listener's.
    let with_port = format!("rebind.evil.com:{}", addr.port());
    let (status, _) = admin(addr, "GET", "/api/v1/config", &[("Host", &with_port)], "");
    assert_eq!(status, 403);
    // Probes answer whatever Host a load balancer sends.
    for path in ["/live", "/ready"] {
        assert_eq!(admin(addr, "GET", path, &[rebind], "").0, 200, "{path}");
    }
}

#[test]
fn the_listeners_own_address_is_served_with_or_without_the_port() {
    let (_b, _weir, addr) = started("");
    let port = addr.port();
    let hosts = [
        format!("127.0.0.1:{port}"),
        "127.0.0.1".to_string(),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ];
    for host in &hosts {
        let (status, body) = admin(addr, "GET", "/api/v1/config", &[("Host", host)], "");
        assert_eq!(status, 200, "{host}: {body}");
    }
    let route = r#"{"name": "b", "path_prefix": "/b", "respond": {"status": 204}}"#;
    let path = "/api/v1/listeners/web/routes/b";
    let (status, body) = admin(addr, "PUT", path, &json(&[("Host", "127.0.0.1")]), route);
    assert_eq!(status, 200, "{body}");
    assert_eq!(route_names(addr, None), ["all", "b"]);
    // Another address of the machine is not this listener's.
    let (status, _) = admin(addr, "GET", "/api/v1/config", &[("Host", "10.9.8.7")], "");
    assert_eq!(status, 403);
}

#[test]
fn a_foreign_origin_is_refused_and_the_listeners_own_served() {
    let (_b, _weir, addr) = started("");
    let evil = ("Origin", "http://evil.example");
    let (status, body) = admin(addr, "GET", "/api/v1/config", &[evil], "");
    assert_eq!(
        (status, body["field"].as_str()),
        (403, Some("Origin")),
        "{body}"
    );
    let path = "/api/v1/listeners/web/routes/pwn";
    assert_eq!(admin(addr, "PUT", path, &json(&[evil]), PWN_ROUTE).0, 403);
    assert_eq!(
        admin(addr, "GET", "/metrics", &[("Origin", "null")], "").0,
        403
    );
    assert_eq!(route_names(addr, None), ["all"], "nothing applied");
    // The dashboard's own requests carry the listener's origin.
    let own = format!("http://{addr}");
    let (status, body) = admin(addr, "GET", "/api/v1/config", &[("Origin", &own)], "");
    assert_eq!(status, 200, "{body}");
}

/// Fetches `/page` from the data port; its `Cache-Status`.
fn fetch(weir: &Weir) -> String {
    let mut c = BlockingClient::connect(weir.addr).expect("connect");
    let r = c.get("/page", "h").expect("response");
    assert_eq!(r.status, 200);
    r.header("Cache-Status").unwrap_or("").to_string()
}

#[test]
fn a_purge_that_is_not_json_is_415_and_purges_nothing() {
    let b = Backend::fixed(200, &[("Cache-Control", "max-age=600")], "cached");
    let weir = Weir::start(&file(&b, ""));
    let addr = weir.admin_addr();
    assert_eq!(fetch(&weir), "weir; fwd=uri-miss");
    let purge = r#"{"url": "http://h/page"}"#;
    // What a form or a `fetch` in no-cors mode can send from any site.
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        let headers: Vec<_> = content_type
            .map(|t| ("Content-Type", t))
            .into_iter()
            .collect();
        let (status, body) = admin(addr, "POST", "/api/v1/caches/purge", &headers, purge);
        assert_eq!(status, 415, "{content_type:?}: {body}");
        assert!(
            body["fix"]
                .as_str()
                .unwrap_or("")
                .contains("application/json"),
            "{body}"
        );
    }
    let (status, _) = admin(addr, "POST", "/api/v1/caches/purge", &[], "");
    assert_eq!(status, 415, "a body-less POST without a type");
    let toml = [("Content-Type", "application/toml")];
    let (status, _) = admin(
        addr,
        "POST",
        "/api/v1/caches/purge",
        &toml,
        "url = \"http://h/page\"",
    );
    assert_eq!(status, 415, "purge takes JSON only");
    // A cross-site POST with its Origin is refused before its type is looked at.
    let cross = [
        ("Content-Type", "text/plain"),
        ("Origin", "http://evil.example"),
    ];
    assert_eq!(
        admin(addr, "POST", "/api/v1/caches/purge", &cross, purge).0,
        403
    );
    assert_eq!(fetch(&weir), "weir; hit", "still cached");
    // The same purge as JSON goes through.
    let (status, body) = admin(addr, "POST", "/api/v1/caches/purge", &json(&[]), purge);
    assert_eq!(
        (status, &body["data"]["purged"]),
        (200, &Value::from(1)),
        "{body}"
    );
    assert_eq!(fetch(&weir), "weir; fwd=uri-miss");
}

#[test]
fn allowed_hosts_admits_its_names_and_a_token_does_not_lift_the_checks() {
    let b = Backend::fixed(200, &[], "app");
    let dir = TempDir::new("admin-guard");
    let token = dir.write("token", "t0ken\n");
    let extra = format!(
        "token_file = \"{}\"\nallowed_hosts = [\"Weir-Admin.Test\", \"192.0.2.7\"]",
        token.display()
    );
    let weir = Weir::start(&file(&b, &extra));
    let addr = weir.admin_addr();
    let bearer = ("Authorization", "Bearer t0ken");
    for host in ["weir-admin.test", "weir-admin.test:9901", "192.0.2.7:19901"] {
        let (status, body) = admin(addr, "GET", "/api/v1/config", &[bearer, ("Host", host)], "");
        assert_eq!(status, 200, "{host}: {body}");
    }
    let origin = ("Origin", "https://weir-admin.test");
    let (status, _) = admin(addr, "GET", "/api/v1/config", &[bearer, origin], "");
    assert_eq!(status, 200);
    // The right token from a rebinding name is still refused, and so is a form's write.
    let rebind = ("Host", "rebind.evil.com");
    let path = "/api/v1/listeners/web/routes/pwn";
    let (status, _) = admin(addr, "PUT", path, &json(&[bearer, rebind]), PWN_ROUTE);
    assert_eq!(status, 403);
    let form = [bearer, ("Content-Type", "text/plain")];
    assert_eq!(admin(addr, "PUT", path, &form, PWN_ROUTE).0, 415);
    assert_eq!(route_names(addr, Some("t0ken")), ["all"], "nothing applied");
    // And the checks come before the token: a page learns nothing about it.
    let (status, _) = admin(addr, "GET", "/api/v1/config", &[rebind], "");
    assert_eq!(status, 403);
}
