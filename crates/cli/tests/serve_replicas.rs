//! Two `codemode serve` replicas on loopback sharing one PostgreSQL, driven by the official
//! MCP SDK client: one budget for both, sessions that move between them, one audit chain, and
//! traces received by a real OTLP/HTTP receiver in the test; and approvals answered on one side
//! (the `codemode approvals` CLI, or the session's client come back through the other replica)
//! resuming the cell on the replica that holds it.

use crate::common;
use common::testbed;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::Value;

struct Replica {
    child: Child,
    url: String,
    base: String,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Replica {
    fn start(args: &[&str]) -> Replica {
        let (child, url) = common::start_serving(
            Command::new(env!("CARGO_BIN_EXE_codemode"))
                .args(["serve", "--listen", "127.0.0.1:0"])
                .args(args)
                .env_remove("CODEMODE_SERVE_TOKEN"),
        );
        let base = url.trim_end_matches("/mcp").to_string();
        Replica { child, url, base }
    }

    /// SIGTERM, so it flushes its traces, then waits.
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.1 GET: (status, body).
fn get(base: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let addr = base.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    (status, body)
}

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

fn otlp_receiver(rt: &tokio::runtime::Runtime) -> (String, Arc<Mutex<Vec<Span>>>) {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let keep = spans.clone();
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let keep = keep.clone();
                async move {
                    let req =
                        ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
                    for rs in req.resource_spans {
                        for ss in rs.scope_spans {
                            keep.lock().unwrap().extend(ss.spans);
                        }
                    }
                    ""
                }
            }),
        )
        .route("/v1/metrics", axum::routing::post(|| async { "" }));
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), spans)
}

fn attr(span: &Span, key: &str) -> String {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .map(|v| format!("{:?}", v.value))
        .unwrap_or_default()
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[test]
fn two_replicas_share_one_budget_one_session_table_and_one_audit_chain() {
    let Some(pg) = common::postgres_url_or_skip("two replicas on PostgreSQL", "serve_replicas")
    else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let state_url = common::fresh_database(&rt, &pg, "budget");
    let (otlp, spans) = otlp_receiver(&rt);

    let config = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    write(&work.path().join("a.txt"), "x");
    let settings = serde_json::json!({
        "mode": "on",
        "state": {"url": state_url, "audit_stream": "team"},
        "budgets": {"principal": {"max_calls": 10}},
        "telemetry": {"otlp_endpoint": otlp, "metrics": true},
    });
    write(&config.path().join("settings.json"), &settings.to_string());
    let (alice, bob) = ("alice-token-0123456789", "bob-token-9876543210");
    let tokens = serde_json::json!({"tokens": [
        {"name": "alice", "team": "infra", "token_sha256": sha256_hex(alice)},
        {"name": "bob", "team": "infra", "token_sha256": sha256_hex(bob)},
    ]});
    let tokens_file = config.path().join("tokens.json");
    write(&tokens_file, &tokens.to_string());
    let args = [
        "--config-dir",
        config.path().to_str().unwrap(),
        "--state-dir",
        state.path().to_str().unwrap(),
        "--workdir",
        work.path().to_str().unwrap(),
        "--tokens-file",
        tokens_file.to_str().unwrap(),
    ];
    let a = Replica::start(&args);
    let b = Replica::start(&args);

    // Health: no token needed; ready once the database answers.
    assert_eq!(get(&a.base, "/healthz", None).0, 200);
    let (code, body) = get(&b.base, "/readyz", None);
    assert_eq!(code, 200, "{body}");
    let ready: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ready["ready"], true, "{body}");
    assert!(
        ready["state"]["backend"]
            .as_str()
            .unwrap()
            .contains("postgres"),
        "{body}"
    );

    let out = Command::new("node")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/replicas-client.cjs"
        ))
        .arg(testbed())
        .args([&a.url, &b.url, alice, bob, "1000"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(v["failed"], 0, "{v}");
    assert_eq!(v["ran"], 10, "exactly the shared budget ran: {v}");
    assert_eq!(v["denied"], 990, "{v}");
    assert!(
        v["deniedSample"]
            .as_str()
            .unwrap()
            .contains("principal budget `max_calls` of `alice`"),
        "{v}"
    );
    assert_eq!(
        v["movedStatus"], 200,
        "a session moves between replicas: {v}"
    );
    assert_eq!(v["movedListsLs"], true, "{v}");
    assert_eq!(v["borrowed"], serde_json::json!([403, 403]), "{v}");

    // Metrics: behind the token.
    assert_eq!(get(&a.base, "/metrics", None).0, 401);
    let (code, text) = get(&a.base, "/metrics", Some(alice));
    assert_eq!(code, 200);
    assert!(text.contains("codemode_calls_total"), "{text}");
    assert!(text.contains("codemode_denials_total"), "{text}");
    assert!(text.contains("codemode_sessions_active"), "{text}");

    a.stop();
    b.stop();

    // One chain, from both replicas, every call in it.
    let verify = Command::new(env!("CARGO_BIN_EXE_codemode"))
        .args([
            "audit", "verify", "--state", &state_url, "--stream", "team", "--key",
        ])
        .arg(state.path().join("audit.key"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verify.stdout);
    assert!(
        verify.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&verify.stderr)
    );
    assert!(said.contains("intact, 1000 lines"), "{said}");
    // Every call journalled before it ran has its outcome line.
    assert!(!said.contains("UNFINISHED"), "{said}");

    // Traces from both replicas reached the receiver, without arguments or tokens.
    let spans = spans.lock().unwrap();
    let ls: Vec<&Span> = spans.iter().filter(|s| s.name == "ls").collect();
    assert_eq!(ls.len(), 1000, "a span per call");
    assert_eq!(
        ls.iter()
            .filter(|s| attr(s, "codemode.status").contains("\"ok\""))
            .count(),
        10
    );
    assert_eq!(
        ls.iter()
            .filter(|s| attr(s, "codemode.stage").contains("budget"))
            .count(),
        990
    );
    for s in spans.iter() {
        for kv in &s.attributes {
            let shown = format!("{:?}", kv.value);
            assert!(!shown.contains("token"), "{shown}");
        }
        assert!(attr(s, "codemode.args").is_empty());
    }
}

const ASKING_POLICY: &str = r#"
@id("first-step")
permit (principal, action == Action::"tool_call", resource == Tool::"bash")
when { context.args has command && context.args.command like "echo first*" };
@id("second-step-needs-a-person")
@ask("the second step appends to the project")
permit (principal, action == Action::"tool_call", resource == Tool::"bash")
when { context.args has command && context.args.command like "echo second*" };
"#;

/// The lines of an audit stream in the shared database, in order.
fn audit_lines(rt: &tokio::runtime::Runtime, state_url: &str, stream: &str) -> Vec<Value> {
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(state_url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
            .query(
                "SELECT line FROM audit_lines WHERE stream = $1 ORDER BY seq",
                &[&stream],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| serde_json::from_str(row.get::<_, &str>(0)).unwrap())
            .collect()
    })
}

