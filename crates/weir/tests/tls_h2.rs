//! HTTP/2 through ALPN on a TLS listener: a client offering `h2` gets HTTP/2 (multiplexed
//! streams to an HTTP/1.1 upstream), one offering only `http/1.1` still gets HTTP/1.1, and
//! an h2 stream behind TLS looks upstream (X-Forwarded-Proto, the client-certificate
//! header, `{scheme}` in redirects) and in the access log exactly like HTTP/1.1 over TLS.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use http::{Method, Request, StatusCode};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use common::{single, tls_table, Conf};
use weir_testkit::certs::{Leaf, TestCa};
use weir_testkit::{wait_until, Backend};

const NAME: &str = "h2.example.com";

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("PEM certificate")
}

/// A client trusting `ca`, offering `alpn`, with an optional client certificate.
fn client_config(ca: &TestCa, alpn: &[&[u8]], client_cert: Option<&Leaf>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(der(&ca.cert_pem)).expect("CA certificate");
    let builder = ClientConfig::builder().with_root_certificates(roots);
    let mut config = match client_cert {
        None => builder.with_no_client_auth(),
        Some(leaf) => {
            let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).expect("key");
            builder
                .with_client_auth_cert(vec![der(&leaf.cert_pem)], key)
                .expect("client cert")
        }
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

async fn tls_connect(addr: SocketAddr, config: Arc<ClientConfig>) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.expect("connect to weir");
    let name = ServerName::try_from(NAME).expect("server name");
    TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .expect("TLS handshake")
}

/// An h2 connection over TLS whose ALPN settled on h2.
async fn h2_connect(addr: SocketAddr, config: Arc<ClientConfig>) -> SendRequest<Bytes> {
    let tls = tls_connect(addr, config).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (client, conn) = h2::client::handshake(tls).await.expect("h2 handshake");
    tokio::spawn(conn);
    client
}

/// A body-less GET over h2: (status, body).
async fn get(client: &mut SendRequest<Bytes>, path: &str) -> (StatusCode, String) {
    let request = Request::builder()
        .method(Method::GET)
        .uri(format!("https://{NAME}{path}"))
        .body(())
        .expect("request");
    let (response, _) = client.send_request(request, true).expect("send request");
    let response = response.await.expect("response");
    let status = response.status();
    let mut body = response.into_body();
    let mut out = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("body chunk");
        let _ = body.flow_control().release_capacity(chunk.len());
        out.extend_from_slice(&chunk);
    }
    (status, String::from_utf8_lossy(&out).into_owned())
}

/// A GET of `/` on a new h2 connection to `addr` (trusting `ca`): the response future.
async fn send_get(ca: &TestCa, addr: SocketAddr) -> (ResponseFuture, SendRequest<Bytes>) {
    let mut client = h2_connect(addr, client_config(ca, &[b"h2"], None)).await;
    let request = Request::builder()
        .uri(format!("https://{NAME}/"))
        .body(())
        .expect("request");
    let (response, _) = client.send_request(request, true).expect("send request");
    (response, client)
}

#[tokio::test]
async fn a_client_offering_h2_gets_multiplexed_http2_to_an_http1_upstream() {
    let ca = TestCa::new("h2 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::echo("e");
    let weir = single(backend.addr())
        .listener(&tls_table(&[&leaf], ""))
        .start();
    let config = client_config(&ca, &[b"h2", b"http/1.1"], None);
    let client = h2_connect(weir.addr, config).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            (i, get(&mut client, &format!("/item/{i}")).await)
        }));
    }
    for task in tasks {
        let (i, (status, body)) = task.await.expect("stream task");
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.starts_with(&format!("GET /item/{i} HTTP/1.1\r\n")),
            "{body}"
        );
        assert!(body.contains("X-Forwarded-Proto: https\r\n"), "{body}");
    }
    // All sixteen streams shared the one client connection. The frame scanner under TLS
    // stayed in step with the frames: no glitch, no forced reset.
    for (name, want) in [
        ("weir_http2_connections_total", "1"),
        ("weir_http2_glitches_total", "0"),
        ("weir_http2_forced_resets_total", "0"),
    ] {
        let text = weir.metrics_text();
        let value = text
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next());
        assert_eq!(value, Some(want), "{name}");
    }
}

#[tokio::test]
async fn a_client_offering_only_http1_gets_http1_on_the_same_listener() {
    let ca = TestCa::new("h1 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::echo("e");
    let weir = single(backend.addr())
        .listener(&tls_table(&[&leaf], ""))
        .start();
    let mut tls = tls_connect(weir.addr, client_config(&ca, &[b"http/1.1"], None)).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let head = format!("GET /one HTTP/1.1\r\nHost: {NAME}\r\nConnection: close\r\n\r\n");
    tls.write_all(head.as_bytes()).await.expect("write");
    tls.flush().await.expect("flush");
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response.contains("X-Forwarded-Proto: https\r\n"),
        "{response}"
    );
}

