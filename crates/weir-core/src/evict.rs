//! The places of connections that have not proven themselves yet, held against a cap, with
//! the one that has gone longest without progress given up first when a newcomer needs a
//! place: TLS handshakes in progress (`places`, `max_handshakes`), connections waiting for
//! a request when their listener is at `max_connections` (`places`, `listener::reclaim`)
//! and the admin listener's connections (`weir-admin`, `[admin] max_connections`).
//!
//! A cap that refuses newcomers lets anyone holding that many silent connections lock every
//! ready client out (issue 24: about 520 idle sockets shut a TLS listener with 2 workers
//! until `handshake_timeout`, and the attacker simply reconnects). So at the cap the
//! newcomer takes the place of the *idlest* entry: the one whose last step forward (its
//! arrival, or the last [`EvictionTable::progressed`] its owner reported: a whole
//! ClientHello, a request served) is the oldest. A ready client is the freshest entry from
//! its first byte on, and each step it makes puts it back at the end of the line, so only
//! `cap` newer arrivals within one of its round trips can push it out: an attacker must
//! open connections at that rate (a flood, for rate limits and SYN cookies), not merely
//! hold them. Bytes that are not a step (a ClientHello trickled byte by byte, a request
//! head that never ends) buy no time.
//!
//! Why not "least progress first" (every silent connection before any that sent a
//! ClientHello): an attacker that sends complete ClientHellos and then stalls would make
//! each newcomer, until its own ClientHello is in, the only candidate, and evict it with
//! the next connection it opens; ordering by the time of the last step has no such
//! class to hide in.
//!
//! An entry can be held out of the line while its owner works for it ([`hold`]: an admin
//! request being handled); at a cap of held entries only, the newcomer is refused.
//!
//! Every operation is O(1): a slab of entries with a doubly linked list through the
//! evictable ones, oldest step first, so no scan per accept. Keys carry a generation, so
//! the owner of an entry that was evicted (and whose place was reused) cannot touch its
//! successor. Not synchronized: a worker keeps its tables in a `RefCell` (thread per core,
//! no lock), the admin listener behind its mutex.
//!
//! [`hold`]: EvictionTable::hold

const NIL: usize = usize::MAX;

/// Entries held against a cap, idlest first.
#[derive(Debug)]
pub struct EvictionTable<T> {
    entries: Vec<Entry<T>>,
    /// Indices of `entries` with no value, for reuse.
    free: Vec<usize>,
    /// The evictable entries, oldest step first (`NIL`: none).
    head: usize,
    tail: usize,
    len: usize,
}

#[derive(Debug)]
struct Entry<T> {
    value: Option<T>,
    generation: u64,
    prev: usize,
    next: usize,
    /// In the evictable list (not held).
    linked: bool,
}

/// An entry of an [`EvictionTable`]; stale once the entry is removed or evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    index: usize,
    generation: u64,
}

/// How [`EvictionTable::admit`] let a newcomer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// There was room.
    Free(Key),
    /// The idlest entry (or more, after the cap was lowered) gave up its place.
    Evicted(Key),
    /// Every entry is held: no place.
    Full,
}

