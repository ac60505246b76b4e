//! The audit log's keyed chain, attacked: changed, removed, reordered, truncated, forged and
//! rechained logs, a forged head, and two processes writing one log at once.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use codemode_gate::{AuditError, AuditLog, Registry, verify};
use common::*;
use serde_json::json;

async fn write_log(path: &Path, calls: usize) {
    let reg = Registry::new();
    reg.register(Arc::new(TestTool::new("t", object_schema())))
        .unwrap();
    let gate = builder(&reg)
        .audit(AuditLog::open_with_key(path, test_key()).unwrap())
        .build()
        .unwrap();
    for i in 0..calls {
        gate.call(req("t", json!({"path": format!("file-{i}")}), script("a")))
            .await
            .unwrap();
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    std::fs::write(
        path,
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
}

fn broken_line(err: AuditError) -> (usize, String) {
    match err {
        AuditError::Broken { line, problem, .. } => (line, problem),
        other => panic!("expected a broken chain, got {other}"),
    }
}

#[tokio::test]
async fn an_intact_log_verifies_and_each_line_carries_what_happened() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 3).await;
    let report = verify(&path, Some(&test_key())).unwrap();
    assert_eq!(report.lines, 3);
    let entries = audit_lines(&path);
    let first = &entries[0];
    for key in [
        "time",
        "provenance",
        "tool",
        "args_sha256",
        "args_preview",
        "decision",
        "policy_ids",
        "status",
        "duration_ms",
        "usage",
        "prev",
        "hash",
    ] {
        assert!(first.get(key).is_some(), "missing {key} in {first}");
    }
    assert_eq!(first["args_preview"], r#"{"path":"file-0"}"#);
    assert_eq!(first["args_sha256"].as_str().unwrap().len(), 64);
    assert_eq!(first["prev"], "0".repeat(64));
    assert_eq!(entries[1]["prev"], first["hash"]);
    assert_eq!(report.last_hash, entries[2]["hash"].as_str().unwrap());
    assert!(first["time"].as_str().unwrap().ends_with('Z'));

    // Reopening continues the chain.
    write_log(&path, 2).await;
    assert_eq!(verify(&path, Some(&test_key())).unwrap().lines, 5);
}

#[tokio::test]
async fn a_changed_line_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 4).await;
    let mut l = lines(&path);
    l[2] = l[2].replace("\"status\":\"ok\"", "\"status\":\"xx\"");
    write_lines(&path, &l);
    let (line, problem) = broken_line(verify(&path, Some(&test_key())).unwrap_err());
    assert_eq!(line, 3);
    assert!(problem.contains("changed"), "{problem}");
}

#[tokio::test]
async fn a_removed_line_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 4).await;
    let mut l = lines(&path);
    l.remove(1);
    write_lines(&path, &l);
    let (line, problem) = broken_line(verify(&path, Some(&test_key())).unwrap_err());
    assert_eq!(line, 2);
    assert!(problem.contains("removed"), "{problem}");

    let mut l = lines(&path);
    l.remove(0);
    write_lines(&path, &l);
    let (line, _) = broken_line(verify(&path, Some(&test_key())).unwrap_err());
    assert_eq!(line, 1);
}

#[tokio::test]
async fn reordered_lines_are_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 4).await;
    let mut l = lines(&path);
    l.swap(1, 2);
    write_lines(&path, &l);
    let (line, problem) = broken_line(verify(&path, Some(&test_key())).unwrap_err());
    assert_eq!(line, 2);
    assert!(problem.contains("reordered"), "{problem}");
}

#[tokio::test]
async fn a_truncated_last_line_is_reported_as_such_and_the_log_is_not_continued() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 3).await;
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, &text[..text.len() - 30]).unwrap();
    let (line, problem) = broken_line(verify(&path, Some(&test_key())).unwrap_err());
    assert_eq!(line, 3);
    assert!(problem.contains("truncated"), "{problem}");
    assert!(
        AuditLog::open_with_key(&path, test_key()).is_err(),
        "new lines must not chain onto a damaged log"
    );
}

