//! Validation of a route's match conditions (`exact`, `methods`, `match_headers`,
//! `match_query`) and of its target: exactly one of `upstream`, `upstreams` (a weighted
//! split), `respond` (a local response) and `redirect`; plus the listener shortcut
//! `redirect_https`. Templates are split into literal and variable parts here, once.

use std::collections::BTreeMap;

use super::{int_in, is_tchar, upstream_index};
use crate::error::{FieldPath, Issue};
use crate::model::{
    LocalResponse, MatchValue, Redirect, RouteMatch, RouteTarget, Template, TemplatePart, Variable,
    WeightedUpstream,
};
use crate::raw::{RawRedirect, RawRespond, RawRoute, RawWeightedUpstream};

/// Most pools one weighted split may name.
const MAX_SPLIT: usize = 16;
/// Most conditions of one kind (methods, headers, query parameters) per route.
const MAX_CONDITIONS: usize = 32;
/// Statuses a redirect may use.
const REDIRECT_STATUSES: [i64; 5] = [301, 302, 303, 307, 308];

/// The route's conditions beyond host and path prefix.
pub(super) fn matching(raw: &mut RawRoute, path: &FieldPath) -> Result<RouteMatch, Issue> {
    Ok(RouteMatch {
        exact: raw.exact.take().unwrap_or(false),
        methods: methods(raw.methods.take(), &path.key("methods"))?,
        headers: conditions(raw.match_headers.take(), &path.key("match_headers"), true)?,
        query: conditions(raw.match_query.take(), &path.key("match_query"), false)?,
    })
}

fn methods(raw: Option<Vec<String>>, path: &FieldPath) -> Result<Vec<String>, Issue> {
    let Some(raw) = raw else {
        return Ok(Vec::new());
    };
    if raw.is_empty() || raw.len() > MAX_CONDITIONS {
        return Err(Issue::new(
            path,
            format!("methods must list 1 to {MAX_CONDITIONS} methods"),
            r#"list the methods the route takes, such as methods = ["GET", "HEAD"], or remove methods to take any"#,
        ));
    }
    let mut out: Vec<String> = Vec::with_capacity(raw.len());
    for (i, m) in raw.into_iter().enumerate() {
        if m.is_empty() || !m.bytes().all(is_tchar) {
            return Err(Issue::new(
                &path.index(i),
                format!("\"{m}\" is not a method name"),
                r#"write a method such as "GET" or "POST" (letters only, no spaces)"#,
            ));
        }
        if out.contains(&m) {
            return Err(Issue::new(
                &path.index(i),
                format!("method \"{m}\" is listed twice"),
                "list each method once",
            ));
        }
        out.push(m);
    }
    Ok(out)
}

/// `match_headers` (`headers`: names are tokens, compared lower-cased) or `match_query`.
fn conditions(
    raw: Option<BTreeMap<String, String>>,
    path: &FieldPath,
    headers: bool,
) -> Result<Vec<(String, MatchValue)>, Issue> {
    let Some(raw) = raw else {
        return Ok(Vec::new());
    };
    if raw.len() > MAX_CONDITIONS {
        return Err(Issue::new(
            path,
            format!("more than {MAX_CONDITIONS} conditions"),
            "split the route, or match on fewer values",
        ));
    }
    let mut out: Vec<(String, MatchValue)> = Vec::with_capacity(raw.len());
    for (name, value) in raw {
        let at = path.key(&name);
        let key = if headers {
            header_name(&name, &at)?;
            name.to_ascii_lowercase()
        } else {
            query_part(&name, &at, "parameter name")?;
            name
        };
        if out.iter().any(|(n, _)| *n == key) {
            return Err(Issue::new(
                &at,
                format!("header \"{key}\" is listed twice (names are case-insensitive)"),
                "keep one of the two entries",
            ));
        }
        let value = if value == "*" {
            MatchValue::Present
        } else if headers {
            header_value(&value, &at)?;
            MatchValue::Exact(value)
        } else {
            query_part(&value, &at, "value")?;
            MatchValue::Exact(value)
        };
        out.push((key, value));
    }
    Ok(out)
}

/// A header name must be a token (RFC 9110 5.1).
pub(super) fn header_name(name: &str, path: &FieldPath) -> Result<(), Issue> {
    if name.is_empty() || !name.bytes().all(is_tchar) {
        return Err(Issue::new(
            path,
            format!("\"{name}\" is not a valid header name"),
            "use letters, digits and '-' only, such as \"X-Canary\" (no spaces or ':')",
        ));
    }
    Ok(())
}

/// A header value: visible ASCII, spaces and tabs, no leading or trailing whitespace.
pub(super) fn header_value(value: &str, path: &FieldPath) -> Result<(), Issue> {
    let printable = value
        .bytes()
        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b));
    if !printable || value.trim() != value {
        return Err(Issue::new(
            path,
            format!("{value:?} is not a valid header value"),
            "use printable ASCII without line breaks or control characters, and no \
             leading or trailing spaces (percent-encode anything else)",
        ));
    }
    Ok(())
}

