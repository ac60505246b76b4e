//! A script fires many calls at one file at once (`Promise.all`). Every change a tool reports
//! as done must be in the file afterwards: a call may be refused (and say so), but never report
//! success for a change a concurrent call then threw away.

mod common;

use codemode_spec::{Provenance, RunContext};
use common::Bench;
use futures::future::join_all;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const ROUNDS: usize = 20;
const EDITS: usize = 8;

fn run_ctx() -> RunContext {
    RunContext {
        provenance: Provenance::model("parallel", "s"),
        cancel: CancellationToken::new(),
    }
}

fn lines(round: usize) -> String {
    (0..EDITS)
        .map(|i| format!("round {round} line {i}: old\n"))
        .collect()
}

/// What the edits that reported success changed, and whether the file still has each change.
fn lost_changes(file: &str, round: usize, succeeded: &[usize]) -> Vec<usize> {
    succeeded
        .iter()
        .copied()
        .filter(|i| !file.contains(&format!("round {round} line {i}: new\n")))
        .collect()
}

/// Edits of different lines of one file, all judged before any runs (as the gate admits a
/// script's calls made together), then run together.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_edits_of_one_file_lose_no_reported_change() {
    let b = Bench::new();
    let edit = b.tool("edit");
    let mut successes = 0;
    for round in 0..ROUNDS {
        let path = b.put("shared.txt", lines(round));
        let prepared: Vec<_> = (0..EDITS)
            .map(|i| {
                edit.prepare(json!({
                    "path": "shared.txt",
                    "old_string": format!("line {i}: old"),
                    "new_string": format!("line {i}: new"),
                }))
                .unwrap()
            })
            .collect();
        let results = join_all(prepared.into_iter().map(|p| p.run(run_ctx()))).await;
        let succeeded: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_ok())
            .map(|(i, _)| i)
            .collect();
        for r in results.iter().filter_map(|r| r.as_ref().err()) {
            assert!(r.message.contains("call it again"), "{}", r.message);
        }
        successes += succeeded.len();
        let file = std::fs::read_to_string(&path).unwrap();
        let lost = lost_changes(&file, round, &succeeded);
        assert!(
            lost.is_empty(),
            "round {round}: edits {lost:?} reported success but their change is gone:\n{file}"
        );
    }
    assert!(successes >= ROUNDS, "too few edits ran: {successes}");
}

/// Edits each prepared and run at once, as direct calls in parallel would be, mixed with
/// writes of another file in the same directory (which must not disturb them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_calls_of_edit_lose_no_reported_change() {
    let b = Bench::new();
    for round in 0..ROUNDS {
        let path = b.put("shared.txt", lines(round));
        let calls = (0..EDITS).map(|i| {
            let args = json!({
                "path": "shared.txt",
                "old_string": format!("line {i}: old"),
                "new_string": format!("line {i}: new"),
            });
            let b = &b;
            async move { b.call("edit", args).await }
        });
        let writes = (0..EDITS).map(|i| {
            let b = &b;
            async move {
                b.call(
                    "write",
                    json!({"path": format!("other-{i}.txt"), "content": "x"}),
                )
                .await
            }
        });
        let (results, written) = tokio::join!(join_all(calls), join_all(writes));
        assert!(written.iter().all(Result::is_ok), "{written:?}");
        let succeeded: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_ok())
            .map(|(i, _)| i)
            .collect();
        let file = std::fs::read_to_string(&path).unwrap();
        let lost = lost_changes(&file, round, &succeeded);
        assert!(
            lost.is_empty(),
            "round {round}: edits {lost:?} reported success but their change is gone:\n{file}"
        );
    }
}

/// An edit racing a write of the same file: whichever comes second sees the first's result or
/// is refused; the write's content is never replaced by an edit of the content it replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_edit_never_undoes_a_write_it_raced() {
    let b = Bench::new();
    let (edit, write) = (b.tool("edit"), b.tool("write"));
    for round in 0..ROUNDS * 2 {
        let path = b.put("shared.txt", "before\n");
        let e = edit
            .prepare(json!({"path": "shared.txt", "old_string": "before", "new_string": "edited"}))
            .unwrap();
        let w = write
            .prepare(json!({"path": "shared.txt", "content": format!("written {round}\n")}))
            .unwrap();
        let (e, w) = tokio::join!(e.run(run_ctx()), w.run(run_ctx()));
        let file = std::fs::read_to_string(&path).unwrap();
        if w.is_ok() && e.is_ok() {
            panic!(
                "round {round}: both the edit and the write of the same file succeeded, yet one was judged on content the other replaced; the file holds {file:?}"
            );
        }
        if w.is_ok() {
            assert_eq!(file, format!("written {round}\n"));
        }
        if e.is_ok() {
            assert_eq!(file, "edited\n");
        }
    }
}

