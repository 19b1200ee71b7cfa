//! The config file API changes are written back to, written so that the operator's file
//! stays theirs:
//!
//! - **Hand edits are not overwritten.** A change is refused (409) when the file no longer
//!   holds the text Weir last read or wrote: an edit not reloaded yet would otherwise be
//!   replaced by the running text plus the API's change, and lost without a word.
//! - **Written before it runs.** The store writes the file, then applies the change, and
//!   writes the old text back if the apply fails: an API answer never says a change
//!   failed while it runs, or that it is saved while a restart would undo it.
//! - **Atomic where it can be**: a temporary file beside the file, synced, renamed over
//!   it, then the directory synced (without that, a crash can undo an acknowledged write).
//!   A file that cannot be renamed over (a single file bind-mounted into a container:
//!   `EBUSY`) is rewritten in place instead, and synced (not crash-atomic).
//! - **The same file, the same access**: a symlink is followed (the link's target gets the
//!   change, so config management that owns the target sees it; a dangling one is an
//!   error), and the new file keeps
//!   the old one's permission bits and, where Weir may set them (root), its owner and group:
//!   a `0600` file holding secrets does not become world-readable at the first `weir ctl`
//!   call.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hyper::StatusCode;

use crate::api::error::ApiError;

/// The config file as named (`path`, shown in errors) and as written (`target`: symlinks
/// resolved).
pub(crate) struct ConfigFile<'a> {
    path: &'a Path,
    target: PathBuf,
}

impl ConfigFile<'_> {
    pub(crate) fn at(path: &Path) -> Result<ConfigFile<'_>, ApiError> {
        let target = match fs::canonicalize(path) {
            Ok(target) => target,
            // A file that does not exist (removed meanwhile) is written where it was named;
            // a dangling symlink is not replaced by a file of its own.
            Err(e) if fs::symlink_metadata(path).is_ok_and(|m| m.is_symlink()) => {
                return Err(write_error(path, &e));
            }
            Err(_) => path.to_owned(),
        };
        Ok(ConfigFile { path, target })
    }

    /// What the file holds now, refused when that is neither `last` (the text Weir last
    /// read or wrote) nor `new` (`weir ctl apply -f` of the edited file itself): a change
    /// would overwrite an edit not reloaded yet. `None`: the file is gone (no edit to keep).
    pub(crate) fn holding(&self, last: &str, new: &str) -> Result<Option<Vec<u8>>, ApiError> {
        match weir_config::named_file::read(&self.target, weir_config::named_file::MAX_FILE_SIZE) {
            Ok(now) if now != last.as_bytes() && now != new.as_bytes() => Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "{} was edited since weir last read or wrote it: this change would \
                     overwrite that edit",
                    self.path.display()
                ),
                "apply the edit first (`systemctl reload weir`, SIGHUP, or `weir ctl apply -f \
                 FILE`; a reload takes a moment to run), or undo it; then repeat this change",
            )),
            Ok(now) => Ok(Some(now)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot read {}: {e}", self.target.display()),
                "make the config file readable by weir",
            )),
        }
    }

    /// Writes `text` over the file (see the module doc for how).
    pub(crate) fn write(&self, text: &[u8]) -> Result<(), ApiError> {
        let mut tmp = self.target.as_os_str().to_owned();
        tmp.push(".weir-tmp");
        let tmp = PathBuf::from(tmp);
        let old = fs::metadata(&self.target).ok();
        let renamed = stage(&tmp, text, old.as_ref()).and_then(|()| fs::rename(&tmp, &self.target));
        let written = match renamed {
            Ok(()) => {
                // The file is replaced: a directory weir may write but not read (so not
                // sync) does not make the change fail.
                if let Err(e) = sync_dir(&self.target) {
                    tracing::warn!(file = %self.target.display(), error = %e,
                        "config file written, its directory not synced");
                }
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::ResourceBusy => {
                let _ = fs::remove_file(&tmp);
                write_in_place(&self.target, text)
            }
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(e)
            }
        };
        written.map_err(|e| write_error(&self.target, &e))
    }
}

/// Writes `text` to a new `tmp` (readable by its owner only until it has `old`'s mode and
/// owner), synced.
fn stage(tmp: &Path, text: &[u8], old: Option<&fs::Metadata>) -> io::Result<()> {
    let _ = fs::remove_file(tmp); // A temporary file a crash left.
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)?;
    file.write_all(text)?;
    if let Some(old) = old {
        // Only root may give a file away: elsewhere the new file is the weir user's, in
        // the old one's group where weir is a member of it.
        if std::os::unix::fs::fchown(&file, Some(old.uid()), Some(old.gid())).is_err() {
            let _ = std::os::unix::fs::fchown(&file, None, Some(old.gid()));
        }
        file.set_permissions(fs::Permissions::from_mode(old.mode() & 0o7777))?;
    }
    file.sync_all()
}

/// Rewrites `path` itself: for a file that cannot be replaced (a mount point). Not
/// crash-atomic; the file is first made long enough for `text`, so a full disk fails the
/// write before any byte of the old text changes.
fn write_in_place(path: &Path, text: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let file = OpenOptions::new().write(true).open(path)?;
    let old_len = file.metadata()?.len();
    let len = text.len() as u64;
    if len > old_len {
        file.set_len(len)?;
    }
    file.write_all_at(text, 0)?;
    file.set_len(len)?;
    file.sync_all()
}

/// Syncs the directory holding `path`, so that the rename survives a crash.
fn sync_dir(path: &Path) -> io::Result<()> {
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => File::open(dir)?.sync_all(),
        None => File::open(".")?.sync_all(),
    }
}

fn write_error(path: &Path, e: &io::Error) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("cannot write {}: {e}", path.display()),
        "make the config file and its directory writable by weir",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("weir-config-file-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_write_keeps_the_mode_and_follows_a_symlink() {
        let dir = dir("mode");
        let real = dir.join("real.toml");
        fs::write(&real, "old").unwrap();
        fs::set_permissions(&real, fs::Permissions::from_mode(0o640)).unwrap();
        let link = dir.join("weir.toml");
        std::os::unix::fs::symlink(&real, &link).unwrap();

        ConfigFile::at(&link).unwrap().write(b"new").unwrap();

        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read_to_string(&real).unwrap(), "new");
        assert_eq!(fs::metadata(&real).unwrap().mode() & 0o777, 0o640);
        assert!(!dir.join("real.toml.weir-tmp").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_edit_not_reloaded_is_refused_and_a_missing_file_is_not() {
        let dir = dir("edit");
        let path = dir.join("weir.toml");
        fs::write(&path, "as loaded").unwrap();
        let file = ConfigFile::at(&path).unwrap();
        let held = file.holding("as loaded", "changed").unwrap();
        assert_eq!(held.as_deref(), Some(&b"as loaded"[..]));
        let edited = "as loaded\n# the operator's edit";
        fs::write(&path, edited).unwrap();
        let refused = file.holding("as loaded", "changed").unwrap_err();
        assert_eq!(refused.status, StatusCode::CONFLICT);
        // The edited file applied as it is (`weir ctl apply -f`) loses nothing.
        assert!(file.holding("as loaded", edited).is_ok());
        fs::remove_file(&path).unwrap();
        assert_eq!(file.holding("as loaded", "changed").unwrap(), None);
        std::os::unix::fs::symlink(dir.join("nowhere"), &path).unwrap();
        assert!(
            ConfigFile::at(&path).is_err(),
            "a dangling link is not replaced"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