#[tokio::test]
async fn a_forged_line_with_a_recomputed_hash_still_breaks_the_next_link() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 3).await;
    let mut l = lines(&path);
    // Rewrite line 2 consistently with itself (new hash), as a careless forger would.
    let head_end = l[1].rfind(",\"hash\":").unwrap();
    let head = l[1][..head_end].replace("file-1", "file-X");
    let hash = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(head.as_bytes()))
    };
    l[1] = format!("{head},\"hash\":\"{hash}\"}}");
    write_lines(&path, &l);
    let (line, problem) = broken_line(verify(&path, Some(&test_key())).unwrap_err());
    assert_eq!(line, 2, "the forged line itself fails its MAC");
    assert!(problem.contains("forged"), "{problem}");
}

/// Rewrites every line's chain fields with `mac` (a forger's hash function), as someone who
/// rewrote the file would.
fn rechain(lines: &[String], mac: impl Fn(&str) -> String) -> Vec<String> {
    let mut prev = "0".repeat(64);
    lines
        .iter()
        .map(|l| {
            let body = &l[..l.rfind(",\"prev\":").unwrap()];
            let head = format!("{body},\"prev\":\"{prev}\"");
            let hash = mac(&head);
            prev = hash.clone();
            format!("{head},\"hash\":\"{hash}\"}}")
        })
        .collect()
}

fn sha(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

#[tokio::test]
async fn lines_cut_from_the_end_are_found_through_the_head() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 5).await;
    let l = lines(&path);
    write_lines(&path, &l[..3]);
    let err = verify(&path, Some(&test_key())).unwrap_err();
    assert!(matches!(err, AuditError::Head { .. }), "{err}");
    assert!(err.to_string().contains("cut from the end"), "{err}");
    // Without the key the cut is still seen: the head's count does not match.
    assert!(verify(&path, None).is_err());
    assert!(AuditLog::open_with_key(&path, test_key()).is_err());
}

#[tokio::test]
async fn a_forged_tail_and_a_rechained_log_do_not_verify_with_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 4).await;
    let original = lines(&path);

    // A forged line appended with a recomputed plain hash.
    let mut l = original.clone();
    let last = l.last().unwrap().clone();
    let forged = rechain(&[last.replace("file-3", "file-9")], sha)[0].replace(
        &format!("\"prev\":\"{}\"", "0".repeat(64)),
        &format!("\"prev\":\"{}\"", {
            let v: serde_json::Value = serde_json::from_str(&last).unwrap();
            v["hash"].as_str().unwrap().to_string()
        }),
    );
    l.push(forged);
    write_lines(&path, &l);
    let (line, _) = broken_line(verify(&path, Some(&test_key())).unwrap_err());
    assert_eq!(line, 5);

    // The whole file rechained with plain SHA-256, and with another key.
    for other in [
        rechain(&original, sha),
        rechain(&original, |t| {
            use hmac::Mac;
            let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(&[1u8; 32]).unwrap();
            m.update(t.as_bytes());
            hex::encode(m.finalize().into_bytes())
        }),
    ] {
        write_lines(&path, &other);
        let (line, problem) = broken_line(verify(&path, Some(&test_key())).unwrap_err());
        assert_eq!(line, 1, "{problem}");
        // Without the key the shape is fine, and the report says what that does not prove.
        if let Ok(report) = verify(&path, None) {
            assert!(!report.authenticated);
            assert!(report.cannot_prove()[0].contains("without the key"));
        }
    }
}

#[tokio::test]
async fn a_forged_head_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 4).await;
    let l = lines(&path);
    write_lines(&path, &l[..2]);
    let v: serde_json::Value = serde_json::from_str(&l[1]).unwrap();
    // The forger cuts two lines and rewrites the head to match, without the key.
    std::fs::write(
        codemode_gate::head_path(&path),
        format!(
            "{{\"lines\":2,\"hash\":\"{}\",\"mac\":\"{}\"}}\n",
            v["hash"].as_str().unwrap(),
            "ab".repeat(32)
        ),
    )
    .unwrap();
    let err = verify(&path, Some(&test_key())).unwrap_err();
    assert!(err.to_string().contains("forged"), "{err}");
    // A deleted head is noticed when the log is opened again.
    std::fs::remove_file(codemode_gate::head_path(&path)).unwrap();
    assert_eq!(
        verify(&path, Some(&test_key())).unwrap().head,
        codemode_gate::HeadCheck::Missing
    );
    assert!(AuditLog::open_with_key(&path, test_key()).is_err());
}

