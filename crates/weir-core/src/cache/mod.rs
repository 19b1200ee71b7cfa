//! The HTTP cache (RFC 9111; docs/configuration.md "HTTP cache"): a route's `cache` names
//! a store (`store::Store`: in memory, or on disk), and two seams of the one request path
//! use it, so every client protocol gets it:
//!
//! - **Hits** are a routing decision (`proxy::route`): [`lookup`] finds a fresh entry for
//!   a GET (or a HEAD, from a cached GET) and the request is answered from it, without an
//!   upstream: a `files::Reply` (`reply`: its conditions and range weighed, its body a
//!   [`Held`]: shared `Bytes`, a small disk entry's read, or a large one's file, open),
//!   which the client adapters send as an upstream's response (`response_headers`,
//!   compression); a body of at least the store's `sendfile_min_size` goes to plain-TCP
//!   HTTP/1.1 clients with sendfile(2) from a sealed memfd or the entry's file (a disk
//!   entry's file over 64 KiB always goes out as the file). A large disk entry found by
//!   the scan has its sum checked once, read in pieces on the blocking pool (the hits
//!   meanwhile wait for that check), before the miss path would go upstream
//!   ([`Fill::collapse`]); then it is sent from its file. A stale disk entry (answering
//!   after a `304`, or for a failure) is held the same way: no request reads a large
//!   body into memory.
//! - **Misses** go upstream with a [`Fill`] (the exchange with an HTTP/1.1 or HTTP/2
//!   upstream, for HTTP/1.x, HTTP/2 and HTTP/3 clients: `forward::exchange`,
//!   `http2::filling`, `http2::upstream`); once the response head
//!   is in ([`Fetched`], of either protocol), [`Fill::admit`] says whether it may be
//!   stored (the `http-cache-semantics` policy: `no-store`, `private`, `Authorization`,
//!   `Set-Cookie`, statuses, freshness) and a [`Recorder`] beside the client's sink keeps
//!   a copy of the body (`forward::relay::Recording`), stored once the body is complete
//!   and within `max_object_size`. A larger one streams through uncached.
//!
//! Concurrent misses of one key are collapsed: the first goes upstream, the others wait
//! for it (at most the route's `lock_timeout`, then go themselves) and are answered from
//! what it stored ([`Fill::collapse`]).
//!
//! Entries are keyed by the route's `key` parts (default `scheme://host/path?query`) and,
//! under a key, by variant: the route's scope (its listener and name: routes sharing a
//! store never answer from each other's entries), then `Vary` (`Accept-Encoding`
//! normalised to the one coding Weir would pick, so variants stay few). The policy sees
//! the request without `max-stale` and with repeated fields joined, and keeps of it only
//! the fields it weighs later; a hit's head is the stored fields with `Age`, and a `304`'s
//! fields are merged into them here. A route without `cache` pays one `Option` check.

mod directives;
pub mod disk;
mod lru;
mod reply;
mod request;
mod sealed;
pub mod stale;
pub mod store;

use std::cell::Cell;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_cache_semantics::{AfterResponse, BeforeRequest, CacheOptions, CachePolicy};
use weir_config::RouteCache;

use request::{key, request_parts, stored_request, without_directives};
pub use stale::{Cause, Staleness};
pub use store::{Body, Entry, FillMemory, Held, Store};
use store::{Ready, Turn};
use tokio::sync::watch;

use crate::codec::http1::write::push_header;
use crate::codec::http1::{BodyFraming, ResponseHead};
use crate::files::Reply;
use crate::forward::body::BodyState;
use crate::forward::h2::is_connection_specific;
use crate::request::Request;

/// What the cache did for a request (the access log's `cache` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheResult {
    /// Answered from a fresh entry (also after waiting for another request's fetch).
    Hit,
    /// Fetched from the upstream (stored if it could be).
    Miss,
    /// A stale entry the upstream confirmed with a 304.
    Revalidated,
    /// A stale entry answered for the upstream's failure.
    Stale,
}

impl CacheResult {
    pub fn label(self) -> &'static str {
        match self {
            CacheResult::Hit => "hit",
            CacheResult::Miss => "miss",
            CacheResult::Revalidated => "revalidated",
            CacheResult::Stale => "stale",
        }
    }
}

/// A snapshot's stores, indexed like `Config::caches`.
pub type Stores = Vec<Arc<Store>>;

/// What the cache says about a request of a route with `cache`.
pub enum Lookup {
    /// Answer with this reply from a fresh entry.
    Hit(Box<Reply>),
    /// Answer with this reply from a stale entry at once (`stale-while-revalidate`), and
    /// revalidate it in the background with this fill (none: another request fetches the
    /// key already, or the request's own conditions would not refresh it).
    Stale(Box<Reply>, Option<Box<Fill>>),
    /// Forward it, and store the response if it may be.
    Miss(Box<Fill>),
    /// Forward it as it is (a method the cache does not serve).
    Bypass,
}

/// A stale entry's body kept for its 304 (`None`: on disk, read again then).
fn held_in_memory(body: &Body) -> Option<Held> {
    match body {
        Body::Memory(body) => Some(Held::Memory(body.clone())),
        Body::Sealed(body, file) => Some(Held::Sealed(body.clone(), file.clone())),
        Body::Disk(_) => None,
    }
}

