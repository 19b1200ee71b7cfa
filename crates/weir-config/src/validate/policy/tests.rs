//! Traffic-policy validation: what is accepted, and every rejection with its key and fix.

use crate::validate::tests::check;
use crate::{parse_str, TemplatePart, Variable};

/// A listener (lines 1-3) with one route `r` (lines 4-6, then `route_lines` from line 7).
fn with_route(route_lines: &str) -> String {
    format!(
        "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\n\
         [[listeners.routes]]\nname = \"r\"\nupstream = \"u\"\n{route_lines}\
         [upstreams.u]\nservers = [{{ addr = \"127.0.0.1:8081\" }}]\n"
    )
}

const RH: &str = "listeners[0].routes[0].request_headers";
const SH: &str = "listeners[0].routes[0].response_headers";

#[test]
fn header_rules_parse_into_templates() {
    let c = parse_str(
        &with_route(
            "request_headers = { set = { \"X-Env\" = \"prod {{x}}\", Host = \"{host}\" }, add = { \"X-Trace\" = \"{request_id}-{path}?{query}\" }, remove = [\"X-Debug\"] }\n\
             response_headers = { remove = [\"Server\"] }\n",
        ),
        "t.toml",
    )
    .unwrap();
    let f = &c.listeners[0].routes[0].filters;
    let rh = f.request_headers.as_ref().unwrap();
    assert!(rh.sets_host);
    assert_eq!(rh.drop, vec!["host", "x-env", "x-debug"]);
    assert!(rh.drops(b"X-DEBUG") && !rh.drops(b"X-Trace"));
    // `_` for `-`, as CGI and WSGI read names: X_Debug is HTTP_X_DEBUG too.
    assert!(rh.drops(b"X_Debug") && rh.drops(b"x_env") && !rh.drops(b"X_Debugs"));
    assert_eq!(
        rh.set[1].value.0,
        vec![TemplatePart::Text("prod {x}".into())]
    );
    assert_eq!(
        rh.add[0].value.0,
        vec![
            TemplatePart::Var(Variable::RequestId),
            TemplatePart::Text("-".into()),
            TemplatePart::Var(Variable::Path),
            TemplatePart::Text("?".into()),
            TemplatePart::Var(Variable::Query),
        ]
    );
    assert_eq!(f.response_headers.as_ref().unwrap().drop, vec!["server"]);
    let plain = parse_str(&with_route(""), "t.toml").unwrap();
    assert_eq!(plain.listeners[0].routes[0].filters, Default::default());
}

#[test]
fn header_rules_reject_hop_by_hop_and_framing_headers() {
    for name in [
        "Connection",
        "transfer-encoding",
        "Content-Length",
        "Upgrade",
        "TE",
        "Keep-Alive",
        "Proxy-Authorization",
        "Trailer",
    ] {
        check(
            &with_route(&format!(
                "request_headers = {{ set = {{ \"{name}\" = \"x\" }} }}\n"
            )),
            &format!("{RH}.set.{name}"),
            7,
            "hop-by-hop or framing",
            "remove the",
        );
        check(
            &with_route(&format!("response_headers = {{ remove = [\"{name}\"] }}\n")),
            &format!("{SH}.remove[0]"),
            7,
            "hop-by-hop or framing",
            "remove the",
        );
    }
}

#[test]
fn header_rules_host_only_by_request_set() {
    check(
        &with_route("request_headers = { remove = [\"host\"] }\n"),
        &format!("{RH}.remove[0]"),
        7,
        "only be replaced",
        "preserve_host",
    );
    check(
        &with_route("request_headers = { add = { Host = \"a\" } }\n"),
        &format!("{RH}.add.Host"),
        7,
        "only be replaced",
        "set =",
    );
    check(
        &with_route("response_headers = { set = { Host = \"a\" } }\n"),
        &format!("{SH}.set.Host"),
        7,
        "request header",
        "request_headers",
    );
}

