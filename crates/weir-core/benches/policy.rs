//! Per-request cost of the traffic-policy filters (issue 16) as the data plane runs them:
//! the upstream request head written without any policy (the path a route without filters
//! takes) against the same head with a request id, request and response header rules
//! (with variables) and a rate-limit check on the client address.
//!
//! `cargo bench -p weir-core --bench policy`. Compare the difference with the whole CPU
//! cost of a proxied keep-alive request in docs/benchmarks.md (about 13.5 us).

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use weir_config::{Config, RateKey};
use weir_core::codec::http1::{parse_request, HeadLimits, RequestHead};
use weir_core::filters::forwarded::ClientIp;
use weir_core::filters::headers::{push_rules, Vars};
use weir_core::filters::rate_limit::RateLimiter;
use weir_core::filters::request_id::{self, RequestId, RequestIds};
use weir_core::forward::request_head::{write_request_head, ClientFacts, HeadNames, RequestEdits};
use weir_core::router::RoutedPath;

const HEAD: &[u8] = b"GET /api/v1/items?page=2 HTTP/1.1\r\nHost: shop.example\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64) bench\r\nAccept: application/json\r\n\
Accept-Encoding: gzip, br\r\nAccept-Language: en\r\nCookie: session=abcdef0123456789\r\n\
X-Debug: 1\r\nConnection: keep-alive\r\n\r\n";

fn config(route_keys: &str) -> Config {
    let text = format!(
        "[[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:0\"\n\
         [[listeners.routes]]\nname = \"r\"\nupstream = \"u\"\n{route_keys}\n\
         [upstreams.u]\nservers = [{{ addr = \"10.0.0.1:80\" }}]\n"
    );
    weir_config::parse_str(&text, "bench").expect("bench config")
}

fn policy(c: &mut Criterion) {
    let mut req = RequestHead::default();
    let limits = HeadLimits {
        max_header_size: 16384,
        max_headers: 100,
    };
    assert!(parse_request(HEAD, limits, &mut req).expect("head"));
    let plain = config("");
    let policed = config(
        "request_headers = { set = { \"X-Env\" = \"prod\", \"X-Origin\" = \"{scheme}://{host}{uri}\" }, remove = [\"X-Debug\"] }\n\
         response_headers = { set = { \"Strict-Transport-Security\" = \"max-age=63072000\", \"X-Request-Id\" = \"{request_id}\" } }\n\
         rate_limit = { rate = \"1000000/s\", burst = 1000000, key = \"client_ip\" }",
    );
    let client = ClientIp::new("192.0.2.7".parse().expect("ip"));
    let path = RoutedPath::default();
    let server = &plain.upstreams[0].servers[0];
    let mut out = Vec::with_capacity(2048);

    let route = &plain.listeners[0].routes[0];
    c.bench_function("policy/none", |b| {
        b.iter(|| {
            out.clear();
            let names = HeadNames {
                forwarded: route.forwarded_headers,
                cert_header: None,
                request_id: None,
                rules: None,
                traced: false,
            };
            let facts = ClientFacts {
                ip: &client,
                tls: None,
                names,
                edits: None,
            };
            write_request_head(&mut out, HEAD, &req, &path, route, server, facts);
            black_box(out.len())
        })
    });

    let listener = &policed.listeners[0];
    let route = &listener.routes[0];
    let filters = &route.filters;
    let limit = filters.rate_limit.as_ref().expect("limit");
    assert_eq!(limit.key, RateKey::ClientIp);
    let limiter = RateLimiter::new(limit);
    let ids = RequestIds::default();
    let id_settings = listener.policy.request_id.as_ref().expect("ids on");
    let mut id = RequestId::default();
    let mut resp_lines = Vec::with_capacity(256);
    let ip = "192.0.2.7".parse::<std::net::IpAddr>().expect("ip");
    // The request's start time advances by the limit's interval: every check passes and
    // writes (the costlier branch), as for a client just under its rate.
    let mut now = Instant::now();
    c.bench_function("policy/id+headers+rate_limit", |b| {
        b.iter(|| {
            request_id::assign(&mut id, &ids, id_settings, HEAD, &req);
            now += std::time::Duration::from_micros(1);
            black_box(limiter.check(ip, now)).expect("under the limit");
            let vars = Vars {
                scheme: b"http",
                host: b"shop.example",
                target: req.path(HEAD),
                client_ip: client.as_bytes(),
                request_id: id.as_bytes(),
            };
            resp_lines.clear();
            push_rules(
                &mut resp_lines,
                filters.response_headers.as_ref().expect("rules"),
                &vars,
            );
            let edits = RequestEdits {
                real_client: None,
                vars,
                trace: None,
            };
            out.clear();
            let names = HeadNames {
                forwarded: route.forwarded_headers,
                cert_header: None,
                request_id: Some(id_settings.header.as_bytes()),
                rules: filters.request_headers.as_ref(),
                traced: false,
            };
            let facts = ClientFacts {
                ip: &client,
                tls: None,
                names,
                edits: Some(&edits),
            };
            write_request_head(&mut out, HEAD, &req, &path, route, server, facts);
            black_box((out.len(), resp_lines.len()))
        })
    });
}

criterion_group!(benches, policy);
criterion_main!(benches);
