//! Red team: a session ended on one `codemode serve` replica must end its cells on every
//! replica sharing the state store, not only on the one that answered.
//!
//! Two real replicas, A and B, on one state store (a SQLite file; PostgreSQL too when the test
//! server is there). A client opens its session on A and starts two cells through B: one that
//! loops calling `bash`, one paused on a call that needs a person. Then the session ends on A:
//! by `DELETE`, or by A's idle sweep (B's idle limit is an hour, so only A expires it).
//!
//! Found: A stopped only the cells it ran itself (none). B's loop went on calling `bash` and
//! spending the session's budget after its session had ended, and the paused call stayed
//! pending, approvable by anyone holding `codemode approvals`.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use codemode_state::{ApprovalQuery, ApprovalState, CellRecord, CellStatus, StateStore};
use serde_json::{Value, json};

const POLICY: &str = r#"
@id("ticks")
permit (principal, action == Action::"tool_call", resource == Tool::"bash")
when { context.args has command && context.args.command like "echo tick-*" };
@id("needs-a-person")
@ask("a person must see this")
permit (principal, action == Action::"tool_call", resource == Tool::"bash")
when { context.args has command && context.args.command like "echo asked*" };
"#;

/// Calls `bash` about five times a second for far longer than the test runs.
const LOOP: &str = r#"// @options: {"yield_after_ms": 300}
for (let i = 0; i < 100000; i++) {
  await tools.bash({ command: "echo tick-" + i + " >> ticks.txt; sleep 0.2" });
}
return "the loop ran to its end";"#;

/// Waits for a person before its one call.
const PAUSED: &str = r#"// @options: {"yield_after_ms": 300}
await tools.bash({ command: "echo asked >> asked.txt" });
return "the asked call ran";"#;

/// Opens a session on `one`, starts both cells through `two`; prints the session and cells.
const START: &str = r#"
const [one, two, loopCode, pausedCode] = process.argv.slice(1);
const h = (session) => Object.assign({ "content-type": "application/json",
  accept: "application/json, text/event-stream" },
  session ? { "mcp-session-id": session, "mcp-protocol-version": "2025-06-18" } : {});
const post = async (url, session, body) => {
  const r = await fetch(url, { method: "POST", headers: h(session), body: JSON.stringify(body) });
  const text = await r.text();
  if (r.status >= 300) throw new Error(url + ": " + r.status + " " + text);
  const messages = (r.headers.get("content-type") || "").includes("event-stream")
    ? text.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).filter(Boolean).map((l) => JSON.parse(l))
    : text ? [JSON.parse(text)] : [];
  return { session: r.headers.get("mcp-session-id"), answer: messages.find((m) => m.id === body.id) };
};
const call = (id, code) => ({ jsonrpc: "2.0", id, method: "tools/call",
  params: { name: "codemode", arguments: { code } } });
(async () => {
  const { session } = await post(one, null, { jsonrpc: "2.0", id: 1, method: "initialize",
    params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "probe", version: "1" } } });
  await fetch(one, { method: "POST", headers: h(session),
    body: JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }) });
  const looping = (await post(two, session, call(2, loopCode))).answer;
  const paused = (await post(two, session, call(3, pausedCode))).answer;
  console.log(JSON.stringify({ session, looping, paused }));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

struct Env {
    _dir: tempfile::TempDir,
    root: PathBuf,
    state_url: String,
}