/// A query parameter name or value as it appears in a URL: no '&', '=', '#', spaces.
/// A `match_query` name or value: compared form-decoded, so written decoded (`"a b"`,
/// `"x&y"`, `"é"`) or encoded (`"a+b"`, `"x%26y"`) alike; only control characters, which
/// no decoded parameter holds as typed, are refused, and an empty name.
fn query_part(text: &str, path: &FieldPath, what: &str) -> Result<(), Issue> {
    if what != "value" && text.is_empty() {
        return Err(Issue::new(
            path,
            "an empty query parameter name",
            "write the parameter's name, such as debug = \"1\"",
        ));
    }
    if text.chars().any(char::is_control) {
        return Err(Issue::new(
            path,
            format!("query {what} {text:?} holds a control character"),
            "write the value as the backend reads it (decoded, such as \"a b\"), or percent-encoded",
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------- targets

/// Exactly one of `upstream`, `upstreams`, `respond` and `redirect`.
pub(super) fn target(
    raw: &mut RawRoute,
    path: &FieldPath,
    upstreams: &[String],
) -> Result<RouteTarget, Issue> {
    if let Some(files) = raw.files.take() {
        return files_target(raw, files, path, upstreams);
    }
    let given: Vec<&str> = [
        ("upstream", raw.upstream.is_some()),
        ("upstreams", raw.upstreams.is_some()),
        ("respond", raw.respond.is_some()),
        ("redirect", raw.redirect.is_some()),
    ]
    .iter()
    .filter(|(_, present)| *present)
    .map(|(key, _)| *key)
    .collect();
    if given.len() > 1 {
        return Err(Issue::new(
            &path.key(given[1]),
            format!(
                "the route has both {} and {}; a route has exactly one target",
                given[0], given[1]
            ),
            format!(
                "keep one of {} and remove the other (use two routes to send requests to both)",
                given.join(", ")
            ),
        ));
    }
    if let Some(split) = raw.upstreams.take() {
        return weighted(split, &path.key("upstreams"), upstreams).map(RouteTarget::Split);
    }
    if let Some(respond) = raw.respond.take() {
        return local_response(respond, &path.key("respond")).map(RouteTarget::Respond);
    }
    if let Some(redirect) = raw.redirect.take() {
        return redirect_target(redirect, &path.key("redirect")).map(RouteTarget::Redirect);
    }
    upstream_index(raw.upstream.take(), &path.key("upstream"), upstreams)
        .map(RouteTarget::Upstream)
        .map_err(|mut issue| {
            if issue.message == "the route has no upstream" {
                issue.message =
                    "the route has no upstream (nor upstreams, respond or redirect)".to_owned();
                issue.fix = format!(
                    "{}, or give it upstreams = [...], respond = {{ ... }} or redirect = {{ ... }}",
                    issue.fix
                );
            }
            issue
        })
}

/// `files`, with the route's `upstream` (if any) for what no file answers; no other target.
fn files_target(
    raw: &mut RawRoute,
    files: crate::raw::RawFiles,
    path: &FieldPath,
    upstreams: &[String],
) -> Result<RouteTarget, Issue> {
    let other = [
        ("upstreams", raw.upstreams.is_some()),
        ("respond", raw.respond.is_some()),
        ("redirect", raw.redirect.is_some()),
    ];
    if let Some((key, _)) = other.iter().find(|(_, present)| *present) {
        return Err(Issue::new(
            &path.key(key),
            format!("the route has both files and {key}; a route has exactly one target"),
            format!("remove {key} (files takes one upstream = \"NAME\" for what no file answers)"),
        ));
    }
    let fallback = match raw.upstream.take() {
        Some(name) => Some(upstream_index(
            Some(name),
            &path.key("upstream"),
            upstreams,
        )?),
        None => None,
    };
    let files = super::files::files(files, &path.key("files"), fallback)?;
    Ok(RouteTarget::Files(Box::new(files)))
}

/// `split_fallback`: only beside `upstreams` (default true).
pub(super) fn split_fallback(raw: &RawRoute, path: &FieldPath) -> Result<bool, Issue> {
    match raw.split_fallback {
        Some(_) if raw.upstreams.is_none() => Err(Issue::new(
            &path.key("split_fallback"),
            "split_fallback applies to a split (upstreams = [...]) and this route has none",
            "remove split_fallback, or give the route upstreams = [{ name, weight }, ...]",
        )),
        on => Ok(on.unwrap_or(true)),
    }
}

fn weighted(
    raw: Vec<RawWeightedUpstream>,
    path: &FieldPath,
    upstreams: &[String],
) -> Result<Vec<WeightedUpstream>, Issue> {
    if raw.is_empty() || raw.len() > MAX_SPLIT {
        return Err(Issue::new(
            path,
            format!("upstreams must list 1 to {MAX_SPLIT} pools"),
            r#"write upstreams = [{ name = "v1", weight = 95 }, { name = "v2", weight = 5 }]"#,
        ));
    }
    let mut out: Vec<WeightedUpstream> = Vec::with_capacity(raw.len());
    for (i, entry) in raw.into_iter().enumerate() {
        let at = path.index(i);
        let upstream = upstream_index(entry.name, &at.key("name"), upstreams)?;
        if out.iter().any(|w| w.upstream == upstream) {
            return Err(Issue::new(
                &at.key("name"),
                format!("upstream \"{}\" is listed twice", upstreams[upstream]),
                "list each pool once and add up its weights",
            ));
        }
        let weight = int_in(entry.weight, 1, 1..=1000, &at.key("weight"))?;
        out.push(WeightedUpstream { upstream, weight });
    }
    Ok(out)
}

/// Headers Weir writes itself on a local response: framing and connection management.
const RESERVED_HEADERS: [&str; 8] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
];

fn local_response(raw: RawRespond, path: &FieldPath) -> Result<LocalResponse, Issue> {
    let status: u16 = int_in(raw.status, 200, 200..=599, &path.key("status"))?;
    let body = raw.body.unwrap_or_default();
    if matches!(status, 204 | 304) && !body.is_empty() {
        return Err(Issue::new(
            &path.key("body"),
            format!("a {status} response has no body"),
            "remove body, or use another status such as 200",
        ));
    }
    let mut headers = Vec::new();
    for (name, value) in raw.headers.unwrap_or_default() {
        let at = path.key("headers").key(&name);
        header_name(&name, &at)?;
        let lower = name.to_ascii_lowercase();
        if RESERVED_HEADERS.contains(&lower.as_str()) {
            return Err(Issue::new(
                &at,
                format!("{name} is set by Weir on local responses (framing and keep-alive)"),
                format!("remove {name} from headers"),
            ));
        }
        if headers
            .iter()
            .any(|(n, _): &(String, String)| n.eq_ignore_ascii_case(&name))
        {
            return Err(Issue::new(
                &at,
                format!("header {name} is given twice (names are case-insensitive)"),
                "keep one of the two entries",
            ));
        }
        header_value(&value, &at)?;
        headers.push((name, value));
    }
    Ok(LocalResponse {
        status,
        body,
        headers,
    })
}

fn redirect_target(raw: RawRedirect, path: &FieldPath) -> Result<Redirect, Issue> {
    let status_path = path.key("status");
    let status = raw.status.unwrap_or(302);
    if !REDIRECT_STATUSES.contains(&status) {
        return Err(Issue::new(
            &status_path,
            format!("{status} is not a redirect status"),
            "use 301 or 308 (permanent), 302, 303 or 307 (temporary); 308 and 307 keep the method",
        ));
    }
    let to_path = path.key("to");
    let Some(to) = raw.to else {
        return Err(Issue::new(
            &to_path,
            "the redirect has no target",
            r#"add to = "https://{host}{uri}" (or another URL or path)"#,
        ));
    };
    header_value(&to, &to_path)?;
    if to.is_empty() || to.contains(' ') {
        return Err(Issue::new(
            &to_path,
            "a redirect target must be a non-empty URL without spaces",
            "percent-encode spaces as %20",
        ));
    }
    Ok(Redirect {
        // One of REDIRECT_STATUSES, so it fits.
        status: u16::try_from(status).unwrap_or(302),
        to: template(&to, &to_path)?,
    })
}

/// Splits a redirect's `to` into text and `{variable}` parts (the header-rule syntax, see
/// `policy::template`); `{request_id}` is not available to a redirect.
pub(super) fn template(text: &str, path: &FieldPath) -> Result<Template, Issue> {
    let template = super::policy::template(text, path)?;
    if template.0.contains(&TemplatePart::Var(Variable::RequestId)) {
        return Err(Issue::new(
            path,
            format!("{{request_id}} is not available in a redirect ({text:?})"),
            "use {scheme} {host} {uri} {path} {query} or {client_ip}",
        ));
    }
    Ok(template)
}

/// `rewrite_prefix` changes the path sent upstream: a route answered locally has none.
pub(super) fn check_local_keys(
    target: &RouteTarget,
    rewrite: bool,
    path: &FieldPath,
) -> Result<(), Issue> {
    let local = match target {
        RouteTarget::Respond(_) => "respond",
        RouteTarget::Redirect(_) => "redirect",
        RouteTarget::Files(_) => "files",
        RouteTarget::Upstream(_) | RouteTarget::Split(_) => return Ok(()),
    };
    if rewrite {
        return Err(Issue::new(
            &path.key("rewrite_prefix"),
            format!("rewrite_prefix has no effect on a route answered by {local}"),
            "remove rewrite_prefix (and reverse_rewrite); use {path} or {uri} in a redirect's to, \
             and put files under root as their request paths name them",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