#[test]
fn header_rules_leave_forwarded_headers_to_the_route() {
    check(
        &with_route("request_headers = { set = { \"X-Forwarded-For\" = \"{client_ip}\" } }\n"),
        &format!("{RH}.set.X-Forwarded-For"),
        7,
        "forwarded headers",
        "forwarded_headers = false",
    );
    let ok = with_route("forwarded_headers = false\nrequest_headers = { set = { \"X-Real-IP\" = \"{client_ip}\" } }\n");
    assert!(parse_str(&ok, "t.toml").is_ok());
}

#[test]
fn header_rules_reject_bad_names_and_values() {
    check(
        &with_route("request_headers = { set = { \"X Env\" = \"a\" } }\n"),
        &format!("{RH}.set.\"X Env\""),
        7,
        "not a header name",
        "token",
    );
    check(
        &with_route("request_headers = { set = { \"X-A\" = \"a\\r\\nX-B: b\" } }\n"),
        &format!("{RH}.set.X-A"),
        7,
        "control character",
        "visible ASCII",
    );
    check(
        &with_route("request_headers = { set = { \"X-A\" = \" a\" } }\n"),
        &format!("{RH}.set.X-A"),
        7,
        "whitespace",
        "no leading",
    );
    check(
        &with_route("request_headers = { set = { \"X-A\" = \"caf\u{e9}\" } }\n"),
        &format!("{RH}.set.X-A"),
        7,
        "non-ASCII",
        "percent-encode",
    );
    check(
        &with_route("request_headers = { set = { \"X-A\" = \"{hots}\" } }\n"),
        &format!("{RH}.set.X-A"),
        7,
        "unknown variable {hots}",
        "{host}",
    );
    check(
        &with_route("request_headers = { set = { \"X-A\" = \"{host\" } }\n"),
        &format!("{RH}.set.X-A"),
        7,
        "unclosed",
        "{{",
    );
    check(
        &with_route("request_headers = { set = { \"X-A\" = \"a}\" } }\n"),
        &format!("{RH}.set.X-A"),
        7,
        "stray",
        "}}",
    );
}

#[test]
fn header_rules_reject_contradictions() {
    check(
        &with_route("request_headers = { set = { \"X-A\" = \"1\", \"x-a\" = \"2\" } }\n"),
        &format!("{RH}.set.x-a"),
        7,
        "named twice",
        "one spelling",
    );
    check(
        &with_route("request_headers = { set = { \"X-A\" = \"1\" }, add = { \"x-a\" = \"2\" } }\n"),
        &format!("{RH}.add.x-a"),
        7,
        "both add and set",
        "one list",
    );
    check(
        &with_route("request_headers = { add = { \"X-A\" = \"1\" }, remove = [\"X-A\"] }\n"),
        &format!("{RH}.add.X-A"),
        7,
        "both add and remove",
        "one list",
    );
    check(
        &with_route("request_headers = { set = { \"X-A\" = \"1\" }, remove = [\"x-a\"] }\n"),
        &format!("{RH}.set.X-A"),
        7,
        "both set and remove",
        "one of the lists",
    );
    check(
        &with_route("response_headers = { remove = [\"A\", \"a\"] }\n"),
        &format!("{SH}.remove[1]"),
        7,
        "listed twice",
        "once",
    );
    // `_` is `-` to the backends that read header names as CGI variables.
    check(
        &with_route("response_headers = { remove = [\"X_Debug\", \"x-debug\"] }\n"),
        &format!("{SH}.remove[1]"),
        7,
        "listed twice",
        "once",
    );
    check(
        &with_route(
            "request_headers = { set = { \"X-User\" = \"a\" }, add = { \"X_User\" = \"b\" } }\n",
        ),
        &format!("{RH}.add.X_User"),
        7,
        "both add and set",
        "one list",
    );
    let many: Vec<String> = (0..65).map(|i| format!("\"X-{i}\"")).collect();
    check(
        &with_route(&format!(
            "response_headers = {{ remove = [{}] }}\n",
            many.join(",")
        )),
        &format!("{SH}.remove"),
        7,
        "more than 64",
        "short",
    );
    check(
        &with_route("response_headers = { delete = [\"A\"] }\n"),
        &format!("{SH}.delete"),
        7,
        "unknown field `delete`",
        "spelling",
    );
}

