//! The journal: a call that can change something is recorded before it runs, so a process
//! killed in the middle of it (a `bash` command can `kill -9` its parent) still leaves a trace.
//! Attacked here: the line must exist while the tool runs, on a file and on shared streams; a
//! journal that cannot be written must stop the call before it runs, and every later call.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use codemode_gate::{
    AuditLog, Gate, Registry, Stage, UnfinishedCall, started_path, unfinished_calls,
    unfinished_stream_calls,
};
use codemode_state::{Clock, MemoryStore, SqliteOptions, SqliteStore, StateStore};
use common::{TestTool, builder, object_schema, req, script, test_key};
use serde_json::json;

/// A gate with a slow tool `w` that can change things and a read-only tool `r`, and the run
/// counters of both.
fn gate(audit: AuditLog) -> (Gate, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let reg = Registry::new();
    let mut w = TestTool::new("w", object_schema());
    w.delay_ms = 400;
    let r = TestTool::new("r", object_schema()).read_only();
    let (w_runs, r_runs) = (w.runs.clone(), r.runs.clone());
    reg.register(Arc::new(w)).unwrap();
    reg.register(Arc::new(r)).unwrap();
    (builder(&reg).audit(audit).build().unwrap(), w_runs, r_runs)
}

async fn wait_until_running(runs: &AtomicUsize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while runs.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the tool never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn tools(calls: &[UnfinishedCall]) -> Vec<String> {
    calls
        .iter()
        .map(|c| c.record["tool"].as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test]
async fn a_call_that_can_change_something_is_in_the_journal_while_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (gate, w_runs, _) = gate(AuditLog::open_with_key(&path, test_key()).unwrap());
    let running = tokio::spawn({
        let gate = gate.clone();
        async move { gate.call(req("w", json!({"path": "x"}), script("a"))).await }
    });
    wait_until_running(&w_runs).await;
    // As if the process were killed now: the log has nothing, the journal has the call.
    assert!(common::audit_lines(&path).is_empty());
    let open = unfinished_calls(&path, Some(&test_key())).unwrap();
    assert_eq!(tools(&open), ["w"]);
    assert_eq!(open[0].record["event"], "started");
    assert_eq!(open[0].record["decision"], "allow");
    assert!(
        open[0].summary().contains(r#"{"path":"x"}"#),
        "{}",
        open[0].summary()
    );

    running.await.unwrap().unwrap();
    assert!(
        unfinished_calls(&path, Some(&test_key()))
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_read_only_call_is_not_journalled_and_a_refused_one_never_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (gate, _, r_runs) = gate(AuditLog::open_with_key(&path, test_key()).unwrap());
    gate.call(req("r", json!({}), script("a"))).await.unwrap();
    assert_eq!(r_runs.load(Ordering::SeqCst), 1);
    // Refused at validation: nothing ran, its one outcome line says so.
    let err = gate
        .call(req("w", json!({"path": 3}), script("a")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Validate);
    let journal = std::fs::read_to_string(started_path(&path)).unwrap();
    assert_eq!(journal, "", "nothing that could change anything ran");
    assert_eq!(common::audit_lines(&path).len(), 2);
}

#[tokio::test]
async fn a_journal_that_cannot_be_written_stops_the_call_before_it_runs_and_every_later_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (gate, w_runs, r_runs) = gate(AuditLog::open_with_key(&path, test_key()).unwrap());
    gate.call(req("w", json!({}), script("a"))).await.unwrap();
    assert_eq!(w_runs.load(Ordering::SeqCst), 1);
    // Someone who can write the journal breaks its chain: appending onto it would extend a
    // chain that no longer verifies, so the gate must refuse rather than run unjournalled.
    let journal = started_path(&path);
    let mut text = std::fs::read_to_string(&journal).unwrap();
    text.push_str("{\"forged\":true}\n");
    std::fs::write(&journal, text).unwrap();

    let err = gate
        .call(req("w", json!({}), script("a")))
        .await
        .unwrap_err();
    assert!(err.message.contains("was not run"), "{}", err.message);
    assert_eq!(w_runs.load(Ordering::SeqCst), 1, "the call must not run");
    let err = gate
        .call(req("r", json!({}), script("a")))
        .await
        .unwrap_err();
    assert!(err.message.contains("audit log"), "{}", err.message);
    assert_eq!(
        r_runs.load(Ordering::SeqCst),
        0,
        "later calls are refused too"
    );
    // The broken journal is reported, not passed over.
    assert!(unfinished_calls(&path, Some(&test_key())).is_err());
}

async fn stream_journal_holds_the_call_while_it_runs(store: Arc<dyn StateStore>) {
    let audit = AuditLog::stream(store.clone(), "team", test_key()).unwrap();
    let (gate, w_runs, _) = gate(audit);
    gate.call(req("r", json!({}), script("a"))).await.unwrap();
    let running = tokio::spawn({
        let gate = gate.clone();
        async move { gate.call(req("w", json!({"path": "y"}), script("a"))).await }
    });
    wait_until_running(&w_runs).await;
    let open = unfinished_stream_calls(store.as_ref(), "team", Some(&test_key()))
        .await
        .unwrap();
    assert_eq!(tools(&open), ["w"], "{}", store.describe());
    running.await.unwrap().unwrap();
    let open = unfinished_stream_calls(store.as_ref(), "team", Some(&test_key()))
        .await
        .unwrap();
    assert!(open.is_empty(), "{open:?}");
    let journal = store.read_audit("team.started", 0, 100).await.unwrap();
    assert_eq!(journal.len(), 1, "only the call that can change something");
}

#[tokio::test]
async fn streams_in_memory_and_sqlite_journal_calls_before_they_run() {
    stream_journal_holds_the_call_while_it_runs(Arc::new(MemoryStore::new(Clock::system()))).await;
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(
        &dir.path().join("state.db"),
        SqliteOptions::default(),
        Clock::system(),
    )
    .await
    .unwrap();
    stream_journal_holds_the_call_while_it_runs(Arc::new(sqlite)).await;
}

#[tokio::test]
async fn a_postgres_stream_journals_calls_before_they_run() {
    let Some(url) = std::env::var("CODEMODE_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
    else {
        eprintln!(
            "SKIPPED: the journal's PostgreSQL test, because CODEMODE_TEST_POSTGRES_URL is not set; run it with `scripts/with-postgres cargo test -p codemode-gate --test suite journal::`"
        );
        return;
    };
    let schema = format!(
        "cm_journal_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..16]
    );
    let options = codemode_state::PostgresOptions {
        schema: Some(schema),
        ..codemode_state::PostgresOptions::default()
    };
    let store = codemode_state::PostgresStore::open(&url, options, Clock::system())
        .await
        .unwrap();
    stream_journal_holds_the_call_while_it_runs(Arc::new(store)).await;
}

#[test]
fn a_stream_cannot_be_named_like_another_streams_journal() {
    let store: Arc<dyn StateStore> = Arc::new(MemoryStore::new(Clock::system()));
    let err = AuditLog::stream(store, "team.started", test_key())
        .err()
        .expect("refused");
    assert!(err.to_string().contains("journals"), "{err}");
}

/// The attack a red team found: a command cuts its own start (and its script's) from the end
/// of the journal, deletes the journal's head so the cut cannot show, and kills codemode. The
/// journal's head is checked like the log's: missing, `verify` fails; deleted while a process
/// writes, the next call is refused.
#[tokio::test]
async fn a_journal_whose_head_was_deleted_fails_and_stops_later_calls() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (gate, w_runs, _) = gate(AuditLog::open_with_key(&path, test_key()).unwrap());
    for _ in 0..3 {
        gate.call(req("w", json!({}), script("a"))).await.unwrap();
    }
    let journal = started_path(&path);
    let kept: String = std::fs::read_to_string(&journal)
        .unwrap()
        .lines()
        .take(1)
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&journal, kept).unwrap();
    std::fs::remove_file(codemode_gate::head_path(&journal)).unwrap();

    let err = unfinished_calls(&path, Some(&test_key())).unwrap_err();
    assert!(err.to_string().contains("head file"), "{err}");
    let err = gate
        .call(req("w", json!({}), script("a")))
        .await
        .unwrap_err();
    assert!(err.message.contains("was not run"), "{}", err.message);
    assert_eq!(w_runs.load(Ordering::SeqCst), 3);
}

/// An MCP server's read-only hint is its own claim: its calls are journalled anyway.
#[tokio::test]
async fn an_mcp_tool_that_says_it_is_read_only_is_journalled_anyway() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let reg = Registry::new();
    let mut tool = TestTool::new("mcp__srv__lookup", object_schema()).read_only();
    tool.spec.namespace = Some("mcp__srv".into());
    reg.register(Arc::new(tool)).unwrap();
    let gate = builder(&reg)
        .audit(AuditLog::open_with_key(&path, test_key()).unwrap())
        .build()
        .unwrap();
    gate.call(req("mcp__srv__lookup", json!({}), script("a")))
        .await
        .unwrap();
    let journal = std::fs::read_to_string(started_path(&path)).unwrap();
    assert!(journal.contains("mcp__srv__lookup"), "{journal}");
    let line = &common::audit_lines(&path)[0];
    assert!(line["journal_id"].as_str().is_some(), "{line}");
}

/// The preview is 200 characters, so padding can make a command look harmless there; the
/// journal keeps the arguments whole (or both ends of very large ones).
#[tokio::test]
async fn the_journal_keeps_the_whole_arguments_a_padded_preview_hides() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (gate, _, _) = gate(AuditLog::open_with_key(&path, test_key()).unwrap());
    let padded = format!("echo hello{}; echo PAYLOAD > pwn.txt", " ".repeat(3000));
    gate.call(req("w", json!({"path": padded}), script("a")))
        .await
        .unwrap();
    let huge = format!("start{}end-of-it", "x".repeat(1536 * 1024));
    gate.call(req("w", json!({"path": huge}), script("a")))
        .await
        .unwrap();
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(started_path(&path))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        !lines[0]["args_preview"]
            .as_str()
            .unwrap()
            .contains("PAYLOAD")
    );
    let whole: serde_json::Value =
        serde_json::from_str(lines[0]["args_text"].as_str().unwrap()).unwrap();
    assert_eq!(whole["path"], padded);
    assert!(lines[1]["args_text"].is_null());
    assert!(
        lines[1]["args_text_start"]
            .as_str()
            .unwrap()
            .contains("start")
    );
    assert!(
        lines[1]["args_text_end"]
            .as_str()
            .unwrap()
            .ends_with("end-of-it\"}")
    );
    assert!(lines[1]["args_bytes"].as_u64().unwrap() > 1536 * 1024);
}

