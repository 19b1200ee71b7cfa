//! The shared objects as this instance last saw them in etcd, with the revisions that
//! writes are conditioned on.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value as Json;
use weir_config::cluster::objects::Objects;

use crate::etcd::{Event, Kv};

/// The key (under `PREFIX/config/`) every write through Weir also puts: its revision is
/// that of the last change, deletions included, and its value says who made it.
pub const VERSION_KEY: &str = ".version";

#[derive(Debug, Clone, Default)]
pub struct View {
    /// Relative key -> value.
    pub objects: Objects,
    /// Relative key -> the revision it was last written at.
    pub mod_revisions: BTreeMap<String, i64>,
    /// Keys deleted since the last listing -> the revision of the deletion.
    deleted: HashMap<String, i64>,
    /// The latest deletion forgotten: any key this view knows nothing of may have been
    /// deleted as late as this (see [`View::carry_deletions`]).
    deleted_floor: i64,
    /// The etcd revision this view is complete at: a watch resumes after it.
    pub revision: i64,
    /// The revision of the last change to the objects: the config's version.
    pub config_revision: i64,
    /// Who made the last change through Weir (the version key's value), and when.
    pub by: String,
    by_revision: i64,
}

impl View {
    /// The view of a full listing of `PREFIX/config/` (keys relative to it) at `revision`.
    pub fn listed(revision: i64, kvs: Vec<(String, Kv)>) -> View {
        let mut view = View {
            revision,
            ..View::default()
        };
        for (key, kv) in kvs {
            view.put(key, kv);
        }
        view
    }

    /// Takes over what `old` (the view this listing replaces: the previous one, or the
    /// snapshot) knew of deletions, and learns the ones it missed: an object `old` had
    /// that is gone now was deleted by this listing's revision at the latest. That much is
    /// known, so it is the deletion's revision here, and as for a deletion watched, the
    /// config's version moves there (it is not the config it was). Without it, a write
    /// with the `If-Match` of before could re-create the object unnoticed.
    ///
    /// The deletions `old` knew are forgotten here, so that the map holds only those since
    /// the last listing: the latest of them becomes the floor, the revision a key this view
    /// knows nothing of may have been deleted at ([`View::last_change`]). The floor is at
    /// most the config's version, so an `If-Match` of the config as it is now still holds.
    pub fn carry_deletions(&mut self, old: &View) {
        let known = old
            .deleted
            .iter()
            .filter(|(k, _)| !self.objects.contains_key(*k));
        let forgotten = known.map(|(_, rev)| *rev).max().unwrap_or(0);
        self.deleted_floor = old.deleted_floor.max(forgotten);
        self.config_revision = self.config_revision.max(self.deleted_floor);
        for key in old.objects.keys() {
            if !self.objects.contains_key(key) {
                self.deleted.insert(key.clone(), self.revision);
                self.config_revision = self.config_revision.max(self.revision);
            }
        }
    }

    /// Applies watched events (keys relative): the view is then complete up to the last
    /// one's revision, and a watch resumes after it. Not after the response's header
    /// revision: etcd catching a watch up sends the events in batches whose header is the
    /// store's current revision, so a watch broken before the rest arrive would resume past
    /// events never seen (etcd's own client resumes after the last event too).
    pub fn apply(&mut self, events: Vec<(String, Event)>) {
        for (key, event) in events {
            self.revision = self.revision.max(event.revision());
            match event {
                Event::Put(kv) => self.put(key, kv),
                Event::Delete { revision, .. } => {
                    self.config_revision = self.config_revision.max(revision);
                    self.objects.remove(&key);
                    self.mod_revisions.remove(&key);
                    self.deleted.insert(key, revision);
                }
            }
        }
    }

    fn put(&mut self, key: String, kv: Kv) {
        self.config_revision = self.config_revision.max(kv.mod_revision);
        if key == VERSION_KEY {
            self.by = String::from_utf8_lossy(&kv.value).into_owned();
            self.by_revision = kv.mod_revision;
            return;
        }
        self.deleted.remove(&key);
        self.mod_revisions.insert(key.clone(), kv.mod_revision);
        self.objects
            .insert(key, String::from_utf8_lossy(&kv.value).into_owned());
    }

