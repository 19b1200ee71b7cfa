//! The JSON Schema of the config file (`weir schema`) against every example config the
//! project shows: the TOML blocks of README.md and docs/*.md, the Weir configs under bench/
//! and contrib/, and the configs bench/*.sh write. Each must validate, and a key the schema
//! lacks (every table is `additionalProperties: false`) fails; so a key added to the
//! parser but documented wrong, or documented and never added, is caught here.
//!
//! Documentation blocks are often fragments (a `[listeners.tls]` table, a route's keys):
//! each is tried at the top of a file and inside a listener, its TLS table, a route and
//! an upstream, and passes if it fits one of them.

use std::path::{Path, PathBuf};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn schema() -> jsonschema::Validator {
    let schema = serde_json::to_value(weir_config::schema()).expect("schema as JSON");
    jsonschema::validator_for(&schema).expect("a valid JSON Schema")
}

/// Where a fragment may stand: prefixes that put it in that place of a file.
const CONTEXTS: [&str; 6] = [
    "",
    "[[listeners]]\n",
    "[[listeners]]\n[listeners.tls]\n",
    "[[listeners]]\n[[listeners.routes]]\n",
    "[upstreams.example]\n",
    "[[listeners]]\n[listeners.http2]\n",
];

/// The errors of `text` in the place where it fits best (none: it validates somewhere).
fn check(validator: &jsonschema::Validator, text: &str) -> Result<(), String> {
    let mut first_error = None;
    for context in CONTEXTS {
        let source = format!("{context}{text}");
        let value: Value = match toml::from_str(&source) {
            Ok(v) => v,
            Err(e) => {
                first_error.get_or_insert(format!("not TOML: {e}"));
                continue;
            }
        };
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        if errors.is_empty() {
            return Ok(());
        }
        first_error.get_or_insert(errors.join("; "));
    }
    Err(first_error.unwrap_or_default())
}

