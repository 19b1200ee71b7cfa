//! Validation of a TLS listener's automatic certificates: `acme = { ... }` (names, contact,
//! directory, challenge, storage) and `internal_ca = { ... }`, whose names come from the
//! listener's routes once those are validated.

use std::path::PathBuf;

use super::super::duration;
use super::file;
use crate::error::{FieldPath, Issue};
use crate::model::{Acme, AcmeChallenge, HostPattern, InternalCa, Listener};
use crate::raw::{RawAcme, RawInternalCa, StrOrList};

/// Let's Encrypt's production directory: the default `acme.directory`.
pub const LETS_ENCRYPT: &str = "https://acme-v02.api.letsencrypt.org/directory";

/// `acme.directory_ca`: read here, within the limits of every file the config names, as
/// the ACME client reads it later itself (with no limit) when it orders.
fn directory_ca(raw: Option<String>, path: &FieldPath) -> Result<PathBuf, Issue> {
    let ca = file(raw, path, "directory CA", "certs/acme-server-ca.pem")?;
    if let Err(e) = crate::named_file::read(&ca, crate::named_file::MAX_FILE_SIZE) {
        return Err(Issue::new(
            path,
            format!("cannot read directory_ca {}: {e}", ca.display()),
            crate::named_file::fix_for(&e).unwrap_or(
                "give the PEM file of the root that issued the ACME server's certificate",
            ),
        ));
    }
    Ok(ca)
}

pub(crate) fn acme(raw: Option<RawAcme>, path: &FieldPath) -> Result<Option<Acme>, Issue> {
    let Some(raw) = raw else { return Ok(None) };
    // Without `domains`, the names come from the listener's routes (`fill_acme_domains`).
    let domains = match raw.domains {
        None => Vec::new(),
        some => domains(some, &path.key("domains"))?,
    };
    let contact = match raw.contact {
        None => Vec::new(),
        Some(StrOrList::One(one)) => vec![one],
        Some(StrOrList::Many(many)) => many,
    };
    if let Some(bad) = contact.iter().find(|c| !c.starts_with("mailto:")) {
        return Err(Issue::new(
            &path.key("contact"),
            format!("contact \"{bad}\" is not a mailto: URL"),
            r#"write contact = "mailto:ops@example.com""#,
        ));
    }
    let directory = raw.directory.unwrap_or_else(|| LETS_ENCRYPT.to_owned());
    if !directory.starts_with("https://") {
        return Err(Issue::new(
            &path.key("directory"),
            format!("directory \"{directory}\" is not an https:// URL (RFC 8555 requires HTTPS)"),
            format!("write the ACME server's directory URL, such as \"{LETS_ENCRYPT}\""),
        ));
    }
    let challenge = match raw.challenge.as_deref().map(str::trim) {
        None | Some("tls-alpn-01") => AcmeChallenge::TlsAlpn01,
        Some("http-01") => AcmeChallenge::Http01,
        Some(other) => {
            return Err(Issue::new(
                &path.key("challenge"),
                format!("unknown challenge \"{other}\""),
                r#"use challenge = "tls-alpn-01" (the default, on this listener) or "http-01" (on the HTTP listeners)"#,
            ))
        }
    };
    let storage = storage(raw.storage, &path.key("storage"), "acme")?;
    let directory_ca = match raw.directory_ca {
        None => None,
        some => Some(directory_ca(some, &path.key("directory_ca"))?),
    };
    let retry_initial = at_least(raw.retry_initial, "10s", &path.key("retry_initial"), 1)?;
    Ok(Some(Acme {
        domains,
        contact,
        directory,
        challenge,
        storage,
        directory_ca,
        retry_initial,
    }))
}

/// The names of an order: at least one, each a DNS name (no wildcard: it needs DNS-01,
/// which Weir does not do; no IP address), each once.
fn domains(raw: Option<Vec<String>>, path: &FieldPath) -> Result<Vec<String>, Issue> {
    let list = raw.filter(|d| !d.is_empty()).ok_or_else(|| {
        Issue::new(
            path,
            "acme needs the names to order a certificate for",
            r#"add domains = ["example.com", "www.example.com"]"#,
        )
    })?;
    let mut out: Vec<String> = Vec::with_capacity(list.len());
    for (i, name) in list.iter().enumerate() {
        let at = path.index(i);
        let name = orderable(name, &at)?;
        if out.contains(&name) {
            return Err(Issue::new(
                &at,
                format!("\"{name}\" is listed twice"),
                "list each name once",
            ));
        }
        out.push(name);
    }
    Ok(out)
}

