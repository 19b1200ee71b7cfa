//! Validation rules: one failing case (or more) per rule, checking key, line, message and fix.

use crate::tests::fail;
use crate::{parse_str, HostPattern, MinBodyRate};
use std::time::Duration;

/// A valid listener on lines 1-3.
const LISTENER: &str = "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\n";

/// A valid listener (lines 1-3) with one route (lines 4-6) and upstream `cgi` (last 2 lines).
fn with_route(route_lines: &str) -> String {
    format!(
        "{LISTENER}[[listeners.routes]]\nname = \"r\"\nupstream = \"cgi\"\n{route_lines}\
         [upstreams.cgi]\nservers = [{{ addr = \"127.0.0.1:8081\" }}]\n"
    )
}

/// A valid listener (lines 1-3) and upstream `u` (header on line 4).
fn with_upstream(lines: &str) -> String {
    format!("{LISTENER}[upstreams.u]\n{lines}")
}

/// Asserts the error's field and line, and that message and fix say something useful.
#[track_caller]
pub(crate) fn check(source: &str, field: &str, line: usize, message: &str, fix: &str) {
    let e = fail(source);
    assert_eq!((e.field.as_str(), e.line), (field, line), "{e}");
    assert!(e.message.contains(message), "message of: {e}");
    assert!(e.fix.contains(fix), "fix of: {e}");
    assert!(!e.to_string().contains('\n'), "one line: {e}");
}

#[test]
fn server_settings() {
    let w = "server.workers";
    check(
        &format!("[server]\nworkers = 0\n{LISTENER}"),
        w,
        2,
        "from 1 to 1024, not 0",
        "\"auto\"",
    );
    check(
        &format!("[server]\nworkers = 1025\n{LISTENER}"),
        w,
        2,
        "not 1025",
        "1 to 1024",
    );
    check(
        &format!("[server]\nworkers = \"4\"\n{LISTENER}"),
        w,
        2,
        "is a string",
        "workers = 4 without quotes",
    );
    check(
        &format!("[server]\nworkers = \"many\"\n{LISTENER}"),
        w,
        2,
        "\"many\"",
        "\"auto\"",
    );
    let d = "server.drain_timeout";
    check(
        &format!("[server]\ndrain_timeout = \"30\"\n{LISTENER}"),
        d,
        2,
        "no unit",
        "\"30s\"",
    );
    check(
        &format!("[server]\ndrain_timeout = \"1w\"\n{LISTENER}"),
        d,
        2,
        "unit \"w\"",
        "duration",
    );
}

#[test]
fn admin_settings() {
    let source = format!("[admin]\nbind = \"localhost:9901\"\n{LISTENER}");
    check(&source, "admin.bind", 2, "invalid admin address", "\"off\"");
    let source = format!("{LISTENER}[[listeners]]\nname = \"b\"\nbind = \"127.0.0.1:9901\"\n");
    check(
        &source,
        "listeners[1].bind",
        6,
        "already used by the admin listener",
        "\"off\"",
    );
    let moved = format!("[admin]\nbind = \"127.0.0.1:9902\"\n{source}");
    assert!(parse_str(&moved, "weir.toml").is_ok());
    for key in ["header_timeout", "idle_timeout"] {
        let source = format!("[admin]\n{key} = \"0s\"\n{LISTENER}");
        check(
            &source,
            &format!("admin.{key}"),
            2,
            "greater than 0",
            "duration",
        );
        let source = format!("[admin]\n{key} = \"10\"\n{LISTENER}");
        check(&source, &format!("admin.{key}"), 2, "no unit", "\"");
    }
    let source = format!("[admin]\nmax_connections = 0\n{LISTENER}");
    check(&source, "admin.max_connections", 2, "not 0", "default 64");
    let set = format!(
        "[admin]\nheader_timeout = \"1s\"\nidle_timeout = \"2s\"\nmax_connections = 3\n{LISTENER}"
    );
    let admin = parse_str(&set, "weir.toml").unwrap().admin;
    assert_eq!(admin.header_timeout, std::time::Duration::from_secs(1));
    assert_eq!(admin.idle_timeout, std::time::Duration::from_secs(2));
    assert_eq!(admin.max_connections, 3);
}

#[test]
fn admin_allowed_hosts() {
    let source =
        format!("[admin]\nallowed_hosts = [\n  \"admin.example\",\n  \"x:9901\",\n]\n{LISTENER}");
    check(
        &source,
        "admin.allowed_hosts[1]",
        4,
        "includes a port",
        "alone",
    );
    let source = format!("[admin]\nallowed_hosts = [\"*.example\"]\n{LISTENER}");
    check(
        &source,
        "admin.allowed_hosts[0]",
        2,
        "wildcards",
        "each name",
    );
    let set = format!("[admin]\nallowed_hosts = [\"Admin.Example\", \"[::1]\"]\n{LISTENER}");
    let admin = parse_str(&set, "weir.toml").unwrap().admin;
    assert_eq!(admin.allowed_hosts, ["admin.example", "::1"]);
}

/// An admin API reachable beyond loopback without a token serves the config, secrets
/// included, to whoever reaches it: `weir check` says so (a warning: probes need it).
#[test]
fn an_open_admin_bind_without_a_token_is_warned_about() {
    let warned = |admin: &str| {
        let config = parse_str(&format!("[admin]\n{admin}\n{LISTENER}"), "t").expect("valid");
        config
            .warnings()
            .iter()
            .any(|w| w.contains("without admin.token_file"))
    };
    assert!(warned("bind = \"0.0.0.0:9901\""));
    assert!(warned("bind = \"10.0.0.5:9901\""));
    assert!(!warned("bind = \"127.0.0.1:9901\""));
    assert!(!warned("bind = \"[::1]:9901\""));
    assert!(
        !warned("bind = \"[::ffff:127.0.0.1]:9901\""),
        "IPv4-mapped loopback"
    );
    assert!(!warned("bind = \"off\""));
    assert!(!warned(
        "bind = \"0.0.0.0:9901\"\ntoken_file = \"/etc/weir/admin.token\""
    ));
}

/// Was accepted: then every API request hung on the FIFO (or read `/dev/zero` to 500).
/// A token file that is missing at load stays accepted (it may be made later).
#[test]
fn a_token_file_that_is_not_a_regular_file_is_refused() {
    let field = "admin.token_file";
    let with = |file: &str| format!("[admin]\ntoken_file = \"{file}\"\n{LISTENER}");
    let not_regular = "is not a regular file (a character device)";
    check(
        &with("/dev/zero"),
        field,
        2,
        not_regular,
        "name a regular file",
    );
    check(&with("/"), field, 2, "(a directory)", "name a regular file");
    assert!(parse_str(&with("/nonexistent/weir-token"), "t").is_ok());
}

#[test]
fn dashboard_settings() {
    use std::time::Duration;
    let on = parse_str(LISTENER, "weir.toml").unwrap().admin.dashboard;
    let on = on.expect("on by default");
    assert_eq!(
        (on.interval, on.history),
        (Duration::from_secs(2), Duration::from_secs(300))
    );
    assert_eq!(on.points(), 150);
    let off = format!("[admin]\ndashboard = false\n{LISTENER}");
    assert_eq!(parse_str(&off, "weir.toml").unwrap().admin.dashboard, None);
    let set =
        format!("[admin]\ndashboard_interval = \"1s\"\ndashboard_history = \"1h\"\n{LISTENER}");
    let set = parse_str(&set, "weir.toml")
        .unwrap()
        .admin
        .dashboard
        .unwrap();
    assert_eq!(set.points(), 3600);
    let i = "admin.dashboard_interval";
    for bad in ["500ms", "61s"] {
        let source = format!("[admin]\ndashboard_interval = \"{bad}\"\n{LISTENER}");
        check(&source, i, 2, "from 1s to 60s", "\"2s\"");
    }
    let h = "admin.dashboard_history";
    let short =
        format!("[admin]\ndashboard_interval = \"10s\"\ndashboard_history = \"5s\"\n{LISTENER}");
    check(
        &short,
        h,
        3,
        "from dashboard_interval (10s) to 1h",
        "\"5m\"",
    );
    let long = format!("[admin]\ndashboard_history = \"2h\"\n{LISTENER}");
    check(&long, h, 2, "not 7200s", "up to \"1h\"");
    let typo = format!("[admin]\ndashboard = \"yes\"\n{LISTENER}");
    assert!(parse_str(&typo, "weir.toml").is_err());
}

#[test]
fn listeners_are_required() {
    check("", "listeners", 1, "no listeners", "[[listeners]]");
    check(
        "# no listeners\nlisteners = []\n[server]\nworkers = 2\n",
        "listeners",
        2,
        "no listeners",
        "bind",
    );
}

