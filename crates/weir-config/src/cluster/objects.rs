//! The shared objects of a fleet in etcd: one key per object, small TOML values.
//!
//! Under `PREFIX/config/`:
//! - `listeners/NAME`: a listener's table without `name` and `routes`;
//! - `routes/LISTENER/NAME`: a route's table without `name` (a listener's routes are kept
//!   in name order: where the file's order decides between two routes, the name does);
//! - `upstreams/NAME`: an upstream's table.
//!
//! Each value is the TOML the file has for that object, so an object is validated exactly
//! as the file is: [`assemble`] builds the whole config text (the local file's per-node
//! sections first, then the objects), [`parse`] validates it with [`crate::parse_in`],
//! and an error in an object is retold at its etcd key, with the line and column in its
//! value. [`split`] goes the other way, from a whole config text (a file pushed with
//! `weir ctl cluster push`, or the admin API's edited text) to the objects.

use std::collections::BTreeMap;
use std::path::Path;

use toml_edit::{ArrayOfTables, DocumentMut, Item, Table};

use crate::error::{FieldPath, Seg};
use crate::{Config, ConfigError};

mod parsed;
pub use parsed::Parsed;

/// The sections of a config file that are shared objects in a fleet.
pub const SHARED_SECTIONS: [&str; 2] = ["listeners", "upstreams"];

/// The shared objects: key relative to `PREFIX/config/` -> TOML value, in key order.
pub type Objects = BTreeMap<String, String>;