const OTHER_PROCESS_ENV: &str = "CONCURRENT_EDITS_OTHER_PROCESS";
const CROSS_EDITS: usize = 30;

fn cross_lines() -> String {
    ["here", "there"]
        .iter()
        .flat_map(|who| (0..CROSS_EDITS).map(move |i| format!("<{who}> line {i}: old\n")))
        .collect()
}

/// Edits the `who` lines of the file at `path`, one call after another, with tools of their
/// own; the indices of the edits that reported success.
async fn edit_lines(root: &std::path::Path, who: &str) -> Vec<usize> {
    let tools = codemode_tools::builtin_tools(&codemode_tools::ToolsConfig::new(root));
    let edit = tools.iter().find(|t| t.spec().name == "edit").unwrap();
    let mut succeeded = Vec::new();
    for i in 0..CROSS_EDITS {
        let prepared = edit
            .prepare(json!({
                "path": "shared.txt",
                "old_string": format!("<{who}> line {i}: old"),
                "new_string": format!("<{who}> line {i}: new"),
            }))
            .unwrap();
        match prepared.run(run_ctx()).await {
            Ok(_) => succeeded.push(i),
            Err(e) => assert!(e.message.contains("call it again"), "{}", e.message),
        }
    }
    succeeded
}

/// Not a test of its own: the body of the other codemode process, which edits the same file.
#[tokio::test]
async fn other_process_edits() {
    let Ok(root) = std::env::var(OTHER_PROCESS_ENV) else {
        return;
    };
    let succeeded = edit_lines(std::path::Path::new(&root), "there").await;
    println!("SUCCEEDED {}", json!(succeeded));
}

/// Two codemode processes (two agents, two replicas on one machine) editing one file: neither
/// may report an edit that the other then throws away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_from_two_processes_lose_no_reported_change() {
    for round in 0..5 {
        let b = Bench::new();
        let path = b.put("shared.txt", cross_lines());
        let other = start_other_process("other_process_edits", OTHER_PROCESS_ENV, &b.root);
        let here = edit_lines(&b.root, "here").await;
        let there = what_the_other_process_did(other);
        let file = std::fs::read_to_string(&path).unwrap();
        for (who, succeeded) in [("here", &here), ("there", &there)] {
            let lost: Vec<_> = succeeded
                .iter()
                .filter(|i| !file.contains(&format!("<{who}> line {i}: new\n")))
                .collect();
            assert!(
                lost.is_empty(),
                "round {round}: {who}'s edits {lost:?} reported success and are gone"
            );
        }
    }
}

/// A program that holds the file's lock (any that can open it can) makes a change wait a
/// bounded time and fail with nothing changed, not hang the call.
#[tokio::test]
async fn an_edit_of_a_file_another_process_keeps_locked_fails_with_nothing_changed() {
    let b = Bench::new();
    let path = b.put("held.txt", "keep: old\n");
    let holder = std::fs::File::open(&path).unwrap();
    rustix::fs::flock(&holder, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let err = b
        .call(
            "edit",
            json!({"path": "held.txt", "old_string": "old", "new_string": "new"}),
        )
        .await
        .expect_err("the file stays locked");
    assert!(err.message.contains("locked (flock)"), "{}", err.message);
    assert_eq!(err.effect, codemode_spec::Effect::None);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep: old\n");
}

/// Writes that each create the same new file, judged together (a script's `Promise.all`) and
/// run together: whichever comes second finds the file the first created and is refused, as it
/// is for a file that existed; two cannot both report creating it while one replaced the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_writes_creating_one_file_report_one_creation() {
    let b = Bench::new();
    let write = b.tool("write");
    for round in 0..ROUNDS {
        let name = format!("new-{round}.txt");
        let prepared: Vec<_> = (0..EDITS)
            .map(|i| {
                write
                    .prepare(json!({"path": name, "content": format!("writer {i}\n")}))
                    .unwrap()
            })
            .collect();
        let results = join_all(prepared.into_iter().map(|p| p.run(run_ctx()))).await;
        let succeeded: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_ok())
            .map(|(i, _)| i)
            .collect();
        for r in results.iter().filter_map(|r| r.as_ref().err()) {
            assert!(r.message.contains("call it again"), "{}", r.message);
            assert_eq!(r.effect, codemode_spec::Effect::None);
        }
        let file = std::fs::read_to_string(b.path(&name)).unwrap();
        assert_eq!(
            succeeded.len(),
            1,
            "round {round}: writers {succeeded:?} all reported creating {name}, which holds {file:?}"
        );
        assert_eq!(file, format!("writer {}\n", succeeded[0]));
    }
}