/// Red team: 50,000 control bytes each side of a payload make a `bash` command of 100 KB (under
/// Linux's 128 KiB for one argument) but 600 KB of JSON, whose middle the journal dropped: the
/// command that ran was in neither the log nor the journal. Any command fits whole now.
#[tokio::test]
async fn a_command_padded_with_control_bytes_is_journalled_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (gate, _, _) = gate(AuditLog::open_with_key(&path, test_key()).unwrap());
    let pad = "\u{1}".repeat(64 * 1024);
    let command = format!(": '{pad}'; echo SECRET-PAYLOAD > marker; : '{pad}'");
    assert!(command.len() <= 128 * 1024 + 64);
    gate.call(req("w", json!({"path": command}), script("a")))
        .await
        .unwrap();
    let journal = std::fs::read_to_string(started_path(&path)).unwrap();
    let line: serde_json::Value = serde_json::from_str(journal.lines().next().unwrap()).unwrap();
    let whole: serde_json::Value =
        serde_json::from_str(line["args_text"].as_str().expect("kept whole")).unwrap();
    assert_eq!(whole["path"], command);
}

/// Given a symlink to the log, the head and the journal go beside the real file (so they are
/// the ones protected, and the ones every other process and `verify` use).
#[tokio::test]
async fn a_log_named_through_a_symlink_keeps_head_and_journal_beside_the_real_file() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("log.jsonl");
    std::fs::write(&real, "").unwrap();
    let alias = dir.path().join("alias.jsonl");
    std::os::unix::fs::symlink(&real, &alias).unwrap();
    let log = AuditLog::open_with_key(&alias, test_key()).unwrap();
    assert_eq!(log.path().unwrap(), real.canonicalize().unwrap());
    let (gate, _, _) = gate(log);
    gate.call(req("w", json!({}), script("a"))).await.unwrap();
    assert!(codemode_gate::head_path(&real).exists());
    assert!(started_path(&real).exists());
    assert!(!codemode_gate::head_path(&alias).exists());
    assert!(!started_path(&alias).exists());
    assert!(
        unfinished_calls(&real, Some(&test_key()))
            .unwrap()
            .is_empty()
    );
}

