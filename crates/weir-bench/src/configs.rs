//! Configuration files of the peers, rendered from the templates under `bench/templates/`
//! (which hold the fairness settings) with the run's ports, paths, backends and routes.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::{bail, Result};

use crate::peers::{Route, Setup, TlsFiles, CGI_PREFIX, NO_ROUTE};

const NGINX_T: &str = include_str!("../../../bench/templates/nginx.conf");
const HAPROXY_T: &str = include_str!("../../../bench/templates/haproxy.cfg");
const CADDY_T: &str = include_str!("../../../bench/templates/Caddyfile");
const APACHE_T: &str = include_str!("../../../bench/templates/apache.conf");
const WEIR_T: &str = include_str!("../../../bench/templates/weir.toml");

/// Replaces each `{{KEY}}`; fails if a placeholder is left over.
pub fn render(template: &str, vars: &[(&str, &str)]) -> Result<String> {
    let mut s = template.to_string();
    for (k, v) in vars {
        s = s.replace(&format!("{{{{{k}}}}}"), v);
    }
    if let Some(i) = s.find("{{") {
        let end = s[i..].find("}}").map_or(s.len(), |e| i + e + 2);
        bail!("template placeholder {} not filled", &s[i..end]);
    }
    Ok(s)
}

fn addr_list(backends: &[SocketAddr], f: impl Fn(&SocketAddr) -> String) -> String {
    backends.iter().map(f).collect::<Vec<_>>().join("")
}

/// nginx's configuration; with `tls`, its server listens with `ssl http2`.
pub fn nginx_conf(
    name: &str,
    dir: &Path,
    port: u16,
    upstream: &str,
    locations: &str,
    tls: Option<&TlsFiles>,
) -> Result<String> {
    let (listen, server) = match tls {
        None if upstream.contains(H2C_MARK) => (" http2".to_string(), String::new()),
        None => (String::new(), String::new()),
        // With a second (RSA) server on the port, this one stays the default.
        Some(t) => (
            format!(
                " ssl http2{}",
                if t.rsa.is_some() {
                    " default_server"
                } else {
                    ""
                }
            ),
            nginx_tls_keys(&t.cert, &t.key),
        ),
    };
    render(
        NGINX_T,
        &[
            ("NAME", name),
            ("DIR", &dir.to_string_lossy()),
            ("PORT", &port.to_string()),
            ("LISTEN_TLS", &listen),
            ("SERVER_TLS", &server),
            ("UPSTREAM", upstream),
            ("LOCATIONS", locations),
        ],
    )
}

/// A comment in the `upstream` text that asks `nginx_conf` for an h2c listener.
const H2C_MARK: &str = "# h2c listener\n";
/// The `ssl_*` lines of an nginx server. nginx 1.22's default `ssl_protocols` lacks
/// TLSv1.3 (added to the default in 1.23.4): without this line it answers TLS 1.3 clients
/// with TLS 1.2, or refuses those that offer only 1.3.
fn nginx_tls_keys(cert: &Path, key: &Path) -> String {
    format!(
        "        ssl_certificate {};\n        ssl_certificate_key {};\n        ssl_protocols TLSv1.2 TLSv1.3;\n        ssl_session_cache shared:SSL:10m;\n",
        cert.display(),
        key.display()
    )
}

/// With an RSA certificate (`tls-handshake`), a second nginx server on the same port for
/// its name, answering like the first.
fn nginx_rsa_server(s: &Setup, port: u16, locations: &str) -> String {
    let Some((cert, key)) = s.tls.and_then(|t| t.rsa.as_ref()) else {
        return String::new();
    };
    format!(
        "    server {{\n        listen 127.0.0.1:{port} ssl http2;\n        server_name {};\n{}{locations}    }}\n",
        crate::handshakes::RSA_NAME,
        nginx_tls_keys(cert, key)
    )
}

