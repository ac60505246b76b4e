//! One token cannot take the whole sandbox pool of `codemode serve` from the others.
//!
//! Every running cell holds a pool worker for as long as it runs, a call waiting for a
//! person included (the worker waits for the call's result). The pool holds 64 workers by
//! default, a session may have 8 live cells and a token may keep hundreds of sessions, so
//! without a cap per token one token's 8 sessions × 8 paused cells hold every worker for up
//! to `approvals.expire_after` (an hour by default) and another token's scripts only queue.
//!
//! The real `codemode serve --listen` with a tokens file (alice and bob) and the default pool:
//! alice fills 8 sessions with 8 cells each that wait for approval; bob's script must still
//! run at once, and alice's cells past her share must be refused with a message naming the
//! limit and the setting that raises it.

use crate::common;
use common::Server;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-98765432100";

const POLICY: &str = r#"
@id("hold-needs-a-person")
@ask("holding needs a person")
permit (principal, action == Action::"tool_call", resource == Tool::"bash");
"#;

/// Each cell waits for a person at its first call; its start returns once it waits.
const HOLD: &str = "// @options: {\"yield_after_ms\": 2000}\nawait tools.bash({ command: \"echo hold\" });\nreturn 'held';";

/// Bob's script needs no tool; it has 8 s to end before its start returns `running`.
const BOB_SCRIPT: &str = "// @options: {\"yield_after_ms\": 8000}\nreturn 'bob ran';";

/// Opens `sessions` sessions with `token` and starts `per_session` cells of `code` in each, a
/// session's cells at once and one session after another (as a steady client would, so the
/// pool starts a worker for each); prints every `codemode` answer.
const START: &str = r#"
const [url, token, sessions, perSession, code] = process.argv.slice(1);
const h = (session) => Object.assign({ "content-type": "application/json",
  accept: "application/json, text/event-stream", authorization: "Bearer " + token },
  session ? { "mcp-session-id": session } : {});
