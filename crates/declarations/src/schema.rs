//! JSON Schema → a small type tree ([`Ty`]).
//!
//! Reading the schema and printing TypeScript are separate steps so that the printer can decide
//! layout (one line or many, with or without tags) from the whole tree, and so that re-rendering
//! without tags does not re-walk the schema. Every input is accepted: whatever this module does not
//! understand becomes `unknown`, and hard bounds on depth, nodes and `$ref` expansions keep hostile
//! schemas (self-references, huge fan-out) cheap.

use std::collections::HashSet;

use serde_json::{Map, Value};

use crate::tags::constraint_tags;
use crate::text::{foreign_comment_lines, property_key};

/// Deeper nesting than this renders as `unknown`: no real tool needs it, and it bounds recursion.
pub(crate) const MAX_DEPTH: usize = 40;
/// `$ref` expansions per schema; more become `unknown` (also stops ref fan-out blowing up).
pub(crate) const MAX_REF_EXPANSIONS: usize = 32;
/// Schema nodes visited per schema; beyond this everything becomes `unknown`.
pub(crate) const MAX_NODES: usize = 50_000;
/// An `enum` with more values than this renders as the types of its values (with an `@oneOf N`
/// tag): a list that long helps no model, and `describeTool` still shows the whole schema.
pub const MAX_ENUM_VALUES: usize = 100;

/// A TypeScript type, before layout.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Ty {
    Unknown,
    Never,
    /// An atom: a primitive name or a JSON literal.
    Atom(String),
    Union(Vec<Ty>),
    Intersection(Vec<Ty>),
    Array(Box<Ty>),
    Tuple {
        items: Vec<Ty>,
        rest: Option<Box<Ty>>,
    },
    Object(Object),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub(crate) struct Object {
    pub props: Vec<Prop>,
    /// `[key: string]: T` for extra keys.
    pub index: Option<Box<Ty>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Prop {
    /// Already quoted when it is not an identifier.
    pub key: String,
    pub optional: bool,
    /// Description lines, already safe for a `//` comment.
    pub doc: Vec<String>,
    /// Constraint tags such as `@min 1`, already safe for a comment.
    pub tags: Vec<String>,
    pub ty: Ty,
}

/// Converts `schema` into a [`Ty`], resolving local references against `schema` itself.
pub(crate) fn build(schema: &Value) -> Ty {
    let mut builder = Builder {
        root: schema,
        ref_stack: Vec::new(),
        expansions: 0,
        nodes: 0,
    };
    builder.build(schema, 0)
}

struct Builder<'a> {
    root: &'a Value,
    ref_stack: Vec<String>,
    expansions: usize,
    nodes: usize,
}

const TYPE_KEYWORDS: &[&str] = &[
    "type",
    "properties",
    "additionalProperties",
    "patternProperties",
    "items",
    "prefixItems",
    "$ref",
    "const",
    "enum",
    "anyOf",
    "oneOf",
    "allOf",
];

impl<'a> Builder<'a> {
    fn build(&mut self, schema: &'a Value, depth: usize) -> Ty {
        self.nodes += 1;
        if depth > MAX_DEPTH || self.nodes > MAX_NODES {
            return Ty::Unknown;
        }
        match schema {
            Value::Bool(true) => Ty::Unknown,
            Value::Bool(false) => Ty::Never,
            Value::Object(map) => self.build_map(map, depth),
            _ => Ty::Unknown,
        }
    }