#[tokio::test]
async fn an_intact_log_reports_what_it_proves() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 2).await;
    let report = verify(&path, Some(&test_key())).unwrap();
    assert!(report.authenticated);
    assert_eq!(report.head, codemode_gate::HeadCheck::Matches);
    assert!(
        report
            .proves()
            .iter()
            .any(|p| p.contains("cut from the end"))
    );
    let unkeyed = verify(&path, None).unwrap();
    assert!(!unkeyed.authenticated);
    // Another key does not verify the log.
    let other = codemode_gate::AuditKey::from_bytes([9; 32]);
    assert!(verify(&path, Some(&other)).is_err());
}

#[tokio::test]
async fn an_older_head_put_back_is_not_read_as_proof_that_nothing_was_cut() {
    // Two lines and their head, kept; two more lines; then the last line cut and the kept head
    // put back: a holder of no key can do this, and it reads as a head left behind.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 2).await;
    let old_head = std::fs::read(codemode_gate::head_path(&path)).unwrap();
    write_log(&path, 2).await;
    let l = lines(&path);
    assert_eq!(l.len(), 4);
    write_lines(&path, &l[..3]);
    std::fs::write(codemode_gate::head_path(&path), &old_head).unwrap();
    let report = verify(&path, Some(&test_key())).unwrap();
    assert_eq!(
        report.head,
        codemode_gate::HeadCheck::Behind { extra: 1 },
        "{report:?}"
    );
    let proves = report.proves().join(" ");
    assert!(!proves.contains("no line was cut from the end"), "{proves}");
    assert!(proves.contains("older head"), "{proves}");
}

const WRITER_ENV: &str = "CODEMODE_TEST_AUDIT_WRITER";
const LINES_PER_WRITER: usize = 150;

/// Not a test of its own: the body of a second process that appends to a shared log.
#[tokio::test]
async fn writer_process() {
    let Ok(path) = std::env::var(WRITER_ENV) else {
        return;
    };
    write_log(Path::new(&path), LINES_PER_WRITER).await;
}

#[tokio::test]
async fn two_processes_appending_to_one_log_keep_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 1).await;
    let spawn = || {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &this_module_test("writer_process"),
                "--test-threads",
                "1",
            ])
            .env(WRITER_ENV, &path)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let (mut a, mut b) = (spawn(), spawn());
    // This process writes too, at the same time.
    write_log(&path, LINES_PER_WRITER).await;
    assert!(a.wait().unwrap().success());
    assert!(b.wait().unwrap().success());
    let report = verify(&path, Some(&test_key())).unwrap();
    assert_eq!(report.lines, 1 + 3 * LINES_PER_WRITER);
    assert_eq!(report.head, codemode_gate::HeadCheck::Matches);
    // And the log can still be continued.
    write_log(&path, 1).await;
}

/// A tool that damages the audit log's head while it runs: its line cannot be written.
struct DamagesTheHead {
    spec: codemode_spec::ToolSpec,
    head: std::path::PathBuf,
    runs: Arc<std::sync::atomic::AtomicUsize>,
}

impl codemode_spec::Tool for DamagesTheHead {
    fn spec(&self) -> &codemode_spec::ToolSpec {
        &self.spec
    }
    fn prepare(
        &self,
        args: serde_json::Value,
    ) -> Result<Box<dyn codemode_spec::PreparedCall>, codemode_spec::ToolError> {
        let (head, runs) = (self.head.clone(), self.runs.clone());
        Ok(codemode_spec::prepared(
            codemode_spec::CallFacts::default(),
            move |_| {
                Box::pin(async move {
                    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    std::fs::write(&head, "not a head").unwrap();
                    Ok(codemode_spec::ToolOutput::value(args))
                })
            },
        ))
    }
}

/// A log of one line at `path`, and a registry with `t` and `damage`, which breaks the log's
/// head when it runs (counted in the returned runs), so that its own line cannot be written.
async fn with_a_tool_that_damages_the_log(
    path: &Path,
) -> (Registry, Arc<std::sync::atomic::AtomicUsize>) {
    write_log(path, 1).await;
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let reg = Registry::new();
    reg.register(Arc::new(TestTool::new("t", object_schema())))
        .unwrap();
    reg.register(Arc::new(DamagesTheHead {
        spec: codemode_spec::ToolSpec::new("damage", "", object_schema()),
        head: path.with_file_name("audit.jsonl.head"),
        runs: runs.clone(),
    }))
    .unwrap();
    (reg, runs)
}

