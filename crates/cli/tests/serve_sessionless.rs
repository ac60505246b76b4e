//! `codemode serve --listen` runs scripts only in sessions a token began.
//!
//! The MCP library also serves the sessionless protocol revision (2026-07-28) to any request
//! whose `_meta` names it. Such a request used to run its script in a session no token owned.
//! That script escaped the token's principal budgets, its cap on running scripts and its
//! name in the audit log, and left the session's memory behind. The attack sends exactly that
//! request with a valid token.
//!
//! A session's `initialize` parameters are kept as long as the session lives, so a client
//! could make each of its sessions hold megabytes. An oversized `initialize` is refused.

use crate::common;
use common::Server;

use std::process::Command;

use serde_json::{Value, json};

const ALICE: &str = "alice-token-0123456789";

/// Posts each `[extra headers, body]` of a file in turn, without a session, and
/// prints `{status, session, text}` for each.
const POST: &str = r#"
const [url, token, bodiesFile] = process.argv.slice(1);
const bodies = require("fs").readFileSync(bodiesFile, "utf8");
(async () => {
  const out = [];
  for (const [extra, body] of JSON.parse(bodies)) {
    const headers = Object.assign({ "content-type": "application/json",
      accept: "application/json, text/event-stream", authorization: "Bearer " + token }, extra);
    const r = await fetch(url, { method: "POST", headers, body: JSON.stringify(body) });
    out.push({ status: r.status, session: r.headers.get("mcp-session-id"), text: await r.text() });
  }
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

fn serve(root: &std::path::Path) -> (Server, String) {
    std::fs::write(
        root.join("policy.cedar"),
        "@id(\"all\")\npermit (principal, action, resource);\n",
    )
    .unwrap();
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(ALICE.as_bytes()))
    };
    let tokens = json!({"tokens": [{"name": "alice", "token_sha256": sha}]});
    std::fs::write(root.join("tokens.json"), tokens.to_string()).unwrap();
    let path = |p: &str| root.join(p).display().to_string();
    let (child, url) = common::start_serving(
        common::codemode()
            .args(["serve", "--listen", "127.0.0.1:0", "--mode", "only"])
            .args(["--policy", &path("policy.cedar")])
            .args(["--tokens-file", &path("tokens.json")])
            .args(["--config-dir", &path("")])
            .args(["--workdir", &path("")])
            .env_remove("CODEMODE_SERVE_TOKEN"),
    );
    (Server(child), url)
}

fn post(url: &str, bodies: Value) -> Vec<Value> {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), bodies.to_string()).unwrap();
    let mut node = Command::new("node");
    node.args(["-e", POST, url, ALICE]).arg(file.path());
    match common::client_json(node) {
        Value::Array(answers) => answers,
        other => panic!("the client printed no list of answers: {other}"),
    }
}

fn initialize(capabilities: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": capabilities,
        "clientInfo": {"name": "probe", "version": "1"}}})
}

#[test]
fn a_request_without_a_session_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, url) = serve(dir.path());
    // The sessionless revision's request, as rmcp accepts it: its `_meta` keys, under an older
    // version header, and under its own with the headers that revision requires.
    let stateless = |version: &str| {
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "codemode",
        "arguments": {"code": "store('left', 'x'.repeat(1000)); return 'ran for nobody';"},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": version,
            "io.modelcontextprotocol/clientCapabilities": {}
        }}})
    };
    let plain_call = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
        "params": {"name": "codemode", "arguments": {"code": "return 'ran';"}}});
    let answers = post(
        &url,
        json!([
            [{"mcp-protocol-version": "2025-06-18"}, stateless("2025-06-18")],
            [{"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "codemode"},
                stateless("2026-07-28")],
            [{}, plain_call]
        ]),
    );
    for answer in &answers {
        let text = answer["text"].as_str().unwrap_or_default();
        assert!(
            !text.contains("ran"),
            "a script ran without a session: {answer}"
        );
        assert_eq!(answer["status"], 400, "{answer}");
        assert!(
            text.contains("no Mcp-Session-Id") && text.contains("initialize"),
            "the refusal says what to do: {answer}"
        );
    }

    // Beginning a session still works, and the session it answers with is usable.
    let begun = post(&url, json!([[{}, initialize(json!({}))]]));
    assert_eq!(begun[0]["status"], 200, "{}", begun[0]);
    assert!(begun[0]["session"].is_string(), "{}", begun[0]);
}

#[test]
fn an_oversized_initialize_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, url) = serve(dir.path());
    // About 200 KB of small numbers: several megabytes once parsed and kept.
    let bulky = json!({"experimental": {"x": {"y": vec![0; 100_000]}}});
    let answers = post(&url, json!([[{}, initialize(bulky)]]));
    assert_eq!(answers[0]["status"], 413, "{}", answers[0]);
    assert!(answers[0]["session"].is_null(), "no session was made");
    let text = answers[0]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("initialize") && text.contains("65536"),
        "{text}"
    );
}
