//! HTTP/3 flood defences, with the HTTP/2 budgets of the listener (`http2.reset_budget`,
//! `glitch_budget`): a client that resets request streams in a loop (rapid reset), opens
//! unidirectional streams past the three HTTP/3 needs, or sends frames on its control
//! stream after SETTINGS, is closed with H3_EXCESSIVE_LOAD once past the budget (one
//! control-stream frame longer than 16 KiB at once), and
//! counted in `weir_http3_client_resets_total`, `weir_http3_glitches_total` and
//! `weir_http3_excessive_load_closes_total`. A request stream's frame other than DATA
//! declared longer than `max_field_section_size` plus 16 KiB ends that stream
//! (H3_EXCESSIVE_LOAD) before its payload is buffered. Each attacker is a real QUIC
//! client (quinn, and the h3 client for requests), writing its own frames where h3 would
//! not.

mod common;

use std::time::Duration;

use http::Request;
use weir_testkit::certs::TestCa;
use weir_testkit::h3_client::{
    connect_to, get, quic_connect, ConnectionError, H3Code, QuicConnection, WriteError,
};
use weir_testkit::Backend;

use common::{single, tls_table, Weir};

const NAME: &str = "h3.example.com";

/// A glitch budget of 5 (per minute).
const FIVE_GLITCHES: &str = "http2 = { glitch_budget = 5, glitch_window = \"60s\" }";

/// HTTP/3's EXCESSIVE_LOAD error code (RFC 9114 8.1).
const H3_EXCESSIVE_LOAD: u32 = 0x107;

fn start(ca: &TestCa, http2: &str) -> (Weir, Backend) {
    let leaf = ca.leaf(&[NAME]);
    let backend = Backend::echo("e");
    let weir = single(backend.addr())
        .listener("http3 = true")
        .listener(http2)
        .listener(&tls_table(&[&leaf], ""))
        .start();
    (weir, backend)
}

/// Waits for `connection` to be closed by Weir; panics unless with H3_EXCESSIVE_LOAD.
async fn closed_for_excessive_load(connection: &QuicConnection) {
    let closed = tokio::time::timeout(Duration::from_secs(20), connection.closed()).await;
    match closed.expect("Weir closes the connection") {
        ConnectionError::ApplicationClosed(close) => {
            assert_eq!(close.error_code, H3_EXCESSIVE_LOAD.into(), "{close:?}")
        }
        other => panic!("closed otherwise: {other:?}"),
    }
}

fn counter(weir: &Weir, name: &str) -> u64 {
    weir.metric(&format!("{name}{{listener=\"web\"}}"))
}

#[tokio::test]
async fn resetting_request_streams_past_the_budget_closes_the_connection() {
    let ca = TestCa::new("h3 CA");
    let (weir, _backend) = start(&ca, "http2 = { reset_budget = 5, reset_window = \"60s\" }");
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    // Within the budget: requests still work.
    assert_eq!(get(&mut c.send, NAME, "/").await.expect("GET").status, 200);
    for _ in 0..20 {
        // A request whose body never comes, reset: Weir holds it open until then.
        let req = Request::post(format!("https://{NAME}/up"))
            .body(())
            .expect("request");
        let Ok(mut stream) = c.send.send_request(req).await else {
            break;
        };
        stream.stop_stream(H3Code::H3_REQUEST_CANCELLED);
        stream.stop_sending(H3Code::H3_REQUEST_CANCELLED);
    }
    closed_for_excessive_load(&c.connection).await;
    assert!(counter(&weir, "weir_http3_client_resets_total") > 5);
    assert_eq!(counter(&weir, "weir_http3_excessive_load_closes_total"), 1);
    // Another connection is served.
    let mut again = connect_to(&ca, weir.addr, NAME).await;
    assert_eq!(
        get(&mut again.send, NAME, "/").await.expect("GET").status,
        200
    );
}

#[tokio::test]
async fn unidirectional_streams_past_the_needed_three_are_glitches() {
    let ca = TestCa::new("h3 CA");
    let (weir, _backend) = start(&ca, FIVE_GLITCHES);
    let c = connect_to(&ca, weir.addr, NAME).await;
    for _ in 0..30 {
        // A reserved stream type (RFC 9114 6.2.3: 0x1f * N + 0x21), then its end.
        let Ok(mut uni) = c.connection.open_uni().await else {
            break;
        };
        if uni.write_all(&[0x21, 0xff]).await.is_err() || uni.finish().is_err() {
            break;
        }
    }
    closed_for_excessive_load(&c.connection).await;
    assert!(counter(&weir, "weir_http3_glitches_total") > 5);
    assert_eq!(counter(&weir, "weir_http3_excessive_load_closes_total"), 1);
}

