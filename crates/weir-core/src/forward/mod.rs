//! Forwarding one request to an upstream server and its response back to the client.
//!
//! `forward` is the exchange: pick a server, write the request head (and whatever body is
//! already buffered), stream the rest of the body while waiting for the response head,
//! relay 1xx, then write the response head and stream the body back. It decides whether
//! each side's connection can be kept, and retries once on a fresh connection when a pooled
//! one turns out dead and replaying is safe.

pub mod body;
pub(crate) mod exchange;
pub mod request_head;
pub mod response_head;
mod to_h2;
pub(crate) mod tunnel;

pub use exchange::{forward, Target};

/// The route, the upstream it chose (index, config and pool plan, all from `snapshot`) and
/// the listener limits an exchange runs under (`listener_index`: its index in `snapshot`).
pub fn exchange_target<'a>(
    (listener, listener_index): (&'a weir_config::Listener, usize),
    route: &'a weir_config::Route,
    snapshot: &'a crate::snapshot::Snapshot,
    upstream_index: usize,
) -> Target<'a> {
    let slots = snapshot.slots.listeners.get(listener_index);
    Target {
        listener,
        listener_slot: slots.map_or(usize::MAX, |s| s.slot),
        route,
        upstream: &snapshot.config.upstreams[upstream_index],
        upstream_index,
        pool: &snapshot.upstreams[upstream_index],
    }
}

use crate::error::ProxyError;

/// How far the response to the client got when a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reached {
    /// Nothing was sent: Weir answers with the error's status.
    Nothing,
    /// Only 1xx responses were sent. A final response may still follow them, so Weir still
    /// answers; but the request is not replayed on another server.
    Interim,
    /// The final response head was sent (or its write began): the response is cut short,
    /// the connection closes, and the request counts with that head's status plus an
    /// abort reason (`weir_responses_aborted_total`, the access log's `aborted`).
    Head,
}

/// A failed exchange: what went wrong and how far the response had got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    pub error: ProxyError,
    pub reached: Reached,
}

impl Failure {
    /// A failure once the final response head was being sent.
    pub fn after_head(error: ProxyError) -> Failure {
        Failure {
            error,
            reached: Reached::Head,
        }
    }
}

impl From<ProxyError> for Failure {
    fn from(error: ProxyError) -> Failure {
        Failure {
            error,
            reached: Reached::Nothing,
        }
    }
}
