//! Every route feature in every cell of client protocol x upstream protocol (issue 26):
//! HTTP/1.1 and HTTP/2 (h2c) clients, HTTP/1.1 and h2c upstreams. Each row of [`FEATURES`]
//! runs in the four cells, against a backend of the cell's protocol that answers alike
//! (`Backend` / `H2Backend`: a fixed answer, or an echo of what it received), and must
//! give the same outcome in each. The access log and the metrics are checked over the
//! cells by `every_cell_logs_and_counts_alike`.

mod common;

use std::io::Read;
use std::net::SocketAddr;

use bytes::Bytes;
use common::{dead_port, h2c_client, Conf, JsonLog, Weir, WAIT};
use weir_testkit::{Backend, H2Backend};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Client {
    Http1,
    H2c,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Server {
    Http1,
    H2c,
}

const CELLS: [(Client, Server); 4] = [
    (Client::Http1, Server::Http1),
    (Client::Http1, Server::H2c),
    (Client::H2c, Server::Http1),
    (Client::H2c, Server::H2c),
];

/// A backend of either protocol (or a dead port).
enum Upstream {
    Http1(Backend),
    H2c(H2Backend),
    Dead(SocketAddr),
}

impl Upstream {
    /// Answers every request with `status`, `headers` and `body`.
    fn fixed(server: Server, status: u16, headers: &[(&str, &str)], body: &str) -> Upstream {
        match server {
            Server::Http1 => Upstream::Http1(Backend::fixed(status, headers, body)),
            Server::H2c => Upstream::H2c(H2Backend::fixed(status, headers, body)),
        }
    }

    /// Answers 200 with what it received: the request's fields are in the body as
    /// `name: value` lines (HTTP/1.1: the head as it came; h2c: on `/show-fields`).
    fn echo(server: Server) -> Upstream {
        match server {
            Server::Http1 => Upstream::Http1(Backend::echo("cells")),
            Server::H2c => Upstream::H2c(H2Backend::h2c()),
        }
    }

    fn addr(&self) -> SocketAddr {
        match self {
            Upstream::Http1(b) => b.addr(),
            Upstream::H2c(b) => b.addr(),
            Upstream::Dead(addr) => *addr,
        }
    }
}

/// An answer as the test sees it, whatever protocol carried it.
struct Answer {
    status: u16,
    /// Lower-case names.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl std::fmt::Debug for Answer {
    /// The body as text, cut at 200 bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body = String::from_utf8_lossy(&self.body[..self.body.len().min(200)]);
        let (status, headers) = (self.status, &self.headers);
        write!(
            f,
            "{status} {headers:?} {body:?} ({} bytes)",
            self.body.len()
        )
    }
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        let found = self.headers.iter().find(|(n, _)| n == name);
        found.map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_lowercase()
    }
}

/// One request.
struct Req {
    method: &'static str,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
}

const GET: Req = Req {
    method: "GET",
    path: "/show-fields",
    headers: &[],
    body: "",
};

/// Sends `req` to `addr` over the client protocol and reads the whole answer.
async fn send(client: Client, addr: SocketAddr, req: &Req) -> Answer {
    match client {
        Client::Http1 => {
            let mut c = weir_testkit::Client::connect(addr).await.expect("connect");
            let r = c.request(req.method, req.path, req.headers, req.body.as_bytes());
            let r = r.await.expect("response");
            let headers = r.headers.iter().map(|(n, v)| (n.to_lowercase(), v.clone()));
            Answer {
                status: r.status,
                headers: headers.collect(),
                body: r.body.clone(),
            }
        }
        Client::H2c => {
            let mut c = h2c_client(addr).await.ready().await.expect("ready");
            let uri = format!("http://test{}", req.path);
            let mut head = http::Request::builder().method(req.method).uri(uri);
            for (n, v) in req.headers {
                head = head.header(*n, *v);
            }
            let end = req.body.is_empty();
            let (resp, mut body) = c.send_request(head.body(()).unwrap(), end).expect("send");
            if !end {
                body.send_data(Bytes::from_static(req.body.as_bytes()), true)
                    .unwrap();
            }
            let (parts, mut recv) = tokio::time::timeout(WAIT, resp)
                .await
                .expect("an answer in time")
                .expect("answer")
                .into_parts();
            let mut body = Vec::new();
            while let Some(chunk) = recv.data().await {
                let chunk = chunk.expect("body");
                let _ = recv.flow_control().release_capacity(chunk.len());
                body.extend_from_slice(&chunk);
            }
            let headers = parts.headers.iter().map(|(n, v)| {
                let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
                (n.as_str().to_string(), v)
            });
            Answer {
                status: parts.status.as_u16(),
                headers: headers.collect(),
                body,
            }
        }
    }
}