#[tokio::test]
async fn frames_on_the_control_stream_after_settings_are_glitches() {
    let ca = TestCa::new("h3 CA");
    let (weir, _backend) = start(&ca, FIVE_GLITCHES);
    let (_endpoint, connection) = quic_connect(weir.addr, NAME, &ca.client_config())
        .await
        .expect("connect");
    let mut control = connection.open_uni().await.expect("control stream");
    // The control stream's type, an empty SETTINGS, then reserved frames (type 0x21,
    // empty), which HTTP/3 says to ignore.
    control
        .write_all(&[0x00, 0x04, 0x00])
        .await
        .expect("SETTINGS");
    for _ in 0..30 {
        if control.write_all(&[0x21, 0x00]).await.is_err() {
            break;
        }
    }
    closed_for_excessive_load(&connection).await;
    assert!(counter(&weir, "weir_http3_glitches_total") > 5);
}

#[tokio::test]
async fn an_ordinary_connection_stays_within_the_default_budgets() {
    let ca = TestCa::new("h3 CA");
    let (weir, _backend) = start(&ca, "");
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    for _ in 0..50 {
        assert_eq!(get(&mut c.send, NAME, "/").await.expect("GET").status, 200);
    }
    assert_eq!(counter(&weir, "weir_http3_excessive_load_closes_total"), 0);
    assert_eq!(counter(&weir, "weir_http3_client_resets_total"), 0);
    assert!(
        counter(&weir, "weir_http3_glitches_total") <= 1,
        "a grease stream at most"
    );
}

#[tokio::test]
async fn a_control_frame_declaring_a_huge_length_closes_the_connection_at_once() {
    let ca = TestCa::new("h3 CA");
    let (weir, _backend) = start(&ca, "");
    let (_endpoint, connection) = quic_connect(weir.addr, NAME, &ca.client_config())
        .await
        .expect("connect");
    let mut control = connection.open_uni().await.expect("control stream");
    // The control stream's type, an empty SETTINGS, then a reserved frame (type 0x21)
    // declaring 2^40 bytes (an 8-byte varint), and the first 64 KiB of its payload: h3
    // would buffer the payload until all of it came.
    control
        .write_all(&[0x00, 0x04, 0x00, 0x21, 0xc0, 0, 0, 0x01, 0, 0, 0, 0])
        .await
        .expect("frame header");
    let _ = control.write_all(&[0; 64 * 1024]).await;
    closed_for_excessive_load(&connection).await;
    assert_eq!(counter(&weir, "weir_http3_excessive_load_closes_total"), 1);
}

/// A request stream whose frames `prefix` begins, then 8 MiB of the payload of the frame
/// it ends with: Weir stops the stream (STOP_SENDING H3_EXCESSIVE_LOAD) at that frame's
/// length, long before the 8 MiB are in. Before, h3 took and buffered it all.
async fn oversized_frame_is_stopped(connection: &QuicConnection, prefix: &[u8]) {
    let (mut send, _recv) = connection.open_bi().await.expect("request stream");
    send.write_all(prefix).await.expect("frame header");
    let chunk = [0u8; 64 * 1024];
    for sent in 0..128 {
        match send.write_all(&chunk).await {
            Ok(()) => {}
            Err(WriteError::Stopped(code)) => {
                assert_eq!(code.into_inner(), u64::from(H3_EXCESSIVE_LOAD));
                assert!(sent < 16, "stopped only after {sent} x 64 KiB");
                return;
            }
            Err(e) => panic!("{e}"),
        }
    }
    panic!("8 MiB of one frame taken");
}

#[tokio::test]
async fn a_request_frame_declaring_a_huge_length_ends_its_stream_only() {
    let ca = TestCa::new("h3 CA");
    let (weir, _backend) = start(&ca, "");
    let mut c = connect_to(&ca, weir.addr, NAME).await;
    // Before the head: a reserved frame type (0x21) declaring 2^30 bytes.
    let unknown = [0x40, 0x21, 0xc0, 0, 0, 0, 0x40, 0, 0, 0];
    oversized_frame_is_stopped(&c.connection, &unknown).await;
    // After a head (QPACK, static table only: POST, https, /, then :authority), in the
    // body: the same frame.
    let mut head = vec![0x00, 0x00, 0xd4, 0xd7, 0xc1, 0x50, NAME.len() as u8];
    head.extend_from_slice(NAME.as_bytes());
    let mut frames = vec![0x01, head.len() as u8];
    frames.extend_from_slice(&head);
    frames.extend_from_slice(&unknown);
    oversized_frame_is_stopped(&c.connection, &frames).await;
    // A HEADERS frame of 2^30 bytes.
    oversized_frame_is_stopped(&c.connection, &[0x01, 0xc0, 0, 0, 0, 0x40, 0, 0, 0]).await;
    // The connection goes on.
    assert_eq!(get(&mut c.send, NAME, "/").await.expect("GET").status, 200);
    assert_eq!(counter(&weir, "weir_http3_excessive_load_closes_total"), 0);
}
