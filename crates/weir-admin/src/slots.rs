//! The admin listener's open connections, held against `[admin] max_connections`.
//!
//! A plain cap that refuses newcomers lets any client holding `max_connections` silent or
//! idle connections keep out Kubernetes' `/live` and `/ready` probes (the pod is then
//! restarted). So at the cap the newcomer takes the place of the connection idle longest,
//! the one whose last step forward (its accept, or the end of its last request) is the
//! oldest, which is closed ([`Clock::evict`]). A connection handling a request is held out
//! of the line until its response is ready; the newcomer is refused only when every
//! connection is handling one. This is the data plane's order for TLS handshakes
//! (`weir_core::evict`, which says why): a probe is the freshest connection from its first
//! byte, so an attacker must open `max_connections` new connections within the probe's
//! round trip to push it out, not merely hold them.
//!
//! Two things keep connections from being held that way: a request counts as handled
//! only once its body has arrived (until then the connection is in its head's time,
//! `header_timeout`, and evictable), and at most [`api_share`] of the cap handle API
//! requests at once (one waiting for a reload to finish is held): the rest is kept for
//! `/live`, `/ready` and `/metrics`, and an API request over the share gets a 503.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use weir_core::evict::{Admitted, EvictionTable, Key};

use crate::conn::{BusyGuard, Clock};

/// The open connections, idlest first.
#[derive(Default)]
pub struct Slots {
    open: Mutex<EvictionTable<Arc<Clock>>>,
    /// Connections handling an API request now.
    api: AtomicUsize,
}

/// How many of `max_connections` admin connections may handle API requests at once: three
/// quarters, rounded down, and at least one. The rest (at least one connection from two
/// on) cannot be held by API requests, so a probe always finds a connection to take the
/// place of; with `max_connections = 1` nothing can be kept for it.
pub fn api_share(max_connections: usize) -> usize {
    (max_connections - max_connections.div_ceil(4)).max(1)
}

/// How a new connection was let in.
pub enum Admission {
    /// A slot was free.
    Free(Slot),
    /// An idle or silent connection was closed to make room.
    Evicted(Slot),
    /// Every connection is handling a request: close the newcomer.
    Full,
}

impl Slots {
    /// Admits a new connection whose phases `clock` follows, under a cap of `max` (more
    /// than one connection goes when a reload lowered the cap).
    pub fn admit(self: &Arc<Slots>, clock: &Arc<Clock>, max: usize) -> Admission {
        let admitted = self
            .lock()
            .admit(max, clock.clone(), |victim| victim.evict());
        let slot = |key| Slot {
            slots: self.clone(),
            key,
            clock: clock.clone(),
        };
        match admitted {
            Admitted::Free(key) => Admission::Free(slot(key)),
            Admitted::Evicted(key) => Admission::Evicted(slot(key)),
            Admitted::Full => Admission::Full,
        }
    }

    fn lock(&self) -> MutexGuard<'_, EvictionTable<Arc<Clock>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One open admin connection, counted against the cap until dropped (or evicted).
pub struct Slot {
    slots: Arc<Slots>,
    key: Key,
    clock: Arc<Clock>,
}

impl Slot {
    /// Marks a request as being handled until the guard drops (the response is ready): the
    /// connection cannot be evicted meanwhile, and is the freshest one afterwards.
    pub fn busy(self: &Arc<Slot>) -> Handling {
        self.slots.lock().hold(self.key);
        Handling {
            slot: self.clone(),
            _phase: self.clock.busy(),
            api: false,
        }
    }

    /// The request's head has arrived and its body is being read: no deadline of the
    /// connection's own (the reader has one), but not held either: it can be evicted.
    pub fn reading_body(&self) {
        self.clock.reading_body();
    }

