//! Metric slots keyed by name, stable across reloads.
//!
//! Shards are indexed by slot, not by config position: a reload that inserts, removes or
//! reorders listeners, routes, upstreams or servers must not move one object's counts onto
//! another's. The [`Layout`] remembers every name it has seen and gives each its slot for
//! the life of the process; a snapshot carries the [`SlotMap`] from its config positions to
//! those slots. A removed object's slot stays (unexported); re-added, it counts on.
//!
//! Except the servers of a pool with `discover`: DNS may bring a new address every few
//! seconds for as long as the process runs, so the slot of an address that left is freed
//! and given to a later address, its counts zeroed first. Not while any snapshot that had
//! the old address may still count on it: each snapshot holds an [`Epoch`], each epoch the
//! next one, so an epoch is gone only when no snapshot up to its own is left (requests in
//! flight included). Nothing of this is on the request path.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};

use weir_config::Config;

/// Slot 0 of every listener: requests no route matched.
pub const NO_ROUTE_SLOT: usize = 0;

/// Every name ever seen, in slot order.
#[derive(Debug, Default)]
pub struct Layout {
    listeners: Vec<Named>,
    upstreams: Vec<Named>,
    /// Server slots of discovered pools freed by the last [`Layout::assign`]: (upstream
    /// slot, server slot), not yet given an epoch to wait for.
    released: Vec<(usize, usize)>,
    /// Freed server slots, each with the epoch of the last snapshot that had it.
    waiting: Vec<(usize, usize, Weak<Epoch>)>,
}

/// One snapshot's place in the order of snapshots; see the module doc.
#[derive(Debug, Default)]
pub struct Epoch {
    next: OnceLock<Arc<Epoch>>,
}

impl Epoch {
    /// `next` is the epoch of the snapshot that replaced this one's (`Shared::publish`
    /// links them, for every publisher).
    pub fn followed_by(&self, next: &Arc<Epoch>) {
        let _ = self.next.set(next.clone());
    }
}

/// Unlinks the chain after this epoch one epoch at a time: after tens of thousands of
/// reloads, a snapshot held all along (a long request) would otherwise free the chain
/// recursively, one stack frame per epoch, and could overflow its worker's stack.
impl Drop for Epoch {
    fn drop(&mut self) {
        let mut next = self.next.take();
        while let Some(epoch) = next {
            // Held elsewhere too (a running snapshot's): its holder frees the rest.
            next = Arc::into_inner(epoch).and_then(|mut e| e.next.take());
        }
    }
}

/// A listener with its routes, or an upstream with its servers.
#[derive(Debug, Clone)]
struct Named {
    name: String,
    /// For a listener, slot 0 is the "no route" slot (named "").
    children: Vec<String>,
    /// The slot of each named child (not the "no route" slot): a fleet's listener may have
    /// 10,000 routes, each looked up on every change.
    slots: HashMap<String, usize>,
    /// Slots freed (a discovered server that left) and zeroed, to give to new children.
    free: Vec<usize>,
}

/// A snapshot's map from config positions to slots.
#[derive(Debug, Clone, Default)]
pub struct SlotMap {
    pub listeners: Box<[ParentSlots]>,
    pub upstreams: Box<[ParentSlots]>,
}

/// The slot of one listener (or upstream) and of each of its routes (or servers).
#[derive(Debug, Clone)]
pub struct ParentSlots {
    pub slot: usize,
    pub children: Box<[usize]>,
}

impl ParentSlots {
    /// The slot of route `route` (`None`: the no-route slot).
    #[inline]
    pub fn route(&self, route: Option<usize>) -> usize {
        route.map_or(NO_ROUTE_SLOT, |r| self.children[r])
    }
}

