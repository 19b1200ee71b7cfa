//! Validation of a route's `files = { ... }` (static files, issue 27): the root must be an
//! existing directory, names and paths must stay plain (no `/` in an index name, no `..`
//! anywhere), and the limits must be sane.

use std::path::PathBuf;

use super::{duration, int_in, size};
use crate::error::{FieldPath, Issue};
use crate::model::{Encoding, Files};
use crate::raw::RawFiles;

/// Most entries of `index` or `try_files`.
const MAX_ENTRIES: usize = 16;

/// The route's `files`, with `fallback`: the route's `upstream`, if it names one.
pub(super) fn files(
    raw: RawFiles,
    path: &FieldPath,
    fallback: Option<usize>,
) -> Result<Files, Issue> {
    Ok(Files {
        root: root(raw.root, &path.key("root"))?,
        index: index(raw.index, &path.key("index"))?,
        try_files: try_files(raw.try_files, &path.key("try_files"))?,
        fallback,
        follow_symlinks: raw.follow_symlinks.unwrap_or(false),
        hidden: raw.hidden.unwrap_or(false),
        precompressed: precompressed(raw.precompressed, &path.key("precompressed"))?,
        cache_control: cache_control(raw.cache_control, &path.key("cache_control"))?,
        sendfile_min_size: size(
            raw.sendfile_min_size,
            16 * 1024,
            &path.key("sendfile_min_size"),
        )?,
        listing: raw.listing.unwrap_or(false),
        open_file_cache: int_in(
            raw.open_file_cache,
            1024,
            0..=1_000_000,
            &path.key("open_file_cache"),
        )?,
        open_file_cache_valid: duration(
            raw.open_file_cache_valid,
            "2s",
            &path.key("open_file_cache_valid"),
            false,
        )?,
    })
}

fn root(raw: Option<String>, path: &FieldPath) -> Result<PathBuf, Issue> {
    let Some(text) = raw.filter(|t| !t.trim().is_empty()) else {
        return Err(Issue::new(
            path,
            "files has no root",
            r#"add root = "/var/www/site" (the directory whose files the route serves)"#,
        ));
    };
    let root = PathBuf::from(text.trim());
    match std::fs::metadata(&root) {
        Ok(meta) if meta.is_dir() => Ok(root),
        Ok(_) => Err(Issue::new(
            path,
            format!("root {} is not a directory", root.display()),
            "point root at the directory that holds the site's files",
        )),
        Err(e) => Err(Issue::new(
            path,
            format!("root {} cannot be used: {e}", root.display()),
            "create the directory, or correct the path (relative paths start at the config file's directory)",
        )),
    }
}

fn index(raw: Option<Vec<String>>, path: &FieldPath) -> Result<Vec<String>, Issue> {
    let Some(names) = raw else {
        return Ok(vec!["index.html".to_owned()]);
    };
    check_count(names.len(), path, r#"index = ["index.html"]"#)?;
    for (i, name) in names.iter().enumerate() {
        if name.is_empty() || name.contains(['/', '\\', '\0']) || name == "." || name == ".." {
            return Err(Issue::new(
                &path.index(i),
                format!("index name {name:?} is not a plain file name"),
                r#"write a file name without '/', such as "index.html""#,
            ));
        }
    }
    Ok(names)
}

fn try_files(raw: Option<Vec<String>>, path: &FieldPath) -> Result<Vec<String>, Issue> {
    let Some(entries) = raw else {
        return Ok(Vec::new());
    };
    check_count(
        entries.len(),
        path,
        r#"try_files = ["{path}", "/index.html"]"#,
    )?;
    for (i, entry) in entries.iter().enumerate() {
        let at = path.index(i);
        let rest = entry.replace("{path}", "/");
        let dotted = rest.split('/').any(|s| s == ".." || s == ".");
        if !entry.starts_with('/') && !entry.starts_with("{path}") || dotted {
            return Err(Issue::new(
                &at,
                format!("try_files entry {entry:?} is not a path under the root"),
                r#"start it with "/" or "{path}" and leave out "." and ".." segments, such as "/index.html""#,
            ));
        }
        if rest.contains(['{', '}', '\0', '\\']) {
            return Err(Issue::new(
                &at,
                format!("try_files entry {entry:?} holds a character or variable it cannot"),
                "use {path} (the request's path) as the only variable",
            ));
        }
    }
    Ok(entries)
}

fn check_count(n: usize, path: &FieldPath, example: &str) -> Result<(), Issue> {
    if n == 0 || n > MAX_ENTRIES {
        return Err(Issue::new(
            path,
            format!("{} must list 1 to {MAX_ENTRIES} entries", path.last_key()),
            format!("write {example}, or leave it out"),
        ));
    }
    Ok(())
}

fn precompressed(raw: Option<Vec<String>>, path: &FieldPath) -> Result<Vec<Encoding>, Issue> {
    let mut out: Vec<Encoding> = Vec::new();
    for (i, name) in raw.unwrap_or_default().iter().enumerate() {
        let found = Encoding::ALL.into_iter().find(|e| e.token() == name);
        match found {
            Some(e) if !out.contains(&e) => out.push(e),
            Some(_) => {
                return Err(Issue::new(
                    &path.index(i),
                    format!("{name} is listed twice"),
                    "list each coding once",
                ))
            }
            None => {
                return Err(Issue::new(
                    &path.index(i),
                    format!("{name:?} is not a coding Weir knows"),
                    r#"use "br" (NAME.br), "zstd" (NAME.zst) or "gzip" (NAME.gz)"#,
                ))
            }
        }
    }
    Ok(out)
}

fn cache_control(raw: Option<String>, path: &FieldPath) -> Result<Option<String>, Issue> {
    let Some(value) = raw else { return Ok(None) };
    super::route_match::header_value(&value, path)?;
    if value.is_empty() {
        return Err(Issue::new(
            path,
            "cache_control is empty",
            r#"write a value such as "public, max-age=3600", or leave it out"#,
        ));
    }
    Ok(Some(value))
}
