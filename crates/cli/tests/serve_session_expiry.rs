//! Red team: an HTTP session that ended (idle past `--session-idle-timeout`) with a state store
//! configured (`state.url`) must stay ended, and must never become another token's session.
//!
//! Found: expiry deleted the session's row in the store (and with it the principal it was
//! fixed to) but kept its `initialize` parameters there, so its id was "known" again; the next
//! token to present it claimed it as a fresh session, became its principal, and could `wait`
//! on, read and terminate the first principal's cells (and be asked about their approvals).

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use serde_json::json;

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-9876543210";

/// A call that needs a person, so alice's cell pauses and outlives her session's idle limit.
const POLICY: &str = r#"
@id("needs-a-person")
@ask("a person must see this")
permit (principal, action == Action::"tool_call", resource == Tool::"bash")
when { context.args has command && context.args.command like "echo *" };
"#;

const SCRIPT: &str = r#"const secret = "alice-secret-7731";
await tools.bash({ command: "echo " + secret });
return "done";"#;

/// Alice opens a session and starts the cell; after `wait_ms` (past the idle limit) bob uses
/// her session id: a ping, then `wait` on her cell, then `wait` with `terminate`.
const PROBE: &str = r#"
const [url, alice, bob, code, waitMs] = process.argv.slice(1);
const h = (token, session) => Object.assign({ "content-type": "application/json",
  accept: "application/json, text/event-stream", authorization: "Bearer " + token },
  session ? { "mcp-session-id": session } : {});
const post = async (token, session, body) => {
  const r = await fetch(url, { method: "POST", headers: h(token, session), body: JSON.stringify(body) });
  const text = await r.text();
  const messages = (r.headers.get("content-type") || "").includes("event-stream")
    ? text.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).filter(Boolean).map((l) => JSON.parse(l))
    : (r.status < 300 && text) ? [JSON.parse(text)] : [];
  return { status: r.status, session: r.headers.get("mcp-session-id"),
    answer: messages.find((m) => m.id === body.id) || null, text: r.status < 300 ? "" : text };
};
const call = (id, name, args) => ({ jsonrpc: "2.0", id, method: "tools/call", params: { name, arguments: args } });
(async () => {
  const opened = await post(alice, null, { jsonrpc: "2.0", id: 1, method: "initialize",
    params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "alice", version: "1" } } });
  const s = opened.session;
  await fetch(url, { method: "POST", headers: h(alice, s),
    body: JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }) });
  const started = await post(alice, s, call(2, "codemode", { code }));
  const cell = started.answer?.result?.structuredContent?.cell;
  await new Promise((r) => setTimeout(r, Number(waitMs)));
  const bobPing = await post(bob, s, { jsonrpc: "2.0", id: 3, method: "ping" });
  const bobWait = await post(bob, s, call(4, "wait", { cell, timeout_ms: 0 }));
  const bobStop = await post(bob, s, call(5, "wait", { cell, terminate: true }));
  console.log(JSON.stringify({ session: s, cell, started: started.answer,
    bobPing: bobPing.status, bobWait, bobStop }));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn setup(root: &std::path::Path) -> Vec<PathBuf> {
    for d in ["config", "state", "project", "db"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::write(root.join("policy.cedar"), POLICY).unwrap();
    let settings = json!({
        "approvals": {"when_nobody_can_answer": "pause", "expire_after": "10m"},
        "audit": {"path": root.join("audit.jsonl")},
        "state": {"url": format!("sqlite://{}", root.join("db/state.db").display())},
    });
    std::fs::write(root.join("config/settings.json"), settings.to_string()).unwrap();
    let sha = |t: &str| {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(t.as_bytes()))
    };
    let tokens = json!({"tokens": [
        {"name": "alice", "token_sha256": sha(ALICE)},
        {"name": "bob", "token_sha256": sha(BOB)},
    ]});
    std::fs::write(root.join("tokens.json"), tokens.to_string()).unwrap();
    vec![
        root.join("config"),
        root.join("state"),
        root.join("project"),
    ]
}