#[test]
fn listener_names_and_binds() {
    let l = "listeners[0]";
    check(
        "[[listeners]]\nbind = \"127.0.0.1:1\"\n",
        &format!("{l}.name"),
        1,
        "no name",
        "name = ",
    );
    check(
        "[[listeners]]\nname = \"we b\"\nbind = \"127.0.0.1:1\"\n",
        &format!("{l}.name"),
        2,
        "\"we b\"",
        "\"we-b\"",
    );
    check(
        "[[listeners]]\nname = \"web\"\n",
        &format!("{l}.bind"),
        1,
        "no bind address",
        "127.0.0.1:8080",
    );
    check(
        "[[listeners]]\nname = \"w\"\nbind = \"localhost:80\"\n",
        &format!("{l}.bind"),
        3,
        "\"localhost:80\"",
        "IP address",
    );
    let twice = format!("{LISTENER}\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8081\"\n");
    check(
        &twice,
        "listeners[1].name",
        6,
        "duplicate listener name \"web\"",
        "unique",
    );
    let shared = format!("{LISTENER}[[listeners]]\nname = \"b\"\nbind = \"127.0.0.1:8080\"\n");
    check(
        &shared,
        "listeners[1].bind",
        6,
        "listener \"web\"",
        "different address",
    );
    let port_zero = "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:0\"\n\
                     [[listeners]]\nname = \"b\"\nbind = \"127.0.0.1:0\"\n";
    assert!(
        parse_str(port_zero, "weir.toml").is_ok(),
        "port 0 is a fresh port each time"
    );
}

#[test]
fn listener_protocol() {
    let p = "listeners[0].protocol";
    check(
        &format!("{LISTENER}protocol = \"udp\"\n"),
        p,
        4,
        "unknown protocol \"udp\"",
        "\"tcp\"",
    );
}

/// A tcp listener (lines 1-5) to upstream `u`, `extra` lines, then upstream `u`.
fn tcp_listener(extra: &str) -> String {
    format!(
        "{LISTENER}protocol = \"tcp\"\nupstream = \"u\"\n{extra}\
         [upstreams.u]\nservers = [{{ addr = \"127.0.0.1:8081\" }}]\n"
    )
}

#[test]
fn tcp_listener_settings() {
    let config = parse_str(
        &tcp_listener(
            "idle_timeout = \"30s\"\nbuffer_size = \"64KiB\"\nsplice = \"off\"\n\
             proxy_protocol = { send = \"v2\" }\nmax_connections = 50\n",
        ),
        "t",
    )
    .expect("valid");
    let l = &config.listeners[0];
    let tcp = l.tcp().expect("tcp");
    assert_eq!(tcp.upstream, 0);
    assert_eq!(tcp.idle_timeout, std::time::Duration::from_secs(30));
    assert_eq!(tcp.buffer_size, 64 * 1024);
    assert_eq!(tcp.splice, crate::SpliceMode::Never);
    assert_eq!(l.proxy_protocol.send, crate::ProxyVersion::V2);
    assert_eq!(l.max_connections, 50);
    let defaults = parse_str(&tcp_listener(""), "t").expect("valid");
    let tcp = defaults.listeners[0].tcp().expect("tcp");
    assert_eq!(tcp.splice, crate::SpliceMode::Auto);
    assert_eq!(tcp.buffer_size, 16 * 1024);
}

/// `tunnel_idle_timeout` / `tunnel_fin_timeout` (HTTP) and `fin_timeout` (TCP): defaults
/// (a fin bound left out is the idle bound), values, zero and a fin bound longer than the
/// idle one refused, each only on its kind of listener.
#[test]
fn tunnel_and_fin_timeouts() {
    use std::time::Duration;
    let http = parse_str(LISTENER, "t").expect("valid");
    let l = &http.listeners[0];
    assert_eq!(l.tunnel_idle_timeout, Duration::from_secs(3600));
    assert_eq!(l.tunnel_fin_timeout, Duration::from_secs(3600));
    let idle_only = format!("{LISTENER}tunnel_idle_timeout = \"2m\"\n");
    let l = &parse_str(&idle_only, "t").expect("valid").listeners[0];
    assert_eq!(l.tunnel_fin_timeout, Duration::from_secs(120));
    let set = "tunnel_idle_timeout = \"10m\"\ntunnel_fin_timeout = \"5s\"\n";
    let http = parse_str(&format!("{LISTENER}{set}"), "t").expect("valid");
    let l = &http.listeners[0];
    assert_eq!(l.tunnel_idle_timeout, Duration::from_secs(600));
    assert_eq!(l.tunnel_fin_timeout, Duration::from_secs(5));
    let tcp = parse_str(&tcp_listener(""), "t").expect("valid");
    assert_eq!(
        tcp.listeners[0].tcp().expect("tcp").fin_timeout,
        Duration::from_secs(300)
    );
    let tcp = parse_str(&tcp_listener("idle_timeout = \"7d\"\n"), "t").expect("valid");
    assert_eq!(
        tcp.listeners[0].tcp().expect("tcp").fin_timeout,
        Duration::from_secs(7 * 24 * 3600)
    );
    let tcp = parse_str(&tcp_listener("fin_timeout = \"2s\"\n"), "t").expect("valid");
    assert_eq!(
        tcp.listeners[0].tcp().expect("tcp").fin_timeout,
        Duration::from_secs(2)
    );
    check(
        &format!("{LISTENER}tunnel_idle_timeout = \"0s\"\n"),
        "listeners[0].tunnel_idle_timeout",
        4,
        "greater than 0",
        "\"1h\"",
    );
    check(
        &format!("{LISTENER}tunnel_fin_timeout = \"soon\"\n"),
        "listeners[0].tunnel_fin_timeout",
        4,
        "expected a duration",
        "\"30s\"",
    );
    check(
        &format!("{LISTENER}tunnel_fin_timeout = \"2h\"\n"),
        "listeners[0].tunnel_fin_timeout",
        4,
        "longer than tunnel_idle_timeout (3600s)",
        "at most tunnel_idle_timeout, or leave it out",
    );
    check(
        &tcp_listener("idle_timeout = \"1m\"\nfin_timeout = \"90s\"\n"),
        "listeners[0].fin_timeout",
        7,
        "longer than idle_timeout (60s)",
        "at most idle_timeout",
    );
    // A sub-second bound is printed as such, not rounded down to "0s".
    check(
        &tcp_listener("idle_timeout = \"500ms\"\nfin_timeout = \"1s\"\n"),
        "listeners[0].fin_timeout",
        7,
        "longer than idle_timeout (500ms)",
        "at most idle_timeout",
    );
    check(
        &tcp_listener("fin_timeout = \"0s\"\n"),
        "listeners[0].fin_timeout",
        6,
        "greater than 0",
        "\"30s\"",
    );
    check(
        &tcp_listener("tunnel_idle_timeout = \"1s\"\n"),
        "listeners[0].tunnel_idle_timeout",
        6,
        "only to protocol = \"http\"",
        "set protocol = \"http\"",
    );
    check(
        &format!("{LISTENER}fin_timeout = \"1s\"\n"),
        "listeners[0].fin_timeout",
        4,
        "only to protocol = \"tcp\"",
        "protocol = \"tcp\"",
    );
}

/// `min_body_rate` (240 bytes a second by default, `0` turns it off) and its grace (5 s),
/// HTTP listeners only.
#[test]
fn min_body_rate_keys() {
    let rate = |extra: &str| {
        let config = parse_str(&format!("{LISTENER}{extra}"), "t").expect("valid");
        config.listeners[0].min_body_rate
    };
    let default = MinBodyRate {
        bytes_per_second: 240,
        grace: Duration::from_secs(5),
    };
    assert_eq!(rate(""), Some(default));
    let set = rate("min_body_rate = \"1KiB\"\nmin_body_rate_grace = \"2s\"\n");
    assert_eq!(
        set.map(|r| (r.bytes_per_second, r.grace.as_secs())),
        Some((1024, 2))
    );
    assert_eq!(rate("min_body_rate = 0\n"), None);
    check(
        &tcp_listener("min_body_rate = 100\n"),
        "listeners[0].min_body_rate",
        6,
        "only to protocol = \"http\"",
        "set protocol = \"http\"",
    );
}

