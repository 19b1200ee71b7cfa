//! The snapshot file: the shared objects last applied here, written whole (a temporary
//! file renamed over the old one) after each change applied, so an instance restarted
//! while etcd is unreachable comes up with them.

use serde_json::Value as Json;
use weir_config::cluster::EtcdCluster;

use crate::view::View;

/// The largest snapshot read: twice etcd's largest reply taken (`etcd::MAX_REPLY`), as its
/// JSON may be larger than the wire form. A bound all the same: the path could be
/// `/dev/zero`, or a file that is not Weir's.
const MAX_SNAPSHOT: u64 = 512 << 20;

/// Writes `text` (a view's [`View::to_json`]) as the snapshot file.
pub fn save(settings: &EtcdCluster, text: &str) -> std::io::Result<()> {
    weir_core::tls::auto::storage::write(&settings.snapshot, text.as_bytes(), true)
}

/// The snapshot of this fleet's prefix; `None` when there is none (or it is of another).
pub fn load(settings: &EtcdCluster) -> Result<Option<View>, String> {
    let path = &settings.snapshot;
    let bytes = match weir_config::named_file::read(path, MAX_SNAPSHOT) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let json: Json =
        serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let view = View::from_json(&json, &settings.prefix);
    if view.is_none() {
        tracing::warn!(path = %path.display(), "the cluster snapshot is of another prefix: not used");
    }
    Ok(view)
}
