//! The admin listener's open connections, held against `[admin] max_connections`.
//!
//! A plain cap that refuses newcomers lets any client holding `max_connections` silent or
//! idle connections keep out Kubernetes' `/live` and `/ready` probes (the pod is then
//! restarted). So at the cap the newcomer takes the slot of the oldest connection that has
//! not completed a request yet, else of the oldest one between requests, which is closed
//! ([`Clock::evict`]); the newcomer is refused only when every connection is handling a
//! request. Oldest first: an attacker's fresh connections push out its own older ones
//! before a probe that connected after them.

use std::sync::{Arc, Mutex};

use crate::conn::{Clock, Standing};

/// The open connections, oldest first.
#[derive(Default)]
pub struct Slots {
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    conns: Vec<(u64, Arc<Clock>)>,
    next_id: u64,
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
    /// Admits a new connection whose phases `clock` follows, under a cap of `max`.
    pub fn admit(self: &Arc<Slots>, clock: &Arc<Clock>, max: usize) -> Admission {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let mut evicted = false;
        // More than one may go when a reload lowered the cap.
        while open.conns.len() >= max {
            if !evict_one(&mut open.conns) {
                return Admission::Full;
            }
            evicted = true;
        }
        let id = open.next_id;
        open.next_id += 1;
        open.conns.push((id, clock.clone()));
        let slot = Slot {
            slots: self.clone(),
            id,
        };
        if evicted {
            Admission::Evicted(slot)
        } else {
            Admission::Free(slot)
        }
    }
}

/// Closes the oldest connection with the most expendable standing; false if all are busy.
fn evict_one(conns: &mut Vec<(u64, Arc<Clock>)>) -> bool {
    let mut victim: Option<(usize, Standing)> = None;
    for (i, (_, clock)) in conns.iter().enumerate() {
        match (clock.standing(), victim) {
            (Some(Standing::Unserved), _) => {
                victim = Some((i, Standing::Unserved));
                break;
            }
            (Some(Standing::Between), None) => victim = Some((i, Standing::Between)),
            _ => {}
        }
    }
    let Some((i, _)) = victim else { return false };
    let (_, clock) = conns.remove(i);
    clock.evict();
    true
}

/// One open admin connection, counted against the cap until dropped (or evicted).
pub struct Slot {
    slots: Arc<Slots>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = open.conns.iter().position(|(id, _)| *id == self.id) {
            open.conns.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(a: Admission) -> Option<(Slot, bool)> {
        match a {
            Admission::Free(s) => Some((s, false)),
            Admission::Evicted(s) => Some((s, true)),
            Admission::Full => None,
        }
    }

    #[tokio::test]
    async fn the_oldest_unserved_then_the_oldest_idle_connection_makes_room() {
        let slots = Arc::new(Slots::default());
        let clocks: Vec<_> = (0..3).map(|_| Clock::new()).collect();
        let mut held: Vec<_> = clocks
            .iter()
            .map(|c| admitted(slots.admit(c, 3)).unwrap())
            .collect();
        assert!(held.iter().all(|(_, evicted)| !evicted));
        // 0 served a request and waits; 1 is handling one; 2 never sent a byte.
        drop(clocks[0].busy());
        let _busy = clocks[1].busy();
        let newcomer = Clock::new();
        let (_newcomer, evicted) = admitted(slots.admit(&newcomer, 3)).unwrap();
        assert!(evicted);
        assert!(clocks[2].is_evicted(), "the unserved one goes first");
        assert!(!clocks[0].is_evicted());
        // Next: the idle keep-alive one, older than the newcomer (unserved, but newer).
        drop(newcomer.busy());
        let (_third, evicted) = admitted(slots.admit(&Clock::new(), 3)).unwrap();
        assert!(evicted && clocks[0].is_evicted() && !newcomer.is_evicted());
        // A dropped slot frees its place.
        drop(held.remove(1));
        assert!(matches!(slots.admit(&Clock::new(), 3), Admission::Free(_)));
    }

    #[tokio::test]
    async fn full_when_every_connection_is_busy() {
        let slots = Arc::new(Slots::default());
        let clock = Clock::new();
        let _slot = admitted(slots.admit(&clock, 1)).unwrap();
        let busy = clock.busy();
        assert!(matches!(slots.admit(&Clock::new(), 1), Admission::Full));
        drop(busy);
        assert!(matches!(
            slots.admit(&Clock::new(), 1),
            Admission::Evicted(_)
        ));
    }
}
