//! Validation of the traffic-policy keys (issue 16): a route's header rules and the
//! other per-route filters, and the listener's client settings. Each filter left out of
//! the file stays `None` in the model, so routes without it pay nothing per request.

use std::collections::BTreeMap;

use super::is_tchar;
use super::tcp::cidr;
use crate::error::{FieldPath, Issue};
use crate::model::{
    AccessList, Cidr, HeaderRule, HeaderRules, Listener, ListenerPolicy, RateKey, RateLimit,
    RequestIdSettings, RouteFilters, Template, TemplatePart, Variable,
};
use crate::raw::{RawHeaderRules, RawListener, RawRateLimit, RawRequestId, RawRoute};

/// Most rules in one `set`, `add` or `remove` list.
const MAX_RULES: usize = 64;

/// The filters of a route; takes the policy keys out of `raw`.
pub(super) fn route_filters(raw: &mut RawRoute, path: &FieldPath) -> Result<RouteFilters, Issue> {
    let forwarded = raw.forwarded_headers.unwrap_or(true);
    let request_headers = raw
        .request_headers
        .take()
        .map(|r| header_rules(r, &path.key("request_headers"), Side::Request { forwarded }))
        .transpose()?;
    let response_headers = raw
        .response_headers
        .take()
        .map(|r| header_rules(r, &path.key("response_headers"), Side::Response))
        .transpose()?;
    Ok(RouteFilters {
        request_headers,
        response_headers,
        access: access_list(raw, path)?,
        rate_limit: raw
            .rate_limit
            .take()
            .map(|r| rate_limit(r, &path.key("rate_limit")))
            .transpose()?,
        basic_auth: raw
            .basic_auth
            .take()
            .map(|r| super::htpasswd::basic_auth(r, &path.key("basic_auth")))
            .transpose()?,
        compression: raw
            .compression
            .take()
            .map(|r| super::compression::compression(r, &path.key("compression")))
            .transpose()?,
        cache: raw
            .cache
            .take()
            .map(|r| super::cache::route_cache(r, &path.key("cache")))
            .transpose()?,
    })
}

/// The listener's policy settings; takes them out of `raw`.
pub(super) fn listener_policy(
    raw: &mut RawListener,
    path: &FieldPath,
) -> Result<ListenerPolicy, Issue> {
    let request_id = match raw.request_id.take() {
        None | Some(RawRequestId::Switch(true)) => Some(RequestIdSettings::default()),
        Some(RawRequestId::Switch(false)) => None,
        Some(RawRequestId::Table(t)) => {
            let header = t.header.unwrap_or_else(|| "X-Request-Id".to_owned());
            let at = path.key("request_id").key("header");
            check_name(&header, &at, Side::Request { forwarded: true }, Op::Set)?;
            if header.eq_ignore_ascii_case("host") {
                return Err(Issue::new(
                    &at,
                    "the request id cannot travel in Host",
                    "name another header, such as \"X-Request-Id\" (the default)",
                ));
            }
            Some(RequestIdSettings {
                header,
                trust_client: t.trust_client.unwrap_or(true),
            })
        }
    };
    let trusted_proxies = cidrs(raw.trusted_proxies.take(), &path.key("trusted_proxies"))?;
    if trusted_proxies.as_ref().is_some_and(Vec::is_empty) {
        return Err(Issue::new(
            &path.key("trusted_proxies"),
            "trusted_proxies is empty",
            "list the addresses of your proxies (such as [\"10.0.0.0/8\"]), or remove the key",
        ));
    }
    Ok(ListenerPolicy {
        request_id,
        trusted_proxies: trusted_proxies.unwrap_or_default(),
    })
}

/// Most entries in one address list (checked per request, in order).
const MAX_CIDRS: usize = 1024;

