//! Router precedence: the most specific host, exact paths, longest prefix, then conditions
//! in file order.

use weir_config::{HostPattern, MatchValue, Route, RouteMatch, RouteTarget};

use super::*;
use crate::codec::http1::{parse_request, HeadLimits, RequestHead};

fn route(name: &str, hosts: Vec<HostPattern>, prefix: &str) -> Route {
    Route {
        name: name.into(),
        hosts,
        path_prefix: prefix.into(),
        rewrite_prefix: None,
        reverse_rewrite: false,
        preserve_host: true,
        forwarded_headers: true,
        upgrades: vec![],
        matching: RouteMatch::default(),
        target: RouteTarget::Upstream(0),
        split_fallback: true,
        filters: Default::default(),
        trace_sampling: None,
    }
}

fn with(mut r: Route, f: impl FnOnce(&mut RouteMatch)) -> Route {
    f(&mut r.matching);
    r
}

/// Routes the request whose head is `head` (request line and headers, no final CRLF).
fn route_head(r: &Router, head: &str) -> Option<usize> {
    let buf = format!("{head}\r\n\r\n").into_bytes();
    let mut parsed = RequestHead::default();
    let limits = HeadLimits {
        max_header_size: 16 * 1024,
        max_headers: 100,
    };
    assert!(parse_request(&buf, limits, &mut parsed).expect("valid head"));
    let view = RequestView::new(&buf, &parsed);
    r.route(parsed.host_name(&buf), parsed.path(&buf), &view)
}

/// Routes `GET path` with `Host: host` (HTTP/1.0 without Host when `host` is empty).
fn at(r: &Router, host: &str, path: &str) -> Option<usize> {
    if host.is_empty() {
        route_head(r, &format!("GET {path} HTTP/1.0"))
    } else {
        route_head(r, &format!("GET {path} HTTP/1.1\r\nHost: {host}"))
    }
}

#[test]
fn longest_prefix_then_most_specific_host() {
    let routes = vec![
        route("any-root", vec![HostPattern::Any], "/"),
        route("any-api", vec![HostPattern::Any], "/api/"),
        route(
            "wild-api",
            vec![HostPattern::Suffix(".example.com".into())],
            "/api/",
        ),
        route(
            "exact-api",
            vec![HostPattern::Exact("a.example.com".into())],
            "/api/",
        ),
        route("cgi", vec![HostPattern::Any], "/cgi/"),
    ];
    let r = Router::new(&routes);
    assert_eq!(at(&r, "x", "/index.html"), Some(0));
    assert_eq!(at(&r, "x", "/api/v1"), Some(1));
    assert_eq!(at(&r, "b.EXAMPLE.com", "/api/v1"), Some(2));
    assert_eq!(at(&r, "A.example.com", "/api/v1"), Some(3));
    assert_eq!(at(&r, "example.com", "/api/v1"), Some(1));
    assert_eq!(at(&r, "x", "/cgi/x"), Some(4));
    assert_eq!(at(&r, "x", "/cgi"), Some(0));
}

/// A route written for a host wins over a wildcard route with a longer prefix (the host's
/// `deny` or `basic_auth` is not skipped for `/static/`), as nginx picks a server by name
/// before its locations; the host falls through to the wildcard routes only for what none
/// of its own routes take.
#[test]
fn the_most_specific_host_comes_before_a_longer_prefix() {
    let routes = vec![
        route("any-static", vec![HostPattern::Any], "/static/"),
        route(
            "secret",
            vec![HostPattern::Exact("secret.test".into())],
            "/",
        ),
        route(
            "subdomains-api",
            vec![HostPattern::Suffix(".secret.test".into())],
            "/api/",
        ),
        with(
            route("any-exact", vec![HostPattern::Any], "/api/ping"),
            |m| m.exact = true,
        ),
        route("any-root", vec![HostPattern::Any], "/"),
    ];
    let r = Router::new(&routes);
    assert_eq!(at(&r, "secret.test", "/static/x"), Some(1));
    assert_eq!(at(&r, "SECRET.test", "/static/x?a=1"), Some(1));
    assert_eq!(at(&r, "other.test", "/static/x"), Some(0));
    assert_eq!(
        at(&r, "a.secret.test", "/api/ping"),
        Some(2),
        "host, then exact"
    );
    assert_eq!(
        at(&r, "a.secret.test", "/static/x"),
        Some(0),
        "falls through"
    );
    assert_eq!(at(&r, "other.test", "/api/ping"), Some(3));
    assert_eq!(at(&r, "other.test", "/api/pingx"), Some(4));
}

#[test]
fn no_match_without_catch_all() {
    let r = Router::new(&[route("a", vec![HostPattern::Exact("a.test".into())], "/")]);
    assert_eq!(at(&r, "b.test", "/"), None);
    assert_eq!(at(&r, "", "/"), None);
    assert_eq!(at(&Router::new(&[]), "a", "/"), None);
}

