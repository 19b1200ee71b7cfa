//! Configuration errors, and locating them in the source text.
//!
//! Every error names the file, a 1-based `line:column`, the offending key as a dotted path
//! (`listeners[0].routes[1].upstream`), what is wrong and how to fix it. Syntax and type
//! errors come with a byte span from the TOML parser; validation errors come with a key
//! path, which is looked up in a span-preserving parse ([`toml_edit::ImDocument`]). A key
//! that cannot be found is reported at its nearest located parent, else at `1:1`.

use std::fmt;
use std::ops::Range;

use toml_edit::{ImDocument, Item, Table, TableLike, Value};

/// Why a configuration could not be loaded.
///
/// Displays as one line:
/// `weir.toml:12:5: listeners[0].routes[0].upstream: unknown upstream "cgi2" (fix: ...)`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message} (fix: {fix})", prefix(.file, .line, .column, .field))]
pub struct ConfigError {
    /// The file name as given to [`crate::load_file`] or [`crate::parse_str`].
    pub file: String,
    /// 1-based line; 0 when the error concerns the file as a whole (it could not be read).
    pub line: usize,
    /// 1-based column, in characters; 0 when `line` is 0.
    pub column: usize,
    /// Dotted path of the offending key, such as `upstreams.cgi.servers[0].addr`;
    /// empty when no key applies (a syntax error, an unreadable file).
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub fix: String,
}

/// `file:line:column: field: `, leaving out the parts that do not apply.
fn prefix(file: &str, line: &usize, column: &usize, field: &str) -> String {
    let mut out = if *line == 0 {
        format!("{file}: ")
    } else {
        format!("{file}:{line}:{column}: ")
    };
    if !field.is_empty() {
        out.push_str(field);
        out.push_str(": ");
    }
    out
}

/// The field `rest` (`.bind`, or empty) of the listener named `name`, as errors found
/// after validation name it (`listeners[web].bind`): a name that reads as a number is
/// quoted (`listeners["443"].bind`), so that it is not taken as the listener's index
/// when the error is located ([`ConfigError::at_field`]).
pub fn listener_field(name: &str, rest: &str) -> String {
    format!("{}{rest}", entry("listeners", name))
}

/// The entry named `name` of the list at `path` (`listeners[web]`), its name quoted when
/// it reads as a number (`listeners["443"]`): a bare number is an index.
pub fn entry(path: &str, name: &str) -> String {
    match name.parse::<usize>() {
        Ok(_) => format!("{path}[\"{name}\"]"),
        Err(_) => format!("{path}[{name}]"),
    }
}

impl ConfigError {
    /// An error found after validation (a certificate that cannot be loaded) about the
    /// key `field` (as errors print it: `listeners[0].tls.certs[1].cert`) of `text`,
    /// located like a validation error.
    pub fn at_field(
        file: &str,
        text: &str,
        field: &str,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> ConfigError {
        let offset = ImDocument::parse(text)
            .ok()
            .and_then(|doc| locate(&doc, &FieldPath::parse_in(field, Some(&doc))))
            .unwrap_or(0);
        let (line, column) = line_column(text, offset);
        ConfigError {
            file: file.to_owned(),
            line,
            column,
            field: field.to_owned(),
            message: message.into(),
            fix: fix.into(),
        }
    }

    /// The configuration file could not be read.
    pub fn io(file: &str, err: &std::io::Error) -> Self {
        let fix = match err.kind() {
            std::io::ErrorKind::NotFound => "check the path, or pass another file with -c FILE",
            std::io::ErrorKind::PermissionDenied => "make the file readable by this user",
            std::io::ErrorKind::InvalidData => "save the file as UTF-8",
            _ => crate::named_file::fix_for(err)
                .unwrap_or("check that the path names a readable file"),
        };
        ConfigError {
            file: file.to_owned(),
            line: 0,
            column: 0,
            field: String::new(),
            message: format!("cannot read the configuration file: {err}"),
            fix: fix.to_owned(),
        }
    }
}

/// One step of a [`FieldPath`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// The path of a key in the document, such as `listeners[0].routes[1].upstream`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldPath(pub(crate) Vec<Seg>);

impl FieldPath {
    /// This path extended by a key.
    pub(crate) fn key(&self, key: &str) -> FieldPath {
        let mut segs = self.0.clone();
        segs.push(Seg::Key(key.to_owned()));
        FieldPath(segs)
    }

