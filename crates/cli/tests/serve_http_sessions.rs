//! The lives of `codemode serve --listen` sessions (issue 13, item 7), driven by the official
//! MCP SDK client: a session idle past `--session-idle-timeout` is forgotten with its `store()`
//! values; one that comes back before keeps them, even after its idle connection was closed and
//! from a new client process; `--max-sessions` ends the longest-idle session.
//!
//! The idle limit is shortened through its flag. Waits are generous on both sides of it, so a
//! loaded machine slows the test down but does not flip its outcome.

use crate::common;
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
        Server::start_in(tempfile::tempdir().unwrap(), extra)
    }

    /// As [`Server::start`], with `config` as the configuration directory.
    fn start_in(config: tempfile::TempDir, extra: &[&str]) -> Server {
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
            // Few heap arenas, and big blocks always mapped and unmapped: freed memory goes back
            // at once, so the memory tests here measure what the server keeps, not what it once
            // needed.
            .env("MALLOC_ARENA_MAX", "2")
            .env("MALLOC_MMAP_THRESHOLD_", "65536")
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

/// A tokens file naming alice and bob, and the unnamed `--token`; returns the server and the
/// three tokens.
fn with_three_tokens(extra: &[&str]) -> (Server, tempfile::TempDir) {
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    let sha = |t: &str| hex::encode(sha2::Sha256::digest(t.as_bytes()));
    let tokens = serde_json::json!({"tokens": [
        {"name": "alice", "token_sha256": sha(ALICE)},
        {"name": "bob", "token_sha256": sha(BOB)},
    ]});
    let file = dir.path().join("tokens.json");
    std::fs::write(&file, tokens.to_string()).unwrap();
    let mut args = vec!["--tokens-file", file.to_str().unwrap(), "--token", MASTER];
    args.extend_from_slice(extra);
    (Server::start(&args), dir)
}

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-9876543210";
const MASTER: &str = "unnamed-token-5555555555";

const FETCH_HELPERS: &str = r#"
const [url, alice, bob, master] = process.argv.slice(1);
const init = (caps) => JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: caps || {}, clientInfo: { name: "probe", version: "1" } } });
const ping = JSON.stringify({ jsonrpc: "2.0", id: 2, method: "ping" });
const h = (token, session) => Object.assign({ "content-type": "application/json",
  accept: "application/json, text/event-stream", authorization: "Bearer " + token },
  session ? { "mcp-session-id": session } : {});
const open = async (token, caps) => {
  const r = await fetch(url, { method: "POST", headers: h(token), body: init(caps) });
  return { status: r.status, id: r.headers.get("mcp-session-id"), text: r.status === 200 ? "" : await r.text() };
};
const use = async (token, session) => (await fetch(url, { method: "POST", headers: h(token, session), body: ping })).status;
const end = async (token, session) => (await fetch(url, { method: "DELETE", headers: h(token, session) })).status;
"#;

/// Red team: the unnamed `--token` could use a named person's session (read their `store()`
/// values, stop their cells, end it), and a named token could take over a session the unnamed
/// token began. Every token may use only the sessions it began.
#[test]
fn no_token_uses_a_session_another_token_began() {
    let (server, _dir) = with_three_tokens(&[]);
    let probe = format!(
        "{FETCH_HELPERS}
(async () => {{
  const a = (await open(alice)).id, m = (await open(master)).id;
  console.log(JSON.stringify({{
    masterOnAlices: await use(master, a), aliceOnMasters: await use(alice, m),
    bobOnMasters: await use(bob, m), masterEndsAlices: await end(master, a),
    aliceStill: await use(alice, a), masterStill: await use(master, m),
  }}));
}})().catch((e) => {{ console.error(e); process.exit(1); }});"
    );
    let mut cmd = Command::new("node");
    cmd.args(["-e", &probe, &server.url, ALICE, BOB, MASTER]);
    let v = common::client_json(cmd);
    for refused in [
        "masterOnAlices",
        "aliceOnMasters",
        "bobOnMasters",
        "masterEndsAlices",
    ] {
        assert_eq!(v[refused], 403, "{refused}: {v}");
    }
    assert_eq!(v["aliceStill"], 200, "{v}");
    assert_eq!(v["masterStill"], 200, "{v}");
}