/// The server an upstream has before the feature's backend.
#[derive(Clone, Copy, PartialEq)]
enum First {
    None,
    /// It refuses connections (a dead port).
    Dead,
    /// It answers 503, which the upstream retries (`retry.on`).
    Unavailable,
}

/// A route feature, its setup and the outcome every cell must give.
struct Feature {
    name: &'static str,
    /// The route's lines besides its `upstream`.
    route: fn() -> Vec<String>,
    listener: &'static [&'static str],
    backend: fn(Server) -> Upstream,
    /// A server before the backend, tried first (round robin).
    first: First,
    request: Req,
    /// The request goes this many times; the check sees the last answer.
    times: usize,
    check: fn(&Answer),
}

const TEXT: &str = "the quick brown fox jumps over the lazy dog, again and again. ";

fn text() -> String {
    TEXT.repeat(40)
}

fn none() -> Vec<String> {
    Vec::new()
}

fn users_file() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("weir-cells-users-{}", std::process::id()))
}

const FEATURES: &[Feature] = &[
    Feature {
        name: "compression",
        route: || vec![r#"compression = { min_size = "0", algorithms = ["gzip"] }"#.into()],
        listener: &[],
        backend: |s| Upstream::fixed(s, 200, &[("Content-Type", "text/plain")], &text()),
        first: First::None,
        request: Req {
            headers: &[("accept-encoding", "gzip")],
            ..GET
        },
        times: 1,
        check: |a| {
            assert_eq!(a.status, 200);
            assert_eq!(a.header("content-encoding"), Some("gzip"), "{a:?}");
            assert!(a
                .header("vary")
                .is_some_and(|v| v.contains("Accept-Encoding")));
            assert_eq!(a.header("content-length"), None);
            let mut plain = String::new();
            let mut decoder = flate2::read::GzDecoder::new(&a.body[..]);
            decoder.read_to_string(&mut plain).expect("gzip");
            assert_eq!(plain, text());
        },
    },
    Feature {
        name: "reverse_rewrite",
        route: || {
            let keys = [r#"path_prefix = "/app/""#, r#"rewrite_prefix = "/""#];
            let mut route: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
            route.push("reverse_rewrite = true".into());
            route
        },
        listener: &[],
        backend: |s| Upstream::fixed(s, 302, &[("Location", "/login?next=1")], ""),
        first: First::None,
        request: Req {
            path: "/app/page",
            ..GET
        },
        times: 1,
        check: |a| {
            assert_eq!(a.status, 302);
            assert_eq!(a.header("location"), Some("/app/login?next=1"), "{a:?}");
        },
    },
    Feature {
        name: "request_headers",
        route: || {
            vec![
                r#"request_headers = { set = { "X-Set" = "v{path}" }, remove = ["x-gone"] }"#
                    .into(),
            ]
        },
        listener: &[],
        backend: Upstream::echo,
        first: First::None,
        request: Req {
            headers: &[("x-gone", "1"), ("x-kept", "2")],
            ..GET
        },
        times: 1,
        check: |a| {
            assert_eq!(a.status, 200);
            let seen = a.text();
            assert!(seen.contains("x-set: v/show-fields"), "{seen}");
            assert!(seen.contains("x-kept: 2"), "{seen}");
            assert!(!seen.contains("x-gone"), "{seen}");
        },
    },
    Feature {
        name: "response_headers",
        route: || {
            vec![r#"response_headers = { set = { "X-Resp" = "r" }, remove = ["x-drop"] }"#.into()]
        },
        listener: &[],
        backend: |s| Upstream::fixed(s, 200, &[("X-Drop", "1"), ("X-Keep", "k")], "ok"),
        first: First::None,
        request: GET,
        times: 1,
        check: |a| {
            assert_eq!(a.status, 200);
            assert_eq!(a.header("x-resp"), Some("r"), "{a:?}");
            assert_eq!(a.header("x-keep"), Some("k"), "{a:?}");
            assert_eq!(a.header("x-drop"), None, "{a:?}");
            assert_eq!(a.body, b"ok");
        },
    },
    Feature {
        name: "deny",
        route: || vec![r#"deny = ["127.0.0.0/8"]"#.into()],
        listener: &[],
        backend: |s| Upstream::fixed(s, 200, &[], "ok"),
        first: First::None,
        request: GET,
        times: 1,
        check: |a| assert_eq!(a.status, 403),
    },
    Feature {
        name: "rate_limit",
        route: || vec![r#"rate_limit = { rate = "1/h", burst = 1, key = "client_ip" }"#.into()],
        listener: &[],
        backend: |s| Upstream::fixed(s, 200, &[], "ok"),
        first: First::None,
        request: GET,
        times: 2,
        check: |a| {
            assert_eq!(a.status, 429);
            assert!(a.header("retry-after").is_some(), "{a:?}");
        },
    },
    Feature {
        name: "basic_auth",
        route: || {
            let path = users_file();
            vec![format!(
                "basic_auth = {{ users_file = \"{}\" }}",
                path.display()
            )]
        },
        listener: &[],
        backend: |s| Upstream::fixed(s, 200, &[], "ok"),
        first: First::None,
        request: GET,
        times: 1,
        check: |a| {
            assert_eq!(a.status, 401);
            let challenge = a.header("www-authenticate").unwrap_or_default();
            assert!(challenge.starts_with("Basic realm="), "{a:?}");
        },
    },
    Feature {
        name: "request_id",
        route: none,
        listener: &["request_id = true"],
        backend: Upstream::echo,
        first: First::None,
        request: GET,
        times: 1,
        check: |a| {
            assert_eq!(a.status, 200);
            assert!(a.text().contains("x-request-id: "), "{}", a.text());
        },
    },
    Feature {
        name: "retries",
        route: none,
        listener: &[],
        backend: |s| Upstream::fixed(s, 200, &[], "second"),
        first: First::Dead,
        request: GET,
        times: 1,
        check: |a| {
            assert_eq!(a.status, 200);
            assert_eq!(a.body, b"second");
        },
    },
    Feature {
        name: "status retries",
        route: none,
        listener: &[],
        backend: |s| Upstream::fixed(s, 200, &[], "second"),
        first: First::Unavailable,
        request: GET,
        times: 1,
        check: |a| {
            assert_eq!(a.status, 200, "{a:?}");
            assert_eq!(a.body, b"second");
        },
    },
    Feature {
        name: "max_informational",
        route: none,
        listener: &["max_informational = 2"],
        backend: |s| match s {
            Server::Http1 => {
                let hint = "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n";
                let raw = format!(
                    "{}HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
                    hint.repeat(20)
                );
                Upstream::Http1(Backend::raw_response(raw.as_bytes()))
            }
            Server::H2c => Upstream::H2c(H2Backend::h2c()),
        },
        first: First::None,
        // h2c: 20 hints (`/hints?n=20`) before the answer; both are past the larger of
        // `max_informational` and `http2.max_informational` (8).
        request: Req {
            path: "/hints?n=20",
            ..GET
        },
        times: 1,
        check: |a| assert_eq!(a.status, 502, "{a:?}"),
    },
];

/// Weir with one route `all` (the feature's lines) to upstream `up` (the backend, after
/// `first`: `dead`, or a server answering 503, when the feature asks).
fn start(feature: &Feature, server: Server, backend: &Upstream, first: Option<&Upstream>) -> Weir {
    let mut conf = Conf::new();
    if feature.listener.contains(&"request_id = true") {
        conf = conf.with_request_ids();
    }
    for line in feature
        .listener
        .iter()
        .filter(|l| !l.starts_with("request_id"))
    {
        conf = conf.listener(line);
    }
    let route = (feature.route)();
    let route: Vec<&str> = route.iter().map(String::as_str).collect();
    let mut servers: Vec<SocketAddr> = first.iter().map(|f| f.addr()).collect();
    servers.push(backend.addr());
    let mut keys = vec![r#"lb = "round_robin""#];
    if feature.first == First::Unavailable {
        keys.push(r#"retry = { on = ["503"] }"#);
    }
    if server == Server::H2c {
        keys.push(r#"protocol = "h2c""#);
    }
    conf.route("all", "up", &route)
        .upstream("up", &servers, &keys)
        .start()
}

#[tokio::test]
async fn every_feature_works_in_every_cell() {
    let hash = bcrypt::hash_with_salt("secret", 4, [3u8; 16]).expect("hash");
    let line = format!("alice:{}\n", hash.format_for_version(bcrypt::Version::TwoY));
    std::fs::write(users_file(), line).expect("users file");
    let dead = dead_port();
    for feature in FEATURES {
        for (client, server) in CELLS {
            let backend = (feature.backend)(server);
            let first = match feature.first {
                First::None => None,
                First::Dead => Some(Upstream::Dead(dead.addr)),
                First::Unavailable => Some(Upstream::fixed(server, 503, &[], "busy")),
            };
            let weir = start(feature, server, &backend, first.as_ref());
            let mut answer = None;
            for _ in 0..feature.times {
                answer = Some(send(client, weir.addr, &feature.request).await);
            }
            let answer = answer.expect("an answer");
            let cell = format!("{} / {client:?} client / {server:?} upstream", feature.name);
            let checked = std::panic::catch_unwind(|| (feature.check)(&answer));
            assert!(checked.is_ok(), "{cell}: {answer:?}");
        }
    }
    let _ = std::fs::remove_file(users_file());
}

/// Each try writes the request for its own server: with `preserve_host = false`, the
/// server a retry reaches gets its own address as `Host` (`:authority`), not the first's.
#[tokio::test]
async fn each_try_names_its_own_server_in_every_cell() {
    let dead = dead_port();
    for (client, server) in CELLS {
        let backend = Upstream::echo(server);
        let mut keys = vec![r#"lb = "round_robin""#];
        if server == Server::H2c {
            keys.push(r#"protocol = "h2c""#);
        }
        let weir = Conf::new()
            .route("all", "up", &["preserve_host = false"])
            .upstream("up", &[dead.addr, backend.addr()], &keys)
            .start();
        let answer = send(
            client,
            weir.addr,
            &Req {
                path: "/host",
                ..GET
            },
        )
        .await;
        assert_eq!(answer.status, 200, "{client:?} / {server:?}");
        let addr = backend.addr().to_string();
        match server {
            Server::Http1 => {
                let host = format!("host: {addr}\r\n");
                assert!(answer.text().contains(&host), "{client:?}: {answer:?}");
            }
            Server::H2c => assert_eq!(answer.header("x-authority"), Some(addr.as_str())),
        }
    }
}

#[tokio::test]
async fn every_cell_logs_and_counts_alike() {
    for (i, (client, server)) in CELLS.into_iter().enumerate() {
        let backend = Upstream::fixed(server, 201, &[], "made");
        let log = JsonLog::new(&format!("cells-{i}"));
        let mut keys = vec![];
        if server == Server::H2c {
            keys.push(r#"protocol = "h2c""#);
        }
        let weir = Conf::new()
            .listener(&log.listener_line())
            .route("all", "up", &[])
            .upstream("up", &[backend.addr()], &keys)
            .start();
        let answer = send(client, weir.addr, &GET).await;
        assert_eq!(answer.status, 201, "{client:?} / {server:?}");
        let protocol = match client {
            Client::Http1 => "HTTP/1.1",
            Client::H2c => "HTTP/2.0",
        };
        let series = format!(
            "weir_requests_total{{listener=\"web\",route=\"all\",method=\"GET\",code=\"201\",protocol=\"{protocol}\"}}"
        );
        weir.wait_metric(&series, 1).await;
        let line = &log.lines(1)[0];
        let upstream = format!("\"upstream\":\"{}\"", backend.addr());
        for field in ["\"status\":201", "\"route\":\"all\"", upstream.as_str()] {
            assert!(
                line.contains(field),
                "{client:?} / {server:?}: {field} in {line}"
            );
        }
        assert!(!line.contains("\"upstream_time\":null"), "{line}");
    }
}
