//! The files of automatic certificates: written whole (a temporary file renamed over the
//! old one, so a crash never leaves half a key), private ones with mode 0600, and the
//! storage directory's lock, so two Weir processes sharing it never order twice.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Writes `contents` to `path` through a temporary file; `private`: mode 0600.
pub fn write(path: &Path, contents: &[u8], private: bool) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        create_dir(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(&tmp)?;
    file.write_all(contents)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Creates `dir` (mode 0700: it holds keys) if it is missing.
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// The file name stem for a certificate of `names`: the first name, `*` spelled out.
pub fn stem(names: &[String]) -> String {
    names
        .first()
        .map_or_else(|| "cert".to_owned(), |n| n.replace('*', "_wildcard_"))
}

/// The certificate and key files of `names` under `storage`.
pub fn cert_files(storage: &Path, names: &[String]) -> (PathBuf, PathBuf) {
    let stem = stem(names);
    (
        storage.join(format!("{stem}.pem")),
        storage.join(format!("{stem}.key")),
    )
}

/// An exclusive lock on `storage/.lock`, held while it lives (`flock`: released by the
/// kernel when the process ends, however it ends).
#[derive(Debug)]
pub struct Lock(#[allow(dead_code)] File);

impl Lock {
    /// Takes the lock, or `Ok(None)` when another process holds it.
    pub fn try_take(storage: &Path) -> std::io::Result<Option<Lock>> {
        create_dir(storage)?;
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(storage.join(".lock"))?;
        use std::os::fd::AsFd;
        let taken = crate::sys::try_lock_exclusive(file.as_fd())?;
        Ok(taken.then_some(Lock(file)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_of_the_storage_lock_is_refused_until_the_first_lets_go() {
        let dir = std::env::temp_dir().join(format!("weir-lock-{}", std::process::id()));
        let first = Lock::try_take(&dir).unwrap();
        assert!(first.is_some());
        // flock locks belong to the open file: a second open conflicts even in-process,
        // as a second Weir process would.
        assert!(Lock::try_take(&dir).unwrap().is_none());
        drop(first);
        assert!(Lock::try_take(&dir).unwrap().is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn private_files_are_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("weir-store-{}", std::process::id()));
        let path = dir.join("k.key");
        write(&path, b"secret", true).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read(&path).unwrap(), b"secret");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