/// Red team: each request with a made-up session id left an entry behind (a token holder grew
/// the server by 15 MB a second). An unknown id is now refused before anything is kept.
#[test]
fn made_up_session_ids_leave_nothing_behind() {
    let (server, _dir) = with_three_tokens(&[]);
    let rss = || rss_kb(server.child.id());
    let probe = format!(
        "{FETCH_HELPERS}
(async () => {{
  const statuses = new Set();
  for (let round = 0; round < 40; round++) {{
    const batch = [];
    for (let i = 0; i < 50; i++) batch.push(use(alice, 'x'.repeat(16000) + Math.random()));
    for (const s of await Promise.all(batch)) statuses.add(s);
  }}
  console.log(JSON.stringify({{ statuses: [...statuses] }}));
}})().catch((e) => {{ console.error(e); process.exit(1); }});"
    );
    let warm = {
        let mut cmd = Command::new("node");
        cmd.args(["-e", &probe, &server.url, ALICE, BOB, MASTER]);
        common::client_json(cmd)
    };
    assert_eq!(warm["statuses"], serde_json::json!([404]), "{warm}");
    let before = rss();
    let mut cmd = Command::new("node");
    cmd.args(["-e", &probe, &server.url, ALICE, BOB, MASTER]);
    let v = common::client_json(cmd);
    assert_eq!(v["statuses"], serde_json::json!([404]), "{v}");
    let grown_kb = rss().saturating_sub(before);
    // 2,000 ids of 16 KB: about 32 MB if each were kept.
    assert!(grown_kb < 12_000, "the server grew by {grown_kb} KB");
}

/// Red team: with `--max-sessions 4`, alice held her sessions busy (a call waiting for an
/// approval nobody gives) and opened more; bob's idle session was ended and his new one
/// refused. One token now holds at most half of the table.
#[test]
fn sessions_held_busy_by_one_token_do_not_lock_another_out() {
    let (server, _dir) = with_three_tokens(&["--max-sessions", "4"]);
    let probe = format!(
        "{FETCH_HELPERS}
const call = JSON.stringify({{ jsonrpc: '2.0', id: 3, method: 'tools/call', params: {{ name: 'codemode',
  arguments: {{ code: 'await tools.bash({{ command: \"true\" }}); return 1' }} }} }});
const hold = async (token) => {{
  const s = await open(token, {{ elicitation: {{}} }});
  await fetch(url, {{ method: 'POST', headers: h(token, s.id), body: JSON.stringify({{ jsonrpc: '2.0', method: 'notifications/initialized' }}) }});
  // Asks for approval over the open response stream, which this client never answers.
  fetch(url, {{ method: 'POST', headers: h(token, s.id), body: call }}).catch(() => {{}});
  return s.id;
}};
(async () => {{
  const b = (await open(bob)).id;
  await hold(alice); await hold(alice);
  await new Promise((r) => setTimeout(r, 1500));
  const third = await open(alice);
  const bobNew = await open(bob);
  console.log(JSON.stringify({{ aliceThird: third.status, aliceText: third.text,
    bobIdle: await use(bob, b), bobNew: bobNew.status }}));
  process.exit(0);
}})().catch((e) => {{ console.error(e); process.exit(1); }});"
    );
    let mut cmd = Command::new("node");
    cmd.args(["-e", &probe, &server.url, ALICE, BOB, MASTER]);
    let v = common::client_json(cmd);
    assert_eq!(v["aliceThird"], 503, "{v}");
    assert!(
        v["aliceText"]
            .as_str()
            .unwrap_or_default()
            .contains("holds 2 of the 4"),
        "{v}"
    );
    assert_eq!(v["bobIdle"], 200, "bob's idle session stays: {v}");
    assert_eq!(v["bobNew"], 200, "{v}");
}

