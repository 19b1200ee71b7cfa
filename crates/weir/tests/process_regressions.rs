//! Regressions for bugs found while testing, reproduced against the real binary.

mod support_process;

use std::io::Write;
use std::time::Duration;

use support_process::{config, connect, get, read_response, route_to, Weir};
use weir_testkit::Backend;

/// An upstream status line without a reason phrase (`HTTP/1.1 200\r\n`, accepted by httparse).
/// Was: httparse returns a static `""` reason outside the buffer, its range pointed outside
/// too, and writing the client head panicked; with the release profile's `panic = "abort"`
/// one such response killed the whole process (found by the `http1_response_head` fuzz target).
#[test]
fn upstream_status_line_without_reason_phrase() {
    for raw in [
        &b"HTTP/1.1 200\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"[..],
        b"HTTP/1.1 200\nContent-Length: 2\nConnection: close\n\nok",
    ] {
        let backend = Backend::raw_response(raw);
        let mut weir = Weir::start(&config(
            "drain_timeout = \"0s\"",
            "",
            &route_to("raw", "/", backend.addr()),
        ));
        let result = get(weir.addr, "/");
        assert!(!weir.exited(), "weir died; stderr:\n{}", weir.log.text());
        let (head, body) = result.unwrap_or_else(|e| {
            panic!(
                "no response ({e}) for {:?}; stderr:\n{}",
                String::from_utf8_lossy(raw),
                weir.log.text()
            )
        });
        assert_eq!(head.status, 200);
        assert_eq!(body, b"ok");
    }
}

/// An absolute-form target without a path (`GET http://test HTTP/1.1`) means `/` (RFC 9112
/// 3.2.2). Was: the router matched prefixes against the empty path, so a `/` route did not
/// match and the listener's default response (404) was sent instead.
#[test]
fn absolute_form_without_path_is_routed_as_root() {
    let backend = Backend::echo("e");
    let weir = Weir::start(&config(
        "drain_timeout = \"0s\"",
        "",
        &route_to("e", "/", backend.addr()),
    ));
    let mut s = connect(weir.addr, Duration::from_secs(2)).unwrap();
    s.write_all(b"GET http://test HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    let (head, body) = read_response(&mut s).unwrap();
    assert_eq!(head.status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(body.starts_with(b"GET / HTTP/1.1\r\n"), "{body:?}");
}