/// What a key under `PREFIX/config/` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectKey<'a> {
    Listener(&'a str),
    Route { listener: &'a str, route: &'a str },
    Upstream(&'a str),
}

impl<'a> ObjectKey<'a> {
    /// `None`: not an object key (ignored, so newer instances may add kinds).
    pub fn parse(key: &'a str) -> Option<ObjectKey<'a>> {
        let parts: Vec<&str> = key.split('/').collect();
        match parts.as_slice() {
            ["listeners", name] if !name.is_empty() => Some(ObjectKey::Listener(name)),
            ["upstreams", name] if !name.is_empty() => Some(ObjectKey::Upstream(name)),
            ["routes", listener, route] if !listener.is_empty() && !route.is_empty() => {
                Some(ObjectKey::Route { listener, route })
            }
            _ => None,
        }
    }
}

/// The local file of an instance, whose per-node sections the assembled config starts with.
#[derive(Debug, Clone)]
pub struct Local<'a> {
    pub text: &'a str,
    /// Its name in errors (the path).
    pub file: &'a str,
    /// The directory relative paths resolve against.
    pub base: Option<&'a Path>,
}

/// A config text built from a local file and shared objects, with what is needed to tell
/// an error in it at the object's key.
#[derive(Debug, Clone)]
pub struct Assembled {
    pub text: String,
    /// Listener names in config order, each with its route names in order.
    listeners: Vec<(String, Vec<String>)>,
    upstreams: Vec<String>,
}

/// Builds the whole config text: `local`'s sections, then every listener (with its routes)
/// and upstream of `objects`. `key_name` gives the full etcd key of a relative key (for
/// errors). A value that is not TOML, or a route of a listener that does not exist, is an
/// error at its key.
pub fn assemble(
    local: &str,
    objects: &Objects,
    key_name: &dyn Fn(&str) -> String,
) -> Result<Assembled, ConfigError> {
    let mut doc: DocumentMut = local.parse().unwrap_or_default();
    let mut listeners = ListenerTables::new();
    let mut upstreams = Table::new();
    upstreams.set_implicit(true);
    let mut routes = Vec::new();
    for (key, value) in objects {
        let table = || value_table(key, value, key_name);
        match ObjectKey::parse(key) {
            Some(ObjectKey::Listener(name)) => {
                listeners.insert(name, (table()?, Vec::new()));
            }
            Some(ObjectKey::Upstream(name)) => {
                upstreams.insert(name, Item::Table(table()?));
            }
            Some(ObjectKey::Route { listener, route }) => routes.push((key, listener, route)),
            None => {}
        }
    }
    for (key, listener, route) in routes {
        let Some((_, list)) = listeners.get_mut(listener) else {
            return Err(orphan_route(&key_name(key), listener));
        };
        list.push((route.to_owned(), value_table(key, &objects[key], key_name)?));
    }
    let (tables, names) = listener_tables(listeners);
    let upstream_names = upstreams.iter().map(|(k, _)| k.to_owned()).collect();
    if !tables.is_empty() {
        doc.insert("listeners", Item::ArrayOfTables(tables));
    }
    if !upstreams.is_empty() {
        doc.insert("upstreams", Item::Table(upstreams));
    }
    renumber(doc.as_table_mut(), &mut 0);
    Ok(Assembled {
        text: doc.to_string(),
        listeners: names,
        upstreams: upstream_names,
    })
}

/// Each listener's table and its routes' tables, by listener name.
type ListenerTables<'a> = BTreeMap<&'a str, (Table, Vec<(String, Table)>)>;

/// The `[[listeners]]` tables, each with its name and routes; and the names in order.
fn listener_tables(listeners: ListenerTables<'_>) -> (ArrayOfTables, Vec<(String, Vec<String>)>) {
    let mut names = Vec::new();
    let mut tables = ArrayOfTables::new();
    for (name, (mut table, list)) in listeners {
        table.insert("name", toml_edit::value(name));
        let mut route_tables = ArrayOfTables::new();
        for (route, mut t) in list.iter().cloned() {
            t.insert("name", toml_edit::value(route));
            route_tables.push(t);
        }
        if !route_tables.is_empty() {
            table.insert("routes", Item::ArrayOfTables(route_tables));
        }
        tables.push(table);
        names.push((name.to_owned(), list.into_iter().map(|(r, _)| r).collect()));
    }
    (tables, names)
}

/// Validates `assembled` as the file would be (relative paths against `local.base`);
/// an error is told at the etcd key of the object it is in (see [`Assembled::locate`]).
pub fn parse(
    local: &Local<'_>,
    assembled: &Assembled,
    objects: &Objects,
    key_name: &dyn Fn(&str) -> String,
) -> Result<Config, ConfigError> {
    crate::parse_in(&assembled.text, local.file, local.base)
        .map_err(|e| assembled.locate(local, objects, key_name, &e.field, e.message, e.fix))
}

impl Assembled {
    /// An error about `field` (a path in the assembled config, such as
    /// `listeners[2].routes[0].upstream`) at the key of the object holding it, the line
    /// and column in its value, and the path within it; a per-node section's field is
    /// located in the local file.
    pub fn locate(
        &self,
        local: &Local<'_>,
        objects: &Objects,
        key_name: &dyn Fn(&str) -> String,
        field: &str,
        message: String,
        fix: String,
    ) -> ConfigError {
        let field = self.by_index(field);
        let path = FieldPath::parse(&field);
        if let Some(name) = self.overridden_bind(local.text, &path.0) {
            let at = format!("cluster.binds.{name}");
            return ConfigError::at_field(local.file, local.text, &at, message, fix);
        }
        let Some((key, inner)) = self.object_of(&path.0) else {
            return ConfigError::at_field(local.file, local.text, &field, message, fix);
        };
        let value = objects.get(&key).map_or("", String::as_str);
        ConfigError::at_field(&key_name(&key), value, &inner.to_string(), message, fix)
    }

    /// `listeners[NAME]...` (how apply errors name a listener) as `listeners[INDEX]...`.
    fn by_index(&self, field: &str) -> String {
        let Some(rest) = field.strip_prefix("listeners[") else {
            return field.to_owned();
        };
        let (name, after) = rest.split_once(']').unwrap_or((rest, ""));
        // A numeric name comes quoted (`crate::listener_field`): a bare number is an index.
        let name = match name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
            Some(quoted) => quoted,
            None if name.parse::<usize>().is_ok() => return field.to_owned(),
            None => name,
        };
        match self.listeners.iter().position(|(l, _)| l == name) {
            Some(i) => format!("listeners[{i}]{after}"),
            None => field.to_owned(),
        }
    }

    /// The listener whose `bind` `path` is, when this node's `binds` gives it.
    fn overridden_bind(&self, local: &str, path: &[Seg]) -> Option<String> {
        let [Seg::Key(top), Seg::Index(i), Seg::Key(bind), ..] = path else {
            return None;
        };
        let name = &self.listeners.get(*i)?.0;
        let doc: DocumentMut = local.parse().ok()?;
        let binds = doc.get("cluster")?.get("binds")?;
        (top == "listeners" && bind == "bind" && binds.get(name).is_some()).then(|| name.clone())
    }

    /// The relative key of the object `path` is in, and the path inside it.
    fn object_of(&self, path: &[Seg]) -> Option<(String, FieldPath)> {
        match path {
            [Seg::Key(top), Seg::Index(i), rest @ ..] if top == "listeners" => {
                let (listener, routes) = self.listeners.get(*i)?;
                match rest {
                    [Seg::Key(r), Seg::Index(j), inner @ ..] if r == "routes" => {
                        let route = routes.get(*j)?;
                        Some((format!("routes/{listener}/{route}"), inner_path(inner)))
                    }
                    _ => Some((format!("listeners/{listener}"), inner_path(rest))),
                }
            }
            [Seg::Key(top), Seg::Key(name), inner @ ..] if top == "upstreams" => self
                .upstreams
                .contains(name)
                .then(|| (format!("upstreams/{name}"), inner_path(inner))),
            _ => None,
        }
    }
}

