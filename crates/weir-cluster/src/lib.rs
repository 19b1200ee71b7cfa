//! A fleet of Weir instances sharing their listeners, routes and upstreams through etcd
//! (`[cluster] etcd`, docs/cluster.md).
//!
//! - `etcd`: the client (etcd-client, one connection per member, the next on failure);
//! - `view`: the shared objects as this instance last saw them;
//! - `fleet`: the member: its config built from the view and the local file, applied;
//! - `sync`: the watch that keeps the view current, and the registration;
//! - `write`: the admin API's writes as conditioned transactions;
//! - `snapshot`: the last applied objects on disk, for a start while etcd is down;
//! - `admin`: `weir ctl cluster push | pull | status`, straight to etcd;
//! - `certs`: the automatic certificates shared through etcd (`key_file`): the order
//!   lock, the encrypted keys, the watch that installs other instances' certificates.
//!
//! Everything runs on one thread ("weir-etcd") with its own runtime, away from the data
//! plane, which never waits for etcd: with etcd gone, requests are served as before.

pub mod admin;
pub mod certs;
pub mod etcd;
pub mod fleet;
mod snapshot;
mod sync;
pub mod view;
pub mod write;

pub use fleet::{Fleet, Initial};