/// `name` lower-cased without a final dot, if an ACME order can have it: a DNS name, no
/// wildcard (it needs DNS-01, which Weir does not do), no IP address.
fn orderable(name: &str, at: &FieldPath) -> Result<String, Issue> {
    let name = name.trim().trim_end_matches('.').to_ascii_lowercase();
    if name.starts_with("*.") {
        return Err(Issue::new(
            at,
            format!("\"{name}\" is a wildcard: it can only be validated by DNS-01"),
            "list each name (www.example.com, api.example.com), or use certs = [...] with a wildcard certificate",
        ));
    }
    if !valid_dns_name(&name) {
        return Err(Issue::new(
            at,
            format!("\"{name}\" is not a DNS name"),
            "write a host name such as \"example.com\" (no scheme, port or IP address)",
        ));
    }
    Ok(name)
}

/// Letters, digits, `-` and `.`, labels of 1 to 63 bytes, not all digits (an IP address).
fn valid_dns_name(name: &str) -> bool {
    let labels_ok = name.split('.').all(|l| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    });
    labels_ok && name.len() <= 253 && !name.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// A storage directory: as written, or `leaf` in the state directory ([`crate::state_dir`]).
fn storage(raw: Option<String>, path: &FieldPath, leaf: &str) -> Result<PathBuf, Issue> {
    match raw.as_deref().map(str::trim) {
        None => Ok(crate::state_dir().join(leaf)),
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        Some(_) => Err(Issue::new(
            path,
            "the storage directory is empty",
            format!(
                "write a directory Weir may write (keys are 0600), or remove storage for the \
                 default, {}",
                crate::state_dir().join(leaf).display()
            ),
        )),
    }
}

pub(crate) fn internal_ca(
    raw: Option<RawInternalCa>,
    path: &FieldPath,
) -> Result<Option<InternalCa>, Issue> {
    let Some(raw) = raw else { return Ok(None) };
    Ok(Some(InternalCa {
        storage: storage(raw.storage, &path.key("storage"), "ca")?,
        names: Vec::new(),
        lifetime: at_least(
            raw.lifetime,
            "168h",
            &path.key("lifetime"),
            MIN_LIFETIME_SECS,
        )?,
    }))
}

/// The shortest internal certificate lifetime: renewal comes at two thirds of it, so a
/// shorter one would have the renewal thread issue almost every second.
const MIN_LIFETIME_SECS: u64 = 5;

/// A duration of at least `min_secs` seconds (a floor against renewal or retry loops).
fn at_least(
    raw: Option<String>,
    default: &str,
    path: &FieldPath,
    min_secs: u64,
) -> Result<std::time::Duration, Issue> {
    let value = duration(raw, default, path, true)?;
    if value.as_secs() < min_secs {
        let key = path.last_key();
        return Err(Issue::new(
            path,
            format!("{key} must be at least {min_secs}s"),
            format!("set {key} to \"{min_secs}s\" or more (the default is \"{default}\")"),
        ));
    }
    Ok(value)
}

/// Gives an `internal_ca` listener its names: the exact and wildcard hosts of its routes,
/// or `localhost` and `127.0.0.1` when no route names a host.
pub(crate) fn fill_internal_names(listener: &mut Listener) {
    let Some(ca) = listener.tls.as_mut().and_then(|t| t.internal_ca.as_mut()) else {
        return;
    };
    let mut names: Vec<String> = Vec::new();
    for host in listener.routes.iter().flat_map(|r| &r.hosts) {
        let name = match host {
            HostPattern::Any => continue,
            HostPattern::Exact(h) => h.clone(),
            HostPattern::Suffix(parent) => format!("*{parent}"),
        };
        if !names.contains(&name) {
            names.push(name);
        }
    }
    if names.is_empty() {
        names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    }
    ca.names = names;
}

/// Gives an `acme` listener written without `domains` the exact hosts of its routes
/// (`routes`, `acme`: the keys, for errors). A wildcard or an IP address among them cannot
/// be ordered: the error names the route host and says to list `domains`.
pub(crate) fn fill_acme_domains(
    listener: &mut Listener,
    routes: &FieldPath,
    acme_path: &FieldPath,
) -> Result<(), Issue> {
    let Some(acme) = listener.tls.as_mut().and_then(|t| t.acme.as_mut()) else {
        return Ok(());
    };
    if !acme.domains.is_empty() {
        return Ok(());
    }
    for (i, route) in listener.routes.iter().enumerate() {
        for (j, host) in route.hosts.iter().enumerate() {
            let at = routes.index(i).key("hosts").index(j);
            let name = match host {
                HostPattern::Any => continue,
                HostPattern::Exact(h) => h.clone(),
                HostPattern::Suffix(parent) => format!("*{parent}"),
            };
            let name = orderable(&name, &at).map_err(|mut issue| {
                issue.fix = format!(
                    "acme orders the route hosts when it has no domains: list the names to \
                     order in acme.domains = [...] ({})",
                    issue.fix
                );
                issue
            })?;
            if !acme.domains.contains(&name) {
                acme.domains.push(name);
            }
        }
    }
    if acme.domains.is_empty() {
        return Err(Issue::new(
            acme_path,
            "acme needs the names to order a certificate for, and no route names a host",
            r#"give the routes hosts = ["example.com"], or add domains = ["example.com"] to acme"#,
        ));
    }
    Ok(())
}
