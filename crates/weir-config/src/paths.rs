//! Relative file paths in the config resolve against the directory of the config file, not
//! the working directory: a config that `weir check` accepts from one directory must start
//! from another (a systemd unit runs in `/`). Paths are rewritten in the raw config, before
//! validation reads any file (htpasswd, upstream CA), so every later use and every error
//! shows the absolute path that was tried. Text parsed without a file (`parse_str`) keeps
//! the working directory.

use std::path::{Path, PathBuf};

use crate::error::FieldPath;
use crate::raw::{RawCertKey, RawConfig, RawListener, RawTls, RawUpstream};

/// A path the config wrote relative, and where it resolved to (`weir check` lists them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelativePath {
    /// The key, as in errors: `listeners[0].tls.certs[0].cert`.
    pub field: String,
    /// As written.
    pub written: String,
    pub resolved: PathBuf,
}

/// Rewrites every relative path of `raw` as `base` joined with it; returns them.
pub(crate) fn resolve(raw: &mut RawConfig, base: &Path) -> Vec<RelativePath> {
    let mut out = Resolver {
        base,
        found: Vec::new(),
    };
    let root = FieldPath::default();
    if let Some(admin) = raw.admin.as_mut() {
        out.fix(&mut admin.token_file, &root.key("admin").key("token_file"));
    }
    for (i, l) in raw.listeners.iter_mut().flatten().enumerate() {
        out.listener(l, &root.key("listeners").index(i));
    }
    for (name, u) in raw.upstreams.iter_mut().flatten() {
        out.upstream(u, &root.key("upstreams").key(name));
    }
    for (name, store) in raw.caches.iter_mut().flatten() {
        out.fix(&mut store.path, &root.key("caches").key(name).key("path"));
    }
    if let Some(etcd) = raw.cluster.as_mut().and_then(|c| c.etcd.as_mut()) {
        out.etcd(etcd, &root.key("cluster").key("etcd"));
    }
    let redis = raw
        .cluster
        .iter_mut()
        .flat_map(|c| c.redis.iter_mut().flatten());
    for (name, r) in redis {
        let at = root.key("cluster").key("redis").key(name);
        out.fix(&mut r.ca, &at.key("ca"));
        out.fix(&mut r.password_file, &at.key("password_file"));
        if let Some(c) = r.client_cert.as_mut() {
            out.cert_key(c, &at.key("client_cert"));
        }
    }
    out.found
}

struct Resolver<'a> {
    base: &'a Path,
    found: Vec<RelativePath>,
}

impl Resolver<'_> {
    /// Resolves one path value (an empty one is left for validation to report).
    fn fix(&mut self, value: &mut Option<String>, field: &FieldPath) {
        let Some(text) = value.as_mut() else { return };
        let written = text.trim();
        if written.is_empty() || Path::new(written).is_absolute() {
            return;
        }
        let resolved = self.base.join(written);
        self.found.push(RelativePath {
            field: field.to_string(),
            written: written.to_string(),
            resolved: resolved.clone(),
        });
        *text = resolved.to_string_lossy().into_owned();
    }

    fn listener(&mut self, l: &mut RawListener, at: &FieldPath) {
        if let Some(log) = l.access_log.as_mut() {
            if log.path.as_deref().map(str::trim) != Some("stdout") {
                self.fix(&mut log.path, &at.key("access_log").key("path"));
            }
        }
        if let Some(tls) = l.tls.as_mut() {
            self.tls(tls, &at.key("tls"));
        }
        for (i, r) in l.routes.iter_mut().flatten().enumerate() {
            if let Some(files) = r.files.as_mut() {
                let field = at.key("routes").index(i).key("files").key("root");
                self.fix(&mut files.root, &field);
            }
            if let Some(auth) = r.basic_auth.as_mut() {
                let field = at
                    .key("routes")
                    .index(i)
                    .key("basic_auth")
                    .key("users_file");
                self.fix(&mut auth.users_file, &field);
            }
        }
    }

    fn tls(&mut self, tls: &mut RawTls, at: &FieldPath) {
        for (i, c) in tls.certs.iter_mut().flatten().enumerate() {
            self.cert_key(c, &at.key("certs").index(i));
        }
        // Compared with the certs' paths, so resolved the same way.
        self.fix(&mut tls.default_cert, &at.key("default_cert"));
        if let Some(acme) = tls.acme.as_mut() {
            self.fix(&mut acme.storage, &at.key("acme").key("storage"));
            self.fix(&mut acme.directory_ca, &at.key("acme").key("directory_ca"));
        }
        if let Some(ca) = tls.internal_ca.as_mut() {
            self.fix(&mut ca.storage, &at.key("internal_ca").key("storage"));
        }
        if let Some(auth) = tls.client_auth.as_mut() {
            self.fix(&mut auth.ca, &at.key("client_auth").key("ca"));
        }
    }

    fn upstream(&mut self, u: &mut RawUpstream, at: &FieldPath) {
        let Some(tls) = u.tls.as_mut() else { return };
        let at = at.key("tls");
        self.fix(&mut tls.ca, &at.key("ca"));
        if let Some(c) = tls.client_cert.as_mut() {
            self.cert_key(c, &at.key("client_cert"));
        }
    }

    fn etcd(&mut self, etcd: &mut crate::cluster::RawEtcd, at: &FieldPath) {
        self.fix(&mut etcd.ca, &at.key("ca"));
        self.fix(&mut etcd.password_file, &at.key("password_file"));
        self.fix(&mut etcd.snapshot, &at.key("snapshot"));
        if let Some(c) = etcd.client_cert.as_mut() {
            self.cert_key(c, &at.key("client_cert"));
        }
    }

    fn cert_key(&mut self, c: &mut RawCertKey, at: &FieldPath) {
        self.fix(&mut c.cert, &at.key("cert"));
        self.fix(&mut c.key, &at.key("key"));
    }
}

/// The directory relative paths of the config file at `file` resolve against: its
/// parent, made absolute (the working directory for a bare file name).
pub(crate) fn base_of(file: &Path) -> PathBuf {
    let parent = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::path::absolute(parent).unwrap_or_else(|_| parent.to_path_buf())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn relative_paths_join_the_base_and_others_stay() {
        let text = "[admin]\ntoken_file = \"token\"\n[[listeners]]\nname = \"w\"\n\
                    bind = \"127.0.0.1:0\"\naccess_log = { path = \"stdout\" }\n\
                    [[listeners]]\nname = \"l\"\nbind = \"127.0.0.1:1\"\n\
                    access_log = { path = \"/var/log/weir.log\" }\n";
        let config = crate::parse_in(text, "t", Some(Path::new("/etc/weir"))).unwrap();
        assert_eq!(
            config.admin.token_file.as_deref(),
            Some(Path::new("/etc/weir/token"))
        );
        assert_eq!(
            config.relative_paths.len(),
            1,
            "{:?}",
            config.relative_paths
        );
        assert_eq!(config.relative_paths[0].field, "admin.token_file");
        assert_eq!(config.relative_paths[0].written, "token");
        let plain = crate::parse_str(text, "t").unwrap();
        assert_eq!(plain.admin.token_file.as_deref(), Some(Path::new("token")));
        assert_eq!(
            super::base_of(Path::new("/etc/weir/weir.toml")),
            Path::new("/etc/weir")
        );
        assert!(super::base_of(Path::new("weir.toml")).is_absolute());
    }
}