#[tokio::test]
async fn alpn_http1_only_never_settles_on_h2() {
    let ca = TestCa::new("h1-only CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::echo("e");
    let weir = single(backend.addr())
        .listener(&tls_table(&[&leaf], "alpn = [\"http/1.1\"]\n"))
        .start();
    let tls = tls_connect(weir.addr, client_config(&ca, &[b"h2", b"http/1.1"], None)).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
}

#[tokio::test]
async fn an_h2_stream_behind_tls_carries_https_the_client_cert_and_the_tls_log_fields() {
    let ca = TestCa::new("h2 facts CA");
    let clients = TestCa::new("h2 clients");
    let leaf = ca.leaf(&[NAME]);
    let alice = clients.client("alice");
    let log = ca.dir.path().join("access.log");
    let backend = Backend::echo("e");
    let extra = format!(
        "client_auth = {{ ca = \"{}\", required = true }}\nclient_cert_header = \"X-Client-Cert\"\n",
        clients.cert_path.display()
    );
    let weir = Conf::new()
        .listener(&format!(
            "access_log = {{ format = \"json\", path = \"{}\" }}",
            log.display()
        ))
        .listener(&tls_table(&[&leaf], &extra))
        .route_keys(
            "moved",
            &[
                "path_prefix = \"/old\"",
                "redirect = { to = \"{scheme}://{host}/new\", status = 301 }",
            ],
        )
        .route("all", "up", &[])
        .upstream("up", &[backend.addr()], &[])
        .start();
    let config = client_config(&ca, &[b"h2"], Some(&alice));
    let mut client = h2_connect(weir.addr, config).await;
    let (status, body) = get(&mut client, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("X-Forwarded-Proto: https\r\n"), "{body}");
    assert!(body.contains("X-Client-Cert: Hash="), "{body}");
    assert!(body.contains(";Subject=\"CN=alice\"\r\n"), "{body}");
    let request = Request::get(format!("https://{NAME}/old"))
        .body(())
        .expect("request");
    let (response, _) = client.send_request(request, true).expect("send request");
    let response = response.await.expect("response");
    assert_eq!(response.status(), StatusCode::MOVED_PERMANENTLY);
    let location = response.headers().get(http::header::LOCATION);
    assert_eq!(
        location.and_then(|v| v.to_str().ok()),
        Some(&*format!("https://{NAME}/new"))
    );
    let mut line = String::new();
    assert!(
        wait_until(common::WAIT, || {
            line = std::fs::read_to_string(&log).unwrap_or_default();
            line.lines().count() >= 2
        }),
        "access log: {line:?}"
    );
    let first = line.lines().next().unwrap_or_default();
    for field in [
        "\"tls_version\":\"TLSv1.3\"",
        &format!("\"sni\":\"{NAME}\""),
        "\"client_cert_subject\":\"CN=alice\"",
    ] {
        assert!(first.contains(field), "{field} in {first}");
    }
}

/// A socket whose reads wait while its gate is closed, and are slow when it is open (at
/// most 1 KiB, and every other read yields first): a client that stops reading for a
/// while, then reads slower than Weir writes, so Weir's writes keep waiting to the end.
struct Gated {
    tcp: TcpStream,
    yielded: bool,
    open: Arc<std::sync::atomic::AtomicBool>,
    waker: Arc<std::sync::Mutex<Option<std::task::Waker>>>,
}

impl tokio::io::AsyncRead for Gated {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::sync::atomic::Ordering;
        if !self.open.load(Ordering::SeqCst) {
            *self.waker.lock().expect("waker") = Some(cx.waker().clone());
            if !self.open.load(Ordering::SeqCst) {
                return std::task::Poll::Pending;
            }
        }
        self.yielded = !self.yielded;
        if self.yielded {
            cx.waker().wake_by_ref();
            return std::task::Poll::Pending;
        }
        let mut chunk = [0u8; 1024];
        let mut small = tokio::io::ReadBuf::new(&mut chunk[..buf.remaining().min(1024)]);
        std::task::ready!(std::pin::Pin::new(&mut self.tcp).poll_read(cx, &mut small))?;
        buf.put_slice(small.filled());
        std::task::Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncWrite for Gated {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// Over TLS a write is Ready once rustls buffered the data, and only the flush waits. A
/// response to a client that stops reading for a moment ends with a flush that waited,
/// then went through once the client read again: the connection must not stay marked
/// stalled. Idle for longer than `stall_timeout` afterwards, it still serves the next
/// request (before the fix it was dropped as stalled, without GOAWAY).
#[tokio::test]
async fn an_idle_tls_connection_after_a_slow_read_is_not_taken_for_stalled() {
    use std::sync::atomic::Ordering;
    let ca = TestCa::new("h2 stall CA");
    let leaf = ca.leaf(&[NAME]);
    let size = 4usize << 20;
    let backend = Backend::huge(size as u64);
    let weir = Conf::new()
        // 2 s: the client's 300 ms pause below stays under it on a loaded machine.
        .listener("http2 = { stall_timeout = \"2s\" }")
        .listener(&tls_table(&[&leaf], ""))
        .route("all", "up", &[])
        .upstream("up", &[backend.addr()], &[])
        .start();
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let waker = Arc::new(std::sync::Mutex::new(None::<std::task::Waker>));
    let gated = Gated {
        tcp: socket.connect(weir.addr).await.expect("connect"),
        yielded: false,
        open: open.clone(),
        waker: waker.clone(),
    };
    let name = ServerName::try_from(NAME).expect("server name");
    let config = client_config(&ca, &[b"h2"], None);
    let tls = TlsConnector::from(config)
        .connect(name, gated)
        .await
        .expect("TLS handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut client, conn) = h2::client::handshake(tls).await.expect("h2 handshake");
    let conn = tokio::spawn(conn);
    // Stop reading, ask, and let Weir write what it can of the answer.
    open.store(false, Ordering::SeqCst);
    let request = Request::get(format!("https://{NAME}/large"))
        .body(())
        .expect("request");
    let (response, _) = client.send_request(request, true).expect("send request");
    // Not a wait for a condition: the test passes however long this is.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    open.store(true, Ordering::SeqCst);
    if let Some(w) = waker.lock().expect("waker").take() {
        w.wake();
    }
    let response = response.await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut n = 0;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("body chunk");
        n += chunk.len();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    assert_eq!(n, size);
    // Idle past stall_timeout: this is the time under test, not a wait for a condition.
    tokio::time::sleep(std::time::Duration::from_millis(3000)).await;
    assert!(!conn.is_finished(), "the connection was closed while idle");
    let (status, body) = get(&mut client, "/again").await;
    assert_eq!((status, body.len()), (StatusCode::OK, size));
    let stalled = weir
        .metrics_text()
        .lines()
        .find(|l| l.starts_with("weir_http2_stalled_total"))
        .and_then(|l| l.rsplit(' ').next().map(str::to_owned));
    assert_eq!(stalled.as_deref(), Some("0"));
}

/// A 103 Early Hints from an HTTP/1.1 upstream reaches an h2 client over TLS (ALPN h2)
/// before the final response.
#[tokio::test]
async fn early_hints_reach_an_h2_client_over_tls() {
    let ca = TestCa::new("h2 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::raw_response(
        b"HTTP/1.1 103 Early Hints\r\nLink: </app.js>; rel=preload\r\n\r\n\
          HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    );
    let weir = single(backend.addr())
        .listener(&tls_table(&[&leaf], ""))
        .start();
    let (response, _client) = send_get(&ca, weir.addr).await;
    let answer = common::read_with_interims(response).await;
    assert_eq!(answer.interims.len(), 1, "{:?}", answer.interims);
    assert_eq!(answer.interims[0].status(), StatusCode::EARLY_HINTS);
    assert_eq!(
        answer.interims[0].headers()["link"],
        "</app.js>; rel=preload"
    );
    assert_eq!(answer.head.status(), StatusCode::OK);
    assert_eq!(answer.body, b"hello");
}

/// A chunked HTTP/1.1 response's trailer reaches an h2 client over TLS (ALPN h2) as
/// trailing HEADERS after the body.
#[tokio::test]
async fn chunked_trailers_reach_an_h2_client_over_tls() {
    let ca = TestCa::new("h2 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::chunked(&["abc", "def"]);
    let weir = single(backend.addr())
        .listener(&tls_table(&[&leaf], ""))
        .start();
    let (response, _client) = send_get(&ca, weir.addr).await;
    let response = response.await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut out = Vec::new();
    while let Some(chunk) = body.data().await {
        out.extend_from_slice(&chunk.expect("body chunk"));
    }
    assert_eq!(out, b"abcdef");
    let trailers = body.trailers().await.expect("trailers").expect("a trailer");
    assert_eq!(trailers["x-trailer"], "done");
}