    fn build_map(&mut self, map: &'a Map<String, Value>, depth: usize) -> Ty {
        if let Some(Value::String(reference)) = map.get("$ref") {
            let ty = self.build_ref(reference, depth);
            return nullable(map, ty);
        }
        if let Some(value) = map.get("const") {
            return Ty::Atom(literal(value));
        }
        if let Some(Value::Array(values)) = map.get("enum") {
            if values.len() > MAX_ENUM_VALUES {
                return nullable(map, union(values.iter().map(json_type).collect()));
            }
            return nullable(
                map,
                union(values.iter().map(|v| Ty::Atom(literal(v))).collect()),
            );
        }

        let mut parts = Vec::new();
        let has_base = [
            "type",
            "properties",
            "additionalProperties",
            "patternProperties",
        ]
        .iter()
        .chain(["required", "items", "prefixItems"].iter())
        .any(|k| map.contains_key(*k));
        if has_base {
            parts.push(self.build_typed(map, depth));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(branches)) = map.get(key) {
                // Branches that only add constraints (`{required: [...]}`) say nothing a type can.
                if branches.is_empty() || branches.iter().any(is_typed) {
                    let tys = branches.iter().map(|b| self.build(b, depth + 1)).collect();
                    parts.push(union(tys));
                }
            }
        }
        if let Some(Value::Array(all)) = map.get("allOf") {
            for part in all {
                parts.push(self.build(part, depth + 1));
            }
        }
        nullable(map, intersection(parts))
    }

    fn build_ref(&mut self, reference: &str, depth: usize) -> Ty {
        if self.ref_stack.iter().any(|r| r == reference) || self.expansions >= MAX_REF_EXPANSIONS {
            return Ty::Unknown;
        }
        let Some(target) = resolve_ref(reference, self.root) else {
            return Ty::Unknown;
        };
        self.expansions += 1;
        self.ref_stack.push(reference.to_string());
        let ty = self.build(target, depth + 1);
        self.ref_stack.pop();
        ty
    }

    fn build_typed(&mut self, map: &'a Map<String, Value>, depth: usize) -> Ty {
        match map.get("type") {
            Some(Value::String(name)) => self.build_type_name(name, map, depth),
            Some(Value::Array(names)) if !names.is_empty() => {
                let tys = names
                    .iter()
                    .map(|n| match n {
                        Value::String(name) => self.build_type_name(name, map, depth),
                        _ => Ty::Unknown,
                    })
                    .collect();
                union(tys)
            }
            _ => {
                if [
                    "properties",
                    "additionalProperties",
                    "patternProperties",
                    "required",
                ]
                .iter()
                .any(|k| map.contains_key(*k))
                {
                    self.build_object(map, depth)
                } else if map.contains_key("items") || map.contains_key("prefixItems") {
                    self.build_array(map, depth)
                } else {
                    Ty::Unknown
                }
            }
        }
    }

    fn build_type_name(&mut self, name: &str, map: &'a Map<String, Value>, depth: usize) -> Ty {
        match name {
            "string" => Ty::Atom("string".into()),
            "number" | "integer" => Ty::Atom("number".into()),
            "boolean" => Ty::Atom("boolean".into()),
            "null" => Ty::Atom("null".into()),
            "array" => self.build_array(map, depth),
            "object" => self.build_object(map, depth),
            _ => Ty::Unknown,
        }
    }

    fn build_array(&mut self, map: &'a Map<String, Value>, depth: usize) -> Ty {
        let tuple = |this: &mut Self, items: &'a [Value], rest: Option<&'a Value>| {
            let items = items.iter().map(|i| this.build(i, depth + 1)).collect();
            let rest = match rest {
                None | Some(Value::Bool(false)) => None,
                Some(schema) => Some(Box::new(this.build(schema, depth + 1))),
            };
            Ty::Tuple { items, rest }
        };
        if let Some(Value::Array(prefix)) = map.get("prefixItems") {
            return tuple(self, prefix, map.get("items"));
        }
        match map.get("items") {
            Some(Value::Array(items)) => {
                // Draft-04 tuples: `additionalItems` is the rest (absent means any).
                let rest = match map.get("additionalItems") {
                    None => Some(&Value::Bool(true)),
                    other => other,
                };
                tuple(self, items, rest)
            }
            Some(Value::Bool(false)) => Ty::Tuple {
                items: Vec::new(),
                rest: None,
            },
            Some(items) => Ty::Array(Box::new(self.build(items, depth + 1))),
            None => Ty::Array(Box::new(Ty::Unknown)),
        }
    }

    fn build_object(&mut self, map: &'a Map<String, Value>, depth: usize) -> Ty {
        let required: HashSet<&str> = match map.get("required") {
            Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).collect(),
            _ => HashSet::new(),
        };
        let mut props = Vec::new();
        if let Some(Value::Object(properties)) = map.get("properties") {
            let mut names: Vec<&'a String> = properties.keys().collect();
            names.sort();
            for name in names {
                let Some(schema) = properties.get(name) else {
                    continue;
                };
                let ty = self.build(schema, depth + 1);
                props.push(Prop {
                    key: property_key(name),
                    optional: !required.contains(name.as_str()),
                    doc: foreign_comment_lines(&self.description_of(schema)),
                    tags: constraint_tags(schema),
                    ty,
                });
            }
        }

        let mut extra = Vec::new();
        match map.get("additionalProperties") {
            None | Some(Value::Bool(false)) => {}
            Some(schema) => extra.push(self.build(schema, depth + 1)),
        }
        if let Some(Value::Object(patterns)) = map.get("patternProperties") {
            for schema in patterns.values() {
                extra.push(self.build(schema, depth + 1));
            }
        }
        let index = if !extra.is_empty() {
            Some(union(extra))
        } else if props.is_empty()
            && !matches!(map.get("properties"), Some(Value::Object(_)))
            && !map.contains_key("additionalProperties")
        {
            // Nothing said about the keys: any keys.
            Some(Ty::Unknown)
        } else {
            None
        };

        match index {
            // A typed index signature beside properties of other types does not type-check in one
            // literal, so it goes into its own half of an intersection.
            Some(index) if !props.is_empty() && index != Ty::Unknown => Ty::Intersection(vec![
                Ty::Object(Object { props, index: None }),
                Ty::Object(Object {
                    props: Vec::new(),
                    index: Some(Box::new(index)),
                }),
            ]),
            index => Ty::Object(Object {
                props,
                index: index.map(Box::new),
            }),
        }
    }

    /// A property's description, or its title, or the description of what its `$ref` names.
    fn description_of(&self, schema: &Value) -> String {
        let Value::Object(map) = schema else {
            return String::new();
        };
        for key in ["description", "title"] {
            if let Some(Value::String(text)) = map.get(key)
                && !text.trim().is_empty()
            {
                return text.clone();
            }
        }
        if let Some(Value::String(reference)) = map.get("$ref")
            && let Some(Value::Object(target)) = resolve_ref(reference, self.root)
            && let Some(Value::String(text)) = target.get("description")
        {
            return text.clone();
        }
        String::new()
    }
}

