//! `weir check -c FILE`: exit 0 and a one-line summary for a good file; a non-zero exit with
//! `file:line:column`, the field path, what is wrong and a fix for a bad one.

mod support_process;

use std::path::Path;

use support_process::{weir_check, TempDir};

const GOOD: &str = r#"[server]
workers = 2
drain_timeout = "5s"

[admin]
bind = "127.0.0.1:0"

[[listeners]]
name = "web"
bind = "127.0.0.1:0"
keepalive_timeout = "5s"
max_body_size = "10MiB"
default_response = { status = 404, body = "no route\n" }

[[listeners.routes]]
name = "cgi"
hosts = ["*"]
path_prefix = "/cgi/"
rewrite_prefix = "/"
reverse_rewrite = true
upstream = "cgi"

[[listeners.routes]]
name = "all"
path_prefix = "/"
upstream = "cgi"

[upstreams.cgi]
servers = [{ addr = "127.0.0.1:8081" }, { addr = "127.0.0.1:8082" }]
connect_timeout = "2s"
"#;

#[test]
fn good_config_prints_one_summary_line() {
    let dir = TempDir::new("check");
    let path = dir.write("good.toml", GOOD);
    let out = weir_check(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stdout}\n{stderr}", out.status);
    assert_eq!(stdout.lines().count(), 1, "one line: {stdout:?}");
    let line = stdout.trim_end();
    assert!(line.starts_with(&path.display().to_string()), "{line}");
    assert!(line.contains("OK"), "{line}");
    assert!(
        line.contains("1 listener(s), 2 route(s), 1 upstream(s), 2 server(s)"),
        "{line}"
    );
    assert!(stderr.trim().is_empty(), "nothing on stderr: {stderr}");
}

/// Runs `weir check` on `text`, expects failure, returns (path, stderr).
fn check_fails(name: &str, text: &str) -> (String, String) {
    let dir = TempDir::new("check");
    let path = dir.write(name, text);
    let out = weir_check(&path);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "{name}: should fail, got {:?}; stdout: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(out.stdout.is_empty(), "{name}: no summary on failure");
    (path.display().to_string(), stderr)
}

/// Asserts the error names `path:line:COLUMN: field: ` and carries a fix hint; returns the
/// column and the rest of the message.
fn assert_located(path: &str, stderr: &str, line: usize, field: &str) -> (usize, String) {
    let prefix = format!("{path}:{line}:");
    let at = stderr
        .find(&prefix)
        .unwrap_or_else(|| panic!("no {prefix} in: {stderr}"));
    let rest = &stderr[at + prefix.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let column: usize = digits
        .parse()
        .unwrap_or_else(|_| panic!("no column after {prefix}: {stderr}"));
    assert!(column >= 1, "{stderr}");
    let rest = &rest[digits.len()..];
    let expected = format!(": {field}: ");
    assert!(
        rest.starts_with(&expected),
        "field path {field:?} right after the position: {stderr}"
    );
    let message = rest[expected.len()..].trim_end().to_string();
    let fix = message
        .split("(fix: ")
        .nth(1)
        .unwrap_or_else(|| panic!("no fix hint: {stderr}"));
    assert!(fix.trim_end_matches(')').trim().len() > 5, "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    (column, message)
}

fn with_line(line_no: usize, insert: &str) -> String {
    let mut lines: Vec<&str> = GOOD.lines().collect();
    lines.insert(line_no - 1, insert);
    lines.join("\n") + "\n"
}

#[test]
fn unknown_key_is_located_with_a_fix() {
    // Line 11 of the file: inside [[listeners]], after `bind`.
    let text = with_line(11, "bakclog = 64");
    let (path, stderr) = check_fails("unknown.toml", &text);
    let (column, message) = assert_located(&path, &stderr, 11, "listeners[0].bakclog");
    assert_eq!(column, 1, "{stderr}");
    assert!(message.contains("unknown field"), "{stderr}");
    assert!(
        message.contains("backlog"),
        "lists the accepted keys: {stderr}"
    );
}

#[test]
fn bad_duration_is_located_with_a_fix() {
    let text = GOOD.replace(
        "keepalive_timeout = \"5s\"",
        "keepalive_timeout = \"5 parsecs\"",
    );
    let (path, stderr) = check_fails("duration.toml", &text);
    let (column, message) = assert_located(&path, &stderr, 11, "listeners[0].keepalive_timeout");
    // The key starts at column 1, its value at 21: either is a fine place to point at.
    assert!(column == 1 || column == 21, "{stderr}");
    assert!(
        message.contains("parsecs"),
        "quotes the bad value: {stderr}"
    );
    assert!(
        message.contains("\"5s\"") || message.contains("ms"),
        "{stderr}"
    );
}

#[test]
fn undefined_upstream_is_located_with_a_fix() {
    let text = GOOD.replace("upstream = \"cgi\"\n\n[[", "upstream = \"cig\"\n\n[[");
    assert_ne!(text, GOOD);
    let (path, stderr) = check_fails("upstream.toml", &text);
    let (column, message) = assert_located(&path, &stderr, 21, "listeners[0].routes[0].upstream");
    assert!(column == 1 || column == 12, "{stderr}");
    assert!(message.contains("cig"), "{stderr}");
    assert!(
        message.contains("cgi"),
        "names the defined upstreams: {stderr}"
    );
}

#[test]
fn missing_file_fails_with_the_path() {
    let dir = TempDir::new("check");
    let path = dir.path().join("absent.toml");
    let out = weir_check(Path::new(&path));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&path.display().to_string()), "{stderr}");
    assert!(stderr.contains("fix:"), "{stderr}");
}

