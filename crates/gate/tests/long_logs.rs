//! A long audit log is checked a line at a time. Every `codemode run` opens (and so checks)
//! its log and journal, and each run may add tens of MiB to them: read whole, ten such runs
//! made `return 1+1` need 662 MB. A process of its own, for its memory figures.

use codemode_gate::{AuditKey, AuditLog, unfinished_calls, verify};
use serde_json::{Map, Value, json};

/// The process's peak resident memory so far, in MiB.
fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib / 1024
}

const LINE_MIB: usize = 1;
const LINES: usize = 96;

#[test]
fn opening_and_checking_a_long_log_costs_a_line_not_the_log() {
    let key = AuditKey::from_bytes([42; 32]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    {
        let log = AuditLog::open_with_key(&path, key.clone()).unwrap();
        let preview = "x".repeat(LINE_MIB << 20);
        for i in 0..LINES {
            let mut record = Map::new();
            record.insert("event".into(), json!("call"));
            record.insert("n".into(), json!(i));
            record.insert("args_preview".into(), Value::String(preview.clone()));
            log.append(record).unwrap();
        }
    }
    let size_mib = std::fs::metadata(&path).unwrap().len() >> 20;
    assert!(size_mib >= (LINES * LINE_MIB) as u64, "{size_mib} MiB");

    let before = peak_rss_mib();
    let report = verify(&path, Some(&key)).unwrap();
    assert_eq!(report.lines, LINES);
    let log = AuditLog::open_with_key(&path, key.clone()).unwrap();
    let mut last = Map::new();
    last.insert("event".into(), json!("call"));
    log.append(last).unwrap();
    assert_eq!(unfinished_calls(&path, Some(&key)).unwrap(), vec![]);
    assert_eq!(verify(&path, Some(&key)).unwrap().lines, LINES + 1);
    let grown = peak_rss_mib().saturating_sub(before);
    eprintln!("checking a {size_mib} MiB log grew the peak by {grown} MiB");
    // A few lines' worth (a read buffer, the line, its parse); reading the log whole costs
    // its size, 96 MiB here.
    assert!(
        grown < 48,
        "checking a {size_mib} MiB log grew the peak by {grown} MiB"
    );
}

/// A line changed in the middle of a long log is still found, with its number.
#[test]
fn a_changed_line_deep_in_a_log_is_named() {
    let key = AuditKey::from_bytes([42; 32]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    {
        let log = AuditLog::open_with_key(&path, key.clone()).unwrap();
        for i in 0..5000 {
            let mut record = Map::new();
            record.insert("event".into(), json!("call"));
            record.insert("n".into(), json!(i));
            log.append(record).unwrap();
        }
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let changed = text.replacen("\"n\":4321,", "\"n\":4322,", 1);
    assert_ne!(text, changed);
    std::fs::write(&path, changed).unwrap();
    let err = verify(&path, Some(&key)).unwrap_err().to_string();
    assert!(err.contains("line 4322"), "{err}");
    assert!(AuditLog::open_with_key(&path, key).is_err());
}
