//! What a remote MCP server says reaches a person's terminal only as text: codemode's warnings
//! quote why a server is down (its error message), and that text must not move the cursor,
//! retitle the window, write the clipboard or clear the screen.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use serde_json::json;

use crate::common;
use common::Server;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/escaping-http-server.cjs"
);

/// The fixture server, killed when dropped.
/// Starts the fixture and reads the port it chose from its first line.
fn start() -> (Server, u16) {
    let mut child = Command::new("node")
        .arg(FIXTURE)
        .stdout(Stdio::piped())
        .spawn()
        .expect("node starts");
    let stdout = child.stdout.take().unwrap();
    let server = Server(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let port = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("the fixture printed {line:?}, not its port"));
    (server, port)
}

fn terminal_controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|c| c.is_control() && *c != '\n' && *c != '\t')
        .collect()
}

#[test]
fn a_down_servers_error_body_cannot_drive_the_terminal() {
    let (_server, port) = start();
    let work = tempfile::tempdir().unwrap();
    let config = tempfile::tempdir().unwrap();
    let servers = json!({"mcpServers": {"remote": {
        "type": "http", "url": format!("http://127.0.0.1:{port}/mcp")}}});
    std::fs::write(config.path().join("mcp.json"), servers.to_string()).unwrap();
    let mut cmd = common::codemode();
    cmd.args(["tools", "--workdir"])
        .arg(work.path())
        .arg("--config-dir")
        .arg(config.path());
    let out = common::pipe(cmd, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("remote") && stderr.contains("end of message"),
        "the warning quotes the server's answer: {stderr}"
    );
    let controls = terminal_controls(&stderr);
    assert!(
        controls.is_empty(),
        "control characters {controls:?} reach the terminal: {stderr:?}"
    );
}