fn cidrs(raw: Option<Vec<String>>, path: &FieldPath) -> Result<Option<Vec<Cidr>>, Issue> {
    let Some(raw) = raw else { return Ok(None) };
    if raw.len() > MAX_CIDRS {
        return Err(Issue::new(
            path,
            format!("more than {MAX_CIDRS} address ranges"),
            "merge ranges into wider prefixes",
        ));
    }
    let list = raw
        .iter()
        .enumerate()
        .map(|(i, text)| cidr(text, &path.index(i)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(list))
}

/// `allow` / `deny` of a route.
fn access_list(raw: &mut RawRoute, path: &FieldPath) -> Result<Option<AccessList>, Issue> {
    let allow = cidrs(raw.allow.take(), &path.key("allow"))?;
    let deny = cidrs(raw.deny.take(), &path.key("deny"))?;
    if allow.as_ref().is_some_and(Vec::is_empty) {
        return Err(Issue::new(
            &path.key("allow"),
            "allow is empty, so every client would get 403",
            "list the allowed ranges, or remove allow (deny = [\"0.0.0.0/0\", \"::/0\"] refuses everyone on purpose)",
        ));
    }
    if allow.is_none() && deny.is_none() {
        return Ok(None);
    }
    Ok(Some(AccessList {
        allow: allow.unwrap_or_default(),
        deny: deny.unwrap_or_default(),
    }))
}

/// `rate_limit = { rate, burst, key, max_keys, shared, on_error }`.
fn rate_limit(raw: RawRateLimit, path: &FieldPath) -> Result<RateLimit, Issue> {
    let rate_path = path.key("rate");
    let text = raw.rate.ok_or_else(|| {
        Issue::new(
            &rate_path,
            "rate_limit has no rate",
            "add rate = \"100/s\" (requests per s, m, h or d)",
        )
    })?;
    let (count, interval) = parse_rate(&text).ok_or_else(|| {
        Issue::new(
            &rate_path,
            format!("invalid rate \"{text}\""),
            "write requests per unit: \"100/s\", \"30/m\", \"1000/h\" or \"5000/d\" (1 to 1000000 per unit)",
        )
    })?;
    let burst = super::int_in(
        raw.burst,
        i64::from(count).min(1_000_000),
        1..=1_000_000,
        &path.key("burst"),
    )?;
    let key = match raw.key.as_deref() {
        None | Some("client_ip") => RateKey::ClientIp,
        Some("route") => RateKey::Route,
        Some(other) => match other.strip_prefix("header:") {
            Some(name) if !name.is_empty() && name.bytes().all(is_tchar) => {
                RateKey::Header(name.to_owned())
            }
            _ => {
                return Err(Issue::new(
                    &path.key("key"),
                    format!("unknown rate-limit key \"{other}\""),
                    "use \"client_ip\" (the default), \"route\" or \"header:NAME\" (such as \"header:X-Api-Key\")",
                ))
            }
        },
    };
    let max_keys = super::int_in(raw.max_keys, 16_384, 16..=16_777_216, &path.key("max_keys"))?;
    Ok(RateLimit {
        interval,
        burst,
        key,
        max_keys,
        shared: super::cluster::shared_limit(raw.shared, raw.on_error, path)?,
    })
}

/// `"N/unit"` with unit `s`, `m`, `h` or `d`: the count and the interval between requests.
fn parse_rate(text: &str) -> Option<(u32, std::time::Duration)> {
    let (count, unit) = text.trim().split_once('/')?;
    let count: u32 = count
        .trim()
        .parse()
        .ok()
        .filter(|n| (1..=1_000_000).contains(n))?;
    let seconds: u64 = match unit.trim() {
        "s" | "sec" | "second" => 1,
        "m" | "min" | "minute" => 60,
        "h" | "hour" => 3600,
        "d" | "day" => 86_400,
        _ => return None,
    };
    Some((count, std::time::Duration::from_secs(seconds) / count))
}

/// Checks between a listener's settings and its routes' filters.
pub(super) fn check_listener(listener: Listener, path: &FieldPath) -> Result<Listener, Issue> {
    let Some(id) = &listener.policy.request_id else {
        return Ok(listener);
    };
    for (i, route) in listener.routes.iter().enumerate() {
        let Some(rules) = &route.filters.request_headers else {
            continue;
        };
        let named = rules.set.iter().chain(&rules.add).map(|r| r.name.as_str());
        if let Some(name) = named
            .chain(rules.drop.iter().map(String::as_str))
            .find(|n| n.eq_ignore_ascii_case(&id.header))
        {
            return Err(Issue::new(
                &path.key("routes").index(i).key("request_headers"),
                format!("header \"{name}\" carries the listener's request id"),
                "remove the rule (the id is set for every request), or set the listener's request_id = false",
            ));
        }
    }
    Ok(listener)
}

/// Which head a set of rules edits.
#[derive(Clone, Copy)]
enum Side {
    /// `forwarded`: the route sets the forwarded headers itself.
    Request {
        forwarded: bool,
    },
    Response,
}

/// What a rule does to its header, for messages.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Set,
    Add,
    Remove,
}

