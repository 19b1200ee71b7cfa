//! The systemd notification protocol (sd_notify(3)) for `Type=notify` units: one datagram
//! of `KEY=VALUE` lines to the unix socket named by `$NOTIFY_SOCKET` (a path, or `@name`
//! in the abstract namespace). Without the variable every call does nothing, so Weir runs
//! the same outside systemd.
//!
//! What Weir tells: `READY=1` once its listeners accept; `RELOADING=1` (with
//! `MONOTONIC_USEC`) when SIGHUP or SIGUSR2 starts a reload or an upgrade, and `READY=1`
//! when it is over; `STOPPING=1` when it drains. A binary upgrade changes the main pid:
//! the new process reports `MAINPID=` its own pid with `READY=1` before it tells the old
//! one to drain, so systemd follows it and does not take the old one's exit for the
//! service's (this needs `NotifyAccess=all`: the new process is not the main one yet).
//! The variable is left in the environment on purpose: the new process of an upgrade
//! inherits it.
//!
//! Ten lines of protocol, written here rather than taken from a crate.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (newline-separated `KEY=VALUE` lines) to the service manager, if any.
/// Failures are logged and otherwise ignored: a notification is never worth stopping for.
pub fn notify(state: &str) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send(&socket, state) {
        tracing::warn!(socket = ?socket, error = %e, "cannot notify the service manager");
    }
}

fn send(socket: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    let datagram = UnixDatagram::unbound()?;
    let bytes = socket.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        datagram.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        datagram.send_to(state.as_bytes(), socket)?;
    }
    Ok(())
}

/// `READY=1`, with `MAINPID=` this process (a new main process after an upgrade).
pub fn ready() {
    notify(&format!("READY=1\nMAINPID={}", std::process::id()));
}

/// `RELOADING=1` with the monotonic time systemd asks for (`Type=notify-reload`).
pub fn reloading(status: &str) {
    notify(&format!(
        "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS={status}",
        monotonic_usec()
    ));
}

pub fn stopping() {
    notify("STOPPING=1\nSTATUS=draining");
}

/// CLOCK_MONOTONIC in microseconds, as `MONOTONIC_USEC` wants it.
fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs * 1_000_000 + nanos / 1_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_and_to_an_abstract_name() {
        let dir = std::env::temp_dir().join(format!("weir-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let receiver = UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        std::fs::remove_dir_all(&dir).unwrap();

        use std::os::linux::net::SocketAddrExt;
        let name = format!("weir-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let receiver = UnixDatagram::bind_addr(&addr).unwrap();
        send(std::ffi::OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }

    #[test]
    fn monotonic_time_moves_forward() {
        let a = monotonic_usec();
        assert!(a > 0);
        assert!(monotonic_usec() >= a);
    }
}
