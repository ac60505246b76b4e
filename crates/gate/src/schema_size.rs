//! How large a tool's input schema is once its local `$ref`s are expanded.
//!
//! Validation walks a schema as if every `$ref` were written out, and branches (`anyOf`,
//! `oneOf`) are each tried against the same value. A 3 KB schema whose `$defs` each point to
//! the next one twice doubles the work per level: a red team's 22 levels took 86 s and 6.6 GB
//! for one call, past the script's deadline, since validation runs on a host thread. A schema
//! whose expansion passes a bound is not checked at all; its tool's calls are refused.

use std::collections::HashMap;

use serde_json::Value;

/// Nodes a schema may expand to. Real tools' schemas expand to hundreds; the declaration
/// renderer stops at 50,000.
pub(crate) const MAX_EXPANDED_NODES: u64 = 200_000;

/// References followed within one another at most.
const MAX_REF_DEPTH: usize = 256;

/// The schema's node count with each local `$ref` counted as its target, stopping past
/// `limit`. A reference back into itself (a recursive type) counts once: recursion is bounded
/// by the value validated, not by the schema.
pub(crate) fn expanded_nodes(schema: &Value, limit: u64) -> u64 {
    let mut walk = Walk {
        root: schema,
        sizes: HashMap::new(),
        open: Vec::new(),
        limit,
    };
    walk.size(schema)
}

struct Walk<'a> {
    root: &'a Value,
    /// Each `$ref`'s expanded size, once known.
    sizes: HashMap<&'a str, u64>,
    /// `$ref`s being expanded now.
    open: Vec<&'a str>,
    limit: u64,
}

impl<'a> Walk<'a> {
    fn size(&mut self, v: &'a Value) -> u64 {
        let mut n = 1u64;
        match v {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get("$ref") {
                    n = n.saturating_add(self.reference(r));
                }
                for child in map.values() {
                    if n > self.limit {
                        break;
                    }
                    n = n.saturating_add(self.size(child));
                }
            }
            Value::Array(items) => {
                for child in items {
                    if n > self.limit {
                        break;
                    }
                    n = n.saturating_add(self.size(child));
                }
            }
            _ => {}
        }
        n
    }

    fn reference(&mut self, r: &'a str) -> u64 {
        if let Some(size) = self.sizes.get(r) {
            return *size;
        }
        if self.open.contains(&r) {
            return 1;
        }
        // A chain of references this deep is refused rather than followed on the stack.
        if self.open.len() >= MAX_REF_DEPTH {
            return self.limit.saturating_add(1);
        }
        let Some(target) = r
            .strip_prefix('#')
            .and_then(|pointer| self.root.pointer(pointer))
        else {
            return 1;
        };
        self.open.push(r);
        let size = self.size(target);
        self.open.pop();
        self.sizes.insert(r, size);
        size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `l0` … `l{depth}`, each trying the next twice.
    fn doubling(depth: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..depth {
            let next = format!("#/$defs/l{}", i + 1);
            defs.insert(
                format!("l{i}"),
                json!({"anyOf": [{"$ref": next}, {"$ref": next, "title": "x"}]}),
            );
        }
        defs.insert(format!("l{depth}"), json!({"type": "string"}));
        json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/l0"}}, "$defs": defs})
    }

    #[test]
    fn a_doubling_chain_is_counted_as_it_expands() {
        assert!(expanded_nodes(&doubling(4), u64::MAX) < 1_000);
        assert!(expanded_nodes(&doubling(22), MAX_EXPANDED_NODES) > MAX_EXPANDED_NODES);
    }

    #[test]
    fn a_long_chain_of_references_is_refused_without_following_it_all() {
        let mut defs = serde_json::Map::new();
        for i in 0..100_000 {
            defs.insert(
                format!("d{i}"),
                json!({"$ref": format!("#/$defs/d{}", i + 1)}),
            );
        }
        let chain = json!({"$ref": "#/$defs/d0", "$defs": defs});
        assert!(expanded_nodes(&chain, MAX_EXPANDED_NODES) > MAX_EXPANDED_NODES);
    }

    #[test]
    fn a_recursive_type_and_an_ordinary_schema_stay_small() {
        let tree = json!({
            "$defs": {"node": {"type": "object", "properties": {
                "value": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
            }}},
            "$ref": "#/$defs/node"
        });
        assert!(expanded_nodes(&tree, u64::MAX) < 100);
        let plain = json!({"type": "object", "properties": {"path": {"type": "string"}}});
        assert!(expanded_nodes(&plain, u64::MAX) < 20);
    }
}