    /// This path extended by an array index.
    pub(crate) fn index(&self, index: usize) -> FieldPath {
        let mut segs = self.0.clone();
        segs.push(Seg::Index(index));
        FieldPath(segs)
    }

    /// A path as `Display` writes it (`upstreams."a.b".servers[0].addr`).
    pub(crate) fn parse(text: &str) -> FieldPath {
        FieldPath::parse_in(text, None)
    }

    /// Like [`FieldPath::parse`]; with `doc`, an element named by its `name` key rather than
    /// its index (`listeners[web].bind`, as errors of a reload name listeners) is taken as
    /// the index of that element in `doc`.
    pub(crate) fn parse_in(text: &str, doc: Option<&ImDocument<&str>>) -> FieldPath {
        let mut segs = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            rest = rest.strip_prefix('.').unwrap_or(rest);
            if let Some(after) = rest.strip_prefix('[') {
                let end = after.find(']').unwrap_or(after.len());
                let inside = &after[..end];
                // `["443"]`: a name that reads as a number (`listener_field`), not an index.
                let quoted = inside.strip_prefix('"').and_then(|n| n.strip_suffix('"'));
                let by_index = quoted.is_none().then(|| inside.parse().ok()).flatten();
                let index = by_index.or_else(|| {
                    let array = node_at(doc?, &segs)?;
                    let name = quoted.unwrap_or(inside);
                    array.elements().iter().position(|e| named(*e, name))
                });
                segs.extend(index.map(Seg::Index));
                rest = after.get(end + 1..).unwrap_or("");
            } else if let Some(after) = rest.strip_prefix('"') {
                let end = after.find('"').unwrap_or(after.len());
                segs.push(Seg::Key(after[..end].to_owned()));
                rest = after.get(end + 1..).unwrap_or("");
            } else {
                let end = rest.find(['.', '[']).unwrap_or(rest.len());
                segs.push(Seg::Key(rest[..end].to_owned()));
                rest = &rest[end..];
            }
        }
        FieldPath(segs)
    }

    /// The last key of the path (`upstream` for `listeners[0].routes[1].upstream`).
    pub(crate) fn last_key(&self) -> &str {
        self.0
            .iter()
            .rev()
            .find_map(|seg| match seg {
                Seg::Key(key) => Some(key.as_str()),
                Seg::Index(_) => None,
            })
            .unwrap_or("")
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Index(index) => write!(f, "[{index}]")?,
                Seg::Key(key) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    let bare = !key.is_empty()
                        && key
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                    if bare {
                        f.write_str(key)?;
                    } else {
                        write!(f, "{key:?}")?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// A validation failure, before it is located in the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Issue {
    pub path: FieldPath,
    pub message: String,
    pub fix: String,
}

impl Issue {
    pub(crate) fn new(
        path: &FieldPath,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Issue {
            path: path.clone(),
            message: message.into(),
            fix: fix.into(),
        }
    }
}

/// The text being parsed, with what is needed to locate errors in it.
pub(crate) struct Source<'a> {
    pub file: &'a str,
    pub text: &'a str,
}

impl Source<'_> {
    fn error(&self, offset: usize, field: String, message: String, fix: String) -> ConfigError {
        let (line, column) = line_column(self.text, offset);
        ConfigError {
            file: self.file.to_owned(),
            line,
            column,
            field,
            message,
            fix,
        }
    }