/// A listener (lines 1-3) with `listener_lines` (from line 4), then route `r` and upstream `u`.
fn with_listener(listener_lines: &str, route_lines: &str) -> String {
    format!(
        "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\n{listener_lines}\
         [[listeners.routes]]\nname = \"r\"\nupstream = \"u\"\n{route_lines}\
         [upstreams.u]\nservers = [{{ addr = \"127.0.0.1:8081\" }}]\n"
    )
}

#[test]
fn request_id_settings() {
    let id = |lines: &str| {
        parse_str(&with_listener(lines, ""), "t.toml")
            .unwrap()
            .listeners[0]
            .policy
            .request_id
            .clone()
    };
    let default = id("").unwrap();
    assert_eq!(
        (default.header.as_str(), default.trust_client),
        ("X-Request-Id", true)
    );
    assert_eq!(id("request_id = true\n"), Some(default));
    assert_eq!(id("request_id = false\n"), None);
    let custom = id("request_id = { header = \"X-Trace\", trust_client = false }\n").unwrap();
    assert_eq!(
        (custom.header.as_str(), custom.trust_client),
        ("X-Trace", false)
    );
}

#[test]
fn request_id_rejections() {
    let l = "listeners[0].request_id";
    check(
        &with_listener("request_id = { header = \"Connection\" }\n", ""),
        &format!("{l}.header"),
        4,
        "hop-by-hop",
        "remove",
    );
    check(
        &with_listener("request_id = { header = \"Host\" }\n", ""),
        &format!("{l}.header"),
        4,
        "Host",
        "X-Request-Id",
    );
    check(
        &with_listener("request_id = { header = \"X Id\" }\n", ""),
        &format!("{l}.header"),
        4,
        "not a header name",
        "token",
    );
    check(
        &with_listener("request_id = \"yes\"\n", ""),
        l,
        4,
        "true, false or a table",
        "",
    );
    check(
        &with_listener("request_id = { heder = \"X\" }\n", ""),
        &format!("{l}.heder"),
        4,
        "unknown field",
        "",
    );
    check(
        &with_listener("", "request_headers = { remove = [\"x-request-id\"] }\n"),
        "listeners[0].routes[0].request_headers",
        7,
        "carries the listener's request id",
        "request_id = false",
    );
    let ok = with_listener(
        "request_id = false\n",
        "request_headers = { set = { \"X-Request-Id\" = \"{uri}\" } }\n",
    );
    assert!(parse_str(&ok, "t.toml").is_ok());
    check(
        "[[listeners]]\nname = \"t\"\nbind = \"127.0.0.1:1\"\nprotocol = \"tcp\"\nupstream = \"u\"\nrequest_id = false\n\
         [upstreams.u]\nservers = [{ addr = \"127.0.0.1:8081\" }]\n",
        "listeners[0].request_id",
        6,
        "",
        "",
    );
}

