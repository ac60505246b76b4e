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
        let schema = &spec.input_schema.value();
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
    let required = |name: &str| b.tool(name).spec().input_schema.value()["required"].clone();
    assert_eq!(required("read"), json!(["path"]));
    assert_eq!(required("write"), json!(["path", "content"]));
    assert_eq!(
        required("edit"),
        json!(["path", "old_string", "new_string"])
    );
    assert_eq!(required("find"), json!(["pattern"]));
    assert_eq!(required("grep"), json!(["pattern"]));
    assert_eq!(required("bash"), json!(["command"]));
    let read = jsonschema::validator_for(&b.tool("read").spec().input_schema.value()).unwrap();
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
    b.put("crlf.txt", "one\r\ntwo");
    b.put("empty.txt", "");
    b.put("pic.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR");
    std::os::unix::fs::symlink("f.txt", b.path("link")).unwrap();
    std::fs::create_dir(b.path("void")).unwrap();
    let calls: Vec<(&str, Value)> = vec![
        ("write", json!({"path": "g.txt", "content": "x"})),
        (
            "edit",
            json!({"path": "f.txt", "old_string": "a", "new_string": "c"}),
        ),
        ("read", json!({"path": "f.txt"})),
        ("read", json!({"path": "f.txt", "offset": 2, "limit": 1})),
        ("read", json!({"path": "crlf.txt"})),
        ("read", json!({"path": "empty.txt"})),
        ("read", json!({"path": "pic.png"})),
        ("ls", json!({})),
        ("ls", json!({"path": "void"})),
        ("find", json!({"pattern": "*.txt"})),
        ("find", json!({"pattern": "*.txt", "limit": 1})),
        ("find", json!({"pattern": "*.none"})),
        ("grep", json!({"pattern": "c"})),
        ("grep", json!({"pattern": "[a-z]", "limit": 1})),
        ("grep", json!({"pattern": "absent"})),
        ("bash", json!({"command": "echo ok"})),
        ("bash", json!({"command": "sleep 5", "timeout_ms": 200})),
    ];
    for (name, args) in calls {
        let schema = b
            .tool(name)
            .spec()
            .output_schema
            .as_ref()
            .map(codemode_spec::Schema::value)
            .unwrap_or_else(|| panic!("{name} has no output schema"));
        let out = b.call(name, args.clone()).await.unwrap();
        let validator = jsonschema::validator_for(&schema).unwrap();
        assert!(
            validator.is_valid(&out.value),
            "{name} {args} returned {} against {schema}",
            out.value
        );
    }
}

/// What scripts get from the file tools: values to use, not text to parse; a direct call still
/// reads as text.
#[tokio::test]
async fn file_tools_give_scripts_structured_values() {
    let b = Bench::new();
    b.put("src/a.rs", "fn a() {}\n// TODO one\n");
    b.put("src/b.rs", "// TODO two\r\nlast line without break");
    b.put("notes.txt", "1\n2\n3\n4\n5\n");
    std::os::unix::fs::symlink("notes.txt", b.path("alias")).unwrap();

    let grep = b.value("grep", json!({"pattern": "TODO"})).await;
    assert_eq!(
        grep,
        json!({"matches": [
            {"path": "src/a.rs", "line": 2, "text": "// TODO one"},
            {"path": "src/b.rs", "line": 1, "text": "// TODO two"}
        ], "truncated": false})
    );
    let none = b.value("grep", json!({"pattern": "FIXME"})).await;
    assert_eq!(none, json!({"matches": [], "truncated": false}));
    // A direct call still reads as a sentence.
    assert!(
        b.text("grep", json!({"pattern": "FIXME"}))
            .await
            .starts_with("No matches for `FIXME`")
    );
    let one = b
        .value("grep", json!({"pattern": "TODO", "limit": 1}))
        .await;
    assert_eq!(one["matches"].as_array().unwrap().len(), 1);
    assert_eq!(one["truncated"], true);

    let find = b.value("find", json!({"pattern": "*.rs"})).await;
    assert_eq!(
        find,
        json!({"paths": ["src/a.rs", "src/b.rs"], "truncated": false})
    );
    let dirs = b.value("find", json!({"pattern": "src"})).await;
    assert_eq!(dirs, json!({"paths": ["src/"], "truncated": false}));
    assert_eq!(
        b.value("find", json!({"pattern": "*.rs", "limit": 1}))
            .await,
        json!({"paths": ["src/a.rs"], "truncated": true})
    );
    assert_eq!(
        b.value("find", json!({"pattern": "*.py"})).await,
        json!({"paths": [], "truncated": false})
    );

    let ls = b.value("ls", json!({})).await;
    assert_eq!(
        ls,
        json!({"entries": [
            {"name": "alias", "kind": "symlink"},
            {"name": "notes.txt", "kind": "file"},
            {"name": "src", "kind": "dir"}
        ], "truncated": false})
    );
    assert_eq!(b.text("ls", json!({})).await, "alias@\nnotes.txt\nsrc/\n");

    let read = b
        .value(
            "read",
            json!({"path": "notes.txt", "offset": 2, "limit": 2}),
        )
        .await;
    assert_eq!(
        read,
        json!({"text": "2\n3\n", "startLine": 2, "endLine": 3, "totalLines": 5, "truncated": true})
    );
    let shown = b
        .text(
            "read",
            json!({"path": "notes.txt", "offset": 2, "limit": 2}),
        )
        .await;
    assert!(shown.starts_with("     2\t2\n     3\t3\n"), "{shown}");
    assert!(shown.contains("offset=4"), "{shown}");
    // Line breaks become \n; a last line the file does not end gets none.
    let crlf = b.value("read", json!({"path": "src/b.rs"})).await;
    assert_eq!(crlf["text"], "// TODO two\nlast line without break");
    assert_eq!(
        (
            crlf["endLine"].clone(),
            crlf["totalLines"].clone(),
            crlf["truncated"].clone()
        ),
        (json!(2), json!(2), json!(false))
    );
    // The whole file, joined back, is the file.
    let whole = b.value("read", json!({"path": "notes.txt"})).await;
    assert_eq!(whole["text"], "1\n2\n3\n4\n5\n");
}