    /// The document is not valid TOML.
    pub(crate) fn syntax_error(&self, err: &toml_edit::TomlError) -> ConfigError {
        let offset = err.span().map_or(0, |s| s.start);
        let message = one_line(err.message());
        if message.trim().is_empty() {
            // toml_edit says nothing when the text ends where a value must come
            // (`workers = ` at the end: an editor crash, a full disk, a write caught midway).
            let (message, fix) = if self.text[offset.min(self.text.len())..].trim().is_empty() {
                (
                    "a value is missing: the file ends here (was it cut off?)",
                    "complete the line, or put back the whole file (from a copy)",
                )
            } else {
                (
                    "invalid TOML here",
                    "correct the TOML syntax at this position",
                )
            };
            return self.error(offset, String::new(), message.to_owned(), fix.to_owned());
        }
        let fix = SYNTAX_FIXES
            .iter()
            .find(|(needle, _)| message.contains(needle))
            .map_or("correct the TOML syntax at this position", |(_, fix)| fix);
        self.error(offset, String::new(), message, fix.to_owned())
    }

    /// The document is valid TOML but does not fit the expected shape.
    pub(crate) fn shape_error(&self, doc: &ImDocument<&str>, err: &toml::de::Error) -> ConfigError {
        let offset = err.span().map_or(0, |s| s.start);
        let mut path = FieldPath::default();
        find_path(Node::Item(doc.as_item()), offset, &mut path);
        let mut message = readable_serde_message(&one_line(err.message()));
        let mut fix = shape_fix(&path.to_string(), &message);
        if let Some((m, f)) = unknown_key(&message, &path, doc) {
            (message, fix) = (m, f);
        }
        self.error(offset, path.to_string(), message, fix)
    }

    /// A validation error: locate its key, else its nearest located parent.
    pub(crate) fn issue_error(&self, doc: &ImDocument<&str>, issue: Issue) -> ConfigError {
        let offset = locate(doc, &issue.path).unwrap_or(0);
        self.error(offset, issue.path.to_string(), issue.message, issue.fix)
    }
}

/// 1-based line and column (in characters) of a byte offset; clamped to the text.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// Joins a possibly multi-line parser message into one line.
fn one_line(message: &str) -> String {
    let parts: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    parts.join("; ")
}

/// Replaces internal type names (`struct RawRoute`) in serde messages with "a table".
fn readable_serde_message(message: &str) -> String {
    let mut out = message.to_owned();
    while let Some(start) = out.find("struct Raw") {
        let rest = &out[start + "struct ".len()..];
        let len = rest
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len());
        out.replace_range(start..start + "struct ".len() + len, "a table");
    }
    out.replace("expected a map", "expected a table")
        .replace("expected i64", "expected a whole number")
}

/// serde's `unknown field `X`, expected one of `a`, `b`` for the key at `path`, retold:
/// only the keys that fit there (a TCP listener is not offered HTTP keys, nor the
/// reverse), and the closest one as a "did you mean".
fn unknown_key(
    message: &str,
    path: &FieldPath,
    doc: &ImDocument<&str>,
) -> Option<(String, String)> {
    let rest = message.strip_prefix("unknown field `")?;
    let (key, expected) = rest.split_once('`')?;
    let mut accepted: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    if let [Seg::Key(top), Seg::Index(i), Seg::Key(_)] = path.0.as_slice() {
        if top == "listeners" {
            let tcp = doc
                .get("listeners")
                .and_then(|l| Node::Item(l).elements().get(*i).copied())
                .and_then(|l| l.table()?.get("protocol")?.as_str())
                == Some("tcp");
            let other: &[&str] = if tcp {
                &crate::validate::tcp::HTTP_ONLY
            } else {
                &crate::validate::tcp::TCP_ONLY
            };
            accepted.retain(|k| !other.contains(k));
        }
    }
    if accepted.is_empty() {
        return None;
    }
    let list: Vec<String> = accepted.iter().map(|k| format!("`{k}`")).collect();
    let message = format!("unknown field `{key}`, expected one of {}", list.join(", "));
    let fix = match closest(key, &accepted) {
        Some(near) => format!("did you mean `{near}`? Rename the key, or remove it"),
        None => "remove the key or correct its spelling".to_owned(),
    };
    Some((message, fix))
}