/// Looks `r` up in `store` (`routed`: its normalised path and query; `cert_header`: the
/// listener's `client_cert_header`, which the upstream sees as Weir writes it).
pub fn lookup(
    r: &Request<'_>,
    routed: &[u8],
    cert_header: Option<&str>,
    cache: &RouteCache,
    store: &Arc<Store>,
) -> Lookup {
    let method = &r.buf[r.req.method.clone()];
    // `If-Match` and `If-Unmodified-Since` are the origin's to weigh (RFC 9111 4.3.2).
    if method != b"GET" && method != b"HEAD" || asks_any(r, &CONDITIONS[2..4]) {
        store.counts.bypasses.fetch_add(1, Relaxed);
        return Lookup::Bypass;
    }
    let key = key(r, routed, cache);
    let Some(parts) = request_parts(r, routed, cert_header) else {
        store.counts.bypasses.fetch_add(1, Relaxed);
        return Lookup::Bypass;
    };
    let now = SystemTime::now();
    let mut stale = None;
    for entry in store.get(&key, &cache.scope) {
        match entry.policy.before_request(&parts, now) {
            BeforeRequest::Fresh(_) => {
                let length = entry.body.length();
                // A HEAD is answered with the length alone: no body is read.
                let ready = match r.req.is_head {
                    true => Ready::Now(Held::Memory(Bytes::new())),
                    false => store.body_now(&key, &entry),
                };
                let body = match ready {
                    Ready::Now(body) => body,
                    Ready::Gone => continue,
                    Ready::Later => {
                        let load = Some(Load { entry });
                        return Lookup::Miss(Box::new(Fill::new(key, parts, store, cache, load)));
                    }
                };
                store.counts.hits.fetch_add(1, Relaxed);
                let head = entry_head(&entry, now);
                let hit = Hit::new(head, body, length, HitLabel::new(Served::Fresh, cache));
                return Lookup::Hit(Box::new(hit.reply(&parts.headers, r.req.is_head)));
            }
            BeforeRequest::Stale { request, matches } if matches && stale.is_none() => {
                let lines = revalidation(r, &request.headers).unwrap_or_default();
                let at_once = !r.req.is_head && may_wait(r);
                if at_once && entry.staleness.while_revalidating(now) {
                    let probe = Probe {
                        key: &key,
                        parts: &parts,
                        store,
                        cache,
                    };
                    if let Some(lookup) = probe.while_revalidating(r, &entry, &lines, now) {
                        return lookup;
                    }
                }
                let body = held_in_memory(&entry.body);
                stale = Some(Stale { entry, lines, body });
            }
            BeforeRequest::Stale { .. } => {}
        }
    }
    store.counts.misses.fetch_add(1, Relaxed);
    if r.req.is_head {
        // A HEAD response has no body to store: forwarded as it is.
        return Lookup::Bypass;
    }
    if stale.as_ref().is_some_and(|s| !s.lines.is_empty()) {
        store.counts.revalidations.fetch_add(1, Relaxed);
    }
    let mut fill = Fill::new(key, parts, store, cache, None);
    fill.stale = stale;
    // Only a request without a body waits for another's fetch (answered from the entry
    // then, nothing of it is left to read).
    if let BodyFraming::None | BodyFraming::Length(0) = r.req.framing {
        fill.take_turn();
    }
    Lookup::Miss(Box::new(fill))
}

/// The conditional header lines that revalidate a stale entry (`conditional`: the fields
/// the policy would send); `None` when it has no validator, or when the client sent a
/// condition of its own (its request goes up as it is, and the response is stored anew).
fn revalidation(r: &Request<'_>, conditional: &HeaderMap) -> Option<Vec<u8>> {
    let own = asks_any(r, &CONDITIONS);
    let mut lines = Vec::new();
    for name in [http::header::IF_NONE_MATCH, http::header::IF_MODIFIED_SINCE] {
        if let Some(value) = conditional.get(&name) {
            push_header(&mut lines, header_case(&name), value.as_bytes());
        }
    }
    (!own && !lines.is_empty()).then_some(lines)
}

/// The conditional lines of a stored response's own validators (its `ETag`, its
/// `Last-Modified`), whatever the request asked.
fn validator_lines(stored: &HeaderMap) -> Vec<u8> {
    let mut lines = Vec::new();
    let fields = [
        (http::header::ETAG, http::header::IF_NONE_MATCH),
        (http::header::LAST_MODIFIED, http::header::IF_MODIFIED_SINCE),
    ];
    for (validator, condition) in fields {
        if let Some(value) = stored.get(&validator) {
            push_header(&mut lines, header_case(&condition), value.as_bytes());
        }
    }
    lines
}

/// Whether `name` is a request field that makes a request conditional or partial (a
/// background revalidation's head leaves them out).
pub(crate) fn is_condition(name: &[u8]) -> bool {
    CONDITIONS
        .iter()
        .any(|c| c.as_bytes().eq_ignore_ascii_case(name))
}

/// Whether `r` has any of the fields `names`.
fn asks_any(r: &Request<'_>, names: &[&str]) -> bool {
    r.req.headers.iter().any(|h| {
        let name = &r.buf[h.name.clone()];
        names
            .iter()
            .any(|c| c.as_bytes().eq_ignore_ascii_case(name))
    })
}

/// Whether `r` takes a stale entry (`stale-while-revalidate`): it says nothing of the
/// freshness it wants (no `Cache-Control`, no `Pragma`).
fn may_wait(r: &Request<'_>) -> bool {
    !asks_any(r, &["cache-control", "pragma"])
}

