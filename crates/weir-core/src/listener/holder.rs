//! Who else listens on an address. Listeners bind with SO_REUSEPORT so that every worker
//! has its own socket; the flip side is that a second process of the same user (a second
//! `weir run` with a copy of the config) could bind the same address without an error and
//! take half of the new connections. Before the first socket of a listener is bound, a
//! probe bind *without* SO_REUSEPORT finds out whether anybody listens there; if somebody
//! does and it is not this process (a reload that rebinds an address keeps the old sockets
//! open until the new ones accept), the bind is refused, naming the holder's PID where
//! /proc shows it.
//!
//! A binary upgrade does not come here for the sockets it hands over: the new process
//! inherits them (see `server::take_inherited`) and binds only the addresses that are new.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};

/// Fails with `AddrInUse` when a socket of another process listens on `addr` (or on an
/// address that overlaps it: the same port on the wildcard address). Port 0 always passes.
pub fn refuse_foreign_listener(addr: SocketAddr) -> io::Result<()> {
    if addr.port() == 0 || probe(addr).is_ok() {
        return Ok(());
    }
    let own = socket_inodes("/proc/self/fd");
    let foreign: Vec<Listening> = listening_on(addr)
        .into_iter()
        .filter(|l| !own.contains(&l.inode))
        .collect();
    let Some(first) = foreign.first() else {
        // Only this process holds it (a reload rebinding the address), or /proc is not
        // readable: nothing to refuse.
        return Ok(());
    };
    let holder = match owner_of(first.inode) {
        Some((pid, name)) => format!("process {pid} ({name})"),
        None => format!(
            "another process (uid {}; its PID is not visible to this user)",
            first.uid
        ),
    };
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!(
            "{} already listens on {} (fix: stop it, or give this listener another bind; \
             a running weir changes config with SIGHUP or `weir ctl apply`, and binary with `weir upgrade`)",
            holder, first.addr
        ),
    ))
}

/// Binds `addr` with SO_REUSEADDR only: succeeds unless a listening socket (of anybody)
/// holds the address. The socket is closed at once.
fn probe(addr: SocketAddr) -> io::Result<()> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())
}

/// A listening socket from /proc/net/tcp{,6}.
#[derive(Debug, PartialEq, Eq)]
struct Listening {
    addr: SocketAddr,
    uid: u32,
    inode: u64,
}

/// The listening sockets whose address overlaps `addr`.
fn listening_on(addr: SocketAddr) -> Vec<Listening> {
    let overlaps = |l: &Listening| {
        l.addr.port() == addr.port()
            && (l.addr.ip() == addr.ip()
                || l.addr.ip().is_unspecified()
                || addr.ip().is_unspecified())
    };
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(parse_line)
                .collect::<Vec<_>>()
        })
        .filter(|l| l.addr.is_ipv6() == addr.is_ipv6() || l.addr.ip().is_unspecified())
        .filter(overlaps)
        .collect()
}

/// One line of /proc/net/tcp{,6}, if it is a listening socket (state 0A).
fn parse_line(line: &str) -> Option<Listening> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.get(3) != Some(&"0A") {
        return None;
    }
    let (ip, port) = fields.get(1)?.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    Some(Listening {
        addr: SocketAddr::new(parse_ip(ip)?, port),
        uid: fields.get(7)?.parse().ok()?,
        inode: fields.get(9)?.parse().ok()?,
    })
}

/// The kernel prints each 32-bit word of the address (network byte order in memory) as a
/// native-endian hex number.
fn parse_ip(hex: &str) -> Option<IpAddr> {
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(bytes)))
        }
        _ => None,
    }
}

/// The socket inodes among the descriptors in `dir` (`/proc/PID/fd`).
fn socket_inodes(dir: &str) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|target| {
            let t = target.to_str()?;
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// The PID and command name of a process holding socket `inode`, where this user may look.
fn owner_of(inode: u64) -> Option<(u32, String)> {
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| socket_inodes(&format!("/proc/{pid}/fd")).contains(&inode))
        .map(|pid| {
            let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map_or_else(|_| "?".to_string(), |n| n.trim().to_string());
            (pid, name)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_listening_lines_only() {
        let v4 = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000 100 0 0 10 0";
        assert_eq!(
            parse_line(v4),
            Some(Listening {
                addr: "127.0.0.1:8080".parse().unwrap(),
                uid: 1000,
                inode: 4242
            })
        );
        let established = v4.replace(" 0A ", " 01 ");
        assert_eq!(parse_line(&established), None);
        let v6 = "   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 7 1 0000000000000000 100 0 0 10 0";
        assert_eq!(parse_line(v6).unwrap().addr, "[::1]:8080".parse().unwrap());
    }

    #[test]
    fn own_sockets_pass_and_port_zero_passes() {
        let own = super::super::bind_reuseport("127.0.0.1:0".parse().unwrap(), 16, false).unwrap();
        let addr = own.local_addr().unwrap();
        refuse_foreign_listener(addr).unwrap();
        refuse_foreign_listener("127.0.0.1:0".parse().unwrap()).unwrap();
        assert!(probe(addr).is_err(), "the probe sees the listener");
        drop(own);
        assert!(probe(addr).is_ok());
    }
}
