//! The harness shared by the HTTP integration tests: a config builder that writes a
//! `weir.toml` text (parsed by the real config parser), and a running Weir (one worker,
//! listener on `127.0.0.1:0`) that shuts down when dropped.
//!
//! Each test file uses a different subset of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use weir_core::Proxy;
use weir_testkit::{wait_until_async, Client};

/// The name of the one listener every test config has.
pub const LISTENER: &str = "web";

/// How long tests poll a condition (backend counters) before giving up. Every use bounds
/// a wait for something expected (a count, a close, a read), never a wait that must run
/// out, so it is generous: only a hang costs it, and a loaded two-core CI machine must
/// never hit it first.
pub const WAIT: Duration = Duration::from_secs(30);

/// Builds a configuration text: one listener `web` on `127.0.0.1:0`, `workers = 1`, the
/// admin listener off, `drain_timeout = "0s"` (so dropping a harness never waits), and
/// `request_id = false` on an HTTP listener (tests compare whole upstream heads; ids are
/// random) unless `with_request_ids` is called.
#[derive(Debug, Default, Clone)]
pub struct Conf {
    /// Worker threads; 0 means 1.
    workers: usize,
    /// The listener's `bind`; `None`: `127.0.0.1:0`.
    bind: Option<SocketAddr>,
    /// `server.drain_timeout`; `None`: `"0s"`.
    drain_timeout: Option<String>,
    /// More `[server]` lines.
    server: Vec<String>,
    request_ids: bool,
    listener: Vec<String>,
    routes: Vec<String>,
    upstreams: Vec<String>,
    /// Top-level tables written as given (`[cluster.redis.NAME]`, an upstream with
    /// `discover`).
    tables: Vec<String>,
}

impl Conf {
    pub fn new() -> Conf {
        Conf::default()
    }

    /// Runs `n` workers instead of one (each with its own SO_REUSEPORT socket).
    pub fn workers(mut self, n: usize) -> Conf {
        self.workers = n;
        self
    }

    /// Sets `server.drain_timeout` (default here `"0s"`: dropping a harness never waits).
    pub fn drain_timeout(mut self, timeout: &str) -> Conf {
        self.drain_timeout = Some(timeout.to_string());
        self
    }

    /// Adds a `key = value` line to `[server]`.
    pub fn server(mut self, line: &str) -> Conf {
        self.server.push(line.to_string());
        self
    }

    /// Binds the listener to `addr` instead of `127.0.0.1:0` (a port known before start).
    pub fn bind(mut self, addr: SocketAddr) -> Conf {
        self.bind = Some(addr);
        self
    }

    /// Leaves the listener's `request_id` at its default (on), or to a `listener` line.
    pub fn with_request_ids(mut self) -> Conf {
        self.request_ids = true;
        self
    }

    /// Adds a `key = value` line to the listener table.
    pub fn listener(mut self, line: &str) -> Conf {
        self.listener.push(line.to_string());
        self
    }

    /// Adds a route; `keys` are extra TOML lines (`path_prefix = "/api/"`, ...).
    pub fn route(mut self, name: &str, upstream: &str, keys: &[&str]) -> Conf {
        let mut text =
            format!("[[listeners.routes]]\nname = \"{name}\"\nupstream = \"{upstream}\"\n");
        for k in keys {
            text.push_str(k);
            text.push('\n');
        }
        self.routes.push(text);
        self
    }

    /// Adds a route whose target is in `keys` (`respond`, `redirect`, `upstreams`).
    pub fn route_keys(mut self, name: &str, keys: &[&str]) -> Conf {
        let mut text = format!("[[listeners.routes]]\nname = \"{name}\"\n");
        for k in keys {
            text.push_str(k);
            text.push('\n');
        }
        self.routes.push(text);
        self
    }