const post = async (session, body) => {
  const r = await fetch(url, { method: "POST", headers: h(session), body: JSON.stringify(body) });
  const text = await r.text();
  if (r.status >= 300) throw new Error(r.status + " " + text);
  const messages = (r.headers.get("content-type") || "").includes("event-stream")
    ? text.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).filter(Boolean).map((l) => JSON.parse(l))
    : text ? [JSON.parse(text)] : [];
  return { session: r.headers.get("mcp-session-id"), answer: messages.find((m) => m.id === body.id) };
};
const open = async () => {
  const { session } = await post(null, { jsonrpc: "2.0", id: 1, method: "initialize",
    params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "probe", version: "1" } } });
  await fetch(url, { method: "POST", headers: h(session),
    body: JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }) });
  return session;
};
(async () => {
  const ids = [];
  for (let s = 0; s < Number(sessions); s++) ids.push(await open());
  const answers = [];
  for (const session of ids) {
    const calls = [];
    for (let i = 0; i < Number(perSession); i++)
      calls.push(post(session, { jsonrpc: "2.0", id: 2 + i, method: "tools/call",
        params: { name: "codemode", arguments: { code } } }).then((r) => r.answer));
    answers.push(...(await Promise.all(calls)));
  }
  console.log(JSON.stringify(answers));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

struct Env {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Env {
    fn new(cells: Value) -> Env {
        Env::with(
            POLICY,
            json!({
                "approvals": {"when_nobody_can_answer": "pause", "expire_after": "10m"},
                "state": {"url": "memory:"},
                "cells": cells,
            }),
        )
    }

    fn with(policy: &str, settings: Value) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        for d in ["config", "state", "project", "tokens"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("policy.cedar"), policy).unwrap();
        std::fs::write(root.join("config/settings.json"), settings.to_string()).unwrap();
        let sha = |t: &str| {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(t.as_bytes()))
        };
        let tokens = json!({"tokens": [
            {"name": "alice", "token_sha256": sha(ALICE)},
            {"name": "bob", "token_sha256": sha(BOB)},
        ]});
        std::fs::write(root.join("tokens/tokens.json"), tokens.to_string()).unwrap();
        Env { _dir: dir, root }
    }

    fn serve(&self) -> (Server, String) {
        let path = |p: &str| self.root.join(p).display().to_string();
        let (child, url) = common::start_serving(
            common::codemode()
                .args(["serve", "--listen", "127.0.0.1:0", "--mode", "only"])
                .args(["--policy", &path("policy.cedar")])
                .args(["--tokens-file", &path("tokens/tokens.json")])
                .args(["--config-dir", &path("config")])
                .args(["--state-dir", &path("state")])
                .args(["--workdir", &path("project")])
                .env_remove("CODEMODE_SERVE_TOKEN"),
        );
        (Server(child), url)
    }
}

/// Every `codemode` answer of `sessions` × `per_session` cells started at once with `token`.
fn start(url: &str, token: &str, sessions: usize, per_session: usize, code: &str) -> Vec<Value> {
    let mut node = Command::new("node");
    node.args(["-e", START, url, token])
        .arg(sessions.to_string())
        .arg(per_session.to_string())
        .arg(code);
    match common::client_json(node) {
        Value::Array(answers) => answers,
        other => panic!("the client printed no list of answers: {other}"),
    }
}

fn status(answer: &Value) -> &str {
    answer["result"]["structuredContent"]["status"]
        .as_str()
        .unwrap_or("")
}

fn text(answer: &Value) -> String {
    answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Live worker processes of the server: its child processes (no MCP server is configured).
fn workers(server: &Server) -> usize {
    let pid = server.0.id();
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
                .map(|c| c.split_whitespace().count())
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn one_token_filling_its_sessions_with_paused_cells_leaves_room_for_another() {
    let env = Env::new(json!({}));
    let (server, url) = env.serve();

    // Alice: 8 sessions × 8 cells (the per-session maximum), each to wait for a person.
    let alice = start(&url, ALICE, 8, 8, HOLD);
    let (refused, admitted): (Vec<String>, Vec<String>) = alice
        .iter()
        .map(text)
        .partition(|t| t.contains("cells.max_running_per_principal"));
    // Workers start one after another: wait until alice's admitted cells hold one each.
    let deadline = Instant::now() + Duration::from_secs(120);
    while workers(&server) < admitted.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let held = workers(&server);
    eprintln!(
        "alice: {} cells admitted, {} refused; the server has {held} worker processes",
        admitted.len(),
        refused.len()
    );

    // Bob's script runs now, not after alice's approvals expire.
    let bob = start(&url, BOB, 1, 1, BOB_SCRIPT);
    assert_eq!(
        status(&bob[0]),
        "finished",
        "bob's script did not run while alice held {held} workers with paused cells: {}",
        text(&bob[0])
    );

    // Alice got her fair share (half of the 64 workers) and a refusal past it that says
    // what the limit is and how to raise it.
    assert_eq!(admitted.len(), 32, "alice's admitted cells");
    for message in &refused {
        assert!(
            message.contains("32"),
            "the refusal names the limit: {message}"
        );
    }
}

/// With cells off, a script holds its worker for as long as its calls take: the same cap holds
/// for a token's scripts, from the same setting.
#[test]
fn with_cells_off_a_tokens_scripts_past_its_share_are_refused() {
    let policy = "@id(\"bash-runs\")\npermit (principal, action == Action::\"tool_call\", resource == Tool::\"bash\");\n";
    let env = Env::with(
        policy,
        json!({"cells": {"enabled": false, "max_running_per_principal": 2}}),
    );
    let (_server, url) = env.serve();
    // Four scripts of alice's at once, each holding its worker for 3 s.
    let hold = "await tools.bash({ command: \"sleep 3\" }); return 'slept';";
    let alice = start(&url, ALICE, 1, 4, hold);
    let texts: Vec<String> = alice.iter().map(text).collect();
    let (refused, ran): (Vec<&String>, Vec<&String>) = texts
        .iter()
        .partition(|t| t.contains("cells.max_running_per_principal"));
    assert_eq!(ran.len(), 2, "alice's share of 2 ran: {texts:?}");
    assert!(ran.iter().all(|t| t.contains("slept")), "{texts:?}");
    assert_eq!(refused.len(), 2, "{texts:?}");
    assert!(
        refused
            .iter()
            .all(|t| t.contains("`alice` already runs 2 scripts")),
        "{texts:?}"
    );
    // Her share is free again once they ended, and bob never shared it.
    let again = start(&url, ALICE, 1, 1, "return 'again';");
    assert!(text(&again[0]).contains("again"), "{again:?}");
    let bob = start(&url, BOB, 1, 1, "return 'bob ran';");
    assert!(text(&bob[0]).contains("bob ran"), "{bob:?}");
}