/// A write judged when its file did not exist, of a file another program created before the
/// write ran: it does not replace that file while reporting that it created it.
#[tokio::test]
async fn a_write_judged_as_creating_does_not_replace_a_file_created_meanwhile() {
    let b = Bench::new();
    let prepared = b
        .tool("write")
        .prepare(json!({"path": "notes.md", "content": "the model's notes\n"}))
        .unwrap();
    let path = b.put("notes.md", "the user's notes, written meanwhile\n");
    let err = prepared
        .run(run_ctx())
        .await
        .expect_err("the file the write was judged to create exists now");
    assert!(err.message.contains("call it again"), "{}", err.message);
    assert_eq!(err.effect, codemode_spec::Effect::None);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "the user's notes, written meanwhile\n"
    );
}

const OTHER_CREATOR_ENV: &str = "CONCURRENT_EDITS_OTHER_CREATOR";
const CROSS_CREATES: usize = 40;

/// Creates `new-0.txt`, `new-1.txt`, … beneath `root` with `write`, each holding `who`; the
/// indices of the writes that reported creating their file (rather than replacing one).
async fn create_files(root: &std::path::Path, who: &str) -> Vec<usize> {
    let tools = codemode_tools::builtin_tools(&codemode_tools::ToolsConfig::new(root));
    let write = tools.iter().find(|t| t.spec().name == "write").unwrap();
    let mut succeeded = Vec::new();
    for i in 0..CROSS_CREATES {
        let prepared = write
            .prepare(json!({"path": format!("new-{i}.txt"), "content": who}))
            .unwrap();
        match prepared.run(run_ctx()).await {
            Ok(out) if format!("{:?}", out.value).contains("Created") => succeeded.push(i),
            Ok(_) => {}
            Err(e) => assert!(e.message.contains("call it again"), "{}", e.message),
        }
    }
    succeeded
}

/// Not a test of its own: the body of the other codemode process, which creates the same files.
#[tokio::test]
async fn other_process_creates() {
    let Ok(root) = std::env::var(OTHER_CREATOR_ENV) else {
        return;
    };
    let succeeded = create_files(std::path::Path::new(&root), "there").await;
    println!("SUCCEEDED {}", json!(succeeded));
}

/// Two codemode processes creating the same new files: for each, at most one may report that
/// it created it (the other, coming second, replaces it knowingly or is refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creations_from_two_processes_report_one_creation_each() {
    for round in 0..5 {
        let b = Bench::new();
        let other = start_other_process("other_process_creates", OTHER_CREATOR_ENV, &b.root);
        let here = create_files(&b.root, "here").await;
        let there = what_the_other_process_did(other);
        let both: Vec<_> = here.iter().filter(|i| there.contains(i)).collect();
        assert!(
            both.is_empty(),
            "round {round}: both processes reported creating new-N.txt for N in {both:?}"
        );
    }
}

/// Changes made together of a file another process keeps locked each wait the bounded time
/// once, together, not one after another behind this process's own lock: six edits end in
/// about 10 s, not 60 (and their threads are not held for a minute after the script ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_edits_of_a_file_another_process_keeps_locked_each_wait_the_bound_once() {
    let b = Bench::new();
    let path = b.put("held.txt", lines(0));
    let holder = std::fs::File::open(&path).unwrap();
    rustix::fs::flock(&holder, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let started = std::time::Instant::now();
    let calls = (0..6).map(|i| {
        let args = json!({
            "path": "held.txt",
            "old_string": format!("line {i}: old"),
            "new_string": format!("line {i}: new"),
        });
        let b = &b;
        async move { b.call("edit", args).await }
    });
    let results = join_all(calls).await;
    let took = started.elapsed();
    for r in &results {
        let err = r.as_ref().expect_err("the file stays locked");
        assert_eq!(err.effect, codemode_spec::Effect::None);
    }
    assert!(
        took < std::time::Duration::from_secs(30),
        "six edits of a locked file took {took:?}: each waited for the one before it"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), lines(0));
}

/// Runs this test binary's `test` (one of the `other_process_*` bodies) as a second process on
/// `root`, given through the environment variable `env`.
fn start_other_process(test: &str, env: &str, root: &std::path::Path) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(env, root)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// The indices the other process reported on its `SUCCEEDED [..]` line, once it ended well.
fn what_the_other_process_did(other: std::process::Child) -> Vec<usize> {
    let out = other.wait_with_output().unwrap();
    assert!(out.status.success());
    // Wherever the test harness put it (on the line that names the test).
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    said.lines()
        .find_map(|l| l.split_once("SUCCEEDED ").map(|(_, list)| list))
        .map(|l| serde_json::from_str(l).unwrap())
        .unwrap_or_else(|| panic!("the other process reports: {said}"))
}
