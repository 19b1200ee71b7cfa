//! The admin object API through the real binary: every endpoint, versions and `If-Match`,
//! dry runs, invalid objects, the bearer token, the body limit, and changes persisted to
//! the config file (comments kept) so a restart keeps them.

mod support_process;

use std::net::SocketAddr;

use serde_json::Value;
use support_process::{backend_of, call, get, TempDir, Weir};
use weir_testkit::Backend;

fn file(a: &Backend, admin_extra: &str) -> String {
    format!(
        "# Weir under test\n[server]\nworkers = 1\ndrain_timeout = \"1s\"\n\n\
         [admin]\nbind = \"127.0.0.1:0\"\n{admin_extra}\n\n\
         [[listeners]]\nname = \"web\" # the public one\nbind = \"127.0.0.1:0\"\n\n\
         [[listeners.routes]]\nname = \"all\"\nupstream = \"app\"\n\n\
         # application servers\n[upstreams.app]\nservers = [{{ addr = \"{}\" }}]\n",
        a.addr()
    )
}

/// A request to the admin API; returns status, ETag version and the JSON body. A body goes
/// as `Content-Type: application/json` unless `headers` name a type.
fn api(
    admin: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Option<u64>, Value) {
    let mut headers = headers.to_vec();
    let typed = headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("content-type"));
    if !body.is_empty() && !typed {
        headers.push(("Content-Type", "application/json"));
    }
    let (head, text) =
        call(admin, method, &format!("/api/v1{path}"), &headers, body).expect("admin call");
    let version = head
        .header("etag")
        .and_then(|e| e.trim_matches('"').parse().ok());
    let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (head.status, version, json)
}

#[test]
fn config_reads_as_json_and_toml_with_its_version() {
    let a = Backend::echo("a");
    let weir = Weir::start(&file(&a, ""));
    let admin = weir.admin_addr();
    let (status, version, body) = api(admin, "GET", "/config", &[], "");
    assert_eq!((status, version), (200, Some(1)));
    assert_eq!(body["data"]["listeners"][0]["name"], "web");
    let (head, text) = call(
        admin,
        "GET",
        "/api/v1/config",
        &[("Accept", "application/toml")],
        "",
    )
    .expect("call");
    assert_eq!(head.status, 200);
    assert!(text.starts_with("# Weir under test"), "{text}");
    // Who may change the config through a loopback API without a token is said at start.
    let said = weir_testkit::wait_until(support_process::START_WAIT, || {
        weir.log
            .text()
            .contains("every local user may change the config")
    });
    assert!(said, "{}", weir.log.text());
}