impl<T> Default for EvictionTable<T> {
    fn default() -> Self {
        EvictionTable {
            entries: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl<T> EvictionTable<T> {
    /// Entries in the table, held ones included.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `value` under a cap of `max` entries: at the cap, the idlest entries are
    /// removed and handed to `evicted` (which tells their owners) until there is room.
    pub fn admit(&mut self, max: usize, value: T, mut evicted: impl FnMut(T)) -> Admitted {
        let mut made_room = false;
        while self.len >= max.max(1) {
            match self.evict() {
                Some(victim) => evicted(victim),
                None => return Admitted::Full,
            }
            made_room = true;
        }
        let key = self.insert(value);
        if made_room {
            Admitted::Evicted(key)
        } else {
            Admitted::Free(key)
        }
    }

    /// Adds `value` as the freshest evictable entry.
    pub fn insert(&mut self, value: T) -> Key {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.entries.push(Entry {
                    value: None,
                    generation: 0,
                    prev: NIL,
                    next: NIL,
                    linked: false,
                });
                self.entries.len() - 1
            }
        };
        let entry = &mut self.entries[index];
        entry.value = Some(value);
        entry.generation += 1;
        let key = Key {
            index,
            generation: entry.generation,
        };
        self.link_tail(index);
        self.len += 1;
        key
    }

    /// The value of `key`, unless it was removed or evicted.
    pub fn get_mut(&mut self, key: Key) -> Option<&mut T> {
        self.index(key).and_then(|i| self.entries[i].value.as_mut())
    }

    pub fn contains(&self, key: Key) -> bool {
        self.index(key).is_some()
    }

    /// Removes `key`'s entry (no-op if it is gone already).
    pub fn remove(&mut self, key: Key) -> Option<T> {
        let index = self.index(key)?;
        self.take(index)
    }

    /// `key`'s owner made a step: it becomes the freshest evictable entry (also after
    /// [`hold`](Self::hold)). Returns its value (`None`: removed or evicted).
    pub fn progressed(&mut self, key: Key) -> Option<&mut T> {
        let index = self.index(key)?;
        self.unlink(index);
        self.link_tail(index);
        self.entries[index].value.as_mut()
    }

    /// Keeps `key`'s entry from eviction until it [`progressed`](Self::progressed). False
    /// if it was removed or evicted.
    pub fn hold(&mut self, key: Key) -> bool {
        let index = self.index(key);
        if let Some(index) = index {
            self.unlink(index);
        }
        index.is_some()
    }

    /// The evictable entries, idlest first.
    pub fn evictable(&self) -> impl Iterator<Item = &T> {
        let mut index = self.head;
        std::iter::from_fn(move || {
            let entry = self.entries.get(index)?;
            index = entry.next;
            entry.value.as_ref()
        })
    }

    /// The idlest evictable entry (the next [`evict`](Self::evict) takes).
    pub fn oldest(&self) -> Option<&T> {
        match self.head {
            NIL => None,
            head => self.entries[head].value.as_ref(),
        }
    }

    /// Removes the idlest evictable entry.
    pub fn evict(&mut self) -> Option<T> {
        match self.head {
            NIL => None,
            head => self.take(head),
        }
    }

    fn index(&self, key: Key) -> Option<usize> {
        let entry = self.entries.get(key.index)?;
        (entry.generation == key.generation && entry.value.is_some()).then_some(key.index)
    }

    /// Empties the live entry at `index` (every linked entry is live).
    fn take(&mut self, index: usize) -> Option<T> {
        self.unlink(index);
        let value = self.entries[index].value.take()?;
        self.free.push(index);
        self.len -= 1;
        Some(value)
    }

    fn link_tail(&mut self, index: usize) {
        let old_tail = self.tail;
        let entry = &mut self.entries[index];
        entry.prev = old_tail;
        entry.next = NIL;
        entry.linked = true;
        match old_tail {
            NIL => self.head = index,
            t => self.entries[t].next = index,
        }
        self.tail = index;
    }

    fn unlink(&mut self, index: usize) {
        let entry = &mut self.entries[index];
        if !entry.linked {
            return;
        }
        entry.linked = false;
        let (prev, next) = (entry.prev, entry.next);
        match prev {
            NIL => self.head = next,
            p => self.entries[p].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.entries[n].prev = prev,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(table: &mut EvictionTable<u32>) -> Vec<u32> {
        std::iter::from_fn(|| table.evict()).collect()
    }

    #[test]
    fn the_idlest_goes_first_and_a_step_puts_an_entry_at_the_end() {
        let mut t = EvictionTable::default();
        let keys: Vec<Key> = (0..4).map(|v| t.insert(v)).collect();
        t.progressed(keys[0]);
        t.progressed(keys[2]);
        assert_eq!(t.len(), 4);
        assert_eq!(t.oldest(), Some(&1));
        assert_eq!(drain(&mut t), [1, 3, 0, 2]);
        assert_eq!(t.oldest(), None);
        assert!(t.is_empty());
    }

    #[test]
    fn held_entries_are_never_evicted_until_they_progress() {
        let mut t = EvictionTable::default();
        let a = t.insert(1);
        let b = t.insert(2);
        t.hold(a);
        t.hold(b);
        let mut told = Vec::new();
        assert_eq!(t.admit(2, 3, |v| told.push(v)), Admitted::Full);
        t.progressed(b);
        assert!(matches!(
            t.admit(2, 3, |v| told.push(v)),
            Admitted::Evicted(_)
        ));
        assert_eq!(told, [2]);
        assert_eq!(t.len(), 2);
        assert_eq!(t.remove(a), Some(1));
    }

    #[test]
    fn a_lowered_cap_evicts_as_many_as_needed() {
        let mut t = EvictionTable::default();
        for v in 0..5 {
            assert!(matches!(t.admit(8, v, |_| {}), Admitted::Free(_)));
        }
        let mut told = Vec::new();
        assert!(matches!(
            t.admit(2, 9, |v| told.push(v)),
            Admitted::Evicted(_)
        ));
        assert_eq!(told, [0, 1, 2, 3]);
        assert_eq!(drain(&mut t), [4, 9]);
    }

    #[test]
    fn a_stale_key_cannot_touch_the_entry_that_reused_its_place() {
        let mut t = EvictionTable::default();
        let old = t.insert(1);
        assert_eq!(t.evict(), Some(1));
        let new = t.insert(2);
        assert!(!t.contains(old) && t.contains(new));
        assert_eq!(t.remove(old), None);
        t.hold(old);
        t.progressed(old);
        assert_eq!(t.get_mut(old), None);
        assert_eq!(t.evict(), Some(2), "still linked, still there");
    }
}