impl Probe<'_> {
    /// The answer from the stale `entry` of the probe's key while it is revalidated in
    /// the background (`lines`: its conditional lines, empty when the client sent its
    /// own), if its body is at hand; the revalidation's fill when this request starts it
    /// (it fetches the key: [`Store::turn`]) and has no body.
    fn while_revalidating(
        &self,
        r: &Request<'_>,
        entry: &Arc<Entry>,
        lines: &[u8],
        now: SystemTime,
    ) -> Option<Lookup> {
        let Probe {
            key,
            parts,
            store,
            cache,
        } = *self;
        let Ready::Now(body) = store.body_now(key, entry) else {
            return None;
        };
        store.counts.stale.fetch_add(1, Relaxed);
        let served = HitLabel::new(Served::WhileRevalidating, cache);
        let reply =
            Hit::whole(entry_head(entry, now), body.clone(), served).reply(&parts.headers, false);
        let mut fill = Fill::new(key.to_vec(), parts.clone(), store, cache, None);
        // The revalidation sends the request's head again without the client's conditions
        // and range (`is_condition`): the entry's own validators make it conditional.
        let lines = match lines.is_empty() {
            true => validator_lines(&entry.headers),
            false => lines.to_vec(),
        };
        fill.stale = Some(Stale {
            entry: entry.clone(),
            lines,
            body: Some(body),
        });
        // ... and without a body.
        if let BodyFraming::None | BodyFraming::Length(0) = r.req.framing {
            fill.take_turn();
        }
        // Counted when the revalidation starts (`Fill::count_revalidation`): it may not.
        let fill = fill.leading.get().then(|| Box::new(fill));
        Some(Lookup::Stale(Box::new(reply), fill))
    }
}

/// An `entry`'s head as it is sent: the stored status and fields (every line, as the
/// upstream sent them, its `Date` the origin's) with its age at `now` in `Age`. Not the
/// policy's `cached_response`, which keeps one line of each field.
fn entry_head(entry: &Entry, now: SystemTime) -> http::response::Parts {
    head_at(entry.status, &entry.headers, &entry.policy, now)
}

/// [`entry_head`] of a response with `status` and `fields` stored under `policy`.
fn head_at(
    status: http::StatusCode,
    fields: &HeaderMap,
    policy: &CachePolicy,
    now: SystemTime,
) -> http::response::Parts {
    let mut head = http::Response::new(()).into_parts().0;
    head.status = status;
    head.headers = fields.clone();
    let age = policy.age(now).as_secs();
    head.headers
        .insert(http::header::AGE, HeaderValue::from(age));
    head
}

/// The request fields that make a request conditional (or partial); the third and fourth
/// only the origin may weigh.
const CONDITIONS: [&str; 6] = [
    "if-none-match",
    "if-modified-since",
    "if-match",
    "if-unmodified-since",
    "if-range",
    "range",
];

fn header_case(name: &HeaderName) -> &'static [u8] {
    match name.as_str() {
        "if-none-match" => b"If-None-Match",
        _ => b"If-Modified-Since",
    }
}

/// The stale entry of a miss: revalidated, or served if the upstream fails.
struct Stale {
    entry: Arc<Entry>,
    /// Its conditional header lines, added to the upstream request (empty: it has no
    /// validator, or the client sent a condition of its own).
    lines: Vec<u8>,
    /// Its body as a hit's is held (a disk entry's once at hand, [`Fill::collapse`]: a
    /// small file read, else its file once checked, never a large body read into memory):
    /// what answers for it, and what a `304` stores again.
    body: Option<Held>,
}

impl Stale {
    /// Whether it may answer at all: confirmed by a `304`, or for a failure.
    fn may_answer(&self, on: weir_config::StaleOn) -> bool {
        let staleness = &self.entry.staleness;
        let for_failure = staleness.if_error.is_some() || on.error || on.timeout || on.status_5xx;
        !self.lines.is_empty() || (!staleness.forbidden && for_failure)
    }
}

/// A fresh disk entry whose body is read before the request is answered from it.
struct Load {
    entry: Arc<Entry>,
}

/// Bytes a stored response's index entry takes in a memory store, besides its body: its
/// key (held twice by the index: by key and in use order, [`lru`]), the request URI its
/// policy keeps, its variant, its heads (the `response` fields, held twice: by the entry
/// and by its policy; the `request` fields its policy keeps, [`stored_request`]), each
/// field with the map's room for it, and [`ENTRY_ROOM`] for the rest. (A disk store
/// counts its file in `max_size` instead, which holds all of these, and this kind of
/// estimate in `index_size`.)
fn index_cost(fill: &Fill, variant: &[u8], response: &HeaderMap, request: &HeaderMap) -> u64 {
    let fields = |h: &HeaderMap| -> u64 {
        let each = h
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len() + FIELD_ROOM);
        each.sum::<usize>() as u64
    };
    let uri = fill
        .parts
        .uri
        .path_and_query()
        .map_or(0, |p| p.as_str().len());
    let named = (2 * fill.key.len() + uri + variant.len()) as u64;
    named + 2 * fields(response) + fields(request) + ENTRY_ROOM
}

/// What a header map takes per field besides its name and value (its bucket, index and
/// the values' own `Bytes`), roughly.
const FIELD_ROOM: usize = 64;

/// What an entry takes besides its body, names and fields (the entry, its policy's
/// other parts), roughly.
const ENTRY_ROOM: u64 = 512;

/// A response from the store, as it is sent ([`Hit::reply`]): the stored head (with its
/// `Age`: [`entry_head`]) and the body, shared.
pub struct Hit {
    head: http::response::Parts,
    /// Empty for a HEAD request.
    body: Held,
    /// The body's length (its `Content-Length`).
    length: u64,
    label: HitLabel,
}

/// How a [`Hit`] is labelled: how it was served, and whether the route adds
/// `Cache-Status` saying so.
#[derive(Clone, Copy)]
struct HitLabel {
    served: Served,
    /// The route adds `Cache-Status`.
    status_header: bool,
}

impl HitLabel {
    fn new(served: Served, cache: &RouteCache) -> HitLabel {
        HitLabel {
            served,
            status_header: cache.status_header,
        }
    }
}

