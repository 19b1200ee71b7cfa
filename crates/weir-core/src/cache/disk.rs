//! A disk store's files (`kind = "disk"`): one file per entry (key and `Vary` variant),
//! named by a hash of both, under a directory of 256 subdirectories (`ab/ab12...`).
//!
//! **Never torn.** An entry is written whole to a temporary file beside its final name and
//! renamed into place, so a reader (or a restart after `kill -9`) finds the old file or the
//! new one, never half of one. A stale entry refreshed by a `304` is a new write too, its
//! body copied from the old file by the kernel ([`Disk::write_copy`]), not through
//! memory. A file carries its own key and variant, its head, and the lengths and CRC-32s
//! of both parts; a file that is short, long, foreign, or whose sums do
//! not match is discarded (removed) and never served: the scan at start checks the head
//! part, every read of a body checks the body's sum. No fsync: a crash of the machine may
//! lose recent entries (the sums then discard them), a cache can afford that, and an fsync
//! per stored response would cost a disk flush each.
//!
//! **One write's head, that write's body.** Each write draws a random id, kept in its file
//! and in the index's [`Location`]: a read finding another id (the file was replaced since
//! it was indexed: two writes of one entry, or another process) is [`Unreadable::Stale`],
//! a miss, and the file is left to its writer. A file is only removed by the holder of its
//! [`Location`] while it still holds that id, checked under a lock of its name that each
//! write's rename also takes, so a newer file renamed into place is never removed for an
//! older entry.
//!
//! Layout (little-endian): `MAGIC`, key length (u32), variant length (u32), policy length
//! (u32), head length (u32), body length (u64), body CRC (u32), write id (u64), head CRC
//! (u32, over the 44 bytes before it and the four parts after it); then the key, the
//! variant, the `CachePolicy` as JSON, the status and fields; then the body.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use http_cache_semantics::CachePolicy;

const MAGIC: [u8; 8] = *b"WEIRCE\x00\x02";
/// Where the head CRC is: it covers the bytes before it.
const HEAD_CRC_AT: usize = 44;
/// The fixed part before the key.
const FIXED: usize = 48;
/// How many locks the names are spread over (by their first byte).
const NAME_LOCKS: usize = 16;
/// Most bytes of key, variant, policy and head a file may have (its head part is read
/// whole by the scan).
const MAX_META: usize = 1 << 20;
/// Most bytes of a body [`Disk::check`] holds at once.
const CHECK_PIECE: usize = 256 << 10;
/// The first read of a file at the scan: its head part, usually all of it.
const FIRST_READ: usize = 16 << 10;
/// A temporary file older than this is a crashed write's, even if its writer's pid is
/// alive again (another process), or when whether it is alive cannot be known (`/proc`
/// not mounted).
const TEMP_MAX_AGE: Duration = Duration::from_secs(3600);

/// Where an entry's body is: its file (by name), which write of it (its id), and where
/// the body starts in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    name: [u8; 16],
    id: u64,
    /// The file's whole length.
    pub file_len: u64,
    body_at: u64,
}

impl Location {
    pub fn body_len(&self) -> u64 {
        self.file_len - self.body_at
    }

    /// Where the body starts in the file.
    pub fn body_at(&self) -> u64 {
        self.body_at
    }
}

/// An entry found by the scan: what its index entry is made of.
pub struct Found {
    pub key: Vec<u8>,
    pub variant: Vec<u8>,
    pub policy: CachePolicy,
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub location: Location,
}

/// How many discarded (and how many unreadable) files a scan names in the log, one warning
/// each; the store's summary after the scan counts them all. A directory of entries an older
/// version wrote (or a disk gone bad) would otherwise log one line per file, millions of them.
const NAMED_IN_LOG: u64 = 10;

/// What the scan did.
#[derive(Debug, Default)]
pub struct Scanned {
    pub found: u64,
    /// Files that were not whole entries (torn, truncated, foreign): removed.
    pub discarded: u64,
    /// Files that could not be read (an I/O error, not their content): left alone.
    pub unreadable: u64,
    /// Temporary files of writes that never finished: removed.
    pub abandoned: u64,
}