impl Env {
    /// `state`: the state URL, or `None` for a SQLite file in the test's directory.
    fn new(state: Option<String>) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        for d in ["config", "state", "project", "db"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("policy.cedar"), POLICY).unwrap();
        let state_url =
            state.unwrap_or_else(|| format!("sqlite://{}", root.join("db/state.db").display()));
        let settings = json!({
            "approvals": {"when_nobody_can_answer": "pause", "expire_after": "10m"},
            "audit": {"path": root.join("audit.jsonl")},
            "state": {"url": state_url},
            // The loop must outlive the test by far on its own.
            "limits": {"timeout_ms": 600_000},
        });
        std::fs::write(root.join("config/settings.json"), settings.to_string()).unwrap();
        Env {
            _dir: dir,
            root,
            state_url,
        }
    }

    /// A replica with its own idle limit; killed when dropped.
    fn serve(&self, idle: &str) -> Replica {
        self.serve_with(idle, &[])
    }

    fn serve_with(&self, idle: &str, extra: &[&str]) -> Replica {
        let (child, url) = common::start_serving(
            common::codemode()
                .args(["serve", "--listen", "127.0.0.1:0", "--mode", "only"])
                .args(["--session-idle-timeout", idle])
                .args(extra)
                .arg("--policy")
                .arg(self.root.join("policy.cedar"))
                .arg("--config-dir")
                .arg(self.root.join("config"))
                .arg("--state-dir")
                .arg(self.root.join("state"))
                .arg("--workdir")
                .arg(self.root.join("project"))
                .env_remove("CODEMODE_SERVE_TOKEN")
                .env_remove("CODEMODE_CELL_LEASE_MS"),
        );
        Replica { child, url }
    }

    fn ticks(&self) -> Vec<String> {
        std::fs::read_to_string(self.root.join("project/ticks.txt"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.root.join("audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

struct Replica {
    child: Child,
    url: String,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the client started: the session and the two cells.
struct Started {
    session: String,
    looping: String,
    paused: String,
    approval: String,
}

fn start_cells(env: &Env, a: &Replica, b: &Replica) -> Started {
    let mut cmd = Command::new("node");
    cmd.current_dir(&env.root)
        .args(["-e", START, &a.url, &b.url, LOOP, PAUSED]);
    let v = common::client_json(cmd);
    let looping = &v["looping"]["result"]["structuredContent"];
    assert_eq!(looping["status"], "running", "the loop runs on: {v}");
    let paused = &v["paused"]["result"]["structuredContent"];
    assert_eq!(paused["status"], "waiting_for_approval", "{v}");
    Started {
        session: v["session"].as_str().unwrap().to_string(),
        looping: looping["cell"].as_str().unwrap().to_string(),
        paused: paused["cell"].as_str().unwrap().to_string(),
        approval: paused["pending"][0]["approval_id"]
            .as_str()
            .unwrap()
            .to_string(),
    }
}

/// `DELETE` of the session, on raw HTTP/1.1: the status.
fn delete_session(url: &str, session: &str) -> u16 {
    let addr = common::socket_address(url);
    let mut s = TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "DELETE /mcp HTTP/1.1\r\nHost: {addr}\r\nmcp-session-id: {session}\r\nmcp-protocol-version: 2025-06-18\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0)
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn cell(rt: &tokio::runtime::Runtime, store: &dyn StateStore, id: &str) -> CellRecord {
    rt.block_on(store.get_cell(id))
        .unwrap()
        .unwrap_or_else(|| panic!("cell {id} is in the store"))
}

/// How the session is ended on A.
enum Ending {
    Delete,
    IdleOnA,
}

fn a_session_ended_on_one_replica_ends_its_cells_on_the_other(env: Env, ending: Ending) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt
        .block_on(codemode_state::open(&env.state_url, Default::default()))
        .unwrap();
    let a = env.serve(match ending {
        Ending::Delete => "1h",
        Ending::IdleOnA => "3s",
    });
    let b = env.serve("1h");
    let started = start_cells(&env, &a, &b);

    // Both cells run on B, and the loop is calling.
    let b_pid = format!("-{}-", b.child.id());
    for id in [&started.looping, &started.paused] {
        let c = cell(&rt, store.as_ref(), id);
        assert!(
            c.owner.as_deref().is_some_and(|o| o.contains(&b_pid)),
            "cell {id} is held by B: {c:?}"
        );
    }
    wait_until("the loop on B calls bash", Duration::from_secs(20), || {
        env.ticks().len() >= 3
    });

    let ended_at = match ending {
        Ending::Delete => {
            assert_eq!(delete_session(&a.url, &started.session), 204);
            Instant::now()
        }
        Ending::IdleOnA => {
            // A's sweep ends the session once it has been idle for 3 s everywhere (B's last
            // use is in the session's row); the row is gone then.
            wait_until("A ends the idle session", Duration::from_secs(30), || {
                rt.block_on(store.get_session(&started.session))
                    .is_ok_and(|row| row.is_none())
            });
            Instant::now()
        }
    };
    let ticks_at_end = env.ticks().len();

    // Both cells end, in the store, within a generous bound: nobody can reach them any more.
    let mut last;
    let stopped = loop {
        last = [&started.looping, &started.paused]
            .iter()
            .map(|id| cell(&rt, store.as_ref(), id))
            .collect::<Vec<_>>();
        if last.iter().all(|c| c.status.is_terminal()) {
            break true;
        }
        if ended_at.elapsed() > Duration::from_secs(20) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        stopped,
        "20 s after its session ended on A, a cell still runs on B: {last:?}; ticks went from {ticks_at_end} to {}",
        env.ticks().len()
    );
    for c in &last {
        assert_eq!(c.status, CellStatus::Terminated, "{c:?}");
        let text = c.result.as_ref().and_then(|r| r["text"].as_str());
        assert!(
            text.is_some_and(|t| t.contains("session") && t.contains("ended")),
            "the cell's end says its session ended: {c:?}"
        );
    }

    // B's scripts ended (each cell's `codemode` call has its outcome line), and from then on
    // nothing calls: at most the one call in flight when the session ended ticked after it.
    for c in &last {
        let call_id = c.options["call_id"].as_str().unwrap().to_string();
        wait_until(
            &format!("the script call of cell {} has its outcome line", c.id),
            Duration::from_secs(20),
            || {
                env.audit().iter().any(|l| {
                    l["tool"] == "codemode"
                        && l["provenance"]["call_id"] == call_id.as_str()
                        && l["provenance"]["session_id"] == started.session.as_str()
                        && l["status"] == "error"
                })
            },
        );
    }
    let ticks_after = env.ticks().len();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        env.ticks().len(),
        ticks_after,
        "the loop still calls after its script ended"
    );
    assert!(
        ticks_after <= ticks_at_end + 1,
        "the loop ran {} calls after its session ended",
        ticks_after - ticks_at_end
    );

    // The paused call never ran, and its approval can no longer be given.
    assert!(!env.root.join("project/asked.txt").exists());
    let approval = rt
        .block_on(store.get_approval(&started.approval))
        .unwrap()
        .unwrap();
    assert_eq!(approval.state, ApprovalState::Denied, "{approval:?}");
    let still_pending = rt
        .block_on(store.list_approvals(ApprovalQuery {
            state: Some(ApprovalState::Pending),
            cell_id: None,
            session_id: Some(started.session.clone()),
        }))
        .unwrap();
    assert!(still_pending.is_empty(), "{still_pending:?}");

    // The audit log says why each cell stopped, naming its session.
    let audit = env.audit();
    for id in [&started.looping, &started.paused] {
        assert!(
            audit.iter().any(|l| l["event"] == "cell_stopped"
                && l["cell_id"] == id.as_str()
                && l["session_id"] == started.session.as_str()
                && l["reason"] == "session_ended"),
            "no audit line says cell {id} stopped because its session ended: {audit:?}"
        );
    }
    drop(a);
    drop(b);
}

#[test]
fn a_session_deleted_through_one_replica_ends_its_cells_on_the_other() {
    a_session_ended_on_one_replica_ends_its_cells_on_the_other(Env::new(None), Ending::Delete);
}

#[test]
fn a_session_expired_on_one_replica_ends_its_cells_on_the_other() {
    a_session_ended_on_one_replica_ends_its_cells_on_the_other(Env::new(None), Ending::IdleOnA);
}

#[test]
fn on_postgres_a_session_deleted_through_one_replica_ends_its_cells_on_the_other() {
    let Some(pg) = common::postgres_url_or_skip(
        "session end across replicas on PostgreSQL",
        "serve_replicas_session_end",
    ) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url = common::fresh_database(&rt, &pg, "session_end");
    drop(rt);
    a_session_ended_on_one_replica_ends_its_cells_on_the_other(Env::new(Some(url)), Ending::Delete);
}

/// A POST of `body` in `session` (or none), on raw HTTP/1.1: the status, the session id the
/// answer names, and the body.
fn post(url: &str, session: Option<&str>, body: &Value) -> (u16, Option<String>, String) {
    let addr = common::socket_address(url);
    let mut s = TcpStream::connect(&addr).unwrap();
    let body = body.to_string();
    let session = session
        .map(|id| format!("mcp-session-id: {id}\r\nmcp-protocol-version: 2025-06-18\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\n{session}content-length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let id = out.lines().take_while(|l| !l.is_empty()).find_map(|l| {
        l.split_once(':')
            .filter(|(k, _)| k.eq_ignore_ascii_case("mcp-session-id"))
            .map(|(_, v)| v.trim().to_string())
    });
    (status, id, out)
}

/// Red-team finding: after its client ended a session through replica A, replica B, which had
/// served it, went on answering it from its own table (and ran scripts in it).
#[test]
fn a_session_deleted_through_one_replica_is_refused_by_the_other() {
    let env = Env::new(None);
    let a = env.serve("1h");
    let b = env.serve("1h");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "probe", "version": "1"}}});
    let (status, session, text) = post(&a.url, None, &init);
    assert_eq!(status, 200, "{text}");
    let session = session.expect("the answer names the session");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(post(&a.url, Some(&session), &initialized).0, 202);
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (status, _, text) = post(&b.url, Some(&session), &list);
    assert_eq!(status, 200, "B serves the session begun on A: {text}");

    assert_eq!(delete_session(&a.url, &session), 204);
    let ended_at = Instant::now();
    let run = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "codemode",
        "arguments": {"code": "await tools.bash({ command: 'echo ran >> after-delete.txt' }); return 1"}}});
    // B may trust its own table for a moment (it asks the store once a second per session).
    let mut last = (0, None, String::new());
    while ended_at.elapsed() < Duration::from_secs(10) {
        last = post(&b.url, Some(&session), &list);
        if last.0 == 404 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        last.0, 404,
        "B still answers the deleted session: {}",
        last.2
    );
    let (status, _, text) = post(&b.url, Some(&session), &run);
    assert_eq!(
        status, 404,
        "B runs a script in the deleted session: {text}"
    );
    assert_eq!(post(&a.url, Some(&session), &list).0, 404);
    assert!(!env.root.join("project/after-delete.txt").exists());
}