fn header_rules(raw: RawHeaderRules, path: &FieldPath, side: Side) -> Result<HeaderRules, Issue> {
    let mut rules = HeaderRules::default();
    let set = raw.set.unwrap_or_default();
    let add = raw.add.unwrap_or_default();
    let remove = raw.remove.unwrap_or_default();
    rules.set = value_rules(set, &path.key("set"), side, Op::Set)?;
    rules.add = value_rules(add, &path.key("add"), side, Op::Add)?;
    let remove_path = path.key("remove");
    check_count(remove.len(), &remove_path)?;
    let mut removed: Vec<String> = Vec::new();
    for (i, name) in remove.iter().enumerate() {
        let at = remove_path.index(i);
        check_name(name, &at, side, Op::Remove)?;
        // Folded as requests are (`X_Debug` is `X-Debug` to a CGI backend).
        let lower = crate::model::fold_name(name);
        if removed.contains(&lower) {
            return Err(Issue::new(
                &at,
                format!("header \"{name}\" is listed twice in remove"),
                "list each header once",
            ));
        }
        removed.push(lower);
    }
    check_overlaps(&rules, &removed, path)?;
    rules.sets_host = rules
        .set
        .iter()
        .any(|r| r.name.eq_ignore_ascii_case("host"));
    rules.drop = rules
        .set
        .iter()
        .map(|r| crate::model::fold_name(&r.name))
        .chain(removed.iter().map(|r| crate::model::fold_name(r)))
        .collect();
    Ok(rules)
}

/// A header named in two lists would be edited twice in one head: say which one to keep.
fn check_overlaps(rules: &HeaderRules, removed: &[String], path: &FieldPath) -> Result<(), Issue> {
    let fold = crate::model::fold_name;
    for r in &rules.add {
        let lower = fold(&r.name);
        let clash = if rules.set.iter().any(|s| fold(&s.name) == lower) {
            Some("set")
        } else if removed.contains(&lower) {
            Some("remove")
        } else {
            None
        };
        if let Some(other) = clash {
            return Err(Issue::new(
                &path.key("add").key(&r.name),
                format!("header \"{}\" is in both add and {other}", r.name),
                "name each header in one list: set replaces, add appends, remove drops",
            ));
        }
    }
    if let Some(r) = rules.set.iter().find(|r| removed.contains(&fold(&r.name))) {
        return Err(Issue::new(
            &path.key("set").key(&r.name),
            format!("header \"{}\" is in both set and remove", r.name),
            "set already drops the incoming header; remove it from one of the lists",
        ));
    }
    Ok(())
}

fn check_count(n: usize, path: &FieldPath) -> Result<(), Issue> {
    if n > MAX_RULES {
        return Err(Issue::new(
            path,
            format!("more than {MAX_RULES} header rules"),
            "keep the list short; rules run on every request of the route",
        ));
    }
    Ok(())
}

fn value_rules(
    raw: BTreeMap<String, String>,
    path: &FieldPath,
    side: Side,
    op: Op,
) -> Result<Vec<HeaderRule>, Issue> {
    check_count(raw.len(), path)?;
    let mut out: Vec<HeaderRule> = Vec::with_capacity(raw.len());
    for (name, value) in raw {
        let at = path.key(&name);
        check_name(&name, &at, side, op)?;
        if out.iter().any(|r| r.name.eq_ignore_ascii_case(&name)) {
            return Err(Issue::new(
                &at,
                format!("header \"{name}\" is named twice (names ignore case)"),
                "keep one spelling of the name",
            ));
        }
        out.push(HeaderRule {
            value: template(&value, &at)?,
            name,
        });
    }
    Ok(out)
}

