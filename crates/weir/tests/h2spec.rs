//! h2spec (strict) against an h2c listener and a TLS listener (ALPN h2) whose route goes
//! to an HTTP/1.1 upstream.
//!
//! Runs when the h2spec binary is found: `WEIR_H2SPEC`, else `$HOME/go/bin/h2spec`
//! (`GOBIN=$HOME/go/bin go install github.com/summerwind/h2spec/cmd/h2spec@latest`).
//! Without it the test prints that it was skipped and passes.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::single;
use weir_testkit::certs::TestCa;
use weir_testkit::Backend;

fn h2spec_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("WEIR_H2SPEC") {
        return Some(PathBuf::from(path));
    }
    let home = std::env::var_os("HOME")?;
    let path = PathBuf::from(home).join("go/bin/h2spec");
    path.is_file().then_some(path)
}

/// (tests, passed, skipped, failed) from h2spec's last line.
fn summary(output: &str) -> Option<(u32, u32, u32, u32)> {
    let line = output.lines().rev().find(|l| l.contains(" tests, "))?;
    let numbers: Vec<u32> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    match numbers[..] {
        [tests, passed, skipped, failed] => Some((tests, passed, skipped, failed)),
        _ => None,
    }
}

/// Runs h2spec strict against `weir` (over TLS with `-t -k` when `tls`) and asserts that
/// every case passed and that requests reached `backend`.
fn run_strict(binary: &PathBuf, weir: &common::Weir, backend: &Backend, tls: bool) {
    let port = weir.addr.port().to_string();
    // `-o 10`: each case waits for Weir's answer (2 s by default, which a starved CI
    // runner can overrun); no case passes by timing out, so a passing run is not slower.
    let mut args = vec!["-S", "-o", "10", "-h", "127.0.0.1", "-p", &port];
    if tls {
        args.extend(["-t", "-k"]);
    }
    let output = Command::new(binary)
        .args(&args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", binary.display()));
    let text = String::from_utf8_lossy(&output.stdout);
    let (tests, passed, skipped, failed) =
        summary(&text).unwrap_or_else(|| panic!("no h2spec summary in:\n{text}"));
    eprintln!(
        "h2spec {}: {tests} tests, {passed} passed, {skipped} skipped, {failed} failed",
        args.join(" ")
    );
    assert!(tests > 100, "{text}");
    assert_eq!(failed, 0, "{text}");
    assert!(
        backend.requests_served() > 0,
        "h2spec's requests reached the upstream"
    );
}

fn skipped(test: &str) {
    // `.ci/run` sets it when go is there to install h2spec: a missing binary is then a bug.
    assert!(
        std::env::var_os("WEIR_REQUIRE_H2SPEC").is_none(),
        "{test}: WEIR_REQUIRE_H2SPEC is set but there is no h2spec binary"
    );
    eprintln!("SKIPPED {test}: no h2spec binary (set WEIR_H2SPEC or install it to $HOME/go/bin)");
}

#[test]
fn h2spec_strict_passes_on_an_h2c_listener() {
    let Some(binary) = h2spec_binary() else {
        return skipped("h2spec_strict_passes_on_an_h2c_listener");
    };
    let backend = Backend::echo("e");
    let weir = single(backend.addr()).start();
    run_strict(&binary, &weir, &backend, false);
}

#[test]
fn h2spec_strict_passes_on_a_tls_listener_through_alpn_h2() {
    let Some(binary) = h2spec_binary() else {
        return skipped("h2spec_strict_passes_on_a_tls_listener_through_alpn_h2");
    };
    let ca = TestCa::new("h2spec CA");
    let leaf = ca.leaf(&["localhost"]);
    let backend = Backend::echo("e");
    let weir = single(backend.addr())
        .listener(&format!(
            "[listeners.tls]\ncerts = [{{ cert = \"{}\", key = \"{}\" }}]",
            leaf.cert_path.display(),
            leaf.key_path.display()
        ))
        .start();
    run_strict(&binary, &weir, &backend, true);
}
