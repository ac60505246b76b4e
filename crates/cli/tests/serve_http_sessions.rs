//! The lives of `codemode serve --listen` sessions (issue 13, item 7), driven by the official
//! MCP SDK client: a session idle past `--session-idle-timeout` is forgotten with its `store()`
//! values; one that comes back before keeps them, even after its idle connection was closed and
//! from a new client process; `--max-sessions` ends the longest-idle session.
//!
//! The idle limit is shortened through its flag. Waits are generous on both sides of it, so a
//! loaded machine slows the test down but does not flip its outcome.

mod common;
use common::testbed;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::Value;

struct Server {
    child: Child,
    url: String,
    log: Arc<Mutex<Vec<String>>>,
    _config: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// `codemode serve` on a free loopback port, logging session events.
    fn start(extra: &[&str]) -> Server {
        let config = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_codemode"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--mode",
                "only",
                "--config-dir",
            ])
            .arg(config.path())
            .arg("--state-dir")
            .arg(config.path().join("state"))
            .args(extra)
            .env("CODEMODE_LOG", "codemode_mcp::server=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = common::serving_url(&mut lines);
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Server {
            child,
            url,
            log,
            _config: config,
        }
    }

    fn client(&self, scenario: &str, wait_ms: u64) -> Value {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/session-client.cjs"
        );
        let out = Command::new("node")
            .arg(script)
            .arg(testbed())
            .arg(&self.url)
            .arg(scenario)
            .arg(wait_ms.to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the client failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap()
    }

    /// Server log lines that mention `needle`.
    fn logged(&self, needle: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }
}

#[test]
fn a_session_idle_past_the_limit_is_forgotten_with_its_store() {
    let server = Server::start(&["--session-idle-timeout", "2s"]);
    // Three times the limit: the sweep runs every few hundred milliseconds.
    let v = server.client("away", 6000);
    assert_eq!(v["stored"], "a", "{v}");
    assert_eq!(
        v["sameClient"]["status"], 404,
        "the forgotten session's id is unknown: {v}"
    );
    assert_eq!(
        v["newProcess"]["status"], 404,
        "coming back with the id from a new process does not revive it: {v}"
    );
    assert_eq!(v["otherSession"]["value"], Value::Null, "{v}");
    let id = v["id"].as_str().unwrap();
    let expired = server.logged("MCP session expired");
    assert!(
        expired.iter().any(|l| l.contains(id)),
        "the sweep ended the session (and dropped its store): {expired:?}"
    );
}

#[test]
fn a_session_that_comes_back_before_the_limit_keeps_its_store_across_a_reconnect() {
    // A 20 s limit closes idle connections after 10 s; the client stays away 13 s.
    let server = Server::start(&["--session-idle-timeout", "20s"]);
    let v = server.client("away", 13_000);
    let id = v["id"].as_str().unwrap().to_string();
    assert_eq!(v["stored"], "a", "{v}");
    assert_eq!(
        v["sameClient"]["value"], "a",
        "the same client continues its session: {v}"
    );
    assert_eq!(
        v["newProcess"]["value"], "a",
        "a new client process with the session id continues it: {v}"
    );
    assert_eq!(
        v["otherSession"]["value"],
        Value::Null,
        "another session does not see it: {v}"
    );
    let closed = server.logged("closing an idle MCP connection");
    assert!(
        closed.iter().any(|l| l.contains(&id)),
        "the idle connection was closed and the session came back on a new one: {closed:?}"
    );
    assert!(
        server.logged("MCP session expired").is_empty(),
        "nothing expired"
    );
}

#[test]
fn max_sessions_ends_the_longest_idle_session() {
    let server = Server::start(&["--max-sessions", "2"]);
    let v = server.client("crowd", 0);
    assert_eq!(v["aUsed"]["value"], "a", "{v}");
    assert_eq!(v["cStored"], "c", "the third session starts: {v}");
    assert_eq!(
        v["a"]["value"], "a",
        "the session used most recently stays, with its store: {v}"
    );
    assert_eq!(
        v["b"]["status"], 404,
        "the longest-idle session was ended: {v}"
    );
    assert_eq!(
        v["bResumed"]["status"], 404,
        "and cannot be resumed by its id: {v}"
    );
    let b = v["ids"]["b"].as_str().unwrap();
    assert!(
        server
            .logged("too many MCP sessions")
            .iter()
            .any(|l| l.contains(b)),
        "the log names the ended session"
    );
}

const PRINCIPALS_PROBE: &str = r#"
const [url, alice, bob] = process.argv.slice(1);
const init = JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "probe", version: "1" } } });
const ping = JSON.stringify({ jsonrpc: "2.0", id: 2, method: "ping" });
const h = (token, session) => Object.assign({ "content-type": "application/json",
  accept: "application/json, text/event-stream", authorization: "Bearer " + token },
  session ? { "mcp-session-id": session } : {});
const open = async (token) => (await fetch(url, { method: "POST", headers: h(token), body: init })).headers.get("mcp-session-id");
const use = async (token, session) => (await fetch(url, { method: "POST", headers: h(token, session), body: ping })).status;
(async () => {
  const a = await open(alice);
  await new Promise((r) => setTimeout(r, 50));
  const bobs = [];
  for (let i = 0; i < 4; i++) { bobs.push(await open(bob)); await new Promise((r) => setTimeout(r, 20)); }
  console.log(JSON.stringify({ alice: await use(alice, a), bobLast: await use(bob, bobs[3]), bobFirst: await use(bob, bobs[0]) }));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

/// Red-team finding: with one token per person, bob opening `--max-sessions` sessions ended
/// alice's. A full table now ends a session of whoever holds the most.
#[test]
fn a_principal_opening_many_sessions_evicts_their_own_not_anothers() {
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    let (alice, bob) = ("alice-token-0123456789", "bob-token-9876543210");
    let sha = |t: &str| hex::encode(sha2::Sha256::digest(t.as_bytes()));
    let tokens = serde_json::json!({"tokens": [
        {"name": "alice", "token_sha256": sha(alice)},
        {"name": "bob", "token_sha256": sha(bob)},
    ]});
    let file = dir.path().join("tokens.json");
    std::fs::write(&file, tokens.to_string()).unwrap();
    let server = Server::start(&[
        "--max-sessions",
        "3",
        "--tokens-file",
        file.to_str().unwrap(),
    ]);
    let mut probe = Command::new("node");
    probe.args(["-e", PRINCIPALS_PROBE, &server.url, alice, bob]);
    let v = common::client_json(probe);
    assert_eq!(v["alice"], 200, "alice's session stays: {v}");
    assert_eq!(v["bobLast"], 200, "{v}");
    assert_eq!(
        v["bobFirst"], 404,
        "bob's own longest-idle session went: {v}"
    );
}
