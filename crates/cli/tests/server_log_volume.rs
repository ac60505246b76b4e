//! What an MCP server sends is not copied whole into codemode's own log under the default log
//! level: rmcp logs each message it did not expect (a notification before the handshake, say)
//! at `warn`, whole, so a server could write gigabytes to the host's standard error.

use serde_json::json;

use crate::common;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/preinit-flood-server.cjs"
);

#[test]
fn notifications_before_the_handshake_do_not_flood_the_log() {
    let work = tempfile::tempdir().unwrap();
    let config = tempfile::tempdir().unwrap();
    let servers = json!({"mcpServers": {"flood": {"command": "node", "args": [FIXTURE]}}});
    std::fs::write(config.path().join("mcp.json"), servers.to_string()).unwrap();
    let mut cmd = common::codemode();
    cmd.env_remove("CODEMODE_LOG")
        .args(["tools", "--workdir"])
        .arg(work.path())
        .arg("--config-dir")
        .arg(config.path());
    let out = common::pipe(cmd, None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("flood"),
        "the server still connects and lists its tool: {stdout}"
    );
    // 200 notifications of 100 KB: 20 MB if each is logged whole.
    assert!(
        out.stderr.len() < 64 * 1024,
        "{} bytes of log, starting {:?}",
        out.stderr.len(),
        String::from_utf8_lossy(&out.stderr[..out.stderr.len().min(300)])
    );
}
