//! A reload keeps the connections a listener has not served yet (attack report F3): changing
//! `max_connections` or `backlog` changes the running sockets in place, and a listener moved
//! to another address first serves what its old socket accepted and queued. Each test holds
//! a TCP listener at `max_connections = 1` with one relayed connection, so a second one waits
//! inside Weir for a place and a third waits in the kernel's accept queue; both used to be
//! reset by the reload.

mod support_process;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use support_process::{listening_addr, Weir, START_WAIT};

/// A TCP server that sends back every byte each connection sends.
fn tcp_echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind echo");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = stream;
                let mut buf = [0u8; 256];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// A config with the TCP listener `web` on `bind` relaying to `echo`, and `keys`.
fn l4(bind: &str, keys: &str, echo: SocketAddr) -> String {
    format!(
        "[server]\nworkers = 1\ndrain_timeout = \"1s\"\n\n[admin]\nbind = \"off\"\n\n\
         [[listeners]]\nname = \"web\"\nbind = \"{bind}\"\nprotocol = \"tcp\"\n\
         upstream = \"up\"\n{keys}\n\n[upstreams.up]\nservers = [{{ addr = \"{echo}\" }}]\n"
    )
}

/// Sends `word` on `s` and reads it back (bounded: a reset or a close fails).
fn echoes(s: &mut TcpStream, word: &[u8]) -> Result<(), String> {
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    s.write_all(word).map_err(|e| format!("write: {e}"))?;
    let mut got = vec![0u8; word.len()];
    s.read_exact(&mut got).map_err(|e| format!("read: {e}"))?;
    match got == word {
        true => Ok(()),
        false => Err(format!("got {got:?}")),
    }
}

/// Starts Weir with `first`, and opens the three connections: one relayed, one waiting in
/// Weir for a place (the log says it paused), one in the kernel's queue.
fn at_the_cap(first: &str) -> (Weir, [TcpStream; 3]) {
    let weir = Weir::start(first);
    let mut held = TcpStream::connect(weir.addr).expect("connect");
    echoes(&mut held, b"held").expect("the first connection is relayed");
    let mut waiting = TcpStream::connect(weir.addr).expect("connect");
    waiting.write_all(b"w").expect("write");
    assert!(
        weir.log.wait_for("pausing accepts", START_WAIT),
        "{}",
        weir.log.text()
    );
    // The handshake completes in the kernel: the connection is queued, not accepted.
    let queued = TcpStream::connect(weir.addr).expect("connect");
    (weir, [held, waiting, queued])
}

/// The waiting and the queued connection are relayed after the reload (the waiting one
/// sent "w" before it).
fn all_served(weir: &Weir, [held, waiting, queued]: &mut [TcpStream; 3]) {
    let text = || weir.log.text();
    echoes(held, b"still").unwrap_or_else(|e| panic!("held: {e}\n{}", text()));
    let mut first = [0u8; 1];
    waiting
        .set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    waiting
        .read_exact(&mut first)
        .unwrap_or_else(|e| panic!("waiting: {e}\n{}", text()));
    assert_eq!(&first, b"w");
    echoes(waiting, b"after").unwrap_or_else(|e| panic!("waiting: {e}\n{}", text()));
    echoes(queued, b"queued").unwrap_or_else(|e| panic!("queued: {e}\n{}", text()));
}

#[test]
fn raising_max_connections_and_backlog_keeps_the_waiting_connections() {
    let echo = tcp_echo();
    let keys = |max, backlog| format!("max_connections = {max}\nbacklog = {backlog}");
    let (weir, mut conns) = at_the_cap(&l4("127.0.0.1:0", &keys(1, 16), echo));
    let path = weir.config_path.clone().expect("path");
    std::fs::write(&path, l4("127.0.0.1:0", &keys(3, 32), echo)).expect("write");
    weir.signal(libc::SIGHUP);
    all_served(&weir, &mut conns);
    // The same socket serves on: no new one was bound.
    let lines = weir.log.lines();
    let listening = lines.iter().filter(|l| listening_addr(l, "web").is_some());
    assert_eq!(listening.count(), 1, "{}", weir.log.text());
}

#[test]
fn a_listener_moved_to_another_port_serves_what_its_old_socket_queued() {
    let echo = tcp_echo();
    let (weir, mut conns) = at_the_cap(&l4("127.0.0.1:0", "max_connections = 1", echo));
    let free = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = free.local_addr().expect("addr").port();
    drop(free);
    let path = weir.config_path.clone().expect("path");
    let moved = l4(&format!("127.0.0.1:{port}"), "max_connections = 1", echo);
    std::fs::write(&path, moved).expect("write");
    weir.signal(libc::SIGHUP);
    all_served(&weir, &mut conns);
}
