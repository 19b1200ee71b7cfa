//! `weir ctl` against a running `weir`: every command, tables and `-o json`, stdin, and
//! clear errors with a non-zero exit.

mod support_process;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use support_process::{backend_of, TempDir, Weir, WEIR};
use weir_testkit::Backend;

fn file(a: &Backend, admin_extra: &str) -> String {
    format!(
        "[server]\nworkers = 1\ndrain_timeout = \"1s\"\n\n[admin]\nbind = \"127.0.0.1:0\"\n{admin_extra}\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n\
         [[listeners.routes]]\nname = \"all\"\nupstream = \"app\"\n\n\
         [upstreams.app]\nlb = \"weighted_round_robin\"\nservers = [{{ addr = \"{}\" }}]\n",
        a.addr()
    )
}

/// Runs `weir ctl --admin URL ARGS...` with `stdin`; returns the output.
fn ctl(weir: &Weir, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(WEIR)
        .arg("ctl")
        .arg("--admin")
        .arg(format!("http://{}", weir.admin_addr()))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn weir ctl");
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes()).expect("stdin");
    }
    child.wait_with_output().expect("weir ctl output")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "weir ctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn get_prints_tables_and_json() {
    let a = Backend::echo("a");
    let weir = Weir::start(&file(&a, ""));
    let out = ok(&ctl(&weir, &["get", "upstreams"], ""));
    assert!(
        out.starts_with("NAME") && out.contains(&a.addr().to_string()),
        "{out}"
    );
    let out = ok(&ctl(&weir, &["get", "listeners"], ""));
    assert!(out.contains("web") && out.contains("all"), "{out}");
    let out = ok(&ctl(&weir, &["get", "health"], ""));
    assert!(out.contains("UPSTREAM") && out.contains(" up"), "{out}");
    let out = ok(&ctl(&weir, &["get", "config"], ""));
    assert!(
        out.starts_with("[server]") && out.contains("[upstreams.app]"),
        "{out}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&ctl(&weir, &["-o", "json", "get", "upstreams"], "")))
            .expect("json");
    assert_eq!(json[0]["name"], "app");
}

#[test]
fn server_commands_change_the_pool() {
    let (a, b) = (Backend::echo("a"), Backend::echo("b"));
    let weir = Weir::start(&file(&a, ""));
    let (a_addr, b_addr) = (a.addr().to_string(), b.addr().to_string());
    let out = ok(&ctl(&weir, &["server", "add", "app", &b_addr, "2"], ""));
    assert!(out.contains(&format!("added server app/{b_addr}")), "{out}");
    ok(&ctl(&weir, &["server", "weight", "app", &b_addr, "5"], ""));
    ok(&ctl(&weir, &["server", "drain", "app", &a_addr], ""));
    for _ in 0..3 {
        assert_eq!(backend_of(weir.addr), "b");
    }
    let out = ok(&ctl(&weir, &["get", "upstreams"], ""));
    assert!(out.contains("w=5") && out.contains("drain"), "{out}");
    ok(&ctl(&weir, &["server", "remove", "app", &a_addr], ""));
    let out = ctl(&weir, &["server", "remove", "app", &a_addr], "");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
}

