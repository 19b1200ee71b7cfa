//! Finding a request's file: the method, the path made plain, each `try_files` entry (or
//! the path alone) opened through the worker's open-file cache, a directory's index, a
//! precompressed sibling the client accepts; then the reply (`FileServer::reply`). A
//! path that cannot be looked at for now (Weir is out of descriptors or memory) answers
//! 503 and is not kept in the open-file cache: a 404 kept for it would hide an existing
//! file after the shortage.

use std::ffi::CString;
use std::rc::Rc;
use std::time::Instant;

use weir_config::Encoding;

use super::cache::OpenFile;
use super::http::Validators;
use super::{path, FileServer, Lookup, Opened, Reply};
use crate::request::Request;
use crate::worker::Worker;

/// What a path led to.
pub(super) enum Found {
    /// A regular file: it, its precompressed sibling if one is served, and its content
    /// type.
    File(Opened, Option<(Opened, Encoding)>),
    /// A directory asked without its `/`: redirected to it.
    Slash,
    /// A directory without an index, listed.
    Listing(Opened),
    Missing,
    /// It could not be looked for now: Weir is short of descriptors or memory.
    Unavailable,
}

/// A path could not be looked at for now (out of descriptors or memory, interrupted): a
/// 503, never kept as missing.
pub(super) struct Unavailable;

/// Whether `e` is Weir's passing shortage (as the proxy's `ProxyError::LocalResources`),
/// not what the path is.
fn is_passing(e: &std::io::Error) -> bool {
    crate::listener::backoff::is_resource_exhaustion(e)
        || matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN))
}

impl FileServer {
    /// What the files say about `r`, whose normalised target is `routed`. A reply to HEAD
    /// has no body, whatever it is (a file, a listing, a redirect, an error): its length
    /// stays in `Content-Length`, and the connection's next response is not mistaken.
    pub(crate) fn lookup(&self, worker: &Worker, r: &Request<'_>, routed: &[u8]) -> Lookup {
        match self.look_up(worker, r, routed) {
            Lookup::Reply(reply) => Lookup::Reply(reply.for_method(r.req.is_head)),
            upstream => upstream,
        }
    }

    fn look_up(&self, worker: &Worker, r: &Request<'_>, routed: &[u8]) -> Lookup {
        let cfg = &self.config;
        let method = &r.buf[r.req.method.clone()];
        if method != b"GET" && !r.req.is_head {
            return match cfg.fallback {
                Some(upstream) => Lookup::Upstream(upstream),
                None => Lookup::Reply(Reply::status(405, b"Allow: GET, HEAD\r\n", cfg)),
            };
        }
        let mut rel = Vec::with_capacity(routed.len() + 16);
        if let Err(status) = path::plain(routed, cfg.hidden, &mut rel) {
            return self.missing(status);
        }
        let at = Looking {
            server: self,
            worker,
            r,
            now: r.started,
        };
        match at.try_paths(&mut rel) {
            Found::File(file, sibling) => Lookup::Reply(self.reply(r, &file, sibling)),
            Found::Slash => Lookup::Reply(Reply::slash(routed, cfg)),
            Found::Listing(dir) => Lookup::Reply(super::listing::reply(&dir, routed, cfg)),
            Found::Missing => self.missing(404),
            Found::Unavailable => Lookup::Reply(Reply::status(503, b"", cfg)),
        }
    }

    /// No file for the request: the route's upstream if it has one, else `status`.
    fn missing(&self, status: u16) -> Lookup {
        match self.config.fallback {
            Some(upstream) if status == 404 => Lookup::Upstream(upstream),
            _ => Lookup::Reply(Reply::status(status, b"", &self.config)),
        }
    }
}

/// One request's lookup.
struct Looking<'a> {
    server: &'a FileServer,
    worker: &'a Worker,
    r: &'a Request<'a>,
    now: Instant,
}

