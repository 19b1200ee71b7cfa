//! Reading the files a config names: certificates, keys, CA bundles, token, password and
//! key files, users files, snapshots, and the config file itself.
//!
//! Every such read goes through [`read`] (or [`read_to_string`]), which refuses what is not
//! a regular file and reads at most a limit. Without it, a path naming `/dev/zero` reads
//! until memory runs out, and a FIFO (or a socket) blocks the reload, `weir check` or the
//! admin API's token check forever, with the config store's lock held. The open itself
//! does not block: it is done with `O_NONBLOCK`, which a FIFO without a writer would
//! otherwise wait on, and which regular files ignore.
//!
//! A file on a mount that hangs (an NFS server gone) still blocks: no flag helps there.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The size limit of a named file (certificate chains, CA bundles, the config file, ...):
/// 16 MiB, far above any real one (a CA bundle of every public root is about 250 KiB).
pub const MAX_FILE_SIZE: u64 = 16 << 20;

/// The size limit of a file holding a secret (a token, a password, a key): 64 KiB.
pub const MAX_SECRET_SIZE: u64 = 64 << 10;

/// The bytes of `path`, a regular file of at most `limit` bytes; otherwise an error whose
/// message says why ("it is not a regular file (a FIFO)", "it is larger than 16 MiB, ...").
/// Symbolic links are followed.
pub fn read(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    // A stat first, so that a device is refused without being opened (opening some has
    // side effects); the fstat after the open covers a file replaced in between.
    regular(&std::fs::metadata(path)?)?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    regular(&meta)?;
    if meta.len() > limit {
        return Err(too_large(limit));
    }
    read_at_most(file, meta.len(), limit)
}

/// Like [`read`], the bytes checked to be UTF-8 (`InvalidData` when they are not).
pub fn read_to_string(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read(path, limit)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

/// Reads `file` (whose size was `len`) to its end, refused past `limit` bytes: a file that
/// grows while it is read is not followed further.
fn read_at_most(file: File, len: u64, limit: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(limit));
    }
    Ok(bytes)
}

/// The fix for an error of [`read`]'s own (not a regular file, too large); `None` for an
/// error of the system's (not found, permission denied, ...), whose fix the caller knows.
pub fn fix_for(err: &io::Error) -> Option<&'static str> {
    match err.kind() {
        io::ErrorKind::InvalidInput => {
            Some("name a regular file (not a FIFO, socket, device or directory)")
        }
        io::ErrorKind::FileTooLarge => {
            Some("check that the path names the right file: larger ones are refused")
        }
        _ => None,
    }
}

/// `Ok` for a regular file; else an error naming what the path is.
fn regular(meta: &Metadata) -> io::Result<()> {
    let kind = meta.file_type();
    if kind.is_file() {
        return Ok(());
    }
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "of another kind"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("it is not a regular file ({what})"),
    ))
}

fn too_large(limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!(
            "it is larger than {}, the limit for this file",
            human_size(limit)
        ),
    )
}

/// `16 MiB`, `64 KiB`, or bytes.
fn human_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("weir-named-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_regular_file_within_the_limit_is_read() {
        let dir = temp("ok");
        let path = dir.join("f");
        std::fs::write(&path, "hello").unwrap();
        assert_eq!(read(&path, 5).unwrap(), b"hello");
        assert_eq!(read_to_string(&path, MAX_FILE_SIZE).unwrap(), "hello");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_file_over_the_limit_is_refused_with_the_limit() {
        let dir = temp("big");
        let path = dir.join("f");
        std::fs::write(&path, vec![b'a'; 64 << 10 | 1]).unwrap();
        let err = read(&path, MAX_SECRET_SIZE).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
        assert!(err.to_string().contains("larger than 64 KiB"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Was: `/dev/zero` read until memory ran out.
    #[test]
    fn a_device_is_refused_without_reading() {
        let err = read(Path::new("/dev/zero"), MAX_FILE_SIZE).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            err.to_string(),
            "it is not a regular file (a character device)"
        );
    }

    /// Was: the read blocked until a writer came, forever.
    #[test]
    fn a_fifo_is_refused_at_once() {
        let dir = temp("fifo");
        let path = dir.join("pipe");
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success());
        let err = read(&path, MAX_FILE_SIZE).unwrap_err();
        assert_eq!(err.to_string(), "it is not a regular file (a FIFO)");
        let err = read_to_string(&dir, MAX_FILE_SIZE).unwrap_err();
        assert_eq!(err.to_string(), "it is not a regular file (a directory)");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn text_that_is_not_utf8_is_invalid_data() {
        let dir = temp("utf8");
        let path = dir.join("f");
        std::fs::write(&path, b"\xff\xfe").unwrap();
        let err = read_to_string(&path, MAX_FILE_SIZE).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