#[test]
fn exact_paths_come_before_every_prefix() {
    let routes = vec![
        route("long-prefix", vec![HostPattern::Any], "/ping/deeper"),
        route("prefix", vec![HostPattern::Any], "/ping"),
        with(route("exact", vec![HostPattern::Any], "/ping"), |m| {
            m.exact = true
        }),
        with(
            route(
                "exact-host",
                vec![HostPattern::Exact("a.test".into())],
                "/ping",
            ),
            |m| m.exact = true,
        ),
    ];
    let r = Router::new(&routes);
    assert_eq!(at(&r, "x", "/ping"), Some(2));
    assert_eq!(
        at(&r, "x", "/ping?a=1"),
        Some(2),
        "the query is not part of the path"
    );
    assert_eq!(
        at(&r, "a.test", "/ping"),
        Some(3),
        "more specific host first"
    );
    assert_eq!(at(&r, "x", "/ping/"), Some(1), "not exact: prefix");
    assert_eq!(at(&r, "x", "/pingx"), Some(1));
    assert_eq!(at(&r, "x", "/ping/deeper/x"), Some(0));
    assert_eq!(at(&r, "x", "/pin"), None);
}

#[test]
fn methods_fall_through_to_the_next_route() {
    let routes = vec![
        with(route("writes", vec![HostPattern::Any], "/api/"), |m| {
            m.methods = vec!["POST".into(), "PUT".into()]
        }),
        with(route("reads", vec![HostPattern::Any], "/api/"), |m| {
            m.methods = vec!["GET".into()]
        }),
        route("api", vec![HostPattern::Any], "/api/"),
    ];
    let r = Router::new(&routes);
    let m = |method: &str| route_head(&r, &format!("{method} /api/x HTTP/1.1\r\nHost: h"));
    assert_eq!(m("POST"), Some(0));
    assert_eq!(m("PUT"), Some(0));
    assert_eq!(m("GET"), Some(1));
    assert_eq!(m("DELETE"), Some(2));
    assert_eq!(m("OPTIONS"), Some(2));
}

#[test]
fn headers_match_by_exact_value_or_presence() {
    let routes = vec![
        with(route("canary", vec![HostPattern::Any], "/"), |m| {
            m.headers = vec![("x-canary".into(), MatchValue::Exact("1".into()))]
        }),
        with(route("debug", vec![HostPattern::Any], "/"), |m| {
            m.headers = vec![("x-debug".into(), MatchValue::Present)]
        }),
        route("rest", vec![HostPattern::Any], "/"),
    ];
    let r = Router::new(&routes);
    let h = |headers: &str| route_head(&r, &format!("GET / HTTP/1.1\r\nHost: h{headers}"));
    assert_eq!(h("\r\nX-Canary: 1"), Some(0));
    assert_eq!(h("\r\nx-CANARY: 1"), Some(0), "names are case-insensitive");
    assert_eq!(h("\r\nX-Canary: 2"), Some(2));
    assert_eq!(h("\r\nX-Canary: 10"), Some(2), "exact, not a prefix");
    assert_eq!(
        h("\r\nX-Canary: 2\r\nX-Canary: 1"),
        Some(0),
        "any of the fields"
    );
    assert_eq!(h("\r\nX-Debug: "), Some(1), "present, even empty");
    assert_eq!(h("\r\nX-Debug: yes"), Some(1));
    assert_eq!(h(""), Some(2));
}

#[test]
fn query_parameters_match() {
    let routes = vec![
        with(route("both", vec![HostPattern::Any], "/"), |m| {
            m.query = vec![
                ("beta".into(), MatchValue::Exact("true".into())),
                ("v".into(), MatchValue::Present),
            ]
        }),
        with(route("beta", vec![HostPattern::Any], "/"), |m| {
            m.query = vec![("beta".into(), MatchValue::Exact("true".into()))]
        }),
        route("rest", vec![HostPattern::Any], "/"),
    ];
    let r = Router::new(&routes);
    assert_eq!(at(&r, "h", "/x?beta=true&v"), Some(0));
    assert_eq!(at(&r, "h", "/x?v=2&beta=true"), Some(0));
    assert_eq!(at(&r, "h", "/x?beta=true"), Some(1));
    assert_eq!(at(&r, "h", "/x?a=1&beta=true&b"), Some(1));
    assert_eq!(at(&r, "h", "/x?beta=truex"), Some(2));
    assert_eq!(at(&r, "h", "/x?xbeta=true"), Some(2));
    assert_eq!(at(&r, "h", "/x?beta=%74rue"), Some(1), "decoded");
    assert_eq!(at(&r, "h", "/x?beta=%74ru"), Some(2));
    assert_eq!(at(&r, "h", "/x"), Some(2));
}