/// One stale entry's lookup: its key, the request as the policy reads it, the store and
/// the route's cache settings.
#[derive(Clone, Copy)]
struct Probe<'a> {
    key: &'a [u8],
    parts: &'a http::request::Parts,
    store: &'a Arc<Store>,
    cache: &'a RouteCache,
}

impl Hit {
    fn new(head: http::response::Parts, body: Held, length: u64, label: HitLabel) -> Hit {
        Hit {
            head,
            body,
            length,
            label,
        }
    }

    /// The entry as a whole answer (`body`: all of it).
    fn whole(head: http::response::Parts, body: Held, label: HitLabel) -> Hit {
        let length = body.len();
        Hit::new(head, body, length, label)
    }
}

/// How a response from the store came to answer: its `Cache-Status` (RFC 9211) and what
/// the access log says.
#[derive(Debug, Clone, Copy)]
enum Served {
    /// A fresh entry.
    Fresh,
    /// A miss answered from the entry another request was fetching.
    Collapsed,
    /// A stale entry answered for the upstream's failure.
    Stale,
    /// A stale entry answered at once while it is revalidated in the background.
    WhileRevalidating,
    /// A stale entry the upstream confirmed (`304`).
    Refreshed,
}

impl Served {
    fn line(self) -> &'static [u8] {
        match self {
            Served::Fresh => b"Cache-Status: weir; hit\r\n",
            Served::Collapsed => b"Cache-Status: weir; hit; collapsed\r\n",
            Served::Stale => b"Cache-Status: weir; hit; detail=stale\r\n",
            Served::WhileRevalidating => {
                b"Cache-Status: weir; hit; detail=stale-while-revalidate\r\n"
            }
            Served::Refreshed => b"Cache-Status: weir; fwd=stale; fwd-status=304\r\n",
        }
    }

    fn result(self) -> CacheResult {
        match self {
            Served::Fresh | Served::Collapsed => CacheResult::Hit,
            Served::Stale | Served::WhileRevalidating => CacheResult::Stale,
            Served::Refreshed => CacheResult::Revalidated,
        }
    }
}

/// A miss on its way upstream: what its response is stored as.
pub struct Fill {
    key: Vec<u8>,
    /// The route's [`RouteCache::scope`]: the entries it may be answered from.
    scope: Arc<[u8]>,
    /// The request fields Weir writes upstream for the route ([`RouteCache::rewritten`]).
    rewritten: Arc<[Box<str>]>,
    parts: http::request::Parts,
    store: Arc<Store>,
    status_header: bool,
    /// A fresh disk entry to answer from once its body is read.
    load: Option<Load>,
    /// A stale entry the request revalidates.
    stale: Option<Stale>,
    /// This request fetches the key while others wait ([`Store::release`] when the fill
    /// is dropped: refused or failed; or once its response, or the head a `304` refreshed,
    /// is stored: the release is handed to [`Store::put`] then). A `Cell`: the refresh
    /// hands it over through `&self`.
    leading: Cell<bool>,
    /// Another request fetches the key: wait for it (within `lock_timeout`) and look again.
    wait: Option<watch::Receiver<()>>,
    lock_timeout: Duration,
    serve_stale_on: weir_config::StaleOn,
}

impl Drop for Fill {
    fn drop(&mut self) {
        if self.leading.get() {
            self.store.release(&self.key, &self.scope);
        }
    }
}

/// The `Cache-Status` lines (RFC 9211) of a response fetched for a miss, and of one
/// fetched to revalidate a stale entry (answers from the store: [`Served`]).
const MISS_LINE: &[u8] = b"Cache-Status: weir; fwd=uri-miss\r\n";
const STALE_LINE: &[u8] = b"Cache-Status: weir; fwd=stale\r\n";

impl Fill {
    fn new(
        key: Vec<u8>,
        parts: http::request::Parts,
        store: &Arc<Store>,
        cache: &RouteCache,
        load: Option<Load>,
    ) -> Fill {
        Fill {
            key,
            scope: cache.scope.clone(),
            rewritten: cache.rewritten.clone(),
            parts,
            store: store.clone(),
            status_header: cache.status_header,
            load,
            stale: None,
            leading: Cell::new(false),
            wait: None,
            lock_timeout: cache.lock_timeout,
            serve_stale_on: cache.serve_stale_on,
        }
    }

    /// Fetches the key, or waits for the request that does.
    fn take_turn(&mut self) {
        match self.store.turn(&self.key, &self.scope) {
            Turn::Lead => self.leading.set(true),
            Turn::Wait(rx) => self.wait = Some(rx),
        }
    }

