//! Weir's configuration: the TOML file, its validation, and the validated model.
//!
//! [`load_file`] and [`parse_str`] turn a `weir.toml` into a [`Config`] in three steps:
//! the text is parsed as TOML (keeping spans), deserialized into raw structs that mirror
//! the file and reject unknown keys, then validated: defaults are filled in, durations,
//! sizes and addresses parsed, names resolved. Any failure is a single [`ConfigError`]
//! naming the file, line, column and key, with a message and a suggested fix.
//!
//! The crate does no I/O beyond reading the file, except that upstream server addresses
//! written as `host:port` are resolved once, at load time.

#![forbid(unsafe_code)]

pub mod cluster;
pub mod model;

pub mod diff;
mod error;
pub mod field_diff;
pub mod named_file;
mod paths;
mod raw;
#[cfg(feature = "schema")]
mod schema;
mod units;
mod validate;

use std::path::Path;

pub use error::{listener_field, ConfigError};
pub use model::*;
pub use paths::RelativePath;
#[cfg(feature = "schema")]
pub use schema::schema;
pub use units::{parse_duration, parse_size};

use error::Source;

/// Weir's state directory: where automatic certificates are kept when `storage` is not
/// written (`acme` in it for ACME, `ca` for the internal CA). `$STATE_DIRECTORY` (set by
/// systemd's `StateDirectory=weir`: /var/lib/weir), else `$XDG_DATA_HOME/weir`, else
/// `$HOME/.local/share/weir` (Caddy's choice too), else /var/lib/weir. Read from the
/// environment when a config is validated: `weir check` shows the result.
pub fn state_dir() -> std::path::PathBuf {
    use std::path::PathBuf;
    let absolute = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    if let Some(dirs) = std::env::var_os("STATE_DIRECTORY") {
        // systemd lists one directory per StateDirectory= entry, separated by colons.
        let dirs = dirs.to_string_lossy().into_owned();
        if let Some(first) = dirs.split(':').map(PathBuf::from).find(|p| p.is_absolute()) {
            return first;
        }
    }
    if let Some(data) = absolute("XDG_DATA_HOME") {
        return data.join("weir");
    }
    match absolute("HOME") {
        Some(home) => home.join(".local/share/weir"),
        None => PathBuf::from("/var/lib/weir"),
    }
}

/// Reads and validates the configuration file at `path`.
///
/// A file that cannot be read (missing, unreadable, not UTF-8) is a [`ConfigError`] too,
/// with `line` 0; errors name the file as `path` displays.
pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
    load_file_with_text(path).map(|(config, _)| config)
}

/// Like [`load_file`], also returning the text (the admin API edits and persists it).
/// Relative paths in it resolve against the file's directory.
pub fn load_file_with_text(path: &Path) -> Result<(Config, String), ConfigError> {
    let file = path.display().to_string();
    let text = read_config(path).map_err(|e| ConfigError::io(&file, &e))?;
    Ok((parse_in(&text, &file, Some(&config_dir(path)))?, text))
}

/// Only the `[admin]` section of the config file at `path` (what `weir ctl -c FILE` needs
/// to reach the admin API), validated as a load would; the rest of the file is not looked
/// at, so a file being edited still names its admin listener.
pub fn load_admin(path: &Path) -> Result<AdminSettings, ConfigError> {
    /// The file, every section but `[admin]` ignored.
    #[derive(serde::Deserialize)]
    struct AdminOnly {
        admin: Option<raw::RawAdmin>,
    }
    let file = path.display().to_string();
    let text = read_config(path).map_err(|e| ConfigError::io(&file, &e))?;
    let src = Source {
        file: &file,
        text: &text,
    };
    let doc = toml_edit::ImDocument::parse(text.as_str()).map_err(|e| src.syntax_error(&e))?;
    let only: AdminOnly = toml::from_str(&text).map_err(|e| src.shape_error(&doc, &e))?;
    let mut raw = raw::RawConfig {
        admin: only.admin,
        ..Default::default()
    };
    paths::resolve(&mut raw, &config_dir(path));
    let at = error::FieldPath::default().key("admin");
    validate::admin(raw.admin.unwrap_or_default(), &at).map_err(|i| src.issue_error(&doc, i))
}

/// `[server] log_format` of the config file at `path`, read before the file is loaded
/// (the log is set up first); `None` when absent or unreadable. A bad value is reported
/// by the load itself.
pub fn peek_log_format(path: &Path) -> Option<LogFormat> {
    let text = read_config(path).ok()?;
    let table: toml::Table = text.parse().ok()?;
    LogFormat::parse(table.get("server")?.get("log_format")?.as_str()?)
}