pub fn nginx_proxy(s: &Setup, port: u16) -> Result<String> {
    let no_route =
        format!("        location / {{\n            return 404 \"{NO_ROUTE}\";\n        }}\n");
    let upstream = format!(
        "    upstream backend {{\n{}        keepalive {};\n        keepalive_requests 1000000;\n        keepalive_timeout 300s;\n    }}\n",
        addr_list(s.backends, |a| format!("        server {a};\n")),
        s.max_conns.max(64) * 2,
    );
    let (upstream, locations) = match s.route {
        Route::Proxy => (upstream, "        location / {\n            proxy_pass http://backend;\n        }\n".to_string()),
        Route::Prefix => (
            upstream,
            format!("        location {CGI_PREFIX} {{\n            proxy_pass http://backend/;\n        }}\n{no_route}"),
        ),
        Route::Default => (String::new(), no_route),
        Route::H2c => (
            format!("{H2C_MARK}{upstream}"),
            "        location / {\n            proxy_pass http://backend;\n        }\n".to_string(),
        ),
        Route::Grpc => (
            format!("{H2C_MARK}{upstream}"),
            "        location / {\n            grpc_pass grpc://backend;\n        }\n".to_string(),
        ),
        Route::Respond => (
            String::new(),
            "        location / {\n            return 200 \"ok\";\n        }\n".to_string(),
        ),
        Route::Static => (
            String::new(),
            format!(
                "        location / {{\n            root {};\n            sendfile on;\n            tcp_nopush on;\n        }}\n",
                crate::peers::site_dir(s.dir).display()
            ),
        ),
    };
    // The http-level part before the main server: the upstream, and the RSA server if any.
    let upstream = upstream + &nginx_rsa_server(s, port, &locations);
    nginx_conf("nginx", s.dir, port, &upstream, &locations, s.tls)
}

pub fn haproxy_cfg(s: &Setup, port: u16, tcp: bool) -> Result<String> {
    let mut body = String::new();
    match s.route {
        Route::Default => {
            let _ = writeln!(
                body,
                "    http-request return status 404 content-type text/plain string \"{NO_ROUTE}\""
            );
        }
        Route::Respond => {
            body.push_str(
                "    http-request return status 200 content-type text/plain string \"ok\"\n",
            );
        }
        Route::Static => bail!("HAProxy serves no files"),
        Route::Proxy | Route::Prefix | Route::H2c | Route::Grpc => {
            body.push_str("    balance roundrobin\n");
            let proto = if s.route == Route::Grpc {
                " proto h2"
            } else {
                ""
            };
            for (i, a) in s.backends.iter().enumerate() {
                let _ = writeln!(body, "    server s{i} {a}{proto}");
            }
        }
    }
    let bind_opts = if s.route.h2c_front() { " proto h2" } else { "" };
    let http_defaults = if tcp {
        ""
    } else {
        "    timeout http-keep-alive 300s\n    option http-keep-alive\n    http-reuse always\n"
    };
    render(
        HAPROXY_T,
        &[
            ("MAXCONN", &(s.max_conns * 2 + 1000).to_string()),
            ("MODE", if tcp { "tcp" } else { "http" }),
            ("HTTP_DEFAULTS", http_defaults),
            ("PORT", &haproxy_bind_tls(s, port)),
            ("BIND_OPTS", bind_opts),
            ("BODY", &body),
        ],
    )
}

/// The port of HAProxy's `bind` line, followed with TLS by `ssl crt ...` (the default ECDSA
/// certificate first, then the RSA one, picked by SNI) and ALPN h2 and http/1.1.
fn haproxy_bind_tls(s: &Setup, port: u16) -> String {
    let Some(t) = s.tls else {
        return port.to_string();
    };
    let mut line = format!(
        "{port} ssl crt {}",
        crate::peers::haproxy_pem(&t.cert).display()
    );
    if let Some((cert, _)) = &t.rsa {
        let _ = write!(line, " crt {}", crate::peers::haproxy_pem(cert).display());
    }
    line + " alpn h2,http/1.1"
}