fn inner_path(segs: &[Seg]) -> FieldPath {
    FieldPath(segs.to_vec())
}

/// The shared objects of a whole config text (per-node sections are left out). Objects
/// are compared by what they say, not how ([`same_value`]).
pub fn split(text: &str, file: &str) -> Result<Objects, ConfigError> {
    let doc: DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| {
        let message = e.message().trim().to_owned();
        ConfigError::at_field(file, text, "", message, "correct the TOML syntax")
    })?;
    let mut out = Objects::new();
    if let Some(listeners) = doc.get("listeners").and_then(Item::as_array_of_tables) {
        for (i, l) in listeners.iter().enumerate() {
            let at = format!("listeners[{i}]");
            let name = key_segment(l, &at, text, file)?;
            let mut table = l.clone();
            table.remove("name");
            if let Some(routes) = table.remove("routes") {
                let routes = routes.as_array_of_tables().ok_or_else(|| {
                    shape(
                        file,
                        text,
                        &format!("{at}.routes"),
                        "write each route as a [[listeners.routes]] table",
                    )
                })?;
                for (j, r) in routes.iter().enumerate() {
                    let route = key_segment(r, &format!("{at}.routes[{j}]"), text, file)?;
                    let mut r = r.clone();
                    r.remove("name");
                    out.insert(format!("routes/{name}/{route}"), value_text(r));
                }
            }
            out.insert(format!("listeners/{name}"), value_text(table));
        }
    }
    if let Some(upstreams) = doc.get("upstreams").and_then(Item::as_table_like) {
        for (name, u) in upstreams.iter() {
            let table = match u {
                Item::Table(t) => t.clone(),
                Item::Value(toml_edit::Value::InlineTable(t)) => t.clone().into_table(),
                _ => {
                    return Err(shape(
                        file,
                        text,
                        &format!("upstreams.{name}"),
                        "write [upstreams.NAME] as a table",
                    ))
                }
            };
            out.insert(format!("upstreams/{name}"), value_text(table));
        }
    }
    Ok(out)
}

/// The keys that differ between two values of the object at `key` (`None`: absent), named
/// as [`crate::field_diff::field_changes`] names them in the assembled config.
pub fn field_changes(
    key: &str,
    old: Option<&str>,
    new: Option<&str>,
) -> Vec<crate::field_diff::FieldChange> {
    let (path, name) = match ObjectKey::parse(key) {
        Some(ObjectKey::Listener(l)) => (format!("listeners[{l}]"), Some(l)),
        Some(ObjectKey::Route { listener, route }) => (
            format!("listeners[{listener}].routes[{route}]"),
            Some(route),
        ),
        Some(ObjectKey::Upstream(u)) => (format!("upstreams.{u}"), None),
        None => return Vec::new(),
    };
    // Listeners and routes are named in their table in the file, by their key here.
    let table = |value: Option<&str>| {
        let mut t = value?.parse::<toml::Table>().ok()?;
        if let Some(name) = name {
            t.insert("name".into(), toml::Value::String(name.to_owned()));
        }
        Some(toml::Value::Table(t))
    };
    let mut out = Vec::new();
    let (old, new) = (table(old), table(new));
    crate::field_diff::value_changes(&path, old.as_ref(), new.as_ref(), &mut out);
    out
}

/// Whether two values say the same (comments and layout aside).
pub fn same_value(a: &str, b: &str) -> bool {
    a == b
        || matches!(
            (a.parse::<toml::Table>(), b.parse::<toml::Table>()),
            (Ok(x), Ok(y)) if x == y
        )
}

