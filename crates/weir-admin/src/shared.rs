//! Where the shared objects live when this instance is a fleet member (`[cluster] etcd`):
//! API writes go to the fleet's store (weir-cluster implements [`Shared`]) instead of
//! being applied here, and come back as they do to every instance, through
//! [`crate::Store::apply_shared`].

use weir_config::Config;

use crate::api::error::ApiError;

/// A fleet's shared objects, as the admin API writes them.
pub trait Shared: Send + Sync {
    /// Validates a whole config text as this instance would run it: its shared objects
    /// with the local file's per-node sections (those of `text` are left out). Returns the
    /// config and its text as the fleet assembles it; errors name the objects' keys.
    fn parse(&self, text: &str) -> Result<(Config, String), ApiError>;

    /// Writes the objects `text` changes from `base`, the text of version `base_version`
    /// (the edit was made on it). `expect` (If-Match): no object written may have changed
    /// after that version (else 412). Returns the version written.
    fn write(
        &self,
        base: &str,
        base_version: u64,
        text: &str,
        expect: Option<u64>,
    ) -> Result<u64, SharedError>;

    /// Waits until this instance has applied `version` (or rejected it: the error).
    fn wait_applied(&self, version: u64) -> Result<(), ApiError>;

    /// The running config's text as the fleet assembles it: the local file's per-node
    /// sections, then the shared objects running here.
    fn text(&self) -> String;

    /// SIGHUP: the local file changed; applies it with the shared objects.
    fn reload_local(&self, text: String) -> Result<(), ApiError>;

    /// `/ready`: whether the fleet side is ready, and a line saying how in sync it is.
    fn readiness(&self) -> (bool, String);
}

/// Why a write did not happen.
#[derive(Debug)]
pub enum SharedError {
    /// An object changed between the version the edit was made on and the write (by
    /// another instance or operator, with no If-Match at stake): edit again.
    Moved,
    Failed(ApiError),
}

impl From<ApiError> for SharedError {
    fn from(e: ApiError) -> SharedError {
        SharedError::Failed(e)
    }
}