#[test]
fn tcp_listener_with_routes_is_located_with_a_fix() {
    // After the listener's bind (line 10): a tcp listener that keeps its HTTP keys.
    let text = with_line(11, "protocol = \"tcp\"\nupstream = \"cgi\"");
    let (path, stderr) = check_fails("tcp.toml", &text);
    let (_, message) = assert_located(&path, &stderr, 13, "listeners[0].keepalive_timeout");
    assert!(message.contains("only to protocol = \"http\""), "{stderr}");
    assert!(
        message.contains("remove keepalive_timeout, max_body_size, default_response, routes"),
        "{stderr}"
    );
}

#[test]
fn h2c_upgrade_is_refused_with_a_fix() {
    // Line 21 of the file: the first route's `upstream`; the new key goes before it.
    let text = with_line(21, "upgrades = [\"websocket\", \"h2c\"]");
    let (path, stderr) = check_fails("h2c.toml", &text);
    let (_, message) = assert_located(&path, &stderr, 21, "listeners[0].routes[0].upgrades[1]");
    assert!(
        message.contains("\"h2c\" would tunnel HTTP past Weir"),
        "{stderr}"
    );
    assert!(message.contains("remove \"h2c\" from upgrades"), "{stderr}");
}

/// A config with one TLS listener serving `cert` / `key`.
fn tls_config(cert: &Path, key: &Path) -> String {
    format!(
        "[admin]\nbind = \"off\"\n\n[[listeners]]\nname = \"https\"\nbind = \"127.0.0.1:0\"\n\
         [listeners.tls]\ncerts = [{{ cert = \"{}\", key = \"{}\" }}]\n",
        cert.display(),
        key.display()
    )
}

/// An admin API beyond loopback without a token serves the config, secrets included, to
/// whoever reaches it: `weir check` warns (and still exits 0: probes need such a bind), and
/// a bad `allowed_hosts` entry is an error at its line.
#[test]
fn an_open_admin_bind_is_warned_about_and_allowed_hosts_checked() {
    let dir = TempDir::new("check-admin");
    let open = GOOD.replace("bind = \"127.0.0.1:0\"\n\n[[", "bind = \"0.0.0.0:0\"\n\n[[");
    let warning = "admin.bind = \"0.0.0.0:0\" without admin.token_file";
    support_process::assert_check_warns(&dir.write("open.toml", &open), warning);
    let named = GOOD.replace(
        "[admin]\n",
        "[admin]\nallowed_hosts = [\"admin.internal:9901\"]\n",
    );
    let out = weir_check(&dir.write("named.toml", &named));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("named.toml:6:"), "{stderr}");
    assert!(
        stderr.contains("admin.allowed_hosts[0]") && stderr.contains("includes a port"),
        "{stderr}"
    );
}