    /// Who made the last change: the writer through Weir, or `etcd` (written directly).
    pub fn author(&self) -> String {
        match self.by_revision == self.config_revision && !self.by.is_empty() {
            true => self.by.clone(),
            false => "etcd".to_owned(),
        }
    }

    /// The revision `key` was last written or deleted at, as far as this view knows: for
    /// a key it knows nothing of, the floor of the deletions it forgot.
    pub fn last_change(&self, key: &str) -> i64 {
        self.mod_revisions
            .get(key)
            .or_else(|| self.deleted.get(key))
            .copied()
            .unwrap_or(self.deleted_floor)
    }

    /// The view as the snapshot file keeps it, written straight from the view (no JSON
    /// tree of 10,000 objects is built on each change).
    pub fn to_json(&self, prefix: &str) -> String {
        let file = SnapshotFile {
            prefix,
            revision: self.revision,
            config_revision: self.config_revision,
            by: &self.by,
            by_revision: self.by_revision,
            objects: ObjectsOut(self),
            deleted: &self.deleted,
            deleted_floor: self.deleted_floor,
        };
        serde_json::to_string(&file).unwrap_or_default()
    }

    /// A view read back from [`View::to_json`]; `None` if it is not one of `prefix`.
    pub fn from_json(json: &Json, prefix: &str) -> Option<View> {
        if json["prefix"].as_str() != Some(prefix) {
            return None;
        }
        let mut view = View {
            revision: json["revision"].as_i64()?,
            config_revision: json["config_revision"].as_i64()?,
            by: json["by"].as_str().unwrap_or_default().to_owned(),
            by_revision: json["by_revision"].as_i64().unwrap_or(0),
            deleted_floor: json["deleted_floor"].as_i64().unwrap_or(0),
            ..View::default()
        };
        for (k, o) in json["objects"].as_object()? {
            view.objects
                .insert(k.clone(), o["value"].as_str()?.to_owned());
            view.mod_revisions
                .insert(k.clone(), o["mod_revision"].as_i64()?);
        }
        // Absent in a snapshot of an older Weir: no deletion known, as before.
        if let Some(deleted) = json["deleted"].as_object() {
            for (k, revision) in deleted {
                view.deleted.insert(k.clone(), revision.as_i64()?);
            }
        }
        Some(view)
    }
}

/// What [`View::to_json`] writes.
#[derive(serde::Serialize)]
struct SnapshotFile<'a> {
    prefix: &'a str,
    revision: i64,
    config_revision: i64,
    by: &'a str,
    by_revision: i64,
    objects: ObjectsOut<'a>,
    /// Deletions known (key -> revision): after a restart, an object deleted before it is
    /// out of the listing and of the objects, and only this dates its deletion.
    deleted: &'a HashMap<String, i64>,
    deleted_floor: i64,
}

/// The objects of a view as a JSON object: key -> `{value, mod_revision}`.
struct ObjectsOut<'a>(&'a View);

#[derive(serde::Serialize)]
struct ObjectOut<'a> {
    value: &'a str,
    mod_revision: Option<&'a i64>,
}

