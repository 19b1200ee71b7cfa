//! A watch: the gateway's `/v3/watch` answers one request with a stream of JSON objects,
//! one per watch response, for as long as the connection lasts.

use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value as Json;

use super::{header_revision, kv, num, EtcdError, Kv};

/// One change of a watched key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Put(Kv),
    Delete { key: String, revision: i64 },
}

/// What a watch said.
#[derive(Debug)]
pub enum WatchMessage {
    /// The watch is in place, at `revision`.
    Created { revision: i64 },
    /// Changes, all of revisions up to `revision`.
    Events { revision: i64, events: Vec<Event> },
    /// The start revision was compacted away: list again, then watch from there.
    Compacted { compact_revision: i64 },
}

pub struct Watch {
    body: Incoming,
    buf: Vec<u8>,
    endpoint: String,
}

impl Watch {
    pub(super) fn new(body: Incoming, endpoint: String) -> Watch {
        Watch {
            body,
            buf: Vec::new(),
            endpoint,
        }
    }

    /// The member this watch is on.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The next message; an error when the stream ends or breaks (watch again).
    pub async fn next(&mut self) -> Result<WatchMessage, EtcdError> {
        loop {
            if let Some(value) = self.take_value()? {
                if let Some(message) = message(&value)? {
                    return Ok(message);
                }
                continue;
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    return Err(EtcdError::Unreachable(format!(
                        "{}: watch broke: {e}",
                        self.endpoint
                    )))
                }
                None => {
                    return Err(EtcdError::Unreachable(format!(
                        "{}: watch ended",
                        self.endpoint
                    )))
                }
            }
        }
    }

    /// A message that has arrived already, without waiting for more.
    pub fn buffered(&mut self) -> Option<Result<WatchMessage, EtcdError>> {
        loop {
            match self.take_value() {
                Ok(Some(value)) => match message(&value) {
                    Ok(Some(m)) => return Some(Ok(m)),
                    Ok(None) => continue,
                    Err(e) => return Some(Err(e)),
                },
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// The first whole JSON value in the buffer, removed from it.
    fn take_value(&mut self) -> Result<Option<Json>, EtcdError> {
        let mut values = serde_json::Deserializer::from_slice(&self.buf).into_iter::<Json>();
        match values.next() {
            None => {
                self.buf.clear();
                Ok(None)
            }
            Some(Ok(value)) => {
                let used = values.byte_offset();
                self.buf.drain(..used);
                Ok(Some(value))
            }
            Some(Err(e)) if e.is_eof() => Ok(None),
            Some(Err(e)) => Err(EtcdError::Refused(format!(
                "{}: watch sent {e}",
                self.endpoint
            ))),
        }
    }
}

/// A gateway object as a message; `None` for one that says nothing new (progress).
fn message(value: &Json) -> Result<Option<WatchMessage>, EtcdError> {
    if let Some(error) = value.get("error") {
        let text = error["message"].as_str().unwrap_or("watch failed");
        return Err(EtcdError::Unreachable(text.to_owned()));
    }
    let result = &value["result"];
    let compact_revision = num(&result["compact_revision"]);
    if compact_revision > 0 {
        return Ok(Some(WatchMessage::Compacted { compact_revision }));
    }
    if result["canceled"].as_bool() == Some(true) {
        let reason = result["cancel_reason"].as_str().unwrap_or("canceled");
        return Err(EtcdError::Refused(format!("watch canceled: {reason}")));
    }
    let revision = header_revision(result);
    if result["created"].as_bool() == Some(true) {
        return Ok(Some(WatchMessage::Created { revision }));
    }
    let events: Vec<Event> = result["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(event)
        .collect();
    Ok((!events.is_empty()).then_some(WatchMessage::Events { revision, events }))
}

fn event(e: &Json) -> Option<Event> {
    let kv = kv(&e["kv"])?;
    Some(match e["type"].as_str() {
        Some("DELETE") => Event::Delete {
            key: kv.key,
            revision: kv.mod_revision,
        },
        _ => Event::Put(kv),
    })
}