impl Looking<'_> {
    /// The request's path (`rel`, reused as scratch), or each `try_files` entry in turn.
    fn try_paths(&self, rel: &mut Vec<u8>) -> Found {
        let entries = &self.server.config.try_files;
        if entries.is_empty() {
            return self.find(rel, true);
        }
        let asked = std::mem::take(rel);
        for entry in entries {
            rel.clear();
            for (i, part) in entry.split("{path}").enumerate() {
                if i > 0 {
                    rel.push(b'/');
                    rel.extend_from_slice(&asked);
                }
                rel.extend_from_slice(part.as_bytes());
            }
            // Made relative, `//` merged (the request's own `/` and the entry's).
            rel.dedup_by(|a, b| *a == b'/' && *b == b'/');
            if rel.first() == Some(&b'/') {
                rel.remove(0);
            }
            match self.find(rel, false) {
                Found::Missing | Found::Slash => continue,
                found => return found,
            }
        }
        Found::Missing
    }

    /// What `rel` is: a file (or, ending in `/`, a directory's index or listing); a
    /// directory named without its `/` is `Slash` when `redirect`, else missing.
    fn find(&self, rel: &mut Vec<u8>, redirect: bool) -> Found {
        let cfg = &self.server.config;
        if rel.is_empty() || rel.ends_with(b"/") {
            let dir_len = rel.len();
            for name in &cfg.index {
                rel.truncate(dir_len);
                rel.extend_from_slice(name.as_bytes());
                match self.open(rel) {
                    Ok(Some(file)) if !file.dir => return self.with_sibling(file, rel),
                    Err(Unavailable) => return Found::Unavailable,
                    _ => {}
                }
            }
            rel.truncate(dir_len);
            return match self.open(rel) {
                Ok(Some(dir)) if dir.dir && cfg.listing => Found::Listing(dir),
                Err(Unavailable) => Found::Unavailable,
                _ => Found::Missing,
            };
        }
        match self.open(rel) {
            Ok(Some(file)) if !file.dir => self.with_sibling(file, rel),
            Ok(Some(_)) if redirect => Found::Slash,
            Err(Unavailable) => Found::Unavailable,
            _ => Found::Missing,
        }
    }

    /// `file` (at `rel`), and the precompressed sibling the client prefers, if one exists.
    fn with_sibling(&self, file: Opened, rel: &mut Vec<u8>) -> Found {
        let order = &self.server.config.precompressed;
        let (buf, headers) = (self.r.buf, &self.r.req.headers);
        let mut left: Vec<Encoding> = order.clone();
        let len = rel.len();
        while let Some(coding) = crate::filters::compression::negotiate_among(&left, buf, headers) {
            rel.truncate(len);
            rel.extend_from_slice(extension(coding));
            // A sibling that cannot be looked at for now: the file itself is sent.
            if let Ok(Some(sibling)) = self.open(rel).map(|f| f.filter(|f| !f.dir)) {
                rel.truncate(len);
                return Found::File(file, Some((sibling, coding)));
            }
            left.retain(|c| *c != coding);
        }
        rel.truncate(len);
        Found::File(file, None)
    }

    /// The file or directory at `rel` (`None`: there is none that may be served), from
    /// the worker's cache when it was looked up lately.
    fn open(&self, rel: &[u8]) -> Result<Option<Opened>, Unavailable> {
        let (server, cfg) = (self.server, &self.server.config);
        let valid = cfg.open_file_cache_valid;
        if cfg.open_file_cache > 0 {
            let mut cache = self.worker.open_files.borrow_mut();
            if let Some(found) = cache.get(server.id, rel, self.now, valid) {
                return Ok(found);
            }
        }
        let found = open_uncached(server, rel)?;
        if cfg.open_file_cache > 0 {
            let mut cache = self.worker.open_files.borrow_mut();
            let max = cfg.open_file_cache;
            cache.put(server.id, rel, found.clone(), self.now, max, valid);
        }
        Ok(found)
    }
}

/// Opens `rel` beneath the root: a regular file or a directory, else nothing; `Err` when
/// it cannot be looked at for now ([`is_passing`]).
fn open_uncached(server: &FileServer, rel: &[u8]) -> Result<Option<Opened>, Unavailable> {
    let Ok(root) = server.root.as_ref() else {
        return Ok(None);
    };
    let name = match rel.strip_suffix(b"/").unwrap_or(rel) {
        [] => CString::new("."),
        name => CString::new(name),
    };
    let Ok(name) = name else { return Ok(None) };
    let passing = |e: &std::io::Error| {
        let passing = is_passing(e);
        if passing {
            tracing::debug!(path = %String::from_utf8_lossy(rel), error = %e, "files: cannot look for now: 503");
        } else if e.raw_os_error() == Some(libc::EXDEV) {
            tracing::debug!(path = %String::from_utf8_lossy(rel), "files: refused a path leading out of the root");
        }
        passing
    };
    let (file, meta) = match root
        .open_beneath(&name)
        .and_then(|f| Ok((f.metadata()?, f)))
    {
        Ok((meta, file)) => (file, meta),
        Err(e) if passing(&e) => return Err(Unavailable),
        Err(_) => return Ok(None),
    };
    let dir = meta.is_dir();
    if !dir && !meta.is_file() {
        return Ok(None);
    }
    let Ok(mtime) = meta.modified() else {
        return Ok(None);
    };
    // Clamped to 9999-12-31: HTTP dates end there (`httpdate` panics past it), and a file
    // may carry any timestamp.
    let mtime = mtime
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs().min(253_402_300_799));
    let name = std::str::from_utf8(rel).unwrap_or("");
    Ok(Some(Rc::new(OpenFile {
        file,
        validators: Validators {
            len: meta.len(),
            mtime,
        },
        content_type: content_type(name),
        dir,
    })))
}

/// The media type of a file named `name` (from its extension); `text/*` in UTF-8.
fn content_type(name: &str) -> Box<str> {
    let guessed = mime_guess::from_path(name).first_raw();
    match guessed {
        Some(t) if t.starts_with("text/") => format!("{t}; charset=utf-8").into(),
        Some(t) => t.into(),
        None => "application/octet-stream".into(),
    }
}

/// The name suffix of a precompressed sibling.
fn extension(coding: Encoding) -> &'static [u8] {
    match coding {
        Encoding::Br => b".br",
        Encoding::Zstd => b".zst",
        Encoding::Gzip => b".gz",
    }
}
