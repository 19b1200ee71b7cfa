//! `[cluster]` for a fleet whose shared objects live in etcd (docs/cluster.md): this
//! node's name, how to reach etcd, and per-node bind addresses of shared listeners.
//!
//! The raw table and its validation live here rather than in `raw.rs` / `validate.rs` so
//! that other `[cluster]` settings (shared rate limits in Redis) stay apart from these.
//! `objects` is the other half: the key layout of the shared objects in etcd, and turning
//! them into a config (and a config into them) with errors located at the etcd key.

pub mod objects;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{FieldPath, Issue};
use crate::model::{PemCertKey, PemFile};
use crate::raw::{RawCertKey, RawListener, StrOrInt, StrOrList};

/// `[cluster]`: the keys of a fleet in etcd (`node`, `etcd`, `binds`), and `redis`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCluster {
    /// This instance's name in the fleet (unique per instance).
    pub node: Option<String>,
    pub etcd: Option<RawEtcd>,
    /// Per-node addresses of shared listeners, by listener name: replace their `bind`.
    pub binds: Option<BTreeMap<String, StrOrList>>,
    /// `[cluster.redis.NAME]`: where shared rate limits count (validate/cluster.rs).
    pub redis: Option<BTreeMap<String, crate::raw::RawRedis>>,
    /// The key that encrypts private keys shared through etcd (certificates, ACME account).
    pub key_file: Option<String>,
}

/// `etcd = { endpoints, prefix, ... }` of `[cluster]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEtcd {
    pub endpoints: Option<Vec<String>>,
    pub prefix: Option<String>,
    pub ca: Option<String>,
    pub client_cert: Option<RawCertKey>,
    pub user: Option<String>,
    pub password_file: Option<String>,
    pub timeout: Option<String>,
    pub lease_ttl: Option<String>,
    pub snapshot: Option<String>,
    pub max_txn_bytes: Option<StrOrInt>,
}

/// A fleet member's settings: `[cluster]` with `etcd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdCluster {
    /// This instance's name: its registration key and what `weir ctl cluster status` lists.
    pub node: String,
    /// `http://host:port` or `https://host:port` of each etcd member, tried in turn.
    pub endpoints: Vec<String>,
    /// The key prefix of this fleet, `/` first, no `/` last (`/weir/prod`).
    pub prefix: String,
    /// CA certificates for `https://` endpoints; `None`: the system's roots.
    pub ca: Option<PemFile>,
    /// A client certificate and key for etcd members that ask for one.
    pub client_cert: Option<PemCertKey>,
    /// etcd authentication: the user, with the password in `password_file`.
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
    /// One request to etcd: longer counts as etcd unreachable.
    pub timeout: Duration,
    /// The registration lease: an instance gone this long drops out of `cluster status`.
    pub lease_ttl: Duration,
    /// The most bytes of keys and values one transaction writes (a write is split into
    /// transactions of at most this; one object over it is refused): under etcd's
    /// `--max-request-bytes`.
    pub max_txn_bytes: usize,
    /// Where the last applied shared objects are kept, so a restart while etcd is down
    /// comes up with them.
    pub snapshot: PathBuf,
    /// `binds`: listener name -> this node's addresses (as written), in place of the
    /// shared listener's `bind`.
    pub binds: BTreeMap<String, Vec<String>>,
    /// `key_file`: with it, automatic certificates are shared through etcd, their private
    /// keys encrypted with this key; without it, each instance keeps its own.
    pub cert_key: Option<FleetKey>,
}

/// The 256-bit key of `[cluster] key_file` (never printed).
#[derive(Clone, PartialEq, Eq)]
pub struct FleetKey {
    pub path: PathBuf,
    pub bytes: [u8; 32],
    /// The file can be read by others than its owner (a warning at start, not an error).
    pub group_or_world_readable: bool,
}

impl std::fmt::Debug for FleetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FleetKey({})", self.path.display())
    }
}

/// The default `timeout`, `lease_ttl`.
const DEFAULT_TIMEOUT: &str = "2s";
const DEFAULT_LEASE_TTL: &str = "10s";
/// The default `max_txn_bytes`: well under etcd's default request limit (1.5 MiB), with
/// the version key, the pending marker and framing.
pub const DEFAULT_MAX_TXN_BYTES: usize = 1024 * 1024;
/// The least `max_txn_bytes`: room for an object of some size beside the keys written.
const MIN_MAX_TXN_BYTES: u64 = 64 * 1024;