impl Layout {
    /// Slots for every object of `config`, adding names not seen before.
    pub fn assign(&mut self, config: &Config) -> SlotMap {
        let listeners = config
            .listeners
            .iter()
            .map(|l| {
                assign(
                    &mut self.listeners,
                    &l.name,
                    l.routes.iter().map(|r| &r.name),
                    true,
                )
            })
            .collect();
        let upstreams = config
            .upstreams
            .iter()
            .map(|u| {
                let slots = assign(
                    &mut self.upstreams,
                    &u.name,
                    u.servers.iter().map(|s| &s.name),
                    false,
                );
                if u.discover.is_some() {
                    self.release_others(&slots);
                }
                slots
            })
            .collect();
        SlotMap {
            listeners,
            upstreams,
        }
    }

    /// Frees the server slots of upstream `slots.slot` that `slots` does not use.
    fn release_others(&mut self, slots: &ParentSlots) {
        let known = &mut self.upstreams[slots.slot];
        let used: std::collections::HashSet<usize> = slots.children.iter().copied().collect();
        let released = &mut self.released;
        known.slots.retain(|_, slot| {
            let keep = used.contains(slot);
            if !keep {
                released.push((slots.slot, *slot));
            }
            keep
        });
    }

    /// The slots freed by the last [`Layout::assign`] wait until `epoch` (that of the last
    /// snapshot that had them) is gone.
    pub fn wait_for(&mut self, epoch: &Arc<Epoch>) {
        let weak = Arc::downgrade(epoch);
        self.waiting
            .extend(self.released.drain(..).map(|(u, s)| (u, s, weak.clone())));
    }

    /// The freed slots no snapshot can count on any more, each passed to `zero` and then
    /// given to the next new child of its upstream.
    pub fn reclaim(&mut self, mut zero: impl FnMut(usize, usize)) {
        let upstreams = &mut self.upstreams;
        self.waiting.retain(|(u, s, epoch)| {
            if epoch.strong_count() > 0 {
                return true;
            }
            zero(*u, *s);
            upstreams[*u].free.push(*s);
            false
        });
    }
}

