//! Cells under `codemode serve`, driven by the real MCP SDK client: yield and wait, bad waits,
//! terminate; and a call paused for approval surviving a SIGKILL of the server: approved from
//! `codemode approvals` while no server runs, the cell is rebuilt by the next server and goes
//! on without running its first call again (the file it appends to says so).

use crate::common;
use common::testbed;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const CLIENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/cells-client.cjs"
);

const POLICY: &str = r#"
@id("sleep")
permit (principal, action == Action::"tool_call", resource == Tool::"bash")
when { context.args has command && context.args.command like "sleep *" };
@id("first-step")
permit (principal, action == Action::"tool_call", resource == Tool::"bash")
when { context.args has command && context.args.command like "echo first*" };
@id("second-step-needs-a-person")
@ask("the second step appends to the project")
permit (principal, action == Action::"tool_call", resource == Tool::"bash")
when { context.args has command && context.args.command like "echo second*" };
"#;

struct Env {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        for d in ["config", "state", "project"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("policy.cedar"), POLICY).unwrap();
        std::fs::write(
            root.join("config/settings.json"),
            json!({
                "approvals": {"when_nobody_can_answer": "pause", "expire_after": "10m"},
                "audit": {"path": "audit.jsonl"}
            })
            .to_string(),
        )
        .unwrap();
        Env { _dir: dir, root }
    }

    fn dirs(&self) -> Vec<String> {
        vec![
            "--config-dir".into(),
            self.root.join("config").display().to_string(),
            "--state-dir".into(),
            self.root.join("state").display().to_string(),
            "--workdir".into(),
            self.root.join("project").display().to_string(),
        ]
    }

    fn serve_args(&self) -> Vec<String> {
        let mut args = vec!["serve".to_string(), "--mode".into(), "only".into()];
        args.extend([
            "--policy".into(),
            self.root.join("policy.cedar").display().to_string(),
        ]);
        args.extend(self.dirs());
        args
    }

    fn client(&self, scenario: &str, arg: &str) -> Value {
        let mut node = Command::new("node");
        node.env("CODEMODE_CELL_LEASE_MS", "1000")
            .arg(CLIENT)
            .arg(testbed())
            .arg(env!("CARGO_BIN_EXE_codemode"))
            .arg(json!(self.serve_args()).to_string())
            .arg(scenario)
            .arg(arg);
        common::client_json(node)
    }

    fn approvals(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = common::codemode();
        cmd.arg("approvals").args(args).args(self.dirs());
        common::pipe(cmd, None)
    }

    fn count(&self) -> String {
        std::fs::read_to_string(self.root.join("project/count.txt")).unwrap_or_default()
    }
}