/// Opens a session on `url`: its id.
fn open_session(url: &str) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "probe", "version": "1"}}});
    let (status, session, text) = post(url, None, &init);
    assert_eq!(status, 200, "{text}");
    let session = session.expect("the answer names the session");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(post(url, Some(&session), &initialized).0, 202);
    session
}

/// Red-team finding: a full session table (`--max-sessions`) ended the longest-idle session
/// without its cells, which ran on unreachable: a client could open sessions to push out its
/// own and run more cells than one session may.
#[test]
fn a_session_pushed_out_of_a_full_table_leaves_no_cell_running_unreachable() {
    let env = Env::new(None);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt
        .block_on(codemode_state::open(&env.state_url, Default::default()))
        .unwrap();
    let a = env.serve_with("1h", &["--max-sessions", "2"]);
    let first = open_session(&a.url);
    let run = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "codemode", "arguments": {"code": LOOP}}});
    let (status, _, text) = post(&a.url, Some(&first), &run);
    assert_eq!(status, 200, "{text}");
    let at = text.find("\"cell\":\"").expect("the loop yielded a cell") + 8;
    let cell_id: String = text[at..].chars().take_while(|c| *c != '"').collect();
    wait_until("the loop calls bash", Duration::from_secs(20), || {
        env.ticks().len() >= 2
    });
    // Two more sessions: the table holds two, so one session must go.
    let _second = open_session(&a.url);
    let _third = open_session(&a.url);
    let ping = json!({"jsonrpc": "2.0", "id": 3, "method": "ping"});
    let (status, _, _) = post(&a.url, Some(&first), &ping);
    if status == 200 {
        // Kept: its cell is still reachable (wait, terminate).
        assert_eq!(
            cell(&rt, store.as_ref(), &cell_id).status,
            CellStatus::Running
        );
        return;
    }
    assert_eq!(status, 404);
    let ended_at = Instant::now();
    let mut last = cell(&rt, store.as_ref(), &cell_id);
    while !last.status.is_terminal() && ended_at.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(200));
        last = cell(&rt, store.as_ref(), &cell_id);
    }
    assert!(
        last.status.is_terminal(),
        "20 s after its session was pushed out, its cell still runs, unreachable: {last:?}; {} ticks",
        env.ticks().len()
    );
}
