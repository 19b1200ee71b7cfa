//! Pool settings: defaults, every policy, and one failing case (or more) per rule.

use std::time::Duration;

use crate::tests::fail;
use crate::{parse_str, HashKey, HealthCheckKind, LbPolicy, RetryOn, StatusRange, Upstream};

/// A valid listener on lines 1-3, then `[upstreams.u]` on line 4 and `lines` from line 5.
fn pool(lines: &str) -> String {
    format!("[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\n[upstreams.u]\n{lines}")
}

const TWO: &str = "servers = [{ addr = \"10.0.0.1:80\" }, { addr = \"10.0.0.2:80\" }]\n";

#[track_caller]
fn parse(lines: &str) -> Upstream {
    match parse_str(&pool(lines), "weir.toml") {
        Ok(mut c) => c.upstreams.remove(0),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// Asserts the error's field and line, and that message and fix say something useful.
#[track_caller]
fn check(lines: &str, field: &str, line: usize, message: &str, fix: &str) {
    let e = fail(&pool(lines));
    assert_eq!((e.field.as_str(), e.line), (field, line), "{e}");
    assert!(e.message.contains(message), "message of: {e}");
    assert!(e.fix.contains(fix), "fix of: {e}");
}

#[test]
fn defaults() {
    let u = parse(TWO);
    assert_eq!(u.lb, LbPolicy::RoundRobin);
    assert_eq!(u.health_check, None);
    assert_eq!(u.passive.max_fails, 1);
    assert_eq!(u.passive.fail_timeout, Duration::from_secs(10));
    assert_eq!(u.passive.slow_start, Duration::from_secs(10));
    assert_eq!(u.retry.attempts, 1);
    assert!(u.retry.on.connect_error && u.retry.on.reset_before_response);
    assert!(!u.retry.on.timeout && u.retry.on.statuses.is_empty());
    assert_eq!(u.retry.budget_percent, 20);
    let s = &u.servers[0];
    assert_eq!((s.weight, s.max_connections, s.backup), (1, None, false));
}

#[test]
fn every_policy_parses() {
    let cases = [
        ("round_robin", LbPolicy::RoundRobin),
        ("weighted_round_robin", LbPolicy::WeightedRoundRobin),
        ("least_connections", LbPolicy::LeastConnections),
        ("random", LbPolicy::Random),
        ("p2c_ewma", LbPolicy::P2cEwma),
        (
            "consistent_hash",
            LbPolicy::ConsistentHash(HashKey::ClientIp),
        ),
        (
            "sticky_cookie",
            LbPolicy::StickyCookie {
                cookie: "weir_server".into(),
            },
        ),
    ];
    for (text, policy) in cases {
        assert_eq!(
            parse(&format!("{TWO}lb = \"{text}\"\n")).lb,
            policy,
            "{text}"
        );
    }
    let keys = [
        ("client_ip", HashKey::ClientIp),
        ("path", HashKey::Path),
        ("header:X-User", HashKey::Header("x-user".into())),
        ("cookie:session", HashKey::Cookie("session".into())),
    ];
    for (text, key) in keys {
        let u = parse(&format!(
            "{TWO}lb = \"consistent_hash\"\nhash_key = \"{text}\"\n"
        ));
        assert_eq!(u.lb, LbPolicy::ConsistentHash(key), "{text}");
    }
    let u = parse(&format!(
        "{TWO}lb = \"sticky_cookie\"\nsticky_cookie = \"srv\"\n"
    ));
    assert_eq!(
        u.lb,
        LbPolicy::StickyCookie {
            cookie: "srv".into()
        }
    );
}

#[test]
fn policy_errors() {
    check(
        &format!("{TWO}lb = \"wrr\"\n"),
        "upstreams.u.lb",
        6,
        "did you mean \"weighted_round_robin\"",
        "\"p2c_ewma\"",
    );
    check(
        &format!("{TWO}lb = \"fastest\"\n"),
        "upstreams.u.lb",
        6,
        "unknown load-balancing policy \"fastest\"",
        "round_robin",
    );
    check(
        &format!("{TWO}hash_key = \"path\"\n"),
        "upstreams.u.hash_key",
        6,
        "only applies to lb = \"consistent_hash\"",
        "remove hash_key",
    );
    check(
        &format!("{TWO}lb = \"consistent_hash\"\nhash_key = \"ip\"\n"),
        "upstreams.u.hash_key",
        7,
        "unknown hash_key \"ip\"",
        "\"header:NAME\"",
    );
    check(
        &format!("{TWO}lb = \"consistent_hash\"\nhash_key = \"header:\"\n"),
        "upstreams.u.hash_key",
        7,
        "not a valid header or cookie name",
        "header:X-User",
    );
    check(
        &format!("{TWO}sticky_cookie = \"s\"\n"),
        "upstreams.u.sticky_cookie",
        6,
        "only applies to lb = \"sticky_cookie\"",
        "set lb = \"sticky_cookie\"",
    );
    check(
        &format!("{TWO}lb = \"sticky_cookie\"\nsticky_cookie = \"a b\"\n"),
        "upstreams.u.sticky_cookie",
        7,
        "not a valid cookie name",
        "weir_server",
    );
}

#[test]
fn server_options() {
    let u = parse(
        "lb = \"weighted_round_robin\"\nservers = [\n  { addr = \"10.0.0.1:80\", weight = 10 },\n  \
         { addr = \"10.0.0.2:80\", weight = 5, max_connections = 100 },\n  \
         { addr = \"10.0.0.3:80\", backup = true },\n]\n",
    );
    let opts: Vec<_> = u
        .servers
        .iter()
        .map(|s| (s.weight, s.max_connections, s.backup))
        .collect();
    assert_eq!(
        opts,
        [(10, None, false), (5, Some(100), false), (1, None, true)]
    );
    let w = "upstreams.u.servers[0].weight";
    check(
        "servers = [{ addr = \"10.0.0.1:80\", weight = 2 }]\n",
        w,
        5,
        "weight has no effect",
        "lb = \"weighted_round_robin\"",
    );
    check(
        "lb = \"random\"\nservers = [{ addr = \"10.0.0.1:80\", weight = 0 }]\n",
        w,
        6,
        "between 1 and 1000, not 0",
        "default 1",
    );
    check(
        "servers = [{ addr = \"10.0.0.1:80\", max_connections = 0 }]\n",
        "upstreams.u.servers[0].max_connections",
        5,
        "from 1 to 4294967295, not 0",
        "remove it (unlimited)",
    );
    check(
        "servers = [{ addr = \"10.0.0.1:80\", backup = true }]\n",
        "upstreams.u.servers",
        5,
        "every server is a backup",
        "at least one server",
    );
}

#[test]
fn health_check_defaults_and_values() {
    let u = parse(&format!("{TWO}[upstreams.u.health_check]\n"));
    let h = u.health_check.expect("health check");
    assert_eq!(
        h.kind,
        HealthCheckKind::Http {
            path: "/".into(),
            expect_status: vec![StatusRange {
                first: 200,
                last: 399
            }],
        }
    );
    assert_eq!(
        (h.interval, h.timeout),
        (Duration::from_secs(2), Duration::from_secs(1))
    );
    assert_eq!((h.rise, h.fall), (2, 3));

    let u = parse(&format!(
        "{TWO}[upstreams.u.health_check]\nkind = \"http\"\npath = \"/healthz?x=1\"\n\
         expect_status = \"200, 204,300-302\"\ninterval = \"3s\"\ntimeout = \"1000ms\"\nrise = 1\nfall = 5\n"
    ));
    let h = u.health_check.expect("health check");
    let HealthCheckKind::Http {
        path,
        expect_status,
    } = h.kind
    else {
        panic!("http check expected")
    };
    assert_eq!(path, "/healthz?x=1");
    let codes: Vec<(u16, u16)> = expect_status.iter().map(|r| (r.first, r.last)).collect();
    assert_eq!(codes, [(200, 200), (204, 204), (300, 302)]);
    assert_eq!((h.rise, h.fall, h.interval), (1, 5, Duration::from_secs(3)));

    let u = parse(&format!(
        "{TWO}[upstreams.u.health_check]\nkind = \"tcp\"\n"
    ));
    assert_eq!(u.health_check.map(|h| h.kind), Some(HealthCheckKind::Tcp));
    let u = parse(&format!(
        "{TWO}[upstreams.u.health_check]\nexpect_status = 204\n"
    ));
    assert!(matches!(
        u.health_check.map(|h| h.kind),
        Some(HealthCheckKind::Http { expect_status, .. }) if expect_status[0].contains(204)
    ));
}

#[test]
fn health_check_errors() {
    let h = |lines: &str| format!("{TWO}[upstreams.u.health_check]\n{lines}\n");
    let f = |k: &str| format!("upstreams.u.health_check.{k}");
    check(
        &h("kind = \"icmp\""),
        &f("kind"),
        7,
        "unknown health check kind",
        "\"tcp\"",
    );
    check(
        &h("kind = \"tcp\"\npath = \"/\""),
        &f("path"),
        8,
        "only applies to kind = \"http\"",
        "remove path",
    );
    check(
        &h("path = \"healthz\""),
        &f("path"),
        7,
        "must start with '/'",
        "/healthz",
    );
    check(
        &h("expect_status = \"2xx\""),
        &f("expect_status"),
        7,
        "\"2xx\" is not a status code",
        "200-399",
    );
    check(
        &h("expect_status = \"399-200\""),
        &f("expect_status"),
        7,
        "backwards",
        "200-399",
    );
    check(
        &h("interval = \"0s\""),
        &f("interval"),
        7,
        "greater than 0",
        "\"2s\"",
    );
    check(
        &h("timeout = \"1\""),
        &f("timeout"),
        7,
        "has no unit",
        "\"1s\"",
    );
    check(
        &h("rise = 0"),
        &f("rise"),
        7,
        "between 1 and 100, not 0",
        "default 2",
    );
    check(&h("fall = 101"), &f("fall"), 7, "not 101", "default 3");
    check(
        &h("interval = 3"),
        &f("interval"),
        7,
        "expected a string",
        "double quotes",
    );
}

#[test]
fn passive_and_retry() {
    let u = parse(&format!(
        "{TWO}[upstreams.u.passive]\nmax_fails = 3\nfail_timeout = \"30s\"\n\
         [upstreams.u.retry]\nattempts = 2\non = [\"connect_error\", \"502\", 503, \"timeout\"]\n\
         budget_percent = 10\n"
    ));
    assert_eq!(u.passive.max_fails, 3);
    assert_eq!(u.passive.fail_timeout, Duration::from_secs(30));
    assert_eq!(
        u.passive.slow_start,
        Duration::from_secs(30),
        "defaults to fail_timeout"
    );
    assert_eq!(u.retry.attempts, 2);
    assert_eq!(
        u.retry.on,
        RetryOn {
            connect_error: true,
            reset_before_response: false,
            timeout: true,
            statuses: vec![502, 503],
        }
    );
    assert_eq!(u.retry.budget_percent, 10);
    let u = parse(&format!(
        "{TWO}[upstreams.u.passive]\nmax_fails = 0\nslow_start = \"0s\"\n[upstreams.u.retry]\nattempts = 0\non = []\n"
    ));
    assert_eq!(
        (u.passive.max_fails, u.passive.slow_start),
        (0, Duration::ZERO)
    );
    assert_eq!(u.retry.attempts, 0);

    let p = |lines: &str| format!("{TWO}[upstreams.u.passive]\n{lines}\n");
    let r = |lines: &str| format!("{TWO}[upstreams.u.retry]\n{lines}\n");
    check(
        &p("max_fails = -1"),
        "upstreams.u.passive.max_fails",
        7,
        "between 0 and 1000",
        "default 1",
    );
    check(
        &p("fail_timeout = \"0s\""),
        "upstreams.u.passive.fail_timeout",
        7,
        "greater than 0",
        "\"10s\"",
    );
    check(
        &r("attempts = 11"),
        "upstreams.u.retry.attempts",
        7,
        "between 0 and 10",
        "default 1",
    );
    check(
        &r("on = [\"connect_error\", \"404\"]"),
        "upstreams.u.retry.on[1]",
        7,
        "unknown retry condition \"404\"",
        "\"502\"",
    );
    check(
        &r("on = []"),
        "upstreams.u.retry.on",
        7,
        "nothing would be retried",
        "attempts = 0",
    );
    check(
        &r("budget_percent = 0"),
        "upstreams.u.retry.budget_percent",
        7,
        "between 1 and 100",
        "default 20",
    );
    check(
        &r("tries = 1"),
        "upstreams.u.retry.tries",
        7,
        "unknown field",
        "spelling",
    );
}

/// Every TOML example in docs/load-balancing.md is valid (the first is an upstream table
/// only, and gets a listener and route in front).
#[test]
fn load_balancing_doc_examples_are_valid() {
    let doc = include_str!("../../../../../docs/load-balancing.md");
    let blocks: Vec<&str> = doc
        .split("```toml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .collect();
    assert!(blocks.len() >= 3, "found {} examples", blocks.len());
    for (i, block) in blocks.iter().enumerate() {
        let text = if i == 0 {
            format!(
                "[[listeners]]\nname = \"w\"\nbind = \"127.0.0.1:8080\"\n\
                 [[listeners.routes]]\nname = \"r\"\nupstream = \"app\"\n{block}"
            )
        } else {
            block.to_string()
        };
        if let Err(e) = parse_str(&text, "load-balancing.md") {
            panic!("example {i} is invalid: {e}\n{text}");
        }
    }
}

#[test]
fn grpc_health_checks() {
    let grpc =
        |lines: &str| format!("protocol = \"h2c\"\n{TWO}[upstreams.u.health_check]\n{lines}\n");
    let u = parse(&grpc("kind = \"grpc\""));
    let kind = u.health_check.map(|h| h.kind);
    assert_eq!(
        kind,
        Some(HealthCheckKind::Grpc {
            service: String::new()
        })
    );
    let u = parse(&grpc("kind = \"grpc\"\nservice = \"app.v1.Orders\""));
    let kind = u.health_check.map(|h| h.kind);
    let service = "app.v1.Orders".to_owned();
    assert_eq!(kind, Some(HealthCheckKind::Grpc { service }));
    let f = |k: &str| format!("upstreams.u.health_check.{k}");
    check(
        &grpc("kind = \"grpc\"\nservice = \"a b\""),
        &f("service"),
        9,
        "not a gRPC service name",
        "my.package.MyService",
    );
    check(
        &grpc("kind = \"grpc\"\npath = \"/\""),
        &f("path"),
        9,
        "only applies to kind = \"http\"",
        "remove path",
    );
    check(
        &grpc("service = \"x\""),
        &f("service"),
        8,
        "only applies to kind = \"grpc\"",
        "remove service",
    );
    check(
        &grpc("kind = \"tcp\"\nservice = \"x\""),
        &f("service"),
        9,
        "not \"tcp\"",
        "kind = \"grpc\"",
    );
    // gRPC needs an HTTP/2 upstream.
    let http1 = format!("{TWO}[upstreams.u.health_check]\nkind = \"grpc\"\n");
    check(&http1, &f("kind"), 7, "speak HTTP/2", "protocol = \"h2c\"");
}
