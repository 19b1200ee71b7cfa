//! `max_connections`: at the limit Weir stops accepting; a further connection waits in the
//! kernel backlog, unanswered, until one of the open connections closes, and is then served.

mod support_process;

use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::time::Duration;

use support_process::{config, connect, get_on, read_response, route_to, Weir};
use weir_testkit::Backend;

const LIMIT: usize = 4;

fn open_served(weir: &Weir) -> TcpStream {
    let mut s = connect(weir.addr, Duration::from_secs(2)).unwrap();
    let (head, _) = get_on(&mut s, "/hold").expect("served below the limit");
    assert_eq!(head.status, 200);
    s
}

#[test]
fn fifth_connection_waits_until_one_closes() {
    let backend = Backend::echo("e");
    let weir = Weir::start(&config(
        "drain_timeout = \"0s\"",
        &format!(
            "max_connections = {LIMIT}\nkeepalive_timeout = \"60s\"\nheader_timeout = \"60s\""
        ),
        &route_to("e", "/", backend.addr()),
    ));
    // Four connections, each proven accepted by a served request, then left idle.
    let mut held: Vec<TcpStream> = (0..LIMIT).map(|_| open_served(&weir)).collect();

    // The fifth: the kernel completes the handshake (backlog), Weir does not accept it.
    let mut fifth = connect(weir.addr, Duration::from_secs(2)).expect("backlog accepts");
    fifth
        .write_all(b"GET /fifth HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    fifth
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    match read_response(&mut fifth) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("the fifth connection must get no response yet: {other:?}"),
    }
    // The held connections are still served at the limit.
    let (head, _) = get_on(&mut held[0], "/still").unwrap();
    assert_eq!(head.status, 200);

    // One closes: the fifth is accepted and its request (already sent) answered.
    drop(held.pop());
    // A blocking read bounded by a generous timeout: no timing is asserted.
    fifth
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let response = read_response(&mut fifth).expect("the fifth is served once one closes");
    let (head, body) = response;
    assert_eq!(head.status, 200);
    assert!(body.starts_with(b"GET /fifth HTTP/1.1\r\n"), "{body:?}");

    // Now four are open again (three held + the fifth): a sixth waits in turn.
    let mut sixth = connect(weir.addr, Duration::from_secs(2)).unwrap();
    sixth
        .write_all(b"GET /sixth HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    sixth
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    assert!(
        read_response(&mut sixth).is_err(),
        "the sixth waits while four are open"
    );
    drop(fifth);
    sixth
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let (head, _) = read_response(&mut sixth).expect("served once the fifth closed");
    assert_eq!(head.status, 200);
}
