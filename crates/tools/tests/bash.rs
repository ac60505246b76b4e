//! bash with real processes: output order, exit codes, timeouts, caps and cancellation.

mod common;

use std::time::Duration;

use codemode_spec::ToolErrorKind;
use common::{Bench, all_gone, process_gone, read_pids};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn merges_stdout_and_stderr_in_order_and_runs_in_the_workdir() {
    let b = Bench::new();
    let out = b
        .call(
            "bash",
            json!({"command": "echo one; echo two >&2; echo three; pwd"}),
        )
        .await
        .unwrap();
    let expected = format!("one\ntwo\nthree\n{}\n", b.root.display());
    assert_eq!(out.value["output"], expected);
    assert_eq!(out.value["exit_code"], 0);
    assert_eq!(out.value["truncated"], false);
    assert!(out.value["wall_time_seconds"].as_f64().unwrap() >= 0.0);
    assert!(out.value.get("note").is_none());
    assert!(!out.is_error);
}

#[tokio::test]
async fn non_zero_exit_is_a_result_not_a_failure() {
    let b = Bench::new();
    let out = b
        .call("bash", json!({"command": "echo failing; exit 3"}))
        .await
        .unwrap();
    assert_eq!(out.value["exit_code"], 3);
    assert_eq!(out.value["output"], "failing\n");
    assert!(out.is_error);
}

#[tokio::test]
async fn stdin_is_empty() {
    let b = Bench::new();
    let out = b
        .call(
            "bash",
            json!({"command": "cat; echo after", "timeout_ms": 20_000}),
        )
        .await
        .unwrap();
    assert_eq!(out.value["output"], "after\n");
    assert_eq!(out.value["exit_code"], 0);
}

#[tokio::test]
async fn killed_by_a_signal_has_no_exit_code_and_a_note() {
    let b = Bench::new();
    let out = b
        .call("bash", json!({"command": "echo before; kill -9 $$"}))
        .await
        .unwrap();
    assert_eq!(out.value["exit_code"], Value::Null);
    assert_eq!(out.value["output"], "before\n");
    assert!(
        out.value["note"].as_str().unwrap().contains("signal 9"),
        "{}",
        out.value
    );
    assert!(out.is_error);
}

#[tokio::test]
async fn timeout_kills_the_whole_group_including_grandchildren() {
    let b = Bench::new();
    let command = "sleep 100 & echo $! > pids; bash -c 'sleep 100 & echo $! >> pids; sleep 100' & echo $! >> pids; echo started; sleep 100";
    let out = b
        .call("bash", json!({"command": command, "timeout_ms": 1500}))
        .await
        .unwrap();
    let pids = read_pids(&b.path("pids"));
    assert_eq!(pids.len(), 3, "{pids:?}");
    assert!(
        all_gone(&pids).await,
        "processes survived the timeout: {pids:?}"
    );
    assert_eq!(out.value["exit_code"], Value::Null);
    assert_eq!(out.value["output"], "started\n");
    assert!(
        out.value["note"]
            .as_str()
            .unwrap()
            .contains("timed out after 1500 ms"),
        "{}",
        out.value
    );
    assert!(out.is_error);
    // Far below the 100 s the sleeps asked for.
    assert!(out.value["wall_time_seconds"].as_f64().unwrap() < 30.0);
}

#[tokio::test]
async fn background_processes_holding_the_output_are_killed_after_the_command_ends() {
    let b = Bench::new();
    let out = b
        .call(
            "bash",
            json!({"command": "sleep 100 & echo $! > pid; echo done"}),
        )
        .await
        .unwrap();
    assert_eq!(out.value["output"], "done\n");
    assert_eq!(out.value["exit_code"], 0);
    assert!(
        out.value["note"]
            .as_str()
            .unwrap()
            .contains("Background processes"),
        "{}",
        out.value
    );
    assert!(all_gone(&read_pids(&b.path("pid"))).await);
}