#[test]
fn servers_are_added_weighted_drained_and_removed_and_persisted() {
    let (a, b) = (Backend::echo("a"), Backend::echo("b"));
    let dir = TempDir::new("api-persist");
    let path = dir.write("weir.toml", &file(&a, ""));
    let weir = Weir::start_file(&path);
    let admin = weir.admin_addr();
    let b_addr = b.addr().to_string();
    let (status, version, body) = api(
        admin,
        "PUT",
        &format!("/upstreams/app/servers/{b_addr}"),
        &[],
        "",
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(version, Some(2));
    assert_eq!(body["changes"][0], format!("added server app/{b_addr}"));
    // Drain a: every new request goes to b.
    let a_path = format!("/upstreams/app/servers/{}", a.addr());
    let (status, _, body) = api(admin, "PUT", &a_path, &[], r#"{"drain": true}"#);
    assert_eq!(status, 200, "{body}");
    for _ in 0..4 {
        assert_eq!(backend_of(weir.addr), "b");
    }
    let (_, _, health) = api(admin, "GET", "/upstreams/app/health", &[], "");
    assert_eq!(
        health["data"]["servers"][0]["state"], "draining",
        "{health}"
    );
    assert_eq!(health["data"]["servers"][1]["state"], "up");
    let (status, _, body) = api(admin, "PUT", &a_path, &[], r#"{"weight": 3}"#);
    assert_eq!(status, 422, "weight needs a weighted policy: {body}");
    assert_eq!(body["field"], "upstreams.app.servers[0].weight");
    let (status, _, _) = api(admin, "DELETE", &a_path, &[], "");
    assert_eq!(status, 200);
    let (status, _, _) = api(admin, "DELETE", &a_path, &[], "");
    assert_eq!(status, 404);

    let text = std::fs::read_to_string(&path).expect("persisted file");
    assert!(
        text.contains("# application servers") && text.contains("# the public one"),
        "{text}"
    );
    assert!(
        !text.contains(&a.addr().to_string()) && text.contains(&b_addr),
        "{text}"
    );
    drop(weir);
    // A restart runs what the API left in the file.
    let weir = Weir::start_file(&path);
    assert_eq!(backend_of(weir.addr), "b");
    let (_, _, list) = api(weir.admin_addr(), "GET", "/upstreams", &[], "");
    assert_eq!(list["data"][0]["servers"].as_array().map(Vec::len), Some(1));
}

#[test]
fn a_stale_version_gets_409_and_a_dry_run_changes_nothing() {
    let (a, b) = (Backend::echo("a"), Backend::echo("b"));
    let weir = Weir::start(&file(&a, ""));
    let admin = weir.admin_addr();
    let put_b = format!(r#"{{"servers": [{{"addr": "{}"}}]}}"#, b.addr());
    let (status, _, body) = api(
        admin,
        "PUT",
        "/upstreams/app?dry_run=true",
        &[("If-Match", "\"1\"")],
        &put_b,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["dry_run"], true);
    assert_eq!(body["changes"].as_array().map(Vec::len), Some(2), "{body}");
    assert_eq!(backend_of(weir.addr), "a");
    let (status, version, _) = api(
        admin,
        "PUT",
        "/upstreams/app",
        &[("If-Match", "\"1\"")],
        &put_b,
    );
    assert_eq!((status, version), (200, Some(2)));
    assert_eq!(backend_of(weir.addr), "b");
    let (status, _, body) = api(admin, "PUT", "/upstreams/app", &[("If-Match", "1")], &put_b);
    assert_eq!(status, 409, "{body}");
    assert!(body["fix"].as_str().unwrap_or("").contains("If-Match"));
}

#[test]
fn invalid_objects_get_the_field_and_the_fix() {
    let a = Backend::echo("a");
    let weir = Weir::start(&file(&a, ""));
    let admin = weir.admin_addr();
    let (status, _, body) = api(
        admin,
        "PUT",
        "/upstreams/app",
        &[],
        r#"{"servers": [{"addr": "nohost"}]}"#,
    );
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["field"], "upstreams.app.servers[0].addr");
    assert!(!body["fix"].as_str().unwrap_or("").is_empty());
    let (status, _, body) = api(admin, "PUT", "/upstreams/app", &[], r#"{"server": []}"#);
    assert_eq!(status, 422, "unknown key: {body}");
    let (status, _, _) = api(admin, "PUT", "/upstreams/app", &[], "not json");
    assert_eq!(status, 400);
    let (status, _, body) = api(admin, "DELETE", "/upstreams/app", &[], "");
    assert_eq!(status, 422, "a route still uses it: {body}");
    let big = "x".repeat(2 << 20);
    let (status, _, _) = api(admin, "PUT", "/config", &[], &big);
    assert_eq!(status, 413);
    let (status, _, _) = api(admin, "GET", "/nothing", &[], "");
    assert_eq!(status, 404);
    assert_eq!(backend_of(weir.addr), "a");
}

#[test]
fn listeners_and_routes_are_read_put_and_deleted() {
    let (a, b) = (Backend::echo("a"), Backend::echo("b"));
    let weir = Weir::start(&file(&a, ""));
    let admin = weir.admin_addr();
    let put = format!(r#"{{"servers": [{{"addr": "{}"}}]}}"#, b.addr());
    assert_eq!(api(admin, "PUT", "/upstreams/other", &[], &put).0, 200);
    let (_, _, got) = api(admin, "GET", "/upstreams/other", &[], "");
    assert_eq!(got["data"]["servers"][0]["addr"], b.addr().to_string());
    let route = r#"{"path_prefix": "/b", "upstream": "other"}"#;
    assert_eq!(
        api(admin, "PUT", "/listeners/web/routes/b", &[], route).0,
        200
    );
    let (head, _) = get(weir.addr, "/b").expect("response");
    assert_eq!(head.header("x-backend"), Some("b"));
    let (_, _, got) = api(admin, "GET", "/listeners/web/routes/b", &[], "");
    assert_eq!(got["data"]["upstream"], "other");
    let listener = r#"{"bind": "127.0.0.1:0", "routes": [{"name": "all", "upstream": "other"}]}"#;
    let (status, _, body) = api(admin, "PUT", "/listeners/extra", &[], listener);
    assert_eq!(status, 200, "{body}");
    let (_, _, list) = api(admin, "GET", "/listeners", &[], "");
    let extra: SocketAddr = list["data"][1]["addr"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .expect("extra addr");
    assert_eq!(backend_of(extra), "b");
    assert_eq!(
        api(admin, "GET", "/listeners/extra", &[], "").2["data"]["bind"],
        "127.0.0.1:0"
    );
    assert_eq!(api(admin, "DELETE", "/listeners/extra", &[], "").0, 200);
    assert!(weir_testkit::wait_until(
        support_process::START_WAIT,
        || support_process::refused(extra)
    ));
    assert_eq!(
        api(admin, "DELETE", "/listeners/web/routes/b", &[], "").0,
        200
    );
    assert_eq!(
        api(admin, "DELETE", "/listeners/web/routes/b", &[], "").0,
        404
    );
    assert_eq!(api(admin, "DELETE", "/upstreams/other", &[], "").0, 200);
    assert_eq!(api(admin, "GET", "/upstreams/other", &[], "").0, 404);
}

#[test]
fn a_token_file_requires_the_bearer_token() {
    let a = Backend::echo("a");
    let dir = TempDir::new("api-token");
    let token = dir.write("token", "t0ken\n");
    let weir = Weir::start(&file(&a, &format!("token_file = \"{}\"", token.display())));
    let admin = weir.admin_addr();
    let listening = weir
        .log
        .lines()
        .into_iter()
        .find(|l| l.contains("admin api listening"));
    assert!(listening.is_some_and(|l| l.contains("token=true")));
    assert_eq!(api(admin, "GET", "/config", &[], "").0, 401);
    assert_eq!(
        api(
            admin,
            "GET",
            "/config",
            &[("Authorization", "Bearer wrong")],
            ""
        )
        .0,
        401
    );
    assert_eq!(
        api(
            admin,
            "GET",
            "/config",
            &[("Authorization", "Bearer t0ken")],
            ""
        )
        .0,
        200
    );
    let (head, _) = call(admin, "GET", "/metrics", &[], "").expect("call");
    assert_eq!(head.status, 401);
    let (head, _) = call(admin, "GET", "/live", &[], "").expect("call");
    assert_eq!(head.status, 200, "probes stay open");
    // A rotated token is picked up without a restart (the file is read at most once a
    // second, so poll for it).
    std::fs::write(&token, "n3w\n").unwrap();
    let status = |bearer: &str| {
        let auth = format!("Bearer {bearer}");
        api(admin, "GET", "/config", &[("Authorization", &auth)], "").0
    };
    let rotated = weir_testkit::wait_until(support_process::START_WAIT, || status("n3w") == 200);
    assert!(rotated, "rotated token");
    assert_eq!(status("t0ken"), 401, "the old token no longer works");
}