/// The ```toml blocks of a markdown file, with their first line numbers.
fn toml_blocks(markdown: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        match &mut current {
            None if line.trim_start() == "```toml" => current = Some((i + 2, String::new())),
            Some(_) if line.trim_start() == "```" => blocks.extend(current.take()),
            Some((_, text)) => {
                text.push_str(line);
                text.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// Shell (`$PORT`, `${DIR}`) and template (`{{ROUTES}}`) placeholders replaced by `0`, and
/// lines that were nothing but a placeholder dropped.
fn fill_placeholders(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut filled = String::new();
        let mut rest = line;
        while let Some(start) = rest.find(['$', '{']) {
            filled.push_str(&rest[..start]);
            let tail = &rest[start..];
            let end = placeholder_len(tail);
            if end == 0 {
                filled.push_str(&tail[..1]);
                rest = &tail[1..];
            } else {
                filled.push('0');
                rest = &tail[end..];
            }
        }
        filled.push_str(rest);
        if filled.trim() != "0" {
            out.push_str(&filled);
            out.push('\n');
        }
    }
    out
}

/// The length of the placeholder `tail` starts with, or 0 if it starts with none.
fn placeholder_len(tail: &str) -> usize {
    let word = |s: &str| s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
    if let Some(inner) = tail.strip_prefix("{{") {
        return inner.find("}}").map_or(0, |n| n + 4);
    }
    if let Some(inner) = tail.strip_prefix("${") {
        return inner.find('}').map_or(0, |n| n + 3);
    }
    match tail.strip_prefix('$') {
        Some(inner) => {
            let n = word(inner).unwrap_or(inner.len());
            if n == 0 {
                0
            } else {
                n + 1
            }
        }
        None => 0,
    }
}

/// The weir.toml heredocs of a shell script: bodies of `<<EOF` / `<<TOML` that have a
/// `[[listeners]]` table.
fn heredocs(script: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut current: Option<(String, usize, String)> = None;
    for (i, line) in script.lines().enumerate() {
        if let Some((end, first, body)) = &mut current {
            if line.trim() == end {
                if body.contains("[[listeners]]") {
                    found.push((*first, fill_placeholders(body)));
                }
                current = None;
            } else {
                body.push_str(line);
                body.push('\n');
            }
        } else if let Some(marker) = line.split("<<").nth(1) {
            let end = marker.trim().trim_matches(['\'', '"', '-']).to_owned();
            if !end.is_empty() && !end.starts_with('<') {
                current = Some((end, i + 2, String::new()));
            }
        }
    }
    found
}

fn files_under(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path, extension));
        } else if path.extension().is_some_and(|e| e == extension) {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Every example: (where, text).
fn examples() -> Vec<(String, String)> {
    let root = repo();
    let mut out = Vec::new();
    let mut markdown = vec![root.join("README.md")];
    markdown.extend(files_under(&root.join("docs"), "md"));
    for path in markdown {
        let text = std::fs::read_to_string(&path).expect("read markdown");
        for (line, block) in toml_blocks(&text) {
            out.push((format!("{}:{line}", path.display()), block));
        }
    }
    for dir in ["bench", "contrib"] {
        for path in files_under(&root.join(dir), "toml") {
            let text = std::fs::read_to_string(&path).expect("read toml");
            // Weir configs only (bench/ also holds other TOML, such as instruction budgets).
            if text.contains("[[listeners]]") {
                out.push((path.display().to_string(), fill_placeholders(&text)));
            }
        }
    }
    for path in files_under(&root.join("bench"), "sh") {
        let text = std::fs::read_to_string(&path).expect("read script");
        for (line, body) in heredocs(&text) {
            out.push((format!("{}:{line}", path.display()), body));
        }
    }
    out
}

#[test]
fn every_example_config_validates_against_the_schema() {
    let validator = schema();
    let examples = examples();
    assert!(
        examples.len() >= 30,
        "found only {} examples: is the search broken?",
        examples.len()
    );
    let failures: Vec<String> = examples
        .iter()
        .filter_map(|(at, text)| {
            check(&validator, text)
                .err()
                .map(|e| format!("{at}: {e}\n{text}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_key_the_schema_lacks_fails_everywhere() {
    let validator = schema();
    let good = "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:8080\"\n\
                [[listeners.routes]]\nname = \"all\"\nupstream = \"app\"\n\
                [upstreams.app]\nservers = [{ addr = \"127.0.0.1:9000\" }]\n";
    check(&validator, good).expect("the good config validates");
    for misspelled in [
        good.replace("bind", "bnid"),
        good.replace("upstream =", "upstrem ="),
        good.replace("addr", "adress"),
        format!("{good}[server]\nworkerz = 2\n"),
        format!("{good}[listeners.tls]\ncerts = []\nacme = {{ domain = [\"a.example\"] }}\n"),
    ] {
        assert!(
            check(&validator, &misspelled).is_err(),
            "accepted:\n{misspelled}"
        );
    }
    // A fragment with a wrong key fails too, in every place it could stand.
    assert!(check(&validator, "[listeners.tls]\ncertz = []\n").is_err());
    assert!(check(&validator, "path_prefx = \"/\"\n").is_err());
}

#[test]
fn the_schema_the_binary_prints_is_the_schema() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .arg("schema")
        .output()
        .expect("run weir schema");
    assert!(out.status.success());
    let printed: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        printed,
        serde_json::to_value(weir_config::schema()).unwrap()
    );
    assert_eq!(printed["additionalProperties"], Value::Bool(false));
}

#[test]
fn placeholders_are_filled() {
    assert_eq!(
        fill_placeholders("bind = \"127.0.0.1:$PORT\"\n{{ROUTES}}\nx = \"${DIR}/a\"\n"),
        "bind = \"127.0.0.1:0\"\nx = \"0/a\"\n"
    );
    assert_eq!(fill_placeholders("a = { b = 1 }\n"), "a = { b = 1 }\n");
}