/// Was: `server drain` of a mistyped address added a (draining) server, wrote it to the
/// file and exited 0.
#[test]
fn drain_undrain_and_weight_of_an_unknown_server_fail_and_change_nothing() {
    let a = Backend::echo("a");
    let weir = Weir::start(&file(&a, ""));
    let path = weir.config_path.clone().expect("path");
    let before = std::fs::read_to_string(&path).expect("read");
    for args in [
        &["server", "drain", "app", "127.0.0.1:1"][..],
        &["server", "undrain", "app", "127.0.0.1:1"],
        &["server", "weight", "app", "127.0.0.1:1", "3"],
    ] {
        let out = ctl(&weir, args, "");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("server 127.0.0.1:1 of upstream app not found (HTTP 404)")
                && err.contains("weir ctl server add app 127.0.0.1:1"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(std::fs::read_to_string(&path).expect("read"), before);
    let out = ok(&ctl(&weir, &["get", "upstreams"], ""));
    assert!(
        !out.contains("127.0.0.1:1 ") && !out.contains("127.0.0.1:1\n"),
        "{out}"
    );
}

/// Was: `diff` named only the objects and exited 0 either way.
#[test]
fn diff_shows_fields_old_and_new_and_exits_like_diff() {
    let a = Backend::echo("a");
    let weir = Weir::start(&file(&a, ""));
    let dir = TempDir::new("ctl-diff");
    let text = std::fs::read_to_string(weir.config_path.as_ref().expect("path")).expect("read");
    let same = dir.write("same.toml", &text);
    let out = ctl(&weir, &["diff", "-f", same.to_str().expect("utf-8")], "");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let edited = text
        .replace("drain_timeout = \"1s\"", "drain_timeout = \"2s\"")
        .replace(
            "name = \"web\"\n",
            "name = \"web\"\nkeepalive_timeout = \"9s\"\n",
        );
    let edited = dir.write("edited.toml", &edited);
    let out = ctl(&weir, &["diff", "-f", edited.to_str().expect("utf-8")], "");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("  server.drain_timeout: \"1s\" -> \"2s\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("  listeners[web].keepalive_timeout: (unset) -> \"9s\""),
        "{stdout}"
    );
    let json: serde_json::Value = serde_json::from_slice(
        &ctl(
            &weir,
            &["-o", "json", "diff", "-f", edited.to_str().expect("utf-8")],
            "",
        )
        .stdout,
    )
    .expect("json");
    let fields = json["fields"].as_array().expect("fields");
    assert!(
        fields
            .iter()
            .any(|f| f["path"] == "server.drain_timeout" && f["old"] == "\"1s\""),
        "{json}"
    );
    assert!(stdout.contains("  changed server\n"), "{stdout}");
    let broken = dir.write("broken.toml", "not = [valid");
    let out = ctl(&weir, &["diff", "-f", broken.to_str().expect("utf-8")], "");
    assert_eq!(out.status.code(), Some(2), "trouble: exit 2");
}

/// Was: `weir ctl` always went to 127.0.0.1:9901 unless told `--admin` on every call.
#[test]
fn ctl_finds_the_admin_api_from_the_environment_or_a_config_file() {
    let a = Backend::echo("a");
    let dir = TempDir::new("ctl-env");
    let token = dir.write("token", "sesame\n");
    let weir = Weir::start(&file(&a, &format!("token_file = \"{}\"", token.display())));
    let admin = weir.admin_addr();
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = Command::new(WEIR);
        cmd.arg("ctl")
            .args(args)
            .env_remove("WEIR_ADMIN")
            .env_remove("WEIR_ADMIN_TOKEN_FILE");
        cmd.envs(env.iter().copied()).current_dir("/");
        cmd.output().expect("run weir ctl")
    };
    let url = format!("http://{admin}");
    let token_path = token.to_str().expect("utf-8");
    let env = [
        ("WEIR_ADMIN", url.as_str()),
        ("WEIR_ADMIN_TOKEN_FILE", token_path),
    ];
    let out = ok(&run(&["get", "upstreams"], &env));
    assert!(out.contains(&a.addr().to_string()), "{out}");
    // A config file naming the admin listener and a token file relative to itself.
    let copy = dir.write(
        "copy.toml",
        &format!(
            "[admin]\nbind = \"0.0.0.0:{}\"\ntoken_file = \"token\"\n",
            admin.port()
        ),
    );
    let out = ok(&run(
        &["-c", copy.to_str().expect("utf-8"), "get", "upstreams"],
        &[],
    ));
    assert!(out.contains(&a.addr().to_string()), "{out}");
    let off = dir.write("off.toml", "[admin]\nbind = \"off\"\n");
    let out = run(
        &["-c", off.to_str().expect("utf-8"), "get", "upstreams"],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no admin API"),
        "{err}"
    );
}

