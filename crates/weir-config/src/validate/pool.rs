//! Validation of an upstream pool's behaviour: the load-balancing policy and its key, the
//! per-server `weight`, `max_connections` and `backup`, and the `health_check`, `passive`
//! and `retry` tables.

use std::time::Duration;

use super::{duration, int_in};
use crate::error::{FieldPath, Issue};
use crate::model::{
    HashKey, HealthCheck, HealthCheckKind, LbPolicy, PassiveHealth, RetryOn, RetryPolicy,
    StatusRange, UpstreamServer,
};
use crate::raw::{RawHealthCheck, RawPassive, RawRetry, RawUpstream, RawUpstreamServer, StrOrInt};

/// The accepted `lb` values, for messages.
const POLICIES: &str = r#""round_robin", "weighted_round_robin", "least_connections", "random", "p2c_ewma", "consistent_hash" or "sticky_cookie""#;

/// The cookie name of `lb = "sticky_cookie"` when `sticky_cookie` is not given.
pub(crate) const DEFAULT_STICKY_COOKIE: &str = "weir_server";

/// Largest server weight (bounds the consistent-hash ring).
const MAX_WEIGHT: i64 = 1000;

/// Most retry attempts.
const MAX_ATTEMPTS: i64 = 10;

/// The policy-related keys of `[upstreams.NAME]`, taken out of the raw table.
pub(super) struct RawPolicy {
    pub lb: Option<String>,
    pub hash_key: Option<String>,
    pub sticky_cookie: Option<String>,
    pub health_check: Option<RawHealthCheck>,
    pub passive: Option<RawPassive>,
    pub retry: Option<RawRetry>,
}

impl RawPolicy {
    pub(super) fn take(raw: &mut RawUpstream) -> RawPolicy {
        RawPolicy {
            lb: raw.lb.take(),
            hash_key: raw.hash_key.take(),
            sticky_cookie: raw.sticky_cookie.take(),
            health_check: raw.health_check.take(),
            passive: raw.passive.take(),
            retry: raw.retry.take(),
        }
    }
}

/// The validated policy-related settings of a pool.
pub(super) struct Policy {
    pub lb: LbPolicy,
    pub health_check: Option<HealthCheck>,
    pub passive: PassiveHealth,
    pub retry: RetryPolicy,
}

/// Validates the policy keys of a pool whose servers are already validated.
pub(super) fn policy(
    raw: RawPolicy,
    servers: &[UpstreamServer],
    path: &FieldPath,
) -> Result<Policy, Issue> {
    let lb = lb(&raw, path)?;
    check_servers(&lb, servers, &path.key("servers"))?;
    Ok(Policy {
        lb,
        health_check: raw
            .health_check
            .map(|h| health_check(h, &path.key("health_check")))
            .transpose()?,
        passive: passive(raw.passive.unwrap_or_default(), &path.key("passive"))?,
        retry: retry(raw.retry.unwrap_or_default(), &path.key("retry"))?,
    })
}

// ---------------------------------------------------------------- lb, hash_key, sticky_cookie