    /// Adds an upstream with the given servers; `keys` are extra TOML lines.
    pub fn upstream(mut self, name: &str, servers: &[SocketAddr], keys: &[&str]) -> Conf {
        let servers: Vec<String> = servers
            .iter()
            .map(|a| format!("{{ addr = \"{a}\" }}"))
            .collect();
        let mut text = format!("[upstreams.{name}]\nservers = [{}]\n", servers.join(", "));
        for k in keys {
            text.push_str(k);
            text.push('\n');
        }
        self.upstreams.push(text);
        self
    }

    /// Adds top-level TOML as written (a table such as `[cluster.redis.main]`).
    pub fn table(mut self, text: &str) -> Conf {
        self.tables.push(text.to_string());
        self
    }

    /// The whole TOML text.
    pub fn toml(&self) -> String {
        let mut out = format!(
            "[server]\nworkers = {}\ndrain_timeout = \"{}\"\n",
            self.workers.max(1),
            self.drain_timeout.as_deref().unwrap_or("0s")
        );
        for line in &self.server {
            out.push_str(line);
            out.push('\n');
        }
        out.push_str("\n[admin]\nbind = \"off\"\n\n");
        let bind = self
            .bind
            .map_or("127.0.0.1:0".to_string(), |a| a.to_string());
        out.push_str(&format!(
            "[[listeners]]\nname = \"{LISTENER}\"\nbind = \"{bind}\"\n"
        ));
        let tcp = self.listener.iter().any(|l| l.contains("\"tcp\""));
        if !self.request_ids && !tcp {
            out.push_str("request_id = false\n");
        }
        for l in &self.listener {
            out.push_str(l);
            out.push('\n');
        }
        out.push('\n');
        for r in &self.routes {
            out.push_str(r);
            out.push('\n');
        }
        for u in self.upstreams.iter().chain(&self.tables) {
            out.push_str(u);
            out.push('\n');
        }
        out
    }

    /// Parses the text with the real config parser and starts Weir (one worker unless
    /// [`Conf::workers`] said otherwise).
    pub fn start(&self) -> Weir {
        let toml = self.toml();
        let config = weir_config::parse_str(&toml, "test.toml")
            .unwrap_or_else(|e| panic!("test config rejected: {e}\n---\n{toml}"));
        let proxy = Proxy::start(config, self.workers.max(1)).expect("start weir");
        let addr = proxy
            .listener_addr(LISTENER)
            .expect("the listener has an address");
        Weir {
            proxy: Some(proxy),
            addr,
        }
    }
}

/// The most common setup: every request (`/`, any host) to one upstream `up` with one server.
pub fn single(backend: SocketAddr) -> Conf {
    Conf::new()
        .route("all", "up", &[])
        .upstream("up", &[backend], &[])
}

/// A running Weir; shut down (and its worker thread joined) on drop.
pub struct Weir {
    proxy: Option<Proxy>,
    pub addr: SocketAddr,
}

impl Weir {
    /// The Prometheus text `/metrics` would serve.
    pub fn metrics_text(&self) -> String {
        self.proxy
            .as_ref()
            .map(|p| p.metrics_renderer()())
            .unwrap_or_default()
    }

