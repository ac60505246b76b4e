//! The journal: a "started" line for each call that can change something, written before the
//! call runs, and the check that pairs those lines with the log's outcome lines.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use codemode_state::StateStore;
use serde_json::Value;

use super::{AuditError, AuditKey, verify, verify_stream};

/// The journal beside a log file: `<log>.started` (with its own `.head`).
pub fn started_path(log: &Path) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".started");
    PathBuf::from(name)
}

/// The journal of a stream: the stream `<stream>.started` in the same store.
pub fn started_stream(stream: &str) -> String {
    format!("{stream}.started")
}

/// A call that was recorded as started but has no outcome line: its process stopped (was
/// killed, or crashed) while it ran, so what it did is unknown.
#[derive(Debug, Clone, PartialEq)]
pub struct UnfinishedCall {
    /// The journal's record (tool, provenance, arguments' hash and preview, decision).
    pub record: Value,
}

impl UnfinishedCall {
    pub fn call_id(&self) -> &str {
        call_id(&self.record).unwrap_or("")
    }

    /// One line for people: when, which tool, which call, with what.
    pub fn summary(&self) -> String {
        let field = |k: &str| self.record.get(k).and_then(Value::as_str).unwrap_or("?");
        let parent = self
            .record
            .pointer("/provenance/parent_call_id")
            .and_then(Value::as_str)
            .map(|p| format!(" (inside call {p})"))
            .unwrap_or_default();
        format!(
            "{} `{}` call {}{parent}, args {}",
            field("time"),
            field("tool"),
            self.call_id(),
            field("args_preview")
        )
    }
}

fn said_journalled(record: &Value) -> bool {
    journal_id(record).is_some()
}

fn journal_id(record: &Value) -> Option<&str> {
    record.get("journal_id").and_then(Value::as_str)
}

/// The error for a journal that the log's own lines say existed.
fn gone(journal: &str) -> AuditError {
    AuditError::Head {
        path: journal.to_string(),
        problem: "it is missing, but lines of the log say calls were journalled there: it was deleted, so calls whose process was killed cannot be named".into(),
    }
}

fn call_id(record: &Value) -> Option<&str> {
    record
        .pointer("/provenance/call_id")
        .and_then(Value::as_str)
}

/// Started calls in `started` without a line in `outcomes`, in journal order. They pair by the
/// journal line's id, which is unique: call ids start again in every process, so a call id
/// alone would let an earlier run's outcome close a later run's killed call. Both chains use
/// one key, so each side must also be what it says:
/// a log that holds starts was replaced by its journal, and an outcome naming a start the
/// journal lacks means the journal was cut or emptied (a start is written before its call runs).
fn unmatched(
    journal: &str,
    started: Vec<Value>,
    outcomes: impl Iterator<Item = Value>,
) -> Result<Vec<UnfinishedCall>, AuditError> {
    let wrong = |problem: &str| AuditError::Head {
        path: journal.to_string(),
        problem: problem.to_string(),
    };
    if started
        .iter()
        .any(|v| v.get("event").and_then(Value::as_str) != Some("started"))
    {
        return Err(wrong(
            "it holds lines that are not starts: it was replaced by a log",
        ));
    }
    let starts: HashSet<&str> = started.iter().filter_map(journal_id).collect();
    let mut ended: HashSet<String> = HashSet::new();
    for v in outcomes {
        if v.get("event").and_then(Value::as_str) == Some("started") {
            return Err(wrong(
                "its log holds starts, not outcomes: the log was replaced by this journal",
            ));
        }
        if let Some(id) = journal_id(&v) {
            if !starts.contains(id) {
                return Err(wrong(
                    "the log names a start it lacks: starts were cut from it or it was emptied",
                ));
            }
            ended.insert(id.to_string());
        }
    }
    Ok(started
        .into_iter()
        .filter(|v| !journal_id(v).is_some_and(|id| ended.contains(id)))
        .map(|record| UnfinishedCall { record })
        .collect())
}