/// The text of the config file at `path`: a regular file of at most
/// [`named_file::MAX_FILE_SIZE`], in UTF-8.
pub fn read_config(path: &Path) -> std::io::Result<String> {
    named_file::read_to_string(path, named_file::MAX_FILE_SIZE)
}

/// The directory relative paths in the config file at `path` resolve against.
pub fn config_dir(path: &Path) -> std::path::PathBuf {
    paths::base_of(path)
}

/// Parses and validates configuration text; `file_name` is used in error messages.
/// Relative paths stay relative to the working directory (see [`parse_in`]).
pub fn parse_str(source: &str, file_name: &str) -> Result<Config, ConfigError> {
    parse_in(source, file_name, None)
}

/// Like [`parse_str`], relative paths resolved against `base` (the directory of the
/// config file the text is, or will be written to) when given.
pub fn parse_in(source: &str, file_name: &str, base: Option<&Path>) -> Result<Config, ConfigError> {
    let src = Source {
        file: file_name,
        text: source,
    };
    let doc = toml_edit::ImDocument::parse(source).map_err(|e| src.syntax_error(&e))?;
    let mut raw: raw::RawConfig = toml::from_str(source).map_err(|e| src.shape_error(&doc, &e))?;
    let relative_paths = base.map_or_else(Vec::new, |b| paths::resolve(&mut raw, b));
    let mut config = validate::config(raw).map_err(|issue| src.issue_error(&doc, issue))?;
    config.relative_paths = relative_paths;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::time::Duration;

    const FULL: &str = r#"[server]
workers = "auto"
drain_timeout = "30s"

[admin]
bind = "127.0.0.1:9901"

[[listeners]]
name = "web"
bind = "127.0.0.1:8080"
protocol = "http"
backlog = 4096
max_connections = 10000
keepalive_timeout = "5s"
keepalive_requests = 500
header_timeout = "10s"
client_timeout = "60s"
max_body_size = "0"
max_header_size = "16KiB"
max_headers = 100
default_response = { status = 404, body = "no route\n", content_type = "text/plain" }

[[listeners.routes]]
name = "cgi"
hosts = ["*"]
path_prefix = "/cgi/"
rewrite_prefix = "/"
reverse_rewrite = false
preserve_host = true
forwarded_headers = true
upstream = "cgi"

[upstreams.cgi]
servers = [{ addr = "127.0.0.1:8081" }]
connect_timeout = "2s"
response_timeout = "60s"
idle_timeout = "60s"
max_idle = 256
"#;

    fn addr(text: &str) -> SocketAddr {
        text.parse().expect("test address")
    }

    fn listener(name: &str, bind: &str, routes: Vec<Route>) -> Listener {
        Listener {
            name: name.into(),
            binds: vec![Bind::new(addr(bind))],
            protocol: Protocol::Http,
            proxy_protocol: ProxyProtocol::default(),
            tls: None,
            backlog: 4096,
            defer_accept: true,
            max_connections: 10_000,
            keepalive_timeout: Duration::from_secs(5),
            keepalive_requests: 500,
            header_timeout: Duration::from_secs(10),
            client_timeout: Duration::from_secs(60),
            min_body_rate: Some(MinBodyRate {
                bytes_per_second: 240,
                grace: Duration::from_secs(5),
            }),
            tunnel_idle_timeout: Duration::from_secs(3600),
            tunnel_fin_timeout: Duration::from_secs(3600),
            tunnel_min_progress: 16 * 1024,
            max_body_size: None,
            max_header_size: 16 * 1024,
            max_headers: 100,
            max_informational: 8,
            http2: Http2::default(),
            http3: None,
            default_response: DefaultResponse {
                status: 404,
                body: "no route\n".into(),
                content_type: "text/plain".into(),
            },
            access_log: None,
            path_normalization: PathNormalization::default(),
            routes,
            redirect_https: None,
            policy: ListenerPolicy::default(),
        }
    }

    fn parse(source: &str) -> Config {
        match parse_str(source, "weir.toml") {
            Ok(config) => config,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }

    pub(crate) fn fail(source: &str) -> ConfigError {
        parse_str(source, "weir.toml").expect_err("the configuration should be rejected")
    }

    #[test]
    fn full_example_parses_into_the_model() {
        let route = Route {
            name: "cgi".into(),
            hosts: vec![HostPattern::Any],
            path_prefix: "/cgi/".into(),
            rewrite_prefix: Some("/".into()),
            reverse_rewrite: false,
            preserve_host: true,
            forwarded_headers: true,
            upgrades: vec!["websocket".into()],
            matching: RouteMatch::default(),
            target: RouteTarget::Upstream(0),
            split_fallback: true,
            filters: Default::default(),
            trace_sampling: None,
        };
        let expected = Config {
            server: ServerSettings {
                workers: Workers::Auto,
                drain_timeout: Duration::from_secs(30),
                cert_check_interval: Duration::from_secs(5),
                log_format: LogFormat::Text,
                background_revalidations: 64,
                password_checks: 4,
            },
            admin: AdminSettings {
                bind: Some(addr("127.0.0.1:9901")),
                token_file: None,
                allowed_hosts: Vec::new(),
                header_timeout: Duration::from_secs(10),
                idle_timeout: Duration::from_secs(60),
                max_connections: 64,
                dashboard: Some(DashboardSettings::default()),
            },
            listeners: vec![listener("web", "127.0.0.1:8080", vec![route])],
            upstreams: vec![Upstream {
                name: "cgi".into(),
                servers: vec![UpstreamServer {
                    name: "127.0.0.1:8081".into(),
                    addr: addr("127.0.0.1:8081"),
                    weight: 1,
                    max_connections: None,
                    backup: false,
                    drain: false,
                }],
                connect_timeout: Duration::from_secs(2),
                response_timeout: Duration::from_secs(60),
                idle_timeout: Duration::from_secs(60),
                max_idle: 256,
                lb: LbPolicy::RoundRobin,
                health_check: None,
                passive: PassiveHealth {
                    max_fails: 1,
                    fail_timeout: Duration::from_secs(10),
                    slow_start: Duration::from_secs(10),
                },
                retry: RetryPolicy {
                    attempts: 1,
                    on: RetryOn {
                        connect_error: true,
                        reset_before_response: true,
                        timeout: false,
                        statuses: Vec::new(),
                    },
                    budget_percent: 20,
                },
                tls: None,
                protocol: UpstreamProtocol::Http1,
                max_concurrent_streams: 100,
                max_header_list_size: 64 * 1024,
                discover: None,
            }],
            cluster: Default::default(),
            tracing: None,
            caches: Vec::new(),
            relative_paths: Vec::new(),
        };
        assert_eq!(parse(FULL), expected);
        assert_eq!(
            expected.summary(),
            "1 listener(s), 1 route(s), 1 upstream(s), 1 server(s)"
        );
    }

    #[test]
    fn minimal_config_gets_the_defaults() {
        let config = parse("[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\n");
        let expected = Config {
            server: ServerSettings {
                workers: Workers::Auto,
                drain_timeout: Duration::from_secs(30),
                cert_check_interval: Duration::from_secs(5),
                log_format: LogFormat::Text,
                background_revalidations: 64,
                password_checks: 4,
            },
            admin: AdminSettings {
                bind: Some(addr("127.0.0.1:9901")),
                token_file: None,
                allowed_hosts: Vec::new(),
                header_timeout: Duration::from_secs(10),
                idle_timeout: Duration::from_secs(60),
                max_connections: 64,
                dashboard: Some(DashboardSettings::default()),
            },
            listeners: vec![listener("web", "127.0.0.1:8080", Vec::new())],
            upstreams: Vec::new(),
            cluster: Default::default(),
            tracing: None,
            caches: Vec::new(),
            relative_paths: Vec::new(),
        };
        assert_eq!(config, expected);
    }

    /// Every section with values other than the defaults.
    const NON_DEFAULT: &str = r#"
server = { workers = 8, drain_timeout = "0s" }
admin = { bind = "off" }
[[listeners]]
name = "a.b-c_d"
bind = "[::1]:0"
max_body_size = "10MB"
max_header_size = 2048
keepalive_timeout = "0"
keepalive_requests = 0
default_response = { status = 503 }
[[listeners.routes]]
name = "r"
hosts = ["Example.COM", "*.Example.org", "[::1]"]
path_prefix = "/app"
rewrite_prefix = "/"
reverse_rewrite = true
preserve_host = false
forwarded_headers = false
upstream = "b"
[upstreams.b]
servers = [{ addr = "localhost:9000" }, { addr = "[::1]:9001" }]
idle_timeout = "0s"
max_idle = 0
[upstreams.a]
servers = [{ addr = "10.0.0.1:80" }]
"#;

    #[test]
    fn non_default_values() {
        let config = parse(NON_DEFAULT);
        assert_eq!(config.server.workers, Workers::Count(8));
        assert_eq!(config.server.drain_timeout, Duration::ZERO);
        assert_eq!(config.admin.bind, None);
        let l = &config.listeners[0];
        assert_eq!(l.binds, vec![Bind::new(addr("[::1]:0"))]);
        assert_eq!(l.max_body_size, Some(10_000_000));
        assert_eq!(l.max_header_size, 2048);
        assert_eq!(l.keepalive_timeout, Duration::ZERO);
        assert_eq!(l.keepalive_requests, 0);
        assert_eq!(l.default_response.status, 503);
        assert_eq!(l.default_response.body, "no route\n");
        let r = &l.routes[0];
        assert_eq!(
            r.hosts,
            vec![
                HostPattern::Exact("example.com".into()),
                HostPattern::Suffix(".example.org".into()),
                HostPattern::Exact("[::1]".into()),
            ]
        );
        assert!(r.reverse_rewrite && !r.preserve_host && !r.forwarded_headers);
    }

    #[test]
    fn upstreams_are_sorted_and_resolved() {
        let config = parse(NON_DEFAULT);
        let names: Vec<&str> = config.upstreams.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(
            config.listeners[0].routes[0].target,
            RouteTarget::Upstream(1),
            "the route names \"b\""
        );
        let b = &config.upstreams[1];
        assert_eq!(b.servers[0].name, "localhost:9000");
        assert_eq!(b.servers[0].addr.port(), 9000);
        assert!(b.servers[0].addr.ip().is_loopback());
        assert_eq!(b.servers[1].addr, addr("[::1]:9001"));
        assert_eq!((b.idle_timeout, b.max_idle), (Duration::ZERO, 0));
    }

    #[test]
    fn syntax_error_reports_line_and_column() {
        let e = fail("[[listeners]]\nname = \"web\nbind = \"127.0.0.1:8080\"\n");
        assert_eq!((e.line, e.column), (2, 12), "{e}");
        assert!(e.message.contains("string"), "{e}");
        assert!(e.to_string().starts_with("weir.toml:2:12: "), "{e}");

        let e = fail("[[listeners]]\nname = \"web\"\nbind = = 1\n");
        assert_eq!((e.line, e.column), (3, 8), "{e}");
        assert!(e.fix.starts_with("write a valid value"), "{e}");

        let e = fail("[[listeners]\nname = \"a\"\n");
        assert_eq!((e.line, e.column), (1, 12), "{e}");
        assert!(e.message.contains("`]]`"), "{e}");

        let e = fail("[[listeners]]\nname = \"a\"\nname = \"b\"\n");
        assert_eq!(e.line, 3, "{e}");
        assert!(e.message.contains("duplicate key"), "{e}");
    }

    /// Was: `weir.toml:2:11:  (fix: correct the TOML syntax at this position)`, no message
    /// (toml_edit gives none where the text ends), in `weir check` and the API alike.
    #[test]
    fn a_file_cut_off_after_an_equals_sign_says_so() {
        for text in [
            "[server]\nworkers = ",
            "x = ",
            "[[listeners]]\nname = \"a\"\nbind =",
        ] {
            let e = fail(text);
            assert!(e.message.contains("a value is missing"), "{e}");
            assert!(e.message.contains("cut off"), "{e}");
            assert!(e.fix.contains("complete the line"), "{e}");
            assert_eq!(e.line, text.lines().count(), "{e}");
        }
    }

    #[test]
    fn password_checks_is_bounded() {
        let listener = "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:1\"\n";
        let config = parse(&format!("[server]\npassword_checks = 32\n{listener}"));
        assert_eq!(config.server.password_checks, 32);
        let e = fail(&format!("[server]\npassword_checks = 0\n{listener}"));
        assert_eq!(e.line, 2, "{e}");
        assert!(e.message.contains("between 1 and 1024"), "{e}");
    }

    #[test]
    fn background_revalidations_is_bounded() {
        let listener = "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:1\"\n";
        let config = parse(&format!(
            "[server]\nbackground_revalidations = 0\n{listener}"
        ));
        assert_eq!(config.server.background_revalidations, 0);
        let e = fail(&format!(
            "[server]\nbackground_revalidations = -1\n{listener}"
        ));
        assert_eq!(e.line, 2, "{e}");
        assert!(e.message.contains("between 0 and 100000"), "{e}");
    }

    #[test]
    fn unknown_keys_are_rejected_where_they_are() {
        let cases = [
            (
                "lisener = 1\n[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:1\"\n",
                1,
                "lisener",
            ),
            (
                "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:1\"\nbakclog = 5\n",
                4,
                "listeners[0].bakclog",
            ),
            (
                "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:1\"\n[[listeners.routes]]\n\
                 name = \"r\"\nupstream = \"u\"\npath = \"/\"\n",
                7,
                "listeners[0].routes[0].path",
            ),
            (
                "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:1\"\n[upstreams.u]\n\
                 servers = [{ addr = \"127.0.0.1:2\" }]\ntimeout = \"1s\"\n",
                6,
                "upstreams.u.timeout",
            ),
            (
                "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:1\"\n[upstreams.u]\n\
                 servers = [{ addr = \"127.0.0.1:2\", wieght = 2 }]\n",
                5,
                "upstreams.u.servers[0].wieght",
            ),
            ("[servre]\n", 1, "servre"),
        ];
        for (source, line, field) in cases {
            let e = fail(source);
            assert_eq!((e.line, e.field.as_str()), (line, field), "{e}");
            assert!(e.message.starts_with("unknown field"), "{e}");
            assert!(
                e.message.contains("expected"),
                "lists the accepted keys: {e}"
            );
            assert!(
                e.fix == "remove the key or correct its spelling"
                    || e.fix.starts_with("did you mean"),
                "{e}"
            );
        }
    }

    /// Was: an unknown key listed every listener key, TCP ones for an HTTP listener too,
    /// and no suggestion.
    #[test]
    fn unknown_keys_suggest_the_near_one_among_the_keys_that_fit() {
        let http = "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:1\"\nbakclog = 5\n";
        let e = fail(http);
        assert_eq!(
            e.fix, "did you mean `backlog`? Rename the key, or remove it",
            "{e}"
        );
        assert!(e.message.contains("`keepalive_timeout`"), "{e}");
        assert!(
            !e.message.contains("`splice`") && !e.message.contains("`sni_routes`"),
            "{e}"
        );
        let tcp = "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:1\"\nprotocol = \"tcp\"\n\
                   upstream = \"u\"\nsplise = \"on\"\n";
        let e = fail(tcp);
        assert_eq!(
            e.fix, "did you mean `splice`? Rename the key, or remove it",
            "{e}"
        );
        assert!(
            !e.message.contains("`keepalive_timeout`") && !e.message.contains("`routes`"),
            "{e}"
        );
        let e = fail("[upstreams.u]\nservers = [{ addr = \"127.0.0.1:2\", wieght = 2 }]\n");
        assert!(e.fix.contains("`weight`"), "{e}");
        let e = fail("lisener = 1\n");
        assert!(e.fix.contains("`listeners`"), "{e}");
    }

    #[test]
    fn wrong_types_are_reported_with_a_fix() {
        let base = "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:1\"\n";
        let e = fail(&format!("{base}header_timeout = 5\n"));
        assert_eq!((e.line, e.column), (4, 18), "{e}");
        assert_eq!(e.field, "listeners[0].header_timeout");
        assert!(e.fix.contains("\"5s\""), "{e}");

        let e = fail(&format!("{base}backlog = \"10\"\n"));
        assert_eq!(e.field, "listeners[0].backlog");
        assert!(e.fix.contains("whole number"), "{e}");

        let e = fail("[upstreams.u]\nservers = [\"127.0.0.1:2\"]\n");
        assert_eq!(e.field, "upstreams.u.servers[0]", "{e}");
        assert!(e.message.ends_with("expected a table"), "{e}");
    }

    #[test]
    fn load_file_reads_and_names_the_file() {
        let dir = std::env::temp_dir().join(format!("weir-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("weir.toml");
        std::fs::write(&path, FULL).expect("write temp file");
        assert_eq!(load_file(&path), parse_str(FULL, "x"));

        std::fs::write(&path, "[[listeners]]\nname = 1\n").expect("write temp file");
        let e = load_file(&path).expect_err("bad file");
        assert_eq!(e.file, path.display().to_string());
        assert_eq!(e.line, 2);

        let missing = dir.join("missing.toml");
        let e = load_file(&missing).expect_err("missing file");
        assert_eq!(
            (e.file.as_str(), e.line),
            (missing.to_str().unwrap_or_default(), 0)
        );
        assert!(e.message.contains("cannot read"), "{e}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
