//! The audit log's hash chain: tampering, removal, reordering and truncation are detected.

mod common;

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
        .audit(AuditLog::open(path).unwrap())
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
    let report = verify(&path).unwrap();
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
    assert_eq!(verify(&path).unwrap().lines, 5);
}

#[tokio::test]
async fn a_changed_line_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 4).await;
    let mut l = lines(&path);
    l[2] = l[2].replace("\"status\":\"ok\"", "\"status\":\"xx\"");
    write_lines(&path, &l);
    let (line, problem) = broken_line(verify(&path).unwrap_err());
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
    let (line, problem) = broken_line(verify(&path).unwrap_err());
    assert_eq!(line, 2);
    assert!(problem.contains("removed"), "{problem}");

    let mut l = lines(&path);
    l.remove(0);
    write_lines(&path, &l);
    let (line, _) = broken_line(verify(&path).unwrap_err());
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
    let (line, problem) = broken_line(verify(&path).unwrap_err());
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
    let (line, problem) = broken_line(verify(&path).unwrap_err());
    assert_eq!(line, 3);
    assert!(problem.contains("truncated"), "{problem}");
    assert!(
        AuditLog::open(&path).is_err(),
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
    let (line, _) = broken_line(verify(&path).unwrap_err());
    assert_eq!(line, 3);
}