pub fn caddyfile(s: &Setup, port: u16) -> Result<String> {
    let routes = match s.route {
        Route::Default => format!("\trespond \"{NO_ROUTE}\" 404"),
        Route::Respond => "\trespond \"ok\" 200".to_string(),
        Route::Static => format!(
            "\troot * {}\n\tfile_server",
            crate::peers::site_dir(s.dir).display()
        ),
        Route::Proxy | Route::Prefix | Route::H2c | Route::Grpc => {
            let idle = s.max_conns.max(64) * 2;
            format!(
                "\treverse_proxy {} {{\n\t\tlb_policy round_robin\n\t\ttransport http {{\n\t\t\tkeepalive 300s\n\t\t\tkeepalive_idle_conns {idle}\n\t\t\tkeepalive_idle_conns_per_host {idle}\n\t\t}}\n\t}}",
                s.backends.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(" ")
            )
        }
    };
    render(CADDY_T, &[("PORT", &port.to_string()), ("ROUTES", &routes)])
}

pub fn apache_conf(s: &Setup, port: u16, moddir: &Path) -> Result<String> {
    let b = s
        .backends
        .first()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let routes = match s.route {
        Route::Proxy | Route::H2c | Route::Grpc => format!("ProxyPass \"/\" \"http://{b}/\"\n"),
        Route::Prefix => format!(
            "ProxyPass \"{CGI_PREFIX}\" \"http://{b}/\"\nProxyPassReverse \"{CGI_PREFIX}\" \"http://{b}/\"\n"
        ),
        Route::Default | Route::Respond | Route::Static => String::new(),
    };
    let unixd = if moddir.join("mod_unixd.so").exists() {
        format!("LoadModule unixd_module {}/mod_unixd.so", moddir.display())
    } else {
        String::new()
    };
    render(
        APACHE_T,
        &[
            ("DIR", &s.dir.to_string_lossy()),
            ("MODDIR", &moddir.to_string_lossy()),
            ("UNIXD", &unixd),
            ("PORT", &port.to_string()),
            ("THREADS", &(s.max_conns + 16).max(64).to_string()),
            ("ROUTES", &routes),
        ],
    )
}

/// HTTP listener keys: keep-alive without a request cap, the default response.
const WEIR_HTTP_LISTENER: &str = "keepalive_timeout = \"300s\"\nkeepalive_requests = 0\n\
    default_response = { status = 404, body = \"no route\", content_type = \"text/plain\" }";
/// L4 listener keys: like HAProxy `mode tcp` with `timeout client 300s` and 16 KiB buffers.
const WEIR_TCP_LISTENER: &str =
    "protocol = \"tcp\"\nupstream = \"backend\"\nidle_timeout = \"300s\"\nbuffer_size = \"16KiB\"";