/// A raw HTTP/1.1 GET with the Host header given, as a page in a browser would send it after
/// its name was pointed at 127.0.0.1 (DNS rebinding); returns the status code.
fn get_with_host(url: &str, path: &str, host: &str) -> u16 {
    use std::io::{Read, Write};
    let addr = common::socket_address(url);
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

/// Red team: rmcp checks Host and Origin on `/mcp` only, so a web page could read `/metrics`
/// (tool names, counts) and `/readyz` (upstream names) of a loopback server by DNS rebinding.
#[test]
fn a_loopback_servers_pages_answer_only_requests_addressed_to_loopback() {
    let config = tempfile::tempdir().unwrap();
    std::fs::write(
        config.path().join("settings.json"),
        r#"{"telemetry": {"metrics": true}}"#,
    )
    .unwrap();
    let server = Server::start_in(config, &[]);
    let port = server
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    for path in ["/metrics", "/readyz"] {
        assert_eq!(
            get_with_host(&server.url, path, &format!("attacker.example:{port}")),
            403,
            "{path}"
        );
        assert_eq!(
            get_with_host(&server.url, path, &format!("127.0.0.1:{port}")),
            200,
            "{path}"
        );
        assert_eq!(
            get_with_host(&server.url, path, &format!("localhost:{port}")),
            200
        );
    }
    assert_eq!(
        get_with_host(&server.url, "/healthz", "attacker.example"),
        200,
        "/healthz says only that the process answers"
    );
}

/// Red team: connections that never finish their headers (or their body) stayed open with no
/// token checked; enough of them took every descriptor and locked out clients with a token.
#[test]
fn a_client_that_never_finishes_its_headers_is_cut_off() {
    use std::io::{Read, Write};
    let server = Server::start(&[]);
    let addr = common::socket_address(&server.url);
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    slow.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .unwrap();
    slow.set_read_timeout(Some(std::time::Duration::from_secs(40)))
        .unwrap();
    let started = std::time::Instant::now();
    let mut rest = Vec::new();
    // The server closes the connection (an error answer or a bare close) once its header
    // timeout passes; before the fix this read waited out its own 40 s.
    let _ = slow.read_to_end(&mut rest);
    let waited = started.elapsed();
    assert!(
        waited < std::time::Duration::from_secs(30),
        "the half-sent request was held for {waited:?}"
    );
}

/// Runs `return 1` as the `codemode` tool twice in a session of each token (alice's, bob's, the
/// unnamed one's) and prints what each answer said.
const CALLS_PER_TOKEN: &str = r#"
const [url, alice, bob, master] = process.argv.slice(1);
const h = (token, session) => Object.assign({ "content-type": "application/json",
  accept: "application/json, text/event-stream", authorization: "Bearer " + token },
  session ? { "mcp-session-id": session } : {});
// An answer is a JSON body or an SSE stream; the message with `id` is the answer.
const post = async (token, session, body) => {
  const r = await fetch(url, { method: "POST", headers: h(token, session), body: JSON.stringify(body) });
  const text = await r.text();
  if (r.status >= 300) throw new Error(r.status + " " + text);
  const messages = (r.headers.get("content-type") || "").includes("event-stream")
    ? text.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).filter(Boolean).map((l) => JSON.parse(l))
    : text ? [JSON.parse(text)] : [];
  return { session: r.headers.get("mcp-session-id"), answer: messages.find((m) => m.id === body.id) };
};
const session = async (token) => {
  const { session } = await post(token, null, { jsonrpc: "2.0", id: 1, method: "initialize",
    params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "probe", version: "1" } } });
  await fetch(url, { method: "POST", headers: h(token, session),
    body: JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }) });
  return session;
};
const run = async (token, s, id) => JSON.stringify((await post(token, s, { jsonrpc: "2.0", id,
  method: "tools/call", params: { name: "codemode", arguments: { code: "return 1" } } })).answer);
