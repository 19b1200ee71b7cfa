//! Opening a request's file beneath the route's root, and nothing outside it.
//!
//! The request path reaches here as plain relative segments (`files::path`: decoded, no
//! `.`/`..`, no encoded slash, no NUL). The kernel then resolves it beneath the root's
//! descriptor with openat2(2) `RESOLVE_BENEATH` (Linux 5.6): a symbolic link that leads
//! out of the root (absolute, or climbing with `..`) fails with `EXDEV`, links inside it
//! are followed. Where the kernel lacks openat2 (`ENOSYS`, or a seccomp filter's `EPERM`),
//! the file is opened with openat(2) and its real path (`/proc/self/fd/N`) must lie
//! beneath the root's canonical path; a file that does not is closed, never read. With
//! `follow_symlinks = true` links may lead anywhere: plain openat.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::sys;

/// Set once openat2 was found missing: every later open takes the fallback at once.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// Flags of every file opened: read-only, and `O_NONBLOCK` so that a FIFO under the root
/// cannot hold the worker in open(2) (it is refused once its type is seen).
const OPEN_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK;

/// A route's root directory, open.
#[derive(Debug)]
pub(crate) struct Root {
    dir: OwnedFd,
    /// Its canonical path, for the fallback's check.
    canonical: PathBuf,
    follow_symlinks: bool,
}

impl Root {
    pub fn open(path: &Path, follow_symlinks: bool) -> io::Result<Root> {
        let canonical = std::fs::canonicalize(path)?;
        let name = std::ffi::CString::new(canonical.as_os_str().as_bytes())?;
        Ok(Root {
            dir: sys::open_dir(&name)?,
            canonical,
            follow_symlinks,
        })
    }

    /// Opens `rel` (relative, plain segments; `.` for the root itself) beneath the root.
    pub fn open_beneath(&self, rel: &CStr) -> io::Result<File> {
        let dir = self.dir.as_fd();
        if self.follow_symlinks {
            return sys::openat(dir, rel, OPEN_FLAGS).map(File::from);
        }
        if !NO_OPENAT2.load(Ordering::Relaxed) {
            let resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
            match sys::openat2(dir, rel, OPEN_FLAGS, resolve) {
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
                    NO_OPENAT2.store(true, Ordering::Relaxed);
                }
                opened => return opened.map(File::from),
            }
        }
        self.open_checked(rel)
    }

    /// The fallback: openat, then the opened file's real path checked against the root.
    pub(super) fn open_checked(&self, rel: &CStr) -> io::Result<File> {
        let fd = sys::openat(self.dir.as_fd(), rel, OPEN_FLAGS)?;
        let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        if !real.starts_with(&self.canonical) {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        Ok(File::from(fd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn c(s: &str) -> std::ffi::CString {
        std::ffi::CString::new(s).unwrap()
    }

    /// Both ways of opening (openat2 and the fallback) refuse a link out of the root and
    /// follow one within it; `follow_symlinks` follows both.
    #[test]
    fn links_out_of_the_root_are_refused_both_ways() {
        let base = std::env::temp_dir().join(format!("weir-resolve-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(base.join("secret"), "secret").unwrap();
        std::fs::write(root.join("sub/page"), "page").unwrap();
        symlink(base.join("secret"), root.join("abs")).unwrap();
        symlink("../secret", root.join("rel")).unwrap();
        symlink("sub/page", root.join("inside")).unwrap();
        let r = Root::open(&root, false).unwrap();
        for name in ["abs", "rel"] {
            assert!(r.open_beneath(&c(name)).is_err(), "{name}");
            assert!(r.open_checked(&c(name)).is_err(), "{name}");
        }
        assert!(r.open_beneath(&c("inside")).is_ok());
        assert!(r.open_checked(&c("inside")).is_ok());
        let r = Root::open(&root, true).unwrap();
        assert!(r.open_beneath(&c("abs")).is_ok());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
