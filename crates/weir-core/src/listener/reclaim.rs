//! At a listener's `max_connections`, a new connection takes the place of an idle
//! one, as nginx reuses its idle connections when it runs out of `worker_connections`,
//! instead of waiting in the backlog behind connections that do nothing (issue 24: idle
//! sockets, however many the cap allows, must not lock ready clients out).
//!
//! Idle (`places`): waiting for the first byte of a first request or of the next
//! keep-alive request, an HTTP/2 connection with no stream open, a TLS handshake in
//! progress. Never a connection in the middle of a request or response, a tunnel, or an
//! HTTP/2 connection with a stream open. A connection that has sent part of a request head
//! is not idle either (nginx takes a connection out of its reusable queue at its first
//! request byte): closing it would lose a request a slow client is still sending, and
//! `header_timeout` already bounds it. A TLS handshake in progress, even one that sent
//! half a ClientHello, is idle: `max_handshakes` already lets newcomers evict it (see
//! `crate::evict` for why bytes that are not a step buy no time), and no request is lost.
//! On a TCP listener, idle is a connection that has not started relaying (`tcp::serve_tcp`:
//! waiting for its PROXY header or its ClientHello, or in its TLS handshake); a relaying
//! one never is.
//!
//! The connection closed is the idlest of its worker's (the oldest last step: the end of
//! its last response, its accept, its whole ClientHello), so a ready client, whose place
//! is the freshest from its first byte, is pushed out only if the cap's worth of
//! connections arrive within its round trip: a flood, not idle sockets.
//!
//! How, with the cap counted for the listener across workers and the idle connections on
//! each worker's own task set: the accept loop takes the newcomer even at the cap, then
//! closes the idlest connection of the listener on its own worker (thread-local, O(1)),
//! and waits for that close to free a place. When its worker has none, it asks the others
//! (`ConnectionCap::ask`: a lock and a notify, at the cap only) and each worker's
//! [`answer_asks`] task, which has an idle connection, takes the ask and closes one. The
//! newcomer takes the place of whichever close comes first: the cap stays exact. Only the
//! accept path at the cap crosses threads; a connection entering or leaving idle touches
//! its own worker's `places` only. With nothing idle anywhere the accept loop pauses
//! (`weir_accept_paused_total`), the ask open, so the first connection to go idle on any
//! worker is closed for the newcomer.
//!
//! A listener's QUIC endpoint (`http3::endpoint`) holds a newcomer at the cap the same way
//! ([`Reclaimer::asking`]): its idle HTTP/3 connections are in the same `places`, so either
//! transport's newcomer takes the place of either's idle connection. It answers no asks:
//! the TCP accept loops of its listener on the same worker do.

use std::future::poll_fn;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::task::JoinHandle;

use super::accept::tell_at_cap;
use super::backoff::ResourceLog;
use super::cap::{ListenerCap, Permit};
use super::StopSignal;
use crate::worker::Worker;

/// Ids of accept loops, for their asks.
static NEXT_ASKER: AtomicU64 = AtomicU64::new(0);

/// One accept loop's side of reclaiming: its asks, and its worker's answers to others'.
pub(crate) struct Reclaimer {
    /// The listener's metric slot and `max_connections`.
    slot: usize,
    asker: u64,
    log: ResourceLog,
    /// The task answering the other workers' asks (`None`: another loop of the listener
    /// on this worker answers them).
    answers: Option<JoinHandle<()>>,
}

impl Reclaimer {
    /// Starts answering the other workers' asks for the listener with slot `slot`.
    pub fn start(
        worker: &Rc<Worker>,
        slot: usize,
        cap: &ListenerCap,
        stop: &Rc<StopSignal>,
    ) -> Reclaimer {
        let answers = answer_asks(worker.clone(), slot, cap.clone(), stop.clone());
        let mut reclaimer = Reclaimer::asking(slot);
        reclaimer.answers = Some(tokio::task::spawn_local(answers));
        reclaimer
    }

    /// A reclaimer that only asks (a QUIC endpoint, whose listener's TCP accept loop on
    /// the same worker answers the asks).
    pub fn asking(slot: usize) -> Reclaimer {
        Reclaimer {
            slot,
            asker: NEXT_ASKER.fetch_add(1, Ordering::Relaxed),
            log: ResourceLog::default(),
            answers: None,
        }
    }