/// Why a body could not be read.
#[derive(Debug)]
pub enum Unreadable {
    /// The file is not (or no longer) the indexed write's: replaced by a newer write, or
    /// removed. The index entry is stale; the file, if any, is someone else's.
    Stale,
    /// The indexed write's file is not whole (cut short, a sum that does not match).
    Broken(io::Error),
    /// Reading failed, not the file (too many open files, EIO, EACCES): try again later.
    Io(io::Error),
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unreadable::Stale => f.write_str("the file was replaced or removed"),
            Unreadable::Broken(e) | Unreadable::Io(e) => e.fmt(f),
        }
    }
}

/// Whether `e` says a file's content is not an entry (rather than that it could not be
/// read): only such files are removed.
fn is_format(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
    )
}

/// What a failed read of an entry's file says: the file is not whole (cut short, not an
/// entry), or reading failed.
fn read_failure(e: io::Error) -> Unreadable {
    match is_format(&e) {
        true => Unreadable::Broken(e),
        false => Unreadable::Io(e),
    }
}

/// A store's directory.
pub struct Disk {
    dir: PathBuf,
    /// Makes temporary names unique within the process.
    seq: AtomicU64,
    /// Held around a rename into a name and around the check-and-remove of a name's file,
    /// so that no file is removed for a write it is not.
    names: [Mutex<()>; NAME_LOCKS],
}

impl Disk {
    pub fn new(dir: PathBuf) -> Disk {
        Disk {
            dir,
            seq: AtomicU64::new(0),
            names: std::array::from_fn(|_| Mutex::new(())),
        }
    }

    /// The lock of `name` (see `names`).
    fn lock(&self, name: &[u8; 16]) -> MutexGuard<'_, ()> {
        let lock = &self.names[usize::from(name[0]) % NAME_LOCKS];
        lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path_of(&self, name: &[u8; 16]) -> PathBuf {
        let hex = hex(name);
        self.dir.join(&hex[..2]).join(hex)
    }

    /// Writes the entry (`key`, its `variant`, `policy`, `status`, `headers`, `body`) to a
    /// temporary file, for [`Disk::place`].
    pub fn write(&self, key: &[u8], meta: Meta<'_>, body: &[u8]) -> io::Result<Written> {
        let (mut file, written) = self.create(key, &meta, body.len() as u64, crc(&[body]))?;
        file.write_all(body)?;
        Ok(written)
    }

