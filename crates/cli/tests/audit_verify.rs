//! `codemode audit verify` on a real log, as a user runs it: a log changed byte by byte, and a
//! reader that stops early.

use std::path::Path;
use std::process::{Output, Stdio};

use crate::common;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `script` with `codemode run`, its calls logged to `log`; a temporary project holds
/// `notes.txt`.
fn run_logged(log: &Path, script: &str) -> Output {
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("notes.txt"), "alpha\nbeta\n").unwrap();
    let config = tempfile::tempdir().unwrap();
    let mut cmd = common::codemode();
    cmd.arg("run")
        .arg("--audit")
        .arg(log)
        .arg("--workdir")
        .arg(work.path())
        .arg("--config-dir")
        .arg(config.path())
        .arg("-");
    common::pipe(cmd, Some(script))
}

fn verify(log: &Path) -> Output {
    common::codemode()
        .args(["audit", "verify"])
        .arg(log)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `bytes` with every UTF-8 encoded U+FFFD (`EF BF BD`) swapped for a lone `FF` byte, which a
/// lossy decoder reads as U+FFFD again.
fn swap_replacement_chars(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while let Some((&b, tail)) = rest.split_first() {
        if rest.starts_with("\u{FFFD}".as_bytes()) {
            out.push(0xFF);
            rest = &rest[3..];
        } else {
            out.push(b);
            rest = tail;
        }
    }
    out
}

/// Found by a red team: the log was decoded lossily before its MACs were checked, so swapping
/// a line's U+FFFD (what a lone surrogate in a call's arguments is written as) for a lone `FF`
/// byte left a file that verify called intact and `codemode run` appended to.
#[test]
fn a_log_with_bytes_that_are_not_utf8_fails_verify_and_is_not_appended_to() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    let out = run_logged(
        &log,
        "await tools.ls({}); try { await tools.read({ path: 'notes\\uD800.txt' }) } catch {} return 1",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ok = verify(&log);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    let bytes = std::fs::read(&log).unwrap();
    let changed = swap_replacement_chars(&bytes);
    assert_ne!(changed, bytes, "the lone surrogate was logged as U+FFFD");
    let line = 1 + bytes[..changed.iter().position(|b| *b == 0xFF).unwrap()]
        .iter()
        .filter(|b| **b == b'\n')
        .count();
    std::fs::write(&log, &changed).unwrap();

    let bad = verify(&log);
    let (stdout, stderr) = (text(&bad.stdout), text(&bad.stderr));
    assert_eq!(bad.status.code(), Some(1), "{stdout}{stderr}");
    assert!(!stdout.contains("intact"), "{stdout}");
    assert!(!stdout.contains("proven"), "{stdout}");
    assert!(
        stderr.contains(&format!("line {line}:"))
            && stderr.contains("not valid UTF-8")
            && stderr.contains("changed outside codemode"),
        "{stderr}"
    );

    let refused = run_logged(&log, "await tools.ls({}); return 1");
    assert!(!refused.status.success(), "{}", text(&refused.stdout));
    assert!(
        text(&refused.stderr).contains("not valid UTF-8"),
        "{}",
        text(&refused.stderr)
    );
    assert_eq!(
        std::fs::read(&log).unwrap(),
        changed,
        "nothing was appended"
    );
}

/// Found by a red team: `codemode audit verify LOG | head -3` panicked ("failed printing to
/// stdout: Broken pipe") with a backtrace. A reader that stops early ends it quietly.
#[test]
fn verify_ends_quietly_when_its_reader_stops_early() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    // Long enough that the reader is gone before verify has anything to print.
    let out = run_logged(
        &log,
        "for (let i = 0; i < 3000; i++) await tools.ls({}); return 1",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut child = common::codemode()
        .args(["audit", "verify"])
        .arg(&log)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
    assert!(
        out.status.code().is_some(),
        "it exits, and is not killed: {:?}",
        out.status
    );
}