/// Was: `apply -f broken.toml` reported the position as `weir.toml:39:1` (the server's file).
#[test]
fn apply_errors_name_the_file_sent() {
    let a = Backend::echo("a");
    let weir = Weir::start(&file(&a, ""));
    let dir = TempDir::new("ctl-broken");
    let text = std::fs::read_to_string(weir.config_path.as_ref().expect("path")).expect("read");
    let broken = dir.write(
        "broken.toml",
        &text.replace("upstream = \"app\"", "upstream = \"nope\""),
    );
    let line = text
        .lines()
        .position(|l| l == "upstream = \"app\"")
        .expect("route line")
        + 1;
    for command in ["apply", "diff"] {
        let out = ctl(&weir, &[command, "-f", broken.to_str().expect("utf-8")], "");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with(&format!("error: {}:{line}:", broken.display())),
            "{command}: {err}"
        );
    }
    let out = ctl(&weir, &["apply", "-f", "-"], "not = [valid");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: stdin:1:"), "{err}");
}

/// Was: API changes were not logged, and there was no way to see what changed when.
#[test]
fn every_change_is_logged_with_who_and_listed_by_history() {
    let (a, b) = (Backend::echo("a"), Backend::echo("b"));
    let weir = Weir::start(&file(&a, ""));
    let b_addr = b.addr().to_string();
    ok(&ctl(&weir, &["server", "add", "app", &b_addr], ""));
    ok(&ctl(&weir, &["server", "drain", "app", &b_addr], ""));
    weir.signal(libc::SIGHUP);
    assert!(
        weir.log.wait_for("by=SIGHUP", Duration::from_secs(20)),
        "{}",
        weir.log.text()
    );
    let logged: Vec<String> = weir
        .log
        .lines()
        .into_iter()
        .filter(|l| l.contains("config changed"))
        .collect();
    assert_eq!(logged.len(), 3, "{logged:?}");
    assert!(
        logged[0].contains("by=api 127.0.0.1:")
            && logged[0].contains("from=1 version=2")
            && logged[0].contains(&format!("added server app/{b_addr}")),
        "{logged:?}"
    );
    let out = ok(&ctl(&weir, &["history"], ""));
    let rows: Vec<&str> = out.lines().collect();
    assert!(rows[0].starts_with("VERSION"), "{out}");
    assert_eq!(rows.len(), 5, "start + 3 changes: {out}");
    assert!(
        rows[1].starts_with("1 ") && rows[1].contains("start"),
        "{out}"
    );
    assert!(
        rows[2].contains("api 127.0.0.1:") && rows[2].contains("added server"),
        "{out}"
    );
    assert!(rows[3].contains("changed server"), "{out}");
    assert!(
        rows[4].starts_with("4 ") && rows[4].contains("SIGHUP"),
        "{out}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&ctl(&weir, &["-o", "json", "history"], ""))).expect("json");
    assert_eq!(json[1]["version"], 2);
    assert!(
        json[1]["at"].as_u64().is_some_and(|t| t > 1_700_000_000),
        "{json}"
    );
    // Each version keeps the keys it edited (the dashboard's diff view).
    let drain = &json[2]["fields"];
    assert_eq!(drain.as_array().map(Vec::len), Some(1), "{json}");
    let path = format!("upstreams.app.servers[{b_addr}].drain");
    assert_eq!(
        (&drain[0]["path"], &drain[0]["old"], &drain[0]["new"]),
        (&path.into(), &serde_json::Value::Null, &"true".into()),
        "{json}"
    );
    assert_eq!(json[0]["fields"], serde_json::json!([]));
}

#[test]
fn apply_and_diff_take_toml_and_json_from_files_and_stdin() {
    let (a, b) = (Backend::echo("a"), Backend::echo("b"));
    let weir = Weir::start(&file(&a, ""));
    let dir = TempDir::new("ctl-apply");
    let next = weir
        .config_path
        .as_ref()
        .map(std::fs::read_to_string)
        .expect("path")
        .expect("read");
    let next = next.replace(&a.addr().to_string(), &b.addr().to_string());
    let path = dir.write("next.toml", &next);
    let out = ctl(&weir, &["diff", "-f", path.to_str().expect("utf-8")], "");
    assert_eq!(out.status.code(), Some(1), "differences: exit 1");
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.starts_with("would change") && out.contains("added server"),
        "{out}"
    );
    assert_eq!(backend_of(weir.addr), "a");
    let out = ok(&ctl(&weir, &["apply", "-f", "-"], &next));
    assert!(out.starts_with("changed (version 2)"), "{out}");
    assert_eq!(backend_of(weir.addr), "b");
    // JSON, as `get config -o json` prints it.
    let json: serde_json::Value =
        serde_json::from_str(&ok(&ctl(&weir, &["-o", "json", "get", "config"], ""))).expect("json");
    let mut data = json["data"].clone();
    data["upstreams"]["app"]["servers"][0]["addr"] = a.addr().to_string().into();
    let json_path = dir.write("next.json", &data.to_string());
    ok(&ctl(
        &weir,
        &["apply", "-f", json_path.to_str().expect("utf-8")],
        "",
    ));
    assert_eq!(backend_of(weir.addr), "a");
}