    /// [`Slot::busy`] for an API request, if fewer than `max` are being handled; `None`:
    /// the API's share of the connections is taken (see [`api_share`]).
    pub fn busy_api(self: &Arc<Slot>, max: usize) -> Option<Handling> {
        let api = &self.slots.api;
        let taken = api.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        });
        taken.ok()?;
        let mut handling = self.busy();
        handling.api = true;
        Some(handling)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.lock().remove(self.key);
    }
}

/// A request being handled on a connection (see [`Slot::busy`]).
pub struct Handling {
    slot: Arc<Slot>,
    _phase: BusyGuard,
    /// Counted in `Slots::api`.
    api: bool,
}

impl Drop for Handling {
    fn drop(&mut self) {
        if self.api {
            self.slot.slots.api.fetch_sub(1, Ordering::AcqRel);
        }
        self.slot.slots.lock().progressed(self.slot.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(a: Admission) -> Option<(Arc<Slot>, bool)> {
        match a {
            Admission::Free(s) => Some((Arc::new(s), false)),
            Admission::Evicted(s) => Some((Arc::new(s), true)),
            Admission::Full => None,
        }
    }

    #[tokio::test]
    async fn the_idlest_connection_makes_room_and_a_served_request_is_a_step() {
        let slots = Arc::new(Slots::default());
        let clocks: Vec<_> = (0..3).map(|_| Clock::new()).collect();
        let mut held: Vec<_> = clocks
            .iter()
            .map(|c| admitted(slots.admit(c, 3)).unwrap())
            .collect();
        assert!(held.iter().all(|(_, evicted)| !evicted));
        // 0 has just been served (a step: now the freshest); 1 is handling a request
        // (held); 2 never sent a byte: it is the idlest.
        drop(held[0].0.busy());
        let _busy = held[1].0.busy();
        let newcomer = Clock::new();
        let (newcomer_slot, evicted) = admitted(slots.admit(&newcomer, 3)).unwrap();
        assert!(evicted);
        assert!(clocks[2].is_evicted(), "the silent one goes first");
        assert!(!clocks[0].is_evicted());
        // Next: 0, idle since its request, before the newcomer, which arrived after it.
        let (_third, evicted) = admitted(slots.admit(&Clock::new(), 3)).unwrap();
        assert!(evicted && clocks[0].is_evicted() && !newcomer.is_evicted());
        // A dropped slot frees its place.
        drop(newcomer_slot);
        assert!(matches!(slots.admit(&Clock::new(), 3), Admission::Free(_)));
        held.clear();
    }

    #[tokio::test]
    async fn api_requests_hold_at_most_their_share_and_probes_find_room() {
        let slots = Arc::new(Slots::default());
        let max = 4;
        assert_eq!(api_share(max), 3);
        assert_eq!(api_share(1), 1);
        // From two connections on, at least one is kept for the probes.
        assert_eq!((api_share(2), api_share(3), api_share(64)), (1, 2, 48));
        let conns: Vec<_> = (0..max)
            .map(|_| admitted(slots.admit(&Clock::new(), max)).unwrap().0)
            .collect();
        let api: Vec<_> = conns[..3]
            .iter()
            .map(|s| s.busy_api(api_share(max)).expect("within the share"))
            .collect();
        assert!(
            conns[3].busy_api(api_share(max)).is_none(),
            "over the share"
        );
        // The fourth connection is not held: a probe takes its place.
        assert!(matches!(
            slots.admit(&Clock::new(), max),
            Admission::Evicted(_)
        ));
        drop(api);
        assert!(conns[3].busy_api(api_share(max)).is_some(), "a place freed");
    }

    #[tokio::test]
    async fn full_when_every_connection_is_busy() {
        let slots = Arc::new(Slots::default());
        let clock = Clock::new();
        let (slot, _) = admitted(slots.admit(&clock, 1)).unwrap();
        let busy = slot.busy();
        assert!(matches!(slots.admit(&Clock::new(), 1), Admission::Full));
        drop(busy);
        assert!(matches!(
            slots.admit(&Clock::new(), 1),
            Admission::Evicted(_)
        ));
    }
}
