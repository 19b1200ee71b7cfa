//! A watch: one gRPC stream of etcd watch responses, for as long as the connection lasts,
//! told as what the fleet acts on (created, changes, history compacted).

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use etcd_client::{EventType, WatchResponse, WatchStream};

use super::{kv, EtcdError, Kv};

/// One change of a watched key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Put(Kv),
    Delete { key: String, revision: i64 },
}

impl Event {
    /// The revision of the change.
    pub fn revision(&self) -> i64 {
        match self {
            Event::Put(kv) => kv.mod_revision,
            Event::Delete { revision, .. } => *revision,
        }
    }
}

/// What a watch said.
#[derive(Debug)]
pub enum WatchMessage {
    /// The watch is in place, at `revision`.
    Created { revision: i64 },
    /// Changes, in the order of their revisions (a view is complete up to the last's:
    /// [`crate::view::View::apply`]).
    Events(Vec<Event>),
    /// The start revision was compacted away: list again, then watch from there.
    Compacted { compact_revision: i64 },
}

pub struct Watch {
    /// Holds the request side open too: dropping it would end the watch.
    stream: WatchStream,
    /// A message [`Watch::buffered`] read that was not changes: [`Watch::next`] gives it.
    held: Option<Result<WatchMessage, EtcdError>>,
}

impl Watch {
    pub(super) fn new(stream: WatchStream) -> Watch {
        Watch { stream, held: None }
    }

    /// The next message; an error when the stream ends or breaks (watch again).
    pub async fn next(&mut self) -> Result<WatchMessage, EtcdError> {
        if let Some(held) = self.held.take() {
            return held;
        }
        loop {
            let response = self.stream.message().await;
            if let Some(message) = message(response).transpose() {
                return message;
            }
        }
    }

    /// Changes that have arrived already, without waiting for more. Anything else that
    /// has arrived is kept for [`Watch::next`].
    pub fn buffered(&mut self) -> Option<Result<WatchMessage, EtcdError>> {
        if self.held.is_some() {
            return None;
        }
        loop {
            // Polled once with a waker that does nothing: only what is there already.
            let mut cx = Context::from_waker(Waker::noop());
            let Poll::Ready(response) = pin!(self.stream.message()).poll(&mut cx) else {
                return None;
            };
            match message(response).transpose() {
                None => continue,
                Some(Ok(changes @ WatchMessage::Events(_))) => return Some(Ok(changes)),
                Some(other) => {
                    self.held = Some(other);
                    return None;
                }
            }
        }
    }
}

/// A response as a message; `None` for one that says nothing new (progress).
fn message(
    response: Result<Option<WatchResponse>, etcd_client::Error>,
) -> Result<Option<WatchMessage>, EtcdError> {
    let r = match response {
        Ok(Some(r)) => r,
        Ok(None) => return Err(EtcdError::Unreachable("watch ended".into())),
        Err(e) => return Err(EtcdError::Unreachable(format!("watch broke: {e}"))),
    };
    let compact_revision = r.compact_revision();
    if compact_revision > 0 {
        return Ok(Some(WatchMessage::Compacted { compact_revision }));
    }
    if r.canceled() {
        return Err(EtcdError::Refused(format!(
            "watch canceled: {}",
            r.cancel_reason()
        )));
    }
    if r.created() {
        let revision = r.header().map_or(0, |h| h.revision());
        return Ok(Some(WatchMessage::Created { revision }));
    }
    let events: Vec<Event> = r.events().iter().filter_map(event).collect();
    Ok((!events.is_empty()).then_some(WatchMessage::Events(events)))
}

fn event(e: &etcd_client::Event) -> Option<Event> {
    let kv = kv(e.kv()?)?;
    // etcd's event type is PUT or DELETE, the only two its protocol has.
    Some(match e.event_type() {
        EventType::Delete => Event::Delete {
            key: kv.key,
            revision: kv.mod_revision,
        },
        EventType::Put => Event::Put(kv),
    })
}