/// A header name a rule may edit: a token, not hop-by-hop or framing, `Host` only by a
/// request `set`, the forwarded headers only when the route does not set them itself.
fn check_name(name: &str, path: &FieldPath, side: Side, op: Op) -> Result<(), Issue> {
    if name.is_empty() || !name.bytes().all(is_tchar) {
        return Err(Issue::new(
            path,
            format!("\"{name}\" is not a header name"),
            "use letters, digits and '-' (a token of RFC 9110), such as \"X-Env\"",
        ));
    }
    let lower = name.to_ascii_lowercase();
    const FRAMING: [&str; 8] = [
        "connection",
        "transfer-encoding",
        "content-length",
        "upgrade",
        "te",
        "keep-alive",
        "trailer",
        "http2-settings",
    ];
    if FRAMING.contains(&lower.as_str()) || lower.starts_with("proxy-") {
        return Err(Issue::new(
            path,
            format!(
                "header \"{name}\" is hop-by-hop or framing: Weir writes it itself for each \
                 connection, and editing it could desynchronise client, Weir and server"
            ),
            format!("remove the \"{name}\" rule (timeouts and keep-alive are listener keys)"),
        ));
    }
    if lower == "host" {
        return match (side, op) {
            (Side::Request { .. }, Op::Set) => Ok(()),
            (Side::Request { .. }, _) => Err(Issue::new(
                path,
                "the Host header can only be replaced, not added or removed",
                "use set = { \"Host\" = \"...\" }, or preserve_host = false to send the server's address",
            )),
            (Side::Response, _) => Err(Issue::new(
                path,
                "Host is a request header",
                "move the rule to request_headers",
            )),
        };
    }
    let forwarded = [
        "x-forwarded-for",
        "x-real-ip",
        "x-forwarded-proto",
        "x-forwarded-host",
    ];
    if matches!(side, Side::Request { forwarded: true }) && forwarded.contains(&lower.as_str()) {
        return Err(Issue::new(
            path,
            format!("header \"{name}\" is set by the route's forwarded headers"),
            "set forwarded_headers = false on the route to manage the forwarded headers with rules",
        ));
    }
    Ok(())
}

/// Splits a value into text and `{variable}`s (`{{` and `}}` are literal braces); the text
/// must be visible ASCII, spaces and tabs, without leading or trailing whitespace.
pub(super) fn template(text: &str, path: &FieldPath) -> Result<Template, Issue> {
    let bad_char = text
        .bytes()
        .any(|b| !(b == b' ' || b == b'\t' || b.is_ascii_graphic()));
    if bad_char || text.starts_with([' ', '\t']) || text.ends_with([' ', '\t']) {
        return Err(Issue::new(
            path,
            format!("header value {text:?} has a control character, non-ASCII text or surrounding whitespace"),
            "use visible ASCII (percent-encode anything else) and no leading or trailing spaces",
        ));
    }
    let names = || {
        Variable::ALL
            .iter()
            .map(|(n, _)| format!("{{{n}}}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut parts = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("{{").or(rest.strip_prefix("}}")) {
            literal.push(c);
            rest = after;
        } else if c == '{' {
            let end = rest.find('}').ok_or_else(|| {
                Issue::new(
                    path,
                    format!("unclosed '{{' in {text:?}"),
                    "write {{ for a literal brace",
                )
            })?;
            let name = &rest[1..end];
            let var = Variable::ALL
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| {
                    Issue::new(
                        path,
                        format!("unknown variable {{{name}}} in {text:?}"),
                        format!("use one of {}, or {{{{ for a literal brace", names()),
                    )
                })?;
            if !literal.is_empty() {
                parts.push(TemplatePart::Text(std::mem::take(&mut literal)));
            }
            parts.push(TemplatePart::Var(var.1));
            rest = &rest[end + 1..];
        } else if c == '}' {
            return Err(Issue::new(
                path,
                format!("stray '}}' in {text:?}"),
                "write }} for a literal brace",
            ));
        } else {
            literal.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    if !literal.is_empty() {
        parts.push(TemplatePart::Text(literal));
    }
    Ok(Template(parts))
}

#[cfg(test)]
mod tests;