fn lb(raw: &RawPolicy, path: &FieldPath) -> Result<LbPolicy, Issue> {
    let lb_path = path.key("lb");
    let policy = match raw.lb.as_deref().map(str::trim) {
        None | Some("round_robin") => LbPolicy::RoundRobin,
        Some("weighted_round_robin") => LbPolicy::WeightedRoundRobin,
        Some("least_connections") => LbPolicy::LeastConnections,
        Some("random") => LbPolicy::Random,
        Some("p2c_ewma") => LbPolicy::P2cEwma,
        Some("consistent_hash") => {
            let key = match raw.hash_key.as_deref() {
                None => HashKey::ClientIp,
                Some(text) => hash_key(text, &path.key("hash_key"))?,
            };
            LbPolicy::ConsistentHash(key)
        }
        Some("sticky_cookie") => LbPolicy::StickyCookie {
            cookie: match raw.sticky_cookie.as_deref() {
                None => DEFAULT_STICKY_COOKIE.to_owned(),
                Some(name) => cookie_name(name, &path.key("sticky_cookie"))?,
            },
        },
        Some(other) => {
            let hint = match other {
                "wrr" => r#" (did you mean "weighted_round_robin"?)"#,
                "rr" | "roundrobin" | "roundRobin" => r#" (did you mean "round_robin"?)"#,
                "leastconn" | "least_conn" => r#" (did you mean "least_connections"?)"#,
                "hash" | "ip_hash" => r#" (did you mean "consistent_hash"?)"#,
                _ => "",
            };
            return Err(Issue::new(
                &lb_path,
                format!("unknown load-balancing policy \"{other}\"{hint}"),
                format!("use lb = {POLICIES}"),
            ));
        }
    };
    if raw.hash_key.is_some() && !matches!(policy, LbPolicy::ConsistentHash(_)) {
        return Err(Issue::new(
            &path.key("hash_key"),
            "hash_key only applies to lb = \"consistent_hash\"",
            "set lb = \"consistent_hash\", or remove hash_key",
        ));
    }
    if raw.sticky_cookie.is_some() && !matches!(policy, LbPolicy::StickyCookie { .. }) {
        return Err(Issue::new(
            &path.key("sticky_cookie"),
            "sticky_cookie only applies to lb = \"sticky_cookie\"",
            "set lb = \"sticky_cookie\", or remove sticky_cookie",
        ));
    }
    Ok(policy)
}

fn hash_key(text: &str, path: &FieldPath) -> Result<HashKey, Issue> {
    let fix = r#"use hash_key = "client_ip", "path", "header:NAME" or "cookie:NAME""#;
    let named = |prefix: &str| {
        text.strip_prefix(prefix)
            .map(|name| (name, is_token(name) && !name.is_empty()))
    };
    match text {
        "client_ip" => return Ok(HashKey::ClientIp),
        "path" => return Ok(HashKey::Path),
        _ => {}
    }
    match (named("header:"), named("cookie:")) {
        (Some((name, true)), _) => Ok(HashKey::Header(name.to_ascii_lowercase())),
        (_, Some((name, true))) => Ok(HashKey::Cookie(name.to_owned())),
        (Some((name, false)), _) | (_, Some((name, false))) => Err(Issue::new(
            path,
            format!("hash_key \"{text}\": \"{name}\" is not a valid header or cookie name"),
            "name it with letters, digits and !#$%&'*+-.^_`|~, such as \"header:X-User\"",
        )),
        (None, None) => Err(Issue::new(
            path,
            format!("unknown hash_key \"{text}\""),
            fix,
        )),
    }
}

fn cookie_name(text: &str, path: &FieldPath) -> Result<String, Issue> {
    if text.is_empty() || !is_token(text) {
        return Err(Issue::new(
            path,
            format!("\"{text}\" is not a valid cookie name"),
            format!("use letters, digits and !#$%&'*+-.^_`|~, such as \"{DEFAULT_STICKY_COOKIE}\""),
        ));
    }
    Ok(text.to_owned())
}