/// The key of `keys` within two edits of `key` (one for short keys), the nearest first.
fn closest<'a>(key: &str, keys: &[&'a str]) -> Option<&'a str> {
    let limit = if key.len() < 5 { 1 } else { 2 };
    keys.iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance, counting a swap of two neighbours as one edit.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    d[0] = (0..=b.len()).collect();
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// Fixes for TOML syntax errors, by a phrase of the message.
const SYNTAX_FIXES: &[(&str, &str)] = &[
    (
        "duplicate key",
        "remove or rename one of the two definitions",
    ),
    (
        "basic string",
        "close the string with a double quote on the same line",
    ),
    (
        "literal string",
        "close the string with a single quote on the same line",
    ),
    (
        "invalid string",
        r#"write a valid value: "text" in quotes, a number, true or false, [a list] or { a table }"#,
    ),
    ("too large", "use a smaller number"),
    (
        "expected",
        "insert what is expected here, or correct the syntax around it",
    ),
];

/// Fixes for serde errors, by a phrase of the message.
const SHAPE_FIXES: &[(&str, &str)] = &[
    ("unknown field", "remove the key or correct its spelling"),
    ("expected a boolean", "write true or false, without quotes"),
    (
        "expected a sequence",
        r#"write a list in brackets, such as ["a", "b"]"#,
    ),
    (
        "expected a table",
        "write a table, such as { key = \"value\" } or a [section]",
    ),
    (
        "expected a string or an integer",
        "write a quoted string or a whole number",
    ),
    ("expected a string", "write the value in double quotes"),
    (
        "expected a whole number",
        "write a whole number, without quotes",
    ),
];

/// Fixes for serde errors on keys whose shape a generic fix would describe badly:
/// (key, phrase of the message, fix).
const KEY_FIXES: &[(&str, &str, &str)] = &[
    (
        "timeout",
        "expected a string",
        r#"write the duration in double quotes with a unit, such as "5s""#,
    ),
    (
        "interval",
        "expected a string",
        r#"write the duration in double quotes with a unit, such as "2s""#,
    ),
    (
        "slow_start",
        "expected a string",
        r#"write the duration in double quotes with a unit, such as "10s""#,
    ),
    (
        "listeners",
        "expected a sequence",
        "write each listener as a [[listeners]] table",
    ),
    (
        "routes",
        "expected a sequence",
        "write each route as a [[listeners.routes]] table",
    ),
    (
        "servers",
        "expected a sequence",
        r#"write servers = [{ addr = "host:port" }, ...]"#,
    ),
    (
        "hosts",
        "expected a sequence",
        r#"write hosts = ["example.com", "*.example.org"]"#,
    ),
];

/// How to fix a serde error on `field`.
fn shape_fix(field: &str, message: &str) -> String {
    let by_key = KEY_FIXES
        .iter()
        .find(|(key, needle, _)| field.ends_with(key) && message.contains(needle));
    if let Some((_, _, fix)) = by_key {
        return (*fix).to_owned();
    }
    SHAPE_FIXES
        .iter()
        .find(|(needle, _)| message.contains(needle))
        .map_or("change the value to the expected type", |(_, fix)| fix)
        .to_owned()
}

