//! `weir ctl cluster push | pull | status`: straight to etcd, so a fleet can be seeded
//! before any instance runs. Push validates the pushed objects as an instance with the
//! given local file would, shows what changes (the same lines as `weir ctl apply`), and
//! writes only the objects that differ, in transactions conditioned on what it read.

use serde_json::{json, Value as Json};
use weir_config::cluster::objects::{self, Local, Objects};
use weir_config::cluster::EtcdCluster;
use weir_config::diff::Change;
use weir_config::{Config, ConfigError};

use crate::etcd::{prefix_end, Etcd};
use crate::view::View;
use crate::write;

/// A session with the fleet's etcd from the command line.
pub struct Admin {
    settings: EtcdCluster,
    etcd: Etcd,
    runtime: tokio::runtime::Runtime,
}

/// What pushing a file would do.
pub struct Plan {
    view: View,
    /// The transactions that write it.
    txns: Vec<write::Txn>,
    /// The objects written (`Some`) or deleted (`None`).
    pub writes: Vec<write::Change>,
    /// The changes to the running config, as `weir ctl apply` shows them.
    pub changes: Vec<Change>,
    /// Things to know (route order).
    pub notes: Vec<String>,
}

impl Admin {
    pub fn new(settings: EtcdCluster) -> anyhow::Result<Admin> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let etcd = Etcd::new(&settings).map_err(anyhow::Error::msg)?;
        Ok(Admin {
            settings,
            etcd,
            runtime,
        })
    }

    fn key_name(&self, key: &str) -> String {
        format!("{}/config/{key}", self.settings.prefix)
    }

    /// The shared objects now.
    pub fn list(&self) -> anyhow::Result<View> {
        Ok(self
            .runtime
            .block_on(crate::sync::list_view(&self.etcd, &self.settings.prefix))?)
    }

    /// Validates `file` (its shared objects, with `local`'s per-node sections), compares
    /// it with what etcd has, and builds the transactions that write the difference.
    pub fn plan(&self, local: &Local<'_>, file: &str, file_name: &str) -> anyhow::Result<Plan> {
        let view = self.list()?;
        let new = objects::split(file, file_name)?;
        let new_config = self.config(local, &new)?;
        let old_config = self.config(local, &view.objects).ok();
        let changes = match old_config {
            Some(old) => weir_config::diff::diff(&old, &new_config),
            None => weir_config::diff::diff(&self.config(local, &Objects::new())?, &new_config),
        };
        let writes = write::changes(&view.objects, &new);
        let by = format!("weir ctl cluster push {file_name}");
        let max_bytes = self.settings.max_txn_bytes;
        let txns = write::transactions(&view, &writes, &|k| self.key_name(k), &by, max_bytes)
            .map_err(|e| anyhow::anyhow!("{e} (fix: {})", write::TOO_LARGE_FIX))?;
        Ok(Plan {
            writes,
            txns,
            changes,
            notes: objects::route_order_notes(file),
            view,
        })
    }

    fn config(&self, local: &Local<'_>, objects: &Objects) -> Result<Config, ConfigError> {
        let key_name = |k: &str| self.key_name(k);
        let assembled = objects::assemble(local.text, objects, &key_name)?;
        objects::parse(local, &assembled, objects, &key_name)
    }

    /// Writes `plan`; the revision of the last transaction.
    pub fn push(&self, plan: &Plan) -> anyhow::Result<i64> {
        if plan.txns.is_empty() {
            return Ok(plan.view.revision);
        }
        let pending = self.key_name(write::PENDING_KEY);
        let txns = plan.txns.clone();
        let written = write::write_all(&self.etcd, txns, &pending, self.settings.lease_ttl);
        match self.runtime.block_on(written)? {
            write::Written::Done(revision) => Ok(revision),
            write::Written::Busy => anyhow::bail!(
                "another push is under way in etcd ({pending} exists); nothing was written: run the push again once it is done"
            ),
            write::Written::Moved(moved) => anyhow::bail!(
                "an object changed in etcd while pushing (revision {}); nothing more was written: run the push again",
                moved.revision
            ),
        }
    }

    /// The shared objects as one config file (listeners with their routes, upstreams).
    pub fn pull(&self) -> anyhow::Result<String> {
        let view = self.list()?;
        let key_name = |k: &str| self.key_name(k);
        Ok(objects::assemble("", &view.objects, &key_name)?.text)
    }

    /// The registered instances and the current config revision.
    pub fn status(&self) -> anyhow::Result<Json> {
        let prefix = format!("{}/instances/", self.settings.prefix);
        let (_, kvs) = self
            .runtime
            .block_on(self.etcd.range(&prefix, &prefix_end(&prefix)))?;
        let instances: Vec<Json> = kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
            .collect();
        let view = self.list()?;
        Ok(json!({"revision": view.config_revision, "instances": instances}))
    }
}
