//! The files of automatic certificates: written whole (a temporary file renamed over the
//! old one, so a crash never leaves half a key; a certificate and its key as a pair with
//! the old pair kept as `.prev`), private ones with mode 0600, and the
//! storage directory's lock, so two Weir processes sharing it never order twice.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Writes `contents` to `path` through a temporary file; `private`: mode 0600.
pub fn write(path: &Path, contents: &[u8], private: bool) -> std::io::Result<()> {
    let tmp = write_temp(path, contents, private)?;
    commit(&tmp, path)?;
    sync_dir(path)
}

/// Writes a certificate and its key so a crash at any point leaves a matching pair on
/// disk: both temporary files first, the old pair kept as `.prev` (the loader's fallback
/// when the pair is found mismatched), then the key renamed in place, then the chain.
pub fn write_pair(cert: &Path, chain: &[u8], key: &Path, key_pem: &[u8]) -> std::io::Result<()> {
    let cert_tmp = write_temp(cert, chain, false)?;
    let key_tmp = match write_temp(key, key_pem, true) {
        Ok(tmp) => tmp,
        Err(e) => {
            let _ = std::fs::remove_file(&cert_tmp);
            return Err(e);
        }
    };
    if cert.exists() && key.exists() {
        // Hard links: the `.prev` pair is the old one whatever happens next.
        for path in [cert, key] {
            let prev = prev_path(path);
            let _ = std::fs::remove_file(&prev);
            std::fs::hard_link(path, &prev)?;
        }
    }
    commit(&key_tmp, key)?;
    commit(&cert_tmp, cert)?;
    sync_dir(cert)
}

/// The copy of `path` kept from before its last pair write.
pub fn prev_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".prev");
    PathBuf::from(name)
}

/// A new temporary file beside `path` (a random name, created exclusively, never through
/// a symlink), its mode set explicitly, holding `contents`, synced.
fn write_temp(path: &Path, contents: &[u8], private: bool) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        create_dir(dir)?;
    }
    let mut random = [0u8; 8];
    aws_lc_rs::rand::fill(&mut random).map_err(|_| std::io::Error::other("no randomness"))?;
    let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{suffix}.tmp"));
    let tmp = PathBuf::from(name);
    let mode = if private { 0o600 } else { 0o644 };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(mode)
        .open(&tmp)?;
    let written = file
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .and_then(|()| file.write_all(contents))
        .and_then(|()| file.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(tmp)
}

fn commit(tmp: &Path, path: &Path) -> std::io::Result<()> {
    std::fs::rename(tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(tmp);
    })
}

/// Syncs the directory of `path`, so the renames in it survive a crash.
fn sync_dir(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Whether `dir` could be used without writing anything now: it is a writable directory,
/// or it is missing and the nearest existing directory above it is writable.
pub fn check_writable(dir: &Path) -> std::io::Result<()> {
    let mut at = dir;
    while !at.exists() {
        match at.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => at = parent,
            _ => {
                at = Path::new(".");
                break;
            }
        }
    }
    if !at.is_dir() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory",
            at.display()
        )));
    }
    crate::sys::check_writable(at)
        .map_err(|e| std::io::Error::other(format!("{} is not writable: {e}", at.display())))
}

/// Creates `dir` (mode 0700: it holds keys) if it is missing.
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// The file name stem for a certificate of `names` from `source` (`acme`, `internal`):
/// the source, a short digest of the sorted name set and the source, and the first name
/// (`*` spelled out) for people reading the directory. Two name sets with the same first
/// name, or ACME and the internal CA sharing a directory, never share files.
pub fn stem(names: &[String], source: &str) -> String {
    let mut sorted: Vec<&str> = names.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let digest =
        crate::tls::facts::sha256_hex(format!("{source}\n{}", sorted.join("\n")).as_bytes());
    let first = names
        .first()
        .map_or_else(|| "cert".to_owned(), |n| n.replace('*', "_wildcard_"));
    format!("{source}-{}-{first}", &digest[..12])
}