    /// The `Cache-Status` line the response gets, if the route adds one.
    pub fn status_line(&self) -> Option<&'static [u8]> {
        let line = match &self.stale {
            Some(s) if !s.lines.is_empty() => STALE_LINE,
            _ => MISS_LINE,
        };
        self.status_header.then_some(line)
    }

    /// [`Fill::status_line`]'s value alone (an HTTP/2 or HTTP/3 field's).
    pub fn status_value(&self) -> Option<&'static str> {
        let line = std::str::from_utf8(self.status_line()?).ok()?;
        line.strip_prefix("Cache-Status: ")?.strip_suffix("\r\n")
    }

    /// What is done before the request goes upstream: a fresh disk entry's body is had
    /// (the request is answered from it); a stale disk entry's body is had (to answer
    /// with if it is confirmed or the upstream fails): each as a hit holds it, a large
    /// file checked first if it was not ([`Store::body`]); and the request fetching the same
    /// key, if another one is, is waited for (within `lock_timeout`), then the store is
    /// looked at again. `None`: this request goes upstream.
    pub async fn collapse(&mut self) -> Option<Reply> {
        if let Some(load) = self.load.take() {
            if let Some(body) = self.store.body(&self.key, &load.entry).await {
                self.store.counts.hits.fetch_add(1, Relaxed);
                let head = entry_head(&load.entry, SystemTime::now());
                return Some(self.reply(Hit::whole(head, body, self.served(Served::Fresh))));
            }
            // Its file could not be read: a miss after all (not collapsed: the request
            // may have a body).
            self.store.counts.misses.fetch_add(1, Relaxed);
        }
        let on = self.serve_stale_on;
        let wanted = |s: &&mut Stale| s.body.is_none() && s.may_answer(on);
        if let Some(stale) = self.stale.as_mut().filter(wanted) {
            stale.body = self.store.body(&self.key, &stale.entry).await;
            if stale.body.is_none() {
                self.stale = None;
            }
        }
        let mut wait = self.wait.take()?;
        self.store.counts.collapsed.fetch_add(1, Relaxed);
        // Closed (`Err`) when the leader is done; a timeout: it takes too long.
        let _ = tokio::time::timeout(self.lock_timeout, wait.changed()).await;
        let now = SystemTime::now();
        let fresh = self.store.get(&self.key, &self.scope);
        let fresh = fresh.into_iter().find(|entry| {
            let policy = entry.policy.before_request(&self.parts, now);
            matches!(policy, BeforeRequest::Fresh(_))
        });
        let entry = fresh?;
        let body = self.store.body(&self.key, &entry).await?;
        self.store.counts.hits.fetch_add(1, Relaxed);
        let head = entry_head(&entry, SystemTime::now());
        let hit = Hit::whole(head, body, self.served(Served::Collapsed));
        Some(self.reply(hit))
    }

    fn served(&self, served: Served) -> HitLabel {
        HitLabel {
            served,
            status_header: self.status_header,
        }
    }

    /// `hit` as the reply to this (GET) request.
    fn reply(&self, hit: Hit) -> Reply {
        hit.reply(&self.parts.headers, false)
    }

    /// The stale entry, as the answer for the upstream's failure `cause`, if it may be
    /// served for it (`stale-if-error`, the route's `serve_stale_on`).
    pub fn stale_answer(&self, cause: Cause) -> Option<Reply> {
        let stale = self.stale.as_ref()?;
        let now = SystemTime::now();
        if !stale
            .entry
            .staleness
            .answers(cause, self.serve_stale_on, now)
        {
            return None;
        }
        let body = stale.body.clone()?;
        self.store.counts.stale.fetch_add(1, Relaxed);
        let head = entry_head(&stale.entry, now);
        Some(self.reply(Hit::whole(head, body, self.served(Served::Stale))))
    }

    /// Counts the revalidation of the stale entry, if it has validators to send (a
    /// revalidation in the background, as it starts).
    pub fn count_revalidation(&self) {
        if self.stale.as_ref().is_some_and(|s| !s.lines.is_empty()) {
            self.store.counts.revalidations.fetch_add(1, Relaxed);
        }
    }

    /// The conditional header lines the upstream request gets (empty: none).
    pub fn conditional_lines(&self) -> &[u8] {
        self.stale.as_ref().map_or(&[], |s| &s.lines)
    }

    /// The conditional fields of [`Fill::conditional_lines`] added to `headers` (an
    /// HTTP/2 upstream's request made from the client's own fields).
    pub fn push_conditional_fields(&self, headers: &mut HeaderMap) {
        // The lines are Weir's own (`push_header`): `Name: value` and CRLF each.
        let lines = self.conditional_lines().split(|b| *b == b'\n');
        for line in lines.filter_map(|l| l.strip_suffix(b"\r")) {
            let Some(colon) = line.iter().position(|b| *b == b':') else {
                continue;
            };
            let name = HeaderName::from_bytes(&line[..colon]);
            let value = HeaderValue::from_bytes(line[colon + 1..].trim_ascii());
            if let (Ok(name), Ok(value)) = (name, value) {
                headers.append(name, value);
            }
        }
    }

    /// The stale entry refreshed by the upstream's `304` (`resp`): the store gets the
    /// updated head with the same body, and the client the entry. `None`: nothing was
    /// revalidated, or the `304` is not for the stored entry (it answers the client's own
    /// condition), so it is relayed.
    fn refresh(&self, resp: Fetched<'_>) -> Option<Reply> {
        let stale = self.stale.as_ref().filter(|s| !s.lines.is_empty())?;
        let body = stale.body.clone()?;
        let fresh = resp.head()?;
        let now = SystemTime::now();
        let kept = stored_request(&self.parts, &[&stale.entry.headers, fresh.headers()]);
        // The policy says whether the 304 is for the stored entry (its validators); its
        // updated head is made here, with every line of the stored fields.
        let matched = stale.entry.policy.after_response(&kept, &fresh, now);
        if let AfterResponse::Modified(..) = matched {
            return None;
        }
        let mut head = http::Response::new(());
        *head.status_mut() = stale.entry.status;
        *head.headers_mut() = updated_fields(&stale.entry.headers, fresh.headers());
        let policy = CachePolicy::new_options(&kept, &head, now, shared());
        let (head, ()) = head.into_parts();
        let fits = fits_reply(&head.headers);
        if !storable(&policy, &head.headers) {
            // Not stored again. If the response forbids it (a `304` with `no-store`,
            // `private` or `Set-Cookie`, or fields that would make every hit fail), this
            // entry goes (this one only: the key's other variants, other routes', stay);
            // if only this request does (its own `no-store`), the entry stays as it was:
            // else any client could empty the store, a URL at a time. This request gets
            // the body the 304 confirmed (with the stored head if the new one does not
            // fit).
            let neutral =
                CachePolicy::new_options(&without_directives(&kept), &head, now, shared());
            if !storable(&neutral, &head.headers) {
                self.store.drop_entry(&self.key, &stale.entry);
            }
            let head = match fits {
                true => head_at(head.status, &head.headers, &policy, now),
                false => entry_head(&stale.entry, now),
            };
            return Some(self.reply(Hit::whole(head, body, self.served(Served::Refreshed))));
        }
        let answer = head_at(head.status, &head.headers, &policy, now);
        let variant = &stale.entry.variant;
        let index = index_cost(self, variant, &head.headers, &kept.headers);
        let entry = Entry {
            staleness: Staleness::of(&policy, &head.headers, now),
            size: body.len() + index,
            index,
            status: head.status,
            headers: head.headers,
            policy,
            // The stale body, `body`: `put_refreshed` puts it here.
            body: Body::Memory(Bytes::new()),
            variant: variant.clone(),
            checked: store::Checked::new(true),
        };
        // The waiting requests are let go once the store has the new head (a disk store:
        // once its file is rewritten, the body copied file to file if it is the entry's
        // file), so that they find it fresh instead of each going upstream.
        let release = self.leading.replace(false).then(|| self.scope.clone());
        let stored = body.clone();
        self.store
            .put_refreshed(self.key.clone(), entry, stored, release);
        Some(self.reply(Hit::whole(answer, body, self.served(Served::Refreshed))))
    }

    /// What answers instead of the upstream's response `resp`: the stale entry a `304`
    /// refreshed, or the one a 5xx may be answered with, unless no client waits (`alone`:
    /// a background revalidation, where a 5xx leaves the entry as it is). Any other
    /// status is relayed (`None`), nothing looked up for it.
    pub fn answer_instead(&self, resp: Fetched<'_>, alone: bool) -> Option<Reply> {
        match resp.status() {
            304 => self.refresh(resp),
            500.. if !alone => self.stale_answer(Cause::Status5xx),
            _ => None,
        }
    }

    /// The recorder for the response `resp`, if it may be stored: the policy allows it
    /// and its length (when known) fits `max_object_size`. `dechunk`: an HTTP/1.1 chunked
    /// body's pieces come decoded (to an HTTP/1.0 client, compressed, or to an HTTP/2 or
    /// HTTP/3 client).
    pub fn admit(self, resp: Fetched<'_>, dechunk: bool) -> Option<Box<Recorder>> {
        let limit = self.store.max_object_size();
        if resp.length().is_some_and(|n| n > limit) {
            return None;
        }
        let head = resp.head()?;
        let kept = stored_request(&self.parts, &[head.headers()]);
        let policy = CachePolicy::new_options(&kept, &head, SystemTime::now(), shared());
        let fits = coding_fits_variant(&self.parts.headers, &head);
        if !storable(&policy, head.headers()) || !fits {
            return None;
        }
        if varies_on(head.headers(), &self.rewritten) {
            self.store.counts.bypasses.fetch_add(1, Relaxed);
            return None;
        }
        let variant = variant(&self.scope, &self.parts.headers, head.headers());
        let (head, ()) = head.into_parts();
        Some(Box::new(Recorder {
            request: kept.headers,
            head,
            chunked: resp.chunked() && !dechunk,
            policy,
            variant,
            body: Vec::new(),
            limit,
            expected: resp.length().filter(|_| !resp.chunked()),
            memory: FillMemory::new(&self.store),
            fill: self,
            over: false,
        }))
    }
}

