//! A cache miss's step shared by every client protocol: the stale entry that answers for
//! a failure ([`stale_answer`]).

use crate::cache::{Cause, Fill};
use crate::files::Reply;
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
