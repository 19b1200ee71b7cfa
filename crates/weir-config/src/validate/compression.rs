//! Validation of a route's `compression = { algorithms, min_size, types, level }`:
//! known codings once each, a size, media-type patterns and a level per algorithm.

use super::is_tchar;
use crate::error::{FieldPath, Issue};
use crate::model::{Compression, CompressionLevels, Encoding};
use crate::raw::{RawCompression, RawCompressionLevels};

/// Default `min_size`: smaller bodies gain little and cost a compressor's setup.
const DEFAULT_MIN_SIZE: u64 = 1024;

/// Default `types`: text formats that compress well (images and archives are compressed
/// already).
const DEFAULT_TYPES: [&str; 6] = [
    "text/*",
    "application/json",
    "application/javascript",
    "application/xml",
    "application/wasm",
    "image/svg+xml",
];

/// Most entries in `types` (checked per response).
const MAX_TYPES: usize = 64;

pub(super) fn compression(raw: RawCompression, path: &FieldPath) -> Result<Compression, Issue> {
    let algorithms = algorithms(raw.algorithms, &path.key("algorithms"))?;
    let min_size = super::size(raw.min_size, DEFAULT_MIN_SIZE, &path.key("min_size"))?;
    let types = types(raw.types, &path.key("types"))?;
    let levels = levels(raw.level.unwrap_or_default(), &path.key("level"))?;
    Ok(Compression {
        algorithms,
        min_size,
        types,
        levels,
    })
}

fn algorithms(raw: Option<Vec<String>>, path: &FieldPath) -> Result<Vec<Encoding>, Issue> {
    let Some(raw) = raw else {
        return Ok(Encoding::ALL.to_vec());
    };
    if raw.is_empty() {
        return Err(Issue::new(
            path,
            "algorithms is empty, so nothing would be compressed",
            "list at least one of \"zstd\", \"br\", \"gzip\", or remove compression from the route",
        ));
    }
    let mut out = Vec::with_capacity(raw.len());
    for (i, name) in raw.iter().enumerate() {
        let at = path.index(i);
        let encoding = Encoding::ALL
            .into_iter()
            .find(|e| e.token() == name.to_ascii_lowercase())
            .ok_or_else(|| {
                Issue::new(
                    &at,
                    format!("unknown compression algorithm \"{name}\""),
                    "use \"zstd\", \"br\" or \"gzip\" (in the order you prefer)",
                )
            })?;
        if out.contains(&encoding) {
            return Err(Issue::new(
                &at,
                format!("algorithm \"{name}\" is listed twice"),
                "list each algorithm once",
            ));
        }
        out.push(encoding);
    }
    Ok(out)
}

fn types(raw: Option<Vec<String>>, path: &FieldPath) -> Result<Vec<String>, Issue> {
    let Some(raw) = raw else {
        return Ok(DEFAULT_TYPES.iter().map(|t| (*t).to_owned()).collect());
    };
    if raw.is_empty() || raw.len() > MAX_TYPES {
        return Err(Issue::new(
            path,
            format!("types must list 1 to {MAX_TYPES} media types"),
            "list media types such as [\"text/*\", \"application/json\"], or leave types out for the default list",
        ));
    }
    raw.iter()
        .enumerate()
        .map(|(i, t)| media_pattern(t, &path.index(i)))
        .collect()
}

/// `type/subtype`, `type/*` or `*/*`, lower-cased.
fn media_pattern(text: &str, path: &FieldPath) -> Result<String, Issue> {
    let valid = text.split_once('/').is_some_and(|(ty, sub)| {
        let token = |s: &str| !s.is_empty() && s.bytes().all(is_tchar);
        // `*` is a tchar: a wildcard is only the whole subtype, or `*/*`.
        let name = |s: &str| token(s) && !s.contains('*');
        (ty == "*" && sub == "*") || (name(ty) && (sub == "*" || name(sub)))
    });
    if !valid || text.contains('*') && !text.ends_with("/*") {
        return Err(Issue::new(
            path,
            format!("\"{text}\" is not a media type"),
            "write type/subtype (\"application/json\"), type/* (\"text/*\") or */*, without parameters",
        ));
    }
    Ok(text.to_ascii_lowercase())
}

fn levels(raw: RawCompressionLevels, path: &FieldPath) -> Result<CompressionLevels, Issue> {
    let d = CompressionLevels::default();
    Ok(CompressionLevels {
        gzip: super::int_in(raw.gzip, d.gzip.into(), 1..=9, &path.key("gzip"))?,
        br: super::int_in(raw.br, d.br.into(), 0..=11, &path.key("br"))?,
        zstd: super::int_in(raw.zstd, d.zstd.into(), 1..=19, &path.key("zstd"))?,
    })
}
