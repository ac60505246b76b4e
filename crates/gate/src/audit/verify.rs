//! Checking an audit log: what can be proven with the key, and what only without it.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use serde::Deserialize;

use super::{AuditError, AuditKey, GENESIS, Head, head_path};

/// How the log compares with its head file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadCheck {
    /// The head names the log's last line and line count.
    Matches,
    /// The log has lines after the head (a process stopped between a line and its head).
    Behind { extra: usize },
    /// There is no head file (or it is empty): lines cut from the end could not be noticed.
    Missing,
}

/// What `verify` found in a log that passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub lines: usize,
    /// Hash of the last line.
    pub last_hash: String,
    /// Every line's and the head's MAC was checked with the key.
    pub authenticated: bool,
    pub head: HeadCheck,
}

impl VerifyReport {
    /// What the check proves, one sentence each.
    pub fn proves(&self) -> Vec<String> {
        let mut out = vec![
            "no line was removed, changed or reordered between the first line and the last"
                .to_string(),
        ];
        match (self.authenticated, &self.head) {
            (true, HeadCheck::Missing) => out.push("every line was written by a holder of the key: a forged line or a rechained file would not verify (there was no head to check)".into()),
            (true, _) => out.push("every line and the head were written by a holder of the key: a forged line or a rechained file would not verify".into()),
            (false, _) => {}
        }
        match (&self.head, self.authenticated) {
            (HeadCheck::Matches, true) => {
                out.push("no line was cut from the end: the keyed head names the last line".into())
            }
            (HeadCheck::Behind { extra }, true) => out.push(format!(
                "no line the head names was cut; the last {extra} line(s) came after the head was last written (a process stopped between the two), unless an older head was put back, which would also hide lines cut after it"
            )),
            _ => {}
        }
        out
    }

    /// What it cannot prove, one sentence each.
    pub fn cannot_prove(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.authenticated {
            out.push("without the key, authenticity is unproven: anyone could have rewritten the whole file, head included, and recomputed every hash".into());
        }
        if self.head == HeadCheck::Missing {
            out.push("with no head file, lines cut from the end cannot be noticed".into());
        }
        out.push("a log and head rolled back together to an earlier state they both had cannot be told from that state; keep the last hash elsewhere to notice that".into());
        out
    }
}

/// Checks the whole chain and its head. With the key, every line's MAC and the head's MAC are
/// checked too; without it, only the chain's shape (each line's `prev` is the line before's
/// `hash`) and its agreement with the head. Says which line is the first that does not fit.
pub fn verify(path: impl AsRef<Path>, key: Option<&AuditKey>) -> Result<VerifyReport, AuditError> {
    let path = path.as_ref();
    let opened = |p: &Path, e: std::io::Error| AuditError::Open {
        path: p.display().to_string(),
        message: e.to_string(),
    };
    let log = File::open(path).map_err(|e| opened(path, e))?;
    // Under a shared lock, as writers append under the exclusive one: the log's length then
    // ends between two whole lines, and the head is not ahead of it. Writers only append, so
    // the bytes up to that length are read after the lock is let go, while writers go on.
    let (head_bytes, settled) = {
        let _lock = super::Flock::shared(&log).map_err(|e| opened(path, e))?;
        let head_bytes = match std::fs::read(head_path(path)) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(opened(&head_path(path), e)),
        };
        let settled = log.metadata().map_err(|e| opened(path, e))?.len();
        (head_bytes, settled)
    };
    let log = read_settled(&log, settled).map_err(|e| opened(path, e))?;
    check(path, log, &head_bytes, key)
}

/// The first `len` bytes of a chained file, read through a buffer: a log is checked one line
/// at a time, never whole (a long log would otherwise cost its size in memory on every open).
pub(crate) fn read_settled(file: &File, len: u64) -> std::io::Result<impl BufRead + '_> {
    let mut at_start = file;
    at_start.seek(SeekFrom::Start(0))?;
    Ok(BufReader::with_capacity(64 * 1024, at_start.take(len)))
}

/// An open file's bytes from its start (a head file: one short line).
pub(crate) fn read_whole(mut file: &File) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.seek(SeekFrom::Start(0))?;
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// What opening a log for appending learned.
pub(crate) struct OpenReport {
    pub lines: usize,
    pub last_hash: String,
    /// The head is behind the log and must be rewritten.
    pub head_stale: bool,
}