#[test]
fn certificates_are_reported_with_names_expiry_and_warnings() {
    use weir_testkit::certs::{LeafOptions, TestCa};
    let ca = TestCa::new("Check CA");
    let dir = TempDir::new("check-tls");
    let good = ca.leaf(&["a.example.com", "*.b.example.com"]);
    let path = dir.write("tls.toml", &tls_config(&good.cert_path, &good.key_path));
    let out = weir_check(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("names a.example.com, *.b.example.com; issuer CN=Check CA"),
        "{stdout}"
    );
    assert!(
        stdout.contains("(in 364 days)") || stdout.contains("(in 365 days)"),
        "{stdout}"
    );
    assert!(!stdout.contains("warning"), "{stdout}");
    // Expiring soon, and a chain with the CA before the leaf: warnings, still exit 0.
    let soon = ca.leaf_with(
        &["soon.example.com"],
        &LeafOptions {
            not_after_days: 9,
            ..Default::default()
        },
    );
    let swapped = dir.write("swapped.pem", &format!("{}{}", ca.cert_pem, soon.cert_pem));
    let path = dir.write("soon.toml", &tls_config(&soon.cert_path, &soon.key_path));
    let out = weir_check(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("warning: listener \"https\"")
            && (stdout.contains("expires in 8 days") || stdout.contains("expires in 9 days")),
        "{stdout}"
    );
    // The swapped chain's first certificate is the CA: no DNS name, an error.
    let path = dir.write("swapped.toml", &tls_config(&swapped, &soon.key_path));
    let out = weir_check(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&swapped.display().to_string()) && stderr.contains("no DNS name"),
        "{stderr}"
    );
    // A key that is not the certificate's: an error naming the key file.
    let path = dir.write("mixed.toml", &tls_config(&good.cert_path, &soon.key_path));
    let out = weir_check(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&soon.key_path.display().to_string()) && stderr.contains("does not match"),
        "{stderr}"
    );
    // Leaf, then an unrelated certificate: out of order.
    let other = TestCa::new("Other CA");
    let misordered = dir.write("mis.pem", &format!("{}{}", good.cert_pem, other.cert_pem));
    let path = dir.write("mis.toml", &tls_config(&misordered, &good.key_path));
    let out = weir_check(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("chain out of order: certificate 1"),
        "{stdout}"
    );
}

/// `weir check` writes nothing: on an `internal_ca` listener it neither makes the storage
/// directory nor a CA, and a storage path under a file is refused with its path.
#[test]
fn check_on_an_internal_ca_config_leaves_the_storage_directory_absent() {
    let dir = TempDir::new("check-ca");
    let storage = dir.path().join("ca");
    let config = format!(
        "[[listeners]]\nname = \"tls\"\nbind = \"127.0.0.1:0\"\n[listeners.tls]\n\
         internal_ca = {{ storage = {:?} }}\n[[listeners.routes]]\nname = \"r\"\n\
         respond = {{ status = 200 }}\n",
        storage.display().to_string()
    );
    let path = dir.write("ca.toml", &config);
    let out = weir_check(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stderr}", out.status);
    assert!(!storage.exists(), "check made {}", storage.display());

    let blocker = dir.write("not-a-dir", "a file");
    let config = config.replace(
        &format!("{:?}", storage.display().to_string()),
        &format!("{:?}", blocker.join("ca").display().to_string()),
    );
    let out = weir_check(&dir.write("bad.toml", &config));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("not-a-dir"), "{stderr}");
}

/// `weir check -c FILE` run from `cwd`.
fn check_from(cwd: &Path, path: &Path) -> std::process::Output {
    std::process::Command::new(support_process::WEIR)
        .args(["check", "-c"])
        .arg(path)
        .current_dir(cwd)
        .env("NO_COLOR", "1")
        .output()
        .expect("run weir check")
}

/// A TLS listener whose files are written relative: `certs/site.pem`, `certs/site.key`.
fn relative_tls(cert: &str) -> String {
    format!(
        "[admin]\nbind = \"off\"\n\n[[listeners]]\nname = \"https\"\nbind = \"127.0.0.1:0\"\n\
         [listeners.tls]\ncerts = [{{ cert = \"{cert}\", key = \"certs/site.key\" }}]\n"
    )
}