/// Red team: the journal is emptied, head and all (by a command that then kills codemode, so
/// its own start goes too). An empty journal with no head reads as a fresh one, though the log
/// names journal lines that are gone.
#[tokio::test]
async fn a_journal_emptied_with_its_head_is_reported_not_read_as_fresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (gate, _, _) = gate(AuditLog::open_with_key(&path, test_key()).unwrap());
    gate.call(req("w", json!({}), script("a"))).await.unwrap();
    drop(gate);
    let journal = started_path(&path);
    std::fs::write(&journal, "").unwrap();
    std::fs::write(codemode_gate::head_path(&journal), "").unwrap();

    let found = unfinished_calls(&path, Some(&test_key()));
    assert!(
        found.is_err(),
        "an emptied journal passed as fresh: {found:?}"
    );
}

/// Red team: the log and its head are replaced by the journal and the journal's head. Both are
/// chains under the same key, so the log verifies, every outcome line (refusals included) is
/// gone, and each start pairs with itself as its own outcome.
#[tokio::test]
async fn a_log_replaced_by_its_own_journal_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (gate, _, _) = gate(AuditLog::open_with_key(&path, test_key()).unwrap());
    gate.call(req("w", json!({}), script("a"))).await.unwrap();
    let refused = gate.call(req("w", json!({"path": 3}), script("a"))).await;
    assert!(refused.is_err());
    drop(gate);
    let journal = started_path(&path);
    std::fs::copy(&journal, &path).unwrap();
    std::fs::copy(
        codemode_gate::head_path(&journal),
        codemode_gate::head_path(&path),
    )
    .unwrap();

    let verified = codemode_gate::verify(&path, Some(&test_key()));
    let found = unfinished_calls(&path, Some(&test_key()));
    assert!(
        verified.is_err() || found.is_err(),
        "a journal passed as the log: {verified:?} {found:?}"
    );
}