/// `tunnel_min_progress` (HTTP) and `min_progress` (TCP): 16 KiB by default, a size from
/// 1 byte to 16 MiB, each only on its kind of listener.
#[test]
fn min_progress_keys() {
    let http = parse_str(LISTENER, "t").expect("valid");
    assert_eq!(http.listeners[0].tunnel_min_progress, 16 * 1024);
    let set = format!("{LISTENER}tunnel_min_progress = \"4KiB\"\n");
    let l = &parse_str(&set, "t").expect("valid").listeners[0];
    assert_eq!(l.tunnel_min_progress, 4096);
    let tcp = |extra: &str| {
        let config = parse_str(&tcp_listener(extra), "t").expect("valid");
        config.listeners[0].tcp().expect("tcp").min_progress
    };
    assert_eq!(tcp(""), 16 * 1024);
    assert_eq!(tcp("min_progress = 1\n"), 1);
    check(
        &tcp_listener("min_progress = 0\n"),
        "listeners[0].min_progress",
        6,
        "between 1 byte and 16MiB, not 0 bytes",
        "\"16KiB\" (the default)",
    );
    check(
        &format!("{LISTENER}tunnel_min_progress = \"1GiB\"\n"),
        "listeners[0].tunnel_min_progress",
        4,
        "between 1 byte and 16MiB",
        "\"16KiB\"",
    );
    check(
        &tcp_listener("tunnel_min_progress = \"1KiB\"\n"),
        "listeners[0].tunnel_min_progress",
        6,
        "only to protocol = \"http\"",
        "set protocol = \"http\"",
    );
    check(
        &format!("{LISTENER}min_progress = \"1KiB\"\n"),
        "listeners[0].min_progress",
        4,
        "only to protocol = \"tcp\"",
        "protocol = \"tcp\"",
    );
}

#[test]
fn defer_accept_defaults_to_on_for_http_and_off_for_tcp() {
    let http = parse_str(&format!("{LISTENER}backlog = 16\n"), "t").expect("valid");
    assert!(http.listeners[0].defer_accept);
    let tcp = parse_str(&tcp_listener(""), "t").expect("valid");
    assert!(!tcp.listeners[0].defer_accept);
    let opted_in = parse_str(&tcp_listener("defer_accept = true\n"), "t").expect("valid");
    assert!(opted_in.listeners[0].defer_accept);
    let opted_out = parse_str(&format!("{LISTENER}defer_accept = false\n"), "t").expect("valid");
    assert!(!opted_out.listeners[0].defer_accept);
}

#[test]
fn tcp_listener_errors() {
    check(
        &format!("{LISTENER}protocol = \"tcp\"\n"),
        "listeners[0].upstream",
        1,
        "needs an upstream",
        "upstream = \"NAME\"",
    );
    check(
        &tcp_listener("[[listeners.routes]]\nname = \"r\"\nupstream = \"u\"\n"),
        "listeners[0].routes",
        6,
        "routes applies only to protocol = \"http\"",
        "remove routes",
    );
    check(
        &tcp_listener("keepalive_timeout = \"1s\"\n"),
        "listeners[0].keepalive_timeout",
        6,
        "only to protocol = \"http\"",
        "set protocol = \"http\"",
    );
    check(
        &tcp_listener("buffer_size = 100\n"),
        "listeners[0].buffer_size",
        6,
        "between 1KiB and 16MiB",
        "16KiB",
    );
    check(
        &tcp_listener("splice = \"maybe\"\n"),
        "listeners[0].splice",
        6,
        "unknown splice mode",
        "\"auto\"",
    );
    check(
        &format!("{LISTENER}upstream = \"u\"\n"),
        "listeners[0].upstream",
        4,
        "only to protocol = \"tcp\"",
        "protocol = \"tcp\"",
    );
    check(
        &format!("{LISTENER}proxy_protocol = {{ send = \"v1\" }}\n"),
        "listeners[0].proxy_protocol.send",
        4,
        "only to protocol = \"tcp\"",
        "remove proxy_protocol.send",
    );
}

#[test]
fn proxy_protocol_accept() {
    let ok = parse_str(
        &format!(
            "{LISTENER}proxy_protocol = {{ accept = true, trusted = [\"127.0.0.0/8\", \"::1\"] }}\n"
        ),
        "t",
    )
    .expect("valid");
    let pp = &ok.listeners[0].proxy_protocol;
    assert!(pp.accept);
    assert!(pp.trusted[0].contains("127.1.2.3".parse().unwrap()));
    assert!(pp.trusted[0].contains("::ffff:127.0.0.1".parse().unwrap()));
    assert!(!pp.trusted[0].contains("128.0.0.1".parse().unwrap()));
    assert!(pp.trusted[1].contains("::1".parse().unwrap()));
    assert!(!pp.trusted[1].contains("::2".parse().unwrap()));
    check(
        &format!("{LISTENER}proxy_protocol = {{ accept = true }}\n"),
        "listeners[0].proxy_protocol.accept",
        4,
        "needs the source ranges",
        "trusted = [",
    );
    check(
        &format!("{LISTENER}proxy_protocol = {{ accept = true, trusted = [\"10.0.0.0/33\"] }}\n"),
        "listeners[0].proxy_protocol.trusted[0]",
        4,
        "invalid address range \"10.0.0.0/33\"",
        "10.0.0.0/8",
    );
    check(
        &format!("{LISTENER}proxy_protocol = {{ trusted = [\"10.0.0.0/8\"] }}\n"),
        "listeners[0].proxy_protocol.trusted",
        4,
        "no effect unless accept = true",
        "accept = true",
    );
}

#[test]
fn cidr_edges() {
    let any = crate::Cidr {
        addr: "0.0.0.0".parse().unwrap(),
        prefix: 0,
    };
    assert!(any.contains("1.2.3.4".parse().unwrap()));
    assert!(!any.contains("::2".parse().unwrap()), "families differ");
    let all6 = crate::Cidr {
        addr: "::".parse().unwrap(),
        prefix: 0,
    };
    assert!(all6.contains("fe80::1".parse().unwrap()));
}

/// Checks a listener with one extra `key = value` line (line 4), rejected at that key.
#[track_caller]
fn check_listener_line(line: &str, message: &str, fix: &str) {
    let key = line.split(" =").next().unwrap_or_default();
    let source = format!("{LISTENER}{line}\n");
    check(&source, &format!("listeners[0].{key}"), 4, message, fix);
}

#[test]
fn listener_integer_limits() {
    check_listener_line("backlog = 0", "between 1 and 65535, not 0", "default 4096");
    check_listener_line("backlog = 65536", "not 65536", "between 1 and 65535");
    check_listener_line("max_connections = 0", "at least 1", "default 10000");
    check_listener_line("keepalive_requests = -1", "at least 0", "default 500");
    check_listener_line("max_headers = 0", "between 1 and 1000", "default 100");
    check_listener_line("max_headers = 1001", "not 1001", "default 100");
    check_listener_line(
        "max_informational = 0",
        "between 1 and 100, not 0",
        "default 8",
    );
    check_listener_line("max_informational = 101", "not 101", "default 8");
}

#[test]
fn listener_size_limits() {
    check_listener_line("max_header_size = \"512\"", "not 512 bytes", "16KiB");
    check_listener_line(
        "max_header_size = \"2MiB\"",
        "between 1KiB and 1MiB",
        "16KiB",
    );
    check_listener_line(
        "max_header_size = \"16 kb\"",
        "unknown size unit",
        "size such as",
    );
    check_listener_line(
        "max_body_size = \"1.5MB\"",
        "expected a size",
        "size such as",
    );
    check_listener_line("max_body_size = -1", "negative", "size such as");
}

#[test]
fn listener_timeouts() {
    check_listener_line("header_timeout = \"0s\"", "greater than 0", "\"10s\"");
    check_listener_line("client_timeout = \"0\"", "greater than 0", "\"60s\"");
    check_listener_line("keepalive_timeout = \"5 min\"", "unit \"min\"", "\"5s\"");
}

#[test]
fn default_response() {
    let d = "listeners[0].default_response";
    let source = |v: &str| format!("{LISTENER}default_response = {{ {v} }}\n");
    check(
        &source("status = 199"),
        &format!("{d}.status"),
        4,
        "between 200 and 599",
        "default 404",
    );
    check(
        &source("status = 600"),
        &format!("{d}.status"),
        4,
        "not 600",
        "default 404",
    );
    check(
        &source("content_type = \"\""),
        &format!("{d}.content_type"),
        4,
        "non-empty",
        "text/plain",
    );
    check(
        &source("content_type = \"a\\nb\""),
        &format!("{d}.content_type"),
        4,
        "printable",
        "text/plain",
    );
    let table = format!("{LISTENER}[listeners.default_response]\nstatus = 200\nbody = \"hi\"\n");
    let config = parse_str(&table, "weir.toml").expect("valid");
    let response = &config.listeners[0].default_response;
    assert_eq!(
        (
            response.status,
            response.body.as_str(),
            response.content_type.as_str()
        ),
        (200, "hi", "text/plain")
    );
}