/// Found by a red-team run: a call whose own line could not be written returned "ok", and only
/// later calls were refused. Its result is now withheld with an error that says it ran.
#[tokio::test]
async fn a_call_whose_line_cannot_be_written_does_not_return_as_if_audited() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (reg, runs) = with_a_tool_that_damages_the_log(&path).await;
    let gate = builder(&reg)
        .audit(AuditLog::open_with_key(&path, test_key()).unwrap())
        .build()
        .unwrap();
    let err = gate
        .call(req("damage", json!({"path": "secret-x"}), script("a")))
        .await
        .expect_err("the result is withheld");
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "{}",
        err.message
    );
    assert!(
        err.message.contains("ran, and what it did stands")
            && err.message.contains("audit line could not be written"),
        "{}",
        err.message
    );
    assert!(!err.message.contains("secret-x"), "{}", err.message);
    // Every later call is refused.
    refused_because(&gate, "audit log cannot be written").await;
}

/// Found by a review: once the log had failed, every refusal was observed (and counted in
/// metrics) as a made-up name, so a dashboard showed no tool refused at all. A name that resolves
/// keeps its tool; one that does not stays unresolved.
#[tokio::test]
async fn refusals_after_the_log_failed_are_observed_under_their_tool() {
    struct Seen(std::sync::Mutex<Vec<(String, bool)>>);
    impl codemode_gate::CallObserver for Seen {
        fn finished(&self, o: &codemode_gate::CallOutcome) {
            self.0
                .lock()
                .unwrap()
                .push((o.tool.clone(), o.kind.is_some()));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (reg, _) = with_a_tool_that_damages_the_log(&path).await;
    let seen = Arc::new(Seen(Default::default()));
    let gate = builder(&reg)
        .audit(AuditLog::open_with_key(&path, test_key()).unwrap())
        .observer(seen.clone())
        .build()
        .unwrap();
    gate.call(req("damage", json!({}), script("a")))
        .await
        .expect_err("its line cannot be written");
    refused_because(&gate, "audit log cannot be written").await;
    let err = gate
        .call(req("no_such_tool", json!({}), script("a")))
        .await
        .unwrap_err();
    assert!(
        err.message.contains("audit log cannot be written"),
        "{}",
        err.message
    );
    let seen = seen.0.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            ("damage".to_string(), true),
            ("t".to_string(), true),
            ("no_such_tool".to_string(), false),
        ]
    );
}

/// Calls `t` and expects a refusal whose message says `why`; returns the message.
async fn refused_because(gate: &codemode_gate::Gate, why: &str) -> String {
    let err = gate
        .call(req("t", json!({}), script("a")))
        .await
        .unwrap_err();
    assert!(err.message.contains(why), "{}", err.message);
    err.message
}

/// A gate on a log at `path` whose tool `t` counts its runs.
fn counting_gate(path: &Path) -> (codemode_gate::Gate, Arc<std::sync::atomic::AtomicUsize>) {
    let reg = Registry::new();
    let tool = TestTool::new("t", object_schema());
    let runs = tool.runs.clone();
    reg.register(Arc::new(tool)).unwrap();
    let gate = builder(&reg)
        .audit(AuditLog::open_with_key(path, test_key()).unwrap())
        .build()
        .unwrap();
    (gate, runs)
}

/// What a permitted `bash` command can do to a log it is not stopped from writing: empty it
/// and its head together, so the chain left is short but whole. The process that wrote the
/// lines knows where its last one ended, and refuses to run anything more onto that log.
#[tokio::test]
async fn a_log_emptied_behind_the_gate_is_noticed_and_nothing_more_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (gate, runs) = counting_gate(&path);
    for _ in 0..3 {
        gate.call(req("t", json!({}), script("a"))).await.unwrap();
    }
    std::fs::write(&path, "").unwrap();
    std::fs::write(codemode_gate::head_path(&path), "").unwrap();
    // On its own the emptied log looks fine: that is why the gate must notice.
    assert_eq!(verify(&path, Some(&test_key())).unwrap().lines, 0);

    let message = refused_because(&gate, "cut, truncated or replaced").await;
    assert!(message.contains("was not run"), "{message}");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 3);
    // The journal still names the three calls the emptied log lost.
    let lost = codemode_gate::unfinished_calls(&path, Some(&test_key())).unwrap();
    assert_eq!(lost.len(), 3, "{lost:?}");
}