    /// The value of the series `series` (name and labels, as rendered); panics when absent.
    pub fn metric(&self, series: &str) -> u64 {
        let text = self.metrics_text();
        let prefix = format!("{series} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }

    /// The value of the series `series`, or `None` while it is absent (for polling a
    /// series that appears with its first count).
    pub fn metric_now(&self, series: &str) -> Option<u64> {
        let prefix = format!("{series} ");
        self.metrics_text()
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.parse().ok())
    }

    /// Waits until the series `series` reads `want`; panics with the metrics after [`WAIT`].
    /// A request is counted just after its answer was written (an HTTP/2 stream when its
    /// task ends, after its last frame was queued): a client holding the answer can read
    /// the metrics before the count. Only a count that never comes costs the wait.
    pub async fn wait_metric(&self, series: &str, want: u64) {
        let reached = wait_until_async(WAIT, || self.metric_now(series) == Some(want)).await;
        let now = self.metric_now(series);
        assert!(
            reached,
            "{series} is {now:?}, not {want}, in\n{}",
            self.metrics_text()
        );
    }

    /// `weir_tunnel_timeouts_total` of the listener: (idle, fin).
    pub fn tunnel_timeouts(&self) -> (u64, u64) {
        let series = |r: &str| {
            format!("weir_tunnel_timeouts_total{{listener=\"{LISTENER}\",reason=\"{r}\"}}")
        };
        (self.metric(&series("idle")), self.metric(&series("fin")))
    }

    /// A new client connection to the listener.
    pub async fn client(&self) -> Client {
        Client::connect(self.addr).await.expect("connect to weir")
    }

    /// Applies `toml` as the new config (the reload path SIGHUP and the admin API use).
    pub fn apply_text(
        &self,
        toml: &str,
    ) -> Result<Vec<weir_config::diff::Change>, weir_core::ApplyError> {
        let config = weir_config::parse_str(toml, "reload.toml")
            .unwrap_or_else(|e| panic!("test config rejected: {e}\n---\n{toml}"));
        self.proxy().apply(config)
    }

    pub fn proxy(&self) -> &Proxy {
        self.proxy.as_ref().expect("running")
    }
}

impl Drop for Weir {
    fn drop(&mut self) {
        if let Some(proxy) = self.proxy.take() {
            proxy.shutdown();
        }
    }
}

/// The forwarded headers Weir appends for a client on 127.0.0.1 that sent `Host: host`
/// and no `X-Forwarded-For` of its own.
pub fn forwarded(host: &str) -> String {
    format!(
        "X-Real-IP: 127.0.0.1\r\nX-Forwarded-For: 127.0.0.1\r\n\
         X-Forwarded-Proto: http\r\nX-Forwarded-Host: {host}\r\n"
    )
}

/// The request head an echo backend reports for a body-less request forwarded with the
/// default route settings (`preserve_host`, forwarded headers): request line, `Host`, the
/// given end-to-end header lines (each ending in CRLF), then the forwarded headers.
pub fn upstream_head(request_line: &str, host: &str, headers: &str) -> String {
    format!(
        "{request_line}\r\nHost: {host}\r\n{headers}{}\r\n",
        forwarded(host)
    )
}

/// Splits a raw response stream at the end of the first head: (head, rest).
pub fn split_head(raw: &[u8]) -> (String, Vec<u8>) {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| p + 4)
        .unwrap_or_else(|| panic!("no complete head in {:?}", String::from_utf8_lossy(raw)));
    (
        String::from_utf8_lossy(&raw[..end]).into_owned(),
        raw[end..].to_vec(),
    )
}

/// A port on 127.0.0.1 where connecting is refused: a socket bound but not listening, held
/// for as long as the value lives (so no other test can start listening on that port).
pub struct DeadPort {
    _socket: tokio::net::TcpSocket,
    pub addr: SocketAddr,
}

pub fn dead_port() -> DeadPort {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.1:0".parse().expect("address"))
        .expect("bind");
    let addr = socket.local_addr().expect("addr");
    DeadPort {
        _socket: socket,
        addr,
    }
}

/// The `[listeners.tls]` table for `certs` (`{ cert, key }` each) plus `extra` lines.
pub fn tls_table(certs: &[&weir_testkit::certs::Leaf], extra: &str) -> String {
    let list: Vec<String> = certs
        .iter()
        .map(|l| {
            format!(
                "{{ cert = \"{}\", key = \"{}\" }}",
                l.cert_path.display(),
                l.key_path.display()
            )
        })
        .collect();
    format!("[listeners.tls]\ncerts = [{}]\n{extra}", list.join(", "))
}

/// An HTTP/2 client connection (h2c, prior knowledge) to `addr`; its connection task runs
/// on the test's runtime.
pub async fn h2c_client(addr: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to weir");
    let (client, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(conn);
    client
}

/// An h2c connection to `addr` whose streams get no window (each gets its head, then
/// waits): `open.send(())` gives each stream `stream` bytes of window and the connection
/// `connection` (its connection task runs on the test's runtime).
pub async fn h2c_without_window(
    addr: SocketAddr,
    stream: u32,
    connection: u32,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    tokio::sync::oneshot::Sender<()>,
) {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to weir");
    let (h2, mut conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .expect("h2 handshake");
    let (open, opened) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        tokio::select! {
            _ = &mut conn => return,
            _ = opened => {}
        }
        conn.set_target_window_size(connection);
        conn.set_initial_window_size(stream).expect("SETTINGS");
        let _ = conn.await;
    });
    (h2, open)
}