/// The records of a log or journal file. Its bytes are never decoded lossily: a line that is
/// not UTF-8 was changed outside codemode, and is an error naming it.
fn records(path: &Path) -> Result<Vec<Value>, AuditError> {
    let opened = |e: std::io::Error| AuditError::Open {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let file = std::fs::File::open(path).map_err(opened)?;
    // Between two whole lines of a log being written (see `verify`).
    let lock = super::Flock::shared(&file).map_err(opened)?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut &file, &mut bytes).map_err(opened)?;
    drop(lock);
    let lines = verify::split_lines(&bytes);
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        let unterminated = i + 1 == lines.len() && !bytes.ends_with(b"\n");
        let text = verify::line_text(path, i + 1, line, unterminated)?;
        if let Ok(value) = serde_json::from_str(text) {
            out.push(value);
        }
    }
    Ok(out)
}

/// Verifies the journal of the log at `log` (its chain, and with the key its MACs) and returns
/// the calls it records as started that have no outcome line in the log. A log without a
/// journal (written before journals existed) has none.
pub fn unfinished_calls(
    log: &Path,
    key: Option<&AuditKey>,
) -> Result<Vec<UnfinishedCall>, AuditError> {
    let journal = started_path(log);
    if !journal.exists() {
        return match records(log)?.iter().any(said_journalled) {
            true => Err(gone(&journal.display().to_string())),
            false => Ok(Vec::new()),
        };
    }
    // The log before the journal: a start is written before its outcome, so every outcome read
    // names a start the journal then holds. The other way round, a call that started and ended
    // between the two reads of a log being written read as a start cut from the journal.
    let outcomes = records(log)?;
    let report = verify(&journal, key)?;
    if report.head == super::HeadCheck::Missing && report.lines > 0 {
        // As for the log: without its head, lines cut from the journal's end (a command
        // removing its own start) cannot be ruled out.
        return Err(AuditError::Head {
            path: journal.display().to_string(),
            problem: format!(
                "its head file {} is missing or empty, so starts cut from its end cannot be ruled out",
                super::head_path(&journal).display()
            ),
        });
    }
    let started = records(&journal)?;
    unmatched(
        &journal.display().to_string(),
        started,
        outcomes.into_iter(),
    )
}

/// [`unfinished_calls`] for a stream in a state store.
pub async fn unfinished_stream_calls(
    store: &dyn StateStore,
    stream: &str,
    key: Option<&AuditKey>,
) -> Result<Vec<UnfinishedCall>, AuditError> {
    let journal = started_stream(stream);
    let read_err = |e: codemode_state::StateError| AuditError::Open {
        path: format!("audit stream `{journal}` in {}", store.describe()),
        message: e.to_string(),
    };
    if !store
        .audit_streams()
        .await
        .map_err(read_err)?
        .contains(&journal)
    {
        let outcomes = read_stream(store, stream).await.map_err(read_err)?;
        return match outcomes.iter().any(said_journalled) {
            true => Err(gone(&format!(
                "audit stream `{journal}` in {}",
                store.describe()
            ))),
            false => Ok(Vec::new()),
        };
    }
    // The outcomes first, for the reason `unfinished_calls` gives.
    let outcomes = read_stream(store, stream).await.map_err(read_err)?;
    verify_stream(store, &journal, key).await?;
    let started = read_stream(store, &journal).await.map_err(read_err)?;
    unmatched(
        &format!("audit stream `{journal}` in {}", store.describe()),
        started,
        outcomes.into_iter(),
    )
}

async fn read_stream(
    store: &dyn StateStore,
    stream: &str,
) -> Result<Vec<Value>, codemode_state::StateError> {
    let mut out = Vec::new();
    let mut seq = 0;
    loop {
        let page = store.read_audit(stream, seq, 1000).await?;
        let Some(last) = page.last() else {
            return Ok(out);
        };
        seq = last.seq;
        out.extend(
            page.iter()
                .filter_map(|r| serde_json::from_str(&r.line).ok()),
        );
    }
}
