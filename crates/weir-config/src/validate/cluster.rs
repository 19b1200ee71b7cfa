//! Validation of `[cluster]` (what the instances of a fleet share) and of the references
//! to it: `[cluster.redis.NAME]` tables and the `shared = "NAME"` of rate limits.
//!
//! `[cluster]`'s `node`, `etcd` and `binds` (the fleet in etcd) validate in
//! `crate::cluster`; each part in its own function.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{check_name, duration};
use crate::cluster::RawCluster;
use crate::error::{FieldPath, Issue};
use crate::model::{Listener, OnRedisError, RedisSettings, SharedLimit};
use crate::raw::RawRedis;

/// The longest `sync_interval`: beyond it a shared limit is barely shared.
const MAX_SYNC_INTERVAL: Duration = Duration::from_secs(60);

/// The `[cluster.redis.NAME]` tables of `[cluster]` (taken out of it), sorted by name.
pub(super) fn redis(
    raw: Option<&mut RawCluster>,
    path: &FieldPath,
) -> Result<Vec<RedisSettings>, Issue> {
    let tables = raw.and_then(|c| c.redis.take()).unwrap_or_default();
    let mut redis = Vec::new();
    for (name, table) in tables {
        redis.push(redis_settings(name, table, &path.key("redis"))?);
    }
    Ok(redis)
}

fn redis_settings(name: String, raw: RawRedis, path: &FieldPath) -> Result<RedisSettings, Issue> {
    let path = path.key(&name);
    check_name(&name, &path, "redis")?;
    let url = redis_url(raw.url, &path.key("url"))?;
    let tls = url.starts_with("rediss://");
    for (key, given) in [
        ("ca", raw.ca.is_some()),
        ("client_cert", raw.client_cert.is_some()),
    ] {
        if given && !tls {
            return Err(Issue::new(
                &path.key(key),
                format!("{key} applies to TLS connections, but the url is not rediss://"),
                format!("write the url as \"rediss://...\", or remove {key}"),
            ));
        }
    }
    let password_file = password_file(raw.password_file, &url, &path.key("password_file"))?;
    let sync_path = path.key("sync_interval");
    let sync_interval = duration(raw.sync_interval, "100ms", &sync_path, true)?;
    if sync_interval > MAX_SYNC_INTERVAL {
        return Err(Issue::new(
            &sync_path,
            format!("sync_interval must be at most 60s, not {sync_interval:?}"),
            "set a shorter sync_interval such as \"100ms\" (the default): the longer it \
             is, the further the fleet can go past a shared limit",
        ));
    }
    let prefix = raw.prefix.unwrap_or_else(|| "weir:".to_owned());
    if prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Issue::new(
            &path.key("prefix"),
            format!("prefix {prefix:?} has spaces or control characters"),
            "use a prefix such as \"weir:\" (the default) or \"weir:prod:\"",
        ));
    }
    Ok(RedisSettings {
        ca: raw
            .ca
            .map(|f| super::upstream_tls::certificates(f, &path.key("ca")))
            .transpose()?,
        client_cert: raw
            .client_cert
            .map(|c| super::upstream_tls::cert_key(c, &path.key("client_cert")))
            .transpose()?,
        timeout: duration(raw.timeout, "1s", &path.key("timeout"), true)?,
        name,
        url,
        password_file,
        sync_interval,
        prefix,
    })
}

/// The password file of a Redis: readable now (`weir check` says so at once), and the only
/// password given.
fn password_file(
    raw: Option<String>,
    url: &str,
    path: &FieldPath,
) -> Result<Option<PathBuf>, Issue> {
    let Some(file) = raw else {
        return Ok(None);
    };
    let in_url = url
        .split_once("://")
        .and_then(|(_, rest)| rest.rsplit_once('@'))
        .is_some_and(|(auth, _)| auth.contains(':'));
    if in_url {
        return Err(Issue::new(
            path,
            "the url has a password and password_file gives another",
            "remove the password from the url (keep the user: redis://USER@HOST:PORT), or remove password_file",
        ));
    }
    let secret = crate::named_file::MAX_SECRET_SIZE;
    if let Err(e) = crate::named_file::read(Path::new(&file), secret) {
        return Err(Issue::new(
            path,
            format!("cannot read password_file {file}: {e}"),
            crate::named_file::fix_for(&e).unwrap_or(
                "give a readable file holding the password (a trailing newline is ignored)",
            ),
        ));
    }
    Ok(Some(PathBuf::from(file)))
}

