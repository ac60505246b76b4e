//! `codemode serve` over stdio, driven by the official MCP SDK client in Node.

use serde_json::Value;

const TESTBED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testbed/node_modules");
const CLIENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/codemode-client.cjs"
);

fn run_client(answer: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("note.txt"), "remember the milk").unwrap();
    let out = std::process::Command::new("node")
        .args([
            CLIENT,
            TESTBED,
            env!("CARGO_BIN_EXE_codemode-mcp-test-server"),
            dir.path().to_str().unwrap(),
            answer,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "client failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

fn text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_real_client_lists_runs_a_script_and_answers_an_approval() {
    let out = run_client("yes");
    let tools: Vec<&str> = out["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(tools.contains(&"codemode"), "{tools:?}");
    let description = out["codemodeDescription"].as_str().unwrap();
    assert!(
        description.contains("mcp__fs__read_text_file") || description.contains("mcp__fs"),
        "{description}"
    );
    let result = &out["result"];
    assert_ne!(result["isError"], Value::Bool(true), "{result}");
    let value = &result["structuredContent"]["value"];
    assert_eq!(
        result["structuredContent"]["ok"],
        Value::Bool(true),
        "{result}"
    );
    assert_eq!(value["read"], "remember the milk", "{result}");
    assert!(
        value["graph"]
            .as_str()
            .unwrap()
            .contains("remember the milk"),
        "{result}"
    );
    let calls = result["structuredContent"]["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 3, "{result}");
    let asked = out["elicitations"].as_array().unwrap();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(
        asked[0]
            .as_str()
            .unwrap()
            .contains("mcp__memory__create_entities")
    );
}

#[test]
fn a_declined_approval_fails_the_call() {
    let out = run_client("no");
    let body = text(&out["result"]);
    assert_eq!(
        out["result"]["isError"],
        Value::Bool(true),
        "{}",
        out["result"]
    );
    assert!(!body.contains("\"graph\""), "{body}");
    assert_eq!(out["elicitations"].as_array().unwrap().len(), 1);
}

#[test]
fn a_client_without_elicitation_is_denied_not_asked() {
    let out = run_client("none");
    assert_eq!(
        out["result"]["isError"],
        Value::Bool(true),
        "{}",
        out["result"]
    );
    assert!(out["elicitations"].as_array().unwrap().is_empty());
}