/// The certificate and key files of `names` from `source` under `storage`.
pub fn cert_files(storage: &Path, names: &[String], source: &str) -> (PathBuf, PathBuf) {
    let stem = stem(names, source);
    (
        storage.join(format!("{stem}.pem")),
        storage.join(format!("{stem}.key")),
    )
}

/// Other stored certificate and key files of `source` under `storage` (a name set before
/// a reload changed it), then the pre-digest name (`{first name}.pem`, read once after an
/// upgrade): candidates to serve while a certificate for the whole set is obtained.
pub fn other_cert_files(storage: &Path, names: &[String], source: &str) -> Vec<(PathBuf, PathBuf)> {
    let own = cert_files(storage, names, source).0;
    let prefix = format!("{source}-");
    let mut found: Vec<(PathBuf, PathBuf)> = std::fs::read_dir(storage)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let name = path.file_name()?.to_str()?;
            (name.starts_with(&prefix) && name.ends_with(".pem") && path != own)
                .then(|| (path.clone(), path.with_extension("key")))
        })
        .collect();
    found.sort();
    if let Some(first) = names.first() {
        let legacy = first.replace('*', "_wildcard_");
        found.push((
            storage.join(format!("{legacy}.pem")),
            storage.join(format!("{legacy}.key")),
        ));
    }
    found
}

/// An exclusive lock on `storage/.lock`, held while it lives (`flock`: released by the
/// kernel when the process ends, however it ends).
#[derive(Debug)]
pub struct Lock(#[allow(dead_code)] File);

impl Lock {
    /// Takes the lock, or `Ok(None)` when another process holds it.
    pub fn try_take(storage: &Path) -> std::io::Result<Option<Lock>> {
        let file = lock_file(&storage.join(".lock"))?;
        use std::os::fd::AsFd;
        let taken = crate::sys::try_lock_exclusive(file.as_fd())?;
        Ok(taken.then_some(Lock(file)))
    }

    /// Waits for the internal CA's lock (`storage/.ca.lock`: apart from the ACME one,
    /// which an order holds for minutes). Making the CA and issuing take milliseconds.
    pub fn take_ca(storage: &Path) -> std::io::Result<Lock> {
        let file = lock_file(&storage.join(".ca.lock"))?;
        use std::os::fd::AsFd;
        crate::sys::lock_exclusive(file.as_fd())?;
        Ok(Lock(file))
    }
}

fn lock_file(path: &Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent() {
        create_dir(dir)?;
    }
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o600)
        .open(path)
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

    #[test]
    fn a_stale_world_readable_temp_file_never_makes_a_key_public() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("weir-stale-{}", std::process::id()));
        create_dir(&dir).unwrap();
        let path = dir.join("k.key");
        // What the old fixed temp names would have reused: left by a crash, or planted.
        for stale in ["k.tmp", "k.key.tmp"] {
            std::fs::write(dir.join(stale), b"old").unwrap();
            std::fs::set_permissions(dir.join(stale), std::fs::Permissions::from_mode(0o644))
                .unwrap();
        }
        write(&path, b"secret", true).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read(&path).unwrap(), b"secret");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_pair_write_keeps_the_old_pair_as_prev() {
        let dir = std::env::temp_dir().join(format!("weir-pair-{}", std::process::id()));
        let (cert, key) = (dir.join("c.pem"), dir.join("c.key"));
        write_pair(&cert, b"cert1", &key, b"key1").unwrap();
        write_pair(&cert, b"cert2", &key, b"key2").unwrap();
        assert_eq!(std::fs::read(&cert).unwrap(), b"cert2");
        assert_eq!(std::fs::read(&key).unwrap(), b"key2");
        assert_eq!(std::fs::read(prev_path(&cert)).unwrap(), b"cert1");
        assert_eq!(std::fs::read(prev_path(&key)).unwrap(), b"key1");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "no temporary file left");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