#[test]
fn route_names_and_upstreams() {
    let r = "listeners[0].routes[0]";
    let no_name = format!("{LISTENER}[[listeners.routes]]\nupstream = \"x\"\n");
    check(&no_name, &format!("{r}.name"), 4, "no name", "name = ");
    let no_upstream = format!("{LISTENER}[[listeners.routes]]\nname = \"r\"\n");
    check(
        &no_upstream,
        &format!("{r}.upstream"),
        4,
        "no upstream",
        "define [upstreams.NAME]",
    );
    let unknown = format!("{LISTENER}[[listeners.routes]]\nname = \"r\"\nupstream = \"x\"\n");
    check(
        &unknown,
        &format!("{r}.upstream"),
        6,
        "unknown upstream \"x\"",
        "define [upstreams.x] with servers",
    );
    let twice = format!(
        "{}[[listeners.routes]]\nname = \"r\"\nupstream = \"cgi\"\npath_prefix = \"/b\"\n",
        with_route("")
    );
    check(
        &twice,
        "listeners[0].routes[1].name",
        10,
        "duplicate route name \"r\"",
        "unique",
    );
}

#[test]
fn unknown_upstream_displays_as_documented() {
    let source =
        "[server]\nworkers = 2\n\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\n\n\
                  [upstreams.cgi]\nservers = [{ addr = \"127.0.0.1:8081\" }]\n\n\
                  [[listeners.routes]]\n    upstream = \"cgi2\"\n    name = \"r\"\n";
    assert_eq!(
        fail(source).to_string(),
        "weir.toml:12:5: listeners[0].routes[0].upstream: unknown upstream \"cgi2\" \
         (fix: define [upstreams.cgi2] or use one of: cgi)"
    );
}

/// Checks a route with one extra line (line 7), rejected at `listeners[0].routes[0]` + `key`.
#[track_caller]
fn check_route_line(line: &str, key: &str, message: &str, fix: &str) {
    let field = format!("listeners[0].routes[0].{key}");
    check(&with_route(&format!("{line}\n")), &field, 7, message, fix);
}

#[test]
fn route_hosts_rejected() {
    check_route_line("hosts = []", "hosts", "could never match", "[\"*\"]");
    let port = "hosts = [\"a.com\", \"a.com:80\"]";
    check_route_line(port, "hosts[1]", "includes a port", "\":PORT\"");
    let star = "'*'";
    check_route_line(
        "hosts = [\"a*.b.com\"]",
        "hosts[0]",
        star,
        "\"*.example.com\"",
    );
    check_route_line("hosts = [\"*.*.com\"]", "hosts[0]", star, "\"*\"");
    let invalid = "not a valid host name";
    check_route_line("hosts = [\"*.\"]", "hosts[0]", invalid, "dots");
    check_route_line("hosts = [\"a..com\"]", "hosts[0]", invalid, "dots");
    check_route_line("hosts = [\"a b\"]", "hosts[0]", invalid, "punycode");
}

#[test]
fn route_hosts_accepted() {
    let source = with_route("hosts = [\"*\", \"WWW.A.com\", \"*.B.com\"]\n");
    let config = parse_str(&source, "f").expect("valid");
    let expected = [
        HostPattern::Any,
        HostPattern::Exact("www.a.com".into()),
        HostPattern::Suffix(".b.com".into()),
    ];
    assert_eq!(config.listeners[0].routes[0].hosts, expected);
}

#[test]
fn route_prefixes() {
    let (path, rewrite) = ("path_prefix", "rewrite_prefix");
    check_route_line(
        "path_prefix = \"cgi/\"",
        path,
        "must start with '/'",
        "\"/cgi/\"",
    );
    check_route_line("path_prefix = \"/a b\"", path, "whitespace", "path part");
    check_route_line("path_prefix = \"/a?b\"", path, "'?'", "path part");
    check_route_line(
        "rewrite_prefix = \"x\"",
        rewrite,
        "must start with '/'",
        "\"/x\"",
    );
    let reverse = "reverse_rewrite = true";
    check_route_line(
        reverse,
        "reverse_rewrite",
        "needs rewrite_prefix",
        "rewrite_prefix",
    );
}

#[test]
fn routes_that_could_never_match() {
    let second = |lines: &str| {
        format!(
            "{}[[listeners.routes]]\nname = \"s\"\nupstream = \"cgi\"\n{lines}",
            with_route("hosts = [\"a.com\", \"b.com\"]\n")
        )
    };
    // Same host set in another order, same (default) path_prefix: reported at the route.
    let e = fail(&second("hosts = [\"B.com\", \"a.com\"]\n"));
    assert_eq!(
        (e.field.as_str(), e.line),
        ("listeners[0].routes[1].path_prefix", 10),
        "{e}"
    );
    assert!(
        e.message.contains("could never match") && e.message.contains("route \"r\""),
        "{e}"
    );
    assert!(e.fix.contains("change its hosts or path_prefix"), "{e}");
    // Written path_prefix: reported at the key.
    let e = fail(&second(
        "hosts = [\"a.com\", \"b.com\"]\npath_prefix = \"/\"\n",
    ));
    assert_eq!(e.line, 14, "{e}");
    // Different hosts or prefix: fine.
    assert!(parse_str(&second("hosts = [\"a.com\"]\n"), "f").is_ok());
    assert!(parse_str(
        &second("hosts = [\"a.com\", \"b.com\"]\npath_prefix = \"/x\"\n"),
        "f"
    )
    .is_ok());
}

#[test]
fn upstream_without_servers() {
    let s = "upstreams.u.servers";
    let timeout = with_upstream("connect_timeout = \"1s\"\n");
    check(&timeout, s, 4, "has no servers", "servers = [{ addr");
    check(
        &with_upstream("servers = []\n"),
        s,
        5,
        "has no servers",
        "addr = ",
    );
    let no_addr = with_upstream("servers = [{}]\n");
    check(&no_addr, &format!("{s}[0].addr"), 5, "no addr", "host:port");
}

/// Checks upstream `u` with the one server `addr`, rejected at its `addr` on line 5.
#[track_caller]
fn check_server(addr: &str, message: &str, fix: &str) {
    let source = with_upstream(&format!("servers = [{{ addr = \"{addr}\" }}]\n"));
    check(&source, "upstreams.u.servers[0].addr", 5, message, fix);
}

#[test]
fn upstream_server_addresses() {
    check_server("127.0.0.1", "has no port", "\"127.0.0.1:80\"");
    check_server("::1:80", "needs brackets", "\"[::1]:80\"");
    check_server("no-such-host.invalid:80", "cannot resolve", "IP address");
    check_server("10.0.0.1:0", "port 0", "port");
    let second = "servers = [\n  { addr = \"10.0.0.1:80\" },\n  { addr = \"10.0.0.2\" },\n]\n";
    let source = with_upstream(second);
    check(
        &source,
        "upstreams.u.servers[1].addr",
        7,
        "has no port",
        "host:port",
    );
}

#[test]
fn upstream_settings() {
    let servers = "servers = [{ addr = \"10.0.0.1:80\" }]\n";
    let cases = [
        (
            "connect_timeout = \"0s\"",
            "connect_timeout",
            "greater than 0",
            "\"2s\"",
        ),
        (
            "response_timeout = \"0ms\"",
            "response_timeout",
            "greater than 0",
            "\"60s\"",
        ),
        (
            "idle_timeout = \"x\"",
            "idle_timeout",
            "expected a duration",
            "\"60s\"",
        ),
        ("max_idle = -1", "max_idle", "at least 0", "default 256"),
        (
            "protocol = \"http2\"",
            "protocol",
            "unknown protocol \"http2\" (did you mean \"h2\"",
            "\"h2c\" or \"auto\"",
        ),
        (
            "protocol = \"h2\"",
            "protocol",
            "but the upstream has no tls",
            "protocol = \"h2c\"",
        ),
        (
            "max_concurrent_streams = 0",
            "max_concurrent_streams",
            "between 1 and 65535",
            "default 100",
        ),
        (
            "max_header_list_size = \"512\"",
            "max_header_list_size",
            "between 1024 and 16777216 bytes, not 512",
            "\"64KiB\" (the default)",
        ),
    ];
    for (line, key, message, fix) in cases {
        check(
            &with_upstream(&format!("{servers}{line}\n")),
            &format!("upstreams.u.{key}"),
            6,
            message,
            fix,
        );
    }
    let bad_name = format!("{LISTENER}[upstreams.\"a b\"]\n{servers}");
    check(
        &bad_name,
        "upstreams.\"a b\"",
        4,
        "invalid upstream name",
        "\"a-b\"",
    );
    let unused = with_upstream(servers);
    assert_eq!(parse_str(&unused, "f").map(|c| c.upstreams.len()), Ok(1));
}

