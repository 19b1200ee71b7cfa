//! 0-RTT on HTTP/3 (`http3.early_data`, RFC 8470), with a real resuming QUIC client: its
//! requests sent in early data are served before Weir's handshake completes only when safe
//! to replay (a GET, forwarded with `Early-Data: 1`); a POST gets 425 Too Early; once the
//! handshake is done requests go through unmarked. Off by default: no session allows
//! 0-RTT then. With it on, a ClientHello spanning two Initial packets still gives the
//! connection its SNI.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use tokio::net::UdpSocket;
use tokio::sync::watch;
use weir_testkit::certs::TestCa;
use weir_testkit::h3_client::{connect, get, request, H3Sender, Resuming};
use weir_testkit::{wait_until_async, Backend};

use common::{single, tls_table, Weir};

const NAME: &str = "h3.example.com";

/// A UDP relay from a QUIC client to Weir that holds Weir's datagrams back until
/// released: the client cannot finish its handshake meanwhile, so all it sends goes in
/// 0-RTT, and Weir serves it while its own handshake is still under way, however fast or
/// loaded the machine.
struct Relay {
    addr: SocketAddr,
    release: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(to: SocketAddr) -> Relay {
        let front = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        let back = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        back.connect(to).await.expect("connect");
        let addr = front.local_addr().expect("address");
        let (release, mut released) = watch::channel(false);
        let task = tokio::spawn(async move {
            let (mut client, mut held) = (None, Vec::new());
            let (mut up, mut down) = (vec![0; 65536], vec![0; 65536]);
            loop {
                tokio::select! {
                    r = front.recv_from(&mut up) => {
                        let Ok((n, from)) = r else { return };
                        client = Some(from);
                        let _ = back.send(&up[..n]).await;
                    }
                    r = back.recv(&mut down) => {
                        let Ok(n) = r else { return };
                        let open = *released.borrow();
                        match (open, client) {
                            (true, Some(to)) => { let _ = front.send_to(&down[..n], to).await; }
                            _ => held.push(down[..n].to_vec()),
                        }
                    }
                    changed = released.changed() => {
                        if changed.is_err() { return; }
                        for datagram in held.drain(..) {
                            if let Some(to) = client {
                                let _ = front.send_to(&datagram, to).await;
                            }
                        }
                    }
                }
            }
        });
        Relay {
            addr,
            release,
            task,
        }
    }