/// Validates `[cluster]`'s `node`, `etcd` and `binds`; `None` when `etcd` is not set.
pub(crate) fn validate(
    raw: Option<&mut RawCluster>,
    path: &FieldPath,
) -> Result<Option<EtcdCluster>, Issue> {
    let Some(raw) = raw else { return Ok(None) };
    let Some(etcd) = raw.etcd.take() else {
        let set = [
            ("node", raw.node.is_some()),
            ("binds", raw.binds.is_some()),
            ("key_file", raw.key_file.is_some()),
        ];
        for (key, set) in set {
            if set {
                return Err(Issue::new(
                    &path.key(key),
                    format!("[cluster] {key} belongs to a fleet whose objects live in etcd, and there is no etcd"),
                    r#"add etcd = { endpoints = ["http://127.0.0.1:2379"], prefix = "/weir/NAME" }, or remove the key"#,
                ));
            }
        }
        return Ok(None);
    };
    let node = node(raw.node.take(), &path.key("node"))?;
    let binds = binds(raw.binds.as_ref(), &path.key("binds"))?;
    let cert_key = match raw.key_file.take() {
        Some(file) => Some(fleet_key(PathBuf::from(file), &path.key("key_file"))?),
        None => None,
    };
    let mut settings = etcd_settings(etcd, node, binds, &path.key("etcd"))?;
    settings.cert_key = cert_key;
    Ok(Some(settings))
}

/// Reads `key_file`: 64 hexadecimal digits (surrounding white space ignored) or 32 raw bytes.
fn fleet_key(path: PathBuf, at: &FieldPath) -> Result<FleetKey, Issue> {
    use std::os::unix::fs::PermissionsExt;
    let fix = "write 32 random bytes as 64 hex digits, the same file on every instance: \
               openssl rand -hex 32 > /etc/weir/cluster.key; chmod 600 /etc/weir/cluster.key";
    let shown = path.display();
    let data = crate::named_file::read(&path, crate::named_file::MAX_SECRET_SIZE)
        .map_err(|e| Issue::new(at, format!("cannot read key_file {shown}: {e}"), fix))?;
    let text = std::str::from_utf8(&data).map(str::trim).unwrap_or("");
    let mut bytes = [0u8; 32];
    if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        for (i, pair) in text.as_bytes().chunks(2).enumerate() {
            let digits = std::str::from_utf8(pair).unwrap_or("00");
            bytes[i] = u8::from_str_radix(digits, 16).unwrap_or(0);
        }
    } else if data.len() == 32 {
        bytes.copy_from_slice(&data);
    } else {
        return Err(Issue::new(
            at,
            format!(
                "key_file {shown} holds {} bytes: expected a 256-bit key (64 hex digits, or 32 raw bytes)",
                data.len()
            ),
            fix,
        ));
    }
    let mode = std::fs::metadata(&path).map_or(0, |m| m.permissions().mode());
    Ok(FleetKey {
        path,
        bytes,
        group_or_world_readable: mode & 0o077 != 0,
    })
}

fn node(raw: Option<String>, path: &FieldPath) -> Result<String, Issue> {
    let fix = r#"write node = "edge-1": a name of letters, digits, '_', '.' and '-', unique in the fleet"#;
    let node = raw.ok_or_else(|| Issue::new(path, "a fleet member needs a node name", fix))?;
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if node.is_empty() || !node.chars().all(valid) {
        return Err(Issue::new(
            path,
            format!("invalid node name \"{node}\""),
            fix,
        ));
    }
    Ok(node)
}

fn binds(
    raw: Option<&BTreeMap<String, StrOrList>>,
    path: &FieldPath,
) -> Result<BTreeMap<String, Vec<String>>, Issue> {
    let mut out = BTreeMap::new();
    for (name, addrs) in raw.into_iter().flatten() {
        let fix = r#"write binds = { web = "0.0.0.0:80" } (a listener name and this node's address, or a list)"#;
        let list = match addrs {
            StrOrList::One(one) => vec![one.clone()],
            StrOrList::Many(many) => many.clone(),
        };
        for (i, a) in list.iter().enumerate() {
            if a.trim().parse::<std::net::SocketAddr>().is_err() {
                let at = match addrs {
                    StrOrList::One(_) => path.key(name),
                    StrOrList::Many(_) => path.key(name).index(i),
                };
                return Err(Issue::new(
                    &at,
                    format!("invalid address \"{a}\": expected an IP address and a port"),
                    fix,
                ));
            }
        }
        if list.is_empty() {
            return Err(Issue::new(
                &path.key(name),
                "the list of addresses is empty",
                fix,
            ));
        }
        out.insert(name.clone(), list);
    }
    Ok(out)
}