/// The policy's options: a shared cache's.
fn shared() -> CacheOptions {
    CacheOptions {
        shared: true,
        ..CacheOptions::default()
    }
}

/// Whether a response with the fields `headers` may be stored under `policy`: the policy
/// allows it, it sets no cookie (a shared cache stores no response that does: it is one
/// client's), and an answer from it keeps within a head's fields ([`fits_reply`]).
fn storable(policy: &CachePolicy, headers: &HeaderMap) -> bool {
    let set_cookie = headers.contains_key(http::header::SET_COOKIE);
    policy.is_storable() && !set_cookie && fits_reply(headers)
}

/// The stored fields `stored` updated by a `304`'s `fresh` ones (RFC 9111 3.2, 4.3.4):
/// each field the 304 carries replaces every stored line of its name, except those that
/// describe the stored body (its framing and coding) and `Vary` (which requests the
/// stored body is for: its variant was chosen, and its coding checked, by it), which stay;
/// the stored `Age` goes (the 304's, if it has one, is the new age).
fn updated_fields(stored: &HeaderMap, fresh: &HeaderMap) -> HeaderMap {
    let describes_body = |name: &HeaderName| {
        [
            http::header::CONTENT_LENGTH,
            http::header::CONTENT_ENCODING,
            http::header::TRANSFER_ENCODING,
            http::header::CONTENT_RANGE,
            http::header::VARY,
        ]
        .contains(name)
    };
    let mut out = HeaderMap::with_capacity(stored.len() + fresh.len());
    for (name, value) in stored {
        let replaced = fresh.contains_key(name) && !describes_body(name);
        if !replaced && name != http::header::AGE {
            out.append(name.clone(), value.clone());
        }
    }
    for (name, value) in fresh.iter().filter(|(name, _)| !describes_body(name)) {
        out.append(name.clone(), value.clone());
    }
    out
}

/// An upstream's response head, as the cache reads it: an HTTP/1.1 one (parsed from the
/// bytes in its buffer) or an HTTP/2 one. The same steps store it, refresh an entry with
/// it or answer instead of it, whatever the upstream's protocol.
#[derive(Clone, Copy)]
pub enum Fetched<'a> {
    Http1(&'a [u8], &'a ResponseHead),
    Http2(&'a http::response::Parts),
}