#[test]
fn upstream_protocol_and_stream_limit() {
    let servers = "servers = [{ addr = \"10.0.0.1:80\" }]\n";
    let parsed = |extra: &str| {
        let config = parse_str(&with_upstream(&format!("{servers}{extra}")), "f").unwrap();
        let u = &config.upstreams[0];
        (u.protocol, u.max_concurrent_streams)
    };
    assert_eq!(parsed(""), (crate::UpstreamProtocol::Http1, 100));
    let list_size = |extra: &str| {
        let text = with_upstream(&format!("{servers}{extra}"));
        parse_str(&text, "f").map(|c| c.upstreams[0].max_header_list_size)
    };
    assert_eq!(list_size(""), Ok(64 * 1024));
    assert_eq!(list_size("max_header_list_size = \"8KiB\"\n"), Ok(8 * 1024));
    let h2c = parsed("protocol = \"h2c\"\nmax_concurrent_streams = 7\n");
    assert_eq!(h2c, (crate::UpstreamProtocol::H2c, 7));
    assert_eq!(
        parsed("protocol = \"auto\"\n").0,
        crate::UpstreamProtocol::Auto
    );
    let tls = "tls = { insecure_skip_verify = true }\n";
    let h2 = parsed(&format!("protocol = \"h2\"\n{tls}"));
    assert_eq!(h2.0, crate::UpstreamProtocol::H2);
    check(
        &with_upstream(&format!("{servers}protocol = \"h2c\"\n{tls}")),
        "upstreams.u.protocol",
        6,
        "cleartext HTTP/2, but the upstream has tls",
        "protocol = \"h2\"",
    );
}

#[test]
fn access_log_defaults_to_combined_on_stdout() {
    let config = crate::parse_str(
        "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:0\"\n[listeners.access_log]\n",
        "weir.toml",
    )
    .unwrap();
    let log = config.listeners[0].access_log.clone().unwrap();
    assert_eq!(log.format, crate::AccessLogFormat::Combined);
    assert_eq!(log.target, crate::LogTarget::Stdout);
}

#[test]
fn access_log_rejects_unknown_format() {
    let err = crate::parse_str(
        "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:0\"\n[listeners.access_log]\nformat = \"xml\"\n",
        "weir.toml",
    )
    .unwrap_err();
    assert_eq!(err.field, "listeners[0].access_log.format");
    assert_eq!(err.line, 5);
    assert!(err.fix.contains("json"));
}

#[test]
fn route_upgrades() {
    let upgrades = |line: &str| {
        let config = parse_str(&with_route(line), "f").expect("valid");
        config.listeners[0].routes[0].upgrades.clone()
    };
    assert_eq!(upgrades(""), ["websocket"]);
    assert_eq!(upgrades("upgrades = []\n"), Vec::<String>::new());
    assert_eq!(
        upgrades("upgrades = [\"WebSocket\", \"foo.bar-1\"]\n"),
        ["websocket", "foo.bar-1"]
    );
    let past = "would tunnel HTTP past Weir";
    check_route_line(
        "upgrades = [\"h2c\"]",
        "upgrades[0]",
        past,
        "remove \"h2c\"",
    );
    check_route_line(
        "upgrades = [\"websocket\", \"H2C\"]",
        "upgrades[1]",
        past,
        "remove \"H2C\"",
    );
    check_route_line("upgrades = [\"HTTP\"]", "upgrades[0]", past, "remove");
    let name = "is not a protocol name";
    check_route_line(
        "upgrades = [\"websocket/13\"]",
        "upgrades[0]",
        name,
        "without a version",
    );
    check_route_line("upgrades = [\"\"]", "upgrades[0]", name, "\"websocket\"");
    check_route_line("upgrades = [\"a b\"]", "upgrades[0]", name, "spaces");
    let twice = "upgrades = [\"websocket\", \"WEBSOCKET\"]";
    check_route_line(twice, "upgrades[1]", "listed twice", "once");
    let many: Vec<String> = (0..65).map(|i| format!("\"p{i}\"")).collect();
    let many = format!("upgrades = [{}]", many.join(", "));
    check_route_line(&many, "upgrades", "more than 64", "only the protocols");
}

#[test]
fn path_normalization_settings() {
    use crate::{EncodedSlash, PathNormalization};
    let ok = parse_str(LISTENER, "t").expect("valid");
    assert_eq!(
        ok.listeners[0].path_normalization,
        PathNormalization {
            dot_segments: true,
            merge_slashes: false,
            encoded_slash: EncodedSlash::Reject,
        }
    );
    let ok = parse_str(
        &format!(
            "{LISTENER}path_normalization = {{ dot_segments = false, merge_slashes = true, \
             encoded_slash = \"decode\" }}\n"
        ),
        "t",
    )
    .expect("valid");
    let p = ok.listeners[0].path_normalization;
    assert!(!p.dot_segments && p.merge_slashes);
    assert_eq!(p.encoded_slash, EncodedSlash::Decode);
    check(
        &format!("{LISTENER}[listeners.path_normalization]\nencoded_slash = \"drop\"\n"),
        "listeners[0].path_normalization.encoded_slash",
        5,
        "unknown encoded_slash value \"drop\"",
        "\"reject\" (the default), \"keep\" or \"decode\"",
    );
    check(
        &format!("{LISTENER}protocol = \"tcp\"\nupstream = \"u\"\npath_normalization = {{}}\n[upstreams.u]\nservers = [{{ addr = \"127.0.0.1:1\" }}]\n"),
        "listeners[0].path_normalization",
        6,
        "only to protocol = \"http\"",
        "remove path_normalization",
    );
}

/// Requests are routed on their normalised path: a prefix not in that form never matches.
#[test]
fn path_prefix_must_be_normalised() {
    let field = "listeners[0].routes[0].path_prefix";
    for (prefix, message, fix) in [
        (
            "/a/../b/",
            "contains a dot segment",
            "without \".\" and \"..\"",
        ),
        (
            "/a/./",
            "contains a dot segment",
            "without \".\" and \"..\"",
        ),
        (
            "/a/..;x/",
            "contains a dot segment",
            "without \".\" and \"..\"",
        ),
        ("/%7Euser/", "encodes '~'", "write '~' instead of %7E"),
        (
            "/a%2fb/",
            "encoded_slash = \"reject\" refuses",
            "encoded_slash = \"keep\"",
        ),
        ("/a%zz/", "malformed escape \"%zz\"", "%25"),
        ("/a\\\\b/", "contains '\\'", "remove the backslash"),
    ] {
        check(
            &with_route(&format!("path_prefix = \"{prefix}\"\n")),
            field,
            7,
            message,
            fix,
        );
    }
    // Under other settings the same prefixes may be fine, or wrong for another reason.
    let listener = |settings: &str, prefix: &str| {
        format!(
            "{LISTENER}path_normalization = {{ {settings} }}\n[[listeners.routes]]\nname = \"r\"\n\
             upstream = \"cgi\"\npath_prefix = \"{prefix}\"\n\
             [upstreams.cgi]\nservers = [{{ addr = \"127.0.0.1:8081\" }}]\n"
        )
    };
    for (settings, prefix) in [
        ("encoded_slash = \"keep\"", "/a%2Fb/"),
        ("dot_segments = false", "/a/../b/"),
        ("", "/a//b/"),
        ("", "/caf%C3%A9/"),
    ] {
        parse_str(&listener(settings, prefix), "t").expect(prefix);
    }
    for (settings, prefix, message) in [
        (
            "encoded_slash = \"keep\"",
            "/a%2fb/",
            "lower-case escape %2f",
        ),
        ("encoded_slash = \"decode\"", "/a%2Fb/", "turns into '/'"),
        ("merge_slashes = true", "/a//b/", "contains \"//\""),
    ] {
        check(&listener(settings, prefix), field, 8, message, "");
    }
}

