//! The journal: a "started" line for each call that can change something, written before the
//! call runs, and the check that pairs those lines with the log's outcome lines.

use std::borrow::Cow;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use codemode_state::StateStore;
use serde::Deserialize;
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

/// What a log's outcome lines say about its journal: which starts they close, and whether the
/// log holds a start itself (then it is the journal, put in the log's place).
#[derive(Default)]
struct Outcomes {
    holds_start: bool,
    ended: HashSet<String>,
}

impl Outcomes {
    fn add(&mut self, event: Option<&str>, journal_id: Option<&str>) {
        self.holds_start |= event == Some("started");
        if let Some(id) = journal_id {
            self.ended.insert(id.to_string());
        }
    }

    fn add_record(&mut self, record: &Value) {
        self.add(
            record.get("event").and_then(Value::as_str),
            journal_id(record),
        );
    }

    /// An outcome line's fields, read without building the rest of it. Lines that are not
    /// JSON objects are skipped, as a log's reader skips them.
    fn add_line(&mut self, line: &str) {
        #[derive(Deserialize)]
        struct Pairing<'a> {
            #[serde(borrow, default)]
            event: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            journal_id: Option<Cow<'a, str>>,
        }
        if !line.trim_start().starts_with('{') {
            return;
        }
        if let Ok(p) = serde_json::from_str::<Pairing>(line) {
            self.add(p.event.as_deref(), p.journal_id.as_deref());
        }
    }
}

/// Pairs a journal's starts, one at a time, with a log's [`Outcomes`], keeping only the starts
/// without one: the calls that were started and never finished, in journal order. They pair
/// by the journal line's id, which is unique: call ids start again in every process, so a call
/// id alone would let an earlier run's outcome close a later run's killed call. Both chains
/// use one key, so each side must also be what it says: a log that holds starts was replaced by
/// its journal, and an outcome naming a start the journal lacks means the journal was cut or
/// emptied (a start is written before its call runs).
struct Unmatched<'a> {
    journal: &'a str,
    outcomes: Outcomes,
    starts: HashSet<String>,
    open: Vec<UnfinishedCall>,
}

impl<'a> Unmatched<'a> {
    fn new(journal: &'a str, outcomes: Outcomes) -> Self {
        Unmatched {
            journal,
            outcomes,
            starts: HashSet::new(),
            open: Vec::new(),
        }
    }

    fn wrong(&self, problem: &str) -> AuditError {
        AuditError::Head {
            path: self.journal.to_string(),
            problem: problem.to_string(),
        }
    }

    fn start(&mut self, record: Value) -> Result<(), AuditError> {
        if record.get("event").and_then(Value::as_str) != Some("started") {
            return Err(self.wrong("it holds lines that are not starts: it was replaced by a log"));
        }
        let id = journal_id(&record).map(str::to_string);
        if !id
            .as_ref()
            .is_some_and(|id| self.outcomes.ended.contains(id))
        {
            self.open.push(UnfinishedCall { record });
        }
        self.starts.extend(id);
        Ok(())
    }

    fn finish(self) -> Result<Vec<UnfinishedCall>, AuditError> {
        if self.outcomes.holds_start {
            return Err(self.wrong(
                "its log holds starts, not outcomes: the log was replaced by this journal",
            ));
        }
        if !self.outcomes.ended.is_subset(&self.starts) {
            return Err(self.wrong(
                "the log names a start it lacks: starts were cut from it or it was emptied",
            ));
        }
        Ok(self.open)
    }
}

/// Calls `each` with every line of a log or journal file, as it stood between two whole lines.
/// Its bytes are never decoded lossily: a line that is not UTF-8 was changed outside codemode,
/// and is an error naming it.
fn each_line_of(
    path: &Path,
    mut each: impl FnMut(&str) -> Result<(), AuditError>,
) -> Result<(), AuditError> {
    let opened = |e: std::io::Error| AuditError::Open {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let file = std::fs::File::open(path).map_err(opened)?;
    // The length under the shared lock ends at a whole line (see `verify`).
    let settled = {
        let _lock = super::Flock::shared(&file).map_err(opened)?;
        file.metadata().map_err(opened)?.len()
    };
    let reader = verify::read_settled(&file, settled).map_err(opened)?;
    verify::each_line(path, reader, |_, text, _| each(text))?;
    Ok(())
}

/// Verifies the journal of the log at `log` (its chain, and with the key its MACs) and returns
/// the calls it records as started that have no outcome line in the log. A log without a
/// journal (written before journals existed) has none. Both files are read a line at a time.
pub fn unfinished_calls(
    log: &Path,
    key: Option<&AuditKey>,
) -> Result<Vec<UnfinishedCall>, AuditError> {
    let journal = started_path(log);
    // The log before the journal: a start is written before its outcome, so every outcome read
    // names a start the journal then holds. The other way round, a call that started and ended
    // between the two reads of a log being written read as a start cut from the journal.
    let mut outcomes = Outcomes::default();
    each_line_of(log, |line| {
        outcomes.add_line(line);
        Ok(())
    })?;
    if !journal.exists() {
        return match outcomes.ended.is_empty() {
            false => Err(gone(&journal.display().to_string())),
            true => Ok(Vec::new()),
        };
    }
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
    let shown = journal.display().to_string();
    let mut pairs = Unmatched::new(&shown, outcomes);
    each_line_of(&journal, |line| match serde_json::from_str::<Value>(line) {
        Ok(record) => pairs.start(record),
        Err(_) => Ok(()),
    })?;
    pairs.finish()
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
        let mut journalled = false;
        each_stream_record(
            store,
            stream,
            |r| {
                journalled |= journal_id(&r).is_some();
                Ok(())
            },
            read_err,
        )
        .await?;
        return match journalled {
            true => Err(gone(&format!(
                "audit stream `{journal}` in {}",
                store.describe()
            ))),
            false => Ok(Vec::new()),
        };
    }
    // The outcomes first, for the reason `unfinished_calls` gives.
    let mut outcomes = Outcomes::default();
    each_stream_record(
        store,
        stream,
        |r| {
            outcomes.add_record(&r);
            Ok(())
        },
        read_err,
    )
    .await?;
    verify_stream(store, &journal, key).await?;
    let shown = format!("audit stream `{journal}` in {}", store.describe());
    let mut pairs = Unmatched::new(&shown, outcomes);
    each_stream_record(store, &journal, |r| pairs.start(r), read_err).await?;
    pairs.finish()
}

/// Calls `each` with every record of a stream, a page at a time. Lines that are not JSON are
/// skipped (the stream's check names them).
async fn each_stream_record(
    store: &dyn StateStore,
    stream: &str,
    mut each: impl FnMut(Value) -> Result<(), AuditError>,
    read_err: impl Fn(codemode_state::StateError) -> AuditError,
) -> Result<(), AuditError> {
    let mut seq = 0;
    loop {
        let page = store
            .read_audit(stream, seq, 1000)
            .await
            .map_err(&read_err)?;
        let Some(last) = page.last() else {
            return Ok(());
        };
        seq = last.seq;
        for record in page
            .iter()
            .filter_map(|r| serde_json::from_str(&r.line).ok())
        {
            each(record)?;
        }
    }
}