fn etcd_settings(
    raw: RawEtcd,
    node: String,
    binds: BTreeMap<String, Vec<String>>,
    path: &FieldPath,
) -> Result<EtcdCluster, Issue> {
    let endpoints = endpoints(raw.endpoints, &path.key("endpoints"))?;
    let prefix = prefix(raw.prefix, &path.key("prefix"))?;
    let ca = match raw.ca {
        None => None,
        Some(file) => Some(crate::validate::certificates(file, &path.key("ca"))?),
    };
    let client_cert = match raw.client_cert {
        None => None,
        Some(pair) => Some(crate::validate::cert_key(pair, &path.key("client_cert"))?),
    };
    let password_file =
        match (&raw.user, raw.password_file) {
            (Some(_), None) => return Err(Issue::new(
                &path.key("password_file"),
                "etcd user is set without a password_file",
                "give password_file = \"/etc/weir/etcd.password\" (a file holding the password)",
            )),
            (_, p) => p.map(PathBuf::from),
        };
    let snapshot = raw.snapshot.map_or_else(
        || crate::state_dir().join(format!("cluster-{node}.snapshot.json")),
        PathBuf::from,
    );
    Ok(EtcdCluster {
        timeout: crate::validate::duration(
            raw.timeout,
            DEFAULT_TIMEOUT,
            &path.key("timeout"),
            true,
        )?,
        lease_ttl: lease_ttl(raw.lease_ttl, &path.key("lease_ttl"))?,
        max_txn_bytes: max_txn_bytes(raw.max_txn_bytes, &path.key("max_txn_bytes"))?,
        node,
        endpoints,
        prefix,
        ca,
        client_cert,
        user: raw.user,
        password_file,
        snapshot,
        binds,
        cert_key: None,
    })
}

fn endpoints(raw: Option<Vec<String>>, path: &FieldPath) -> Result<Vec<String>, Issue> {
    let fix = r#"write endpoints = ["http://10.0.0.5:2379", "http://10.0.0.6:2379"] (every member of the etcd cluster)"#;
    let list = raw
        .filter(|l| !l.is_empty())
        .ok_or_else(|| Issue::new(path, "etcd needs at least one endpoint", fix))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, e) in list.iter().enumerate() {
        let e = e.trim().trim_end_matches('/');
        let host = e
            .strip_prefix("http://")
            .or_else(|| e.strip_prefix("https://"));
        if host.is_none_or(|h| h.is_empty() || h.contains('/')) {
            return Err(Issue::new(
                &path.index(i),
                format!(
                    "invalid etcd endpoint \"{e}\": expected http://HOST:PORT or https://HOST:PORT"
                ),
                fix,
            ));
        }
        out.push(e.to_owned());
    }
    Ok(out)
}

fn prefix(raw: Option<String>, path: &FieldPath) -> Result<String, Issue> {
    let fix = r#"write prefix = "/weir/prod": the keys of this fleet, shared by all its instances"#;
    let p = raw.ok_or_else(|| Issue::new(path, "etcd needs a key prefix", fix))?;
    let p = p.trim().trim_end_matches('/');
    if !p.starts_with('/') || p.len() < 2 || p.contains("//") {
        return Err(Issue::new(
            path,
            format!("invalid prefix \"{p}\": it must start with / and name at least one level"),
            fix,
        ));
    }
    Ok(p.to_owned())
}

fn lease_ttl(raw: Option<String>, path: &FieldPath) -> Result<Duration, Issue> {
    let ttl = crate::validate::duration(raw, DEFAULT_LEASE_TTL, path, true)?;
    if ttl < Duration::from_secs(2) {
        return Err(Issue::new(
            path,
            "lease_ttl must be at least 2s (etcd counts leases in whole seconds)",
            "write lease_ttl = \"10s\"",
        ));
    }
    Ok(ttl)
}

fn max_txn_bytes(raw: Option<StrOrInt>, path: &FieldPath) -> Result<usize, Issue> {
    let bytes = crate::validate::size(raw, DEFAULT_MAX_TXN_BYTES as u64, path)?;
    if bytes < MIN_MAX_TXN_BYTES {
        return Err(Issue::new(
            path,
            format!("max_txn_bytes must be at least 64KiB (is {bytes})"),
            "write max_txn_bytes = \"1MiB\" (the default), or more with etcd's --max-request-bytes raised",
        ));
    }
    Ok(usize::try_from(bytes).unwrap_or(usize::MAX))
}