/// True when a schema says something a type can express (not only constraints).
fn is_typed(schema: &Value) -> bool {
    match schema {
        Value::Object(map) => TYPE_KEYWORDS.iter().any(|k| map.contains_key(*k)),
        _ => true,
    }
}

/// OpenAPI's `nullable: true` adds `null`.
fn nullable(map: &Map<String, Value>, ty: Ty) -> Ty {
    if map.get("nullable") == Some(&Value::Bool(true)) && ty != Ty::Unknown {
        union(vec![ty, Ty::Atom("null".into())])
    } else {
        ty
    }
}

/// A JSON value as a TypeScript literal type. JSON text is valid TypeScript type syntax.
pub(crate) fn literal(value: &Value) -> String {
    match serde_json::to_string(value) {
        Ok(json) => crate::text::escape_invisible(&json),
        Err(_) => "unknown".to_string(),
    }
}

/// The TypeScript type of one JSON value, for an enum too long to list.
fn json_type(value: &Value) -> Ty {
    let name = match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "unknown[]",
        Value::Object(_) => "{ [key: string]: unknown }",
    };
    Ty::Atom(name.into())
}

/// A union with nested unions flattened, `never` removed, duplicates removed, and `unknown`
/// absorbing everything. Duplicates are found by hashing, so a hostile enum of many thousand
/// values costs linear time, not quadratic.
pub(crate) fn union(members: Vec<Ty>) -> Ty {
    let mut flat: Vec<Ty> = Vec::new();
    let mut seen: HashSet<Ty> = HashSet::new();
    let mut add = |m: Ty, flat: &mut Vec<Ty>| {
        if seen.insert(m.clone()) {
            flat.push(m);
        }
    };
    for member in members {
        match member {
            Ty::Unknown => return Ty::Unknown,
            Ty::Never => {}
            Ty::Union(inner) => {
                for m in inner {
                    add(m, &mut flat);
                }
            }
            m => add(m, &mut flat),
        }
    }
    match flat.len() {
        0 => Ty::Never,
        1 => flat.pop().unwrap_or(Ty::Never),
        _ => Ty::Union(flat),
    }
}

/// An intersection with `unknown` parts dropped (they add nothing) and nested ones flattened.
fn intersection(parts: Vec<Ty>) -> Ty {
    let mut flat: Vec<Ty> = Vec::new();
    let mut seen: HashSet<Ty> = HashSet::new();
    for part in parts {
        match part {
            Ty::Unknown => {}
            Ty::Never => return Ty::Never,
            Ty::Intersection(inner) => flat.extend(inner),
            p => {
                if seen.insert(p.clone()) {
                    flat.push(p);
                }
            }
        }
    }
    match flat.len() {
        0 => Ty::Unknown,
        1 => flat.pop().unwrap_or(Ty::Unknown),
        _ => Ty::Intersection(flat),
    }
}

/// The subschema a local reference (`#`, `#/$defs/Item`, `#/definitions/a~1b`) names in `root`.
/// Remote references, missing targets and malformed escapes give `None`.
pub(crate) fn resolve_ref<'v>(reference: &str, root: &'v Value) -> Option<&'v Value> {
    let pointer = reference.strip_prefix('#')?;
    if pointer.is_empty() {
        return Some(root);
    }
    let pointer = pointer.strip_prefix('/')?;
    let mut current = root;
    for raw in pointer.split('/') {
        let segment = percent_decode(raw)?.replace("~1", "/").replace("~0", "~");
        current = match current {
            Value::Object(map) => map.get(&segment)?,
            Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(current)
}

/// URI percent-decoding of one pointer segment; `None` for a malformed escape or non-UTF-8 result.
fn percent_decode(segment: &str) -> Option<String> {
    if !segment.contains('%') {
        return Some(segment.to_string());
    }
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = segment.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn resolves_local_pointers_with_escapes() {
        let root = json!({"$defs": {"a/b": {"type": "string"}, "c d": {"type": "null"}}});
        assert_eq!(
            resolve_ref("#/$defs/a~1b", &root),
            Some(&json!({"type": "string"}))
        );
        assert_eq!(
            resolve_ref("#/$defs/c%20d", &root),
            Some(&json!({"type": "null"}))
        );
        assert_eq!(resolve_ref("#/$defs/%zz", &root), None);
        assert_eq!(resolve_ref("https://x/y", &root), None);
        assert_eq!(resolve_ref("#", &root), Some(&root));
    }

    #[test]
    fn unions_flatten_and_absorb() {
        let s = Ty::Atom("string".into());
        assert_eq!(union(vec![s.clone(), s.clone()]), s);
        assert_eq!(union(vec![s.clone(), Ty::Unknown]), Ty::Unknown);
        assert_eq!(union(vec![]), Ty::Never);
    }
}