#[test]
fn access_lists_and_trusted_proxies() {
    let c = parse_str(
        &with_listener(
            "trusted_proxies = [\"10.0.0.0/8\", \"fd00::1\"]\n",
            "allow = [\"192.168.0.0/16\", \"::1\"]\ndeny = [\"192.168.9.0/24\"]\n",
        ),
        "t.toml",
    )
    .unwrap();
    let l = &c.listeners[0];
    assert_eq!(l.policy.trusted_proxies.len(), 2);
    let access = l.routes[0].filters.access.as_ref().unwrap();
    let ok = |ip: &str| access.permits(ip.parse().unwrap());
    assert!(ok("192.168.1.1") && ok("::1") && ok("::ffff:192.168.1.1"));
    assert!(!ok("192.168.9.1") && !ok("10.0.0.1") && !ok("::2"));
    let deny_only = parse_str(&with_route("deny = [\"10.0.0.0/8\"]\n"), "t.toml").unwrap();
    let access = deny_only.listeners[0].routes[0]
        .filters
        .access
        .clone()
        .unwrap();
    assert!(access.permits("127.0.0.1".parse().unwrap()));
    assert!(!access.permits("10.1.1.1".parse().unwrap()));
}

/// Was: `deny = ["::ffff:127.0.0.1"]` passed `weir check` and never matched, clients being
/// compared in their IPv4 form (attacker review): the entry is held in that form too.
#[test]
fn ipv4_mapped_ranges_are_held_in_their_ipv4_form() {
    let lines = "deny = [\"::ffff:127.0.0.1\", \"::ffff:10.0.0.0/104\"]\n";
    let c = parse_str(&with_route(lines), "t.toml").unwrap();
    let access = c.listeners[0].routes[0].filters.access.clone().unwrap();
    let held: Vec<String> = (access.deny.iter())
        .map(|c| format!("{}/{}", c.addr, c.prefix))
        .collect();
    assert_eq!(held, ["127.0.0.1/32", "10.0.0.0/8"]);
    // Shorter than /96 it would match no client at all: refused, with the fix.
    let e = parse_str(&with_route("deny = [\"::ffff:0:0/80\"]\n"), "t.toml").unwrap_err();
    assert!(e.to_string().contains("shorter than /96"), "{e}");
    for ip in ["127.0.0.1", "::ffff:127.0.0.1", "10.9.8.7"] {
        assert!(!access.permits(ip.parse().unwrap()), "{ip}");
    }
    assert!(access.permits("192.0.2.1".parse().unwrap()));
}

#[test]
fn access_list_rejections() {
    let r = "listeners[0].routes[0]";
    check(
        &with_route("allow = [\"10.0.0.0/33\"]\n"),
        &format!("{r}.allow[0]"),
        7,
        "invalid address range",
        "10.0.0.0/8",
    );
    check(
        &with_route("deny = [\"10.0.0.1\", \"nope\"]\n"),
        &format!("{r}.deny[1]"),
        7,
        "\"nope\"",
        "",
    );
    check(
        &with_route("allow = []\n"),
        &format!("{r}.allow"),
        7,
        "every client would get 403",
        "deny = [",
    );
    check(
        &with_listener("trusted_proxies = []\n", ""),
        "listeners[0].trusted_proxies",
        4,
        "empty",
        "remove the key",
    );
    check(
        &with_listener("trusted_proxies = [\"::1/129\"]\n", ""),
        "listeners[0].trusted_proxies[0]",
        4,
        "invalid address range",
        "",
    );
    check(
        "[[listeners]]\nname = \"t\"\nbind = \"127.0.0.1:1\"\nprotocol = \"tcp\"\nupstream = \"u\"\ntrusted_proxies = [\"10.0.0.0/8\"]\n\
         [upstreams.u]\nservers = [{ addr = \"127.0.0.1:8081\" }]\n",
        "listeners[0].trusted_proxies",
        6,
        "",
        "",
    );
}

#[test]
fn rate_limit_settings() {
    use crate::RateKey;
    use std::time::Duration;
    let limit = |line: &str| {
        parse_str(&with_route(line), "t.toml").unwrap().listeners[0].routes[0]
            .filters
            .rate_limit
            .clone()
            .unwrap()
    };
    let l = limit("rate_limit = { rate = \"100/s\" }\n");
    assert_eq!(
        (l.interval, l.burst, l.key, l.max_keys),
        (Duration::from_millis(10), 100, RateKey::ClientIp, 16_384)
    );
    let l = limit(
        "rate_limit = { rate = \"1/h\", burst = 3, key = \"header:X-Api-Key\", max_keys = 64 }\n",
    );
    assert_eq!(
        (l.interval, l.burst, l.key, l.max_keys),
        (
            Duration::from_secs(3600),
            3,
            RateKey::Header("X-Api-Key".into()),
            64
        )
    );
    assert_eq!(
        limit("rate_limit = { rate = \"30/m\", key = \"route\" }\n").key,
        RateKey::Route
    );
}

