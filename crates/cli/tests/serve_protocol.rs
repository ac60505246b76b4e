//! `codemode serve` answering malformed JSON-RPC the way the protocol says: a line that is not
//! JSON is -32700, one that is not a request -32600, invalid params are -32602 with what is
//! wrong, and an unavailable method names itself. Raw lines over stdio, as a hostile or buggy
//! client would send them.

use crate::common;

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
    // `--builtins` here: keep the built-in tools (the codemode tool needs some tool).
    let builtins = extra.first() == Some(&"--builtins");
    let extra = if builtins { &extra[1..] } else { extra };
    cmd.arg("serve")
        .args((!builtins).then_some("--no-builtins"))
        .arg("--config-dir")
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
    let rx = common::json_lines(child.stdout.take().unwrap());
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

/// A `codemode serve` on stdio, fed raw bytes; its answers arrive on `answers`.
struct Raw {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    answers: mpsc::Receiver<Value>,
    _dir: tempfile::TempDir,
}

impl Raw {
    fn start() -> Raw {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = common::codemode();
        cmd.args(["serve", "--no-builtins", "--mode", "only", "--config-dir"])
            .arg(dir.path())
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--workdir")
            .arg(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("codemode serve starts");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, answers) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // Every line the server writes must be JSON: a panic here fails the test.
                let v: Value = serde_json::from_str(&line).expect("the server writes JSON lines");
                let _ = tx.send(v);
            }
        });
        Raw {
            child,
            stdin,
            answers,
            _dir: dir,
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    /// The next line the server writes (a generous bound only against a hang).
    fn next(&self) -> Value {
        self.answers
            .recv_timeout(Duration::from_secs(60))
            .expect("the server answered")
    }

    /// Answers until one with `id` arrives: the error answers (id null) seen on the way, and it.
    fn until_id(&self, id: Value) -> (Vec<Value>, Value) {
        let mut errors = Vec::new();
        loop {
            let v = self.next();
            if v["id"] == id {
                return (errors, v);
            }
            if v["id"].is_null() && v.get("error").is_some() {
                errors.push(v);
            }
        }
    }
}

fn error_of(v: &Value) -> (i64, String) {
    (
        v["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("not an error: {v}")),
        v["error"]["message"].as_str().unwrap().to_string(),
    )
}

#[test]
fn lines_that_are_not_requests_get_errors_and_the_session_goes_on() {
    let mut raw = Raw::start();
    // Before the handshake: garbage, a cut-off object, JSON that is not JSON-RPC, blank lines.
    raw.send(b"this is not json\n");
    raw.send(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initia\n");
    raw.send(b"{\"hello\":\"world\"}\n");
    raw.send(b"\n\r\n   \n");
    raw.send(b"{\"jsonrpc\":\"2.0\",\"id\":\"x\",\"method\":7}\n");
    let expected = [
        (-32700, "not JSON"),
        (-32700, "not JSON"),
        (-32600, "no \"jsonrpc\""),
    ];
    for (code, says) in expected {
        let v = raw.next();
        assert_eq!(v["jsonrpc"], "2.0", "{v}");
        assert!(
            v["id"].is_null() && v.as_object().unwrap().contains_key("id"),
            "{v}"
        );
        let (c, m) = error_of(&v);
        assert_eq!(c, code, "{v}");
        assert!(m.contains(says), "{m:?} does not say {says:?}");
        assert!(
            m.contains("\"method\":\"tools/list\""),
            "no example in {m:?}"
        );
    }
    let v = raw.next();
    assert_eq!(v["id"], "x", "an id that can be read is answered: {v}");
    let (c, m) = error_of(&v);
    assert_eq!(c, -32600);
    assert!(m.contains("\"method\" is a number"), "{m}");

    // A byte order mark and CRLF on a real initialize.
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}});
    raw.send(format!("\u{feff}{init}\r\n").as_bytes());
    let (errors, v) = raw.until_id(json!(0));
    assert!(errors.is_empty(), "{errors:?}");
    assert!(v["result"]["serverInfo"].is_object(), "{v}");
    raw.send(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n");

    // A long but valid line (4 MiB) is read; one over the 16 MiB limit is answered, unread.
    let pad = "x".repeat(4 << 20);
    let long = json!({"jsonrpc": "2.0", "id": 1, "method": "ping",
        "params": {"_meta": {"pad": pad}}});
    raw.send(format!("{long}\n").as_bytes());
    let (errors, v) = raw.until_id(json!(1));
    assert!(errors.is_empty(), "{errors:?}");
    assert!(v["result"].is_object(), "{v}");
    let mut huge = vec![b'['; 17 << 20];
    huge.push(b'\n');
    raw.send(&huge);
    raw.send(b"garbage after the huge line\n");
    raw.send(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\"}\n");
    let (errors, v) = raw.until_id(json!(2));
    let tools: Vec<&str> = v["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("tools/list answered: {v}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(tools.contains(&"codemode"), "{tools:?}");
    assert_eq!(errors.len(), 2, "{errors:?}");
    let (c, m) = error_of(&errors[0]);
    assert_eq!(c, -32600);
    assert!(m.contains("longer than 16 MiB"), "{m}");
    assert_eq!(error_of(&errors[1]).0, -32700);

    // Still serving, and ends cleanly when the client closes stdin.
    assert!(
        raw.child.try_wait().unwrap().is_none(),
        "the server is running"
    );
    drop(raw.stdin.take());
    let status = raw.child.wait().unwrap();
    assert!(status.success(), "{status}");
}

/// Red team: the text a script's result carries is cut to `max_output_tokens`, but its
/// `structuredContent` held every printed byte, so a script printing 15 MB sent the client a
/// 15.7 MB answer, and a client that shows the structured result to the model (some prefer it)
/// put all of it in the model's context. The structured result now stays within 256 KiB and
/// says what it left out; the status stays.
#[test]
fn a_script_that_prints_megabytes_gets_a_bounded_answer() {
    let script = "for (let i = 0; i < 8; i++) text('y'.repeat(500000)); return 'done'";
    let answers = exchange(
        &["--builtins"],
        &[json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "codemode", "arguments": {"code": script}}})],
    );
    let answer = &answers[0];
    let size = serde_json::to_vec(answer).unwrap().len();
    let parts: Vec<(String, usize)> = answer["result"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.to_string().len()))
        .collect();
    assert!(size < 512 * 1024, "the answer is {size} bytes: {parts:?}");
    let result = &answer["result"];
    assert_eq!(result["isError"], false, "{}", result["content"]);
    let structured = &result["structuredContent"];
    assert_eq!(structured["ok"], true, "{structured}");
    assert!(
        structured["omitted"]["output"]
            .as_str()
            .is_some_and(|s| s.contains("8 items")),
        "{structured}"
    );
    assert_eq!(structured["value"], "done");
}
