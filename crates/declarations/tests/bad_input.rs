//! Hostile and odd input: nothing panics, output stays well-formed, limits hold.

mod support;

use std::time::Instant;

use codemode_declarations::{
    DescriptionInput, RenderOptions, ToolIndex, codemode_description, direct_tool_note,
    render_declaration, render_type, tool_sample,
};
use codemode_spec::ToolSpec;
use serde_json::{Value, json};

fn ts(schema: &Value) -> String {
    let out = render_type(schema, &RenderOptions::default());
    support::balanced(&out).unwrap();
    out
}

#[test]
fn non_object_schemas() {
    for (schema, expected) in [
        (json!(null), "unknown"),
        (json!(true), "unknown"),
        (json!(false), "never"),
        (json!(0), "unknown"),
        (json!("object"), "unknown"),
        (json!([{"type": "string"}]), "unknown"),
        (json!({}), "unknown"),
        (json!({"type": 7}), "unknown"),
        (json!({"type": []}), "unknown"),
        (json!({"type": "bogus"}), "unknown"),
        (json!({"enum": []}), "never"),
        (json!({"enum": "x"}), "unknown"),
        (json!({"anyOf": []}), "never"),
        (json!({"anyOf": "x"}), "unknown"),
        (json!({"properties": 5}), "Record<string, unknown>"),
        (json!({"required": [1, null]}), "Record<string, unknown>"),
        (json!({"type": "array", "items": 3}), "unknown[]"),
    ] {
        assert_eq!(ts(&schema), expected, "for {schema}");
    }
}

/// `{ "type": <ty>, <key>: <inner> }` built by hand: `json!` would serialize (recurse into) `inner`.
fn wrap(ty: Option<&str>, key: &str, inner: Value) -> Value {
    let mut map = serde_json::Map::new();
    if let Some(ty) = ty {
        map.insert("type".into(), Value::String(ty.into()));
    }
    map.insert(key.into(), inner);
    Value::Object(map)
}

#[test]
fn deep_nesting_is_cut_off() {
    let mut schema = json!({"type": "string"});
    let mut arrays = json!({"type": "string"});
    let mut unions = json!({"type": "string"});
    for _ in 0..2_000 {
        schema = wrap(Some("object"), "properties", wrap(None, "a", schema));
        arrays = wrap(Some("array"), "items", arrays);
        unions = wrap(
            None,
            "anyOf",
            Value::Array(vec![unions, json!({"type": "null"})]),
        );
    }
    assert!(ts(&schema).contains("unknown"));
    let nested = ts(&arrays);
    assert!(
        nested.starts_with("unknown[][]") && nested.ends_with("[]"),
        "{nested}"
    );
    assert_eq!(ts(&unions), "unknown");
    // Dropping a 2,000-deep value recurses in serde_json itself; not what this test is about.
    std::mem::forget(schema);
    std::mem::forget(arrays);
    std::mem::forget(unions);
}

