//! What changes between two config texts, key by key, with the old and the new value as
//! written (`weir ctl diff`, the API's dry run). [`crate::diff`] says which objects change
//! in effect; this says which keys were edited. Lists of tables are matched by their
//! `name` (listeners, routes) or `addr` (servers), so a reordered list is no change and a
//! key of a moved route is shown under the route's name. Keys come in sorted order (the
//! same whichever way the `toml` crate keeps its tables).

use std::collections::HashMap;

use toml::Value;

/// One key whose value differs; `None` where it is absent (its default applies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldChange {
    /// Such as `listeners[web].routes[api].path_prefix` or `upstreams.app.servers[10.0.0.1:80].weight`.
    pub path: String,
    pub old: Option<String>,
    pub new: Option<String>,
}

impl std::fmt::Display for FieldChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(unset)".to_string());
        write!(
            f,
            "{}: {} -> {}",
            self.path,
            show(&self.old),
            show(&self.new)
        )
    }
}

/// The keys that differ between `old` and `new` (TOML texts); empty if either is not TOML.
pub fn field_changes(old: &str, new: &str) -> Vec<FieldChange> {
    let (Ok(old), Ok(new)) = (old.parse::<toml::Table>(), new.parse::<toml::Table>()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    walk(
        "",
        Some(&Value::Table(old)),
        Some(&Value::Table(new)),
        &mut out,
    );
    out
}

/// The keys that differ between two values at `path` (`None`: absent), added to `out`.
pub fn value_changes(
    path: &str,
    old: Option<&Value>,
    new: Option<&Value>,
    out: &mut Vec<FieldChange>,
) {
    walk(path, old, new, out);
}

/// Values longer than this are cut (a whole added listener, say).
const MAX_SHOWN: usize = 100;

fn walk(path: &str, old: Option<&Value>, new: Option<&Value>, out: &mut Vec<FieldChange>) {
    match (old, new) {
        (Some(Value::Table(a)), Some(Value::Table(b))) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                walk(&join(path, key), a.get(key), b.get(key), out);
            }
        }
        (Some(Value::Array(a)), Some(Value::Array(b))) if keyed(a) && keyed(b) => {
            // Indexed by name: a fleet's listener may have 10,000 routes.
            let (by_a, by_b) = (index(a), index(b));
            let added = b
                .iter()
                .filter_map(key_of)
                .filter(|n| !by_a.contains_key(n));
            for name in a.iter().filter_map(key_of).chain(added) {
                let at = crate::error::entry(path, name);
                walk(&at, by_a.get(name).copied(), by_b.get(name).copied(), out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(FieldChange {
            path: path.to_string(),
            old: a.map(shown),
            new: b.map(shown),
        }),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// A list whose entries are tables named by `name` or `addr`.
fn keyed(list: &[Value]) -> bool {
    !list.is_empty() && list.iter().all(|v| key_of(v).is_some())
}

fn key_of(v: &Value) -> Option<&str> {
    let t = v.as_table()?;
    t.get("name").or_else(|| t.get("addr"))?.as_str()
}

/// The entries of a keyed list by name (the first of two with one name, as a search would).
fn index(list: &[Value]) -> HashMap<&str, &Value> {
    let mut by_name = HashMap::with_capacity(list.len());
    for v in list {
        if let Some(name) = key_of(v) {
            by_name.entry(name).or_insert(v);
        }
    }
    by_name
}

/// The value as TOML would write it inline, cut at [`MAX_SHOWN`] characters.
fn shown(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(MAX_SHOWN) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = r#"
[[listeners]]
name = "web"
bind = "127.0.0.1:8080"
[[listeners.routes]]
name = "api"
path_prefix = "/api"
upstream = "api"
[[listeners.routes]]
name = "all"
upstream = "api"
[upstreams.api]
servers = [{ addr = "10.0.0.1:80" }, { addr = "10.0.0.2:80", weight = 2 }]
"#;

    #[test]
    fn names_each_key_with_old_and_new_values() {
        let new = OLD
            .replace("\"/api\"", "\"/v2\"")
            .replace("weight = 2", "weight = 3")
            .replace(
                "bind = \"127.0.0.1:8080\"",
                "bind = \"127.0.0.1:8080\"\nbacklog = 64",
            );
        let shown: Vec<String> = field_changes(OLD, &new)
            .iter()
            .map(|c| c.to_string())
            .collect();
        assert_eq!(
            shown,
            [
                "listeners[web].backlog: (unset) -> 64",
                "listeners[web].routes[api].path_prefix: \"/api\" -> \"/v2\"",
                "upstreams.api.servers[10.0.0.2:80].weight: 2 -> 3",
            ]
        );
    }

    #[test]
    fn reordering_named_entries_is_no_change_and_additions_are_whole() {
        let swapped = OLD.replace(
            r#"[{ addr = "10.0.0.1:80" }, { addr = "10.0.0.2:80", weight = 2 }]"#,
            r#"[{ addr = "10.0.0.2:80", weight = 2 }, { addr = "10.0.0.1:80" }]"#,
        );
        assert!(field_changes(OLD, &swapped).is_empty());
        let added = OLD.replace("weight = 2 }]", "weight = 2 }, { addr = \"10.0.0.3:80\" }]");
        let changes = field_changes(OLD, &added);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].path, "upstreams.api.servers[10.0.0.3:80]");
        assert_eq!(changes[0].old, None);
        assert!(field_changes(OLD, "not = [toml").is_empty());
    }

    /// A name that reads as a number is quoted, as errors quote it: bare, it is an index.
    #[test]
    fn a_numeric_name_is_quoted() {
        let old = OLD.replace("name = \"web\"", "name = \"443\"");
        let new = old.replace("8080", "8443");
        let changes = field_changes(&old, &new);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].path, "listeners[\"443\"].bind");
    }
}