/// A fresh directory for a disk cache store (`tag`: the test's), removed on drop.
pub struct DiskDir(pub std::path::PathBuf);

impl DiskDir {
    pub fn new(tag: &str) -> DiskDir {
        let name = format!("weir-disk-store-{tag}-{}", std::process::id());
        let dir = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&dir);
        DiskDir(dir)
    }
}

impl Drop for DiskDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A client socket to `addr` with a 64 KiB receive buffer (SO_RCVBUF set before the
/// connect, so the window it advertises stays that small): with [`read_slowly`], a slow
/// reader whose pace does not depend on how the kernel batches window updates.
pub async fn small_window(addr: SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(64 * 1024).expect("SO_RCVBUF");
    socket.connect(addr).await.expect("connect to weir")
}

/// Reads 8 KiB every 50 ms (160 KiB/s) from `s` for 6 s, from a sender that sends as fast
/// as it can: each read must find bytes (within [`WAIT`]). Returns the bytes read. With a
/// 2 s bound, the sender's side waits for room most of the time, so only its socket's
/// draining queue shows the relay is moving.
pub async fn read_slowly<R: tokio::io::AsyncRead + Unpin>(s: &mut R) -> usize {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 8192];
    let (start, mut got) = (std::time::Instant::now(), 0usize);
    while start.elapsed() < Duration::from_secs(6) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let n = tokio::time::timeout(WAIT, s.read(&mut buf)).await;
        let n = n.expect("data in time").expect("read");
        assert!(n > 0, "cut after {got} bytes");
        got += n;
    }
    got
}

/// A JSON access log in a fresh file, removed on drop.
pub struct JsonLog {
    dir: std::path::PathBuf,
}

