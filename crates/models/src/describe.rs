//! Short names for JSON values in error messages ("a string", "{ prompt }"), so a message says
//! what the script passed without echoing large data back.

use serde_json::Value;

const MAX_KEYS: usize = 6;

pub(crate) fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(_) => "a boolean".into(),
        Value::Number(_) => "a number".into(),
        Value::String(s) if s.is_empty() => "an empty string".into(),
        Value::String(_) => "a string".into(),
        Value::Array(a) if a.is_empty() => "an empty array".into(),
        Value::Array(_) => "an array".into(),
        Value::Object(o) if o.is_empty() => "{}".into(),
        Value::Object(o) => {
            let mut keys: Vec<&str> = o.keys().take(MAX_KEYS).map(String::as_str).collect();
            if o.len() > MAX_KEYS {
                keys.push("…");
            }
            format!("{{ {} }}", keys.join(", "))
        }
    }
}