/// A node of the span-preserving document.
#[derive(Clone, Copy)]
enum Node<'a> {
    Item(&'a Item),
    Value(&'a Value),
    Table(&'a Table),
}

impl<'a> Node<'a> {
    fn span(self) -> Option<Range<usize>> {
        match self {
            Node::Item(item) => item.span(),
            Node::Value(value) => value.span(),
            Node::Table(table) => table.span(),
        }
    }

    fn table(self) -> Option<&'a dyn TableLike> {
        match self {
            Node::Item(item) => item.as_table_like(),
            Node::Value(value) => value.as_inline_table().map(|t| t as &dyn TableLike),
            Node::Table(table) => Some(table as &dyn TableLike),
        }
    }

    /// Elements of an array or array of tables; empty for anything else.
    fn elements(self) -> Vec<Node<'a>> {
        let array = match self {
            Node::Item(item) => {
                if let Some(tables) = item.as_array_of_tables() {
                    return tables.iter().map(Node::Table).collect();
                }
                item.as_array()
            }
            Node::Value(value) => value.as_array(),
            Node::Table(_) => None,
        };
        array.map_or_else(Vec::new, |a| a.iter().map(Node::Value).collect())
    }
}

/// The node at `path` in `doc`, if there is one.
fn node_at<'a>(doc: &'a ImDocument<&str>, path: &[Seg]) -> Option<Node<'a>> {
    let mut node = Node::Item(doc.as_item());
    for seg in path {
        node = match seg {
            Seg::Key(key) => Node::Item(node.table()?.get(key)?),
            Seg::Index(index) => *node.elements().get(*index)?,
        };
    }
    Some(node)
}

/// Whether `node` is a table whose `name` is `name`.
fn named(node: Node<'_>, name: &str) -> bool {
    let given = node
        .table()
        .and_then(|t| t.get("name"))
        .and_then(Item::as_str);
    given == Some(name)
}

/// Byte offset of the key named by `path`, else of its nearest located parent.
fn locate(doc: &ImDocument<&str>, path: &FieldPath) -> Option<usize> {
    let mut node = Node::Item(doc.as_item());
    let mut found = None;
    for seg in &path.0 {
        let next = match seg {
            Seg::Key(key) => node
                .table()
                .and_then(|t| t.get_key_value(key))
                .map(|(k, item)| (k.span(), Node::Item(item))),
            Seg::Index(index) => node.elements().get(*index).map(|n| (n.span(), *n)),
        };
        let Some((span, child)) = next else { break };
        found = span.map(|s| s.start).or(found);
        node = child;
    }
    found
}