#[test]
fn http2_settings() {
    let ok = crate::parse_str(&format!(
        "{LISTENER}[listeners.http2]\nmax_concurrent_streams = 10\nmax_header_list_size = \"32KiB\"\nreset_window = \"1s\"\n"
    ), "t.toml")
    .expect("valid http2 table");
    let h2 = &ok.listeners[0].http2;
    assert_eq!(
        (h2.max_concurrent_streams, h2.max_header_list_size),
        (10, 32 * 1024)
    );
    assert_eq!(h2.reset_window, std::time::Duration::from_secs(1));
    assert_eq!(h2.reset_budget, crate::Http2::default().reset_budget);
    let base = format!("{LISTENER}[listeners.http2]\n");
    check(
        &format!("{base}max_concurrent_streams = 0\n"),
        "listeners[0].http2.max_concurrent_streams",
        5,
        "between 1 and 65535",
        "default 128",
    );
    check(
        &format!("{base}initial_stream_window = \"4GiB\"\n"),
        "listeners[0].http2.initial_stream_window",
        5,
        "must be between",
        "(the default)",
    );
    check(
        &format!("{base}reset_window = \"0s\"\n"),
        "listeners[0].http2.reset_window",
        5,
        "greater than 0",
        "10s",
    );
    check(
        &format!("{base}glitch_budget = 0\n"),
        "listeners[0].http2.glitch_budget",
        5,
        "between 1 and 1000000",
        "default 1000",
    );
    check(
        &format!("{base}stall_timeout = \"0s\"\n"),
        "listeners[0].http2.stall_timeout",
        5,
        "greater than 0",
        "30s",
    );
    check(
        &format!("{base}max_informational = 101\n"),
        "listeners[0].http2.max_informational",
        5,
        "between 0 and 100",
        "default 8",
    );
    check(
        &format!("{base}max_streams = 5\n"),
        "listeners[0].http2.max_streams",
        5,
        "unknown field",
        "spelling",
    );
}

/// A valid listener (lines 1-3) with a `[listeners.tls]` table (header on line 4).
fn with_tls(lines: &str) -> String {
    format!("{LISTENER}[listeners.tls]\n{lines}")
}

const CERTS: &str =
    "certs = [{ cert = \"a.pem\", key = \"a.key\" }, { cert = \"b.pem\", key = \"b.key\" }]\n";

#[test]
fn tls_defaults_and_values() {
    let ok = parse_str(&with_tls(CERTS), "t").expect("valid");
    let tls = ok.listeners[0].tls.as_ref().expect("tls");
    assert_eq!(tls.certs.len(), 2);
    assert_eq!(tls.certs[1].key, std::path::PathBuf::from("b.key"));
    assert_eq!(tls.default_cert, 0);
    assert_eq!(tls.min_version, crate::TlsVersion::V1_2);
    assert_eq!(tls.alpn, vec!["h2".to_string(), "http/1.1".to_string()]);
    assert!(tls.session_resumption);
    assert_eq!(tls.client_auth, None);
    assert_eq!(tls.client_cert_header, None);
    assert_eq!(tls.handshake_timeout, std::time::Duration::from_secs(10));
    assert_eq!(tls.max_handshakes, 256);
    let ok = parse_str(
        &with_tls(&format!(
            "{CERTS}default_cert = \"b.pem\"\nmin_version = \"1.3\"\nalpn = []\n\
             session_resumption = false\nclient_auth = {{ ca = \"ca.pem\", required = false }}\n\
             client_cert_header = \"X-Client-Cert\"\nhandshake_timeout = \"3s\"\nmax_handshakes = 8\n"
        )),
        "t",
    )
    .expect("valid");
    let tls = ok.listeners[0].tls.as_ref().expect("tls");
    assert_eq!(tls.default_cert, 1);
    assert_eq!(tls.min_version, crate::TlsVersion::V1_3);
    assert!(tls.alpn.is_empty());
    assert!(!tls.session_resumption);
    let auth = tls.client_auth.as_ref().expect("client_auth");
    assert_eq!(auth.ca, std::path::PathBuf::from("ca.pem"));
    assert!(!auth.required);
    assert_eq!(tls.client_cert_header.as_deref(), Some("X-Client-Cert"));
    assert_eq!(tls.handshake_timeout, std::time::Duration::from_secs(3));
    assert_eq!(tls.max_handshakes, 8);
}

#[test]
fn tls_rules() {
    let t = "listeners[0].tls";
    check(
        &with_tls("min_version = \"1.2\"\n"),
        &format!("{t}.certs"),
        4,
        "at least one certificate",
        "certs = [{",
    );
    check(
        &with_tls("certs = []\n"),
        &format!("{t}.certs"),
        5,
        "at least one certificate",
        "cert =",
    );
    check(
        &with_tls("certs = [{ cert = \"a.pem\" }]\n"),
        &format!("{t}.certs[0].key"),
        5,
        "key file is missing",
        "add key =",
    );
    check(
        &with_tls("certs = [{ cert = \" \", key = \"a.key\" }]\n"),
        &format!("{t}.certs[0].cert"),
        5,
        "path is empty",
        "PEM file",
    );
    check(
        &with_tls("certs = [{ cert = \"a.pem\", key = \"a.key\" }, { cert = \"a.pem\", key = \"b.key\" }]\n"),
        &format!("{t}.certs[1].cert"), 5, "listed twice (also certs[0])", "once",
    );
    check(
        &with_tls(&format!("{CERTS}default_cert = \"c.pem\"\n")),
        &format!("{t}.default_cert"),
        6,
        "not one of the listed",
        "\"a.pem\", \"b.pem\"",
    );
    check(
        &with_tls(&format!("{CERTS}min_version = \"1.1\"\n")),
        &format!("{t}.min_version"),
        6,
        "unsupported min_version \"1.1\"",
        "\"1.3\"",
    );
    check(
        &with_tls(&format!("{CERTS}alpn = [\"http/1.1\", \"h3\"]\n")),
        &format!("{t}.alpn[1]"),
        6,
        "does not speak \"h3\"",
        "[\"h2\", \"http/1.1\"]",
    );
    check(
        &with_tls(&format!("{CERTS}alpn = [\"h2\", \"h2\"]\n")),
        &format!("{t}.alpn[1]"),
        6,
        "listed twice",
        "once",
    );
    check(
        &with_tls(&format!("{CERTS}client_auth = {{ required = true }}\n")),
        &format!("{t}.client_auth.ca"),
        6,
        "client CA file is missing",
        "add ca =",
    );
    check(
        &with_tls(&format!("{CERTS}client_cert_header = \"X Cert\"\n")),
        &format!("{t}.client_cert_header"),
        6,
        "not a valid header name",
        "X-Forwarded-Client-Cert",
    );
    check(
        &with_tls(&format!(
            "{CERTS}client_cert_header = \"x-forwarded-for\"\n"
        )),
        &format!("{t}.client_cert_header"),
        6,
        "the proxy sets",
        "of its own",
    );
    check(
        &with_tls(&format!("{CERTS}handshake_timeout = \"0s\"\n")),
        &format!("{t}.handshake_timeout"),
        6,
        "",
        "",
    );
    check(
        &with_tls(&format!("{CERTS}max_handshakes = 0\n")),
        &format!("{t}.max_handshakes"),
        6,
        "",
        "",
    );
    check(
        &with_tls(&format!("{CERTS}ciphers = \"all\"\n")),
        &format!("{t}.ciphers"),
        6,
        "unknown",
        "",
    );
}

/// A TCP listener (lines 1-5) with a `[listeners.tls]` table (line 6), `extra` on line 8.
fn tcp_tls(extra: &str) -> String {
    format!(
        "[[listeners]]\nname = \"t\"\nbind = \"127.0.0.1:1\"\nprotocol = \"tcp\"\nupstream = \"u\"\n\
         [listeners.tls]\n{CERTS}{extra}\n[upstreams.u]\nservers = [{{ addr = \"127.0.0.1:2\" }}]\n"
    )
}

#[test]
fn tls_on_a_tcp_listener_offers_no_alpn_unless_told_and_adds_no_headers() {
    let ok = parse_str(&tcp_tls(""), "t").expect("valid");
    let tls = ok.listeners[0].tls.as_ref().expect("tls");
    assert!(tls.alpn.is_empty());
    let ok = parse_str(&tcp_tls("alpn = [\"imap\", \"h2\"]"), "t").expect("valid");
    let tls = ok.listeners[0].tls.as_ref().expect("tls");
    assert_eq!(tls.alpn, vec!["imap".to_string(), "h2".to_string()]);
    let t = "listeners[0].tls";
    check(
        &tcp_tls("client_cert_header = \"X-Cert\""),
        &format!("{t}.client_cert_header"),
        8,
        "adds no headers",
        "remove client_cert_header",
    );
    check(
        &tcp_tls("alpn = [\"\"]"),
        &format!("{t}.alpn[0]"),
        8,
        "not a valid ALPN",
        "1 to 255 bytes",
    );
    check(
        &tcp_tls("alpn = [\"imap\", \"imap\"]"),
        &format!("{t}.alpn[1]"),
        8,
        "listed twice",
        "once",
    );
}