/// Checks an open log with the key before it is appended to. A missing head is only accepted
/// for an empty log.
pub(crate) fn verify_open(
    path: &Path,
    log: &File,
    head: &File,
    key: &AuditKey,
) -> Result<OpenReport, AuditError> {
    let io = |e: std::io::Error| AuditError::Open {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let head_bytes = read_whole(head).map_err(io)?;
    // Appenders hold the lock this caller holds, so the length is where the last line ends.
    let settled = log.metadata().map_err(io)?.len();
    let report = check(
        path,
        read_settled(log, settled).map_err(io)?,
        &head_bytes,
        Some(key),
    )?;
    if report.head == HeadCheck::Missing && report.lines > 0 {
        return Err(AuditError::Head {
            path: path.display().to_string(),
            problem: format!(
                "its head file {} is missing or empty, so lines cut from the end could not be noticed; restore the head, or move the log aside to start a new one",
                head_path(path).display()
            ),
        });
    }
    Ok(OpenReport {
        lines: report.lines,
        last_hash: report.last_hash,
        head_stale: report.head != HeadCheck::Matches,
    })
}

/// The line's hash when its MAC verifies with `key`.
pub(crate) fn line_hash(line: &str, key: &AuditKey) -> Option<String> {
    let (head, hash) = split_line(line)?;
    key.verify(head.as_bytes(), hash).then(|| hash.to_string())
}

/// The part a line's hash covers, and the hash.
pub(crate) fn split_line(line: &str) -> Option<(&str, &str)> {
    let at = line.rfind(",\"hash\":\"")?;
    let hash = line[at..]
        .strip_prefix(",\"hash\":\"")?
        .strip_suffix("\"}")?;
    Some((&line[..at], hash))
}

/// Calls `each` with every line of `reader`: its number (from 1), its text without the newline,
/// and whether it ended in one (only a file's last line may not). One line is held at a time.
pub(crate) fn each_line(
    path: &Path,
    mut reader: impl BufRead,
    mut each: impl FnMut(usize, &str, bool) -> Result<(), AuditError>,
) -> Result<usize, AuditError> {
    let mut buf = Vec::new();
    let mut n = 0;
    loop {
        buf.clear();
        let read = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| AuditError::Open {
                path: path.display().to_string(),
                message: format!("could not read it: {e}"),
            })?;
        if read == 0 {
            return Ok(n);
        }
        n += 1;
        let terminated = buf.last() == Some(&b'\n');
        if terminated {
            buf.pop();
        }
        each(n, line_text(path, n, &buf, !terminated)?, terminated)?;
    }
}

/// The fields of a line the chain's check reads; the rest is checked as JSON and skipped.
#[derive(Deserialize)]
struct ChainFields<'a> {
    #[serde(borrow, default)]
    prev: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    event: Option<Cow<'a, str>>,
}

/// A line's chain fields, when it is a JSON object whose `prev` and `event` (if there) are
/// strings.
fn chain_fields(line: &str) -> Result<ChainFields<'_>, String> {
    if !line.trim_start().starts_with('{') {
        return Err("not a JSON object".into());
    }
    serde_json::from_str(line).map_err(|e| e.to_string())
}

const TRUNCATED: &str =
    "the last line is truncated (a write was interrupted); remove it to continue the log";

/// Line `n` of the file at `path` as text. codemode writes only UTF-8 (a lone surrogate in a
/// call's arguments is written as U+FFFD), so other bytes were put there by something else.
/// They are never decoded lossily: that would turn them into U+FFFD, and a line whose U+FFFD
/// was swapped for other bytes would verify. `unterminated` says the line is the file's last
/// and lacks its newline, where a character cut short is an interrupted write.
pub(crate) fn line_text<'a>(
    path: &Path,
    n: usize,
    line: &'a [u8],
    unterminated: bool,
) -> Result<&'a str, AuditError> {
    std::str::from_utf8(line).map_err(|e| AuditError::Broken {
        path: path.display().to_string(),
        line: n,
        problem: if unterminated && e.error_len().is_none() {
            TRUNCATED.into()
        } else {
            not_utf8(format!("at byte {} of the line", e.valid_up_to() + 1))
        },
    })
}

/// Why a record does not belong in a file of its kind: a journal's lines are all starts, a
/// log's never.
fn wrong_kind(journal: bool, event: Option<&str>) -> Option<&'static str> {
    let start = event == Some("started");
    match (journal, start) {
        (true, false) => Some(
            "it is not a call's start, and this file is a journal (`.started`), which holds only starts: the journal was replaced by a log",
        ),
        (false, true) => Some(
            "it is a call's start, which only the journal (`<log>.started`) holds: the log was replaced by its journal",
        ),
        _ => None,
    }
}