/// Routes of a listener in `text` that are not in name order: a fleet keeps them in name
/// order, which decides only between routes at the same path and host (docs/cluster.md).
pub fn route_order_notes(text: &str) -> Vec<String> {
    let Ok(doc) = text.parse::<DocumentMut>() else {
        return Vec::new();
    };
    let listeners = doc.get("listeners").and_then(Item::as_array_of_tables);
    let mut notes = Vec::new();
    for l in listeners.into_iter().flat_map(|a| a.iter()) {
        let names: Vec<&str> = l
            .get("routes")
            .and_then(Item::as_array_of_tables)
            .into_iter()
            .flat_map(|r| r.iter())
            .filter_map(|r| r.get("name")?.as_str())
            .collect();
        if names.windows(2).any(|w| w[0] > w[1]) {
            let listener = l.get("name").and_then(Item::as_str).unwrap_or("?");
            notes.push(format!(
                "listener {listener}: its routes are tried in name order in the fleet ({}), not in file order, where the order decides",
                sorted(names).join(", ")
            ));
        }
    }
    notes
}

fn sorted(mut names: Vec<&str>) -> Vec<&str> {
    names.sort_unstable();
    names
}

/// The object's name, which is a segment of its key: not empty, no `/`.
fn key_segment(table: &Table, at: &str, text: &str, file: &str) -> Result<String, ConfigError> {
    match table.get("name").and_then(Item::as_str) {
        Some(n) if !n.is_empty() && !n.contains('/') => Ok(n.to_owned()),
        _ => Err(ConfigError::at_field(
            file,
            text,
            &format!("{at}.name"),
            "a shared object needs a name without '/' (it is part of its etcd key)",
            "give it name = \"...\" of letters, digits, '_', '.' and '-'",
        )),
    }
}

fn shape(file: &str, text: &str, field: &str, fix: &str) -> ConfigError {
    ConfigError::at_field(
        file,
        text,
        field,
        format!("{field} has the wrong shape"),
        fix,
    )
}

/// A table as a standalone TOML document (its sub-tables as `[tls]`, `[[servers]]`...).
fn value_text(mut table: Table) -> String {
    table.set_implicit(false);
    table.decor_mut().clear();
    let mut doc = DocumentMut::new();
    *doc.as_table_mut() = table;
    renumber(doc.as_table_mut(), &mut 0);
    doc.to_string()
}

/// An object's value as a table; not TOML, or a `name` other than its key's: an error at
/// its key. `routes` in a listener's value is refused (they have keys of their own).
fn value_table(
    key: &str,
    value: &str,
    key_name: &dyn Fn(&str) -> String,
) -> Result<Table, ConfigError> {
    let file = key_name(key);
    let source = crate::error::Source {
        file: &file,
        text: value,
    };
    let doc: DocumentMut = value.parse().map_err(|e| source.syntax_error(&e))?;
    let mut table = doc.as_table().clone();
    let name = key.rsplit('/').next().unwrap_or_default();
    if let Some(written) = table.get("name").and_then(Item::as_str) {
        if written != name {
            return Err(ConfigError::at_field(
                &file,
                value,
                "name",
                format!("name = \"{written}\" differs from the name in the key, \"{name}\""),
                "remove name from the value: the key names the object",
            ));
        }
        table.remove("name");
    }
    if key.starts_with("listeners/") && table.contains_key("routes") {
        return Err(ConfigError::at_field(
            &file,
            value,
            "routes",
            "a listener's routes are objects of their own in a fleet",
            "put each route at PREFIX/config/routes/LISTENER/ROUTE (weir ctl cluster push does)",
        ));
    }
    Ok(table)
}

fn orphan_route(key: &str, listener: &str) -> ConfigError {
    ConfigError {
        file: key.to_owned(),
        line: 0,
        column: 0,
        field: String::new(),
        message: format!("a route of listener \"{listener}\", which does not exist"),
        fix: "add the listener, or delete the route".into(),
    }
}

/// Sets every table's position in depth-first order, so a document built from tables of
/// other documents renders each sub-table under its own parent.
fn renumber(table: &mut Table, next: &mut usize) {
    table.set_position(*next);
    *next += 1;
    for (_, item) in table.iter_mut() {
        match item {
            Item::Table(t) => renumber(t, next),
            Item::ArrayOfTables(a) => a.iter_mut().for_each(|t| renumber(t, next)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
