//! The shared objects parsed once per value: a change of one object among 10,000 parses
//! that one value, not the whole configuration again.
//!
//! [`Parsed::config`] gives the same config as [`super::parse`] of [`super::assemble`]:
//! each object's value is deserialized on its own (the raw tables of the file, cached by
//! key while the value stays the same), the raw config is put together from them in the
//! order `assemble` uses, and validated by the same [`crate::validate::config`]. A route
//! validated before, from the same value and the same upstream names, is taken as it was
//! validated (its own checks depend on nothing else but the files some read, so those
//! routes are validated each time); the checks across routes, listeners
//! and upstreams run on the whole config each time. When anything fails on this path, the
//! whole config is assembled and parsed as a file, so every error is the one the file's
//! path gives (the same message, at the object's key).

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
    /// The upstream names the cached routes were validated against.
    upstreams: Vec<String>,
    /// The routes parsed by the last call, whose validated form is kept once it succeeds.
    fresh: Vec<String>,
    /// How many values were parsed (tests check that unchanged ones are not).
    #[cfg(test)]
    pub(super) parses: usize,
}

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
        self.fresh.clear();
        match self.fast(local, objects) {
            Some(config) => {
                self.keep_validated(&config);
                Ok(config)
            }
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
        self.check_upstream_names(objects);
        let mut listeners: Vec<(&str, RawListener)> = Vec::new();
        let mut upstreams = std::collections::BTreeMap::new();
        for (key, value) in objects {
            let Some(kind) = ObjectKey::parse(key) else {
                continue;
            };
            match (kind, self.object(key, value)?) {
                (ObjectKey::Listener(name), RawObject::Listener(l)) => {
                    let mut l = RawListener::clone(l);
                    l.routes = Some(Vec::with_capacity(route_count(objects, name)));
                    listeners.push((name, l));
                }
                (ObjectKey::Upstream(name), RawObject::Upstream(u)) => {
                    upstreams.insert(name.to_owned(), RawUpstream::clone(u));
                }
                (ObjectKey::Route { listener, .. }, RawObject::Route(r)) => {
                    // Keys sort listeners (by name) before routes: the listener is in
                    // `listeners` already if it exists (else the slow path names the orphan).
                    let i = listeners
                        .binary_search_by(|(n, _)| (*n).cmp(listener))
                        .ok()?;
                    let routes = listeners[i].1.routes.as_mut()?;
                    routes.push(RawRoute::clone(r));
                }
                _ => return None,
            }
        }
        for (_, l) in &mut listeners {
            // As the file has it: a listener without routes has no `routes`.
            if l.routes.as_ref().is_some_and(Vec::is_empty) {
                l.routes = None;
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

    /// The local file's raw config (parsed again only when its text changed: then no
    /// route is taken as validated, as its paths resolve against the file's directory).
    fn local_raw(&mut self, text: &str) -> Option<RawConfig> {
        if self.local.as_ref().is_none_or(|(t, _)| t != text) {
            let raw: RawConfig = toml::from_str(text).ok()?;
            self.local = Some((text.to_owned(), raw));
            self.forget_validated();
        }
        self.local.as_ref().map(|(_, raw)| raw.clone())
    }

    /// The raw table of the object at `key` (parsed again only when its value changed).
    fn object(&mut self, key: &str, value: &str) -> Option<&RawObject> {
        let seen = self.objects.get(key).is_some_and(|(seen, _)| seen == value);
        if !seen {
            #[cfg(test)]
            {
                self.parses += 1;
            }
            let raw = raw_object(key, value)?;
            if matches!(raw, RawObject::Route(_)) {
                self.fresh.push(key.to_owned());
            }
            self.objects.insert(key.to_owned(), (value.to_owned(), raw));
        }
        self.objects.get(key).map(|(_, raw)| raw)
    }

    /// A route names its upstream by its index among the names: when they change, every
    /// route is validated again.
    fn check_upstream_names(&mut self, objects: &Objects) {
        use std::ops::Bound::{Excluded, Included};
        let names = objects
            .range::<str, _>((Included("upstreams/"), Excluded("upstreams0")))
            .filter_map(|(k, _)| k.strip_prefix("upstreams/"));
        if !names.clone().eq(self.upstreams.iter().map(String::as_str)) {
            self.upstreams = names.map(str::to_owned).collect();
            self.forget_validated();
        }
    }

    fn forget_validated(&mut self) {
        for (_, raw) in self.objects.values_mut() {
            if let RawObject::Route(r) = raw {
                r.validated = None;
            }
        }
    }

    /// Keeps the validated form of each route parsed by this call. Not for a listener with
    /// `http3`: its validation adds the `Alt-Svc` header to its routes, which a route
    /// taken as validated would keep even when the listener no longer says so. Nor for a
    /// route whose validation read files (a users file, a `files` root): they may have
    /// changed since, and a reload must see them as `weir check` does.
    fn keep_validated(&mut self, config: &Config) {
        for key in std::mem::take(&mut self.fresh) {
            let Some(ObjectKey::Route { listener, route }) = ObjectKey::parse(&key) else {
                continue;
            };
            let l = config.listeners.iter().find(|l| l.name == listener);
            let Some(l) = l.filter(|l| l.http3.is_none()) else {
                continue;
            };
            // A listener's routes are in name order (their keys').
            let Ok(i) = l.routes.binary_search_by(|r| r.name.as_str().cmp(route)) else {
                continue;
            };
            if crate::validate::route_reads_files(&l.routes[i]) {
                continue;
            }
            if let Some((_, RawObject::Route(raw))) = self.objects.get_mut(&key) {
                raw.validated = Some(Box::new(l.routes[i].clone()));
            }
        }
    }
}

/// How many route keys listener `name` has.
fn route_count(objects: &Objects, name: &str) -> usize {
    use std::ops::Bound::{Excluded, Included};
    let (from, to) = (format!("routes/{name}/"), format!("routes/{name}0"));
    objects
        .range::<str, _>((Included(from.as_str()), Excluded(to.as_str())))
        .count()
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
