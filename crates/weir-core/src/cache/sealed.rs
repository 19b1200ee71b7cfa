//! A memory store's large bodies in sealed memfds ([`super::Store::put`]), so that hits
//! send them with sendfile(2). Each holds a file descriptor while its entry, or a hit
//! sending it, lives: at most a quarter of the process's open-file limit (and at most
//! 16,384, well under the kernel's default bound of 65,530 mappings) are held at once, so
//! that connections keep their descriptors; past that a body stays on the heap.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

/// The sealed memfds held by the process.
static HELD: AtomicU64 = AtomicU64::new(0);

/// The kernel refused a sealed memfd for good (no `memfd_create`, sealing or mapping):
/// not tried again.
static UNAVAILABLE: AtomicBool = AtomicBool::new(false);

/// The most sealed memfds held at once when the open-file limit cannot be read.
const BOUND_UNKNOWN: u64 = 256;
/// The most sealed memfds held at once whatever the open-file limit (one mapping each).
const BOUND_MAX: u64 = 16_384;

/// A sealed memfd holding a body (counted in [`HELD`] while it is open).
pub struct Memfd {
    pub file: File,
}

impl Drop for Memfd {
    fn drop(&mut self) {
        HELD.fetch_sub(1, Relaxed);
    }
}

/// How many sealed memfds may be held at once.
fn bound() -> u64 {
    static BOUND: OnceLock<u64> = OnceLock::new();
    *BOUND.get_or_init(|| {
        let share = crate::sys::descriptor_share();
        share.unwrap_or(BOUND_UNKNOWN).min(BOUND_MAX)
    })
}

/// Whether [`seal`] may succeed now: the kernel gives sealed memfds and fewer than the
/// bound are held (a hint: another thread may take the last place meanwhile).
pub fn may_seal() -> bool {
    !UNAVAILABLE.load(Relaxed) && HELD.load(Relaxed) < bound()
}

/// `bytes` in a new sealed memfd, and its bytes mapped from it; fails past the bound,
/// or when the kernel refuses (out of descriptors, memory or mappings).
pub fn seal(bytes: &[u8]) -> io::Result<(Arc<Memfd>, Bytes)> {
    if UNAVAILABLE.load(Relaxed) {
        return Err(io::ErrorKind::Unsupported.into());
    }
    if HELD.fetch_add(1, Relaxed) >= bound() {
        HELD.fetch_sub(1, Relaxed);
        return Err(io::Error::other("as many sealed bodies held as allowed"));
    }
    match crate::sys::sealed_memfd(bytes) {
        Ok((file, mapped)) => Ok((Arc::new(Memfd { file }), mapped)),
        Err(e) => {
            HELD.fetch_sub(1, Relaxed);
            let refused = matches!(
                e.raw_os_error(),
                Some(libc::EPERM | libc::ENOSYS | libc::EINVAL)
            );
            if refused && !UNAVAILABLE.swap(true, Relaxed) {
                tracing::warn!(error = %e, "cache: this kernel gives no sealed memfd: memory-store hits are written from memory, without sendfile(2)");
            }
            Err(e)
        }
    }
}
