//! Several addresses per listener, `http_bind`, the port-80 bind `acme` implies, the
//! names and storage `acme` gets by default, and where their errors point.

use crate::model::Bind;
use crate::{parse_str, Config, ConfigError};

fn parse(text: &str) -> Config {
    parse_str(text, "weir.toml").unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn fail(text: &str) -> ConfigError {
    parse_str(text, "weir.toml").expect_err(text)
}

fn addr(text: &str) -> std::net::SocketAddr {
    text.parse().unwrap()
}

const ROUTE: &str = "[[listeners.routes]]\nname = \"app\"\nhosts = [\"example.com\"]\n\
                     respond = { status = 200 }\n";

#[test]
fn one_listener_serves_tls_and_plain_http_with_the_same_routes() {
    let c = parse(&format!(
        "[[listeners]]\nname = \"site\"\nbind = [\"127.0.0.1:8443\", \"[::1]:8443\"]\n\
         http_bind = \"127.0.0.1:8080\"\n[listeners.tls]\ncerts = [{{ cert = \"a.pem\", key = \"a.key\" }}]\n{ROUTE}"
    ));
    let l = &c.listeners[0];
    let plain = |a: &str| Bind {
        addr: addr(a),
        plain_http: true,
        implied: false,
    };
    assert_eq!(
        l.binds,
        vec![
            Bind::new(addr("127.0.0.1:8443")),
            Bind::new(addr("[::1]:8443")),
            plain("127.0.0.1:8080")
        ]
    );
    assert_eq!(
        l.redirect_https, None,
        "a written http_bind serves the routes"
    );
    assert_eq!(l.first_addr(), addr("127.0.0.1:8443"));

    let c = parse(&format!(
        "[[listeners]]\nname = \"site\"\nbind = \"127.0.0.1:8443\"\nhttp_bind = \"127.0.0.1:8080\"\n\
         redirect_https = true\n[listeners.tls]\ncerts = [{{ cert = \"a.pem\", key = \"a.key\" }}]\n{ROUTE}"
    ));
    assert_eq!(
        c.listeners[0].redirect_https,
        Some(8443),
        "plain requests redirected to the listener's own TLS port, routes kept"
    );
}

#[test]
fn bind_errors_point_at_the_address() {
    let tls = "[listeners.tls]\ncerts = [{ cert = \"a.pem\", key = \"a.key\" }]\n";
    let cases = [
        (
            "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:1\"\nhttp_bind = \"127.0.0.1:2\"\n".to_owned(),
            "listeners[0].http_bind",
            4,
            "has none",
        ),
        (
            format!("[[listeners]]\nname = \"a\"\nbind = [\"127.0.0.1:1\", \"127.0.0.1:x\"]\n{tls}"),
            "listeners[0].bind[1]",
            3,
            "invalid address \"127.0.0.1:x\"",
        ),
        (
            "[[listeners]]\nname = \"a\"\nbind = []\n".to_owned(),
            "listeners[0].bind",
            3,
            "empty",
        ),
        (
            format!("[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:1\"\nhttp_bind = [\"127.0.0.1:2\", \"127.0.0.1:1\"]\n{tls}"),
            "listeners[0].http_bind[1]",
            4,
            "listed twice (also at listeners[0].bind)",
        ),
        (
            format!("[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:1\"\n\
                     [[listeners]]\nname = \"b\"\nbind = \"127.0.0.1:3\"\nhttp_bind = \"127.0.0.1:1\"\n{tls}"),
            "listeners[1].http_bind",
            7,
            "already an address of listener \"a\" (listeners[0])",
        ),
        (
            "[admin]\nbind = \"127.0.0.1:9000\"\n[[listeners]]\nname = \"a\"\nbind = [\"127.0.0.1:1\", \"127.0.0.1:9000\"]\n".to_owned(),
            "listeners[0].bind[1]",
            5,
            "admin listener",
        ),
        (
            "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:1\"\nprotocol = \"tcp\"\nupstream = \"u\"\n\
             http_bind = \"127.0.0.1:2\"\n[upstreams.u]\nservers = [{ addr = \"127.0.0.1:3\" }]\n".to_owned(),
            "listeners[0].http_bind",
            6,
            "tcp listener",
        ),
    ];
    for (text, field, line, message) in cases {
        let e = fail(&text);
        assert_eq!((e.field.as_str(), e.line), (field, line), "{e}");
        assert!(e.message.contains(message), "{e}");
        assert!(!e.fix.is_empty(), "{e}");
    }
}

#[test]
fn acme_implies_port_80_redirecting_to_https_and_needs_only_the_route_hosts() {
    let c = parse(&format!(
        "[[listeners]]\nname = \"site\"\nbind = \"127.0.0.2:443\"\ntls = {{ acme = {{}} }}\n\
         {ROUTE}[[listeners.routes]]\nname = \"www\"\nhosts = [\"WWW.example.com\", \"*\"]\n\
         respond = {{ status = 200 }}\n"
    ));
    let l = &c.listeners[0];
    assert_eq!(
        l.binds,
        vec![
            Bind::new(addr("127.0.0.2:443")),
            Bind {
                addr: addr("127.0.0.2:80"),
                plain_http: true,
                implied: true
            }
        ]
    );
    assert_eq!(
        l.redirect_https,
        Some(443),
        "the implied bind redirects, as Caddy's"
    );
    let acme = l.tls.as_ref().unwrap().acme.as_ref().unwrap();
    assert_eq!(acme.domains, vec!["example.com", "www.example.com"]);
    assert_eq!(acme.storage, crate::state_dir().join("acme"));
}

#[test]
fn no_port_80_is_implied_where_one_is_bound_or_http_bind_says() {
    let site = |extra: &str| {
        format!(
            "[[listeners]]\nname = \"site\"\nbind = \"127.0.0.2:443\"\n{extra}\
             tls = {{ acme = {{ domains = [\"example.com\"] }} }}\n"
        )
    };
    let plain = "[[listeners]]\nname = \"web\"\nbind = \"0.0.0.0:80\"\nredirect_https = true\n";
    for text in [
        format!("{plain}{}", site("")),
        format!("{}{plain}", site("")),
        site("http_bind = \"off\"\n"),
    ] {
        let c = parse(&text);
        let l = c.listeners.iter().find(|l| l.name == "site").unwrap();
        assert_eq!(l.binds, vec![Bind::new(addr("127.0.0.2:443"))], "{text}");
    }
    let c = parse(&site("http_bind = \"127.0.0.2:8080\"\n"));
    assert_eq!(
        c.listeners[0].redirect_https, None,
        "a written http_bind serves the routes"
    );
}

#[test]
fn acme_without_names_says_where_to_put_them() {
    let e = fail(
        "[[listeners]]\nname = \"site\"\nbind = \"127.0.0.1:443\"\n[listeners.tls]\nacme = {}\n",
    );
    assert_eq!(
        (e.field.as_str(), e.line),
        ("listeners[0].tls.acme", 5),
        "{e}"
    );
    assert!(e.fix.contains("hosts = [\"example.com\"]"), "{e}");

    let e = fail(
        "[[listeners]]\nname = \"site\"\nbind = \"127.0.0.1:443\"\n[listeners.tls]\nacme = {}\n\
         [[listeners.routes]]\nname = \"r\"\nhosts = [\"a.example\", \"*.example\"]\nrespond = { status = 200 }\n",
    );
    assert_eq!(
        (e.field.as_str(), e.line),
        ("listeners[0].routes[0].hosts[1]", 8),
        "{e}"
    );
    assert!(e.message.contains("wildcard"), "{e}");
    assert!(e.fix.contains("acme.domains"), "{e}");
}

#[test]
fn redirect_https_on_tls_needs_plain_binds() {
    let e = fail(
        "[[listeners]]\nname = \"a\"\nbind = \"127.0.0.1:443\"\nredirect_https = true\n\
         [listeners.tls]\ncerts = [{ cert = \"a.pem\", key = \"a.key\" }]\n",
    );
    assert_eq!(e.field, "listeners[0].redirect_https", "{e}");
    assert!(e.fix.contains("http_bind"), "{e}");
}
