//! A store's index: entries by key (a `BTreeMap`, so a prefix is a range), each key with
//! its variants (`Vary`), keys in use order, and the bytes they account for. Both store
//! kinds use it (a disk store's entries point at their files); what it removes it hands
//! back, so a disk store can remove their files once its lock is let go.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::store::Entry;

/// Most variants (`Vary`) one route keeps under one key; its oldest goes first. Counted
/// per route (the scope a variant begins with): a route whose variants a client controls
/// cannot push another route's out.
const MAX_VARIANTS: usize = 8;

/// What a key's bookkeeping costs beyond its bodies and heads (an estimate).
pub(super) const ENTRY_OVERHEAD: u64 = 256;

/// The route scope `variant` begins with (`RouteCache::scope`: the listener's and the
/// route's names, each after its length as four little-endian bytes); empty for a
/// variant without one (a disk entry written before scopes).
fn scope_of(variant: &[u8]) -> &[u8] {
    let mut at = 0usize;
    for _ in 0..2 {
        let Some(Ok(len)) = variant.get(at..at + 4).map(<[u8; 4]>::try_from) else {
            return &[];
        };
        let end = at + 4 + u32::from_le_bytes(len) as usize;
        if end > variant.len() {
            return &[];
        }
        at = end;
    }
    &variant[..at]
}

#[derive(Default)]
pub(super) struct Lru {
    keys: BTreeMap<Box<[u8]>, Slot>,
    /// Use order: the tick of each key's last use.
    order: BTreeMap<u64, Box<[u8]>>,
    tick: u64,
    pub bytes: u64,
    /// The entries' [`Entry::index`] bytes together.
    pub index: u64,
}

struct Slot {
    variants: Vec<Arc<Entry>>,
    tick: u64,
}

impl Slot {
    fn size(&self) -> u64 {
        self.variants.iter().map(|e| e.size).sum()
    }

    fn index(&self) -> u64 {
        self.variants.iter().map(|e| e.index).sum()
    }
}

impl Lru {
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Marks `key` used now.
    fn touch(&mut self, key: &[u8]) {
        let tick = self.next_tick();
        let Some(slot) = self.keys.get_mut(key) else {
            return;
        };
        let old = std::mem::replace(&mut slot.tick, tick);
        let k = self.order.remove(&old).unwrap_or_else(|| key.into());
        self.order.insert(tick, k);
    }

    /// The variants of `key` (marked as used), newest first.
    pub fn get(&mut self, key: &[u8]) -> Vec<Arc<Entry>> {
        self.touch(key);
        self.keys
            .get(key)
            .map_or_else(Vec::new, |slot| slot.variants.clone())
    }

    /// Adds `entry` under `key` in place of the variant it replaces (unless `only_new` and
    /// that variant is there: a scan's find loses to a newer write). Returns the variants
    /// it pushed out past [`MAX_VARIANTS`] (not the one it replaced, which had its name).
    pub fn insert(&mut self, key: &[u8], entry: Arc<Entry>, only_new: bool) -> Vec<Arc<Entry>> {
        let Some(slot) = self.keys.get_mut(key) else {
            self.bytes += entry.size + ENTRY_OVERHEAD;
            self.index += entry.index;
            let slot = Slot {
                variants: vec![entry],
                tick: 0,
            };
            self.keys.insert(key.into(), slot);
            self.touch(key);
            return Vec::new();
        };
        if only_new && slot.variants.iter().any(|e| e.variant == entry.variant) {
            return Vec::new();
        }
        let before = slot.size();
        let index_before = slot.index();
        let scope = scope_of(&entry.variant).to_vec();
        slot.variants.retain(|e| e.variant != entry.variant);
        slot.variants.insert(0, entry);
        // Newest first: the route's variants past its MAX_VARIANTS are its oldest.
        let mut same = 0;
        let (kept, pushed_out) = std::mem::take(&mut slot.variants)
            .into_iter()
            .partition(|e| {
                same += usize::from(scope_of(&e.variant) == scope);
                scope_of(&e.variant) != scope || same <= MAX_VARIANTS
            });
        slot.variants = kept;
        self.bytes = self.bytes - before + slot.size();
        self.index = self.index - index_before + slot.index();
        self.touch(key);
        pushed_out
    }

    /// Removes `key` with its variants; returns them.
    pub fn remove(&mut self, key: &[u8]) -> Vec<Arc<Entry>> {
        let Some(slot) = self.keys.remove(key) else {
            return Vec::new();
        };
        self.order.remove(&slot.tick);
        self.bytes -= slot.size() + ENTRY_OVERHEAD;
        self.index -= slot.index();
        slot.variants
    }

    /// Removes the one variant `entry` of `key`, if it is still there.
    pub fn remove_entry(&mut self, key: &[u8], entry: &Arc<Entry>) -> bool {
        let Some(slot) = self.keys.get_mut(key) else {
            return false;
        };
        let Some(i) = slot.variants.iter().position(|e| Arc::ptr_eq(e, entry)) else {
            return false;
        };
        slot.variants.remove(i);
        self.bytes -= entry.size;
        self.index -= entry.index;
        if slot.variants.is_empty() {
            self.remove(key);
        }
        true
    }

    /// The keys starting with `prefix`.
    pub fn prefixed(&self, prefix: &[u8]) -> Vec<Box<[u8]>> {
        let from = std::ops::Bound::Included(prefix);
        (self
            .keys
            .range::<[u8], _>((from, std::ops::Bound::Unbounded)))
        .map(|(k, _)| k)
        .take_while(|k| k.starts_with(prefix))
        .cloned()
        .collect()
    }

    /// Evicts least recently used keys until the bytes are within `max` and the index
    /// bytes within `max_index`; returns how many keys went and their variants.
    pub fn evict_past(&mut self, max: u64, max_index: u64) -> (u64, Vec<Arc<Entry>>) {
        let mut evicted = (0, Vec::new());
        while self.bytes > max || self.index > max_index {
            let Some((_, key)) = self.order.pop_first() else {
                break;
            };
            if let Some(slot) = self.keys.remove(&key) {
                self.bytes -= slot.size() + ENTRY_OVERHEAD;
                self.index -= slot.index();
                evicted.0 += 1;
                evicted.1.extend(slot.variants);
            }
        }
        evicted
    }
}
