//! Bodies stream through bounded buffers: a large request body (to a `sink` backend) and a
//! large response body (from a `huge` backend) cross the real `weir` process at the same
//! time, are hashed on both ends, and the process's peak RSS (VmHWM) stays under 64 MiB.
//!
//! Both sizes always run. Measured in the debug build on a 2-core machine: 1 GiB each way
//! in about 25 s (pattern generation and hashing in unoptimised test code dominate), weir's
//! VmHWM about 10 MiB before and after; 64 MiB each way in about 3 s. Should the 1 GiB run
//! ever pass a minute, mark it `#[ignore = "slow: run with --ignored"]`: the 64 MiB run
//! keeps guarding the bound.

mod support_process;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support_process::{config, connect, read_head, read_response, route_to, Weir};
use weir_testkit::{fill_pattern, pattern_hash, Backend, Hasher};

const RSS_LIMIT_KIB: u64 = 64 * 1024;
const BLOCK: usize = 64 * 1024;

/// Sends a `len`-byte pattern body to `/sink`; checks the sink's length and hash.
fn upload(addr: SocketAddr, len: u64) -> Duration {
    let started = Instant::now();
    let mut s = connect(addr, Duration::from_secs(2)).unwrap();
    s.write_all(
        format!("POST /sink HTTP/1.1\r\nHost: test\r\nContent-Length: {len}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut hasher = Hasher::new();
    let mut buf = vec![0u8; BLOCK];
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(BLOCK as u64) as usize;
        fill_pattern(off, &mut buf[..n]);
        hasher.update(&buf[..n]);
        s.write_all(&buf[..n]).expect("upload write");
        off += n as u64;
    }
    let (head, body) = read_response(&mut s).expect("sink response");
    assert_eq!(head.status, 200);
    assert_eq!(
        String::from_utf8_lossy(&body),
        hasher.summary(),
        "the sink saw exactly the bytes sent"
    );
    started.elapsed()
}

/// Downloads `/huge` (`len` pattern bytes); checks length and hash.
fn download(addr: SocketAddr, len: u64) -> Duration {
    let expected = std::thread::spawn(move || pattern_hash(len));
    let started = Instant::now();
    let mut s = connect(addr, Duration::from_secs(2)).unwrap();
    s.write_all(b"GET /huge HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    let head = read_head(&mut s).expect("huge response head");
    assert_eq!(head.status, 200);
    assert_eq!(head.content_length(), Some(len));
    let mut hasher = Hasher::new();
    hasher.update(&head.rest);
    let mut buf = vec![0u8; BLOCK];
    while hasher.len() < len {
        let want = ((len - hasher.len()) as usize).min(BLOCK);
        let n = s.read(&mut buf[..want]).expect("download read");
        assert!(n > 0, "closed after {} of {len} bytes", hasher.len());
        hasher.update(&buf[..n]);
    }
    let elapsed = started.elapsed();
    assert_eq!(hasher.len(), len);
    assert_eq!(
        hasher.finish(),
        expected.join().unwrap(),
        "the client got exactly the bytes the backend sent"
    );
    elapsed
}

fn stream_both_ways(len: u64) {
    let sink = Backend::sink();
    let huge = Backend::huge(len);
    let weir = Weir::start(&config(
        "drain_timeout = \"0s\"",
        "client_timeout = \"60s\"",
        &(route_to("sink", "/sink", sink.addr()) + &route_to("huge", "/huge", huge.addr())),
    ));
    let addr = weir.addr;
    let idle_hwm = weir.proc_status_kib("VmHWM");
    let started = Instant::now();
    let up = std::thread::spawn(move || upload(addr, len));
    let down = std::thread::spawn(move || download(addr, len));
    let up = up.join().expect("upload");
    let down = down.join().expect("download");
    let hwm = weir.proc_status_kib("VmHWM");
    let rss = weir.proc_status_kib("VmRSS");
    eprintln!(
        "{len} bytes each way: upload {up:?}, download {down:?}, total {:?}; weir VmHWM idle \
         {idle_hwm} KiB, after {hwm} KiB, VmRSS {rss} KiB",
        started.elapsed()
    );
    assert!(
        hwm < RSS_LIMIT_KIB,
        "peak RSS {hwm} KiB >= {RSS_LIMIT_KIB} KiB"
    );
}

#[test]
fn body_64mib_both_ways_in_bounded_memory() {
    stream_both_ways(64 << 20);
}

#[test]
fn body_1gib_both_ways_in_bounded_memory() {
    stream_both_ways(1 << 30);
}
