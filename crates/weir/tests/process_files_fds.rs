//! Static files under a low open-file limit (attacker review): the open-file cache holds at
//! most a quarter of the limit whatever `open_file_cache` says, so a crawl of many files
//! leaves descriptors for connections; a file that cannot be opened for want of
//! descriptors answers 503, and is not kept as missing (a 404 for `open_file_cache_valid`
//! after the shortage).

mod support_process;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use support_process::{config, connect, get_on, TempDir, Weir};
use weir_testkit::wait_until;

const FD_LIMIT: u32 = 64;
const FILES: usize = 150;

#[test]
fn the_open_file_cache_leaves_descriptors_and_keeps_no_shortage() {
    let dir = TempDir::new("files-fds");
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    for i in 0..FILES {
        std::fs::write(root.join(format!("f{i}")), format!("file {i}")).unwrap();
    }
    std::fs::write(root.join("late"), "late").unwrap();
    std::fs::write(root.join("later"), "later").unwrap();
    let route = format!(
        "[[listeners.routes]]\nname = \"files\"\npath_prefix = \"/\"\n\
         files = {{ root = \"{}\", open_file_cache_valid = \"60s\" }}\n",
        root.display()
    );
    let text = config(
        "drain_timeout = \"1s\"",
        "header_timeout = \"60s\"\nkeepalive_timeout = \"60s\"\nbacklog = 1024",
        &route,
    );
    let path = dir.write("weir.toml", &text);
    let weir = Weir::spawn(support_process::fd_limited(&path, FD_LIMIT));

    // A crawl of more files than the limit: every one is served, and the cache keeps at
    // most a quarter of the limit open. Was: the cache kept 1024 per worker, opens failed
    // with EMFILE, and existing files answered 404 (kept so).
    let mut early = connect(weir.addr, Duration::from_secs(2)).unwrap();
    let (head, _) = get_on(&mut early, "/late").unwrap();
    assert_eq!(head.status, 200);
    let before = weir.open_fds();
    for i in 0..FILES {
        let (head, body) = get_on(&mut early, &format!("/f{i}")).unwrap();
        assert_eq!(head.status, 200, "/f{i}");
        assert_eq!(body, format!("file {i}").as_bytes());
    }
    let held = weir.open_fds() - before;
    eprintln!("the crawl left {held} descriptors more open");
    assert!(held <= FD_LIMIT as usize / 4, "{held} descriptors more");

    // Out of descriptors (connections hold them all): a file not in the cache is a 503.
    let mut flood: Vec<TcpStream> = Vec::new();
    for _ in 0..2 * FD_LIMIT {
        if let Ok(mut s) = connect(weir.addr, Duration::from_secs(1)) {
            let _ = s.write_all(b"GET /f0 HTTP/1.1\r\nHost: test\r\n\r\n");
            flood.push(s);
        }
    }
    assert!(
        weir.log
            .wait_for("out of resources", Duration::from_secs(20)),
        "stderr:\n{}",
        weir.log.text()
    );
    let (head, _) = get_on(&mut early, "/later").unwrap();
    assert_eq!(head.status, 503, "a passing shortage, not a missing file");

    // Once descriptors are free, the file is found: no 404 was kept for it.
    drop(flood);
    let mut last = 0;
    let found = wait_until(Duration::from_secs(20), || {
        last = get_on(&mut early, "/later").map_or(0, |(head, _)| head.status);
        last != 503
    });
    assert!(found && last == 200, "{last}");
}