/// `redis://host:port[/db]` or `rediss://...`; the rest is checked by the client.
fn redis_url(raw: Option<String>, path: &FieldPath) -> Result<String, Issue> {
    let fix = "write url = \"redis://127.0.0.1:6379\" (or \"rediss://...\" for TLS)";
    let url = raw.ok_or_else(|| Issue::new(path, "the redis table has no url", fix))?;
    let url = url.trim().to_owned();
    let rest = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"));
    let host = rest.map(|r| r.rsplit('@').next().unwrap_or(r));
    match host {
        Some(h) if !h.is_empty() && !h.starts_with('/') => Ok(url),
        _ => Err(Issue::new(
            path,
            format!("invalid redis url \"{}\"", redact(&url)),
            fix,
        )),
    }
}

/// `url` without a password, for messages.
pub(crate) fn redact(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
    match rest.rsplit_once('@') {
        Some((auth, host)) => {
            let user = auth.split_once(':').map_or(auth, |(user, _)| user);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
}

/// `shared` and `on_error` of a `rate_limit`.
pub(super) fn shared_limit(
    shared: Option<String>,
    on_error: Option<String>,
    path: &FieldPath,
) -> Result<Option<SharedLimit>, Issue> {
    let on_error = match on_error.as_deref().map(str::trim) {
        None | Some("allow") => OnRedisError::Allow,
        Some("deny") => OnRedisError::Deny,
        Some(other) => {
            return Err(Issue::new(
                &path.key("on_error"),
                format!("unknown on_error \"{other}\""),
                "use on_error = \"allow\" (the default: each instance limits alone while \
                 Redis is down) or \"deny\" (refuse with 503 until it is back)",
            ))
        }
    };
    let Some(redis) = shared else {
        if on_error != OnRedisError::Allow {
            return Err(Issue::new(
                &path.key("on_error"),
                "on_error applies to shared limits only",
                "add shared = \"NAME\" (a [cluster.redis.NAME] table), or remove on_error",
            ));
        }
        return Ok(None);
    };
    Ok(Some(SharedLimit { redis, on_error }))
}

/// Every `shared = "NAME"` must name a `[cluster.redis.NAME]`.
pub(super) fn check_shared_refs(
    listeners: &[Listener],
    redis: &[RedisSettings],
    path: &FieldPath,
) -> Result<(), Issue> {
    for (li, listener) in listeners.iter().enumerate() {
        for (ri, route) in listener.routes.iter().enumerate() {
            let Some(limit) = &route.filters.rate_limit else {
                continue;
            };
            let Some(shared) = &limit.shared else {
                continue;
            };
            if !redis.iter().any(|r| r.name == shared.redis) {
                let known: Vec<&str> = redis.iter().map(|r| r.name.as_str()).collect();
                return Err(Issue::new(
                    &path
                        .index(li)
                        .key("routes")
                        .index(ri)
                        .key("rate_limit")
                        .key("shared"),
                    format!("no [cluster.redis.{}] table", shared.redis),
                    if known.is_empty() {
                        format!(
                            "add [cluster.redis.{}] with url = \"redis://HOST:6379\"",
                            shared.redis
                        )
                    } else {
                        format!("use one of: {}", known.join(", "))
                    },
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::redact;
    use crate::model::OnRedisError;
    use crate::validate::tests::check;
    use std::time::Duration;

    /// A listener whose route (lines 4-6) has `limit`, then `cluster` (from line 7).
    fn with_limit(limit: &str, cluster: &str) -> String {
        format!(
            "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\n\
             [[listeners.routes]]\nname = \"api\"\nrespond = {{ status = 200 }}\n\
             rate_limit = {limit}\n{cluster}"
        )
    }

    const REDIS: &str = "[cluster.redis.main]\nurl = \"redis://127.0.0.1:6379\"\n";

    #[test]
    fn shared_limits_and_their_redis() {
        let text = with_limit(
            r#"{ rate = "10/s", shared = "main", on_error = "deny" }"#,
            &format!("{REDIS}sync_interval = \"250ms\"\nprefix = \"weir:prod:\"\n"),
        );
        let config = crate::parse_str(&text, "t").expect("valid");
        let redis = config.cluster.redis("main").expect("main");
        assert_eq!(redis.sync_interval, Duration::from_millis(250));
        assert_eq!(redis.timeout, Duration::from_secs(1));
        assert_eq!(redis.prefix, "weir:prod:");
        let limit = config.listeners[0].routes[0].filters.rate_limit.clone();
        let shared = limit.and_then(|l| l.shared).expect("shared");
        assert_eq!(
            (shared.redis.as_str(), shared.on_error),
            ("main", OnRedisError::Deny)
        );
        let local = with_limit(r#"{ rate = "10/s" }"#, "");
        let config = crate::parse_str(&local, "t").expect("valid");
        assert!(config.listeners[0].routes[0]
            .filters
            .rate_limit
            .as_ref()
            .unwrap()
            .shared
            .is_none());
    }

    #[test]
    fn shared_limit_errors() {
        let shared = "listeners[0].routes[0].rate_limit.shared";
        let on_error = "listeners[0].routes[0].rate_limit.on_error";
        let text = with_limit(r#"{ rate = "10/s", shared = "main" }"#, "");
        check(
            &text,
            shared,
            7,
            "no [cluster.redis.main]",
            "url = \"redis://",
        );
        let other = REDIS.replace("main", "other");
        let text = with_limit(r#"{ rate = "10/s", shared = "main" }"#, &other);
        check(&text, shared, 7, "no [cluster.redis.main]", "one of: other");
        let text = with_limit(
            r#"{ rate = "10/s", shared = "main", on_error = "open" }"#,
            REDIS,
        );
        check(&text, on_error, 7, "unknown on_error \"open\"", "\"deny\"");
        let text = with_limit(r#"{ rate = "10/s", on_error = "deny" }"#, "");
        check(
            &text,
            on_error,
            7,
            "shared limits only",
            "shared = \"NAME\"",
        );
    }

    #[test]
    fn redis_errors() {
        let at = |key: &str| format!("cluster.redis.main.{key}");
        let limit = r#"{ rate = "10/s", shared = "main" }"#;
        let text = with_limit(limit, "[cluster.redis.main]\ntimeout = \"1s\"\n");
        check(&text, &at("url"), 8, "no url", "redis://127.0.0.1:6379");
        let text = with_limit(limit, "[cluster.redis.main]\nurl = \"http://:pw@h:1\"\n");
        check(
            &text,
            &at("url"),
            9,
            "invalid redis url \"http://:***@h:1\"",
            "rediss://",
        );
        let text = with_limit(limit, &format!("{REDIS}sync_interval = \"2m\"\n"));
        check(&text, &at("sync_interval"), 10, "at most 60s", "100ms");
        let text = with_limit(limit, &format!("{REDIS}sync_interval = \"0s\"\n"));
        check(&text, &at("sync_interval"), 10, "greater than 0", "100ms");
        let text = with_limit(limit, &format!("{REDIS}ca = \"ca.pem\"\n"));
        check(&text, &at("ca"), 10, "not rediss://", "rediss://");
        let text = with_limit(limit, &format!("{REDIS}prefix = \"a b\"\n"));
        check(&text, &at("prefix"), 10, "spaces", "weir:");
        let text = with_limit(limit, &format!("{REDIS}port = 1\n"));
        check(
            &text,
            "cluster.redis.main.port",
            10,
            "expected one of `url`",
            "remove the key",
        );
    }

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(redact("redis://:secret@h:6379"), "redis://:***@h:6379");
        assert_eq!(redact("redis://u:secret@h:6379"), "redis://u:***@h:6379");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
    }

    #[test]
    fn a_password_file_is_readable_and_the_only_password() {
        let at = "cluster.redis.main.password_file";
        let limit = r#"{ rate = "10/s", shared = "main" }"#;
        let file = std::env::temp_dir().join(format!("weir-redis-pw-{}", std::process::id()));
        std::fs::write(&file, "s3cret\n").expect("write");
        let redis = |url: &str, file: &str| {
            let table =
                format!("[cluster.redis.main]\nurl = \"{url}\"\npassword_file = \"{file}\"\n");
            with_limit(limit, &table)
        };
        let given = file.display().to_string();
        let config = crate::parse_str(&redis("redis://edge@r:6379", &given), "t").expect("valid");
        let main = config.cluster.redis("main").expect("main");
        assert_eq!(main.password_file.as_deref(), Some(file.as_path()));
        let both = redis("redis://edge:pw@r:6379", &given);
        check(
            &both,
            at,
            10,
            "the url has a password",
            "redis://USER@HOST:PORT",
        );
        let missing = redis("redis://r:6379", "/nonexistent/weir-pw");
        check(
            &missing,
            at,
            10,
            "cannot read password_file",
            "readable file",
        );
        let _ = std::fs::remove_file(file);
    }
}