impl JsonLog {
    pub fn new(test: &str) -> JsonLog {
        let dir = std::env::temp_dir().join(format!("weir-log-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        JsonLog { dir }
    }

    pub fn listener_line(&self) -> String {
        format!(
            "access_log = {{ format = \"json\", path = \"{}\" }}",
            self.dir.join("access.log").display()
        )
    }

    /// The log's lines once there are `n` (polls; the writer thread batches).
    pub fn lines(&self, n: usize) -> Vec<String> {
        let read = || std::fs::read_to_string(self.dir.join("access.log")).unwrap_or_default();
        assert!(
            weir_testkit::wait_until(WAIT, || read().lines().count() >= n),
            "fewer than {n} access-log lines: {}",
            read()
        );
        read().lines().map(str::to_string).collect()
    }
}

impl Drop for JsonLog {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A whole HTTP/2 answer with the informational (1xx) heads that came before it.
pub struct WithInterims {
    pub interims: Vec<http::Response<()>>,
    pub head: http::Response<()>,
    pub body: Vec<u8>,
}

/// The first informational head of `response` (a client waiting for 100 before its body).
pub async fn first_interim(response: &mut h2::client::ResponseFuture) -> http::Response<()> {
    tokio::time::timeout(
        WAIT,
        std::future::poll_fn(|cx| response.poll_informational(cx)),
    )
    .await
    .expect("an informational head in time")
    .expect("an informational head")
    .expect("no error")
}

/// Reads `response`: every informational head (in order), then the final head and its body.
pub async fn read_with_interims(mut response: h2::client::ResponseFuture) -> WithInterims {
    use std::future::Future;
    use std::task::Poll;
    let mut interims = Vec::new();
    let head = std::future::poll_fn(|cx| {
        while let Poll::Ready(Some(interim)) = response.poll_informational(cx) {
            interims.push(interim.expect("informational head"));
        }
        std::pin::Pin::new(&mut response).poll(cx)
    });
    let (head, mut recv) = tokio::time::timeout(WAIT, head)
        .await
        .expect("a final head in time")
        .expect("final head")
        .into_parts();
    let mut body = Vec::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.expect("body chunk");
        let _ = recv.flow_control().release_capacity(chunk.len());
        body.extend_from_slice(&chunk);
    }
    WithInterims {
        interims,
        head: http::Response::from_parts(head, ()),
        body,
    }
}

/// An h2 `GET` for `path` with `headers` (to `http://example.com`), on the connection `h2`:
/// its status, fields and body.
pub async fn h2_get(
    h2: &mut h2::client::SendRequest<bytes::Bytes>,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, http::HeaderMap, Vec<u8>) {
    let mut request = http::Request::get(format!("http://example.com{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let ready = h2.clone().ready().await.expect("h2 ready");
    *h2 = ready;
    let (response, _) = h2.send_request(request.body(()).unwrap(), true).unwrap();
    let got = read_with_interims(response).await;
    let (head, ()) = got.head.into_parts();
    (head.status.as_u16(), head.headers, got.body)
}

/// Raises this process's soft open-file limit to `want` (at most the hard limit), for tests
/// holding many sockets on both ends at once; returns the limit now in force.
pub fn raise_fd_limit(want: u64) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a valid, initialized struct.
    #[allow(unsafe_code)]
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur < want {
            limit.rlim_cur = want.min(limit.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        }
    }
    limit.rlim_cur
}

/// The passive-health lines of an upstream `up` that ejects a server at its first
/// failure, for longer than a test runs.
pub const EJECT_AT_FIRST_FAILURE: [&str; 3] = [
    "[upstreams.up.passive]",
    "max_fails = 1",
    "fail_timeout = \"60s\"",
];

/// Asserts that each server took `each` requests between the counts `before` and `after`
/// (round robin over servers none of which was ejected).
pub fn assert_each_took(before: &[usize], after: &[usize], each: usize) {
    for (i, (after, before)) in after.iter().zip(before).enumerate() {
        assert_eq!(
            after - before,
            each,
            "server {i}: {before:?} then {after:?}"
        );
    }
}

/// A Weir with request ids on before the h2c upstream `upstream`, whose one route's
/// `request_headers` set `X-User` and remove `x-secret`: names a client's trailer fields
/// lose (as the other names its request head does not carry as they came).
pub fn user_rules_to_h2c(upstream: SocketAddr) -> Weir {
    let rules = r#"request_headers = { set = { "X-User" = "weir" }, remove = ["x-secret"] }"#;
    Conf::new()
        .with_request_ids()
        .route("all", "up", &[rules])
        .upstream("up", &[upstream], &["protocol = \"h2c\""])
        .start()
}

/// An upstream that answers each request on its connections with the bytes it got of it
/// (the head, then the chunked body as it came, to the body's end), after sending on
/// `arrived` once the first body bytes came.
pub fn echoing_raw_chunked(arrived: UnboundedSender<()>) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for socket in listener.incoming().map_while(Result::ok) {
            let arrived = arrived.clone();
            std::thread::spawn(move || echo_raw_chunked(socket, arrived));
        }
    });
    addr
}

/// [`echoing_raw_chunked`]'s connection.
fn echo_raw_chunked(mut socket: std::net::TcpStream, arrived: UnboundedSender<()>) {
    use std::io::{Read, Write};
    let (mut got, mut buf, mut told) = (Vec::new(), [0u8; 4096], false);
    loop {
        match socket.read(&mut buf) {
            Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return,
        }
        let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let body = &got[end + 4..];
        if !body.is_empty() && !std::mem::replace(&mut told, true) {
            let _ = arrived.send(());
        }
        let Ok(decoded) = weir_testkit::chunked::decode_all(body) else {
            continue;
        };
        let request: Vec<u8> = got.drain(..end + 4 + decoded.consumed).collect();
        told = false;
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            request.len()
        );
        if socket
            .write_all(&[head.as_bytes(), &request].concat())
            .is_err()
        {
            return;
        }
    }
}
