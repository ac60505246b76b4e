//! `codemode serve --listen` driven by the official MCP SDK client over streamable HTTP.

use crate::common;
use common::Server;
use common::testbed;

use std::process::{Command, Stdio};

use serde_json::Value;

/// Starts the server on a free loopback port and returns it with its URL.
fn serve(extra: &[&str]) -> (Server, String, tempfile::TempDir) {
    let config = tempfile::tempdir().unwrap();
    let (child, url) = common::start_serving(
        Command::new(env!("CARGO_BIN_EXE_codemode"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config-dir"])
            .arg(config.path())
            .arg("--state-dir")
            .arg(config.path().join("state"))
            .args(extra),
    );
    (Server(child), url, config)
}

fn client(url: &str, token: &str) -> Value {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/http-client.cjs"
    );
    let out = Command::new("node")
        .arg(script)
        .arg(testbed())
        .arg(url)
        .arg(token)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap()
}

#[test]
fn two_http_sessions_keep_their_own_store_and_the_token_is_required() {
    let audit = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let audit_s = audit.to_str().unwrap().to_string();
    let (_server, url, _config) =
        serve(&["--token", "s3cret", "--mode", "only", "--audit", &audit_s]);
    let v = client(&url, "s3cret");
    assert_eq!(v["unauthorized"], 401, "{v}");
    assert_eq!(
        v["tools"],
        serde_json::json!(["codemode", "wait"]),
        "mode only offers codemode alone, and wait for its cells"
    );
    assert_eq!(v["stored"]["value"], "a");
    assert_eq!(v["again"]["value"], "a", "the same session sees its store");
    assert_eq!(v["other"]["value"], Value::Null, "another session does not");
    let many: Vec<i64> = v["many"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect();
    assert_eq!(many, (0..16).map(|i| i * 2).collect::<Vec<_>>());
    assert_eq!(v["listed"]["value"], true, "{v}");
    let audit = std::fs::read_to_string(&audit).unwrap();
    assert!(
        audit.contains("client-a"),
        "the audit log names the MCP client: {audit}"
    );
}

#[test]
fn a_public_address_without_a_token_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_codemode"))
        .args(["serve", "--listen", "0.0.0.0:0"])
        .env_remove("CODEMODE_SERVE_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--token"));
}