impl Fetched<'_> {
    fn status(&self) -> u16 {
        match self {
            Fetched::Http1(_, resp) => resp.status,
            Fetched::Http2(parts) => parts.status.as_u16(),
        }
    }

    /// The body's length, when the head says it.
    fn length(&self) -> Option<u64> {
        match self {
            Fetched::Http1(_, resp) => resp.framing.length(),
            Fetched::Http2(parts) => crate::forward::h2::content_length(parts),
        }
    }

    /// The body's pieces carry chunk framing (an HTTP/1.1 chunked body, not decoded).
    fn chunked(&self) -> bool {
        matches!(self, Fetched::Http1(_, resp) if resp.framing == BodyFraming::Chunked)
    }

    /// The response as the policy reads it: its status and end-to-end fields. `None`: a
    /// field that is not valid HTTP/1.1 (the `h2` crate lets a name such as `x"y` through:
    /// stored, every hit's head, parsed again as HTTP/1.1, would fail).
    fn head(&self) -> Option<http::Response<()>> {
        let mut head = self.end_to_end()?;
        // What was for this hop of the exchange only: never in a reply from the store.
        for name in ["trailer", "proxy-authenticate", "proxy-authentication-info"] {
            head.headers_mut().remove(name);
        }
        directives::normalise(head.headers_mut());
        Some(head)
    }

    fn end_to_end(&self) -> Option<http::Response<()>> {
        match self {
            Fetched::Http1(buf, resp) => response_parts(buf, resp),
            Fetched::Http2(parts) if !crate::forward::h2::names_are_tokens(&parts.headers) => None,
            Fetched::Http2(parts) => {
                let mut head = http::Response::new(());
                *head.status_mut() = parts.status;
                let fields = parts.headers.iter();
                let end_to_end = fields.filter(|(n, _)| !is_connection_specific(n));
                head.headers_mut()
                    .extend(end_to_end.map(|(n, v)| (n.clone(), v.clone())));
                Some(head)
            }
        }
    }
}

/// The fields a reply from the store adds to the stored ones (`Age`, `Cache-Status`,
/// `Content-Length`, `Content-Range`), with room to spare.
const REPLY_ADDS: usize = 8;

/// Whether a reply from an entry with the stored fields `headers` stays within the fields
/// a reply head may have (it is parsed again as it is sent): else it is not stored, as
/// every hit of it would fail.
fn fits_reply(headers: &HeaderMap) -> bool {
    headers.len() + REPLY_ADDS <= crate::codec::http1::response::MAX_RESPONSE_HEADERS
}

/// Whether the response `head`'s `Content-Encoding` is one its variant covers, when it
/// varies on `Accept-Encoding`: identity, or the one coding the request's normalised
/// `Accept-Encoding` (in `request`) names. The client's own `Accept-Encoding` goes
/// upstream, so the upstream may pick a coding the variant does not name (zstd, deflate,
/// gzip for the `br` variant): stored, it would be served to clients of that variant that
/// cannot decode it. (A response that does not vary on it says it is for every client.)
fn coding_fits_variant(request: &HeaderMap, head: &http::Response<()>) -> bool {
    let vary = head.headers().get_all(http::header::VARY).iter();
    let names = vary.flat_map(|v| v.as_bytes().split(|b| *b == b','));
    if !names
        .map(<[u8]>::trim_ascii)
        .any(|n| n.eq_ignore_ascii_case(b"accept-encoding"))
    {
        return true;
    }
    let variant = request.get(http::header::ACCEPT_ENCODING);
    let fields = head
        .headers()
        .get_all(http::header::CONTENT_ENCODING)
        .iter();
    let mut codings = fields
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case(b"identity"));
    match (codings.next(), codings.next()) {
        (None, _) => true,
        (Some(coding), None) => variant.is_some_and(|v| coding.eq_ignore_ascii_case(v.as_bytes())),
        (Some(_), Some(_)) => false,
    }
}

/// Whether the response with the fields `headers` varies (`Vary`) on any of the request
/// fields `rewritten` (folded names): the variant would be chosen by the client's copy,
/// which is not what the upstream saw (Weir wrote its own), so a response made for one
/// client's `X-Real-IP` would be a hit for every other. Such a response is not stored.
/// (The client-certificate field is instead matched as Weir forwards it: `request_parts`.)
fn varies_on(headers: &HeaderMap, rewritten: &[Box<str>]) -> bool {
    let vary = headers.get_all(http::header::VARY).iter();
    let names = vary.flat_map(|v| v.as_bytes().split(|b| *b == b','));
    names.map(<[u8]>::trim_ascii).any(|name| {
        rewritten.iter().any(|r| {
            let fold = |b: &u8| weir_config::fold_name_byte(*b);
            r.len() == name.len() && name.iter().map(fold).eq(r.bytes())
        })
    })
}

/// The response `resp` (its head in `buf`) as the policy reads it: its end-to-end fields.
fn response_parts(buf: &[u8], resp: &ResponseHead) -> Option<http::Response<()>> {
    let mut head = http::Response::new(());
    *head.status_mut() = http::StatusCode::from_u16(resp.status).ok()?;
    let headers = head.headers_mut();
    for h in resp
        .headers
        .iter()
        .filter(|h| !h.kind.is_hop_by_hop() && !h.connection_listed)
    {
        let name = HeaderName::from_bytes(&buf[h.name.clone()]).ok()?;
        let value = HeaderValue::from_bytes(&buf[h.value.clone()]).ok()?;
        headers.append(name, value);
    }
    Some(head)
}

