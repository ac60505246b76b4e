//! `codemode serve` answering malformed JSON-RPC the way the protocol says: invalid params are
//! -32602 with what is wrong, and an unavailable method names itself. Raw lines over stdio, as a
//! hostile or buggy client would send them.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

/// Sends `requests` (after the handshake) to `codemode serve` with `extra` flags and returns
/// the response to each, by id.
fn exchange(extra: &[&str], requests: &[Value]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = common::codemode();
    cmd.args(["serve", "--no-builtins", "--config-dir"])
        .arg(dir.path())
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--workdir")
        .arg(dir.path())
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("codemode serve starts");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                let _ = tx.send(v);
            }
        }
    });
    let mut send = |v: &Value| writeln!(stdin, "{v}").unwrap();
    send(
        &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}}),
    );
    let init = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("initialize answered");
    assert_eq!(init["id"], 0, "{init}");
    send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    for r in requests {
        send(r);
    }
    let mut answers: Vec<Value> = Vec::new();
    while answers.len() < requests.len() {
        let v = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no answer after {answers:?}"));
        if v.get("id").is_some() {
            answers.push(v);
        }
    }
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    answers.sort_by_key(|v| v["id"].as_i64());
    answers
}

#[test]
fn malformed_tools_call_params_are_invalid_params_that_say_what_is_wrong() {
    let answers = exchange(
        &["--mode", "on"],
        &[
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": null}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "codemode", "arguments": "x"}}),
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"arguments": {}}}),
            json!({"jsonrpc": "2.0", "id": 4, "method": "no/such_method", "params": {}}),
        ],
    );
    for a in &answers[..3] {
        assert_eq!(a["error"]["code"], -32602, "{a}");
        let message = a["error"]["message"].as_str().unwrap();
        assert!(message.contains("invalid params for tools/call"), "{a}");
    }
    let m = |i: usize| answers[i]["error"]["message"].as_str().unwrap().to_string();
    assert!(m(0).contains("missing or null"), "{}", m(0));
    assert!(m(1).contains("invalid type"), "{}", m(1));
    assert!(m(2).contains("name"), "{}", m(2));
    assert_eq!(answers[3]["error"]["code"], -32601, "{}", answers[3]);
    assert!(m(3).contains("no/such_method"), "{}", m(3));
}

#[test]
fn an_unavailable_method_names_itself() {
    let answers = exchange(
        &["--mode", "only"],
        &[
            json!({"jsonrpc": "2.0", "id": 1, "method": "prompts/get", "params": {"name": "p"}}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": "x:y"}}),
            json!({"jsonrpc": "2.0", "id": 3, "method": "prompts/list"}),
        ],
    );
    for (a, method) in answers
        .iter()
        .zip(["prompts/get", "resources/read", "prompts/list"])
    {
        assert_eq!(a["error"]["code"], -32601, "{a}");
        let message = a["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(method), "{a}");
    }
}
