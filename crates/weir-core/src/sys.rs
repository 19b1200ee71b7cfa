//! The data plane's only unsafe code: pipes and splice(2) for the L4 relay (Linux), the
//! registration of listening sockets with the reactor, the SIOCOUTQ ioctl(2) (a socket's
//! unacknowledged bytes, for the relays' still-time watch), TCP_DEFER_ACCEPT, flock(2)
//! and sysconf(3) for the `process_*` metrics; open(2), openat(2), openat2(2) and
//! sendfile(2) for static files (`files`); memfd_create(2), its seals and mmap(2) for
//! large memory-store cache entries (`cache::sealed`), so that they too go out with
//! sendfile(2), and getrlimit(2) to bound how many they hold.
//!
//! Each function wraps one system call; the file descriptors involved are borrowed from
//! owned sockets and pipes (`BorrowedFd`), so none can be closed while in use. The one
//! exception, [`borrow_socket`], is an `unsafe fn`: its callers state why the socket
//! outlives the borrow. On other
//! systems `Pipe::new` fails with `Unsupported` and the relay copies through a buffer.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// A non-blocking pipe: bytes spliced into `write` come out of `read`.
#[derive(Debug)]
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    #[cfg(target_os = "linux")]
    pub fn new() -> io::Result<Pipe> {
        use std::os::fd::FromRawFd;
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(Pipe { read, write })
    }

    #[cfg(not(target_os = "linux"))]
    pub fn new() -> io::Result<Pipe> {
        Err(io::ErrorKind::Unsupported.into())
    }

    /// Moves up to `len` bytes from the socket `from` into the pipe.
    pub fn fill_from(&self, from: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
        splice(from, self.write.as_fd(), len)
    }

    /// Moves up to `len` bytes from the pipe to the socket `to`.
    pub fn drain_to(&self, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
        splice(self.read.as_fd(), to, len)
    }
}

/// Registers a listening socket with the reactor, for readable (incoming connection) events.
/// Accepting through the `mio` listener yields sockets that are not registered (see
/// `client_stream`), which tokio's own `TcpListener` cannot do.
pub fn register_listener(
    listener: mio::net::TcpListener,
) -> io::Result<tokio::io::unix::AsyncFd<mio::net::TcpListener>> {
    use tokio::io::{unix::AsyncFd, Interest};
    // SAFETY: the AsyncFd takes ownership of `listener`, which owns its descriptor, so the
    // descriptor stays open for as long as it is registered.
    unsafe { AsyncFd::register_with_interest(listener, Interest::READABLE) }.map_err(Into::into)
}

/// Bytes written to a TCP socket that the peer has not acknowledged yet (the SIOCOUTQ
/// ioctl, which libc names TIOCOUTQ: the same request number on Linux). The relays'
/// still-time watch compares it between ticks: a queue that shrank is a slow reader
/// taking bytes while Weir's own write waits for room. 0 when unknown.
#[cfg(target_os = "linux")]
pub fn unsent(socket: BorrowedFd<'_>) -> u32 {
    use std::os::fd::AsRawFd;
    let mut value: libc::c_int = 0;
    // SAFETY: the descriptor is borrowed from a live socket; `value` is valid for writes
    // for the duration of the call (SIOCOUTQ stores one int).
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &mut value) };
    match rc {
        0 => u32::try_from(value).unwrap_or(0),
        _ => 0,
    }
}

/// See the Linux version; elsewhere the watch relies on Weir's own transfers.
#[cfg(not(target_os = "linux"))]
pub fn unsent(_socket: BorrowedFd<'_>) -> u32 {
    0
}

