//! What changes between two configs, object by object: listeners, routes, upstreams and
//! servers added, removed or changed. The admin API's dry run returns this list, reloads
//! log it, and `weir ctl diff` prints it.

use std::collections::HashMap;

use crate::model::{Config, Listener, Upstream};

/// How one object changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Removed,
    Changed,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "added",
            ChangeKind::Removed => "removed",
            ChangeKind::Changed => "changed",
        }
    }
}

/// One changed object, such as `listener "web"` or `server "api" "10.0.0.1:80"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub kind: ChangeKind,
    /// `server`, `listener`, `route`, `upstream` or `server`.
    pub object: &'static str,
    /// The object's path of names: `["web"]`, `["web", "api"]` for a route.
    pub name: Vec<String>,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind.as_str(), self.object)?;
        if !self.name.is_empty() {
            write!(f, " {}", self.name.join("/"))?;
        }
        Ok(())
    }
}

/// Every object that differs between `old` and `new`, in config order.
pub fn diff(old: &Config, new: &Config) -> Vec<Change> {
    let mut out = Vec::new();
    if old.server != new.server {
        out.push(change(ChangeKind::Changed, "server", &[]));
    }
    if old.admin != new.admin {
        out.push(change(ChangeKind::Changed, "admin", &[]));
    }
    if old.cluster != new.cluster {
        out.push(change(ChangeKind::Changed, "cluster", &[]));
    }
    by_name(
        &old.listeners,
        &new.listeners,
        LISTENER.name,
        &mut |kind, o, n| LISTENER.compare(kind, o, n, &mut out),
    );
    by_name(
        &old.upstreams,
        &new.upstreams,
        UPSTREAM.name,
        &mut |kind, o, n| UPSTREAM.compare(kind, o, n, &mut out),
    );
    out
}

fn change(kind: ChangeKind, object: &'static str, name: &[&str]) -> Change {
    Change {
        kind,
        object,
        name: name.iter().map(|s| s.to_string()).collect(),
    }
}

/// Calls `f` for every item only in `old` (removed), only in `new` (added), or in both but
/// different (changed); `f` gets whichever sides exist.
fn by_name<'a, T: PartialEq>(
    old: &'a [T],
    new: &'a [T],
    name: impl Fn(&T) -> &String,
    f: &mut dyn FnMut(ChangeKind, Option<&'a T>, Option<&'a T>),
) {
    // Indexed by name: a fleet's listener may have 10,000 routes. The first of two items
    // with one name is the one found, as a search would.
    let index = |items: &'a [T]| {
        let mut by_name: HashMap<&'a String, &'a T> = HashMap::with_capacity(items.len());
        for item in items {
            by_name.entry(name(item)).or_insert(item);
        }
        by_name
    };
    let (old_by_name, new_by_name) = (index(old), index(new));
    for o in old {
        match new_by_name.get(name(o)) {
            None => f(ChangeKind::Removed, Some(o), None),
            Some(&n) if n != o => f(ChangeKind::Changed, Some(o), Some(n)),
            Some(_) => {}
        }
    }
    for n in new {
        if !old_by_name.contains_key(name(n)) {
            f(ChangeKind::Added, None, Some(n));
        }
    }
}

/// How to compare one kind of object that has children: a listener with its routes, an
/// upstream with its servers.
struct Parent<P, C> {
    object: &'static str,
    child: &'static str,
    name: fn(&P) -> &String,
    children: fn(&P) -> &Vec<C>,
    /// Whether the two are the same but for their children.
    same_but_children: fn(&P, &P) -> bool,
    child_name: fn(&C) -> &String,
}

const LISTENER: Parent<Listener, crate::model::Route> = Parent {
    object: "listener",
    child: "route",
    name: |l| &l.name,
    children: |l| &l.routes,
    same_but_children: Listener::same_but_routes,
    child_name: |r| &r.name,
};

const UPSTREAM: Parent<Upstream, crate::model::UpstreamServer> = Parent {
    object: "upstream",
    child: "server",
    name: |u| &u.name,
    children: |u| &u.servers,
    same_but_children: |o, n| {
        Upstream {
            servers: n.servers.clone(),
            ..o.clone()
        } == *n
    },
    child_name: |s| &s.name,
};

impl<P: PartialEq, C: PartialEq> Parent<P, C> {
    /// Records the object's own change, then each child's.
    fn compare(&self, kind: ChangeKind, o: Option<&P>, n: Option<&P>, out: &mut Vec<Change>) {
        let (Some(o), Some(n)) = (o, n) else {
            let name = o.or(n).map_or("", |p| (self.name)(p).as_str());
            return out.push(change(kind, self.object, &[name]));
        };
        let parent = (self.name)(n);
        if !(self.same_but_children)(o, n) {
            out.push(change(kind, self.object, &[parent]));
        }
        by_name(
            (self.children)(o),
            (self.children)(n),
            self.child_name,
            &mut |kind, a, b| {
                let child = a.or(b).map_or("", |c| (self.child_name)(c).as_str());
                out.push(change(kind, self.child, &[parent, child]));
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[[listeners]]
name = "web"
bind = "127.0.0.1:8080"
[[listeners.routes]]
name = "api"
path_prefix = "/api"
upstream = "api"
[upstreams.api]
servers = [{ addr = "127.0.0.1:9001" }, { addr = "127.0.0.1:9002" }]
"#;

    fn parse(text: &str) -> Config {
        crate::parse_str(text, "test.toml").unwrap()
    }

    #[test]
    fn same_config_has_no_changes() {
        assert!(diff(&parse(BASE), &parse(BASE)).is_empty());
    }

    #[test]
    fn names_each_changed_object() {
        let new = BASE
            .replace("9002\" }", "9003\", backup = true }")
            .replace("/api\"", "/v2\"");
        let changes: Vec<String> = diff(&parse(BASE), &parse(&new))
            .iter()
            .map(|c| c.to_string())
            .collect();
        assert_eq!(
            changes,
            [
                "changed route web/api",
                "removed server api/127.0.0.1:9002",
                "added server api/127.0.0.1:9003",
            ]
        );
    }
}