#[test]
fn errors_are_clear_and_exit_non_zero() {
    let a = Backend::echo("a");
    let dir = TempDir::new("ctl-errors");
    let token = dir.write("token", "sesame");
    let weir = Weir::start(&file(&a, &format!("token_file = \"{}\"", token.display())));
    let out = ctl(&weir, &["get", "upstreams"], "");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("HTTP 401") && err.contains("fix:"), "{err}");
    let token_arg = token.to_str().expect("utf-8");
    ok(&ctl(
        &weir,
        &["--token-file", token_arg, "get", "upstreams"],
        "",
    ));
    let out = ctl(
        &weir,
        &["--token-file", token_arg, "delete", "upstream", "app"],
        "",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("field: listeners[0].routes[0].upstream"),
        "{err}"
    );
    let out = ctl(
        &weir,
        &["--token-file", token_arg, "apply", "-f", "-"],
        "not = [valid",
    );
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("HTTP 422"));
    let nobody = Command::new(WEIR)
        .args(["ctl", "--admin", "http://127.0.0.1:1", "get", "config"])
        .output()
        .expect("run");
    assert!(!nobody.status.success());
    assert!(String::from_utf8_lossy(&nobody.stderr).contains("cannot reach the admin API"));
}

/// The SHA-256 fingerprint of a PEM certificate as the openssl CLI computes it, in the
/// API's form (lower-case hex, no colons).
fn openssl_sha256(cert: &std::path::Path) -> String {
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
        .arg(cert)
        .output()
        .expect("run openssl");
    let text = String::from_utf8_lossy(&out.stdout);
    let hex = text.trim().rsplit('=').next().unwrap_or_default();
    hex.replace(':', "").to_ascii_lowercase()
}

/// Weir with `tls` (a `[listeners.tls]` table) on the listener, and `weir ctl get certs`.
fn start_with_tls(backend: &Backend, tls: &str) -> (Weir, String) {
    let config = file(backend, "").replacen(
        "\n\n[[listeners.routes]]",
        &format!("\n{tls}[[listeners.routes]]"),
        1,
    );
    let weir = Weir::start(&config);
    let out = ok(&ctl(&weir, &["get", "certs"], ""));
    (weir, out)
}