/// The log and its journal are chained with one key, so each verifies as a chain. Swapped
/// (heads and all) by someone who can write the files but lacks the key, each must still be
/// refused on its own by `verify`, which is what a tool reading only the log runs.
#[tokio::test]
async fn a_log_swapped_with_its_journal_does_not_verify_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (gate, _, _) = gate(AuditLog::open_with_key(&path, test_key()).unwrap());
    gate.call(req("w", json!({}), script("a"))).await.unwrap();
    gate.call(req("w", json!({}), script("a"))).await.unwrap();
    let key = Some(&test_key());
    codemode_gate::verify(&path, key).expect("the log verifies");
    let journal = started_path(&path);
    codemode_gate::verify(&journal, key).expect("the journal verifies");

    let head = |p: &std::path::Path| {
        let mut name = p.as_os_str().to_owned();
        name.push(".head");
        std::path::PathBuf::from(name)
    };
    let aside = dir.path().join("aside");
    for (a, b) in [
        (path.clone(), journal.clone()),
        (head(&path), head(&journal)),
    ] {
        std::fs::rename(&a, &aside).unwrap();
        std::fs::rename(&b, &a).unwrap();
        std::fs::rename(&aside, &b).unwrap();
    }
    let log_err = codemode_gate::verify(&path, key).expect_err("a journal in the log's place");
    assert!(
        log_err.to_string().contains("replaced by its journal"),
        "{log_err}"
    );
    let journal_err =
        codemode_gate::verify(&journal, key).expect_err("a log in the journal's place");
    assert!(
        journal_err.to_string().contains("replaced by a log"),
        "{journal_err}"
    );
    // So a log may not be given a journal's name.
    let named = AuditLog::open_with_key(dir.path().join("calls.started"), test_key())
        .err()
        .expect("a log named like a journal is refused");
    assert!(
        named.to_string().contains("must not end in `.started`"),
        "{named}"
    );
}