/// Which variant of its key a response is: the route's `scope`, then the values of the
/// request fields `response` varies on, joined.
fn variant(scope: &[u8], request: &HeaderMap, response: &HeaderMap) -> Vec<u8> {
    let mut out = scope.to_vec();
    let names = response.get_all(http::header::VARY).iter();
    for name in names
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
    {
        let name = name.trim().to_ascii_lowercase();
        out.extend_from_slice(name.as_bytes());
        out.push(b'=');
        for value in request.get_all(name.as_str()) {
            out.extend_from_slice(value.as_bytes());
        }
        out.push(0);
    }
    out
}

/// A copy of a response's body on its way to the client, stored once it is complete.
pub struct Recorder {
    fill: Fill,
    /// The response's status and end-to-end fields.
    head: http::response::Parts,
    /// The request's fields its policy keeps (counted in the entry's size).
    request: HeaderMap,
    policy: CachePolicy,
    variant: Vec<u8>,
    /// The bytes as the upstream framed them (chunks decoded when stored).
    body: Vec<u8>,
    chunked: bool,
    limit: u64,
    /// The body's length, when the head says it: its room never grows past it.
    expected: Option<u64>,
    /// The body's room, counted against the store's `max_fill_memory`.
    memory: FillMemory,
    /// The body passed `max_object_size`, or its room would have passed the store's
    /// `max_fill_memory`: it streams on, uncached.
    over: bool,
}

impl Recorder {
    /// Keeps a piece of the body.
    pub fn record(&mut self, piece: &[u8]) {
        if self.over {
            return;
        }
        let len = self.body.len() + piece.len();
        // Framed bytes past the limit: a body past it whatever the framing (a chunked
        // body's framing takes at most this much more, with chunks of a byte or more).
        let past = match self.chunked {
            true => self.limit.saturating_mul(2).saturating_add(4096),
            false => self.limit,
        };
        if len as u64 > past {
            self.abandon();
            return;
        }
        if len > self.body.capacity() && !self.make_room(len) {
            self.memory
                .store()
                .counts
                .fills_abandoned
                .fetch_add(1, Relaxed);
            self.abandon();
            return;
        }
        self.body.extend_from_slice(piece);
    }

    /// Grows the body's room to hold `len` bytes, if the store's fills stay within its
    /// `max_fill_memory`: doubling (a few atomic adds for a whole body), never past the
    /// length the head said, then exactly `len` if the double does not fit.
    fn make_room(&mut self, len: usize) -> bool {
        let room = self.body.capacity();
        let double = (len as u64).max(2 * room as u64).max(4096);
        let target = self
            .expected
            .map_or(double, |e| double.min(e.max(len as u64)));
        for want in [target, len as u64] {
            if self.memory.grow(want - room as u64) {
                self.body.reserve_exact(want as usize - self.body.len());
                return true;
            }
        }
        false
    }

    /// Drops what was kept: the rest of the body streams to the client alone. The
    /// requests waiting for this fetch of the key are let go now (they go upstream
    /// themselves), not once this response ends: it will store nothing, and a slow
    /// client would keep them waiting up to `lock_timeout` for it.
    fn abandon(&mut self) {
        self.over = true;
        self.body = Vec::new();
        self.memory.release();
        if self.fill.leading.replace(false) {
            self.fill.store.release(&self.fill.key, &self.fill.scope);
        }
    }

    /// Ends a chunked body passed through whose trailer section was held back (the
    /// section is not stored; the blank line that ends the body is).
    pub fn end_chunks(&mut self) {
        if self.chunked {
            self.record(b"\r\n");
        }
    }

    /// The body passed what may be stored: the rest is for the client alone.
    pub fn is_over(&self) -> bool {
        self.over
    }

    /// Stores the entry whose whole body is `body` (it came with the head).
    pub fn finish_with(mut self, body: &[u8]) {
        self.record(body);
        self.finish();
    }

    /// Stores the entry: the body was relayed to its end.
    pub fn finish(mut self) {
        let store = self.fill.store.clone();
        let body = match self.chunked {
            true => dechunk(self.body),
            false => Some(self.body),
        };
        let Some(body) = body.filter(|b| !self.over && b.len() as u64 <= self.limit) else {
            store.counts.bypasses.fetch_add(1, Relaxed);
            return;
        };
        let body_len = body.len() as u64;
        let index = index_cost(&self.fill, &self.variant, &self.head.headers, &self.request);
        let now = SystemTime::now();
        let entry = Entry {
            staleness: Staleness::of(&self.policy, &self.head.headers, now),
            status: self.head.status,
            headers: self.head.headers,
            policy: self.policy,
            body: Body::Memory(Bytes::from(body)),
            variant: self.variant,
            size: body_len + index,
            index,
            checked: store::Checked::new(true),
        };
        // A disk store has the entry once its file is written: the requests waiting for
        // this fetch are let go then, so that they find it; the fill's memory is let go
        // then too.
        let release = (self.fill.leading.replace(false)).then(|| self.fill.scope.clone());
        let key = std::mem::take(&mut self.fill.key);
        store.put_holding(key, entry, release, Some(self.memory));
    }
}

/// A chunked body's data; `None` if its framing is bad.
fn dechunk(mut raw: Vec<u8>) -> Option<Vec<u8>> {
    let mut state = BodyState::new(BodyFraming::Chunked, true, None);
    let mut out = Vec::with_capacity(raw.len());
    let mut at = 0;
    while !state.is_done() && at < raw.len() {
        let (forward, used) = state.take(&mut raw[at..]).ok()?;
        out.extend_from_slice(&raw[at..at + forward]);
        if used == 0 {
            return None;
        }
        at += used;
    }
    state.is_done().then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunked_body_is_stored_decoded() {
        let raw = b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n".to_vec();
        assert_eq!(dechunk(raw).unwrap(), b"hello world");
        assert!(dechunk(b"5\r\nhel".to_vec()).is_none());
    }
}