#[test]
fn sni_routes_behind_tls_offload_may_reach_tls_upstreams() {
    let source = format!(
        "[[listeners]]\nname = \"t\"\nbind = \"127.0.0.1:1\"\nprotocol = \"tcp\"\nupstream = \"u\"\n\
         sni_routes = [{{ hosts = [\"a.example.com\"], upstream = \"u\" }}]\n\
         [listeners.tls]\n{CERTS}\n[upstreams.u]\nservers = [{{ addr = \"127.0.0.1:2\" }}]\n\
         tls = {{ server_name = \"u.internal\" }}\n"
    );
    parse_str(&source, "t").expect("terminated here: one TLS layer to the upstream");
}

#[test]
fn sni_routes() {
    let config = parse_str(
        &format!(
            "{LISTENER}protocol = \"tcp\"\nupstream = \"u\"\npreread_timeout = \"2s\"\n\
             sni_routes = [{{ hosts = [\"A.example.com\", \"*.b.example.com\"], upstream = \"v\" }}]\n\
             [upstreams.u]\nservers = [{{ addr = \"127.0.0.1:8081\" }}]\n\
             [upstreams.v]\nservers = [{{ addr = \"127.0.0.1:8082\" }}]\n"
        ),
        "t",
    )
    .expect("valid");
    let tcp = config.listeners[0].tcp().expect("tcp");
    assert_eq!(tcp.preread_timeout, std::time::Duration::from_secs(2));
    assert_eq!(tcp.sni_routes.len(), 1);
    assert_eq!(tcp.sni_routes[0].upstream, 1);
    assert_eq!(
        tcp.sni_routes[0].hosts,
        vec![
            HostPattern::Exact("a.example.com".into()),
            HostPattern::Suffix(".b.example.com".into())
        ]
    );
    let defaults = parse_str(&tcp_listener(""), "t").expect("valid");
    let tcp = defaults.listeners[0].tcp().expect("tcp");
    assert!(tcp.sni_routes.is_empty());
    assert_eq!(tcp.preread_timeout, std::time::Duration::from_secs(5));
}

