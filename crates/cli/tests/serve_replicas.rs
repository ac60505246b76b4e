//! Two `codemode serve` replicas on loopback sharing one PostgreSQL, driven by the official
//! MCP SDK client: one budget for both, sessions that move between them, one audit chain, and
//! traces received by a real OTLP/HTTP receiver in the test.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::Value;

const PG_URL_VAR: &str = "CODEMODE_TEST_POSTGRES_URL";

fn testbed() -> PathBuf {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testbed/node_modules"
    ));
    assert!(
        p.join("@modelcontextprotocol/sdk").exists(),
        "the npm testbed is missing: run scripts/test (it runs `npm ci --prefix testbed`)"
    );
    p
}

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
        let mut child = Command::new(env!("CARGO_BIN_EXE_codemode"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("CODEMODE_SERVE_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines
                .next()
                .expect("the replica printed its address")
                .unwrap();
            if let Some(rest) = line.split("serving MCP at ").nth(1) {
                break rest.trim().to_string();
            }
        };
        std::thread::spawn(move || for _ in lines {});
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

/// A fresh database on the test server, and its URL.
fn fresh_database(rt: &tokio::runtime::Runtime, url: &str) -> String {
    let name = format!("cm_cli_{}", std::process::id());
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        for sql in [
            format!("DROP DATABASE IF EXISTS {name}"),
            format!("CREATE DATABASE {name}"),
        ] {
            client.batch_execute(&sql).await.unwrap();
        }
    });
    let (head, _) = url.rsplit_once('/').unwrap();
    format!("{head}/{name}")
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
    let Some(pg) = std::env::var(PG_URL_VAR)
        .ok()
        .filter(|u| !u.trim().is_empty())
    else {
        eprintln!(
            "SKIPPED: two replicas on PostgreSQL, because {PG_URL_VAR} is not set; run with `scripts/with-postgres cargo test -p codemode-cli --test serve_replicas`"
        );
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let state_url = fresh_database(&rt, &pg);
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