#[test]
fn self_referential_and_exploding_refs() {
    assert_eq!(ts(&json!({"$ref": "#"})), "unknown");
    let mutual = json!({"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}}, "b": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}}}, "$ref": "#/$defs/a"});
    assert_eq!(ts(&mutual), "{ b?: { a?: unknown } }");
    // Each level doubles the work without the expansion bound: 2^40 otherwise.
    let mut defs = serde_json::Map::new();
    for i in 0..40 {
        defs.insert(format!("d{i}"), json!({"type": "object", "properties": {"l": {"$ref": format!("#/$defs/d{}", i + 1)}, "r": {"$ref": format!("#/$defs/d{}", i + 1)}}}));
    }
    defs.insert("d40".into(), json!({"type": "string"}));
    let start = Instant::now();
    let out = ts(&json!({"$defs": defs, "$ref": "#/$defs/d0"}));
    assert!(start.elapsed().as_secs() < 5);
    assert!(out.contains("unknown"));
}

#[test]
fn ten_thousand_properties() {
    let mut properties = serde_json::Map::new();
    for i in 0..10_000 {
        properties.insert(
            format!("p{i}"),
            json!({"type": "string", "description": format!("Property {i}")}),
        );
    }
    let schema = json!({"type": "object", "properties": properties});
    let start = Instant::now();
    let bounded = ts(&schema);
    // Too long for the default bound even without comments: degrades to `unknown`.
    assert_eq!(bounded, "unknown");
    let unbounded = render_type(
        &schema,
        &RenderOptions {
            max_chars: usize::MAX,
            ..RenderOptions::default()
        },
    );
    assert_eq!(unbounded.lines().count(), 10_002);
    assert!(unbounded.contains("  p9999?: string // Property 9999\n"));
    assert!(start.elapsed().as_secs() < 10);
    let tool = ToolSpec::new("wide", "Very wide", schema);
    let index = ToolIndex::new(std::slice::from_ref(&tool), &[]);
    assert!(
        index
            .describe_tool("wide")
            .unwrap()
            .contains("wide(args: unknown)")
    );
}

#[test]
fn too_long_types_drop_tags_then_comments() {
    let mut properties = serde_json::Map::new();
    for i in 0..40 {
        properties.insert(format!("p{i}"), json!({"type": "integer", "minimum": 1, "maximum": 1000, "description": "x".repeat(30)}));
    }
    let schema = json!({"type": "object", "properties": properties});
    let full = render_type(
        &schema,
        &RenderOptions {
            max_chars: usize::MAX,
            ..RenderOptions::default()
        },
    );
    assert!(full.contains("@int") && full.contains("xxx"));
    let no_tags = render_type(
        &schema,
        &RenderOptions {
            max_chars: full.len() - 1,
            ..RenderOptions::default()
        },
    );
    assert!(
        !no_tags.contains("@int") && no_tags.contains("xxx"),
        "{no_tags}"
    );
    let bare = render_type(
        &schema,
        &RenderOptions {
            max_chars: no_tags.len() - 1,
            ..RenderOptions::default()
        },
    );
    assert!(
        !bare.contains("//") && bare.contains("p39?: number"),
        "{bare}"
    );
    let none = render_type(
        &schema,
        &RenderOptions {
            max_chars: 10,
            ..RenderOptions::default()
        },
    );
    assert_eq!(none, "unknown");
}

#[test]
fn weird_names_and_descriptions() {
    let names = [
        "read file",
        "a.b.c",
        "a-b.c",
        "🚀 launch",
        "delete",
        "class",
        "1st",
        "",
        "with\nnewline",
        "名前",
    ];
    let descriptions = [
        "",
        "   ",
        "ends */ comment",
        "ctl \u{0}\u{1b}[31m red",
        "para\n\n\n\npara",
        "```\ncode\n```",
    ];
    let mut tools = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let description = descriptions[i % descriptions.len()];
        let tool = ToolSpec::new(
            *name,
            description,
            json!({"type": "object", "properties": {"x": {"type": "string", "description": description}}}),
        );
        let declaration = render_declaration(&tool, &RenderOptions::default());
        support::balanced(&declaration).unwrap();
        for line in declaration.lines() {
            assert!(
                !line.chars().any(|c| c.is_control()),
                "control character in {line:?}"
            );
        }
        let signature = declaration.lines().find(|l| !l.starts_with("//")).unwrap();
        // render_declaration shows one tool alone, so it always uses the identifier.
        assert!(signature.starts_with(&format!("{}(args: ", codemode_spec::to_identifier(name))));
        let sample = tool_sample(&tool);
        assert!(sample.contains("```ts\ndeclare const tools: {\n"));
        assert_eq!(
            sample.matches("```").count(),
            2,
            "the description cannot close the fence: {sample}"
        );
        assert!(
            !sample.chars().any(|c| c.is_control() && c != '\n'),
            "{sample:?}"
        );
        assert!(direct_tool_note(&tool).starts_with("Codemode: `tools."));
        tools.push(tool);
    }
    let text = codemode_description(&DescriptionInput::new(&tools, &[]));
    // The listing block must close exactly once: descriptions cannot end the fence early.
    let listing = &text[text.find("```ts").unwrap()..];
    assert_eq!(listing.matches("```").count(), 2, "{text}");
    let block = &text[text.find("```ts").unwrap() + 5..text.rfind("```").unwrap()];
    support::balanced(block).unwrap();
    // `a.b.c` and `a-b.c` share `a_b_c`: both are declared by raw name, neither shadows the other.
    assert!(
        text.contains("\"a.b.c\"(args: ") && text.contains("\"a-b.c\"(args: "),
        "{text}"
    );
    assert!(
        text.contains("\n_(args: ") && text.contains("\n__(args: "),
        "{text}"
    );
}

/// A hostile server's enum of 200 000 values used to cost quadratic time (deduplicating the
/// union) and stall the gateway; now a long enum renders as its values' type with a count.
#[test]
fn huge_enum_renders_as_its_base_type() {
    let values: Vec<Value> = (0..200_000).map(|i| json!(format!("value_{i}"))).collect();
    let schema = json!({"type": "object", "properties": {"e": {"enum": values}}});
    let start = Instant::now();
    let out = ts(&schema);
    assert!(out.contains("e?: string"), "{out}");
    assert!(out.contains("@oneOf 200000 values"), "{out}");
    assert!(!out.contains("value_1"), "{out}");
    // Mixed values keep every type they use; a short enum still lists its values.
    let mixed: Vec<Value> = (0..500)
        .map(|i| if i % 2 == 0 { json!(i) } else { json!(null) })
        .collect();
    assert_eq!(ts(&json!({"enum": mixed})), "number | null");
    assert_eq!(ts(&json!({"enum": ["a", "b"]})), "\"a\" | \"b\"");
    // Many distinct branches (within the node bound) are deduplicated in linear time too.
    let branches: Vec<Value> = (0..45_000).map(|i| json!({"const": i})).collect();
    let wide = render_type(
        &json!({"anyOf": branches}),
        &RenderOptions {
            max_chars: usize::MAX,
            ..RenderOptions::default()
        },
    );
    assert_eq!(wide.matches(" | ").count(), 44_999);
    // Generous: the quadratic version took minutes here.
    assert!(start.elapsed().as_secs() < 30);
    let tool = ToolSpec::new("bigenum", "Big enum", schema);
    let index = ToolIndex::new(std::slice::from_ref(&tool), &[]);
    let described = index.describe_tool("bigenum").unwrap();
    assert!(described.contains("@oneOf 200000 values"), "{described}");
}