    fn release(&self) {
        let _ = self.release.send(true);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn post(path: &str) -> Request<()> {
    Request::post(format!("https://{NAME}{path}"))
        .header("content-length", "5")
        .body(())
        .expect("request")
}

fn early_marked(text: &str) -> bool {
    text.to_ascii_lowercase().contains("\r\nearly-data: 1\r\n")
}

/// Weir (`http3` as given) before an echo backend, and a client that holds a session from
/// a first connection (whose request came after its handshake: not early data).
async fn with_a_session(http3: &str) -> (Weir, Backend, Resuming) {
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::echo("e");
    let weir = single(backend.addr())
        .listener(http3)
        .listener(&tls_table(&[&leaf], ""))
        .start();
    let client = Resuming::new(&ca.client_config()).expect("client");
    let mut first = client.connect(weir.addr, NAME).await.expect("connect");
    let r = get(&mut first.send, NAME, "/full").await.expect("GET");
    assert_eq!(r.status, 200);
    assert!(!early_marked(&r.text()), "{}", r.text());
    first.connection.close(0u32.into(), b"");
    (weir, backend, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_data_serves_safe_methods_marked_and_answers_others_too_early() {
    let (weir, backend, client) = with_a_session("http3 = { early_data = true }").await;

    // The second resumes it with 0-RTT, its handshake held up by the relay.
    let relay = Relay::start(weir.addr).await;
    let early = client.connect_early(relay.addr, NAME).await.expect("0-RTT");
    let mut send: H3Sender = early.send.clone();
    let got = tokio::spawn(async move { get(&mut send, NAME, "/early").await });
    let mut send: H3Sender = early.send.clone();
    let posted =
        tokio::spawn(async move { request(&mut send, post("/early"), b"hello", None).await });
    // Both are answered before the handshake can complete: the GET forwarded, the POST
    // refused.
    let served = wait_until_async(Duration::from_secs(20), || {
        backend.requests_served() == 2 && weir.metrics_text().contains("code=\"425\"")
    })
    .await;
    assert!(served, "{}", weir.metrics_text());
    relay.release();
    let got = got.await.expect("task").expect("early GET");
    assert_eq!(got.status, 200);
    assert!(early_marked(&got.text()), "{}", got.text());
    let posted = posted.await.expect("task").expect("early POST");
    assert_eq!(posted.status, 425);
    assert_eq!(
        backend.requests_served(),
        2,
        "the early POST never went upstream"
    );

    // After the handshake, a POST on the same connection goes through, unmarked.
    let mut send = early.send.clone();
    let r = request(&mut send, post("/late"), b"hello", None)
        .await
        .expect("POST");
    assert_eq!(r.status, 200);
    assert!(
        r.text().starts_with("POST /late HTTP/1.1\r\n"),
        "{}",
        r.text()
    );
    assert!(!early_marked(&r.text()), "{}", r.text());
}

#[tokio::test]
async fn zero_rtt_is_off_by_default() {
    // Control: the same client, with a session from a listener that has early data on,
    // resumes it in 0-RTT (so what follows is not a client that could not).
    let (on, _backend, control) = with_a_session("http3 = { early_data = true }").await;
    let resumed = control.connect_early(on.addr, NAME).await;
    assert!(resumed.is_ok(), "0-RTT with early_data on");
    let (weir, _backend, client) = with_a_session("http3 = true").await;
    // Resumed, but its session allows no early data.
    let early = client.connect_early(weir.addr, NAME).await;
    assert!(early.is_err(), "0-RTT must be off unless early_data is set");
    let mut again = client.connect(weir.addr, NAME).await.expect("connect");
    let r = get(&mut again.send, NAME, "/").await.expect("GET");
    assert_eq!(r.status, 200);
}

/// A UDP relay from a QUIC client to Weir that holds the client's second datagram back a
/// moment: a ClientHello spanning two Initial packets (a post-quantum key share) reaches
/// Weir in two parts, so Weir has the connection before the whole hello.
struct SplitHello {
    addr: SocketAddr,
    /// The client's Initial datagrams before Weir's first flight.
    first_flight: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl SplitHello {
    async fn start(to: SocketAddr) -> SplitHello {
        let front = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        let back = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("bind"));
        back.connect(to).await.expect("connect");
        let addr = front.local_addr().expect("address");
        let first_flight = Arc::new(AtomicUsize::new(0));
        let counted = first_flight.clone();
        let task = tokio::spawn(async move {
            let (mut client, mut sent, mut answered) = (None, 0, false);
            let (mut up, mut down) = (vec![0; 65536], vec![0; 65536]);
            loop {
                tokio::select! {
                    r = front.recv_from(&mut up) => {
                        let Ok((n, from)) = r else { return };
                        client = Some(from);
                        // The first flight: the Initial datagrams (padded to 1200 bytes)
                        // before Weir's first flight (its certificate, more than 1000).
                        let initial = !answered && n >= 1200;
                        if initial {
                            sent += 1;
                            counted.store(sent, Ordering::Relaxed);
                        }
                        let datagram = up[..n].to_vec();
                        let back = back.clone();
                        // The hello's second part comes late (a lossy path would do as
                        // much); the rest goes at once.
                        let late = initial && sent == 2;
                        let delay = Duration::from_millis(if late { 300 } else { 0 });
                        tokio::spawn(async move {
                            tokio::time::sleep(delay).await;
                            let _ = back.send(&datagram).await;
                        });
                    }
                    r = back.recv(&mut down) => {
                        let Ok(n) = r else { return };
                        answered |= n > 1000;
                        if let Some(to) = client {
                            let _ = front.send_to(&down[..n], to).await;
                        }
                    }
                }
            }
        });
        SplitHello {
            addr,
            first_flight,
            task,
        }
    }
}

impl Drop for SplitHello {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn with_early_data_a_client_hello_in_two_packets_still_gives_the_sni() {
    let dir = std::env::temp_dir().join(format!("weir-h3-sni-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("access.log");
    let ca = TestCa::new("h3 CA");
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::echo("e");
    let weir = single(backend.addr())
        .listener("http3 = { early_data = true }")
        .listener(&format!(
            "access_log = {{ format = \"json\", path = \"{}\" }}",
            path.display()
        ))
        .listener(&tls_table(&[&leaf], ""))
        .start();
    let relay = SplitHello::start(weir.addr).await;
    // A post-quantum key share only (1216 bytes for ML-KEM-768 alone): the ClientHello
    // cannot fit one Initial packet.
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768];
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(ca.roots())
        .with_no_client_auth();
    let connected = connect(relay.addr, NAME, &tls).await;
    let mut c = connected.expect("HTTP/3 connection");
    let r = get(&mut c.send, NAME, "/").await.expect("GET");
    assert_eq!(r.status, 200);
    let flight = relay.first_flight.load(Ordering::Relaxed);
    assert!(flight >= 2, "the ClientHello spans {flight} datagram(s)");
    let read = || std::fs::read_to_string(&path).unwrap_or_default();
    let logged = wait_until_async(Duration::from_secs(10), || read().ends_with('\n')).await;
    let line = read();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(logged, "no log line");
    assert!(line.contains(&format!("\"sni\":\"{NAME}\"")), "{line}");
}