    /// [`Disk::write`] of a body that is in the open file `from` (another write's: a stale
    /// entry whose head a `304` refreshed), `len` bytes from `at`. Copied file to file by
    /// the kernel (`io::copy` between files is copy_file_range(2)), never read into memory,
    /// whatever its length; the new file carries the sum `from`'s fixed part holds: that
    /// body's, checked against it in this process before it was handed out
    /// ([`super::store::Entry::checked`]). `from`'s offset is moved: its other readers
    /// (the reply sending it) read at explicit offsets only.
    pub fn write_copy(
        &self,
        key: &[u8],
        meta: Meta<'_>,
        from: &File,
        at: u64,
        len: u64,
    ) -> io::Result<Written> {
        use std::io::Seek;
        use std::os::unix::fs::FileExt;
        let mut buf = [0; FIXED];
        from.read_exact_at(&mut buf, 0)?;
        let fixed = Fixed::parse(&buf)?;
        if fixed.body_at() != at || fixed.body_len != len {
            return Err(invalid("the body is not where its file's head says"));
        }
        let (mut file, written) = self.create(key, &meta, len, fixed.body_crc)?;
        let mut source = from;
        source.seek(io::SeekFrom::Start(at))?;
        let copied = io::copy(&mut source.take(len), &mut file)?;
        if copied != len {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(written)
    }

    /// A new temporary file for the entry (`key`, `meta`) whose body is `body_len` bytes
    /// summing to `body_crc`, its head part written: the body goes after it.
    fn create(
        &self,
        key: &[u8],
        meta: &Meta<'_>,
        body_len: u64,
        body_crc: u32,
    ) -> io::Result<(File, Written)> {
        let name = name(key, meta.variant);
        let path = self.path_of(&name);
        let id = write_id()?;
        let head = encode_head(key, meta, id, body_len, body_crc)?;
        let seq = self.seq.fetch_add(1, Relaxed);
        let temp = path.with_extension(format!("{}.{seq}.tmp", std::process::id()));
        let mut file = match File::create_new(&temp) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(temp.parent().unwrap_or(&self.dir))?;
                File::create_new(&temp)?
            }
            other => other?,
        };
        // Made before any byte is written: dropped on a failure, it removes the file.
        let written = Written {
            temp: Some(temp),
            path,
            at: Location {
                name,
                id,
                file_len: head.len() as u64 + body_len,
                body_at: head.len() as u64,
            },
        };
        file.write_all(&head)?;
        Ok((file, written))
    }

    /// Renames a written entry into place; `then` runs before anyone may remove the new
    /// file (the lock of its name held): index it there, so that the index sees a name's
    /// writes in the order the files do.
    pub fn place<T>(
        &self,
        mut written: Written,
        then: impl FnOnce(Location) -> T,
    ) -> io::Result<T> {
        let temp = written.temp.take().unwrap_or_default();
        let _name = self.lock(&written.at.name);
        match fs::rename(&temp, &written.path) {
            Ok(()) => Ok(then(written.at)),
            Err(e) => {
                let _ = fs::remove_file(&temp);
                Err(e)
            }
        }
    }

    /// The body of the entry at `at` stored under `key`: read in one go, checked against
    /// the file's write id, lengths, key and body sum.
    pub fn read(&self, at: &Location, key: &[u8]) -> Result<Bytes, Unreadable> {
        let mut buf = vec![0; at.file_len as usize];
        let read = File::open(self.path_of(&at.name)).and_then(|mut f| f.read_exact(&mut buf));
        match read {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Unreadable::Stale),
            // Shorter than the indexed write: cut short, or another write's.
            Err(e) if is_format(&e) => return Err(Unreadable::Broken(e)),
            Err(e) => return Err(Unreadable::Io(e)),
            Ok(()) => {}
        }
        let fixed = Fixed::parse(&buf).map_err(Unreadable::Broken)?;
        if fixed.id != at.id {
            return Err(Unreadable::Stale);
        }
        let key_at = FIXED..FIXED + fixed.key_len;
        if fixed.file_len() != at.file_len
            || fixed.body_at() != at.body_at
            || buf.get(key_at) != Some(key)
        {
            return Err(Unreadable::Broken(invalid("the file holds another entry")));
        }
        let body = Bytes::from(buf).slice(at.body_at as usize..);
        if crc(&[&body]) != fixed.body_crc {
            return Err(Unreadable::Broken(invalid("the body's sum does not match")));
        }
        Ok(body)
    }

    /// The file of the entry at `at`, open, once its fixed part and length show it is that
    /// write's (its body's sum is not read: [`super::store::Entry::checked`]). The open
    /// file stays that write's bytes whatever happens to its name (replaced by a rename,
    /// removed by an eviction or a purge).
    pub fn open(&self, at: &Location) -> Result<File, Unreadable> {
        self.open_fixed(at).map(|(file, _)| file)
    }

    /// [`Disk::open`], with the file's fixed part.
    fn open_fixed(&self, at: &Location) -> Result<(File, Fixed), Unreadable> {
        use std::os::unix::fs::FileExt;
        let file = match File::open(self.path_of(&at.name)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Unreadable::Stale),
            Err(e) => return Err(Unreadable::Io(e)),
            Ok(file) => file,
        };
        let mut buf = [0; FIXED];
        let fixed = file
            .read_exact_at(&mut buf, 0)
            .and_then(|()| Fixed::parse(&buf));
        let fixed = fixed.map_err(read_failure)?;
        if fixed.id != at.id {
            return Err(Unreadable::Stale);
        }
        let len = file.metadata().map_err(Unreadable::Io)?.len();
        if len != at.file_len || fixed.file_len() != at.file_len || fixed.body_at() != at.body_at {
            return Err(Unreadable::Broken(invalid(
                "the file is not its write's length",
            )));
        }
        Ok((file, fixed))
    }

    /// Checks the file of the entry at `at` stored under `key` as [`Disk::read`] does
    /// (write id, lengths, key, body sum), reading it in pieces of at most
    /// [`CHECK_PIECE`]: what a body of any length costs in memory.
    pub fn check(&self, at: &Location, key: &[u8]) -> Result<(), Unreadable> {
        use std::os::unix::fs::FileExt;
        let (file, fixed) = self.open_fixed(at)?;
        let mut stored_key = vec![0; fixed.key_len];
        file.read_exact_at(&mut stored_key, FIXED as u64)
            .map_err(read_failure)?;
        if stored_key != key {
            return Err(Unreadable::Broken(invalid("the file holds another entry")));
        }
        let mut buf = vec![0; CHECK_PIECE.min(at.body_len() as usize)];
        let mut sum = flate2::Crc::new();
        let mut from = at.body_at;
        while from < at.file_len {
            let n = buf.len().min((at.file_len - from) as usize);
            file.read_exact_at(&mut buf[..n], from)
                .map_err(read_failure)?;
            sum.update(&buf[..n]);
            from += n as u64;
        }
        if sum.sum() != fixed.body_crc {
            return Err(Unreadable::Broken(invalid("the body's sum does not match")));
        }
        Ok(())
    }

    /// Removes the file of the entry at `at` if it still holds that write (gone already,
    /// or replaced by another write: left alone).
    pub fn remove(&self, at: &Location) {
        let path = self.path_of(&at.name);
        let _name = self.lock(&at.name);
        let mut buf = [0; FIXED];
        let read = File::open(&path).and_then(|mut f| f.read_exact(&mut buf));
        if read.is_ok() && Fixed::parse(&buf).is_ok_and(|f| f.id == at.id) {
            let _ = fs::remove_file(&path);
        }
    }

    /// Reads every entry's head part (not its body: the time is bounded by the number of
    /// files, not their size), giving each whole one to `found`; removes files that are
    /// not whole entries and temporary files whose write never finished.
    pub fn scan(&self, mut found: impl FnMut(Found)) -> Scanned {
        let mut out = Scanned::default();
        let Ok(subdirs) = fs::read_dir(&self.dir) else {
            return out;
        };
        for sub in subdirs.flatten() {
            let sub_name = sub.file_name();
            let ours = sub_name.len() == 2 && sub_name.to_str().is_some_and(is_hex);
            let Some(files) = ours.then(|| fs::read_dir(sub.path()).ok()).flatten() else {
                continue;
            };
            for file in files.flatten() {
                self.scan_file(&file.path(), &mut out, &mut found);
            }
        }
        out
    }

    fn scan_file(&self, path: &Path, out: &mut Scanned, found: &mut impl FnMut(Found)) {
        let Some(file_name) = path.file_name().and_then(|n| n.to_str()) else {
            return;
        };
        if file_name.ends_with(".tmp") {
            if abandoned(path, file_name) {
                let _ = fs::remove_file(path);
                out.abandoned += 1;
            }
            return;
        }
        let Some(name) = parse_name(file_name) else {
            return; // Not a file of the store's: left alone.
        };
        match load(path, name) {
            Ok(entry) => {
                out.found += 1;
                found(entry);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {} // Removed meanwhile.
            Err(e) if is_format(&e) => {
                if out.discarded < NAMED_IN_LOG {
                    tracing::warn!(file = %path.display(), error = %e, "cache file discarded");
                }
                self.remove_broken(path, name);
                out.discarded += 1;
            }
            Err(e) => {
                if out.unreadable < NAMED_IN_LOG {
                    tracing::warn!(file = %path.display(), error = %e, "cache file unreadable: left");
                }
                out.unreadable += 1;
            }
        }
    }

    /// Removes the file at `path` (named `name`) the scan found not whole, unless a write
    /// replaced it meanwhile (the store answers while it scans): checked again under the
    /// name's lock.
    fn remove_broken(&self, path: &Path, name: [u8; 16]) {
        let _name = self.lock(&name);
        if load(path, name).is_err_and(|e| is_format(&e)) {
            let _ = fs::remove_file(path);
        }
    }
}

