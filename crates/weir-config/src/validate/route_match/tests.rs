//! Route conditions and targets: what parses into the model, and each rejection with its
//! key, line and fix.

use crate::model::{
    LocalResponse, MatchValue, Redirect, RouteTarget, TemplatePart, Variable, WeightedUpstream,
};
use crate::tests::fail;
use crate::{parse_str, Config};

/// A listener (lines 1-3), one route (header line 4, name line 5, then `lines` from line
/// 6), and upstreams `a` and `b`.
fn source(lines: &str) -> String {
    format!(
        "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\n[[listeners.routes]]\n\
         name = \"r\"\n{lines}\n[upstreams.a]\nservers = [{{ addr = \"127.0.0.1:8081\" }}]\n\
         [upstreams.b]\nservers = [{{ addr = \"127.0.0.1:8082\" }}]\n"
    )
}

fn parse(lines: &str) -> Config {
    match parse_str(&source(lines), "weir.toml") {
        Ok(config) => config,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// Asserts the error's field, line, and words of its message and fix.
#[track_caller]
fn check(lines: &str, field: &str, line: usize, message: &str, fix: &str) {
    let e = fail(&source(lines));
    assert_eq!((e.field.as_str(), e.line), (field, line), "{e}");
    assert!(e.message.contains(message), "message of: {e}");
    assert!(e.fix.contains(fix), "fix of: {e}");
}

#[test]
fn conditions_parse_into_the_model() {
    let c = parse(
        "upstream = \"a\"\nexact = true\nmethods = [\"GET\", \"POST\"]\n\
         match_headers = { \"X-Canary\" = \"1\", \"x-user\" = \"*\" }\n\
         match_query = { beta = \"true\", debug = \"*\" }",
    );
    let m = &c.listeners[0].routes[0].matching;
    assert!(m.exact && m.has_conditions());
    assert_eq!(m.methods, ["GET", "POST"]);
    assert_eq!(
        m.headers,
        [
            ("x-canary".to_owned(), MatchValue::Exact("1".into())),
            ("x-user".to_owned(), MatchValue::Present)
        ]
    );
    assert_eq!(
        m.query,
        [
            ("beta".to_owned(), MatchValue::Exact("true".into())),
            ("debug".to_owned(), MatchValue::Present)
        ]
    );
    let plain = parse("upstream = \"a\"");
    assert!(!plain.listeners[0].routes[0].matching.has_conditions());
    assert!(!plain.listeners[0].routes[0].matching.exact);
}

#[test]
fn targets_parse_into_the_model() {
    let split = parse("upstreams = [{ name = \"b\", weight = 5 }, { name = \"a\" }]");
    assert_eq!(
        split.listeners[0].routes[0].target,
        RouteTarget::Split(vec![
            WeightedUpstream {
                upstream: 1,
                weight: 5
            },
            WeightedUpstream {
                upstream: 0,
                weight: 1
            },
        ])
    );
    let respond = parse(
        "respond = { status = 503, body = \"down\\n\", headers = { \"Retry-After\" = \"5\" } }",
    );
    assert_eq!(
        respond.listeners[0].routes[0].target,
        RouteTarget::Respond(LocalResponse {
            status: 503,
            body: "down\n".into(),
            headers: vec![("Retry-After".into(), "5".into())],
        })
    );
    let empty = parse("respond = {}");
    assert_eq!(
        empty.listeners[0].routes[0].target,
        RouteTarget::Respond(LocalResponse {
            status: 200,
            body: String::new(),
            headers: vec![]
        })
    );
    let redirect = parse("redirect = { to = \"https://{host}:8443{uri}?from={client_ip}\" }");
    let RouteTarget::Redirect(Redirect { status, to }) = &redirect.listeners[0].routes[0].target
    else {
        panic!("not a redirect");
    };
    assert_eq!(*status, 302);
    use TemplatePart::*;
    assert_eq!(
        to.0,
        [
            Text("https://".into()),
            Var(Variable::Host),
            Text(":8443".into()),
            Var(Variable::Uri),
            Text("?from=".into()),
            Var(Variable::ClientIp),
        ]
    );
}

#[test]
fn one_target_per_route() {
    check(
        "upstream = \"a\"\nrespond = { status = 200 }",
        "listeners[0].routes[0].respond",
        7,
        "both upstream and respond",
        "keep one of upstream, respond",
    );
    check(
        "redirect = { to = \"/x\" }\nupstreams = [{ name = \"a\" }]",
        "listeners[0].routes[0].redirect",
        6,
        "both upstreams and redirect",
        "remove the other",
    );
    check(
        "exact = true",
        "listeners[0].routes[0].upstream",
        4,
        "no upstream (nor upstreams",
        "respond = { ... }",
    );
}

#[test]
fn weighted_split_rejections() {
    let r = "listeners[0].routes[0].upstreams";
    check("upstreams = []", r, 6, "1 to 16 pools", "weight = 95");
    check(
        "upstreams = [{ name = \"a\", weight = 0 }]",
        &format!("{r}[0].weight"),
        6,
        "between 1 and 1000, not 0",
        "default 1",
    );
    check(
        "upstreams = [{ name = \"zz\" }]",
        &format!("{r}[0].name"),
        6,
        "unknown upstream \"zz\"",
        "a, b",
    );
    check(
        "upstreams = [{ name = \"a\" }, { name = \"a\" }]",
        &format!("{r}[1].name"),
        6,
        "listed twice",
        "once",
    );
}

#[test]
fn respond_rejections() {
    let r = "listeners[0].routes[0].respond";
    check(
        "respond = { status = 99 }",
        &format!("{r}.status"),
        6,
        "between 200 and 599",
        "default 200",
    );
    check(
        "respond = { status = 204, body = \"x\" }",
        &format!("{r}.body"),
        6,
        "no body",
        "remove body",
    );
    check(
        "respond = { headers = { \"Bad Name\" = \"x\" } }",
        &format!("{r}.headers.\"Bad Name\""),
        6,
        "not a valid header name",
        "no spaces",
    );
    check(
        "respond = { headers = { \"X-A\" = \"a\\r\\nSet-Cookie: x\" } }",
        &format!("{r}.headers.X-A"),
        6,
        "not a valid header value",
        "without line breaks",
    );
    check(
        "respond = { headers = { \"Content-Length\" = \"3\" } }",
        &format!("{r}.headers.Content-Length"),
        6,
        "set by Weir",
        "remove Content-Length",
    );
}

#[test]
fn local_routes_have_no_rewrite() {
    check(
        "rewrite_prefix = \"/\"\nrespond = {}",
        "listeners[0].routes[0].rewrite_prefix",
        6,
        "no effect on a route answered by respond",
        "remove rewrite_prefix",
    );
}

#[test]
fn redirect_rejections() {
    let r = "listeners[0].routes[0].redirect";
    for bad in [200, 300, 304, 309] {
        check(
            &format!("redirect = {{ to = \"/x\", status = {bad} }}"),
            &format!("{r}.status"),
            6,
            &format!("{bad} is not a redirect status"),
            "301 or 308",
        );
    }
    for good in [301, 302, 303, 307, 308] {
        parse(&format!("redirect = {{ to = \"/x\", status = {good} }}"));
    }
    check(
        "redirect = { to = \"https://{hots}{uri}\" }",
        &format!("{r}.to"),
        6,
        "unknown variable {hots}",
        "{scheme} {host} {uri} {path} {query} {client_ip}",
    );
    check(
        "redirect = { to = \"https://{host\" }",
        &format!("{r}.to"),
        6,
        "unclosed '{'",
        "{{",
    );
    check(
        "redirect = { to = \"https://{host}{request_id}\" }",
        &format!("{r}.to"),
        6,
        "{request_id} is not available in a redirect",
        "{client_ip}",
    );
    check(
        "redirect = { status = 301 }",
        &format!("{r}.to"),
        6,
        "no target",
        "to = ",
    );
    check(
        "redirect = { to = \"/a b\" }",
        &format!("{r}.to"),
        6,
        "without spaces",
        "%20",
    );
}

#[test]
fn condition_rejections() {
    let r = "listeners[0].routes[0]";
    check(
        "upstream = \"a\"\nmethods = [\"GET\", \"G T\"]",
        &format!("{r}.methods[1]"),
        7,
        "not a method name",
        "\"GET\"",
    );
    check(
        "upstream = \"a\"\nmethods = []",
        &format!("{r}.methods"),
        7,
        "1 to 32 methods",
        "remove methods",
    );
    check(
        "upstream = \"a\"\nmatch_headers = { \"x-a\" = \"1\", \"X-A\" = \"2\" }",
        &format!("{r}.match_headers.x-a"),
        7,
        "listed twice",
        "keep one",
    );
    check(
        "upstream = \"a\"\nmatch_headers = { \"x:a\" = \"1\" }",
        &format!("{r}.match_headers.\"x:a\""),
        7,
        "not a valid header name",
        "no spaces or ':'",
    );
    check(
        "upstream = \"a\"\nmatch_query = { \"a\" = \"x\\ty\" }",
        &format!("{r}.match_query.a"),
        7,
        "control character",
        "decoded",
    );
}

/// Was: the docs said to write values decoded (`"a b"`), but a space, `&`, `=` or `#`
/// was refused as "cannot appear in a query string".
#[test]
fn match_query_takes_decoded_values() {
    let text = source("upstream = \"a\"\nmatch_query = { q = \"a b\", \"x y\" = \"é&=#\" }");
    let c = parse_str(&text, "w").expect("decoded values are accepted");
    assert_eq!(c.listeners[0].routes[0].matching.query.len(), 2);
}

#[test]
fn same_place_routes() {
    let two = |first: &str, second: &str| {
        format!(
            "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\n\
             [[listeners.routes]]\nname = \"one\"\nupstream = \"a\"\n{first}\n\
             [[listeners.routes]]\nname = \"two\"\nupstream = \"a\"\n{second}\n\
             [upstreams.a]\nservers = [{{ addr = \"127.0.0.1:8081\" }}]\n"
        )
    };
    // A route with conditions before a catch-all at the same place is fine; the reverse is not.
    parse_str(&two("methods = [\"GET\"]", ""), "w").expect("conditions first");
    parse_str(&two("exact = true", ""), "w").expect("exact and prefix differ");
    let e = parse_str(&two("", "methods = [\"GET\"]"), "w").expect_err("catch-all first");
    assert!(e.message.contains("could never match"), "{e}");
    let e = parse_str(&two("methods = [\"GET\"]", "methods = [\"GET\"]"), "w").expect_err("same");
    assert!(e.message.contains("could never match"), "{e}");
}

#[test]
fn redirect_https_listener() {
    let c = parse_str(
        "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\nredirect_https = true\n",
        "w",
    )
    .expect("valid");
    assert_eq!(c.listeners[0].redirect_https, Some(443));
    let e = fail(&source("upstream = \"a\"").replace(
        "bind = \"127.0.0.1:8080\"\n",
        "bind = \"127.0.0.1:8080\"\nredirect_https = true\n",
    ));
    assert_eq!(e.field, "listeners[0].redirect_https", "{e}");
    assert!(e.fix.contains("redirect = {"), "{e}");
}

/// Was: the redirect dropped the port (`http://host:8080/x` -> `https://host/x`).
#[test]
fn redirect_https_port_defaults_to_the_tls_listener() {
    let plain = "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\nredirect_https = true\n";
    let tls = "[[listeners]]\nname = \"tls\"\nbind = \"127.0.0.1:8443\"\n\
               tls = { certs = [{ cert = \"/nonexistent/c.pem\", key = \"/nonexistent/k.pem\" }] }\n";
    let c = parse_str(&format!("{plain}{tls}"), "w").expect("valid");
    assert_eq!(c.listeners[0].redirect_https, Some(8443));
    let c = parse_str(&format!("{plain}redirect_https_port = 9443\n{tls}"), "w").expect("valid");
    assert_eq!(c.listeners[0].redirect_https, Some(9443));
    let e = fail(&format!("{plain}redirect_https_port = 0\n"));
    assert_eq!(e.field, "listeners[0].redirect_https_port", "{e}");
    let e = fail(&plain.replace("redirect_https = true", "redirect_https_port = 8443"));
    assert_eq!(e.field, "listeners[0].redirect_https_port", "{e}");
    assert!(e.fix.contains("redirect_https = true"), "{e}");
}

#[test]
fn files_parse_into_the_model_with_their_defaults() {
    let root = std::env::temp_dir();
    let c = parse(&format!(
        "files = {{ root = \"{}\", try_files = [\"{{path}}\", \"/index.html\"], precompressed = [\"br\", \"gzip\"] }}\nupstream = \"b\"",
        root.display()
    ));
    let RouteTarget::Files(files) = &c.listeners[0].routes[0].target else {
        panic!("not files");
    };
    assert_eq!(files.root, root);
    assert_eq!(files.index, ["index.html"]);
    assert_eq!(files.try_files, ["{path}", "/index.html"]);
    assert_eq!(files.fallback, Some(1));
    assert_eq!(
        files.precompressed,
        [crate::Encoding::Br, crate::Encoding::Gzip]
    );
    assert!(!files.follow_symlinks && !files.hidden && !files.listing);
    assert_eq!(files.sendfile_min_size, 16 * 1024);
    assert_eq!(files.open_file_cache, 1024);
    assert_eq!(c.listeners[0].routes[0].target.upstreams(), [1]);
}

#[test]
fn bad_files_are_rejected_with_a_fix() {
    let root = std::env::temp_dir().display().to_string();
    let files = |extra: &str| format!("files = {{ root = \"{root}\"{extra} }}");
    check(
        "files = { index = [\"a\"] }",
        "listeners[0].routes[0].files.root",
        6,
        "no root",
        "root =",
    );
    check(
        "files = { root = \"/no/such/dir/weir\" }",
        "listeners[0].routes[0].files.root",
        6,
        "cannot be used",
        "create the directory",
    );
    check(
        "files = { root = \"/etc/hostname\" }",
        "listeners[0].routes[0].files.root",
        6,
        "not a directory",
        "directory",
    );
    check(
        &format!("{}\nrespond = {{ status = 200 }}", files("")),
        "listeners[0].routes[0].respond",
        7,
        "both files and respond",
        "remove respond",
    );
    check(
        &files(", index = [\"a/b.html\"]"),
        "listeners[0].routes[0].files.index[0]",
        6,
        "not a plain file name",
        "index.html",
    );
    check(
        &files(", try_files = [\"/../x\"]"),
        "listeners[0].routes[0].files.try_files[0]",
        6,
        "not a path under the root",
        "\"/\" or \"{path}\"",
    );
    check(
        &files(", try_files = [\"/{uri}\"]"),
        "listeners[0].routes[0].files.try_files[0]",
        6,
        "holds a character or variable",
        "{path}",
    );
    check(
        &files(", precompressed = [\"deflate\"]"),
        "listeners[0].routes[0].files.precompressed[0]",
        6,
        "not a coding",
        "\"br\"",
    );
    check(
        &format!("{}\nrewrite_prefix = \"/\"", files("")),
        "listeners[0].routes[0].rewrite_prefix",
        7,
        "answered by files",
        "remove rewrite_prefix",
    );
}
