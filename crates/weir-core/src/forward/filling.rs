//! A cache miss's steps shared by every client protocol: the stale entry that answers for
//! a failure ([`stale_answer`]), and a body relayed with the store's copy kept beside the
//! client's sink ([`relay_recorded`]).

use crate::cache::{Cause, Fill, Recorder};
use crate::files::Reply;
use crate::forward::relay::{relay, Broke, Coding, Recording, Sink, Source};
use crate::forward::{Failure, Reached};

/// The stale entry of a cache miss's `fill` (if still held) that answers for the
/// exchange's failure (`result`), for a client of any protocol: only when nothing was sent
/// yet and the entry may answer for its cause (`stale-if-error`, `serve_stale_on`).
pub(crate) fn stale_answer<T>(fill: Option<&Fill>, result: &Result<T, Failure>) -> Option<Reply> {
    match (fill, result) {
        (Some(fill), Err(failure)) if failure.reached == Reached::Nothing => {
            fill.stale_answer(Cause::of(failure.error)?)
        }
        _ => None,
    }
}

/// Relays `source` into `sink` (through `coding`), a copy of each piece kept by `recorder`
/// when there is one (boxed then: a route without `cache` keeps the relay's state as
/// before).
pub(crate) async fn relay_recorded<S: Source, K: Sink>(
    source: &mut S,
    sink: &mut K,
    coding: Option<&mut Coding>,
    recorder: Option<&mut Recorder>,
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