/// An RFC 9110 token (header and cookie names).
fn is_token(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

// ---------------------------------------------------------------- servers

/// `weight`, `max_connections` and `backup` of one server.
pub(super) fn server_options(
    raw: &RawUpstreamServer,
    path: &FieldPath,
) -> Result<(u32, Option<u32>, bool), Issue> {
    let weight = int_in(raw.weight, 1, 1..=MAX_WEIGHT, &path.key("weight"))?;
    let max_connections = match raw.max_connections {
        None => None,
        Some(n @ 1..=0xffff_ffff) => u32::try_from(n).ok(),
        Some(n) => {
            return Err(Issue::new(
                &path.key("max_connections"),
                format!("max_connections must be from 1 to {}, not {n}", u32::MAX),
                "set max_connections to the most requests the server may have in flight,                  or remove it (unlimited)",
            ))
        }
    };
    Ok((weight, max_connections, raw.backup.unwrap_or(false)))
}

/// A pool needs a primary server, and plain round robin ignores weights.
fn check_servers(lb: &LbPolicy, servers: &[UpstreamServer], path: &FieldPath) -> Result<(), Issue> {
    if !servers.is_empty() && servers.iter().all(|s| s.backup) {
        return Err(Issue::new(
            path,
            "every server is a backup; backups are used only while no primary server is up",
            "remove backup = true from at least one server",
        ));
    }
    if *lb == LbPolicy::RoundRobin {
        if let Some(i) = servers.iter().position(|s| s.weight != 1) {
            return Err(Issue::new(
                &path.index(i).key("weight"),
                "lb = \"round_robin\" gives every server the same share, so weight has no effect",
                "set lb = \"weighted_round_robin\" (or another weighted policy), or remove weight",
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- [upstreams.NAME.health_check]

fn health_check(raw: RawHealthCheck, path: &FieldPath) -> Result<HealthCheck, Issue> {
    let kind = match raw.kind.as_deref() {
        None | Some("http") => {
            grpc_keys_absent(&raw, path, "http")?;
            HealthCheckKind::Http {
                path: check_path(raw.path, &path.key("path"))?,
                expect_status: expect_status(raw.expect_status, &path.key("expect_status"))?,
            }
        }
        Some("tcp") => {
            http_keys_absent(&raw, path)?;
            grpc_keys_absent(&raw, path, "tcp")?;
            HealthCheckKind::Tcp
        }
        Some("grpc") => {
            http_keys_absent(&raw, path)?;
            HealthCheckKind::Grpc {
                service: grpc_service(raw.service.as_deref(), &path.key("service"))?,
            }
        }
        Some(other) => {
            return Err(Issue::new(
                &path.key("kind"),
                format!("unknown health check kind \"{other}\""),
                r#"use kind = "http" (GET path, check the status), "tcp" (connect only) or "grpc" (grpc.health.v1)"#,
            ))
        }
    };
    Ok(HealthCheck {
        kind,
        interval: duration(raw.interval, "2s", &path.key("interval"), true)?,
        timeout: duration(raw.timeout, "1s", &path.key("timeout"), true)?,
        rise: int_in(raw.rise, 2, 1..=100, &path.key("rise"))?,
        fall: int_in(raw.fall, 3, 1..=100, &path.key("fall"))?,
    })
}

/// `path` and `expect_status` belong to HTTP checks only.
fn http_keys_absent(raw: &RawHealthCheck, path: &FieldPath) -> Result<(), Issue> {
    let http_only = [
        ("path", raw.path.is_some()),
        ("expect_status", raw.expect_status.is_some()),
    ];
    match http_only.iter().find(|(_, set)| *set) {
        Some((key, _)) => Err(Issue::new(
            &path.key(key),
            format!("{key} only applies to kind = \"http\" health checks"),
            format!("set kind = \"http\", or remove {key}"),
        )),
        None => Ok(()),
    }
}

/// `service` belongs to gRPC checks only.
fn grpc_keys_absent(raw: &RawHealthCheck, path: &FieldPath, kind: &str) -> Result<(), Issue> {
    match raw.service {
        Some(_) => Err(Issue::new(
            &path.key("service"),
            format!("service only applies to kind = \"grpc\" health checks, not \"{kind}\""),
            "set kind = \"grpc\", or remove service",
        )),
        None => Ok(()),
    }
}

/// A gRPC service name: printable ASCII without spaces, at most 256 bytes; absent: `""`
/// (the server as a whole, by the grpc.health.v1 convention).
fn grpc_service(raw: Option<&str>, path: &FieldPath) -> Result<String, Issue> {
    let text = raw.unwrap_or("");
    if text.len() > 256 || !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Issue::new(
            path,
            format!("service {text:?} is not a gRPC service name (printable ASCII, no spaces, at most 256 bytes)"),
            r#"use the fully qualified name, e.g. service = "my.package.MyService", or remove it to check the whole server"#,
        ));
    }
    Ok(text.to_owned())
}

fn check_path(raw: Option<String>, path: &FieldPath) -> Result<String, Issue> {
    let text = raw.unwrap_or_else(|| "/".to_owned());
    if !text.starts_with('/') || text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Issue::new(
            path,
            format!("health check path \"{text}\" must start with '/' and contain no spaces"),
            "use a path such as \"/healthz\" (a query string is allowed)",
        ));
    }
    Ok(text)
}

/// `"200-399"`, `"200"`, `"200,204,300-399"` or the integer `200`.
fn expect_status(raw: Option<StrOrInt>, path: &FieldPath) -> Result<Vec<StatusRange>, Issue> {
    let text = match raw {
        None => "200-399".to_owned(),
        Some(StrOrInt::Str(s)) => s,
        Some(StrOrInt::Int(n)) => n.to_string(),
    };
    let fix = r#"use a status, a range or a list of them, such as "200-399" or "200,204""#;
    let bad = |why: String| Issue::new(path, why, fix);
    let code = |s: &str| {
        s.trim()
            .parse::<u16>()
            .ok()
            .filter(|c| (100..=599).contains(c))
            .ok_or_else(|| {
                bad(format!(
                    "expect_status \"{text}\": \"{}\" is not a status code from 100 to 599",
                    s.trim()
                ))
            })
    };
    let mut out = Vec::new();
    for part in text.split(',') {
        let range = match part.split_once('-') {
            Some((a, b)) => StatusRange {
                first: code(a)?,
                last: code(b)?,
            },
            None => {
                let c = code(part)?;
                StatusRange { first: c, last: c }
            }
        };
        if range.first > range.last {
            return Err(bad(format!(
                "expect_status \"{text}\": the range {}-{} is backwards",
                range.first, range.last
            )));
        }
        out.push(range);
    }
    Ok(out)
}

// ---------------------------------------------------------------- [upstreams.NAME.passive]

fn passive(raw: RawPassive, path: &FieldPath) -> Result<PassiveHealth, Issue> {
    let fail_timeout = duration(raw.fail_timeout, "10s", &path.key("fail_timeout"), true)?;
    let slow_start = match raw.slow_start {
        None => fail_timeout,
        Some(text) => duration(Some(text), "10s", &path.key("slow_start"), false)?,
    };
    Ok(PassiveHealth {
        max_fails: int_in(raw.max_fails, 1, 0..=1000, &path.key("max_fails"))?,
        fail_timeout,
        slow_start: slow_start.min(Duration::from_secs(3600)),
    })
}

// ---------------------------------------------------------------- [upstreams.NAME.retry]

fn retry(raw: RawRetry, path: &FieldPath) -> Result<RetryPolicy, Issue> {
    let attempts: u32 = int_in(raw.attempts, 1, 0..=MAX_ATTEMPTS, &path.key("attempts"))?;
    let on_path = path.key("on");
    let on = match raw.on {
        None => RetryOn {
            connect_error: true,
            reset_before_response: true,
            ..RetryOn::default()
        },
        Some(list) => {
            let mut on = RetryOn::default();
            for (i, item) in list.into_iter().enumerate() {
                retry_condition(item, &mut on, &on_path.index(i))?;
            }
            on
        }
    };
    let none = !on.connect_error && !on.reset_before_response && !on.timeout;
    if attempts > 0 && none && on.statuses.is_empty() {
        return Err(Issue::new(
            &on_path,
            "on is empty, so nothing would be retried",
            "list conditions such as [\"connect_error\", \"reset_before_response\"], or set attempts = 0",
        ));
    }
    Ok(RetryPolicy {
        attempts,
        on,
        budget_percent: int_in(raw.budget_percent, 20, 1..=100, &path.key("budget_percent"))?,
    })
}

fn retry_condition(item: StrOrInt, on: &mut RetryOn, path: &FieldPath) -> Result<(), Issue> {
    let text = match item {
        StrOrInt::Str(s) => s,
        StrOrInt::Int(n) => n.to_string(),
    };
    match text.trim() {
        "connect_error" => on.connect_error = true,
        "reset_before_response" => on.reset_before_response = true,
        "timeout" => on.timeout = true,
        code => match code.parse::<u16>() {
            Ok(status @ 500..=599) => {
                if !on.statuses.contains(&status) {
                    on.statuses.push(status);
                }
            }
            _ => {
                return Err(Issue::new(
                    path,
                    format!("unknown retry condition \"{text}\""),
                    "use \"connect_error\", \"reset_before_response\", \"timeout\" or a 5xx \
                     status such as \"502\", \"503\", \"504\"",
                ))
            }
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests;
