//! Constraints a TypeScript type cannot say, as short comment tags (`@int @min 1 @default 20`).
//!
//! Tags are the first thing dropped when a declaration is too long, so they carry only what helps
//! a script pass validation on the first try.

use serde_json::{Map, Value};

use crate::schema::literal;
use crate::text::one_line;

/// Tags longer than this (a huge pattern or default) cost more than they help, so they are dropped.
const MAX_TAG_CHARS: usize = 80;

/// The tags of one property schema. The non-null branch of a two-way `anyOf`/`oneOf` is read too:
/// that is how Pydantic writes `int | None`.
pub(crate) fn constraint_tags(schema: &Value) -> Vec<String> {
    let Value::Object(map) = schema else {
        return Vec::new();
    };
    let mut sources = vec![map];
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = map.get(key) {
            let non_null: Vec<&Map<String, Value>> = branches
                .iter()
                .filter_map(Value::as_object)
                .filter(|b| b.get("type") != Some(&Value::String("null".into())))
                .collect();
            if non_null.len() == 1 && branches.len() == 2 {
                sources.extend(non_null);
            }
        }
    }

    let mut tags = Vec::new();
    let is_integer = sources.iter().any(|m| match m.get("type") {
        Some(Value::String(t)) => t == "integer",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "integer"),
        _ => false,
    });
    if is_integer {
        tags.push("@int".to_string());
    }

    let lower = bound(&sources, "minimum", "exclusiveMinimum", true);
    let upper = bound(&sources, "maximum", "exclusiveMaximum", false);
    for (name, value) in [
        ("@min", lower.inclusive),
        ("@gt", lower.exclusive),
        ("@max", upper.inclusive),
        ("@lt", upper.exclusive),
    ] {
        if let Some(v) = value {
            tags.push(format!("{name} {}", number(v)));
        }
    }
    for (keyword, name, largest) in [
        ("minLength", "@minLen", true),
        ("maxLength", "@maxLen", false),
        ("minItems", "@minItems", true),
        ("maxItems", "@maxItems", false),
        ("minProperties", "@minProps", true),
        ("maxProperties", "@maxProps", false),
    ] {
        if let Some(v) = pick(&sources, keyword, largest) {
            tags.push(format!("{name} {}", number(v)));
        }
    }
    if let Some(v) = pick(&sources, "multipleOf", true) {
        tags.push(format!("@multipleOf {}", number(v)));
    }
    for (keyword, name) in [("pattern", "@pattern"), ("format", "@format")] {
        if let Some(text) = sources.iter().find_map(|m| m.get(keyword)?.as_str()) {
            tags.push(format!("{name} {}", one_line(text)));
        }
    }
    if sources
        .iter()
        .any(|m| m.get("uniqueItems") == Some(&Value::Bool(true)))
    {
        tags.push("@unique".to_string());
    }
    if let Some(Value::Array(values)) = map.get("enum")
        && values.len() > crate::schema::MAX_ENUM_VALUES
    {
        tags.push(format!(
            "@oneOf {} values (describeTool lists them)",
            values.len()
        ));
    }
    if let Some(default) = map.get("default") {
        tags.push(format!("@default {}", one_line(&literal(default))));
    }
    if sources
        .iter()
        .any(|m| m.get("deprecated") == Some(&Value::Bool(true)))
    {
        tags.push("@deprecated".to_string());
    }
    tags.retain(|t| t.chars().count() <= MAX_TAG_CHARS);
    tags
}

#[derive(Default)]
struct Bound {
    inclusive: Option<f64>,
    exclusive: Option<f64>,
}

/// The tightest inclusive and exclusive bounds, honouring draft-04's boolean `exclusiveMinimum`.
fn bound(sources: &[&Map<String, Value>], inclusive: &str, exclusive: &str, lower: bool) -> Bound {
    let tighter = |a: Option<f64>, b: f64| match a {
        Some(a) if (lower && a >= b) || (!lower && a <= b) => Some(a),
        _ => Some(b),
    };
    let mut out = Bound::default();
    for map in sources {
        let value = map.get(inclusive).and_then(Value::as_f64);
        match (value, map.get(exclusive)) {
            (Some(v), Some(Value::Bool(true))) => out.exclusive = tighter(out.exclusive, v),
            (Some(v), _) => out.inclusive = tighter(out.inclusive, v),
            _ => {}
        }
        if let Some(v) = map.get(exclusive).and_then(Value::as_f64) {
            out.exclusive = tighter(out.exclusive, v);
        }
    }
    out
}

fn pick(sources: &[&Map<String, Value>], keyword: &str, largest: bool) -> Option<f64> {
    sources
        .iter()
        .filter_map(|m| m.get(keyword)?.as_f64())
        .reduce(|a, b| if (b > a) == largest { b } else { a })
}

/// `1` rather than `1.0` for whole numbers.
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_constraints_and_the_non_null_branch() {
        let tags = constraint_tags(&json!({
            "anyOf": [{"type": "integer", "maximum": 5}, {"type": "null"}], "default": null
        }));
        assert_eq!(tags, vec!["@int", "@max 5", "@default null"]);
        let tags =
            constraint_tags(&json!({"type": "number", "minimum": 0, "exclusiveMinimum": true}));
        assert_eq!(tags, vec!["@gt 0"]);
        let tags = constraint_tags(&json!({"type": "string", "pattern": "x".repeat(100)}));
        assert!(tags.is_empty());
    }
}