#[tokio::test]
async fn a_log_cut_by_its_last_line_or_deleted_is_noticed() {
    let dir = tempfile::tempdir().unwrap();
    // Cut by its last line (the head, left as it was, would tell too).
    let path = dir.path().join("cut.jsonl");
    let (gate, runs) = counting_gate(&path);
    for _ in 0..2 {
        gate.call(req("t", json!({}), script("a"))).await.unwrap();
    }
    let kept: Vec<String> = lines(&path).into_iter().take(1).collect();
    write_lines(&path, &kept);
    refused_because(&gate, "cut, truncated or replaced").await;
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);

    // Deleted while open: later lines would go to a file nobody can see.
    let path = dir.path().join("deleted.jsonl");
    let (gate, runs) = counting_gate(&path);
    gate.call(req("t", json!({}), script("a"))).await.unwrap();
    std::fs::remove_file(&path).unwrap();
    refused_because(&gate, "deleted, moved or replaced").await;
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// Another process appending to the same log is not tampering: lines after ours are fine.
#[tokio::test]
async fn lines_another_writer_adds_after_ours_are_not_mistaken_for_tampering() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (a, _) = counting_gate(&path);
    let (b, _) = counting_gate(&path);
    for _ in 0..3 {
        a.call(req("t", json!({}), script("a"))).await.unwrap();
        b.call(req("t", json!({}), script("b"))).await.unwrap();
    }
    assert_eq!(verify(&path, Some(&test_key())).unwrap().lines, 6);
}

/// `bytes` with every UTF-8 encoded U+FFFD (`EF BF BD`) swapped for a lone `FF` byte, which a
/// lossy decoder turns back into U+FFFD; panics when there is none to swap.
fn swap_replacement_chars(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    let mut swapped = 0;
    while !rest.is_empty() {
        if rest.starts_with("\u{FFFD}".as_bytes()) {
            out.push(0xFF);
            rest = &rest[3..];
            swapped += 1;
        } else {
            out.push(rest[0]);
            rest = &rest[1..];
        }
    }
    assert!(swapped > 0, "no U+FFFD to swap");
    out
}

/// Found by a red team: the log was decoded lossily before its MACs were checked, so a line
/// whose U+FFFD (what lone surrogates in arguments become) was swapped for a lone `FF` byte
/// decoded back to the text the MAC covers: a changed file verified as unchanged, and writers
/// chained onto it. Bytes that are not UTF-8 are a changed line now, in the log, its head and
/// its journal, and the log is not continued.
#[tokio::test]
async fn bytes_that_are_not_utf8_are_a_change_and_the_log_is_not_continued() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 2).await;
    // A writer that opened the log before the change, and appends after it.
    let open_before = AuditLog::open_with_key(&path, test_key()).unwrap();
    let (gate, _) = counting_gate(&path);
    gate.call(req("t", json!({"path": "caf\u{FFFD}"}), script("a")))
        .await
        .unwrap();
    let key = test_key();
    assert_eq!(verify(&path, Some(&key)).unwrap().lines, 3);
    let journal = codemode_gate::started_path(&path);
    let (log_bytes, head_bytes, journal_bytes) = (
        std::fs::read(&path).unwrap(),
        std::fs::read(codemode_gate::head_path(&path)).unwrap(),
        std::fs::read(&journal).unwrap(),
    );

    // In the log: line 3 is named, and nothing is chained onto it.
    std::fs::write(&path, swap_replacement_chars(&log_bytes)).unwrap();
    let (line, problem) = broken_line(verify(&path, Some(&key)).unwrap_err());
    assert_eq!(line, 3, "{problem}");
    assert!(
        problem.contains("not valid UTF-8") && problem.contains("outside codemode"),
        "{problem}"
    );
    let (line, _) = broken_line(verify(&path, None).unwrap_err());
    assert_eq!(line, 3);
    let mut record = serde_json::Map::new();
    record.insert("tool".into(), json!("t"));
    let refused = open_before
        .append(record.clone())
        .expect_err("a writer must not chain onto a changed log");
    assert!(refused.to_string().contains("UTF-8"), "{refused}");
    let refused = AuditLog::open_with_key(&path, test_key())
        .err()
        .expect("a changed log is not opened for appending");
    assert!(refused.to_string().contains("line 3"), "{refused}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        swap_replacement_chars(&log_bytes)
    );
    std::fs::write(&path, &log_bytes).unwrap();

    // In the head.
    let mut head = head_bytes.clone();
    head.insert(head.len() - 1, 0xFF);
    std::fs::write(codemode_gate::head_path(&path), &head).unwrap();
    let problem = verify(&path, Some(&key)).unwrap_err().to_string();
    assert!(
        problem.contains("not valid UTF-8") && problem.contains("line 1"),
        "{problem}"
    );
    assert!(AuditLog::open_with_key(&path, test_key()).is_err());
    std::fs::write(codemode_gate::head_path(&path), &head_bytes).unwrap();

    // In the journal: the log verifies, its journal does not, and the log is not continued.
    std::fs::write(&journal, swap_replacement_chars(&journal_bytes)).unwrap();
    assert_eq!(verify(&path, Some(&key)).unwrap().lines, 3);
    let (line, problem) =
        broken_line(codemode_gate::unfinished_calls(&path, Some(&key)).unwrap_err());
    assert_eq!(line, 3, "{problem}");
    assert!(problem.contains("not valid UTF-8"), "{problem}");
    assert!(
        AuditLog::open_with_key(&path, test_key()).is_err(),
        "a log whose journal was changed is not continued"
    );
}

