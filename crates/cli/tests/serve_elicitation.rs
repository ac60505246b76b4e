//! `codemode serve` facing a client that declares elicitation and then never answers the
//! approval question: the call it asked about must not wait forever (holding its script, a
//! sandbox worker and the session's cell slot), but count as unanswered once
//! `approvals.expire_after` has passed, like every other approval. Raw lines over stdio, as a
//! hostile client would send them.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const POLICY: &str = r#"
@id("append-needs-a-person")
@ask("the script appends to the project")
permit (principal, action == Action::"tool_call", resource == Tool::"bash")
when { context.args has command && context.args.command like "echo asked*" };
"#;

struct Serve {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: mpsc::Receiver<Value>,
    dir: tempfile::TempDir,
}

impl Serve {
    fn start(settings: Value) -> Serve {
        let dir = tempfile::tempdir().unwrap();
        for d in ["config", "state", "project"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        std::fs::write(dir.path().join("policy.cedar"), POLICY).unwrap();
        std::fs::write(
            dir.path().join("config/settings.json"),
            settings.to_string(),
        )
        .unwrap();
        let mut cmd = common::codemode();
        cmd.args(["serve", "--mode", "only", "--policy"])
            .arg(dir.path().join("policy.cedar"))
            .arg("--config-dir")
            .arg(dir.path().join("config"))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--workdir")
            .arg(dir.path().join("project"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("codemode serve starts");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    let _ = tx.send(v);
                }
            }
        });
        Serve {
            child,
            stdin,
            lines,
            dir,
        }
    }

    fn send(&mut self, v: Value) {
        writeln!(self.stdin, "{v}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Lines until the answer to `id`; `seen` gets every line on the way. `None` when nothing
    /// came within `limit`.
    fn answer_to(&self, id: i64, limit: Duration, seen: &mut Vec<Value>) -> Option<Value> {
        let until = Instant::now() + limit;
        loop {
            let left = until.checked_duration_since(Instant::now())?;
            let v = self.lines.recv_timeout(left).ok()?;
            if v["id"] == json!(id) && v.get("method").is_none() {
                return Some(v);
            }
            seen.push(v);
        }
    }

    fn handshake(&mut self) {
        self.send(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {"elicitation": {}},
            "clientInfo": {"name": "silent", "version": "1"}}}),
        );
        self.answer_to(0, Duration::from_secs(60), &mut Vec::new())
            .expect("initialize answered");
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn structured(answer: &Value) -> &Value {
    &answer["result"]["structuredContent"]
}

/// The client is asked (an `elicitation/create` request reaches it) and never answers. With
/// `approvals.expire_after` at 2 s, the call is refused and the cell ends well within a minute;
/// the command never runs, and the client is told the question is withdrawn.
#[test]
fn an_approval_question_the_client_never_answers_expires_and_the_call_is_refused() {
    let mut serve = Serve::start(json!({
        "approvals": {"expire_after": "2s"},
        "cells": {"yield_after_ms": 1000},
        "audit": {"path": "audit.jsonl"}
    }));
    serve.handshake();
    let code = r#"
        try {
            await tools.bash({ command: "echo asked >> asked.txt" });
            return "ran";
        } catch (e) {
            return "refused: " + e.message;
        }
    "#;
    serve.send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "codemode", "arguments": {"code": code}}}));
    let mut seen = Vec::new();
    let first = serve
        .answer_to(1, Duration::from_secs(60), &mut seen)
        .expect("the codemode call answers (finished, or yielded as a running cell)");
    let asked = seen
        .iter()
        .find(|v| v["method"] == "elicitation/create")
        .unwrap_or_else(|| panic!("the client was asked: {seen:?}"))
        .clone();
    let cell = structured(&first)["cell"]
        .as_str()
        .unwrap_or_else(|| panic!("a cell id: {first}"))
        .to_string();

    // Waits again and again, up to a minute in all: far longer than the 2 s expiry.
    let mut last = first;
    let started = Instant::now();
    let mut id = 2;
    while structured(&last)["status"] != "finished"
        && structured(&last)["status"] != "failed"
        && started.elapsed() < Duration::from_secs(60)
    {
        serve.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "wait", "arguments": {"cell": cell, "timeout_ms": 5000}}}));
        last = serve
            .answer_to(id, Duration::from_secs(60), &mut seen)
            .expect("wait answers");
        id += 1;
    }
    let status = &structured(&last)["status"];
    assert!(
        status == "finished" || status == "failed",
        "a call whose approval question went unanswered for a minute (expiry 2 s) is still \
         waiting: {last}"
    );
    let value = structured(&last)["value"].as_str().unwrap_or_default();
    assert!(value.starts_with("refused: "), "{last}");
    assert!(
        !serve.dir.path().join("project/asked.txt").exists(),
        "the unanswered call ran"
    );
    let withdrawn = seen.iter().any(|v| {
        v["method"] == "notifications/cancelled" && v["params"]["requestId"] == asked["id"]
    });
    assert!(
        withdrawn,
        "the client was not told the question is withdrawn: {seen:?}"
    );
}