/// Red team: each journal line keeps a call's arguments whole (up to 1 MiB, twice that once
/// escaped), and nothing bounded a script's total: one script could write gigabytes into the
/// journal. A script's calls now share a bound; past it they are refused before they run, with
/// the log intact, and another script's calls go on.
#[tokio::test]
async fn a_scripts_calls_cannot_fill_the_journal_past_their_share() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (gate, runs) = gate_with_a_journal_share(&path);
    // Quotes double when the line is escaped; the share counts what the call passed.
    let padding = "\"".repeat(200 * 1024);
    let mut refused = None;
    for i in 0..10 {
        match gate
            .call(req(
                "w",
                json!({"path": format!("{i}{padding}")}),
                script("filler"),
            ))
            .await
        {
            Ok(_) => {}
            Err(e) => {
                refused = Some((i, e));
                break;
            }
        }
    }
    let (at, err) = refused.expect("the share ran out");
    // Each call puts about 400 KiB of escaped arguments in: the third passes the 1 MiB share.
    assert!((2..=3).contains(&at), "refused at call {at}");
    assert!(err.message.contains("audit journal"), "{}", err.message);
    assert!(
        err.message.contains("nothing was changed"),
        "{}",
        err.message
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        at,
        "the refused call did not run"
    );
    let journal = std::fs::metadata(started_path(&path)).unwrap().len();
    assert!(journal < 3 * 1024 * 1024, "{journal} bytes in the journal");
    // Only that script: another one's call runs, and the log still verifies.
    gate.call(req("w", json!({"path": "small"}), script("other")))
        .await
        .unwrap();
    let report = codemode_gate::verify(&path, Some(&test_key())).unwrap();
    // Every call that ran, and the one refused, has its line.
    assert_eq!(report.lines, at + 2);
}

/// The same share under a burst: calls of one script fired together cannot each find room
/// that only some of them have (the share is counted under the ledger's lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_one_scripts_calls_cannot_overrun_its_journal_share() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (gate, runs) = gate_with_a_journal_share(&path);
    let padding = "x".repeat(200 * 1024);
    let calls = (0..40).map(|i| {
        let gate = gate.clone();
        let args = json!({"path": format!("{i}{padding}")});
        async move { gate.call(req("w", args, script("burst"))).await }
    });
    let results = futures::future::join_all(calls).await;
    let ran = results.iter().filter(|r| r.is_ok()).count();
    // 1 MiB holds five calls of about 200 KiB each, however they interleave.
    assert_eq!(ran, 5, "{ran} calls ran");
    assert_eq!(runs.load(Ordering::SeqCst), 5);
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(r.message.contains("audit journal"), "{}", r.message);
    }
}

/// Red team: `audit verify` on a log other processes were writing said "the log names a start
/// it lacks" (2 of 30 runs): it read the journal, then the log, and a call that started and
/// ended between the two reads looked like a start cut from the journal. The log is read first.
/// Round 4 (a CI run, and 1 in 8 runs on a loaded machine): a head read after its log named
/// lines the read had not seen ("lines were cut from the end"), and a line being written was
/// read half ("the last line is truncated"). Logs are now read under a shared `flock`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verifying_a_log_while_calls_are_written_finds_no_start_missing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let reg = Registry::new();
    reg.register(Arc::new(TestTool::new("quick", object_schema())))
        .unwrap();
    let gate = builder(&reg)
        .audit(AuditLog::open_with_key(&path, test_key()).unwrap())
        .build()
        .unwrap();
    let writer = tokio::spawn(async move {
        for i in 0..1_500 {
            gate.call(req(
                "quick",
                json!({"path": format!("p{i}")}),
                script("busy"),
            ))
            .await
            .unwrap();
        }
    });
    let mut checks = 0;
    while !writer.is_finished() {
        let log = path.clone();
        let checked = tokio::task::spawn_blocking(move || {
            codemode_gate::unfinished_calls(&log, Some(&test_key()))
        })
        .await
        .unwrap();
        if let Err(e) = checked {
            panic!("verify, while calls were written, after {checks} checks: {e}");
        }
        checks += 1;
    }
    writer.await.unwrap();
    assert!(
        checks >= 3,
        "only {checks} checks ran while the calls were written"
    );
}

/// A gate with one tool, `w`, whose scripts may put 1 MiB of arguments in the journal of the
/// log at `path`; and how many times `w` ran.
fn gate_with_a_journal_share(path: &std::path::Path) -> (Gate, Arc<AtomicUsize>) {
    let reg = Registry::new();
    let w = TestTool::new("w", object_schema());
    let runs = w.runs.clone();
    reg.register(Arc::new(w)).unwrap();
    let gate = builder(&reg)
        .audit(AuditLog::open_with_key(path, test_key()).unwrap())
        .max_journalled_bytes_per_script(1024 * 1024)
        .build()
        .unwrap();
    (gate, runs)
}
