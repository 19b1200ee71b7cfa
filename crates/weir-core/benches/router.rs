//! Cost of routing one request: host + path (and, for routes that have them, method,
//! header and query conditions) to a route index, over a listener of 12 plain routes, and
//! the same listener with a conditional route in front of the catch-all that is hit.
//!
//! `cargo bench -p weir-core --bench router`. Routes without conditions must cost what
//! they cost before conditions existed (docs/benchmarks.md keeps the numbers).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use weir_core::router::Router;

const LISTENER: &str = r#"
[[listeners]]
name = "l"
bind = "127.0.0.1:0"
"#;

const PLAIN: &str = r#"
[[listeners.routes]]
name = "root"
upstream = "u"
[[listeners.routes]]
name = "static"
path_prefix = "/static/"
upstream = "u"
[[listeners.routes]]
name = "img"
path_prefix = "/img/"
upstream = "u"
[[listeners.routes]]
name = "api-v1"
path_prefix = "/api/v1/"
upstream = "u"
[[listeners.routes]]
name = "api-v2"
path_prefix = "/api/v2/"
upstream = "u"
[[listeners.routes]]
name = "api"
path_prefix = "/api/"
upstream = "u"
[[listeners.routes]]
name = "a-api"
hosts = ["a.example.com"]
path_prefix = "/api/"
upstream = "u"
[[listeners.routes]]
name = "wild-api"
hosts = ["*.example.com"]
path_prefix = "/api/"
upstream = "u"
[[listeners.routes]]
name = "admin"
hosts = ["admin.example.com"]
upstream = "u"
[[listeners.routes]]
name = "health"
path_prefix = "/healthz"
upstream = "u"
[[listeners.routes]]
name = "login"
path_prefix = "/login"
upstream = "u"
[[listeners.routes]]
name = "cgi"
path_prefix = "/cgi-bin/"
upstream = "u"
"#;

const UPSTREAM: &str = "[upstreams.u]\nservers = [{ addr = \"127.0.0.1:1\" }]\n";

/// A route with conditions, declared before the `api` catch-all (requests without the header
/// fall through to it).
const CANARY: &str = r#"
[[listeners.routes]]
name = "canary"
path_prefix = "/api/"
methods = ["GET", "POST"]
match_headers = { "x-canary" = "1" }
upstream = "u"
"#;

fn router(extra: &str) -> Router {
    let text = format!("{LISTENER}{extra}{PLAIN}{UPSTREAM}");
    let config = weir_config::parse_str(&text, "bench").expect("bench config");
    Router::new(&config.listeners[0].routes)
}

const REQUEST: &[u8] = b"GET /api/users/42?x=1 HTTP/1.1\r\nHost: b.example.org\r\nUser-Agent: bench\r\nAccept: */*\r\nX-Trace: abc\r\n\r\n";

fn routing(c: &mut Criterion) {
    let mut head = weir_core::codec::http1::RequestHead::default();
    let limits = weir_core::codec::http1::HeadLimits {
        max_header_size: 16 * 1024,
        max_headers: 100,
    };
    weir_core::codec::http1::parse_request(REQUEST, limits, &mut head).expect("request");
    for (name, extra) in [("plain", ""), ("with-canary", CANARY)] {
        let r = router(extra);
        c.bench_function(&format!("route/{name}"), |b| {
            b.iter(|| {
                let buf = black_box(REQUEST);
                let view = weir_core::router::RequestView::new(buf, &head);
                black_box(r.route(head.host_name(buf), head.path(buf), &view))
            })
        });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = routing
}
criterion_main!(benches);
