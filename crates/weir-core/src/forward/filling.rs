//! What an HTTP/1.1 exchange's response is stored by: nothing ([`NoFill`], a route without
//! `cache`), or a cache miss's [`Fill`]. The response half is generic over it, so that a
//! route without `cache` compiles to an exchange without any of the cache's steps (each
//! [`NoFill`] step is a constant the compiler removes) while both share one path.

use std::convert::Infallible;

use crate::cache::{Cause, Fetched, Fill, Recorder};
use crate::codec::http1::ResponseHead;
use crate::files::Reply;
use crate::forward::relay::{relay, Broke, Coding, Recording, Sink, Source};
use crate::forward::{Failure, Reached};

/// The stale entry of a cache miss's `fill` that answers for `failure`, for a client of
/// any protocol: only when nothing was sent yet and the entry may answer for its cause
/// (`stale-if-error`, `serve_stale_on`).
pub(crate) fn stale_answer(fill: &Fill, failure: &Failure) -> Option<Reply> {
    if failure.reached != Reached::Nothing {
        return None;
    }
    fill.stale_answer(Cause::of(failure.error)?)
}

/// What stores a response, or answers instead of it.
pub(crate) trait Filling {
    /// What keeps the body on its way to the client.
    type Recorder: Record;

    /// The stored entry that answers instead of `resp` (its head in `buf`), if any.
    fn answer_instead(&self, buf: &[u8], resp: &ResponseHead) -> Option<Reply>;

    /// The `Cache-Status` line the response gets, if any.
    fn status_line(&self) -> Option<&'static [u8]>;

    /// The recorder of `resp` (its head in `buf`), if it may be stored; `dechunk`: its
    /// body's pieces come decoded.
    fn admit(self, buf: &[u8], resp: &ResponseHead, dechunk: bool) -> Option<Self::Recorder>;
}

/// A copy of a body on its way to the client (a [`Recorder`]'s steps).
pub(crate) trait Record {
    /// Keeps a piece of the body.
    fn record(&mut self, piece: &[u8]);
    /// The body passed what may be stored.
    fn is_over(&self) -> bool;
    /// Stores the entry whose whole body is `body`.
    fn finish_with(self, body: &[u8]);
    /// Stores the entry: the body was relayed to its end.
    fn finish(self);
}

/// A route without `cache`: nothing is stored, nothing answers instead.
pub(crate) struct NoFill;

impl Filling for NoFill {
    type Recorder = Infallible;

    fn answer_instead(&self, _: &[u8], _: &ResponseHead) -> Option<Reply> {
        None
    }

    fn status_line(&self) -> Option<&'static [u8]> {
        None
    }

    fn admit(self, _: &[u8], _: &ResponseHead, _: bool) -> Option<Infallible> {
        None
    }
}

impl Filling for Box<Fill> {
    type Recorder = Box<Recorder>;

    fn answer_instead(&self, buf: &[u8], resp: &ResponseHead) -> Option<Reply> {
        Fill::answer_instead(self, Fetched::Http1(buf, resp), false)
    }

    fn status_line(&self) -> Option<&'static [u8]> {
        Fill::status_line(self)
    }

    fn admit(self, buf: &[u8], resp: &ResponseHead, dechunk: bool) -> Option<Box<Recorder>> {
        Fill::admit(*self, Fetched::Http1(buf, resp), dechunk)
    }
}

/// [`NoFill`]'s recorder: there is none.
impl Record for Infallible {
    fn record(&mut self, _: &[u8]) {
        match *self {}
    }

    fn is_over(&self) -> bool {
        match *self {}
    }

    fn finish_with(self, _: &[u8]) {
        match self {}
    }

    fn finish(self) {
        match self {}
    }
}

impl Record for Box<Recorder> {
    fn record(&mut self, piece: &[u8]) {
        Recorder::record(self, piece);
    }

    fn is_over(&self) -> bool {
        Recorder::is_over(self)
    }

    fn finish_with(self, body: &[u8]) {
        Recorder::finish_with(*self, body);
    }

    fn finish(self) {
        Recorder::finish(*self);
    }
}

/// Relays `source` into `sink` (through `coding`), a copy of each piece kept by `recorder`
/// when there is one (boxed then: a route without `cache` keeps the relay's state as
/// before).
pub(crate) async fn relay_recorded<S: Source, K: Sink, R: Record>(
    source: &mut S,
    sink: &mut K,
    coding: Option<&mut Coding>,
    recorder: Option<&mut R>,
) -> Result<(), Broke> {
    match recorder {
        None => relay(source, sink, coding).await,
        Some(recorder) => {
            let mut recording = Recording {
                inner: source,
                recorder,
                stop_when_over: false,
            };
            Box::pin(relay(&mut recording, sink, coding)).await
        }
    }
}