/// The unsent bytes of all `sockets` together (see [`unsent`]): the still-time probe of a
/// relay. Only the peers' acknowledgements shrink the sum; Weir's writes grow it.
pub fn unsent_total(sockets: &[Option<BorrowedFd<'_>>]) -> u64 {
    sockets
        .iter()
        .flatten()
        .map(|s| u64::from(unsent(*s)))
        .sum()
}

/// Borrows a socket by its descriptor number, for a relay that holds the stream owning
/// it mutably (split into halves, or moved into a TLS stream) while its watch asks
/// [`unsent`]. `None` for -1 (`ClientStream::raw_fd` of a socket that is gone).
///
/// # Safety
///
/// The descriptor must stay open for as long as the returned `BorrowedFd` is used: the
/// stream that owns it must outlive the relay, and the relay be its only user.
pub unsafe fn borrow_socket<'a>(fd: std::os::fd::RawFd) -> Option<BorrowedFd<'a>> {
    // SAFETY: the caller keeps the descriptor open (see above); -1 is filtered out, as
    // `borrow_raw` requires.
    (fd != -1).then(|| unsafe { BorrowedFd::borrow_raw(fd) })
}

/// TCP_DEFER_ACCEPT on a listening socket: accept(2) returns a connection only once its
/// first bytes have arrived, or after about `seconds` (the kernel then hands it over anyway).
/// The first read of an accepted connection then finds its request instead of waiting.
#[cfg(target_os = "linux")]
pub fn set_defer_accept(socket: BorrowedFd<'_>, seconds: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let value = libc::c_int::try_from(seconds).unwrap_or(libc::c_int::MAX);
    // SAFETY: the descriptor is borrowed from a live socket; `value` outlives the call and
    // its size is passed with it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The TCP_DEFER_ACCEPT setting of a socket, as the kernel reports it (seconds, 0 = off).
#[cfg(all(test, target_os = "linux"))]
pub fn defer_accept(socket: BorrowedFd<'_>) -> io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the descriptor is borrowed from a live socket; `value` and `len` are valid
    // for writes for the duration of the call.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u32::try_from(value).unwrap_or(0))
}

/// TCP_DEFER_ACCEPT is Linux-only: elsewhere connections are accepted at once.
#[cfg(not(target_os = "linux"))]
pub fn set_defer_accept(_: BorrowedFd<'_>, _: u32) -> io::Result<()> {
    Ok(())
}

/// The size of a memory page in bytes (sysconf `_SC_PAGESIZE`), `None` if unknown.
pub fn page_size() -> Option<u64> {
    sysconf(libc::_SC_PAGESIZE)
}

/// The kernel's clock ticks per second (sysconf `_SC_CLK_TCK`), the unit of the CPU times
/// in /proc/PID/stat; `None` if unknown.
pub fn clock_ticks_per_second() -> Option<u64> {
    sysconf(libc::_SC_CLK_TCK)
}

fn sysconf(name: libc::c_int) -> Option<u64> {
    // SAFETY: sysconf takes a plain integer and touches no memory of ours; it returns -1
    // for an unknown name or an indeterminate value.
    let value = unsafe { libc::sysconf(name) };
    u64::try_from(value).ok().filter(|v| *v > 0)
}

/// splice(2) between two descriptors, without blocking; `len` is capped at what the
/// kernel accepts in one call.
#[cfg(target_os = "linux")]
fn splice(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
    // SAFETY: both descriptors are borrowed from live owners for the duration of the call;
    // null offsets mean "the file position", as required for sockets and pipes.
    let n = unsafe {
        libc::splice(
            from.as_raw_fd(),
            std::ptr::null_mut(),
            to.as_raw_fd(),
            std::ptr::null_mut(),
            len.min(1 << 30),
            flags,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

#[cfg(not(target_os = "linux"))]
fn splice(_: BorrowedFd<'_>, _: BorrowedFd<'_>, _: usize) -> io::Result<usize> {
    Err(io::ErrorKind::Unsupported.into())
}

/// Whether this kernel can splice at all: a zero-length splice between two pipes answers
/// at once (0 or EAGAIN) where splice exists, and ENOSYS / EINVAL where it does not.
pub fn splice_available() -> bool {
    let (Ok(a), Ok(b)) = (Pipe::new(), Pipe::new()) else {
        return false;
    };
    match splice(a.read.as_fd(), b.write.as_fd(), 1) {
        Ok(_) => true,
        Err(e) => e.kind() == io::ErrorKind::WouldBlock,
    }
}

/// Whether a splice error means "not possible on these descriptors" (so copying is the
/// answer) rather than a failed connection.
pub fn splice_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
    ) || e.kind() == io::ErrorKind::Unsupported
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[test]
    fn splices_between_sockets() {
        assert!(splice_available());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let back = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let out = std::net::TcpStream::connect(back.local_addr().unwrap()).unwrap();
        let (mut sink, _) = back.accept().unwrap();
        client.write_all(b"hello").unwrap();
        let pipe = Pipe::new().unwrap();
        let n = pipe.fill_from(server.as_fd(), 64).unwrap();
        assert_eq!(pipe.drain_to(out.as_fd(), n).unwrap(), n);
        let mut got = vec![0; n];
        sink.read_exact(&mut got).unwrap();
        assert_eq!(got[..], b"hello"[..n]);
        server.set_nonblocking(true).unwrap();
        let e = pipe.fill_from(server.as_fd(), 64).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }
}

/// Takes an exclusive `flock(2)` on `file` without waiting: `Ok(false)` when another
/// process holds it. Released when the descriptor closes (the lock of automatic
/// certificates' storage).
/// The effective user ID of this process.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid takes nothing and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether this process may create files in directory `dir` (`access(W_OK | X_OK)`).
pub fn check_writable(dir: &std::path::Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::other("a NUL byte in the path"))?;
    // SAFETY: a valid NUL-terminated path; access only reads it.
    if unsafe { libc::access(c_path.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits for an exclusive `flock` on `file` (held until the file is closed).
pub fn lock_exclusive(file: BorrowedFd<'_>) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: flock on a borrowed, open descriptor; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

pub fn try_lock_exclusive(file: BorrowedFd<'_>) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a borrowed, open descriptor; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let error = io::Error::last_os_error();
    if error.kind() == io::ErrorKind::WouldBlock {
        Ok(false)
    } else {
        Err(error)
    }
}

/// Opens `path` as an `O_PATH` directory descriptor (a static-file root).
pub fn open_dir(path: &std::ffi::CStr) -> io::Result<OwnedFd> {
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: `path` is NUL-terminated; the result is checked.
    owned_fd(unsafe { libc::open(path.as_ptr(), flags) })
}

/// openat(2): `rel` relative to the directory `dir`, with `flags`.
pub fn openat(
    dir: BorrowedFd<'_>,
    rel: &std::ffi::CStr,
    flags: libc::c_int,
) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    // SAFETY: `rel` is NUL-terminated, `dir` an open descriptor; the result is checked.
    owned_fd(unsafe { libc::openat(dir.as_raw_fd(), rel.as_ptr(), flags) })
}

/// openat2(2): as [`openat`], resolved as `resolve` (`RESOLVE_*`) says.
pub fn openat2(
    dir: BorrowedFd<'_>,
    rel: &std::ffi::CStr,
    flags: libc::c_int,
    resolve: u64,
) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    // SAFETY: `open_how` is plain data; zeroed is its valid empty value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.resolve = resolve;
    // SAFETY: the arguments are what openat2(2) takes: a directory descriptor, a
    // NUL-terminated path, a pointer to `how` and its size; the result is checked.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            rel.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    owned_fd(fd as libc::c_int)
}

fn owned_fd(fd: libc::c_int) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just returned by the kernel, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// sendfile(2): up to `len` bytes of `file` from `*offset` (advanced) to `socket`.
pub fn sendfile(
    socket: BorrowedFd<'_>,
    file: BorrowedFd<'_>,
    offset: &mut i64,
    len: usize,
) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: two open descriptors and a valid offset pointer; the result is checked.
    let n = unsafe { libc::sendfile(socket.as_raw_fd(), file.as_raw_fd(), offset, len) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// A read-only mapping of a sealed memfd: the bytes of a [`sealed_memfd`].
struct Mapping {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the mapping is read-only and its file sealed against writes, shrinking and
// growth: the bytes never change and stay mapped until `Drop`, whoever holds it.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: nothing is ever written through it.
unsafe impl Sync for Mapping {}

impl AsRef<[u8]> for Mapping {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len` bytes mapped readable at `ptr` until `Drop` (see `Send`).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made by `sealed_memfd`, unmapped once, here.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// A memfd holding a copy of `bytes`, sealed (no write, shrink or growth, no more seals:
/// mapping it and sending it with sendfile(2) are safe whoever holds it), and its bytes
/// as `Bytes` mapped from it (one copy in memory, shared). Fails for empty `bytes`.
#[cfg(target_os = "linux")]
pub fn sealed_memfd(bytes: &[u8]) -> io::Result<(std::fs::File, bytes::Bytes)> {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    if bytes.is_empty() {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: a NUL-terminated name and flags; the result is checked by `owned_fd`.
    let fd = owned_fd(unsafe { libc::memfd_create(c"weir-cache".as_ptr(), flags) })?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on an open descriptor; the result is checked.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // Private, not shared: before Linux 6.7 the kernel refuses any shared mapping of a
    // write-sealed file, even a read-only one (EPERM). A private mapping that is never
    // written maps the file's own pages (no copy on write ever happens).
    let (prot, private) = (libc::PROT_READ, libc::MAP_PRIVATE);
    // SAFETY: a new read-only mapping of `bytes.len()` bytes of an open file that long.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes.len(),
            prot,
            private,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mapping = Mapping {
        ptr: ptr as *const u8,
        len: bytes.len(),
    };
    Ok((file, bytes::Bytes::from_owner(mapping)))
}

#[cfg(not(target_os = "linux"))]
pub fn sealed_memfd(_: &[u8]) -> io::Result<(std::fs::File, bytes::Bytes)> {
    Err(io::ErrorKind::Unsupported.into())
}

/// The descriptors one kind of long-held file may take together (the cache's sealed
/// memfds, the static files' open-file caches): a quarter of the open-file limit, so that
/// connections keep the rest; `None` when the limit cannot be read or is infinite. Read
/// once.
pub fn descriptor_share() -> Option<u64> {
    static SHARE: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *SHARE.get_or_init(|| open_file_limit().map(|n| n / 4))
}

/// The soft limit on this process's open files (RLIMIT_NOFILE), if it is finite.
pub fn open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit for getrlimit to fill; the result is checked.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}
