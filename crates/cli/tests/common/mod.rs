//! Running the real `codemode` binary with a script on standard input.
#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// The `codemode` binary under test: `CODEMODE_TEST_BIN` when set (worktrees that share one
/// target directory overwrite each other's `target/debug/codemode`; point this at your own
/// `target/debug/deps/codemode-<hash>`), else the one cargo built.
pub fn bin() -> std::path::PathBuf {
    std::env::var_os("CODEMODE_TEST_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_codemode").into())
}

/// A `codemode` command, ready for arguments.
pub fn codemode() -> Command {
    let mut cmd = Command::new(bin());
    cmd.env("XDG_STATE_HOME", test_state_home());
    cmd
}

/// A state directory of this test process's own: tests never read or write the state (audit
/// key, state.db) of the person running them, nor share it with another test binary.
pub fn test_state_home() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temporary directory"))
        .path()
}

/// Runs `cmd` with `script` on standard input (or none) and collects its output.
pub fn pipe(mut cmd: Command, script: Option<&str>) -> Output {
    cmd.stdin(if script.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("codemode starts");
    if let Some(text) = script {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

/// Exit code, standard output parsed as JSON (`null` when it is not), and standard error.
pub fn json_outcome(out: Output) -> (Option<i32>, Value, String) {
    let value = serde_json::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap_or(Value::Null);
    (
        out.status.code(),
        value,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The npm testbed's node_modules (pinned MCP servers and SDK clients), installed by scripts/test.
pub fn testbed() -> std::path::PathBuf {
    let p = std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testbed/node_modules"
    ));
    assert!(
        p.join("@modelcontextprotocol/sdk").exists(),
        "the npm testbed is missing: run scripts/test (it runs `npm ci --prefix testbed`)"
    );
    p
}

/// The address `codemode serve --listen` prints on stderr ("serving MCP at URL"), read from its
/// lines; the lines after it stay for the caller.
pub fn serving_url(
    lines: &mut std::io::Lines<std::io::BufReader<std::process::ChildStderr>>,
) -> String {
    loop {
        let line = lines
            .next()
            .expect("the server printed its address before it stopped")
            .expect("the server's stderr is readable");
        if let Some(rest) = line.split("serving MCP at ").nth(1) {
            return rest
                .split(' ')
                .next()
                .unwrap_or_default()
                .trim()
                .to_string();
        }
    }
}

/// Runs a client program that must succeed and print one JSON value (its last line).
pub fn client_json(mut cmd: Command) -> Value {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim().lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// The JSON messages a process writes one per line (lines that are not JSON are skipped), read
/// on a thread of their own so a test can wait for them with a timeout.
pub fn json_lines(out: std::process::ChildStdout) -> std::sync::mpsc::Receiver<Value> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                let _ = tx.send(v);
            }
        }
    });
    rx
}

/// Starts a `codemode serve --listen` command with stdin and stdout closed, waits for the
/// address it prints, and keeps draining its stderr so it never blocks on a full pipe.
pub fn start_serving(cmd: &mut Command) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("codemode serve starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut lines = std::io::BufReader::new(stderr).lines();
    let url = serving_url(&mut lines);
    std::thread::spawn(move || for _ in lines {});
    (child, url)
}

/// The `host:port` of a served URL such as `http://127.0.0.1:4000/mcp`, for raw sockets.
pub fn socket_address(url: &str) -> String {
    url.trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A fresh database on the test server, and its URL; `tag` keeps the tests of one run apart.
pub fn fresh_database(rt: &tokio::runtime::Runtime, url: &str, tag: &str) -> String {
    let name = format!("cm_cli_{tag}_{}", std::process::id());
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

/// The test PostgreSQL server's URL (`scripts/with-postgres` sets it), or `None` after saying
/// on stderr that `what` is skipped and how to run it.
pub fn postgres_url_or_skip(what: &str, test_binary: &str) -> Option<String> {
    let url = std::env::var("CODEMODE_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.trim().is_empty());
    if url.is_none() {
        eprintln!(
            "SKIPPED: {what}, because CODEMODE_TEST_POSTGRES_URL is not set; run with `scripts/with-postgres cargo test -p codemode-cli --test {test_binary}`"
        );
    }
    url
}

/// A `codemode serve` process, killed and reaped when dropped.
pub struct Server(pub std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
