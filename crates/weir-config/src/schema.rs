//! The JSON Schema of `weir.toml` (`weir schema`), derived from the raw structs in `raw`
//! so it can never disagree with what the parser accepts: every key is there with its doc
//! comment as description, and `deny_unknown_fields` becomes `additionalProperties:
//! false`, so editors (Taplo / Even Better TOML) complete keys and flag unknown ones.
//! Values are checked by type only; ranges, units and cross-references stay with
//! validation (`weir check`), which says where and how to fix them.

use std::borrow::Cow;

use schemars::transform::RecursiveTransform;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde_json::Value;

use crate::raw::{RawConfig, StrOrInt, Switch};

/// The schema of the whole file (JSON Schema 2020-12).
pub fn schema() -> Schema {
    let settings = schemars::generate::SchemaSettings::draft2020_12()
        .with_transform(RecursiveTransform(drop_null));
    let mut schema = settings
        .into_generator()
        .into_root_schema_for::<RawConfig>();
    schema.insert("title".into(), "weir.toml".into());
    schema.insert(
        "description".into(),
        "Weir's configuration file (docs/configuration.md)".into(),
    );
    schema
}

/// Every key is optional (`Option`), which schemars writes as "or null"; TOML has no null,
/// so the alternative only clutters what editors show.
fn drop_null(schema: &mut Schema) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    if let Some(Value::Array(types)) = object.get_mut("type") {
        types.retain(|t| t != "null");
        if let [only] = types.as_slice() {
            let only = only.clone();
            object.insert("type".into(), only);
        }
    }
    if let Some(Value::Array(any_of)) = object.get_mut("anyOf") {
        any_of.retain(|s| s.get("type").is_none_or(|t| t != "null"));
        if let [Value::Object(only)] = any_of.as_slice() {
            let only = only.clone();
            object.remove("anyOf");
            object.extend(only);
        }
    }
}

impl JsonSchema for StrOrInt {
    fn schema_name() -> Cow<'static, str> {
        "StrOrInt".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "a string (\"16KiB\", \"auto\") or a whole number",
            "type": ["string", "integer"]
        })
    }
}

impl<T: JsonSchema + crate::raw::Described> JsonSchema for Switch<T> {
    fn schema_name() -> Cow<'static, str> {
        format!("Switch_{}", T::schema_name()).into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let table = generator.subschema_for::<T>();
        json_schema!({
            "description": T::EXPECTING,
            "anyOf": [{ "type": "boolean" }, table]
        })
    }
}
