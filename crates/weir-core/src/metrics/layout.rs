//! Metric slots keyed by name, stable across reloads.
//!
//! Shards are indexed by slot, not by config position: a reload that inserts, removes or
//! reorders listeners, routes, upstreams or servers must not move one object's counts onto
//! another's. The [`Layout`] remembers every name it has seen and gives each its slot for
//! the life of the process; a snapshot carries the [`SlotMap`] from its config positions to
//! those slots. A removed object's slot stays (unexported); re-added, it counts on.

use std::collections::HashMap;

use weir_config::Config;

/// Slot 0 of every listener: requests no route matched.
pub const NO_ROUTE_SLOT: usize = 0;

/// Every name ever seen, in slot order.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    listeners: Vec<Named>,
    upstreams: Vec<Named>,
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
                assign(
                    &mut self.upstreams,
                    &u.name,
                    u.servers.iter().map(|s| &s.name),
                    false,
                )
            })
            .collect();
        SlotMap {
            listeners,
            upstreams,
        }
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
            });
            parents.len() - 1
        }
    };
    let known = &mut parents[slot];
    let children = children
        .map(|c| match known.slots.get(c) {
            Some(&i) => i,
            None => {
                known.children.push(c.clone());
                let i = known.children.len() - 1;
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
}