#[test]
fn a_long_script_yields_and_wait_returns_the_rest() {
    let env = Env::new();
    let r = env.client("yield", "");
    assert_eq!(r["tools"], json!(["codemode", "wait"]), "{r}");
    let first = &r["first"];
    assert_eq!(first["status"], "running", "{first}");
    assert!(
        first["text"].as_str().unwrap().contains("before"),
        "{first}"
    );
    assert!(
        !first["text"].as_str().unwrap().contains("after"),
        "{first}"
    );
    let last = &r["last"];
    assert_eq!(last["status"], "finished", "{r}");
    assert_eq!(last["structured"]["value"], 42, "{last}");
    let seen: String = r["waits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["text"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(seen.contains("after"), "{seen}");
    assert!(!last["text"].as_str().unwrap().contains("before"), "{last}");
    for (key, needle) in [
        ("again", "already finished"),
        ("unknown", "no cell"),
        ("bad", "timeout_ms"),
    ] {
        assert_eq!(r[key]["isError"], true, "{key}: {}", r[key]);
        assert!(
            r[key]["text"].as_str().unwrap().contains(needle),
            "{key}: {}",
            r[key]
        );
    }
    assert_eq!(r["long"]["status"], "running");
    assert_eq!(r["stopped"]["status"], "terminated", "{}", r["stopped"]);
}

/// Runs a server (which takes over cells left by a stopped one) until `done`.
fn hold_a_server_until(env: &Env, what: &str, done: impl FnMut() -> bool) {
    let stop = env.root.join("stop");
    let _ = std::fs::remove_file(&stop);
    let holder = {
        let args = env.serve_args();
        let stop = stop.clone();
        std::thread::spawn(move || {
            Command::new("node")
                .env("CODEMODE_CELL_LEASE_MS", "1000")
                .arg(CLIENT)
                .arg(testbed())
                .arg(env!("CARGO_BIN_EXE_codemode"))
                .arg(json!(args).to_string())
                .arg("hold")
                .arg(stop.display().to_string())
                .output()
                .unwrap()
        })
    };
    wait_until(what, Duration::from_secs(60), done);
    std::fs::write(&stop, "").unwrap();
    let out = holder.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn approval_json(env: &Env, id: &str) -> Value {
    let out = env.approvals(&["show", id, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_paused_cell_survives_sigkill_and_resumes_without_repeating_a_call() {
    let env = Env::new();
    let r = env.client("pause_and_kill", "");
    assert_eq!(r["status"], "waiting_for_approval", "{r}");
    let pending = &r["structured"]["pending"][0];
    assert_eq!(pending["tool"], "bash");
    assert_eq!(
        pending["arguments"],
        json!({"command": "echo second >> count.txt"})
    );
    assert_eq!(pending["policy_ids"], json!(["second-step-needs-a-person"]));
    let id = pending["approval_id"].as_str().unwrap().to_string();
    assert_eq!(env.count(), "first\n");

    // The server is dead; the approval is still there for the person.
    let list = env.approvals(&["list"]);
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(
        listed.contains(&id) && listed.contains("echo second"),
        "{listed}"
    );
    let shown = approval_json(&env, &id);
    assert_eq!(shown["approval"]["state"], "pending");
    assert_eq!(shown["cell"]["status"], "waiting_for_approval");

    // Bad answers: an unknown id, a hash of another call.
    let unknown = env.approvals(&["approve", "ap_unknown"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no approval"));
    let wrong = env.approvals(&["approve", &id, "--call-hash", &"0".repeat(64)]);
    assert_eq!(wrong.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("different call"));

    let ok = env.approvals(&["approve", &id, "--by", "alice"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let twice = env.approvals(&["deny", &id]);
    assert_eq!(twice.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&twice.stderr).contains("already answered"));

    // A new server takes the cell over, replays the first call and runs the second.
    hold_a_server_until(&env, "the cell finished", || {
        approval_json(&env, &id)["cell"]["status"] == "finished"
    });
    assert_eq!(env.count(), "first\nsecond\n", "no call ran twice");

    let audit = std::fs::read_to_string(env.root.join("state/audit.jsonl")).unwrap();
    let answer: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["event"] == "approval")
        .collect();
    assert_eq!(answer.len(), 1, "{audit}");
    assert_eq!(answer[0]["by"], "alice");
    assert_eq!(answer[0]["channel"], "cli");
    let verify = common::pipe(
        {
            let mut c = common::codemode();
            c.args(["audit", "verify"])
                .arg(env.root.join("state/audit.jsonl"))
                .arg("--key")
                .arg(env.root.join("state/audit.key"));
            c
        },
        None,
    );
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    // The script was journalled by the killed server; the one that finished it closes it.
    let said = String::from_utf8_lossy(&verify.stdout);
    assert!(!said.contains("UNFINISHED"), "{said}");
    let end: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["event"] == "taken_over_script_end")
        .collect();
    assert_eq!(end.len(), 1, "{audit}");
    assert_eq!(end[0]["status"], "ok");
    assert_eq!(end[0]["cell_status"], "finished");
}

#[test]
fn a_state_database_that_cannot_be_used_stops_serve_at_start_with_a_clear_error() {
    let env = Env::new();
    let db: &Path = &env.root.join("state/state.db");
    std::fs::write(
        db,
        b"this is not an SQLite database, it is a text file that got here",
    )
    .unwrap();
    let mut cmd = common::codemode();
    cmd.args(env.serve_args());
    let out = common::pipe(cmd, None);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("damaged or is not a codemode state database"),
        "{err}"
    );
    // Nothing was overwritten.
    assert!(
        std::fs::read(db)
            .unwrap()
            .starts_with(b"this is not an SQLite")
    );
}

#[test]
fn codemode_run_pauses_until_another_process_answers() {
    let env = Env::new();
    let mut cmd = common::codemode();
    cmd.args(["run", "--json", "--policy"])
        .arg(env.root.join("policy.cedar"))
        .args(env.dirs())
        .arg("-");
    let script = r#"await tools.bash({ command: "echo first >> count.txt" });
try { await tools.bash({ command: "echo second >> count.txt" }); return "approved"; }
catch (e) { return e.stage; }"#;
    let run = std::thread::spawn(move || common::pipe(cmd, Some(script)));
    let mut id = String::new();
    wait_until("the run paused", Duration::from_secs(60), || {
        let out = env.approvals(&["list", "--json"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if let Some(line) = text.lines().next() {
            let v: Value = serde_json::from_str(line).unwrap();
            id = v["id"].as_str().unwrap().to_string();
            return true;
        }
        false
    });
    assert_eq!(env.count(), "first\n");
    // Red-team finding: an answer given where no audit log is configured went unaudited. It
    // is refused, and the approval stays pending for an audited answer.
    let bare = env.root.join("config-without-audit");
    std::fs::create_dir_all(&bare).unwrap();
    let mut cmd = common::codemode();
    cmd.args([
        "approvals",
        "approve",
        &id,
        "--by",
        "mallory",
        "--config-dir",
    ])
    .arg(&bare)
    .arg("--state-dir")
    .arg(env.root.join("state"))
    .arg("--workdir")
    .arg(env.root.join("project"));
    let unaudited = common::pipe(cmd, None);
    assert!(!unaudited.status.success());
    let why = String::from_utf8_lossy(&unaudited.stderr);
    assert!(
        why.contains("no audit log is configured") && why.contains("--audit"),
        "{why}"
    );
    let denied = env.approvals(&["deny", &id, "--by", "bob"]);
    assert!(
        denied.status.success(),
        "{}",
        String::from_utf8_lossy(&denied.stderr)
    );
    let out = run.join().unwrap();
    let (code, value, stderr) = common::json_outcome(out);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(value["value"], "approval", "{value}");
    assert!(
        stderr.contains(&id) && stderr.contains("codemode approvals approve"),
        "{stderr}"
    );
    assert_eq!(env.count(), "first\n", "the denied call never ran");
}

const MCP_FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../mcp/tests/fixtures/misbehaving-server.cjs"
);

/// A cell whose script goes on to an MCP tool after its approval: the server that takes it
/// over must wait for that MCP server to connect before replaying, or the script would fail on
/// a tool name not known yet. The MCP server here starts slowly from its second start on.
#[test]
fn a_cell_taken_over_waits_for_the_mcp_servers_its_script_calls() {
    let env = Env::new();
    let once = env.root.join("started-once");
    let launcher = format!(
        "if [ -f {once} ]; then sleep 4; fi; touch {once}; exec node {MCP_FIXTURE} {}",
        testbed().display(),
        once = once.display()
    );
    std::fs::write(
        env.root.join("config/mcp.json"),
        json!({"mcpServers": {"slow": {"command": "sh", "args": ["-c", launcher]}}}).to_string(),
    )
    .unwrap();
    let mut policy = std::fs::read_to_string(env.root.join("policy.cedar")).unwrap();
    policy.push_str(
        "@id(\"slow\") permit (principal, action == Action::\"tool_call\", resource is Tool) when { resource.namespace == \"mcp__slow\" };\n",
    );
    std::fs::write(env.root.join("policy.cedar"), policy).unwrap();

    let script = r#"await tools.bash({ command: "echo first >> count.txt" });
await tools.bash({ command: "echo second >> count.txt" });
const r = await tools.mcp__slow__echo({ text: "after the take-over" });
return r.content[0].text;"#;
    let r = env.client("pause_and_kill", script);
    assert_eq!(r["status"], "waiting_for_approval", "{r}");
    let id = r["structured"]["pending"][0]["approval_id"]
        .as_str()
        .unwrap()
        .to_string();
    let ok = env.approvals(&["approve", &id, "--by", "alice"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    hold_a_server_until(&env, "the cell ended", || {
        let status = approval_json(&env, &id)["cell"]["status"].clone();
        status == "finished" || status == "failed"
    });
    let cell = approval_json(&env, &id)["cell"].clone();
    assert_eq!(cell["status"], "finished", "{cell}");
    assert_eq!(env.count(), "first\nsecond\n", "no call ran twice");
}

/// Red team: `approvals list` cuts arguments at 80 characters and `approve <id>` needed nothing
/// more, so a command padded past the cut was approved by a person who never saw its end. Such
/// an approval must now name the call by the hash `show` prints beside the whole arguments.
#[tokio::test]
async fn approving_arguments_the_list_cut_needs_the_hash_show_prints() {
    let env = Env::new();
    let store = codemode_state::open(
        &format!("sqlite://{}", env.root.join("state/state.db").display()),
        Default::default(),
    )
    .await
    .unwrap();
    // Runs of spaces are shown counted; ordinary words are not.
    let padded = format!("echo {}; touch PWNED", "checking the build ".repeat(6));
    let a = store
        .create_approval(codemode_state::NewApproval {
            cell_id: None,
            session_id: "s".into(),
            tool: "bash".into(),
            arguments: json!({ "command": padded }),
            provenance: json!({}),
            paths: Vec::new(),
            policy_ids: vec!["ask".into()],
            reason: "bash asks".into(),
            expires_in: Duration::from_secs(600),
        })
        .await
        .unwrap();
    drop(store);
    let listed = env.approvals(&["list"]);
    assert!(!String::from_utf8_lossy(&listed.stdout).contains("PWNED"));
    let blind = env.approvals(&["approve", &a.id]);
    assert_eq!(blind.status.code(), Some(2));
    let why = String::from_utf8_lossy(&blind.stderr);
    assert!(why.contains("approvals show"), "{why}");
    assert_eq!(approval_json(&env, &a.id)["approval"]["state"], "pending");
    let hash = approval_json(&env, &a.id)["approval"]["call_hash"]
        .as_str()
        .unwrap()
        .to_string();
    let seen = env.approvals(&["approve", &a.id, "--call-hash", &hash]);
    assert!(
        seen.status.success(),
        "{}",
        String::from_utf8_lossy(&seen.stderr)
    );
    assert_eq!(approval_json(&env, &a.id)["approval"]["state"], "approved");
}