#[test]
fn rate_limit_rejections() {
    let r = "listeners[0].routes[0].rate_limit";
    check(
        &with_route("rate_limit = { burst = 3 }\n"),
        &format!("{r}.rate"),
        7,
        "no rate",
        "100/s",
    );
    for bad in ["100", "0/s", "10/w", "x/s", "2000000/s", "-1/s"] {
        check(
            &with_route(&format!("rate_limit = {{ rate = \"{bad}\" }}\n")),
            &format!("{r}.rate"),
            7,
            "invalid rate",
            "30/m",
        );
    }
    check(
        &with_route("rate_limit = { rate = \"1/s\", burst = 0 }\n"),
        &format!("{r}.burst"),
        7,
        "between 1 and 1000000",
        "",
    );
    check(
        &with_route("rate_limit = { rate = \"1/s\", key = \"ip\" }\n"),
        &format!("{r}.key"),
        7,
        "unknown rate-limit key",
        "header:NAME",
    );
    check(
        &with_route("rate_limit = { rate = \"1/s\", key = \"header:\" }\n"),
        &format!("{r}.key"),
        7,
        "unknown rate-limit key",
        "",
    );
    check(
        &with_route("rate_limit = { rate = \"1/s\", max_keys = 1 }\n"),
        &format!("{r}.max_keys"),
        7,
        "between 16 and",
        "",
    );
    check(
        &with_route("rate_limit = { rate = \"1/s\", zone = \"a\" }\n"),
        &format!("{r}.zone"),
        7,
        "unknown field",
        "",
    );
}

