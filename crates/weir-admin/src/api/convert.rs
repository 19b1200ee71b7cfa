//! Request bodies to TOML and config text to JSON.
//!
//! Object bodies (an upstream, a listener, a route, a server's settings) arrive as JSON or
//! TOML and become `toml_edit` tables that are spliced into the config document, so the
//! file keeps the user's comments and layout around them. Reading goes the other way: the
//! config text is deserialized into JSON as written.

use serde_json::Value as Json;
use toml_edit::{Array, ArrayOfTables, InlineTable, Item, Table, Value};

use super::error::ApiError;

/// How a body is encoded, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Toml,
}

impl Format {
    /// JSON unless the type names TOML.
    pub fn of_content_type(content_type: Option<&str>) -> Format {
        match content_type {
            Some(t) if t.contains("toml") => Format::Toml,
            _ => Format::Json,
        }
    }
}

/// A body holding one object (a table) as a `toml_edit` table.
pub fn body_table(body: &[u8], format: Format) -> Result<Table, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("the body is not UTF-8", "send UTF-8 text"))?;
    match format {
        Format::Toml => {
            let doc: toml_edit::DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| {
                ApiError::bad_request(
                    format!("invalid TOML: {}", e.message()),
                    "send a TOML table",
                )
            })?;
            Ok(doc.as_table().clone())
        }
        Format::Json => match parse_json(text)? {
            Json::Object(map) => Ok(json_table(&map)),
            _ => Err(ApiError::bad_request(
                "the body is not a JSON object",
                "send an object such as {\"servers\": [{\"addr\": \"127.0.0.1:8081\"}]}",
            )),
        },
    }
}

/// A whole config body as TOML text (JSON is converted; TOML is kept as sent).
pub fn body_config_text(body: &[u8], format: Format) -> Result<String, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("the body is not UTF-8", "send UTF-8 text"))?;
    match format {
        Format::Toml => Ok(text.to_string()),
        Format::Json => match parse_json(text)? {
            Json::Object(map) => {
                let mut doc = toml_edit::DocumentMut::new();
                *doc.as_table_mut() = json_table(&map);
                Ok(doc.to_string())
            }
            _ => Err(ApiError::bad_request(
                "the body is not a JSON object",
                "send the config as a JSON object, or as TOML with Content-Type: application/toml",
            )),
        },
    }
}

fn parse_json(text: &str) -> Result<Json, ApiError> {
    serde_json::from_str(text).map_err(|e| {
        ApiError::bad_request(format!("invalid JSON: {e}"), "send a valid JSON document")
    })
}

/// Config text as JSON, keys as written.
pub fn config_json(text: &str) -> Json {
    toml::from_str::<Json>(text).unwrap_or(Json::Null)
}

/// A JSON object as a TOML table: nested objects become sub-tables, arrays of objects
/// become arrays of tables (`[[listeners.routes]]`), except `servers`, which the examples
/// write inline (`servers = [{ addr = "..." }]`).
pub fn json_table(map: &serde_json::Map<String, Json>) -> Table {
    let mut table = Table::new();
    for (key, value) in map {
        let item = match value {
            Json::Object(inner) => Item::Table(json_table(inner)),
            Json::Array(items)
                if key != "servers" && !items.is_empty() && items.iter().all(Json::is_object) =>
            {
                let mut tables = ArrayOfTables::new();
                for item in items.iter().filter_map(Json::as_object) {
                    tables.push(json_table(item));
                }
                Item::ArrayOfTables(tables)
            }
            Json::Null => continue,
            other => Item::Value(json_value(other)),
        };
        table.insert(key, item);
    }
    table
}

/// A JSON value as an inline TOML value.
pub fn json_value(value: &Json) -> Value {
    match value {
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::from(i),
            None => Value::from(n.as_f64().unwrap_or(0.0)),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => {
            let mut array = Array::new();
            for item in items.iter().filter(|i| !i.is_null()) {
                array.push(json_value(item));
            }
            Value::Array(array)
        }
        Json::Object(map) => {
            let mut inline = InlineTable::new();
            for (k, v) in map.iter().filter(|(_, v)| !v.is_null()) {
                inline.insert(k, json_value(v));
            }
            Value::InlineTable(inline)
        }
        Json::Null => Value::from(""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_config_becomes_toml_the_parser_accepts() {
        let body = br#"{"server": {"workers": 1},
            "listeners": [{"name": "web", "bind": "127.0.0.1:0",
                "routes": [{"name": "all", "upstream": "app"}]}],
            "upstreams": {"app": {"servers": [{"addr": "127.0.0.1:9000", "weight": 2}],
                "lb": "weighted_round_robin"}}}"#;
        let text = body_config_text(body, Format::Json).unwrap();
        let config = weir_config::parse_str(&text, "api").unwrap();
        assert_eq!(config.listeners[0].routes[0].name, "all");
        assert_eq!(config.upstreams[0].servers[0].weight, 2);
        assert_eq!(
            config_json(&text)["upstreams"]["app"]["lb"],
            "weighted_round_robin"
        );
    }

    #[test]
    fn bodies_that_are_not_objects_are_refused() {
        assert!(body_table(b"[1, 2]", Format::Json).is_err());
        assert!(body_table(b"{", Format::Json).is_err());
        assert!(body_table(b"a = ", Format::Toml).is_err());
        assert!(body_table(&[0xff, 0xfe], Format::Json).is_err());
        let t = body_table(b"lb = \"random\"", Format::Toml).unwrap();
        assert_eq!(t.get("lb").and_then(|i| i.as_str()), Some("random"));
    }
}