#[tokio::test]
async fn background_processes_with_redirected_output_keep_running() {
    let b = Bench::new();
    let out = b
        .call(
            "bash",
            json!({"command": "sleep 100 > /dev/null 2>&1 & echo $! > pid; echo done"}),
        )
        .await
        .unwrap();
    assert_eq!(out.value["output"], "done\n");
    assert!(out.value.get("note").is_none(), "{}", out.value);
    let pids = read_pids(&b.path("pid"));
    assert!(
        !process_gone(pids[0]),
        "a detached background process was killed"
    );
    unsafe {
        libc::kill(pids[0], libc::SIGKILL);
    }
}

#[tokio::test]
async fn long_output_keeps_head_and_tail() {
    let b = Bench::with(|c| c.max_output_bytes = 1000);
    let out = b
        .call("bash", json!({"command": "seq 1 20000"}))
        .await
        .unwrap();
    let text = out.value["output"].as_str().unwrap();
    assert_eq!(out.value["truncated"], true);
    assert!(text.starts_with("1\n2\n3\n"), "{text}");
    assert!(text.ends_with("19999\n20000\n"), "{text}");
    let total: usize = (1..=20000).map(|i: u32| i.to_string().len() + 1).sum();
    assert!(
        text.contains(&format!("of {total} bytes of output")),
        "{text}"
    );
    assert!(text.len() < 1200, "{} bytes kept", text.len());
    assert_eq!(out.value["exit_code"], 0);
}

#[tokio::test]
async fn cancelling_the_call_kills_the_group() {
    let b = Bench::new();
    let cancel = CancellationToken::new();
    let pid_file = b.path("pids");
    let call = b.call_with(
        "bash",
        json!({"command": "sleep 100 & echo $! > pids; sleep 100 & echo $! >> pids; wait"}),
        cancel.clone(),
    );
    let canceller = async {
        for _ in 0..200 {
            if read_pids(&pid_file).len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        cancel.cancel();
    };
    let (result, ()) = tokio::join!(call, canceller);
    assert_eq!(result.unwrap_err().kind, ToolErrorKind::Cancelled);
    let pids = read_pids(&pid_file);
    assert_eq!(pids.len(), 2);
    assert!(
        all_gone(&pids).await,
        "processes survived cancellation: {pids:?}"
    );
}

#[tokio::test]
async fn dropping_the_call_kills_the_group() {
    let b = Bench::new();
    let pid_file = b.path("pid");
    {
        let call = b.call(
            "bash",
            json!({"command": "sleep 100 & echo $! > pid; wait"}),
        );
        let wait_for_pid = async {
            while read_pids(&pid_file).is_empty() {
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        };
        tokio::select! {
            _ = call => panic!("the command should still be running"),
            _ = tokio::time::timeout(Duration::from_secs(20), wait_for_pid) => {}
        }
    }
    assert!(all_gone(&read_pids(&pid_file)).await);
}

#[tokio::test(flavor = "current_thread")]
async fn a_running_command_does_not_block_the_runtime() {
    let b = Bench::new();
    // On a single-threaded runtime a blocking wait would keep the timer from firing first.
    tokio::select! {
        biased;
        _ = b.call("bash", json!({"command": "sleep 3"})) => panic!("the timer should have fired first"),
        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
    }
}

#[tokio::test]
async fn timeout_above_the_configured_maximum_is_refused() {
    let b = Bench::with(|c| c.bash_timeout_ms = 5_000);
    let err = b
        .error("bash", json!({"command": "true", "timeout_ms": 5_001}))
        .await;
    assert_eq!(err.kind, ToolErrorKind::InvalidArguments);
    assert!(err.message.contains("5000"), "{}", err.message);
    assert_eq!(
        b.tool("bash").spec().input_schema.value()["properties"]["timeout_ms"]["maximum"],
        5_000
    );
}

#[tokio::test]
async fn direct_calls_show_output_and_status() {
    let b = Bench::new();
    let out = b
        .call("bash", json!({"command": "echo hi; exit 2"}))
        .await
        .unwrap();
    match out.content.as_deref() {
        Some([codemode_spec::ContentBlock::Text { text }]) => {
            assert_eq!(text, "hi\n\n\n[exit code 2]");
        }
        other => panic!("unexpected content {other:?}"),
    }
}
