//! The certificate store: choosing by SNI, and rejecting unusable files with their reason.

use super::*;
use weir_testkit::certs::{Leaf, LeafOptions, TestCa};

fn provider() -> CryptoProvider {
    rustls::crypto::aws_lc_rs::default_provider()
}

fn files(leaf: &Leaf) -> CertKey {
    CertKey {
        cert: leaf.cert_path.clone(),
        key: leaf.key_path.clone(),
    }
}

fn loaded(leaf: &Leaf) -> LoadedCert {
    load(&files(leaf), &provider(), super::super::facts::unix_now()).expect("usable certificate")
}

/// Three certificates: an exact name, a wildcard, and one with both kinds of name.
fn three(ca: &TestCa) -> CertStore {
    let a = ca.leaf(&["a.example.com"]);
    let wild = ca.leaf(&["*.example.net"]);
    let c = ca.leaf(&["c.example.org", "exact.example.net"]);
    CertStore::new(vec![loaded(&a), loaded(&wild), loaded(&c)], 0)
}

#[test]
fn chooses_by_sni_among_three_with_a_wildcard() {
    let ca = TestCa::new("store CA");
    let store = three(&ca);
    assert_eq!(store.choose(Some("a.example.com")), 0);
    assert_eq!(store.choose(Some("x.example.net")), 1);
    assert_eq!(store.choose(Some("c.example.org")), 2);
    assert_eq!(
        store.choose(Some("A.Example.COM")),
        0,
        "names are case-insensitive"
    );
    assert_eq!(
        store.choose(Some("a.example.com.")),
        0,
        "a trailing dot is the same name"
    );
    assert_eq!(store.certs()[1].facts.names, vec!["*.example.net"]);
}

#[test]
fn exact_name_beats_wildcard_and_wildcard_covers_one_label() {
    let ca = TestCa::new("store CA");
    let store = three(&ca);
    assert_eq!(store.choose(Some("exact.example.net")), 2);
    assert_eq!(store.choose(Some("example.net")), 0, "not covered: default");
    assert_eq!(
        store.choose(Some("a.b.example.net")),
        0,
        "two labels: default"
    );
}

#[test]
fn no_sni_or_unknown_name_gets_the_default() {
    let ca = TestCa::new("store CA");
    let a = ca.leaf(&["a.example.com"]);
    let b = ca.leaf(&["b.example.com"]);
    let store = CertStore::new(vec![loaded(&a), loaded(&b)], 1);
    assert_eq!(store.choose(None), 1);
    assert_eq!(store.choose(Some("unknown.example.org")), 1);
    assert_eq!(store.choose(Some("a.example.com")), 0);
    let first = CertStore::new(vec![loaded(&a), loaded(&b)], 0);
    assert_eq!(first.choose(None), 0);
}

#[test]
fn facts_name_the_certificate() {
    let ca = TestCa::new("Facts CA");
    let leaf = ca.leaf(&["f.example.com", "*.g.example.com"]);
    let cert = loaded(&leaf);
    assert_eq!(cert.facts.names, vec!["f.example.com", "*.g.example.com"]);
    assert!(
        cert.facts.issuer.contains("Facts CA"),
        "{}",
        cert.facts.issuer
    );
    assert!(
        cert.facts.subject.contains("f.example.com"),
        "{}",
        cert.facts.subject
    );
    let in_a_year = super::super::facts::unix_now() + 365 * 86_400;
    assert!((cert.facts.not_after - in_a_year).abs() < 86_400);
    assert_eq!(cert.facts.sha256.len(), 64);
    assert_eq!(cert.file, leaf.cert_path);
}

#[test]
fn a_key_that_does_not_match_is_rejected_naming_the_key_file() {
    let ca = TestCa::new("store CA");
    let a = ca.leaf(&["a.example.com"]);
    let b = ca.leaf(&["b.example.com"]);
    let mixed = CertKey {
        cert: a.cert_path.clone(),
        key: b.key_path.clone(),
    };
    let err = load(&mixed, &provider(), 0).expect_err("mismatched key");
    assert_eq!(err.file, b.key_path);
    assert!(err.reason.contains("does not match"), "{err}");
}

#[test]
fn an_expired_certificate_is_rejected_with_its_expiry() {
    let ca = TestCa::new("store CA");
    let old = ca.leaf_with(
        &["old.example.com"],
        &LeafOptions {
            not_before_days: -30,
            not_after_days: -1,
            ..LeafOptions::default()
        },
    );
    let err =
        load(&files(&old), &provider(), super::super::facts::unix_now()).expect_err("expired");
    assert_eq!(err.file, old.cert_path);
    assert!(err.reason.contains("expired at 20"), "{err}");
}

#[test]
fn unreadable_empty_and_nameless_files_are_rejected_with_the_reason() {
    let ca = TestCa::new("store CA");
    let leaf = ca.leaf(&["a.example.com"]);
    let missing = CertKey {
        cert: ca.dir.path().join("missing.pem"),
        key: leaf.key_path.clone(),
    };
    let err = load(&missing, &provider(), 0).expect_err("missing");
    assert!(err.reason.contains("cannot read it"), "{err}");
    let empty = ca.dir.write("empty.pem", "");
    let err = load(
        &CertKey {
            cert: empty.clone(),
            key: leaf.key_path.clone(),
        },
        &provider(),
        0,
    )
    .expect_err("empty");
    assert_eq!(err.file, empty);
    assert!(err.reason.contains("no certificate"), "{err}");
    let no_key = CertKey {
        cert: leaf.cert_path.clone(),
        key: leaf.cert_path.clone(),
    };
    let err = load(&no_key, &provider(), 0).expect_err("no key");
    assert!(err.reason.contains("no private key"), "{err}");
    let ip_only = ca.leaf(&["127.0.0.1"]);
    let err = load(&files(&ip_only), &provider(), 0).expect_err("no DNS name");
    assert!(err.reason.contains("no DNS name"), "{err}");
}
