//! A signal in the middle of a tool call: the call is stopped (a `bash` command's whole process
//! group killed) and audited as cancelled before codemode exits, for `codemode run` and for a
//! cell `codemode serve` runs after its request returned. Before, the process ended with the
//! command still running and no line for it, and `audit verify` called the log intact.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("all.cedar"),
            "@id(\"all\") permit (principal, action, resource);",
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("work")).unwrap();
        Setup { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A script whose one call marks its start, sleeps, then marks its end.
    fn script(&self) -> String {
        format!(
            "await tools.bash({{command: \"touch {}; sleep 3; touch {}\"}}); return 1",
            self.path("started").display(),
            self.path("ended").display()
        )
    }

    fn command(&self, sub: &[&str]) -> Command {
        let mut cmd = common::codemode();
        cmd.args(sub)
            .arg("--policy")
            .arg(self.path("all.cedar"))
            .arg("--audit")
            .arg(self.path("audit.jsonl"))
            .arg("--config-dir")
            .arg(self.path("config"))
            .arg("--state-dir")
            .arg(self.path("state"))
            .arg("--workdir")
            .arg(self.path("work"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn wait_started(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.path("started").exists() {
            assert!(Instant::now() < deadline, "the command never started");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The audit lines, after the command would have ended had it not been killed.
    fn lines_after_the_command_would_have_ended(&self) -> Vec<Value> {
        std::thread::sleep(Duration::from_millis(3500));
        assert!(
            !self.path("ended").exists(),
            "the command went on after codemode stopped"
        );
        std::fs::read_to_string(self.path("audit.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn verifies(&self) {
        let out = common::codemode()
            .args(["audit", "verify"])
            .arg(self.path("audit.jsonl"))
            .arg("--key")
            .arg(self.path("state/audit.key"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.contains("UNFINISHED"),
            "every journalled call has its outcome line: {text}"
        );
    }
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "codemode did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_bash_cancelled(lines: &[Value], what: &str) {
    let bash: Vec<&Value> = lines.iter().filter(|l| l["tool"] == "bash").collect();
    assert_eq!(
        bash.len(),
        1,
        "{what}: one line for the bash call: {lines:?}"
    );
    assert_eq!(bash[0]["status"], "cancelled", "{what}: {}", bash[0]);
    assert_eq!(bash[0]["effect"], "unknown", "{what}: {}", bash[0]);
}

#[test]
fn a_signal_during_a_call_of_codemode_run_stops_and_audits_it() {
    for (name, code) in [("INT", 130), ("TERM", 143), ("HUP", 129), ("USR1", 138)] {
        let s = Setup::new();
        std::fs::write(s.path("s.js"), s.script()).unwrap();
        let mut child = s.command(&["run"]).arg(s.path("s.js")).spawn().unwrap();
        s.wait_started();
        signal(&child, name);
        let status = wait_exit(&mut child);
        assert_eq!(status.code(), Some(code), "SIG{name}");
        let lines = s.lines_after_the_command_would_have_ended();
        assert_bash_cancelled(&lines, &format!("SIG{name}"));
        s.verifies();
    }
}

/// One JSON-RPC line to the server, and the answer to `id` (notifications skipped).
fn request(
    stdin: &mut impl Write,
    stdout: &mut impl BufRead,
    id: u64,
    method: &str,
    params: Value,
) -> Value {
    let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    writeln!(stdin, "{msg}").unwrap();
    stdin.flush().unwrap();
    loop {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "the server closed"
        );
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["id"] == id {
            return v;
        }
    }
}

#[test]
fn sigterm_while_a_yielded_cell_runs_a_call_of_codemode_serve_stops_and_audits_it() {
    let s = Setup::new();
    let mut child = s
        .command(&["serve", "--mode", "only"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let init = request(
        &mut stdin,
        &mut stdout,
        1,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "t", "version": "1"}}),
    );
    assert!(init["result"].is_object(), "{init}");
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    )
    .unwrap();
    let code = format!("// @options: {{\"yield_after_ms\": 200}}\n{}", s.script());
    let answer = request(
        &mut stdin,
        &mut stdout,
        2,
        "tools/call",
        json!({"name": "codemode", "arguments": {"code": code}}),
    );
    assert_eq!(
        answer["result"]["structuredContent"]["status"], "running",
        "the cell yielded: {answer}"
    );
    s.wait_started();
    signal(&child, "TERM");
    let status = wait_exit(&mut child);
    assert!(status.success(), "{status:?}");
    let lines = s.lines_after_the_command_would_have_ended();
    assert_bash_cancelled(&lines, "serve");
    assert!(
        lines.iter().any(|l| l["tool"] == "codemode"),
        "the codemode call has its line too: {lines:?}"
    );
    s.verifies();
    drop(stdin);
}

const DELETE_CLIENT: &str = r#"
const [testbed, url, token, code] = process.argv.slice(1);
const path = require("path");
const { createRequire } = require("module");
const sdk = createRequire(path.join(testbed, "noop.js"));
const { Client } = sdk("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = sdk("@modelcontextprotocol/sdk/client/streamableHttp.js");
(async () => {
  const transport = new StreamableHTTPClientTransport(new URL(url),
    { requestInit: { headers: { authorization: "Bearer " + token } } });
  const client = new Client({ name: "t", version: "1" }, { capabilities: {} });
  await client.connect(transport);
  const r = await client.callTool({ name: "codemode", arguments: { code } });
  await new Promise((r) => setTimeout(r, 500));
  await transport.terminateSession();
  console.log(JSON.stringify(r.structuredContent));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

/// A client that ends its HTTP session (`DELETE`) ends the cells it started: before, they ran on
/// unreachable, and ending and reopening sessions ran more cells than `max_per_session` allows.
#[test]
fn ending_an_http_session_terminates_its_cells_and_audits_their_calls() {
    let s = Setup::new();
    let mut child = s
        .command(&[
            "serve",
            "--mode",
            "only",
            "--listen",
            "127.0.0.1:0",
            "--token",
            "t0k",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = common::serving_url(&mut lines);
    std::thread::spawn(move || for _ in lines {});
    let code = format!("// @options: {{\"yield_after_ms\": 200}}\n{}", s.script());
    let mut client = Command::new("node");
    client
        .args(["-e", DELETE_CLIENT])
        .arg(common::testbed())
        .args([&url, "t0k", &code]);
    let first = common::client_json(client);
    assert_eq!(first["status"], "running", "{first}");
    let lines = s.lines_after_the_command_would_have_ended();
    signal(&child, "TERM");
    wait_exit(&mut child);
    assert_bash_cancelled(&lines, "DELETE");
    s.verifies();
}

/// The attack the journal answers: a command that kills codemode itself (`kill -9 $PPID`, a
/// signal nothing can catch) in the middle of its own call. Its outcome line can never be
/// written, but its start was, before it ran, and `audit verify` names it.
#[test]
fn a_command_that_kills_codemode_in_its_own_call_is_named_by_audit_verify() {
    let s = Setup::new();
    // A run that ends well first: its calls have the same ids (`codemode_1`, `codemode_1/1`)
    // as the killed run's, since call ids start again in every process. Paired by call id,
    // its outcome lines hid the killed calls (found by a red team).
    std::fs::write(
        s.path("warm.js"),
        "await tools.bash({command: \"true\"}); return 1",
    )
    .unwrap();
    let warm = s.command(&["run"]).arg(s.path("warm.js")).output().unwrap();
    assert!(warm.status.success(), "{warm:?}");
    std::fs::write(
        s.path("s.js"),
        format!(
            "await tools.bash({{command: \"touch {}; kill -9 $PPID; sleep 5\"}}); return 1",
            s.path("done").display()
        ),
    )
    .unwrap();
    let mut child = s.command(&["run"]).arg(s.path("s.js")).spawn().unwrap();
    let status = wait_exit(&mut child);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "codemode was killed: {status:?}");
    assert!(s.path("done").exists(), "the command's effect happened");
    let log = std::fs::read_to_string(s.path("audit.jsonl")).unwrap();
    assert_eq!(
        log.matches("\"tool\":\"bash\"").count(),
        1,
        "only the first run's bash call has an outcome line: {log}"
    );

    let text = verify_output(&s.path("audit.jsonl"));
    // The bash call, and the script it ran in, with its first lines.
    assert!(text.contains("UNFINISHED: 2 call(s)"), "{text}");
    let script = text
        .lines()
        .find(|l| l.contains("`codemode`"))
        .unwrap_or_else(|| panic!("the script is named: {text}"));
    assert!(script.contains("await tools.bash"), "{script}");
    let named = text
        .lines()
        .find(|l| l.contains("`bash`"))
        .unwrap_or_else(|| panic!("the bash call is named: {text}"));
    assert!(named.contains("kill -9 $PPID"), "{named}");
}

/// A permitted command cannot empty the log and its head (it runs confined, with the log
/// read-only); another process of the user can. When one does while a script runs (so what is
/// left is a short, whole chain), the next call is refused before it runs, and `audit verify`
/// still names, from the journal, the calls whose lines were wiped.
#[test]
fn a_command_that_empties_the_audit_log_stops_every_later_call_and_is_named_by_verify() {
    let s = Setup::new();
    let log = s.path("audit.jsonl");
    let after = s.path("after");
    let ready = s.path("ready");
    let emptied = s.path("emptied");
    std::fs::write(
        s.path("s.js"),
        format!(
            r#"await tools.bash({{command: "echo first"}});
await tools.bash({{command: "(: > {log}; : > {log}.head; echo tried) > {tried} 2>&1"}});
try {{ await tools.bash({{command: "touch {ready}; while [ ! -e {emptied} ]; do sleep 0.05; done"}}); }} catch {{}}
try {{ await tools.bash({{command: "touch {after}"}}); }} catch {{}}"#,
            log = log.display(),
            after = after.display(),
            ready = ready.display(),
            emptied = emptied.display(),
            tried = s.path("tried").display(),
        ),
    )
    .unwrap();
    let child = s
        .command(&["run"])
        .arg(s.path("s.js"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !ready.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the script never got to wait"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The user's own shell, outside codemode, empties both.
    std::fs::write(&log, "").unwrap();
    std::fs::write(format!("{}.head", log.display()), "").unwrap();
    std::fs::write(&emptied, "").unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let tried = std::fs::read_to_string(s.path("tried")).unwrap();
    assert!(
        tried.contains("Read-only file system") && tried.contains("tried"),
        "bash could not empty the log itself: {tried}"
    );
    assert!(
        !after.exists(),
        "nothing runs onto an emptied log: {stdout}"
    );
    assert!(stdout.contains("cut, truncated or replaced"), "{stdout}");
    // The script's own line cannot be written either: its result is withheld, not returned.
    assert!(stdout.contains("result is withheld"), "{stdout}");

    let text = verify_output(&log);
    // The script and its first three calls, whose outcome lines were wiped or never written.
    assert!(text.contains("UNFINISHED: 4 call(s)"), "{text}");
    assert!(text.contains("echo first"), "{text}");
    assert!(text.contains(": > "), "{text}");
    assert!(text.contains("while [ !"), "{text}");

    // Had the command removed the journal too, verify could not name them; the log's lines
    // say they were journalled, so verify fails and says the journal was deleted.
    std::fs::write(s.path("s.js"), "return 1").unwrap();
    std::fs::remove_file(s.path("audit.jsonl")).unwrap();
    std::fs::remove_file(s.path("audit.jsonl.head")).unwrap();
    let out = s.command(&["run"]).arg(s.path("s.js")).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    std::fs::remove_file(s.path("audit.jsonl.started")).unwrap();
    let out = common::codemode()
        .args(["audit", "verify"])
        .arg(&log)
        .arg("--key")
        .arg(s.path("state/audit.key"))
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("there is no journal beside the log"),
        "{said}"
    );
    assert!(said.contains("it was deleted"), "{said}");
}

/// What `codemode audit verify` prints for `log`, which must verify with the key of the run
/// that wrote it (`state/audit.key` beside it).
fn verify_output(log: &std::path::Path) -> String {
    let out = common::codemode()
        .args(["audit", "verify"])
        .arg(log)
        .arg("--key")
        .arg(log.with_file_name("state").join("audit.key"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