/// Why bytes that are not UTF-8 mean a change, for a place in a file.
fn not_utf8(at: String) -> String {
    format!(
        "its bytes are not valid UTF-8 {at}: codemode writes only UTF-8 (a lone surrogate in a call's arguments is written as U+FFFD), so the file was changed outside codemode"
    )
}

fn check(
    path: &Path,
    log: impl BufRead,
    head_bytes: &[u8],
    key: Option<&AuditKey>,
) -> Result<VerifyReport, AuditError> {
    let p = path.display().to_string();
    let broken = |line: usize, problem: String| AuditError::Broken {
        path: p.clone(),
        line,
        problem,
    };
    let bad_head = |problem: String| AuditError::Head {
        path: p.clone(),
        problem: format!(
            "its head file {} is not valid: {problem}",
            head_path(path).display()
        ),
    };
    let head_text = std::str::from_utf8(head_bytes).map_err(|e| {
        let at = e.valid_up_to();
        let line = head_bytes[..at].iter().filter(|b| **b == b'\n').count() + 1;
        bad_head(not_utf8(format!(
            "at line {line} (byte {} of the file)",
            at + 1
        )))
    })?;
    let head = if head_text.trim().is_empty() {
        None
    } else {
        Some(Head::parse(head_text, key).map_err(bad_head)?)
    };
    // A journal (`<log>.started`) holds only starts and a log none: both use one key, so
    // without this a log swapped with its journal would verify on its own.
    let journal = path
        .file_name()
        .is_some_and(|name| name.to_string_lossy().ends_with(".started"));
    let mut prev = GENESIS.to_string();
    let mut hash_at_head: Option<String> = None;
    let count = each_line(path, log, |n, line, terminated| {
        if !terminated {
            return Err(broken(n, TRUNCATED.into()));
        }
        let fields = chain_fields(line)
            .map_err(|e| broken(n, format!("not a JSON record ({e}); the line was changed")))?;
        let Some((covered, hash)) = split_line(line) else {
            return Err(broken(
                n,
                "the hash is missing or not at the end of the line; the line was changed".into(),
            ));
        };
        if let Some(key) = key
            && !key.verify(covered.as_bytes(), hash)
        {
            return Err(broken(
                n,
                "the line's MAC does not verify with the key: the line was changed or forged, or written with another key (or by a codemode without keyed logs)".into(),
            ));
        }
        if let Some(problem) = wrong_kind(journal, fields.event.as_deref()) {
            return Err(broken(n, problem.into()));
        }
        if fields.prev.as_deref().unwrap_or_default() != prev {
            let problem = if n == 1 {
                "it does not start the chain: lines before it were removed".to_string()
            } else {
                format!(
                    "it does not follow line {}: a line between them was removed, or lines were reordered",
                    n - 1
                )
            };
            return Err(broken(n, problem));
        }
        prev = hash.to_string();
        if head.as_ref().is_some_and(|h| h.lines == n) {
            hash_at_head = Some(prev.clone());
        }
        Ok(())
    })?;
    let head_check = match &head {
        None => HeadCheck::Missing,
        Some(h) if h.lines > count => {
            return Err(AuditError::Head {
                path: p,
                problem: format!(
                    "the log has {count} lines but its head records {}: lines were cut from the end",
                    h.lines
                ),
            });
        }
        Some(h) if h.lines == 0 && h.hash == GENESIS => {
            if count == 0 {
                HeadCheck::Matches
            } else {
                HeadCheck::Behind { extra: count }
            }
        }
        Some(h) if hash_at_head.as_deref() != Some(h.hash.as_str()) => {
            return Err(AuditError::Head {
                path: p,
                problem: format!(
                    "line {} is not the line its head records: the log was rewritten from there on",
                    h.lines
                ),
            });
        }
        Some(h) if h.lines == count => HeadCheck::Matches,
        Some(h) => HeadCheck::Behind {
            extra: count - h.lines,
        },
    };
    Ok(VerifyReport {
        lines: count,
        last_hash: prev,
        authenticated: key.is_some(),
        head: head_check,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_head_is_never_claimed_as_proven() {
        let report = VerifyReport {
            lines: 3,
            last_hash: "h".into(),
            authenticated: true,
            head: HeadCheck::Missing,
        };
        assert!(
            report
                .proves()
                .iter()
                .all(|p| !p.contains("head were") && !p.contains("no line was cut")),
            "{:?}",
            report.proves()
        );
        assert!(
            report
                .cannot_prove()
                .iter()
                .any(|c| c.contains("no head file"))
        );
    }
}