#[test]
fn get_certs_lists_every_certificate_in_use() {
    use weir_testkit::certs::{LeafOptions, TestCa};
    let a = Backend::echo("a");
    let ca = TestCa::new("Ctl Test CA");
    let site = ca.leaf(&["site.example.com", "www.example.com"]);
    let options = LeafOptions {
        not_after_days: 30,
        ..LeafOptions::default()
    };
    let soon = ca.leaf_with(&["*.soon.example.net"], &options);
    let tls = format!(
        "[listeners.tls]\ncerts = [{{ cert = \"{}\", key = \"{}\" }}, {{ cert = \"{}\", key = \"{}\" }}]\n\n",
        site.cert_path.display(),
        site.key_path.display(),
        soon.cert_path.display(),
        soon.key_path.display()
    );
    let (weir, out) = start_with_tls(&a, &tls);
    let header = out.lines().next().unwrap_or_default();
    for column in [
        "LISTENER",
        "NAMES",
        "ISSUER",
        "NOT AFTER",
        "DAYS LEFT",
        "SHA-256",
    ] {
        assert!(header.contains(column), "{out}");
    }
    let site_sha = openssl_sha256(&site.cert_path);
    assert_eq!(site_sha.len(), 64, "openssl fingerprint: {site_sha}");
    let row = out
        .lines()
        .find(|l| l.contains(&site_sha))
        .expect("site row");
    assert!(row.starts_with("web"), "{row}");
    assert!(row.contains("site.example.com, www.example.com"), "{row}");
    assert!(row.contains("CN=Ctl Test CA"), "{row}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&ctl(&weir, &["-o", "json", "get", "certs"], ""))).expect("json");
    let certs = json.as_array().expect("a list");
    assert_eq!(certs.len(), 2, "{json}");
    assert_eq!(certs[0]["sha256"], site_sha.as_str());
    assert_eq!(certs[0]["default"], true);
    let second = &certs[1];
    assert_eq!(second["listener"], "web");
    assert_eq!(second["names"], serde_json::json!(["*.soon.example.net"]));
    assert_eq!(second["sha256"], openssl_sha256(&soon.cert_path).as_str());
    let days = second["days_left"].as_i64().expect("days_left");
    assert!((29..=30).contains(&days), "{second}");
    assert!(
        second["not_after"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{second}"
    );
}

#[test]
fn get_certs_shows_the_source_of_each_certificate() {
    use weir_testkit::certs::{CertDir, TestCa};
    let a = Backend::echo("a");
    let ca = TestCa::new("Ctl Test CA");
    let site = ca.leaf(&["site.example.com"]);
    let dir = CertDir::new();
    let tls = format!(
        "[listeners.tls]\ncerts = [{{ cert = \"{}\", key = \"{}\" }}]\ninternal_ca = {{ storage = {:?} }}\n\n",
        site.cert_path.display(),
        site.key_path.display(),
        dir.path().join("ca").display().to_string()
    );
    let (weir, out) = start_with_tls(&a, &tls);
    let header = out.lines().next().unwrap_or_default();
    for column in ["SOURCE", "RENEW AT", "LAST ERROR"] {
        assert!(header.contains(column), "{out}");
    }
    assert!(
        out.lines()
            .any(|l| l.contains(" file ") && l.contains("site.example.com")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.contains(" internal ") && l.contains("localhost")),
        "{out}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&ctl(&weir, &["-o", "json", "get", "certs"], ""))).expect("json");
    let certs = json.as_array().expect("a list");
    assert_eq!(certs.len(), 2, "{json}");
    assert_eq!(certs[0]["source"], "file");
    let internal = &certs[1];
    assert_eq!(internal["source"], "internal");
    assert_eq!(internal["names"], serde_json::json!(["localhost"]));
    assert!(
        internal["issuer"]
            .as_str()
            .is_some_and(|i| i.contains("Weir internal CA")),
        "{internal}"
    );
    assert!(
        internal["renew_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{internal}"
    );
    assert_eq!(internal["last_error"], serde_json::Value::Null);
}
