//! `codemode serve` stops cleanly on SIGTERM, SIGINT and SIGHUP: it exits, and no process of
//! the upstream servers it started is left (issue 13, item 6).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../mcp/tests/fixtures/misbehaving-server.cjs"
);
const TESTBED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testbed/node_modules");

/// Processes whose process group is `pgid`.
fn group_members(pgid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command name: state, ppid, pgrp.
        let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split(' ').collect();
        if fields.first() == Some(&"Z") {
            continue;
        }
        if fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid) {
            out.push(pid);
        }
    }
    out
}

fn wait_for_file(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.lines().count() >= 2
        {
            return s;
        }
        assert!(Instant::now() < deadline, "the upstream never started");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stops_cleanly_on(signal: &str, http: bool) {
    let dir = tempfile::tempdir().unwrap();
    // Not in the configuration directory, which the servers see read-only.
    let out = tempfile::tempdir().unwrap();
    let pids = out.path().join("pids");
    // Like `npx`: a launcher whose child outlives a plain kill of the server process.
    let launcher = format!(
        "echo $$ > {p}; sleep 300 & echo $! >> {p}; exec node {FIXTURE} {TESTBED}",
        p = pids.display()
    );
    let servers = serde_json::json!({"mcpServers": {
        "a": {"command": "sh", "args": ["-c", launcher]},
        "b": {"command": "sh", "args": ["-c", format!("sleep 300 & exec node {FIXTURE} {TESTBED}")]}
    }});
    std::fs::write(dir.path().join("mcp.json"), servers.to_string()).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_codemode"));
    cmd.args(["serve", "--no-builtins", "--mode", "only", "--config-dir"])
        .arg(dir.path())
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--workdir")
        .arg(dir.path());
    if http {
        cmd.args(["--listen", "127.0.0.1:0"]);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let leader: i32 = wait_for_file(&pids)
        .lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Let both servers finish starting.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        group_members(leader).len() >= 2,
        "the upstream and its child run in their own group"
    );
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "codemode serve did not stop on {signal}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{signal}: {exit:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !group_members(leader).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        group_members(leader),
        Vec::<i32>::new(),
        "{signal}: no process of the upstream's group is left"
    );
}

#[test]
fn sigterm_over_stdio() {
    stops_cleanly_on("TERM", false);
}

#[test]
fn sigint_over_stdio() {
    stops_cleanly_on("INT", false);
}

#[test]
fn sighup_over_http() {
    stops_cleanly_on("HUP", true);
}

#[test]
fn sigterm_over_http() {
    stops_cleanly_on("TERM", true);
}