/// Weir's configuration; `tcp` asks for an L4 listener; `access_log` turns on a JSON access
/// log to that file (HTTP listeners only: TCP listeners have none).
pub fn weir_toml(
    s: &Setup,
    port: u16,
    admin: Option<u16>,
    tcp: bool,
    access_log: Option<&Path>,
) -> Result<String> {
    let servers = s
        .backends
        .iter()
        .map(|a| format!("{{ addr = \"{a}\" }}"))
        .collect::<Vec<_>>()
        .join(", ");
    let pool = format!(
        "[upstreams.backend]\nservers = [{servers}]\nmax_idle = {}\nidle_timeout = \"300s\"\n",
        s.max_conns.max(64) * 2
    );
    let pool = if s.route == Route::Grpc {
        format!("{pool}protocol = \"h2c\"\n")
    } else {
        pool
    };
    let (routes, upstreams) = match (tcp, s.route) {
        (true, _) => (String::new(), pool),
        (false, Route::Proxy | Route::H2c | Route::Grpc) => (
            "\n[[listeners.routes]]\nname = \"all\"\npath_prefix = \"/\"\nforwarded_headers = false\nupstream = \"backend\"\n".to_string(),
            pool,
        ),
        (false, Route::Prefix) => (
            format!("\n[[listeners.routes]]\nname = \"cgi\"\npath_prefix = \"{CGI_PREFIX}\"\nrewrite_prefix = \"/\"\nreverse_rewrite = true\nforwarded_headers = false\nupstream = \"backend\"\n"),
            pool,
        ),
        (false, Route::Default) => (String::new(), String::new()),
        (false, Route::Respond) => (
            "\n[[listeners.routes]]\nname = \"ok\"\npath_prefix = \"/\"\nrespond = { status = 200, body = \"ok\" }\n".to_string(),
            String::new(),
        ),
        (false, Route::Static) => (
            format!(
                "\n[[listeners.routes]]\nname = \"site\"\npath_prefix = \"/\"\nfiles = {{ root = \"{}\" }}\n",
                crate::peers::site_dir(s.dir).display()
            ),
            String::new(),
        ),
    };
    let admin = admin.map_or("off".to_string(), |p| format!("127.0.0.1:{p}"));
    let mut access_log = access_log.filter(|_| !tcp).map_or(String::new(), |path| {
        format!(
            "access_log = {{ format = \"json\", path = \"{}\" }}",
            path.display()
        )
    });
    if let Some(t) = s.tls {
        // The listener's last keys: a table header ends them.
        let _ = write!(
            access_log,
            "\n[listeners.tls]\ncerts = [{{ cert = \"{}\", key = \"{}\" }}",
            t.cert.display(),
            t.key.display()
        );
        if let Some((cert, key)) = &t.rsa {
            let _ = write!(
                access_log,
                ", {{ cert = \"{}\", key = \"{}\" }}",
                cert.display(),
                key.display()
            );
        }
        access_log.push(']');
    }
    render(
        WEIR_T,
        &[
            ("ADMIN", &admin),
            ("ACCESS_LOG", &access_log),
            ("PORT", &port.to_string()),
            (
                "LISTENER",
                if tcp {
                    WEIR_TCP_LISTENER
                } else {
                    WEIR_HTTP_LISTENER
                },
            ),
            ("ROUTES", &routes),
            ("UPSTREAMS", &upstreams),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup<'a>(dir: &'a Path, backends: &'a [SocketAddr], route: Route) -> Setup<'a> {
        Setup {
            dir,
            backends,
            route,
            max_conns: 512,
            weir: Path::new("/nonexistent/weir"),
            admin: false,
            tls: None,
        }
    }

    fn addrs() -> Vec<SocketAddr> {
        vec![
            "127.0.0.1:9001".parse().unwrap(),
            "127.0.0.1:9002".parse().unwrap(),
        ]
    }

    #[test]
    fn render_fills_and_detects_leftovers() {
        assert_eq!(render("a {{X}} b", &[("X", "1")]).unwrap(), "a 1 b");
        let e = render("a {{X}} {{Y}}", &[("X", "1")]).unwrap_err();
        assert!(e.to_string().contains("{{Y}}"), "{e}");
    }

    #[test]
    fn every_template_renders_for_every_route() {
        let b = addrs();
        let dir = Path::new("/tmp/wb");
        for route in [Route::Proxy, Route::Prefix, Route::Default] {
            let s = setup(dir, &b, route);
            let n = nginx_proxy(&s, 8080).unwrap();
            assert!(n.contains("worker_processes 1;") && n.contains("access_log off;"));
            assert_eq!(n.contains("keepalive 1024;"), route != Route::Default);
            haproxy_cfg(&s, 8080, false).unwrap();
            caddyfile(&s, 8080).unwrap();
            apache_conf(&s, 8080, Path::new("/m")).unwrap();
            weir_toml(&s, 8080, None, false, None).unwrap();
        }
    }

    #[test]
    fn weir_config_matches_the_fairness_rules() {
        let b = addrs();
        let s = setup(Path::new("/tmp"), &b, Route::Prefix);
        let t = weir_toml(&s, 8080, Some(9901), false, None).unwrap();
        assert!(!t.contains("access_log"), "access log on by default:\n{t}");
        let observed = weir_toml(&s, 8080, Some(9901), false, Some(Path::new("/l/a.log"))).unwrap();
        assert!(observed.contains("access_log = { format = \"json\", path = \"/l/a.log\" }"));
        for want in [
            "workers = 1",
            "keepalive_requests = 0",
            "forwarded_headers = false",
            "rewrite_prefix = \"/\"",
            "bind = \"127.0.0.1:9901\"",
            "{ addr = \"127.0.0.1:9002\" }",
        ] {
            assert!(t.contains(want), "missing {want} in\n{t}");
        }
        let d = weir_toml(
            &setup(Path::new("/tmp"), &b, Route::Default),
            1,
            None,
            false,
            None,
        )
        .unwrap();
        assert!(!d.contains("[upstreams"), "{d}");
        assert!(d.contains("bind = \"off\""));
        let tcp = weir_toml(&s, 8080, None, true, Some(Path::new("/l/a.log"))).unwrap();
        let config = weir_config::parse_str(&tcp, "bench.toml").expect("valid tcp config");
        assert!(config.listeners[0].tcp().is_some(), "{tcp}");
        let http = weir_toml(&s, 8080, None, false, None).unwrap();
        weir_config::parse_str(&http, "bench.toml").expect("valid http config");
    }

    #[test]
    fn tls_configs_terminate_with_the_same_certificate() {
        let b = addrs();
        let files = TlsFiles {
            cert: "/c/cert.pem".into(),
            key: "/c/key.pem".into(),
            ca: "/c/ca.pem".into(),
            rsa: Some(("/c/rsa.pem".into(), "/c/rsa.key".into())),
        };
        let s = Setup {
            tls: Some(&files),
            ..setup(Path::new("/tmp"), &b, Route::Proxy)
        };
        let n = nginx_proxy(&s, 8443).unwrap();
        assert!(
            n.contains("listen 127.0.0.1:8443 ssl http2 default_server backlog=4096;"),
            "{n}"
        );
        // The RSA certificate: its own server for its name; TLS 1.3 on (not 1.22's default).
        assert!(
            n.contains("server_name rsa.localhost;") && n.contains("ssl_certificate /c/rsa.pem;")
        );
        assert!(n.contains("ssl_protocols TLSv1.2 TLSv1.3;"));
        let h = haproxy_cfg(&s, 8443, false).unwrap();
        assert!(
            h.contains("bind 127.0.0.1:8443 ssl crt /c/cert.haproxy.pem crt /c/rsa.haproxy.pem alpn h2,http/1.1"),
            "{h}"
        );
        let t = weir_toml(&s, 8443, None, false, None).unwrap();
        let config = weir_config::parse_str(&t, "bench.toml").expect("valid tls config");
        assert_eq!(
            config.listeners[0].tls.as_ref().unwrap().certs.len(),
            2,
            "{t}"
        );
        let local = Setup {
            route: Route::Respond,
            ..setup(Path::new("/tmp"), &b, Route::Respond)
        };
        let r = weir_toml(&local, 1, None, false, None).unwrap();
        let config = weir_config::parse_str(&r, "bench.toml").expect("valid respond config");
        assert_eq!(config.listeners[0].routes.len(), 1, "{r}");
        assert!(nginx_proxy(&local, 1)
            .unwrap()
            .contains("return 200 \"ok\";"));
        assert!(haproxy_cfg(&local, 1, false)
            .unwrap()
            .contains("http-request return status 200"));
        assert!(
            n.contains("ssl_certificate /c/cert.pem;")
                && n.contains("ssl_certificate_key /c/key.pem;")
        );
        let plain = nginx_proxy(&setup(Path::new("/tmp"), &b, Route::Proxy), 8080).unwrap();
        assert!(
            plain.contains("listen 127.0.0.1:8080 backlog=4096;")
                && !plain.contains("ssl_certificate")
        );
        let t = weir_toml(&s, 8443, None, false, None).unwrap();
        let config = weir_config::parse_str(&t, "bench.toml").expect("valid tls config");
        let tls = config.listeners[0].tls.as_ref().expect("a TLS listener");
        assert_eq!(tls.certs[0].cert, Path::new("/c/cert.pem"));
        assert_eq!(tls.alpn, ["h2", "http/1.1"]);
        assert_eq!(config.listeners[0].routes.len(), 1, "{t}");
        let observed = weir_toml(&s, 8443, Some(9901), false, Some(Path::new("/l/a.log"))).unwrap();
        let config = weir_config::parse_str(&observed, "bench.toml").expect("valid");
        assert!(config.listeners[0].access_log.is_some(), "{observed}");
    }

    #[test]
    fn haproxy_modes() {
        let b = addrs();
        let s = setup(Path::new("/tmp"), &b, Route::Proxy);
        let tcp = haproxy_cfg(&s, 1, true).unwrap();
        assert!(tcp.contains("mode tcp") && !tcp.contains("option http-keep-alive"));
        let http = haproxy_cfg(&s, 1, false).unwrap();
        assert!(http.contains("nbthread 1") && http.contains("server s1 127.0.0.1:9002"));
    }
}

#[cfg(test)]
mod h2c_tests {
    use super::*;

    #[test]
    fn h2c_and_grpc_routes_make_h2c_listeners_and_grpc_upstreams() {
        let dir = Path::new("/tmp/wb");
        let backends: Vec<SocketAddr> = vec!["127.0.0.1:9001".parse().unwrap()];
        let setup = |route| Setup {
            dir,
            backends: &backends,
            route,
            max_conns: 32,
            weir: Path::new("/nonexistent/weir"),
            admin: false,
            tls: None,
        };
        let nginx = nginx_proxy(&setup(Route::H2c), 8080).unwrap();
        assert!(nginx.contains("listen 127.0.0.1:8080 http2 "), "{nginx}");
        assert!(nginx.contains("proxy_pass http://backend;"));
        let nginx = nginx_proxy(&setup(Route::Grpc), 8080).unwrap();
        assert!(nginx.contains("grpc_pass grpc://backend;"), "{nginx}");
        assert!(nginx_proxy(&setup(Route::Proxy), 8080)
            .unwrap()
            .contains("listen 127.0.0.1:8080 backlog"));
        let haproxy = haproxy_cfg(&setup(Route::Grpc), 8080, false).unwrap();
        assert!(
            haproxy.contains("bind 127.0.0.1:8080 proto h2\n"),
            "{haproxy}"
        );
        assert!(
            haproxy.contains("server s0 127.0.0.1:9001 proto h2\n"),
            "{haproxy}"
        );
        let haproxy = haproxy_cfg(&setup(Route::H2c), 8080, false).unwrap();
        assert!(haproxy.contains("server s0 127.0.0.1:9001\n"), "{haproxy}");
        let weir = weir_toml(&setup(Route::Grpc), 8080, None, false, None).unwrap();
        let config = weir_config::parse_str(&weir, "bench.toml").expect("valid grpc config");
        assert_eq!(
            config.upstreams[0].protocol,
            weir_config::UpstreamProtocol::H2c
        );
        let weir = weir_toml(&setup(Route::H2c), 8080, None, false, None).unwrap();
        let config = weir_config::parse_str(&weir, "bench.toml").expect("valid h2c config");
        assert_eq!(
            config.upstreams[0].protocol,
            weir_config::UpstreamProtocol::Http1
        );
    }
}

#[cfg(test)]
mod static_tests {
    use super::*;

    /// The `static` scenarios: every peer serves the run's `site/` itself, nginx with
    /// sendfile; Weir's config is one the real parser takes (its root must exist).
    #[test]
    fn static_routes_serve_the_site_directory() {
        let dir = std::env::temp_dir().join(format!("wb-static-{}", std::process::id()));
        std::fs::create_dir_all(crate::peers::site_dir(&dir)).unwrap();
        let s = Setup {
            dir: &dir,
            backends: &[],
            route: Route::Static,
            max_conns: 32,
            weir: Path::new("/nonexistent/weir"),
            admin: false,
            tls: None,
        };
        let site = crate::peers::site_dir(&dir).display().to_string();
        let nginx = nginx_proxy(&s, 8080).unwrap();
        assert!(
            nginx.contains(&format!("root {site};")) && nginx.contains("sendfile on;"),
            "{nginx}"
        );
        let caddy = caddyfile(&s, 8080).unwrap();
        assert!(
            caddy.contains(&format!("root * {site}\n\tfile_server")),
            "{caddy}"
        );
        assert!(haproxy_cfg(&s, 8080, false).is_err());
        let weir = weir_toml(&s, 8080, None, false, None).unwrap();
        let config = weir_config::parse_str(&weir, "bench.toml").expect(&weir);
        let target = &config.listeners[0].routes[0].target;
        assert!(
            matches!(target, weir_config::RouteTarget::Files(_)),
            "{weir}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
