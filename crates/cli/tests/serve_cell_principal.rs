//! A cell taken over after a restart acts for the principal its session acted for, not for
//! nobody: its calls are charged to that principal's daily budget (and refused over it, naming
//! them) and its audit lines name them, though its client never came back to say who it is.
//!
//! The real `codemode serve --listen` with a tokens file and SQLite state (and, in a second
//! test, PostgreSQL): alice's session starts a cell that pauses for approval; the server is
//! killed; the approval is answered from the CLI; a new server takes the cell over and its
//! calls meet alice's `max_calls`.

use crate::common;
use common::Server;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const ALICE: &str = "alice-token-0123456789";

const POLICY: &str = r#"
@id("first-step")
permit (principal, action == Action::"tool_call", resource == Tool::"bash")
when { context.args has command && context.args.command like "echo first*" };
@id("second-step-needs-a-person")
@ask("the second step appends to the project")
permit (principal, action == Action::"tool_call", resource == Tool::"bash")
when { context.args has command && context.args.command like "echo second*" };
@id("more")
permit (principal, action == Action::"tool_call", resource == Tool::"bash")
when { context.args has command && context.args.command like "echo more*" };
"#;

/// Two allowed steps, one that waits for a person, then five more calls: alice's budget of
/// four calls a day (the `codemode` call, `first`, `second`, and one more for `second` asked
/// again after the restart: the dead server's holds last 15 minutes) leaves none of the five.
const SCRIPT: &str = r#"await tools.bash({ command: "echo first >> count.txt" });
await tools.bash({ command: "echo second >> count.txt" });
for (let i = 0; i < 5; i++) await tools.bash({ command: "echo more >> count.txt" });
return "all ran";"#;

/// Opens a session with alice's token and starts the script as a cell; prints the session id
/// and the answer.
const START: &str = r#"
const [url, token, code] = process.argv.slice(1);
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
(async () => {
  const { session } = await post(null, { jsonrpc: "2.0", id: 1, method: "initialize",
    params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "probe", version: "1" } } });
  await fetch(url, { method: "POST", headers: h(session),
    body: JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }) });
  const { answer } = await post(session, { jsonrpc: "2.0", id: 2, method: "tools/call",
    params: { name: "codemode", arguments: { code } } });
  console.log(JSON.stringify({ session, answer }));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

struct Env {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Env {
    /// `state`: the state URL, or `None` for SQLite in the test's directory.
    fn new(state: Option<String>) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        for d in ["config", "state", "project", "db", "tokens"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("policy.cedar"), POLICY).unwrap();
        let settings = json!({
            "approvals": {"when_nobody_can_answer": "pause", "expire_after": "10m"},
            "audit": {"path": root.join("audit.jsonl")},
            // Shared state, so that budgets per principal outlive the server.
            "state": {"url": state.unwrap_or_else(|| format!("sqlite://{}", root.join("db/state.db").display()))},
            "budgets": {"principal": {"max_calls": 4}},
        });
        std::fs::write(root.join("config/settings.json"), settings.to_string()).unwrap();
        let sha = {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(ALICE.as_bytes()))
        };
        let tokens = json!({"tokens": [{"name": "alice", "team": "infra", "token_sha256": sha}]});
        std::fs::write(root.join("tokens/tokens.json"), tokens.to_string()).unwrap();
        Env { _dir: dir, root }
    }

    fn dirs(&self) -> Vec<String> {
        let path = |p: &str| self.root.join(p).display().to_string();
        vec![
            "--config-dir".into(),
            path("config"),
            "--state-dir".into(),
            path("state"),
            "--workdir".into(),
            path("project"),
        ]
    }

    /// `codemode serve` on a free loopback port; returns it and its URL.
    fn serve(&self) -> (Server, String) {
        let (child, url) = common::start_serving(
            common::codemode()
                .args(["serve", "--listen", "127.0.0.1:0", "--mode", "only"])
                .arg("--policy")
                .arg(self.root.join("policy.cedar"))
                .arg("--tokens-file")
                .arg(self.root.join("tokens/tokens.json"))
                .args(self.dirs())
                .env("CODEMODE_CELL_LEASE_MS", "1000")
                .env_remove("CODEMODE_SERVE_TOKEN"),
        );
        (Server(child), url)
    }

    fn approvals(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = common::codemode();
        cmd.arg("approvals").args(args).args(self.dirs());
        common::pipe(cmd, None)
    }

    fn shown(&self, id: &str) -> Value {
        let out = self.approvals(&["show", id, "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.root.join("audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// Killed (SIGKILL) when dropped: a server that dies without a word.
fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn count(root: &Path) -> String {
    std::fs::read_to_string(root.join("project/count.txt")).unwrap_or_default()
}

#[test]
fn a_cell_taken_over_after_a_restart_is_charged_to_its_sessions_principal() {
    taken_over_after_a_restart(Env::new(None));
}

/// The same with the state in PostgreSQL.
#[test]
fn on_postgres_a_cell_taken_over_after_a_restart_is_charged_to_its_sessions_principal() {
    let Some(pg) =
        common::postgres_url_or_skip("a cell taken over on PostgreSQL", "serve_cell_principal")
    else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let state = common::fresh_database(&rt, &pg, "cell_principal");
    taken_over_after_a_restart(Env::new(Some(state)));
}

fn taken_over_after_a_restart(env: Env) {
    let (server, url) = env.serve();
    let mut node = Command::new("node");
    node.args(["-e", START, &url, ALICE, SCRIPT]);
    let started = common::client_json(node);
    let session = started["session"].as_str().unwrap().to_string();
    let result = &started["answer"]["result"];
    let structured = &result["structuredContent"];
    assert_eq!(structured["status"], "waiting_for_approval", "{started}");
    let id = structured["pending"][0]["approval_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(count(&env.root), "first\n");

    // The server dies; a person approves the waiting call while no server runs.
    drop(server);
    let ok = env.approvals(&["approve", &id, "--by", "carol"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    // A new server takes the cell over. alice's client never comes back to it.
    let (_server, _url) = env.serve();
    wait_until("the taken-over cell ended", Duration::from_secs(60), || {
        env.shown(&id)["cell"]["status"]
            .as_str()
            .is_some_and(|s| s != "waiting_for_approval" && s != "running")
    });
    let cell = env.shown(&id)["cell"].clone();
    // The approved call ran; the rest were over alice's budget.
    assert_eq!(count(&env.root), "first\nsecond\n", "{cell}");
    assert_eq!(cell["status"], "failed", "{cell}");

    // Every line of the session's calls names alice, the taken-over ones too.
    let lines = env.audit();
    let theirs: Vec<&Value> = lines
        .iter()
        .filter(|l| l["provenance"]["session_id"] == session.as_str())
        .collect();
    let bash: Vec<&Value> = theirs
        .iter()
        .copied()
        .filter(|l| l["tool"] == "bash")
        .collect();
    assert_eq!(bash.len(), 3, "first, second, one refused more: {lines:?}");
    for line in &theirs {
        assert_eq!(line["principal"], "alice", "{line}");
    }
    // The refusal says whose budget it was.
    assert_eq!(bash[2]["stage"], "budget", "{:?}", bash[2]);
    let message = bash[2]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("principal budget `max_calls` of `alice`"),
        "{:?}",
        bash[2]
    );
}