/// Was: relative paths resolved against the working directory, so a config that checked
/// from its own directory failed from another one (a systemd unit runs in `/`).
#[test]
fn relative_paths_resolve_against_the_config_file_and_check_says_where() {
    let ca = weir_testkit::certs::TestCa::new("Paths CA");
    let leaf = ca.leaf(&["site.example"]);
    let dir = TempDir::new("check-paths");
    std::fs::create_dir_all(dir.path().join("certs")).expect("mkdir");
    dir.write("certs/site.pem", &leaf.chain_pem);
    dir.write("certs/site.key", &leaf.key_pem);
    let path = dir.write("weir.toml", &relative_tls("certs/site.pem"));
    let out = check_from(Path::new("/"), &path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resolved = dir.path().join("certs/site.pem");
    assert!(
        stdout.contains(&format!(
            "listeners[0].tls.certs[0].cert = \"certs/site.pem\" -> {}",
            resolved.display()
        )),
        "says where a relative path pointed: {stdout}"
    );
}

/// The line of `text` where `certs = ...` is (1-based).
fn certs_line(text: &str) -> usize {
    let index = text.lines().position(|l| l.starts_with("certs ="));
    index.expect("a certs line") + 1
}

/// Was: `listener "https": certs/sitee.pem: cannot read it`: no position, no fix, and the
/// path as written rather than the one tried.
#[test]
fn an_unreadable_certificate_is_located_with_the_path_tried_and_a_fix() {
    let dir = TempDir::new("check-cert-missing");
    let text = relative_tls("certs/sitee.pem");
    let path = dir.write("weir.toml", &text);
    let out = check_from(Path::new("/"), &path);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    let (_, message) = assert_located(
        &path.display().to_string(),
        &stderr,
        certs_line(&text),
        "listeners[0].tls.certs[0].cert",
    );
    let tried = dir.path().join("certs/sitee.pem").display().to_string();
    assert!(
        message.contains(&format!("{tried}: cannot read it")),
        "{stderr}"
    );
    assert!(
        message.contains(&format!("(fix: {tried} does not exist")),
        "{stderr}"
    );
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo").arg(path).status();
    assert!(made.expect("mkfifo").success(), "mkfifo {}", path.display());
}

/// Was: a FIFO as certificate hung `weir check` until something wrote to it (forever),
/// and `/dev/zero` was read for 10 s until "out of memory". Now both are refused at once,
/// at the `cert` line, saying what the file is.
#[test]
fn a_certificate_that_is_a_fifo_or_a_device_fails_fast() {
    let ca = weir_testkit::certs::TestCa::new("Special CA");
    let good = ca.leaf(&["a.example.com"]);
    let dir = TempDir::new("check-cert-special");
    let fifo = dir.path().join("cert.fifo");
    mkfifo(&fifo);
    for (cert, what) in [
        (fifo.as_path(), "(a FIFO)"),
        (Path::new("/dev/zero"), "(a character device)"),
    ] {
        let text = tls_config(cert, &good.key_path);
        let path = dir.write("weir.toml", &text);
        let started = std::time::Instant::now();
        let out = weir_check(&path);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{stderr}"
        );
        assert!(!out.status.success(), "{stderr}");
        let field = "listeners[0].tls.certs[0].cert";
        let shown = path.display().to_string();
        let (_, message) = assert_located(&shown, &stderr, certs_line(&text), field);
        let said = format!(
            "{}: cannot read it: it is not a regular file {what}",
            cert.display()
        );
        assert!(message.contains(&said), "{stderr}");
        assert!(
            message.contains("(fix: give the path of a regular file"),
            "{stderr}"
        );
    }
}

/// `weir check -c FILE | head -1`: a reader that closed its end before the report was
/// written is no error and no panic ("failed printing to stdout: Broken pipe").
#[test]
fn a_closed_stdout_is_a_quiet_exit() {
    use std::process::{Command, Stdio};
    let dir = TempDir::new("check-pipe");
    let path = dir.write("good.toml", GOOD);
    let mut child = Command::new(support_process::WEIR)
        .args(["check", "-c"])
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn weir check");
    // The read end closes before the config is even read: the write meets EPIPE.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("weir check ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.trim().is_empty(), "nothing on stderr: {stderr}");
}
