//! Golden tests: the exact text for representative schemas, tools and descriptions is pinned in
//! tests/golden/. After an intended change, regenerate with `UPDATE_GOLDEN=1 cargo test -p
//! codemode-declarations --test golden` and review the diff.

mod support;

use codemode_declarations::{
    DescriptionInput, Globals, RenderOptions, codemode_description, direct_tool_note,
    render_declaration, render_type, tool_sample,
};
use codemode_spec::{CodemodeMode, Exposure, ToolSpec};
use serde_json::{Value, json};

fn check(name: &str, actual: &str) {
    let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("missing golden {path}; run with UPDATE_GOLDEN=1 to create it"));
    if expected != actual {
        let _ = std::fs::write(format!("{path}.actual"), actual);
        panic!("{name} differs from its golden; the new text is in {path}.actual");
    }
}

fn type_cases() -> Vec<(&'static str, Value)> {
    vec![
        (
            "primitives in a type array",
            json!({"type": ["string", "integer", "boolean", "null"]}),
        ),
        (
            "enum and const",
            json!({"type": "object", "properties": {"mode": {"enum": ["a", "b", 3, null]}, "kind": {"const": "fixed"}}, "required": ["kind"]}),
        ),
        (
            "sorted, optional, quoted keys",
            json!({"type": "object", "properties": {"zeta": {"type": "string"}, "alpha-beta": {"type": "number"}, "with space": {"type": "boolean"}, "delete": {"type": "null"}}, "required": ["zeta"]}),
        ),
        (
            "reference's read-file example",
            json!({"type": "object", "properties": {"path": {"type": "string", "description": "File path"}, "limit": {"type": "integer", "minimum": 1, "default": 20}, "mode": {"enum": ["a", "b"]}}, "required": ["path"]}),
        ),
        (
            "pydantic optional int",
            json!({"type": "object", "properties": {"n": {"anyOf": [{"type": "integer", "maximum": 5}, {"type": "null"}], "default": null}}}),
        ),
        (
            "all tags",
            json!({"type": "object", "properties": {
            "n": {"type": "number", "minimum": 0, "exclusiveMaximum": 10, "multipleOf": 0.5},
            "s": {"type": "string", "minLength": 1, "maxLength": 80, "pattern": "^[a-z]+$", "format": "email"},
            "l": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3, "uniqueItems": true},
            "old": {"type": "string", "deprecated": true, "description": "Use new instead"}}}),
        ),
        (
            "arrays and tuples",
            json!({"type": "object", "properties": {
            "list": {"type": "array", "items": {"type": ["string", "number"]}},
            "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}], "items": false},
            "open": {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "boolean"}},
            "old": {"type": "array", "items": [{"type": "string"}, {"type": "null"}], "additionalItems": false},
            "any": {"type": "array"}}, "required": ["list", "pair", "open", "old", "any"]}),
        ),
        (
            "unions and intersections",
            json!({"type": "object", "properties": {
            "u": {"oneOf": [{"type": "string"}, {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}]},
            "i": {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}}, {"anyOf": [{"type": "object", "properties": {"b": {"type": "string"}}}, {"type": "object", "properties": {"c": {"type": "string"}}}]}]},
            "n": {"type": "string", "nullable": true},
            "only_constraints": {"type": "object", "properties": {"a": {"type": "string"}}, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}}}),
        ),
        (
            "maps and index signatures",
            json!({"type": "object", "properties": {
            "free": {"type": "object"},
            "typed": {"type": "object", "additionalProperties": {"type": "number"}},
            "mixed": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "number"}},
            "open": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": true},
            "closed": {"type": "object", "properties": {}, "additionalProperties": false}}}),
        ),
        (
            "refs: local, recursive, remote, escaped",
            json!({
            "$defs": {"Node": {"type": "object", "description": "A tree node", "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}, "a/b": {"type": "string"}},
            "type": "object",
            "properties": {"root": {"$ref": "#/$defs/Node"}, "slash": {"$ref": "#/$defs/a~1b"}, "remote": {"$ref": "https://example.com/s.json"}, "missing": {"$ref": "#/$defs/nope"}, "bad": {"$ref": "#/$defs/%zz"}}}),
        ),
        (
            "nested multi-line objects indent",
            json!({"type": "object", "properties": {"outer": {"type": "object", "description": "Outer\nspans two lines", "properties": {"inner": {"type": "object", "properties": {"leaf": {"type": "string", "description": "The leaf"}}}}}}}),
        ),
        (
            "hostile descriptions",
            json!({"type": "object", "properties": {"x": {"type": "string", "description": "ends */ a comment\u{7}, has ```fences``` and\u{2028}separators"}}}),
        ),
        (
            "non-object schemas",
            json!([true, false, 1, "string", null]),
        ),
    ]
}

#[test]
fn types_match_their_goldens() {
    let mut out = String::new();
    for (name, schema) in type_cases() {
        let rendered = if name == "non-object schemas" {
            schema
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    format!(
                        "{s} renders as {}",
                        render_type(s, &RenderOptions::default())
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            render_type(&schema, &RenderOptions::default())
        };
        support::balanced(&rendered).unwrap();
        out.push_str(&format!("=== {name}\n{rendered}\n\n"));
    }
    check("types.txt", &out);
}

#[test]
fn declarations_and_samples_match_their_goldens() {
    let mut tools = support::coding_tools();
    tools.extend(support::mcp_server("server-memory").0);
    tools.extend(support::mcp_server("server-everything").0);
    let mut out = String::new();
    for tool in &tools {
        out.push_str(&render_declaration(tool, &RenderOptions::default()));
        out.push_str("\n\n");
    }
    check("declarations.txt", &out);

    let mut samples = String::new();
    for tool in tools
        .iter()
        .filter(|t| ["read", "bash", "mcp__memory__open_nodes"].contains(&t.name.as_str()))
    {
        samples.push_str(&format!("=== {}\n{}\n\n", tool.name, tool_sample(tool)));
        samples.push_str(&format!("note: {}\n\n", direct_tool_note(tool)));
    }
    check("samples.txt", &samples);
}

#[test]
fn descriptions_match_their_goldens() {
    let mut tools: Vec<ToolSpec> = support::coding_tools();
    for tool in tools
        .iter_mut()
        .filter(|t| ["read", "bash"].contains(&t.name.as_str()))
    {
        tool.exposure = Exposure::Direct;
    }
    let (mcp, namespaces) = support::all_mcp();
    tools.extend(mcp);
    let mut lint = ToolSpec::new(
        "lint-js",
        "Lint JavaScript files.",
        json!({"type": "object", "properties": {"files": {"type": "array", "items": {"type": "string"}}}, "required": ["files"]}),
    );
    lint.exposure = Exposure::Codemode;
    tools.push(lint);
    let mut hidden = ToolSpec::new("secret", "never shown", json!({}));
    hidden.exposure = Exposure::Hidden;
    tools.push(hidden);

    let on = DescriptionInput::new(&tools, &namespaces);
    check("description-on.txt", &codemode_description(&on));
    let only = DescriptionInput {
        mode: CodemodeMode::Only,
        globals: Globals {
            models: true,
            models_doc: Some("docs/models.md".into()),
        },
        inline_budget_tokens: 1500,
        ..DescriptionInput::new(&tools, &namespaces)
    };
    check("description-only-1500.txt", &codemode_description(&only));
    let none = DescriptionInput {
        inline_budget_tokens: 0,
        ..DescriptionInput::new(&tools, &namespaces)
    };
    check("description-budget-0.txt", &codemode_description(&none));
}