/// Gives each listener named in `binds` this node's addresses in place of its `bind`.
pub(crate) fn override_binds(raw: Option<&RawCluster>, listeners: &mut [RawListener]) {
    let Some(binds) = raw.and_then(|c| c.binds.as_ref()) else {
        return;
    };
    for l in listeners.iter_mut() {
        if let Some(addrs) = l.name.as_ref().and_then(|n| binds.get(n)) {
            l.bind = Some(addrs.clone());
        }
    }
}

/// `[cluster]` with `etcd`, the local file's sections: any shared object in it is an error
/// (they live in etcd; `weir ctl cluster push` puts them there).
pub fn check_local_file(text: &str, file: &str) -> Result<(), crate::ConfigError> {
    let Ok(doc) = text.parse::<toml_edit::DocumentMut>() else {
        return Ok(()); // the load reports it
    };
    for key in objects::SHARED_SECTIONS {
        if doc.contains_key(key) {
            return Err(crate::ConfigError::at_field(
                file,
                text,
                key,
                format!("{key} are shared objects of the fleet and live in etcd, not in the local file of a [cluster] member"),
                "move them to etcd with `weir ctl cluster push -f FILE`, and keep [server], [admin] and [cluster] here",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    fn with_key(contents: &[u8], mode: u32) -> Result<crate::Config, crate::ConfigError> {
        let dir = std::env::temp_dir().join(format!("weir-fleet-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("key-{}-{mode:o}", contents.len()));
        std::fs::write(&path, contents).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let text = format!(
            "[cluster]\nnode = \"a\"\nkey_file = {:?}\netcd = {{ endpoints = [\"http://127.0.0.1:2379\"], prefix = \"/w\" }}\n",
            path.display().to_string()
        );
        crate::parse_str(&text, "local.toml")
    }

    #[test]
    fn key_file_holds_a_256_bit_key_in_hex_or_raw() {
        let hex = format!("{}\n", "0f".repeat(32));
        let config = with_key(hex.as_bytes(), 0o600).unwrap();
        let key = config.cluster.etcd.unwrap().cert_key.unwrap();
        assert_eq!(key.bytes, [0x0f; 32]);
        assert!(!key.group_or_world_readable);
        // The bytes are 0x0f (15): Debug shows the path only, never them.
        assert_eq!(
            format!("{key:?}"),
            format!("FleetKey({})", key.path.display())
        );
        let raw = with_key(&[9u8; 32], 0o644).unwrap();
        let key = raw.cluster.etcd.unwrap().cert_key.unwrap();
        assert_eq!(key.bytes, [9; 32]);
        assert!(key.group_or_world_readable, "warned about at start");
    }

    #[test]
    fn a_key_file_of_another_length_is_refused_with_the_fix() {
        let e = with_key(b"short", 0o600).unwrap_err().to_string();
        assert!(e.contains("holds 5 bytes: expected a 256-bit key"), "{e}");
        assert!(e.contains("openssl rand -hex 32"), "{e}");
        assert!(e.starts_with("local.toml:3:1: cluster.key_file:"), "{e}");
        let text = "[cluster]\nkey_file = \"/k\"\n";
        let e = crate::parse_str(text, "local.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("[cluster] key_file belongs to a fleet"), "{e}");
    }

    /// `max_txn_bytes`: 1 MiB by default, a size with a unit, at least 64 KiB (refused
    /// with the file, line, field and fix).
    #[test]
    fn max_txn_bytes_is_a_size_of_at_least_64_kib() {
        let parse = |field: &str| {
            let text = format!(
                "[cluster]\nnode = \"a\"\netcd = {{ endpoints = [\"http://127.0.0.1:2379\"], prefix = \"/w\"{field} }}\n"
            );
            crate::parse_str(&text, "local.toml").map(|c| c.cluster.etcd.unwrap().max_txn_bytes)
        };
        assert_eq!(parse("").unwrap(), 1024 * 1024);
        assert_eq!(parse(", max_txn_bytes = \"8MiB\"").unwrap(), 8 << 20);
        let e = parse(", max_txn_bytes = \"1KiB\"").unwrap_err().to_string();
        assert!(
            e.starts_with(
                "local.toml:3:64: cluster.etcd.max_txn_bytes: max_txn_bytes must be at least 64KiB"
            ),
            "{e}"
        );
        assert!(e.contains("--max-request-bytes"), "{e}");
    }
}
