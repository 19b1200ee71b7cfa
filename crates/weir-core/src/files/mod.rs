//! Static files (a route's `files`, issue 27): a response source that is not an upstream.
//!
//! The routing decision (`proxy::route`) asks the route's [`FileServer`] for the request
//! ([`FileServer::lookup`]): the path is made plain (`path`), opened beneath the root
//! (`resolve`, through the worker's open-file cache, `cache`), tried as `try_files` says;
//! its conditions and range are weighed (`http`), and the answer is a [`Reply`]: an
//! HTTP/1.1 head, as an upstream would have sent it, and a body (`body`). Or, when no file
//! answers and the route has an `upstream`, the request goes there
//! ([`Lookup::Upstream`]). The client adapters then send a reply as they send an
//! upstream's response (`reply`): the same `forward::head::Edits` (`response_headers`,
//! compression) on the head, the same `forward::relay` for the body, so every client
//! protocol gets it; plain-TCP HTTP/1.1 bodies past `sendfile_min_size` go out with
//! sendfile(2).

mod body;
pub(crate) mod cache;
pub(crate) mod head;
pub(crate) mod http;
mod listing;
mod lookup;
mod path;
mod reply;
mod resolve;

use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use weir_config::Files;

pub(crate) use body::{Body, BodySource, Data, Part, PIECE};
pub(crate) use reply::{respond_http1, send_http1, Under};

/// A route's `files`, prepared with its snapshot: the config and the open root.
#[derive(Debug)]
pub struct FileServer {
    pub config: Files,
    /// Tells this server's entries apart in the workers' open-file caches (a reload makes
    /// new servers, whose files may differ).
    id: u64,
    /// The open root, or why it could not be opened (every request then gets 404).
    root: Result<resolve::Root, String>,
}

impl FileServer {
    pub fn new(config: &Files) -> FileServer {
        static IDS: AtomicU64 = AtomicU64::new(1);
        let root = resolve::Root::open(&config.root, config.follow_symlinks).map_err(|e| {
            tracing::warn!(root = %config.root.display(), error = %e, "files: cannot open the root; its route answers 404");
            e.to_string()
        });
        FileServer {
            config: config.clone(),
            id: IDS.fetch_add(1, Ordering::Relaxed),
            root,
        }
    }
}

/// What the files say about a request.
pub enum Lookup {
    /// Answered from the files (or refused: 404, 405, 304, 416, ...).
    Reply(Reply),
    /// No file answers: the route's upstream (its index) takes the request.
    Upstream(usize),
}

/// A response from a source that is not an upstream: the files, or a cache entry
/// (`cache::Hit::reply`). Its HTTP/1.1 head (status line, fields, `Content-Length`, the
/// blank line), as an upstream would send it, and its body; sent as an upstream's
/// response is ([`respond_http1`], `http2::files::respond_stream`).
pub struct Reply {
    pub(crate) head: Vec<u8>,
    pub(crate) body: Body,
    /// Plain-TCP HTTP/1.1 bodies of a file at least this long go out with sendfile(2).
    pub(crate) sendfile_min_size: u64,
    /// What the cache did, for a reply from a cache entry (the access log's `cache`).
    pub(crate) cache: Option<crate::cache::CacheResult>,
    /// A `304` (from a cache entry or the files): the head of the `200` it stands for,
    /// which the route's compression plan is made from ([`Reply::plan`]).
    pub(crate) planned_as: Option<Box<[u8]>>,
}

impl Reply {
    /// The route's compression plan for this reply (its head `head`, parsed as `resp`). A
    /// `304` (from a cache entry or the files) is planned as the `200` it stands for: its
    /// `ETag` is that 200's (weakened only when the 200 is compressed), though it has no
    /// `Content-Type` or length to weigh.
    pub(crate) fn plan(
        &self,
        route: &weir_config::Route,
        head: &[u8],
        resp: &crate::codec::http1::ResponseHead,
        is_head: bool,
        accepted: Option<weir_config::Encoding>,
    ) -> crate::filters::compression::Plan {
        use crate::forward::head::plan_http1;
        let Some(full) = self.planned_as.as_deref() else {
            return plan_http1(route, head, resp, is_head, accepted);
        };
        let mut as_200 = crate::codec::http1::ResponseHead::default();
        // Weir wrote this head itself: it always parses.
        match crate::codec::http1::parse_response(full, full.len(), is_head, &mut as_200) {
            Ok(true) => crate::filters::compression::Plan {
                encoding: None,
                ..plan_http1(route, full, &as_200, is_head, accepted)
            },
            _ => plan_http1(route, head, resp, is_head, accepted),
        }
    }
}

/// An open file and the path it was found at (for a sibling's name and the listing).
pub(crate) type Opened = Rc<cache::OpenFile>;