impl serde::Serialize for ObjectsOut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let view = self.0;
        s.collect_map(view.objects.iter().map(|(k, v)| {
            let object = ObjectOut {
                value: v,
                mod_revision: view.mod_revisions.get(k),
            };
            (k, object)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str, rev: i64) -> Kv {
        Kv {
            key: key.into(),
            value: value.as_bytes().to_vec(),
            mod_revision: rev,
            create_revision: rev,
        }
    }

    #[test]
    fn events_and_deletions_move_the_config_revision_and_the_snapshot_round_trips() {
        let mut view = View::listed(5, vec![("upstreams/a".into(), kv("k", "x = 1\n", 4))]);
        assert_eq!((view.revision, view.config_revision), (5, 4));
        view.apply(vec![(
            "upstreams/a".into(),
            Event::Delete {
                key: "k".into(),
                revision: 8,
            },
        )]);
        assert_eq!(
            (view.config_revision, view.last_change("upstreams/a")),
            (8, 8)
        );
        view.apply(vec![(
            VERSION_KEY.into(),
            Event::Put(kv("k", "api on n1", 10)),
        )]);
        assert_eq!((view.config_revision, view.by.as_str()), (10, "api on n1"));
        assert!(view.objects.is_empty());
        assert_eq!(view.revision, 10);
        let mut again = View::listed(
            3,
            vec![("listeners/w".into(), kv("k", "bind = \"x\"\n", 2))],
        );
        again.by = "push".into();
        let json: Json = serde_json::from_str(&again.to_json("/p")).unwrap();
        assert!(View::from_json(&json, "/q").is_none());
        let back = View::from_json(&json, "/p").unwrap();
        assert_eq!(
            (back.objects, back.mod_revisions, back.by),
            (again.objects, again.mod_revisions, again.by)
        );
    }

    /// An object deleted and applied before a restart is in neither the listing nor the
    /// snapshot's objects: the snapshot's deletions date it, so a stale `If-Match` fails.
    #[test]
    fn a_deletion_applied_before_a_restart_is_still_dated_after_it() {
        let mut view = View::listed(5, vec![("upstreams/a".into(), kv("k", "x = 1\n", 4))]);
        view.apply(vec![(
            "upstreams/a".into(),
            Event::Delete {
                key: "k".into(),
                revision: 8,
            },
        )]);
        let json: Json = serde_json::from_str(&view.to_json("/p")).unwrap();
        let snapshot = View::from_json(&json, "/p").unwrap();
        let mut listed = View::listed(9, vec![]);
        listed.carry_deletions(&snapshot);
        assert_eq!(listed.last_change("upstreams/a"), 8);
        assert_eq!(listed.config_revision, 8);
    }

    /// A batch of a watch catching up: its header says the store's current revision (2000),
    /// its events end at 1005. A watch broken then resumes at 1006, not 2001.
    #[test]
    fn a_watch_resumes_after_the_last_event_applied() {
        let mut view = View::listed(3, vec![]);
        let events = (4..=1005)
            .map(|rev| ("routes/w/r".to_owned(), Event::Put(kv("k", "x", rev))))
            .collect();
        view.apply(events);
        assert_eq!((view.revision, view.config_revision), (1005, 1005));
        view.apply(vec![]);
        assert_eq!(view.revision, 1005);
    }

    /// An object deleted while the view was not watching: its deletion is dated at the
    /// listing that found it gone, and the config's version moves there too.
    #[test]
    fn a_listing_learns_the_deletions_it_missed() {
        let mut old = View::listed(
            9,
            vec![
                ("routes/w/a".into(), kv("k", "x", 4)),
                ("routes/w/b".into(), kv("k", "y", 5)),
                (VERSION_KEY.into(), kv("k", "push", 5)),
            ],
        );
        old.deleted.insert("routes/w/c".into(), 3);
        let relisted = |old: &View| {
            let kvs = vec![
                ("routes/w/a".into(), kv("k", "x", 4)),
                (VERSION_KEY.into(), kv("k", "push", 5)),
            ];
            let mut view = View::listed(12, kvs);
            view.carry_deletions(old);
            view
        };
        let view = relisted(&old);
        assert_eq!(view.last_change("routes/w/b"), 12);
        assert_eq!(view.last_change("routes/w/c"), 3);
        assert_eq!(view.last_change("routes/w/a"), 4);
        assert_eq!((view.config_revision, view.author().as_str()), (12, "etcd"));
        // Nothing missed: the version stays. The deletions known are forgotten, their
        // latest the floor of any key not known: the map does not grow from one listing
        // to the next, and an If-Match from before the floor still fails.
        let again = relisted(&view);
        assert_eq!(again.config_revision, 12);
        assert!(again.deleted.is_empty(), "{:?}", again.deleted);
        assert_eq!(again.last_change("routes/w/b"), 12);
        assert_eq!(again.last_change("routes/w/never"), 12);
        assert_eq!(again.last_change("routes/w/a"), 4);
        old.objects.remove("routes/w/b");
        assert_eq!(relisted(&old).config_revision, 5);
    }
}