#[test]
fn sni_route_errors() {
    let route = |r: &str| tcp_listener(&format!("sni_routes = [{r}]\n"));
    check(
        &route(r#"{ hosts = ["a.example.com"], upstream = "nope" }"#),
        "listeners[0].sni_routes[0].upstream",
        6,
        "unknown upstream \"nope\"",
        "use one of: u",
    );
    check(
        &route(r#"{ hosts = [], upstream = "u" }"#),
        "listeners[0].sni_routes[0].hosts",
        6,
        "at least one host",
        "hosts = [",
    );
    check(
        &route(r#"{ hosts = ["a b"], upstream = "u" }"#),
        "listeners[0].sni_routes[0].hosts[0]",
        6,
        "not a valid host name",
        "labels",
    );
    check(
        &route(r#"{ hosts = ["*"], upstream = "u" }"#),
        "listeners[0].sni_routes[0].hosts[0]",
        6,
        "match every connection",
        "listener's upstream",
    );
    check(
        &route(r#"{ hosts = ["a.x"], upstream = "u" }, { hosts = ["A.x"], upstream = "u" }"#),
        "listeners[0].sni_routes[1].hosts[0]",
        6,
        "more than one SNI route",
        "one SNI route only",
    );
    check(
        &format!(
            "{LISTENER}protocol = \"tcp\"\nupstream = \"u\"\n\
             sni_routes = [{{ hosts = [\"a.x\"], upstream = \"u\" }}]\n\
             [upstreams.u]\nservers = [{{ addr = \"127.0.0.1:8081\" }}]\n\
             tls = {{ insecure_skip_verify = true }}\n"
        ),
        "listeners[0].sni_routes[0].upstream",
        6,
        "second TLS layer",
        "remove tls from [upstreams.u]",
    );
    check(
        &format!("{LISTENER}sni_routes = []\n"),
        "listeners[0].sni_routes",
        4,
        "only to protocol = \"tcp\"",
        "protocol = \"tcp\"",
    );
}

/// A file in the temp dir holding `text`, for the TLS keys' file checks.
fn temp_file(name: &str, text: &str) -> String {
    let path = std::env::temp_dir().join(format!("weir-config-{}-{name}", std::process::id()));
    std::fs::write(&path, text).expect("write a temp file");
    path.display().to_string()
}

/// A certificate-shaped PEM block (PEM parsing does not look inside).
const CERT_PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
const KEY_PEM: &str = "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n";

#[test]
fn upstream_tls_settings() {
    let ca = temp_file("ca.pem", CERT_PEM);
    let key = temp_file("client.key", KEY_PEM);
    let config = parse_str(
        &with_upstream(&format!(
            "servers = [{{ addr = \"127.0.0.1:8443\" }}]\n\
             tls = {{ server_name = \"api.internal\", ca = \"{ca}\", \
             client_cert = {{ cert = \"{ca}\", key = \"{key}\" }} }}\n"
        )),
        "t",
    )
    .expect("valid");
    let tls = config.upstreams[0].tls.as_ref().expect("tls");
    assert_eq!(tls.server_name.as_deref(), Some("api.internal"));
    assert_eq!(tls.ca.as_ref().expect("ca").contents, CERT_PEM.as_bytes());
    assert!(!tls.insecure_skip_verify);
    assert!(config.warnings().is_empty());
    let debug = format!("{:?}", tls.client_cert);
    assert!(!debug.contains("MIIB"), "key bytes never printed: {debug}");
    let insecure = parse_str(
        &with_upstream(
            "servers = [{ addr = \"127.0.0.1:8443\" }]\ntls = { insecure_skip_verify = true }\n",
        ),
        "t",
    )
    .expect("valid");
    let warnings = insecure.warnings();
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].contains("upstreams.u.tls.insecure_skip_verify"));
}

#[test]
fn upstream_tls_errors() {
    let servers = "servers = [{ addr = \"127.0.0.1:8443\" }]\n";
    let tls = |t: &str| with_upstream(&format!("{servers}tls = {{ {t} }}\n"));
    check(
        &tls("server_name = \"not a name\""),
        "upstreams.u.tls.server_name",
        6,
        "not a DNS name or an IP address",
        "api.internal",
    );
    check(
        &tls("ca = \"/nonexistent/weir-ca.pem\""),
        "upstreams.u.tls.ca",
        6,
        "cannot read /nonexistent/weir-ca.pem",
        "check the path",
    );
    let key = temp_file("only-key.pem", KEY_PEM);
    check(
        &tls(&format!("ca = \"{key}\"")),
        "upstreams.u.tls.ca",
        6,
        "holds no PEM certificate",
        "BEGIN CERTIFICATE",
    );
    let cert = temp_file("only-cert.pem", CERT_PEM);
    check(
        &tls(&format!(
            "client_cert = {{ cert = \"{cert}\", key = \"{cert}\" }}"
        )),
        "upstreams.u.tls.client_cert.key",
        6,
        "holds no PEM private key",
        "PKCS#8",
    );
    check(
        &tls(&format!("client_cert = {{ cert = \"{cert}\" }}")),
        "upstreams.u.tls.client_cert.key",
        6,
        "client_cert has no key",
        "client_cert = {",
    );
}

#[test]
fn redirect_https_is_refused_on_a_tls_listener() {
    check(
        &format!("{LISTENER}redirect_https = true\n[listeners.tls]\n{CERTS}"),
        "listeners[0].redirect_https",
        4,
        "redirects HTTPS requests to themselves",
        "plain-HTTP listener",
    );
}

#[test]
fn tls_automatic_certificates() {
    let ok = parse_str(&with_tls("internal_ca = { storage = \"ca\" }\n"), "t").expect("valid");
    let tls = ok.listeners[0].tls.as_ref().expect("tls");
    assert!(tls.certs.is_empty());
    let ca = tls.internal_ca.as_ref().expect("internal_ca");
    assert_eq!(
        ca.names,
        vec!["localhost", "127.0.0.1"],
        "no route host: loopback"
    );
    assert_eq!(ca.lifetime, std::time::Duration::from_secs(168 * 3600));
    let acme =
        "acme = { domains = [\"Example.com\"], storage = \"s\", contact = \"mailto:a@b.c\" }\n";
    let ok = parse_str(&with_tls(acme), "t").expect("valid");
    let a = ok.listeners[0]
        .tls
        .as_ref()
        .unwrap()
        .acme
        .clone()
        .expect("acme");
    assert_eq!(a.domains, vec!["example.com"]);
    assert_eq!(
        a.directory,
        "https://acme-v02.api.letsencrypt.org/directory"
    );
    assert_eq!(a.challenge, crate::AcmeChallenge::TlsAlpn01);
    assert_eq!(a.retry_initial, std::time::Duration::from_secs(10));
    let t = "listeners[0].tls.acme";
    let cases = [
        (
            "acme = { domains = [\"*.a.com\"], storage = \"s\" }",
            "domains[0]",
            "DNS-01",
        ),
        (
            "acme = { domains = [\"10.0.0.1\"], storage = \"s\" }",
            "domains[0]",
            "not a DNS name",
        ),
        (
            "acme = { domains = [], storage = \"s\" }",
            "domains",
            "names to order",
        ),
        (
            "acme = { domains = [\"a.com\"], storage = \" \" }",
            "storage",
            "storage directory",
        ),
        (
            "acme = { domains = [\"a.com\"], storage = \"s\", challenge = \"dns-01\" }",
            "challenge",
            "unknown challenge",
        ),
        (
            "acme = { domains = [\"a.com\"], storage = \"s\", directory = \"http://x/\" }",
            "directory",
            "https://",
        ),
        (
            "acme = { domains = [\"a.com\"], storage = \"s\", contact = \"ops@x\" }",
            "contact",
            "mailto:",
        ),
        (
            "acme = { domains = [\"a.com\"], storage = \"s\", directory_ca = \"/dev/zero\" }",
            "directory_ca",
            "not a regular file",
        ),
        (
            "acme = { domains = [\"a.com\"], storage = \"s\", retry_initial = \"100ms\" }",
            "retry_initial",
            "at least 1s",
        ),
    ];
    for (line, field, message) in cases {
        let e = parse_str(&with_tls(&format!("{line}\n")), "t").expect_err(line);
        assert_eq!(e.field, format!("{t}.{field}"), "{e}");
        assert_eq!(e.line, 5, "{e}");
        assert!(e.to_string().contains(message), "{e}");
    }
    let both =
        "acme = { domains = [\"a.com\"], storage = \"s\" }\ninternal_ca = { storage = \"c\" }\n";
    let e = parse_str(&with_tls(both), "t").expect_err("both");
    assert!(e.to_string().contains("not both"), "{e}");
    let short = "internal_ca = { storage = \"c\", lifetime = \"2s\" }\n";
    let e = parse_str(&with_tls(short), "t").expect_err("short lifetime");
    assert_eq!(e.field, "listeners[0].tls.internal_ca.lifetime", "{e}");
    assert!(e.to_string().contains("at least 5s"), "{e}");
}

#[test]
fn internal_ca_names_come_from_route_hosts() {
    let text = format!(
        "{LISTENER}[listeners.tls]\ninternal_ca = {{ storage = \"ca\" }}\n\
         [[listeners.routes]]\nname = \"a\"\nhosts = [\"App.test\", \"*.api.test\"]\nrespond = {{ status = 200 }}\n"
    );
    let ok = parse_str(&text, "t").expect("valid");
    let ca = ok.listeners[0]
        .tls
        .as_ref()
        .unwrap()
        .internal_ca
        .clone()
        .unwrap();
    assert_eq!(ca.names, vec!["app.test", "*.api.test"]);
}

#[test]
fn http3_is_off_by_default_and_on_with_true_or_a_table() {
    let http3 = |line: &str| {
        let text = format!("{LISTENER}{line}\n[listeners.tls]\n{CERTS}");
        parse_str(&text, "t").map(|c| c.listeners[0].http3.clone())
    };
    assert_eq!(http3(""), Ok(None));
    assert_eq!(http3("http3 = false"), Ok(None));
    assert_eq!(http3("http3 = true"), Ok(Some(crate::Http3::default())));
    assert_eq!(http3("http3 = { enabled = false }"), Ok(None));
    let set = http3(
        "http3 = { max_concurrent_streams = 7, stream_window = \"64KiB\", \
         connection_window = \"2MiB\", idle_timeout = \"5s\", max_field_section_size = 4096, \
         alt_svc_max_age = \"1h\", early_data = true }",
    )
    .unwrap()
    .unwrap();
    assert!(set.early_data);
    assert!(
        !crate::Http3::default().early_data,
        "0-RTT is off by default"
    );
    assert_eq!(set.max_concurrent_streams, 7);
    assert_eq!(set.stream_window, 64 * 1024);
    assert_eq!(set.connection_window, 2 * 1024 * 1024);
    assert_eq!(set.idle_timeout, std::time::Duration::from_secs(5));
    assert_eq!(set.max_field_section_size, 4096);
    assert_eq!(set.alt_svc_max_age, std::time::Duration::from_secs(3600));
}

#[test]
fn http3_errors() {
    check_listener_line(
        "http3 = true",
        "needs an HTTP listener with [listeners.tls]",
        "add a [listeners.tls]",
    );
    let with = |table: &str| format!("{LISTENER}http3 = {{ {table} }}\n[listeners.tls]\n{CERTS}");
    let cases = [
        (
            "max_concurrent_streams = 0",
            "max_concurrent_streams",
            "between 1 and 10000",
            "default 100",
        ),
        (
            "stream_window = 10",
            "stream_window",
            "between 1024 and",
            "\"256KiB\"",
        ),
        (
            "idle_timeout = \"0s\"",
            "idle_timeout",
            "greater than 0",
            "\"30s\"",
        ),
        (
            "max_field_section_size = \"64MiB\"",
            "max_field_section_size",
            "between 1024",
            "\"64KiB\"",
        ),
        ("bogus = 1", "http3.bogus", "unknown field", ""),
    ];
    for (table, key, message, fix) in cases {
        let field = match key.starts_with("http3") {
            true => format!("listeners[0].{key}"),
            false => format!("listeners[0].http3.{key}"),
        };
        check(&with(table), &field, 4, message, fix);
    }
    let early = |tls: &str| {
        format!("{LISTENER}http3 = {{ early_data = true }}\n[listeners.tls]\n{tls}\n{CERTS}")
    };
    let field = "listeners[0].http3.early_data";
    let fix = "remove early_data";
    let resumption = early("session_resumption = false");
    check(&resumption, field, 4, "needs tls.session_resumption", fix);
    let client_auth = early("client_auth = { ca = \"ca.pem\" }");
    check(
        &client_auth,
        field,
        4,
        "cannot be used with tls.client_auth",
        fix,
    );
}

#[test]
fn http3_sets_alt_svc_on_every_route_unless_the_route_names_it() {
    let rules = |bind: &str, route: &str| {
        let text = format!(
            "[[listeners]]\nname = \"web\"\nbind = \"{bind}\"\nhttp3 = true\n[listeners.tls]\n{CERTS}\
             [[listeners.routes]]\nname = \"r\"\nrespond = {{ status = 200 }}\n{route}"
        );
        let config = parse_str(&text, "t").expect("valid");
        let rules = config.listeners[0].routes[0]
            .filters
            .response_headers
            .clone();
        rules.map(|r| {
            (
                r.set
                    .iter()
                    .map(|s| format!("{}: {:?}", s.name, s.value.0))
                    .collect::<Vec<_>>(),
                r.drop,
            )
        })
    };
    let (set, drop) = rules("127.0.0.1:8443", "").expect("rules");
    assert_eq!(set.len(), 1);
    assert!(
        set[0].starts_with("Alt-Svc: ") && set[0].contains("h3=\\\":8443\\\"; ma=86400"),
        "{set:?}"
    );
    assert_eq!(drop, vec!["alt-svc".to_string()]);
    // Port 0: nothing to advertise, no rules made.
    assert_eq!(rules("127.0.0.1:0", ""), None);
    // The route's own Alt-Svc rule wins.
    let own = "response_headers = { remove = [\"Alt-Svc\"] }\n";
    let (set, drop) = rules("127.0.0.1:8443", own).expect("rules");
    assert!(set.is_empty(), "{set:?}");
    assert_eq!(drop, vec!["alt-svc".to_string()]);
}

#[test]
fn client_auth_with_an_http_bind_serving_routes_is_warned_about() {
    let auth = "client_auth = { ca = \"ca.pem\", required = true }\n";
    let listener = |extra: &str| {
        let head = LISTENER.replace(
            "bind = \"127.0.0.1:8080\"\n",
            &format!("bind = \"127.0.0.1:8443\"\n{extra}"),
        );
        format!("{head}[listeners.tls]\n{CERTS}{auth}")
    };
    let serving = parse_str(&listener("http_bind = \"127.0.0.1:8080\"\n"), "t").expect("valid");
    let warnings = serving.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("listeners.web.tls.client_auth"));
    assert!(warnings[0].contains("127.0.0.1:8080"));
    assert!(warnings[0].contains("redirect_https = true"));
    let redirecting = listener("http_bind = \"127.0.0.1:8080\"\nredirect_https = true\n");
    let quiet = [redirecting, listener("")];
    for text in quiet {
        let config = parse_str(&text, "t").expect("valid");
        assert!(config.warnings().is_empty(), "{text}");
    }
}