/// An entry written to its temporary file, not yet in place (removed if dropped so).
pub struct Written {
    temp: Option<PathBuf>,
    path: PathBuf,
    at: Location,
}

impl Drop for Written {
    fn drop(&mut self) {
        if let Some(temp) = &self.temp {
            let _ = fs::remove_file(temp);
        }
    }
}

/// What an entry's head part holds besides its key.
pub struct Meta<'a> {
    pub variant: &'a [u8],
    pub policy: &'a CachePolicy,
    pub status: StatusCode,
    pub headers: &'a HeaderMap,
}

/// The fixed part of a file.
struct Fixed {
    key_len: usize,
    variant_len: usize,
    policy_len: usize,
    head_len: usize,
    body_len: u64,
    body_crc: u32,
    id: u64,
    head_crc: u32,
}

impl Fixed {
    fn parse(buf: &[u8]) -> io::Result<Fixed> {
        if buf.len() < FIXED || buf[..8] != MAGIC {
            return Err(invalid("not a cache entry"));
        }
        let u32_at = |at: usize| u32::from_le_bytes(buf[at..at + 4].try_into().unwrap_or_default());
        let fixed = Fixed {
            key_len: u32_at(8) as usize,
            variant_len: u32_at(12) as usize,
            policy_len: u32_at(16) as usize,
            head_len: u32_at(20) as usize,
            body_len: u64::from_le_bytes(buf[24..32].try_into().unwrap_or_default()),
            body_crc: u32_at(32),
            id: u64::from_le_bytes(buf[36..44].try_into().unwrap_or_default()),
            head_crc: u32_at(HEAD_CRC_AT),
        };
        if fixed.meta_len() > MAX_META {
            return Err(invalid("the head part is too long"));
        }
        Ok(fixed)
    }

