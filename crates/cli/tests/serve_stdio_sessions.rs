//! A stdio `codemode serve` names its one session itself. A red team found the name was
//! `mcp-stdio-<pid>-<n>`: a later server that got the same process id (every container's first
//! process has one, and pids are reused) took over the session of one that was killed, with
//! its `store()` values, its live-cell count and its pending approvals. Two servers here are
//! each the first process of a fresh pid namespace, so they have the same pid.

use crate::common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// Whether this machine lets an unprivileged process make a user and pid namespace.
fn namespaces_allowed() -> bool {
    Command::new("unshare")
        .args(["-Urpf", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs one script in a stdio server that is pid 1 of its own pid namespace, returns the text
/// of the result, then kills the server (as a crash would: it ends no session).
fn run_as_pid_one(root: &Path, code: &str) -> String {
    let mut cmd = Command::new("unshare");
    // --kill-child: killing `unshare` kills the server too.
    cmd.args(["-Urpf", "--kill-child"])
        .arg(env!("CARGO_BIN_EXE_codemode"))
        .args(["serve", "--mode", "only", "--no-builtins", "--config-dir"])
        .arg(root.join("config"))
        .arg("--state-dir")
        .arg(root.join("state"))
        .arg("--workdir")
        .arg(root.join("project"))
        .env("XDG_STATE_HOME", common::test_state_home())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("unshare starts codemode serve");
    let mut stdin = child.stdin.take().unwrap();
    let rx = common::json_lines(child.stdout.take().unwrap());
    let mut send = |v: &Value| writeln!(stdin, "{v}").unwrap();
    let answer = |id: i64| loop {
        let v: Value = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("no answer to request {id}"));
        if v["id"] == id {
            break v;
        }
    };
    send(
        &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    answer(0);
    send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "codemode", "arguments": {"code": code}}}));
    let result = answer(1);
    let _ = child.kill();
    let _ = child.wait();
    result["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {result}"))
        .to_string()
}

#[test]
fn a_server_with_the_same_pid_does_not_inherit_a_killed_servers_session() {
    if !namespaces_allowed() {
        eprintln!("SKIPPED: this machine does not allow user and pid namespaces (unshare -Urpf)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for d in ["config", "state", "project"] {
        std::fs::create_dir_all(dir.path().join(d)).unwrap();
    }
    let first = run_as_pid_one(
        dir.path(),
        "store('token', 'alice-secret'); return load('token')",
    );
    assert!(first.contains("alice-secret"), "{first}");
    let second = run_as_pid_one(
        dir.path(),
        "return 'seen: ' + JSON.stringify(load('token') ?? null)",
    );
    assert!(second.contains("seen: null"), "{second}");
    assert!(!second.contains("alice-secret"), "{second}");
}