/// A write interrupted inside a character leaves bytes that are not UTF-8 too; at the end of an
/// unfinished last line they are an interrupted write, not a change.
#[tokio::test]
async fn a_last_line_cut_inside_a_character_is_reported_as_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (gate, _) = counting_gate(&path);
    gate.call(req("t", json!({"path": "caf\u{FFFD}"}), script("a")))
        .await
        .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let at = bytes
        .windows(3)
        .position(|w| w == "\u{FFFD}".as_bytes())
        .unwrap();
    std::fs::write(&path, &bytes[..at + 2]).unwrap();
    let (line, problem) = broken_line(verify(&path, Some(&test_key())).unwrap_err());
    assert_eq!(line, 1);
    assert!(problem.contains("truncated"), "{problem}");
}

/// Red-team finding: any process that can open the log, even read-only (a permitted `bash`
/// whose view keeps it read-only), can hold its `flock`. Every call then waited for the lock
/// forever, each holding a runtime thread, until the whole process stood still. A call now
/// waits a bounded time and fails, with a message that says why, and no later call runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_locked_by_another_process_refuses_calls_instead_of_hanging_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (gate, runs) = counting_gate(&path);
    gate.call(req("t", json!({}), script("a"))).await.unwrap();
    let holder = std::fs::File::open(&path).unwrap();
    rustix::fs::flock(&holder, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let g = gate.clone();
    let call = tokio::spawn(async move { g.call(req("t", json!({}), script("a"))).await });
    let outcome = tokio::time::timeout(std::time::Duration::from_secs(60), call).await;
    drop(holder);
    let err = outcome
        .expect("the call ends while the lock is held")
        .unwrap()
        .expect_err("a call that cannot be audited is refused");
    assert!(
        err.message.contains("locked") && err.message.contains("audit.jsonl"),
        "{}",
        err.message
    );
    // That call was journalled, so it may have run (its result is withheld); none after it runs.
    let ran = runs.load(std::sync::atomic::Ordering::SeqCst);
    // Every later call is refused.
    refused_because(&gate, "audit log cannot be written").await;
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), ran);
}

/// Calls made together while another process holds the log's lock each wait the bounded time
/// once, together: the appends queued behind this process's own lock do not wait 10 s again
/// each in turn (six calls end in about 10 s, not a minute, with threads held all along).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_made_together_while_another_process_holds_the_log_lock_end_together() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (gate, _) = counting_gate(&path);
    gate.call(req("t", json!({}), script("a"))).await.unwrap();
    let holder = std::fs::File::open(&path).unwrap();
    rustix::fs::flock(&holder, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let started = std::time::Instant::now();
    let calls: Vec<_> = (0..6)
        .map(|_| {
            let g = gate.clone();
            tokio::spawn(async move { g.call(req("t", json!({}), script("a"))).await })
        })
        .collect();
    let outcome = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        futures::future::join_all(calls),
    )
    .await;
    let took = started.elapsed();
    drop(holder);
    for result in outcome.expect("the calls end while the lock is held") {
        result
            .unwrap()
            .expect_err("a call that cannot be audited fails");
    }
    assert!(
        took < std::time::Duration::from_secs(30),
        "six calls made together took {took:?}: each waited for the lock after the one before"
    );
}

/// `name`'s full test path in this binary (`audit::name`), for running it as a second process.
fn this_module_test(name: &str) -> String {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    format!("{module}::{name}")
}
