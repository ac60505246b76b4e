//! Audit streams: opaque lines chained by hash, one chain per stream.
//!
//! The store does not know how lines are hashed or signed (that is the gate's audit format).
//! It serializes the chain: [`append_audit`](crate::StateStore::append_audit) hands the
//! stream's head to the caller's closure, which makes the next line and its hash, and stores
//! the line as the new head only if the head is still the one the line was made on (memory
//! and SQLite lock the head first; PostgreSQL checks it in the statement that writes, and
//! makes the line again on a head another replica moved). So two replicas appending at once
//! make one chain without forks, and the `(stream, prev)` uniqueness in the schema refuses a
//! fork even if that logic were wrong.

use serde::{Deserialize, Serialize};

use crate::error::{Result, StateError};
use crate::validate::{check_id, check_text};

/// The last line of a stream: the one a new line chains onto.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditHead {
    /// Lines in the stream so far (the last line's `seq`); 0 for an empty stream.
    pub seq: u64,
    /// The last line's hash; `None` for an empty stream (the caller picks its genesis value).
    pub hash: Option<String>,
}

/// When an appended line must have reached the store's disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Before the append returns.
    #[default]
    Now,
    /// The append returns once the line is committed (every replica sees it, and it stays if
    /// the appending process dies), but the store may flush it to disk later: with the next
    /// line appended [`Durability::Now`] (a flush takes every commit before it too) or on its
    /// own shortly after (PostgreSQL: within three `wal_writer_delay`s, 0.6 s by default). Only
    /// a crash of the store's server in that time loses it, and the appending process then
    /// finds the stream's head behind its own last line and fails its next append. For lines
    /// that a later durable line covers; stores without the distinction write every line now.
    Deferred,
}

/// What the closure makes: the line's text and its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditLine {
    pub line: String,
    pub hash: String,
}

/// Makes the next line from the head it chains onto; keep it quick and free of I/O. It may run
/// more than once: PostgreSQL chains lines optimistically onto the head it last wrote, and
/// makes them again on the head another replica moved meanwhile. Only the line made on the
/// head it is stored after is kept. An `Err` aborts the append with nothing written.
pub type AuditLineFn = Box<dyn Fn(&AuditHead) -> Result<AuditLine, String> + Send + Sync>;

/// A stored line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub stream: String,
    /// 1 for the first line, then consecutive.
    pub seq: u64,
    /// The previous line's hash (`None` for the first line).
    pub prev: Option<String>,
    pub hash: String,
    pub line: String,
    pub at_ms: i64,
}

/// Runs the caller's closure and checks what it made.
pub(crate) fn make_line(
    stream: &str,
    head: &AuditHead,
    make: &AuditLineFn,
    now_ms: i64,
) -> Result<AuditRecord> {
    let made = make(head).map_err(|message| StateError::AuditLine {
        stream: stream.to_string(),
        message,
    })?;
    check_text("audit line", &made.line)?;
    check_id("audit line hash", &made.hash)?;
    if head.hash.as_deref() == Some(made.hash.as_str()) {
        return Err(StateError::AuditLine {
            stream: stream.to_string(),
            message: "the new line has the same hash as the line before it".into(),
        });
    }
    Ok(AuditRecord {
        stream: stream.to_string(),
        seq: head.seq + 1,
        prev: head.hash.clone(),
        hash: made.hash,
        line: made.line,
        at_ms: now_ms,
    })
}

pub(crate) fn validate_stream(stream: &str) -> Result<()> {
    check_id("audit stream", stream)
}
