//! The shared objects parsed once per value: a change of one object among 10,000 parses
//! that one value, not the whole configuration again.
//!
//! [`Parsed::config`] gives the same config as [`super::parse`] of [`super::assemble`]:
//! each object's value is deserialized on its own (the raw tables of the file, cached by
//! key while the value stays the same), the raw config is put together from them in the
//! order `assemble` uses, and validated by the same [`crate::validate::config`]. When
//! anything fails on this path, the whole config is assembled and parsed as a file, so
//! every error is the one the file's path gives (the same message, at the object's key).

use std::collections::HashMap;

use super::{assemble, parse, Local, ObjectKey, Objects};
use crate::raw::{RawConfig, RawListener, RawRoute, RawUpstream};
use crate::{Config, ConfigError};

/// The raw tables of the objects last seen, and of the local file.
#[derive(Default)]
pub struct Parsed {
    /// Relative key -> the value it was parsed from, and its raw table.
    objects: HashMap<String, (String, RawObject)>,
    /// The local file's text and its raw config (its per-node sections).
    local: Option<(String, RawConfig)>,
    /// How many values were parsed (tests check that unchanged ones are not).
    #[cfg(test)]
    pub(super) parses: usize,
}

#[derive(Clone)]
enum RawObject {
    Listener(Box<RawListener>),
    Route(Box<RawRoute>),
    Upstream(Box<RawUpstream>),
}

impl Parsed {
    /// The config of `objects` with the local file, validated as a file is; errors name the
    /// object's key (`key_name` gives the full key of a relative one).
    pub fn config(
        &mut self,
        local: &Local<'_>,
        objects: &Objects,
        key_name: &dyn Fn(&str) -> String,
    ) -> Result<Config, ConfigError> {
        match self.fast(local, objects) {
            Some(config) => Ok(config),
            None => {
                let assembled = assemble(local.text, objects, key_name)?;
                parse(local, &assembled, objects, key_name)
            }
        }
    }

    /// The config from the cached raw tables; `None` on any error (the slow path tells it).
    fn fast(&mut self, local: &Local<'_>, objects: &Objects) -> Option<Config> {
        let mut raw = self.local_raw(local.text)?;
        self.objects.retain(|key, _| objects.contains_key(key));
        let mut listeners: Vec<(&str, RawListener)> = Vec::new();
        let mut upstreams = std::collections::BTreeMap::new();
        for (key, value) in objects {
            let Some(kind) = ObjectKey::parse(key) else {
                continue;
            };
            match (kind, self.object(key, value)?) {
                (ObjectKey::Listener(name), RawObject::Listener(l)) => listeners.push((name, *l)),
                (ObjectKey::Upstream(name), RawObject::Upstream(u)) => {
                    upstreams.insert(name.to_owned(), *u);
                }
                (ObjectKey::Route { listener, .. }, RawObject::Route(r)) => {
                    // Keys sort listeners (by name) before routes: the listener is in
                    // `listeners` already if it exists (else the slow path names the orphan).
                    let i = listeners.binary_search_by(|(n, _)| (*n).cmp(listener)).ok()?;
                    listeners[i].1.routes.get_or_insert_with(Vec::new).push(*r);
                }
                _ => return None,
            }
        }
        if !listeners.is_empty() {
            raw.listeners = Some(listeners.into_iter().map(|(_, l)| l).collect());
        }
        if !upstreams.is_empty() {
            raw.upstreams = Some(upstreams);
        }
        let relative_paths = local
            .base
            .map_or_else(Vec::new, |b| crate::paths::resolve(&mut raw, b));
        let mut config = crate::validate::config(raw).ok()?;
        config.relative_paths = relative_paths;
        Some(config)
    }

    /// The local file's raw config (parsed again only when its text changed).
    fn local_raw(&mut self, text: &str) -> Option<RawConfig> {
        if self.local.as_ref().is_none_or(|(t, _)| t != text) {
            let raw: RawConfig = toml::from_str(text).ok()?;
            self.local = Some((text.to_owned(), raw));
        }
        self.local.as_ref().map(|(_, raw)| raw.clone())
    }

    /// The raw table of the object at `key` (parsed again only when its value changed).
    fn object(&mut self, key: &str, value: &str) -> Option<RawObject> {
        if let Some((seen, raw)) = self.objects.get(key) {
            if seen == value {
                return Some(raw.clone());
            }
        }
        #[cfg(test)]
        {
            self.parses += 1;
        }
        let raw = raw_object(key, value)?;
        self.objects
            .insert(key.to_owned(), (value.to_owned(), raw.clone()));
        Some(raw)
    }
}

/// One value as the raw table the file would have, named by its key; `None` where the
/// value would be an error (or is written in a way only the slow path takes).
fn raw_object(key: &str, value: &str) -> Option<RawObject> {
    let name = Some(key.rsplit('/').next()?.to_owned());
    let named = |written: &Option<String>| written.is_none() || *written == name;
    match ObjectKey::parse(key)? {
        ObjectKey::Listener(_) => {
            let mut l: RawListener = toml::from_str(value).ok()?;
            if !named(&l.name) || l.routes.is_some() {
                return None;
            }
            l.name = name;
            Some(RawObject::Listener(Box::new(l)))
        }
        ObjectKey::Route { .. } => {
            let mut r: RawRoute = toml::from_str(value).ok()?;
            if !named(&r.name) {
                return None;
            }
            r.name = name;
            Some(RawObject::Route(Box::new(r)))
        }
        ObjectKey::Upstream(_) => Some(RawObject::Upstream(Box::new(toml::from_str(value).ok()?))),
    }
}
