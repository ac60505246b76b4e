//! What the tools declare: names, strict schemas, annotations, exposure, output schemas.

mod common;

use codemode_spec::{CallKind, Exposure};
use common::Bench;
use serde_json::{Value, json};

#[test]
fn seven_tools_in_a_stable_order() {
    let b = Bench::new();
    let names: Vec<&str> = b.tools.iter().map(|t| t.spec().name.as_str()).collect();
    assert_eq!(
        names,
        ["read", "write", "edit", "ls", "find", "grep", "bash"]
    );
}

#[test]
fn input_schemas_are_strict_and_valid() {
    let b = Bench::new();
    for tool in &b.tools {
        let spec = tool.spec();
        let schema = &spec.input_schema;
        assert!(
            jsonschema::meta::is_valid(schema),
            "{} schema is not a valid JSON Schema",
            spec.name
        );
        assert_eq!(schema["type"], "object", "{}", spec.name);
        assert_eq!(schema["additionalProperties"], false, "{}", spec.name);
        for (field, def) in schema["properties"].as_object().unwrap() {
            assert!(
                def.get("type").is_some(),
                "{}.{field} has no type",
                spec.name
            );
            assert!(
                def.get("description").is_some(),
                "{}.{field} has no description",
                spec.name
            );
        }
        assert!(
            spec.description.len() > 60,
            "{} needs a real description",
            spec.name
        );
        assert_eq!(spec.namespace, None);
        assert_eq!(spec.kind, CallKind::Tool);
        let validator = jsonschema::validator_for(schema).unwrap();
        assert!(
            !validator.is_valid(&json!({"unexpected": 1})),
            "{} accepts unknown fields",
            spec.name
        );
    }
    let required = |name: &str| b.tool(name).spec().input_schema["required"].clone();
    assert_eq!(required("read"), json!(["path"]));
    assert_eq!(required("write"), json!(["path", "content"]));
    assert_eq!(
        required("edit"),
        json!(["path", "old_string", "new_string"])
    );
    assert_eq!(required("find"), json!(["pattern"]));
    assert_eq!(required("grep"), json!(["pattern"]));
    assert_eq!(required("bash"), json!(["command"]));
    let read = jsonschema::validator_for(&b.tool("read").spec().input_schema).unwrap();
    assert!(read.is_valid(&json!({"path": "a", "offset": 1, "limit": 5})));
    assert!(!read.is_valid(&json!({"path": "a", "offset": 0})));
    assert!(!read.is_valid(&json!({"path": 3})));
}

#[test]
fn annotations_say_what_each_tool_does() {
    let b = Bench::new();
    for name in ["read", "ls", "find", "grep"] {
        let a = b.tool(name).spec().annotations.clone();
        assert_eq!(a.read_only_hint, Some(true), "{name}");
        assert_eq!(a.destructive_hint, Some(false), "{name}");
    }
    for name in ["write", "edit"] {
        let a = b.tool(name).spec().annotations.clone();
        assert_eq!(a.read_only_hint, Some(false), "{name}");
        assert_eq!(a.destructive_hint, Some(true), "{name}");
        assert_eq!(a.open_world_hint, Some(false), "{name}");
    }
    let bash = b.tool("bash").spec().annotations.clone();
    assert_eq!(bash.open_world_hint, Some(true));
    assert_eq!(bash.destructive_hint, Some(true));
    assert_eq!(bash.read_only_hint, Some(false));
}

#[test]
fn exposure_comes_from_the_config() {
    assert!(
        Bench::new()
            .tools
            .iter()
            .all(|t| t.spec().exposure == Exposure::Direct)
    );
    let b = Bench::with(|c| c.exposure = Exposure::Deferred);
    assert!(
        b.tools
            .iter()
            .all(|t| t.spec().exposure == Exposure::Deferred)
    );
}

#[tokio::test]
async fn results_match_their_output_schemas() {
    let b = Bench::new();
    b.put("f.txt", "a\nb\n");
    let calls: Vec<(&str, Value)> = vec![
        ("write", json!({"path": "g.txt", "content": "x"})),
        (
            "edit",
            json!({"path": "f.txt", "old_string": "a", "new_string": "c"}),
        ),
        ("ls", json!({})),
        ("find", json!({"pattern": "*.txt"})),
        ("grep", json!({"pattern": "c"})),
        ("bash", json!({"command": "echo ok"})),
        ("bash", json!({"command": "sleep 5", "timeout_ms": 200})),
    ];
    for (name, args) in calls {
        let schema = b
            .tool(name)
            .spec()
            .output_schema
            .clone()
            .unwrap_or_else(|| panic!("{name} has no output schema"));
        let out = b.call(name, args).await.unwrap();
        let validator = jsonschema::validator_for(&schema).unwrap();
        assert!(
            validator.is_valid(&out.value),
            "{name} returned {} against {schema}",
            out.value
        );
    }
    // read returns text or an image, so it declares no fixed shape.
    assert!(b.tool("read").spec().output_schema.is_none());
}