    /// A place under the cap for a connection accepted at it: an idle connection of this
    /// worker is closed for it, or else the other workers are asked to close one; the
    /// place is the first that a close frees. `None`: the worker drains or the listener
    /// stops first. Dropped unfinished (a QUIC newcomer that waited too long), it takes
    /// its ask back.
    pub async fn place_for(
        &mut self,
        worker: &Worker,
        cap: &ListenerCap,
        pause_log: &mut ResourceLog,
        stop: &StopSignal,
    ) -> Option<Permit> {
        let mut asked = None;
        loop {
            if let Some(permit) = cap.try_acquire() {
                return Some(permit);
            }
            if !evict_idlest(worker, self.slot, cap.limit(), &mut self.log) {
                // Again after an answer whose place another worker's newcomer took.
                cap.count.ask(self.asker);
                if asked.is_none() {
                    asked = Some(Ask(cap, self.asker));
                    let message = "listener at max_connections: pausing accepts until a worker has an idle connection to close or a connection closes";
                    tell_at_cap(
                        worker,
                        self.slot,
                        cap.limit(),
                        pause_log,
                        |m| &m.accept_paused,
                        message,
                    );
                }
            }
            tokio::select! {
                () = cap.wait_below(|| {}) => {}
                () = worker.drained() => return None,
                () = stop.stopped() => return None,
            }
        }
    }
}

impl Drop for Reclaimer {
    fn drop(&mut self) {
        if let Some(answers) = &self.answers {
            answers.abort();
        }
    }
}

/// An accept loop's open ask, taken back when its wait ends (however it ends).
struct Ask<'a>(&'a ListenerCap, u64);

impl Drop for Ask<'_> {
    fn drop(&mut self) {
        self.0.count.withdraw(self.1);
    }
}

/// Closes an idle connection of the listener with slot `slot` on this worker whenever
/// another worker (or this one's accept loop) asks for one and this worker has one.
async fn answer_asks(worker: Rc<Worker>, slot: usize, cap: ListenerCap, stop: Rc<StopSignal>) {
    let mut log = ResourceLog::default();
    let answer = async {
        loop {
            cap.count.asked().await;
            poll_fn(|cx| poll_idle(&worker, slot, cx)).await;
            // Nothing runs between the look and the eviction: the idle connection is there.
            if cap.count.take_ask() {
                evict_idlest(&worker, slot, cap.limit(), &mut log);
            }
            // Many asks at once: let the connections closed meanwhile run.
            tokio::task::coop::consume_budget().await;
        }
    };
    tokio::select! {
        () = answer => {}
        () = worker.drained() => {}
        () = stop.stopped() => {}
    }
}

/// Ready once this worker has an idle connection of the listener (or a handshake in
/// progress); else `cx` is woken when one enters.
fn poll_idle(worker: &Worker, slot: usize, cx: &mut Context<'_>) -> Poll<()> {
    // Both polled: each must know to wake `cx`.
    let idle = worker.idle.poll_occupied(slot, cx);
    let handshakes = worker.handshakes.poll_occupied(slot, cx);
    if idle.is_ready() || handshakes.is_ready() {
        Poll::Ready(())
    } else {
        Poll::Pending
    }
}

/// Closes the idlest connection of the listener (metric slot `slot`, `max_connections`
/// `limit`) on this worker, waiting for a request or in its TLS handshake, counted in
/// `weir_connections_evicted_total` and logged (at most once a second); false if there is
/// none.
fn evict_idlest(worker: &Worker, slot: usize, limit: usize, log: &mut ResourceLog) -> bool {
    let (idle, handshakes) = (&worker.idle, &worker.handshakes);
    let from = match (idle.oldest(slot), handshakes.oldest(slot)) {
        (Some(i), Some(h)) if h < i => handshakes,
        (Some(_), _) => idle,
        (None, Some(_)) => handshakes,
        (None, None) => return false,
    };
    from.evict_oldest(slot);
    let message = "listener at max_connections: closing idle connections for new ones";
    tell_at_cap(
        worker,
        slot,
        limit,
        log,
        |m| &m.connections_evicted,
        message,
    );
    true
}