/// `codemode serve` on a free loopback port over the SQLite state in `root`.
fn serve(root: &std::path::Path, dirs: &[PathBuf], idle: &str) -> (Server, String) {
    let (child, url) = common::start_serving(
        common::codemode()
            .args(["serve", "--listen", "127.0.0.1:0", "--mode", "only"])
            .args(["--session-idle-timeout", idle])
            .arg("--policy")
            .arg(root.join("policy.cedar"))
            .arg("--tokens-file")
            .arg(root.join("tokens.json"))
            .arg("--config-dir")
            .arg(&dirs[0])
            .arg("--state-dir")
            .arg(&dirs[1])
            .arg("--workdir")
            .arg(&dirs[2])
            .env_remove("CODEMODE_SERVE_TOKEN"),
    );
    (Server(child), url)
}

/// Alice opens a session on replica 1, uses it once on replica 2, then keeps using it on
/// replica 1 (every 500 ms for `busyMs`) and comes back to replica 2.
const MOVES: &str = r#"
const [one, two, alice, busyMs] = process.argv.slice(1);
const h = (session) => Object.assign({ "content-type": "application/json",
  accept: "application/json, text/event-stream", authorization: "Bearer " + alice },
  session ? { "mcp-session-id": session } : {});
const post = async (url, session, body) => {
  const r = await fetch(url, { method: "POST", headers: h(session), body: JSON.stringify(body) });
  await r.text();
  return { status: r.status, session: r.headers.get("mcp-session-id") };
};
const ping = (url, s) => post(url, s, { jsonrpc: "2.0", id: 9, method: "ping" }).then((r) => r.status);
(async () => {
  const { session: s } = await post(one, null, { jsonrpc: "2.0", id: 1, method: "initialize",
    params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "alice", version: "1" } } });
  await fetch(one, { method: "POST", headers: h(s),
    body: JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }) });
  const onTwo = await ping(two, s);
  const onOne = [];
  for (let t = 0; t < Number(busyMs); t += 500) {
    onOne.push(await ping(one, s));
    await new Promise((r) => setTimeout(r, 500));
  }
  console.log(JSON.stringify({ session: s, onTwo, onOne, backOnTwo: await ping(two, s) }));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

/// Red team: each replica sweeps the sessions idle in its own table. A session alice kept
/// using on replica 1 was idle on replica 2, whose sweep ended it everywhere: its row and
/// `store()` values deleted from the shared store, its id unknown from then on.
#[test]
fn a_session_in_use_on_one_replica_is_not_ended_by_anothers_idle_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let dirs = setup(root);
    let (_one, one) = serve(root, &dirs, "3s");
    let (_two, two) = serve(root, &dirs, "3s");
    let mut cmd = Command::new("node");
    cmd.args(["-e", MOVES, &one, &two, ALICE, "7000"]);
    let v = common::client_json(cmd);
    assert_eq!(v["onTwo"], 200, "the session moves to replica 2: {v}");
    assert!(
        v["onOne"]
            .as_array()
            .is_some_and(|a| a.iter().all(|s| s == 200)),
        "{v}"
    );
    assert_eq!(
        v["backOnTwo"], 200,
        "a session used 500 ms ago was ended by replica 2's sweep: {v}"
    );
}

#[test]
fn an_expired_session_id_does_not_become_another_tokens_session() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let dirs = setup(root);
    let (_server, url) = serve(root, &dirs, "2s");
    let mut cmd = Command::new("node");
    // Three times the idle limit: the sweep runs every few hundred milliseconds.
    cmd.args(["-e", PROBE, &url, ALICE, BOB, SCRIPT, "6000"]);
    let v = common::client_json(cmd);
    let started = v["started"]["result"]["structuredContent"]["status"].as_str();
    assert_eq!(
        started,
        Some("waiting_for_approval"),
        "alice's cell waits for a person: {v}"
    );
    // The session ended: its id is unknown (404) or, at the least, not bob's (403).
    let bob_ping = v["bobPing"].as_u64().unwrap_or(0);
    assert!(
        bob_ping == 404 || bob_ping == 403,
        "bob was let into alice's expired session: {v}"
    );
    for step in ["bobWait", "bobStop"] {
        let status = v[step]["status"].as_u64().unwrap_or(0);
        assert!(
            status == 404 || status == 403,
            "{step}: bob reached alice's cell through her expired session id: {v}"
        );
        assert!(
            !v[step].to_string().contains("alice-secret-7731"),
            "{step}: bob read alice's pending call: {v}"
        );
    }
}