/// Appends to `path` the keys leading to the deepest node that contains `offset`;
/// returns whether `offset` lies in `node` at all.
fn find_path(node: Node<'_>, offset: usize, path: &mut FieldPath) -> bool {
    if let Some(table) = node.table() {
        for (name, item) in table.iter() {
            let on_key = table
                .key(name)
                .and_then(|k| k.span())
                .is_some_and(|s| s.contains(&offset));
            path.0.push(Seg::Key(name.to_owned()));
            if on_key || find_path(Node::Item(item), offset, path) {
                return true;
            }
            path.0.pop();
        }
    }
    for (index, child) in node.elements().into_iter().enumerate() {
        path.0.push(Seg::Index(index));
        if find_path(child, offset, path) {
            return true;
        }
        path.0.pop();
    }
    node.span().is_some_and(|s| s.contains(&offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_one_line() {
        let err = ConfigError {
            file: "weir.toml".into(),
            line: 12,
            column: 5,
            field: "listeners[0].routes[0].upstream".into(),
            message: "unknown upstream \"cgi2\"".into(),
            fix: "define [upstreams.cgi2] or use one of: cgi".into(),
        };
        assert_eq!(
            err.to_string(),
            "weir.toml:12:5: listeners[0].routes[0].upstream: unknown upstream \"cgi2\" \
             (fix: define [upstreams.cgi2] or use one of: cgi)"
        );
    }

    #[test]
    fn display_leaves_out_what_does_not_apply() {
        let err = ConfigError::io(
            "weir.toml",
            &std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        let text = err.to_string();
        assert!(
            text.starts_with("weir.toml: cannot read the configuration file: "),
            "{text}"
        );
        assert!(text.ends_with("(fix: check the path, or pass another file with -c FILE)"));
    }

    #[test]
    fn paths_render_dotted() {
        let path = FieldPath::default()
            .key("upstreams")
            .key("cgi")
            .key("servers")
            .index(0);
        assert_eq!(
            path.key("addr").to_string(),
            "upstreams.cgi.servers[0].addr"
        );
        assert_eq!(
            FieldPath::default().key("upstreams").key("a.b").to_string(),
            "upstreams.\"a.b\""
        );
        for text in [
            "upstreams.\"a.b\".servers[0].addr",
            "listeners[1].tls.certs[0].cert",
            "x",
        ] {
            assert_eq!(FieldPath::parse(text).to_string(), text);
        }
    }

    #[test]
    fn line_column_counts_characters() {
        let text = "ab\nçd = 1\n";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 3), (2, 1));
        assert_eq!(line_column(text, 5), (2, 2)); // after the two-byte 'ç'
        assert_eq!(line_column(text, 4), (2, 1)); // inside 'ç': clamped back
        assert_eq!(line_column(text, 999), (3, 1));
    }

    #[test]
    fn internal_type_names_are_hidden() {
        assert_eq!(
            readable_serde_message("invalid type: string \"x\", expected struct RawUpstreamServer"),
            "invalid type: string \"x\", expected a table"
        );
    }

    #[test]
    fn near_keys_are_suggested() {
        let keys = ["backlog", "bind", "name", "weight"];
        assert_eq!(closest("bakclog", &keys), Some("backlog"));
        assert_eq!(closest("wieght", &keys), Some("weight"));
        assert_eq!(closest("bnd", &keys), Some("bind"));
        assert_eq!(closest("path", &keys), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn locate_falls_back_to_parent() {
        let text = "[[listeners]]\nname = \"a\"\n\n[[listeners]]\nname = \"b\"\n";
        let doc = ImDocument::parse(text).expect("valid TOML");
        let listeners = FieldPath::default().key("listeners");
        assert_eq!(locate(&doc, &listeners.index(1).key("name")), Some(40));
        assert_eq!(locate(&doc, &listeners.index(1).key("bind")), Some(26));
        assert_eq!(locate(&doc, &FieldPath::default().key("upstreams")), None);
    }

    /// Was: `listeners[extra].bind` (a bind failure on reload) fell back to the first
    /// `[[listeners]]` line; the listener's own `bind` line is meant.
    #[test]
    fn an_element_named_by_its_name_is_located() {
        let text = "[[listeners]]\nname = \"a\"\nbind = \":1\"\n\n\
                    [[listeners]]\nname = \"extra\"\nbind = \":2\"\n";
        let e = ConfigError::at_field("f", text, "listeners[extra].bind", "taken", "fix");
        assert_eq!((e.line, e.column), (7, 1), "{e}");
        assert_eq!(e.field, "listeners[extra].bind");
        let e = ConfigError::at_field("f", text, "listeners[nowhere].bind", "taken", "fix");
        assert_eq!(e.line, 1, "an unknown name: the parent key");
    }

    /// A listener named like a number (`443`) is its name, not an index, in the fields
    /// apply errors name. Was: `listeners[1].bind` for a listener named "1" pointed at the
    /// second listener's `bind`, and a name past the end at the first line.
    #[test]
    fn a_numeric_listener_name_is_located_by_name() {
        let text = "[[listeners]]\nname = \"443\"\nbind = \":1\"\n\n\
                    [[listeners]]\nname = \"0\"\nbind = \":2\"\n";
        let field = listener_field("0", ".bind");
        assert_eq!(field, "listeners[\"0\"].bind");
        let e = ConfigError::at_field("f", text, &field, "taken", "fix");
        assert_eq!((e.line, e.column), (7, 1), "{e}");
        let e = ConfigError::at_field("f", text, &listener_field("443", ".bind"), "m", "f");
        assert_eq!((e.line, e.column), (3, 1), "{e}");
        assert_eq!(listener_field("web", ".bind"), "listeners[web].bind");
        let e = ConfigError::at_field("f", text, "listeners[1].bind", "m", "f");
        assert_eq!(e.line, 7, "an index is still an index: {e}");
    }
}