fn assign<'a>(
    parents: &mut Vec<Named>,
    name: &str,
    children: impl Iterator<Item = &'a String>,
    no_route_slot: bool,
) -> ParentSlots {
    let slot = match parents.iter().position(|p| p.name == name) {
        Some(i) => i,
        None => {
            let initial = if no_route_slot {
                vec![String::new()]
            } else {
                Vec::new()
            };
            parents.push(Named {
                name: name.to_string(),
                children: initial,
                slots: HashMap::new(),
                free: Vec::new(),
            });
            parents.len() - 1
        }
    };
    let known = &mut parents[slot];
    let children = children
        .map(|c| match known.slots.get(c) {
            Some(&i) => i,
            None => {
                let i = match known.free.pop() {
                    Some(i) => {
                        known.children[i] = c.clone();
                        i
                    }
                    None => {
                        known.children.push(c.clone());
                        known.children.len() - 1
                    }
                };
                known.slots.insert(c.clone(), i);
                i
            }
        })
        .collect();
    ParentSlots { slot, children }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(routes: &[&str], servers: &[&str]) -> Config {
        let mut text = String::from("[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\n");
        for r in routes {
            text += &format!(
                "[[listeners.routes]]\nname = \"{r}\"\npath_prefix = \"/{r}\"\nupstream = \"u\"\n"
            );
        }
        let servers: Vec<String> = servers
            .iter()
            .map(|s| format!("{{ addr = \"{s}\" }}"))
            .collect();
        text += &format!("[upstreams.u]\nservers = [{}]\n", servers.join(", "));
        weir_config::parse_str(&text, "t.toml").unwrap()
    }

    #[test]
    fn slots_follow_names_not_positions() {
        let mut layout = Layout::default();
        let a = layout.assign(&config(&["a", "b"], &["127.0.0.1:1", "127.0.0.1:2"]));
        assert_eq!(&*a.listeners[0].children, &[1, 2]);
        assert_eq!(&*a.upstreams[0].children, &[0, 1]);
        let b = layout.assign(&config(&["c", "b"], &["127.0.0.1:2", "127.0.0.1:3"]));
        assert_eq!(b.listeners[0].slot, a.listeners[0].slot);
        assert_eq!(&*b.listeners[0].children, &[3, 2]);
        assert_eq!(&*b.upstreams[0].children, &[1, 2]);
        let c = layout.assign(&config(&["a"], &["127.0.0.1:1"]));
        assert_eq!(&*c.listeners[0].children, &[1]);
        assert_eq!(&*c.upstreams[0].children, &[0]);
        assert_eq!(c.listeners[0].route(None), NO_ROUTE_SLOT);
    }

    /// Pool `u` discovering its servers from DNS, with the addresses `servers` as answered.
    fn discovered(servers: &[&str]) -> Config {
        let text = "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\n\
            [[listeners.routes]]\nname = \"r\"\nupstream = \"u\"\n\
            [upstreams.u]\ndiscover = { dns = \"api.internal:80\" }\n";
        let mut config = weir_config::parse_str(text, "t.toml").unwrap();
        config.upstreams[0].servers = config_servers(servers);
        config
    }

    fn config_servers(servers: &[&str]) -> Vec<weir_config::UpstreamServer> {
        config(&[], servers).upstreams.remove(0).servers
    }

    #[test]
    fn a_discovered_servers_slot_is_freed_once_no_snapshot_can_count_on_it() {
        let mut layout = Layout::default();
        let epoch = |_: &SlotMap| Arc::new(Epoch::default());
        let a = layout.assign(&discovered(&["127.0.0.1:1", "127.0.0.1:2"]));
        let first = epoch(&a);
        let b = layout.assign(&discovered(&["127.0.0.1:3"]));
        assert_eq!(&*b.upstreams[0].children, &[2]);
        // The addresses that left wait for the last snapshot that had them.
        layout.wait_for(&first);
        let second = epoch(&b);
        first.followed_by(&second);
        let mut zeroed = Vec::new();
        layout.reclaim(|u, s| zeroed.push((u, s)));
        assert!(zeroed.is_empty());
        let c = layout.assign(&discovered(&["127.0.0.1:3", "127.0.0.1:4"]));
        assert_eq!(
            &*c.upstreams[0].children,
            &[2, 3],
            "not reused while counted on"
        );
        layout.wait_for(&second);
        // A newer snapshot alone does not keep them: the older ones are gone.
        drop(first);
        layout.reclaim(|u, s| zeroed.push((u, s)));
        zeroed.sort_unstable();
        assert_eq!(zeroed, [(0, 0), (0, 1)]);
        let d = layout.assign(&discovered(&["127.0.0.1:3", "127.0.0.1:5", "127.0.0.1:6"]));
        let mut children = d.upstreams[0].children.to_vec();
        children.sort_unstable();
        assert_eq!(children, [0, 1, 2], "freed slots given to new addresses");
        // Servers of a pool without `discover` keep their slots (re-added, they count on).
        let mut fixed = Layout::default();
        fixed.assign(&config(&[], &["127.0.0.1:1"]));
        fixed.assign(&config(&[], &["127.0.0.1:2"]));
        fixed.wait_for(&Arc::new(Epoch::default()));
        fixed.reclaim(|_, _| panic!("a fixed pool's slot freed"));
        let again = fixed.assign(&config(&[], &["127.0.0.1:1"]));
        assert_eq!(&*again.upstreams[0].children, &[0]);
    }

    /// A chain of many epochs frees on a small stack (it would recurse once per epoch).
    #[test]
    fn a_long_chain_of_epochs_is_dropped_without_recursion() {
        let first = Arc::new(Epoch::default());
        let mut last = first.clone();
        for _ in 0..200_000 {
            let next = Arc::new(Epoch::default());
            last.followed_by(&next);
            last = next;
        }
        let weak_last = Arc::downgrade(&last);
        drop(last);
        let dropper = std::thread::Builder::new().stack_size(64 * 1024);
        dropper.spawn(move || drop(first)).unwrap().join().unwrap();
        assert!(weak_last.upgrade().is_none());
    }
}