fn guarded_admin() -> Router {
    let routes = vec![
        with(route("admin", vec![HostPattern::Any], "/"), |m| {
            m.query = vec![("admin".into(), MatchValue::Exact("1".into()))]
        }),
        route("rest", vec![HostPattern::Any], "/"),
    ];
    Router::new(&routes)
}

#[test]
fn query_conditions_are_not_bypassed_by_percent_encoding() {
    let r = guarded_admin();
    let plain = "admin=1";
    // Every byte of the pair escaped on its own, in upper and lower case hex (except the
    // `=`: an escaped `=` is data, not the separator, as backends read it).
    for i in 0..plain.len() {
        if i == 5 {
            continue;
        }
        for escaped in [
            format!("%{:02X}", plain.as_bytes()[i]),
            format!("%{:02x}", plain.as_bytes()[i]),
        ] {
            let q = format!("{}{escaped}{}", &plain[..i], &plain[i + 1..]);
            assert_eq!(at(&r, "h", &format!("/x?{q}")), Some(0), "{q}");
            assert_eq!(at(&r, "h", &format!("/x?a=b&{q}&c")), Some(0), "{q}");
        }
    }
    assert_eq!(
        at(&r, "h", "/x?%61%64%6D%69%6E=%31"),
        Some(0),
        "all escaped"
    );
    assert_eq!(at(&r, "h", "/x?admin%3D1"), Some(1), "an escaped = is data");
    assert_eq!(at(&r, "h", "/x?admin=%312"), Some(1), "decodes to 12");
}

#[test]
fn query_conditions_treat_plus_as_space_and_malformed_escapes_as_no_match() {
    let routes = vec![
        with(route("q", vec![HostPattern::Any], "/"), |m| {
            m.query = vec![("q".into(), MatchValue::Exact("a b".into()))]
        }),
        with(route("encoded", vec![HostPattern::Any], "/"), |m| {
            // Written as in a URL: decoded once when the router is built.
            m.query = vec![("p".into(), MatchValue::Exact("100%25+x".into()))]
        }),
        with(route("literal", vec![HostPattern::Any], "/"), |m| {
            m.query = vec![("r".into(), MatchValue::Exact("5%".into()))]
        }),
        route("rest", vec![HostPattern::Any], "/"),
    ];
    let r = Router::new(&routes);
    assert_eq!(at(&r, "h", "/x?q=a+b"), Some(0));
    assert_eq!(at(&r, "h", "/x?q=a%20b"), Some(0));
    assert_eq!(at(&r, "h", "/x?q=a%2Bb"), Some(3), "an escaped + is a plus");
    assert_eq!(at(&r, "h", "/x?p=100%25%20x"), Some(1));
    assert_eq!(at(&r, "h", "/x?p=100%+x"), Some(3), "malformed");
    assert_eq!(at(&r, "h", "/x?r=5%25"), Some(2));
    for bad in ["/x?r=5%", "/x?r=5%2", "/x?r=5%zz", "/x?%7=1&r=5%g5"] {
        assert_eq!(at(&r, "h", bad), Some(3), "{bad}");
    }
}

#[test]
fn conditions_combine_and_respect_host_and_prefix_first() {
    let routes = vec![
        route(
            "other-host",
            vec![HostPattern::Exact("b.test".into())],
            "/api/",
        ),
        with(route("canary", vec![HostPattern::Any], "/api/"), |m| {
            m.methods = vec!["GET".into()];
            m.headers = vec![("x-canary".into(), MatchValue::Present)];
            m.query = vec![("beta".into(), MatchValue::Exact("1".into()))];
        }),
        route("api", vec![HostPattern::Any], "/api/"),
        with(route("deeper", vec![HostPattern::Any], "/api/v2/"), |m| {
            m.methods = vec!["POST".into()]
        }),
    ];
    let r = Router::new(&routes);
    let go = |line: &str, host: &str, extra: &str| {
        route_head(&r, &format!("{line} HTTP/1.1\r\nHost: {host}{extra}"))
    };
    assert_eq!(
        go("GET /api/x?beta=1", "a.test", "\r\nX-Canary: y"),
        Some(1)
    );
    assert_eq!(
        go("POST /api/x?beta=1", "a.test", "\r\nX-Canary: y"),
        Some(2)
    );
    assert_eq!(
        go("GET /api/x?beta=2", "a.test", "\r\nX-Canary: y"),
        Some(2)
    );
    assert_eq!(go("GET /api/x?beta=1", "a.test", ""), Some(2));
    // An exact host at the same prefix is more specific than any condition.
    assert_eq!(
        go("GET /api/x?beta=1", "b.test", "\r\nX-Canary: y"),
        Some(0)
    );
    // A longer prefix whose conditions fail falls back to the shorter prefix.
    assert_eq!(go("GET /api/v2/x", "a.test", ""), Some(2));
    assert_eq!(go("POST /api/v2/x", "a.test", ""), Some(3));
}