(async () => {
  const out = {};
  for (const [who, token] of [["alice", alice], ["bob", bob], ["master", master]]) {
    const s = await session(token);
    out[who] = { session: s, first: await run(token, s, 2), second: await run(token, s, 3) };
  }
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

/// `--principal` with `--tokens-file`: a session begun with a named token acts for that
/// token's name (its budget, its audit lines), and only the unnamed `--token`'s sessions act for
/// `--principal`. Each principal may make one call a day: each gets its own first call, so no
/// two share a ledger.
#[test]
fn a_named_tokens_session_is_its_own_principal_and_the_unnamed_tokens_is_principal_flags() {
    let config = tempfile::tempdir().unwrap();
    let audit = config.path().join("audit.jsonl");
    let settings = serde_json::json!({
        "audit": {"path": audit},
        "budgets": {"principal": {"max_calls": 1}},
    });
    std::fs::write(config.path().join("settings.json"), settings.to_string()).unwrap();
    let tokens = tempfile::tempdir().unwrap();
    let file = tokens.path().join("tokens.json");
    let sha = |t: &str| {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(t.as_bytes()))
    };
    let listed = serde_json::json!({"tokens": [
        {"name": "alice", "team": "infra", "token_sha256": sha(ALICE)},
        {"name": "bob", "token_sha256": sha(BOB)},
    ]});
    std::fs::write(&file, listed.to_string()).unwrap();
    let server = Server::start_in(
        config,
        &[
            "--no-builtins",
            "--tokens-file",
            file.to_str().unwrap(),
            "--token",
            MASTER,
            "--principal",
            "ci-bot",
        ],
    );
    let mut probe = Command::new("node");
    probe.args(["-e", CALLS_PER_TOKEN, &server.url, ALICE, BOB, MASTER]);
    let v = common::client_json(probe);
    for (who, principal) in [("alice", "alice"), ("bob", "bob"), ("master", "ci-bot")] {
        let first = v[who]["first"].as_str().unwrap();
        assert!(
            first.contains("completed"),
            "{who}'s first call runs: {first}"
        );
        let second = v[who]["second"].as_str().unwrap();
        let refusal = format!("principal budget `max_calls` of `{principal}`");
        assert!(second.contains(&refusal), "{who}: {second}");
    }

    // Each audit line names the principal of the session that made the call.
    let text = std::fs::read_to_string(&audit).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for (who, principal) in [("alice", "alice"), ("bob", "bob"), ("master", "ci-bot")] {
        let session = v[who]["session"].as_str().unwrap();
        let theirs: Vec<&Value> = lines
            .iter()
            .filter(|l| l["provenance"]["session_id"] == session)
            .collect();
        assert_eq!(theirs.len(), 2, "{who}'s two calls: {text}");
        for line in theirs {
            assert_eq!(line["principal"], principal, "{line}");
        }
    }
}

/// `--principal` that no session could act for, and a tokens file without an HTTP server, are
/// errors that say what to do, not flags silently ignored.
#[test]
fn principal_flags_that_would_apply_to_no_session_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.json");
    let listed = serde_json::json!({"tokens": [
        {"name": "alice", "token_sha256": "0".repeat(64)},
    ]});
    std::fs::write(&file, listed.to_string()).unwrap();
    let serve = |extra: &[&str]| {
        let mut cmd = common::codemode();
        cmd.args(["serve", "--no-builtins", "--config-dir"])
            .arg(dir.path())
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .args(["--tokens-file", file.to_str().unwrap()])
            .args(extra)
            .env_remove("CODEMODE_SERVE_TOKEN");
        let (code, _, stderr) = common::json_outcome(common::pipe(cmd, None));
        (code, stderr)
    };
    let (code, stderr) = serve(&["--listen", "127.0.0.1:0", "--principal", "ci-bot"]);
    assert_ne!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("--principal ci-bot would apply to no session")
            && stderr.contains("add --token"),
        "{stderr}"
    );
    let (code, stderr) = serve(&[]);
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("add --listen"), "{stderr}");
}

