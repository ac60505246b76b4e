//! A tool's JSON Schema, held as its compact JSON text.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// A JSON Schema kept as compact JSON text, shared by every copy of the spec that holds it.
///
/// A parsed `serde_json::Value` takes about ten times its text in memory, and one MCP server may
/// list thousands of tools with large schemas: held as text, such a listing costs the host about
/// its own size. Readers parse it when they need it ([`Schema::value`]); the few that read it on
/// every call (a tool's validator) keep what they built from it.
#[derive(Clone, PartialEq, Eq)]
pub struct Schema(Arc<str>);

impl Schema {
    pub fn new(value: &Value) -> Schema {
        // Writing a `Value` cannot fail: its keys are strings and its numbers finite.
        Schema(serde_json::to_string(value).unwrap_or_default().into())
    }

    /// The schema, parsed. Text that does not parse back (nesting past the JSON reader's depth
    /// limit) reads as `false`, the schema nothing matches: a call is refused, not waved through.
    pub fn value(&self) -> Value {
        serde_json::from_str(&self.0).unwrap_or(Value::Bool(false))
    }

    /// The compact JSON text.
    pub fn text(&self) -> &str {
        &self.0
    }

    /// Whether both are the one shared text (not merely equal).
    pub fn shares(&self, other: &Schema) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl From<Value> for Schema {
    fn from(value: Value) -> Schema {
        Schema::new(&value)
    }
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Schema {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Schema {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Schema, D::Error> {
        Value::deserialize(deserializer).map(Schema::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_and_shares() {
        let v = json!({"type": "object", "properties": {"b": {"type": "string"}, "a": {}}});
        let s = Schema::new(&v);
        assert_eq!(s.value(), v);
        assert_eq!(
            s.text(),
            r#"{"type":"object","properties":{"b":{"type":"string"},"a":{}}}"#
        );
        let copy = s.clone();
        assert!(copy.shares(&s));
        assert!(!Schema::new(&v).shares(&s));
        assert_eq!(serde_json::to_value(&s).unwrap(), v);
        let back: Schema = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn text_too_deep_to_read_back_is_the_schema_nothing_matches() {
        let mut v = json!({});
        for _ in 0..200 {
            v = json!({ "not": v });
        }
        assert_eq!(Schema::new(&v).value(), Value::Bool(false));
    }
}