#[test]
fn an_approval_answered_elsewhere_resumes_the_cell_on_the_replica_that_holds_it() {
    let Some(pg) =
        common::postgres_url_or_skip("approvals across replicas on PostgreSQL", "serve_replicas")
    else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let state_url = common::fresh_database(&rt, &pg, "approvals");

    let config = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let settings = serde_json::json!({
        "state": {"url": state_url, "audit_stream": "team"},
        "approvals": {"when_nobody_can_answer": "pause", "expire_after": "10m"},
    });
    write(&config.path().join("settings.json"), &settings.to_string());
    let policy = config.path().join("policy.cedar");
    write(&policy, ASKING_POLICY);
    let dirs = [
        "--config-dir",
        config.path().to_str().unwrap(),
        "--state-dir",
        state.path().to_str().unwrap(),
        "--workdir",
        work.path().to_str().unwrap(),
    ];
    // Dana's token: what she answers is recorded under her name, whatever her client calls
    // itself ("dana-laptop").
    let dana = "dana-token-0123456789";
    let tokens =
        serde_json::json!({"tokens": [{"name": "dana", "token_sha256": sha256_hex(dana)}]});
    let tokens_file = config.path().join("tokens.json");
    write(&tokens_file, &tokens.to_string());
    let mut serve_args = vec!["--mode", "only", "--policy", policy.to_str().unwrap()];
    serve_args.extend(["--tokens-file", tokens_file.to_str().unwrap()]);
    serve_args.extend(dirs);
    let a = Replica::start(&serve_args);
    let b = Replica::start(&serve_args);

    // The person's CLI: another process, on another machine as far as it knows, that shares
    // only the database (named with --state).
    let mut approvals_args = vec!["--state", state_url.as_str()];
    approvals_args.extend(dirs);
    let out = Command::new("node")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/replicas-approvals-client.cjs"
        ))
        .arg(testbed())
        .arg(env!("CARGO_BIN_EXE_codemode"))
        .args([&a.url, &b.url])
        .arg(serde_json::json!(approvals_args).to_string())
        .env("CODEMODE_TEST_TOKEN", dana)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(v["tools"], serde_json::json!(["codemode", "wait"]), "{v}");

    // 1. Paused on A (its client cannot be asked), answered by the CLI on the shared store.
    let cli = &v["cli"];
    let started = &cli["started"];
    assert_eq!(started["status"], "waiting_for_approval", "{cli}");
    let cell1 = started["cell"].as_str().unwrap();
    let pending = &started["structured"]["pending"][0];
    assert_eq!(pending["tool"], "bash");
    assert_eq!(
        pending["arguments"],
        serde_json::json!({"command": "echo second-1 >> count.txt"})
    );
    let id1 = pending["approval_id"].as_str().unwrap();
    // The session moved to B: `wait` there reads the cell from the store and says where it runs.
    let on_b = &cli["waitOnBWhilePaused"];
    assert_eq!(on_b["isError"], false, "{on_b}");
    assert_eq!(on_b["status"], "waiting_for_approval", "{on_b}");
    assert_eq!(
        on_b["structured"]["pending"][0]["approval_id"], id1,
        "{on_b}"
    );
    assert!(
        on_b["text"]
            .as_str()
            .unwrap()
            .contains("runs in another codemode process"),
        "{on_b}"
    );
    // Only the process that runs a cell can terminate it on its own; B says so rather than
    // pretending, and names what stops it from anywhere.
    let stop = &cli["terminateOnB"];
    assert_eq!(stop["isError"], true, "{stop}");
    let said = stop["text"].as_str().unwrap();
    assert!(said.contains("works only through that process"), "{stop}");
    assert!(said.contains("Ending the session"), "{stop}");
    assert!(
        cli["listedBefore"]["stdout"]
            .as_str()
            .unwrap()
            .contains(id1),
        "{cli}"
    );
    assert_eq!(cli["approve"]["code"], 0, "{}", cli["approve"]);
    // The answer resumed the cell on A; `wait` gives the result on both replicas.
    let on_b = &cli["onB"]["last"];
    assert_eq!(on_b["status"], "finished", "{}", cli["onB"]);
    assert!(
        on_b["text"].as_str().unwrap().contains("finished-1"),
        "{on_b}"
    );
    let on_a = &cli["onA"]["last"];
    assert_eq!(on_a["status"], "finished", "{}", cli["onA"]);
    assert_eq!(on_a["structured"]["value"], "finished-1", "{on_a}");
    let calls = on_a["structured"]["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{on_a}");
    assert_eq!(calls[1]["decision"], "ask", "{on_a}");
    assert_eq!(calls[1]["status"], "ok", "{on_a}");
    assert!(
        cli["againOnA"]["text"]
            .as_str()
            .unwrap()
            .contains("already finished"),
        "{cli}"
    );
    let shown: Value = serde_json::from_str(cli["shown"]["stdout"].as_str().unwrap()).unwrap();
    assert_eq!(shown["approval"]["state"], "approved", "{shown}");
    assert_eq!(shown["approval"]["answered_channel"], "cli", "{shown}");
    assert_eq!(shown["cell"]["id"], cell1, "{shown}");
    assert_eq!(shown["cell"]["status"], "finished", "{shown}");

    // 2. Paused on A (its client did not answer the question), answered by the same session's
    //    client come back through B: B asked it about the paused call.
    let el = &v["elicitation"];
    assert_eq!(el["started"]["status"], "waiting_for_approval", "{el}");
    assert!(!el["questionsOnA"].as_array().unwrap().is_empty(), "{el}");
    let cell2 = el["started"]["cell"].as_str().unwrap();
    let id2 = el["started"]["structured"]["pending"][0]["approval_id"]
        .as_str()
        .unwrap();
    assert_eq!(el["waitOnB"]["isError"], false, "{el}");
    let asked = el["questionsOnB"].as_array().unwrap();
    assert_eq!(asked.len(), 1, "B asked once: {el}");
    assert!(
        asked[0].as_str().unwrap().contains("echo second-2")
            && asked[0].as_str().unwrap().contains("while you were away"),
        "{el}"
    );
    let on_a = &el["onA"]["last"];
    assert_eq!(on_a["status"], "finished", "{}", el["onA"]);
    assert_eq!(on_a["structured"]["value"], "finished-2", "{on_a}");
    assert_eq!(el["onB"]["last"]["status"], "finished", "{}", el["onB"]);
    let shown: Value = serde_json::from_str(el["shown"]["stdout"].as_str().unwrap()).unwrap();
    assert_eq!(shown["approval"]["state"], "approved", "{shown}");
    assert_eq!(shown["approval"]["answered_channel"], "elicitation");
    // The token's principal, not the name the client gave itself.
    assert_eq!(shown["approval"]["answered_by"], "dana");
    assert_eq!(shown["cell"]["id"], cell2, "{shown}");

    // Each call ran exactly once, though two processes saw each cell and two answers could
    // have come in.
    assert_eq!(
        std::fs::read_to_string(work.path().join("count.txt")).unwrap(),
        "first-1\nsecond-1\nfirst-2\nsecond-2\n"
    );
    a.stop();
    b.stop();

    // Both answers are in the team's one audit chain, which still verifies.
    let lines = audit_lines(&rt, &state_url, "team");
    let answers: Vec<&Value> = lines.iter().filter(|l| l["event"] == "approval").collect();
    assert_eq!(answers.len(), 2, "{lines:?}");
    assert_eq!(answers[0]["approval_id"], id1);
    assert_eq!(answers[0]["by"], "carol");
    assert_eq!(answers[0]["channel"], "cli");
    assert_eq!(answers[1]["approval_id"], id2);
    assert_eq!(answers[1]["channel"], "elicitation");
    let ran: Vec<&Value> = lines
        .iter()
        .filter(|l| l["tool"] == "bash" && l["status"] == "ok")
        .collect();
    assert_eq!(ran.len(), 4, "{lines:?}");
    let verify = Command::new(env!("CARGO_BIN_EXE_codemode"))
        .args([
            "audit", "verify", "--state", &state_url, "--stream", "team", "--key",
        ])
        .arg(state.path().join("audit.key"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verify.stdout);
    assert!(
        verify.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&verify.stderr)
    );
    assert!(said.contains("intact"), "{said}");
}