#[test]
fn basic_auth_settings_and_rejections() {
    let dir = std::env::temp_dir().join(format!("weir-config-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("htpasswd");
    let hash = "$2y$04$abcdefghijklmnopqrstuOabcdefghijklmnopqrstuvwxyz01234";
    std::fs::write(&file, format!("zed:{hash}\nann:{hash}\n")).unwrap();
    let route = |extra: &str| {
        format!(
            "basic_auth = {{ users_file = \"{}\"{extra} }}\n",
            file.display()
        )
    };
    let c = parse_str(&with_route(&route("")), "t.toml").unwrap();
    let auth = c.listeners[0].routes[0].filters.basic_auth.clone().unwrap();
    assert_eq!(auth.realm, "Restricted");
    assert_eq!(auth.user(b"ann").unwrap().hash, hash);
    assert!(auth.user(b"bob").is_none());
    let r = "listeners[0].routes[0].basic_auth";
    check(
        &with_route(&route(", realm = \"a\\\"b\"")),
        &format!("{r}.realm"),
        7,
        "printable ASCII",
        "Restricted",
    );
    check(
        &with_route("basic_auth = { realm = \"x\" }\n"),
        &format!("{r}.users_file"),
        7,
        "no users_file",
        "htpasswd",
    );
    check(
        &with_route("basic_auth = { users_file = \"/nonexistent/weir-htpasswd\" }\n"),
        &format!("{r}.users_file"),
        7,
        "cannot read",
        "path",
    );
    std::fs::write(&file, format!("ann:{hash}\nbob:$apr1$xyz$abc\n")).unwrap();
    check(
        &with_route(&route("")),
        &format!("{r}.users_file"),
        7,
        "line 2: user \"bob\" does not have a bcrypt ($2y$...) or argon2",
        "htpasswd -B",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn compression_defaults_and_settings() {
    use crate::{CompressionLevels, Encoding};
    let comp = |line: &str| {
        parse_str(&with_route(line), "t.toml").unwrap().listeners[0].routes[0]
            .filters
            .compression
            .clone()
    };
    assert_eq!(comp(""), None);
    let c = comp("compression = {}\n").unwrap();
    assert_eq!(c.algorithms, [Encoding::Zstd, Encoding::Br, Encoding::Gzip]);
    assert_eq!(c.min_size, 1024);
    assert!(c.types.contains(&"text/*".to_string()));
    assert_eq!(
        c.levels,
        CompressionLevels {
            gzip: 1,
            br: 3,
            zstd: 3
        }
    );
    let c = comp(
        "compression = { algorithms = [\"GZIP\", \"br\"], min_size = \"2KiB\", types = [\"Application/JSON\", \"*/*\"], level = { gzip = 6, br = 5 } }\n",
    )
    .unwrap();
    assert_eq!(c.algorithms, [Encoding::Gzip, Encoding::Br]);
    assert_eq!(c.min_size, 2048);
    assert_eq!(c.types, ["application/json", "*/*"]);
    assert_eq!(
        c.levels,
        CompressionLevels {
            gzip: 6,
            br: 5,
            zstd: 3
        }
    );
}

#[test]
fn compression_rejections_name_key_and_fix() {
    let c = "listeners[0].routes[0].compression";
    let cases = [
        (
            "compression = { algorithms = [] }",
            format!("{c}.algorithms"),
            "is empty",
            "at least one",
        ),
        (
            "compression = { algorithms = [\"deflate\"] }",
            format!("{c}.algorithms[0]"),
            "unknown compression algorithm \"deflate\"",
            "\"zstd\", \"br\" or \"gzip\"",
        ),
        (
            "compression = { algorithms = [\"gzip\", \"gzip\"] }",
            format!("{c}.algorithms[1]"),
            "listed twice",
            "once",
        ),
        (
            "compression = { min_size = \"1 parsec\" }",
            format!("{c}.min_size"),
            "size",
            "16KiB",
        ),
        (
            "compression = { types = [] }",
            format!("{c}.types"),
            "1 to 64 media types",
            "text/*",
        ),
        (
            "compression = { types = [\"text\"] }",
            format!("{c}.types[0]"),
            "not a media type",
            "type/subtype",
        ),
        (
            "compression = { types = [\"text/html; charset=utf-8\"] }",
            format!("{c}.types[0]"),
            "not a media type",
            "without parameters",
        ),
        (
            "compression = { types = [\"*/json\"] }",
            format!("{c}.types[0]"),
            "not a media type",
            "type/*",
        ),
        (
            "compression = { types = [\"tex*/*\"] }",
            format!("{c}.types[0]"),
            "not a media type",
            "type/*",
        ),
        (
            "compression = { types = [\"text/ht*ml\"] }",
            format!("{c}.types[0]"),
            "not a media type",
            "type/*",
        ),
        (
            "compression = { level = { gzip = 10 } }",
            format!("{c}.level.gzip"),
            "between 1 and 9, not 10",
            "default 1",
        ),
        (
            "compression = { level = { br = 12 } }",
            format!("{c}.level.br"),
            "between 0 and 11",
            "default 3",
        ),
        (
            "compression = { level = { zstd = 22 } }",
            format!("{c}.level.zstd"),
            "between 1 and 19",
            "default 3",
        ),
        (
            "compression = { level = { lz4 = 1 } }",
            format!("{c}.level.lz4"),
            "unknown field `lz4`",
            "correct its spelling",
        ),
        (
            "compression = { algorithm = [\"gzip\"] }",
            format!("{c}.algorithm"),
            "unknown field",
            "did you mean `algorithms`?",
        ),
    ];
    for (line, field, message, fix) in cases {
        check(&with_route(&format!("{line}\n")), &field, 7, message, fix);
    }
}