    fn meta_len(&self) -> usize {
        self.key_len
            .saturating_add(self.variant_len)
            .saturating_add(self.policy_len)
            .saturating_add(self.head_len)
    }

    fn body_at(&self) -> u64 {
        (FIXED + self.meta_len()) as u64
    }

    fn file_len(&self) -> u64 {
        self.body_at().saturating_add(self.body_len)
    }
}

/// The fixed part and the head part of an entry whose body is `body_len` bytes summing to
/// `body_crc`.
fn encode_head(
    key: &[u8],
    meta: &Meta<'_>,
    id: u64,
    body_len: u64,
    body_crc: u32,
) -> io::Result<Vec<u8>> {
    let policy = serde_json::to_vec(meta.policy).map_err(io::Error::other)?;
    let mut head = Vec::new();
    head.extend_from_slice(&meta.status.as_u16().to_le_bytes());
    for (name, value) in meta.headers {
        head.extend_from_slice(&(name.as_str().len() as u32).to_le_bytes());
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(&(value.len() as u32).to_le_bytes());
        head.extend_from_slice(value.as_bytes());
    }
    let parts = [key, meta.variant, &policy, &head];
    let meta_len: usize = parts.iter().map(|p| p.len()).sum();
    if meta_len > MAX_META {
        return Err(invalid("the head part is too long"));
    }
    let mut out = Vec::with_capacity(FIXED + meta_len);
    out.extend_from_slice(&MAGIC);
    for part in parts {
        out.extend_from_slice(&(part.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(&body_len.to_le_bytes());
    out.extend_from_slice(&body_crc.to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    for part in parts {
        out.extend_from_slice(part);
    }
    let head_crc = head_crc(&out[..HEAD_CRC_AT], &out[HEAD_CRC_AT..]);
    out.splice(HEAD_CRC_AT..HEAD_CRC_AT, head_crc.to_le_bytes());
    Ok(out)
}

/// A write's id: random, so that writes of one entry by any process differ.
fn write_id() -> io::Result<u64> {
    let mut id = [0; 8];
    aws_lc_rs::rand::fill(&mut id).map_err(|_| io::Error::other("no random write id"))?;
    Ok(u64::from_le_bytes(id))
}

fn head_crc(fixed: &[u8], meta: &[u8]) -> u32 {
    crc(&[fixed, meta])
}

/// The CRC-32 of `parts` one after the other (zlib-rs's, through flate2: SIMD where the
/// CPU has it).
fn crc(parts: &[&[u8]]) -> u32 {
    let mut sum = flate2::Crc::new();
    for part in parts {
        sum.update(part);
    }
    sum.sum()
}

/// The entry in the file at `path` (named `name`): its head part read and checked (sum,
/// lengths against the file's, the name against its key and variant).
fn load(path: &Path, name: [u8; 16]) -> io::Result<Found> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut buf = vec![0; FIRST_READ.min(len as usize)];
    file.read_exact(&mut buf)?;
    let fixed = Fixed::parse(&buf)?;
    if fixed.file_len() != len {
        return Err(invalid("the file's length is not the entry's"));
    }
    let body_at = fixed.body_at() as usize;
    if buf.len() < body_at {
        let have = buf.len();
        buf.resize(body_at, 0);
        file.read_exact(&mut buf[have..])?;
    }
    if head_crc(&buf[..HEAD_CRC_AT], &buf[FIXED..body_at]) != fixed.head_crc {
        return Err(invalid("the head part's sum does not match"));
    }
    let mut meta = Cursor(&buf[FIXED..body_at]);
    let key = meta.take(fixed.key_len)?.to_vec();
    let variant = meta.take(fixed.variant_len)?.to_vec();
    let policy = meta.take(fixed.policy_len)?;
    let policy = serde_json::from_slice(policy).map_err(|_| invalid("a bad policy"))?;
    let (status, headers) = decode_head(Cursor(meta.take(fixed.head_len)?))?;
    if !super::directives::is_normal(&headers) {
        // Stored before its directives were lowered and its `Age` capped: its policy
        // would read `Private` as nothing, or overflow on a huge `Age`.
        return Err(invalid(
            "a head stored before its cache directives were normalised",
        ));
    }
    if self::name(&key, &variant) != name {
        return Err(invalid("the file is named for another entry"));
    }
    Ok(Found {
        key,
        variant,
        policy,
        status,
        headers,
        location: Location {
            name,
            id: fixed.id,
            file_len: len,
            body_at: body_at as u64,
        },
    })
}

/// The status and fields of a head part.
fn decode_head(mut head: Cursor<'_>) -> io::Result<(StatusCode, HeaderMap)> {
    let status = u16::from_le_bytes(head.take(2)?.try_into().unwrap_or_default());
    let status = StatusCode::from_u16(status).map_err(|_| invalid("a bad status"))?;
    let mut headers = HeaderMap::new();
    while !head.0.is_empty() {
        let n = head.u32()?;
        let name = HeaderName::from_bytes(head.take(n)?).map_err(|_| invalid("a bad name"))?;
        let n = head.u32()?;
        let value = HeaderValue::from_bytes(head.take(n)?).map_err(|_| invalid("a bad field"))?;
        headers.append(name, value);
    }
    Ok((status, headers))
}

/// The unread rest of a head part.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        let (part, rest) = self.0.split_at_checked(n).ok_or(invalid("a short head"))?;
        self.0 = rest;
        Ok(part)
    }

    fn u32(&mut self) -> io::Result<usize> {
        let bytes = self.take(4)?.try_into().unwrap_or_default();
        Ok(u32::from_le_bytes(bytes) as usize)
    }
}

/// The file name of a key's variant: 128 bits of its SHA-256.
fn name(key: &[u8], variant: &[u8]) -> [u8; 16] {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    ctx.update(&(key.len() as u64).to_le_bytes());
    ctx.update(key);
    ctx.update(variant);
    let digest = ctx.finish();
    let mut out = [0; 16];
    out.copy_from_slice(&digest.as_ref()[..16]);
    out
}

fn hex(name: &[u8; 16]) -> String {
    name.iter().map(|b| format!("{b:02x}")).collect()
}

fn is_hex(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn parse_name(text: &str) -> Option<[u8; 16]> {
    if text.len() != 32 || !is_hex(text) {
        return None;
    }
    let mut out = [0; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Whether the temporary file `path` (`NAME.PID.SEQ.tmp`) belongs to a write that will
/// never finish ([`abandoned_by`]).
fn abandoned(path: &Path, file_name: &str) -> bool {
    let pid = file_name
        .split('.')
        .nth(1)
        .and_then(|p| p.parse::<u32>().ok());
    let age = fs::metadata(path)
        .and_then(|m| m.modified())
        .map(|t| SystemTime::now().duration_since(t).unwrap_or_default());
    let Ok(age) = age else {
        return false; // Gone meanwhile, or unreadable: left for the next scan.
    };
    // Our own pid's directory tells whether /proc shows processes at all.
    let proc_usable = Path::new(&format!("/proc/{}", std::process::id())).exists();
    let writer_alive = pid.map(|pid| Path::new(&format!("/proc/{pid}")).exists());
    abandoned_by(proc_usable.then_some(writer_alive.unwrap_or(false)), age)
}

/// Whether a temporary file `age` old whose writer is alive (`Some(true)`), gone
/// (`Some(false)`), or unknown (`None`: `/proc` not usable) belongs to a write that will
/// never finish: its writer is gone, or it is older than any write takes
/// ([`TEMP_MAX_AGE`]; a live pid may be another process now). A writer that cannot be
/// seen is not taken for gone: its write may be under way.
fn abandoned_by(writer_alive: Option<bool>, age: Duration) -> bool {
    writer_alive == Some(false) || age > TEMP_MAX_AGE
}

fn invalid(why: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> (CachePolicy, http::response::Parts) {
        let req = http::Request::get("http://h/a").body(()).unwrap();
        let res = http::Response::builder()
            .status(200)
            .header("cache-control", "max-age=60")
            .header("x-up", "1")
            .body(())
            .unwrap();
        let policy = CachePolicy::new(&req, &res);
        (policy, res.into_parts().0)
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weir-disk-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn write(disk: &Disk, key: &[u8], body: &[u8]) -> Location {
        let (policy, parts) = policy();
        let meta = Meta {
            variant: b"accept-encoding=gzip\0",
            policy: &policy,
            status: parts.status,
            headers: &parts.headers,
        };
        let written = disk.write(key, meta, body).unwrap();
        disk.place(written, |at| at).unwrap()
    }

    #[test]
    fn an_entry_is_found_again_and_its_body_read_back() {
        let dir = temp_dir("roundtrip");
        let disk = Disk::new(dir.clone());
        let at = write(&disk, b"http://h/a", b"hello");
        assert_eq!(&disk.read(&at, b"http://h/a").unwrap()[..], b"hello");
        assert!(disk.read(&at, b"http://h/b").is_err(), "another key's");
        let mut found = Vec::new();
        let scanned = disk.scan(|f| found.push(f));
        assert_eq!((scanned.found, scanned.discarded), (1, 0));
        let f = &found[0];
        assert_eq!(f.key, b"http://h/a");
        assert_eq!(f.variant, b"accept-encoding=gzip\0");
        assert_eq!(f.headers["x-up"], "1");
        assert_eq!(f.location, at);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_temporary_file_is_abandoned_only_if_its_writer_is_gone_or_it_is_old() {
        let young = Duration::from_secs(1);
        let old = TEMP_MAX_AGE + young;
        assert!(abandoned_by(Some(false), young), "its writer is gone");
        assert!(!abandoned_by(Some(true), young), "a write under way");
        assert!(
            !abandoned_by(None, young),
            "an unseen writer may be writing"
        );
        assert!(abandoned_by(None, old) && abandoned_by(Some(true), old));
    }

    #[test]
    fn torn_and_foreign_files_are_discarded_and_abandoned_writes_removed() {
        let dir = temp_dir("torn");
        let disk = Disk::new(dir.clone());
        let whole = write(&disk, b"http://h/whole", b"whole body");
        let cut = write(&disk, b"http://h/cut", &[7; 5000]);
        let flipped = write(&disk, b"http://h/flipped", b"abc");
        let cut_path = disk.path_of(&cut.name);
        let file = fs::OpenOptions::new().write(true).open(&cut_path).unwrap();
        file.set_len(cut.file_len - 10).unwrap();
        let mut bytes = fs::read(disk.path_of(&flipped.name)).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(disk.path_of(&flipped.name), &bytes).unwrap();
        assert!(disk.read(&cut, b"http://h/cut").is_err(), "truncated");
        assert!(
            disk.read(&flipped, b"http://h/flipped").is_err(),
            "body sum"
        );
        // A foreign file under an entry's name, and a write that died (its pid is gone).
        fs::create_dir_all(dir.join("00")).unwrap();
        fs::write(dir.join("00").join("0".repeat(32)), b"not an entry").unwrap();
        let temp = dir
            .join("00")
            .join(format!("{}.999999999.0.tmp", "1".repeat(32)));
        fs::write(&temp, b"half").unwrap();
        let mut found = Vec::new();
        let scanned = disk.scan(|f| found.push(f.key));
        // The flipped body's sum is only checked when it is read.
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!((scanned.discarded, scanned.abandoned), (2, 1));
        assert!(!cut_path.exists() && !temp.exists());
        assert!(disk.read(&whole, b"http://h/whole").is_ok());
        fs::remove_dir_all(dir).unwrap();
    }
}