/// Red team: a `store()` value of `[0,0,…]` is 2 characters of JSON per element but 32 bytes
/// decoded, and `serve` kept a decoded copy of every session's values (1 MiB of text took it
/// from 60 to 146 MB). Values are now kept as text, and not in memory at all when the state
/// store holds them: more sessions at the full 1 MiB each cost no more than sessions without.
#[test]
fn store_values_of_small_elements_do_not_grow_the_server() {
    let (server, _dir) = with_three_tokens(&[]);
    let rss = || rss_kb(server.child.id());
    let probe = |sessions: usize| {
        format!(
            "{FETCH_HELPERS}
const call = (token, id, code) => fetch(url, {{ method: 'POST', headers: h(token, id),
  body: JSON.stringify({{ jsonrpc: '2.0', id: 3, method: 'tools/call', params: {{ name: 'codemode', arguments: {{ code }} }} }}) }})
  .then((r) => r.text());
(async () => {{
  const stored = [], loaded = [];
  for (let i = 0; i < {sessions}; i++) {{
    const s = await open(alice);
    await fetch(url, {{ method: 'POST', headers: h(alice, s.id), body: JSON.stringify({{ jsonrpc: '2.0', method: 'notifications/initialized' }}) }});
    stored.push((await call(alice, s.id,
      \"for (let k = 0; k < 4; k++) store('k' + k, new Array(130000).fill(0)); return 'stored-' + 4\")).includes('stored-4'));
    loaded.push((await call(alice, s.id, \"return 'len-' + load('k3').length\")).includes('len-130000'));
  }}
  console.log(JSON.stringify({{ stored, loaded }}));
}})().catch((e) => {{ console.error(e); process.exit(1); }});"
        )
    };
    let run = |sessions: usize| {
        let mut cmd = Command::new("node");
        cmd.args(["-e", &probe(sessions), &server.url, ALICE, BOB, MASTER]);
        common::client_json(cmd)
    };
    // A few sessions first, so the baseline holds what every session costs anyway.
    let warm = run(4);
    assert_eq!(warm["stored"], serde_json::json!(vec![true; 4]), "{warm}");
    let before = rss();
    let v = run(16);
    assert_eq!(v["stored"], serde_json::json!(vec![true; 16]), "{v}");
    assert_eq!(v["loaded"], serde_json::json!(vec![true; 16]), "{v}");
    let grown_kb = rss().saturating_sub(before);
    // Decoded, 16 sessions' 8 million zeros are 270 MB at the least; kept as text in memory,
    // 16 MB; in the state store, nothing (16 sessions without store() values grow it ~2 MB).
    assert!(
        grown_kb < 12_000,
        "16 more sessions of 1 MiB store() values grew the server by {grown_kb} KB"
    );
}

/// A process's resident memory in KB, from `/proc/<pid>/status` (0 once it is gone).
fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0)
}

/// The body of `GET /readyz`, with its status code.
fn readyz(url: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let addr = common::socket_address(url);
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        stream,
        "GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// Red team: once an audit line could not be written, the gate refuses every call until the
/// process restarts, yet `/readyz` kept answering 200, so a load balancer went on sending
/// clients to a replica that could do nothing. Here another process holds the audit log's
/// lock while a call is made.
#[test]
fn readyz_says_not_ready_once_the_audit_log_failed() {
    let config = tempfile::tempdir().unwrap();
    let log = config.path().join("audit.jsonl");
    std::fs::write(
        config.path().join("settings.json"),
        serde_json::json!({"audit": {"path": log}}).to_string(),
    )
    .unwrap();
    let server = Server::start_in(config, &[]);
    let (code, body) = readyz(&server.url);
    assert_eq!(code, 200, "{body}");
    let first = server.client("once", 0);
    assert_eq!(first["isError"], false, "{first}");
    let holder = std::fs::File::open(&log).unwrap();
    rustix::fs::flock(&holder, rustix::fs::FlockOperation::LockExclusive).unwrap();
    // The call waits for the lock a bounded time, then fails its audit line (a cell may
    // report it still running meanwhile).
    let _ = server.client("once", 0);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let (code, body) = loop {
        let (code, body) = readyz(&server.url);
        if code != 200 || std::time::Instant::now() > until {
            break (code, body);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    drop(holder);
    assert_eq!(code, 503, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["ready"], false, "{body}");
    assert!(
        v["audit"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("audit log") && e.contains("restarted")),
        "{body}"
    );
    // The gate stays closed with the lock gone: still not ready, calls still refused.
    let after = server.client("once", 0);
    assert_eq!(after["isError"], true, "{after}");
    assert_eq!(readyz(&server.url).0, 503);
}
