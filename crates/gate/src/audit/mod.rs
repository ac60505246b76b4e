//! The audit log: one JSON line per call, chained by keyed hashes, with a keyed head beside it.
//!
//! Each line is a JSON object whose last two fields are `prev` (the `hash` of the line before,
//! 64 zeros for the first) and `hash`: HMAC-SHA256, under the user's [`AuditKey`], of the line's
//! text up to and including `prev`'s value and its closing quote. A changed line fails its own
//! hash; a removed or reordered line breaks the next `prev`; a forged line cannot be given a
//! valid hash without the key, and neither can a whole rewritten chain.
//!
//! Cutting lines from the end leaves a valid chain, so the log keeps a head file beside it
//! (`<log>.head`): the number of lines and the last hash, keyed too. It is rewritten under the
//! same lock after every line, so a log shorter than its head, or different at the head's line,
//! was cut or rewritten.
//!
//! Appends take an advisory `flock` on the log and read the chain's end from the file under it,
//! so several processes can write one log and the chain stays whole.
//!
//! A call's line is written when it ends, so a process killed while a call ran (a `bash`
//! command can `kill -9` its parent) would leave no trace of it. Calls that can change
//! something therefore get a line in the log's *journal* first (`<log>.started`, or the stream
//! `<stream>.started`), a chain of its own kept the same way, before they run; a started call
//! with no outcome line in the log is one whose process stopped while it ran
//! ([`unfinished_calls`]).

mod journal;
mod key;
mod stream;
mod verify;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::FlockOperation;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

pub use journal::{
    UnfinishedCall, started_path, started_stream, unfinished_calls, unfinished_stream_calls,
};
pub use key::AuditKey;
pub use stream::{StreamReport, verify_stream};
pub use verify::{HeadCheck, VerifyReport, verify};

use codemode_state::{Durability, StateStore};
use futures::future::BoxFuture;

pub(crate) const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("cannot open audit log {path}: {message}")]
    Open { path: String, message: String },
    #[error("cannot write audit log {path}: {message}")]
    Write { path: String, message: String },
    #[error("audit log {path} line {line}: {problem}")]
    Broken {
        path: String,
        line: usize,
        problem: String,
    },
    #[error("audit log {path}: {problem}")]
    Head { path: String, problem: String },
    #[error("audit key {path}: {problem}")]
    Key { path: String, problem: String },
}

/// The head file beside a log.
pub fn head_path(log: &Path) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".head");
    PathBuf::from(name)
}

/// What the head file records: how many lines the log has and the last one's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Head {
    pub lines: usize,
    pub hash: String,
}

impl Head {
    fn text(&self, key: &AuditKey) -> String {
        format!(
            "{{\"lines\":{},\"hash\":\"{}\",\"mac\":\"{}\"}}\n",
            self.lines,
            self.hash,
            key.mac(self.signed().as_bytes())
        )
    }

    fn signed(&self) -> String {
        format!("codemode audit head\n{}\n{}", self.lines, self.hash)
    }

    /// Parses a head file; with a key, only a head whose MAC checks is returned.
    pub(crate) fn parse(text: &str, key: Option<&AuditKey>) -> Result<Head, String> {
        let v: Value = serde_json::from_str(text.trim()).map_err(|e| format!("not JSON ({e})"))?;
        let lines = v.get("lines").and_then(Value::as_u64);
        let hash = v.get("hash").and_then(Value::as_str);
        let mac = v.get("mac").and_then(Value::as_str);
        let (Some(lines), Some(hash), Some(mac)) = (lines, hash, mac) else {
            return Err("it lacks `lines`, `hash` or `mac`".into());
        };
        let head = Head {
            lines: lines as usize,
            hash: hash.to_string(),
        };
        if let Some(key) = key
            && !key.verify(head.signed().as_bytes(), mac)
        {
            return Err(
                "its MAC does not verify with this key: it was forged, or written with another key"
                    .into(),
            );
        }
        Ok(head)
    }
}

struct Files {
    log: File,
    head: File,
    /// Where this process's last line ended, and its hash: a log found shorter, or different
    /// there, was cut or replaced behind the gate's back (a `bash` command can do that).
    written: Option<Written>,
    /// Set once an append gave up waiting for the log's `flock`: later appends (the calls that
    /// were already running when it did; the gate refuses every call after) take the lock only
    /// if it is free at once, rather than wait the bound again one after another.
    gave_up: bool,
}

struct Written {
    end: u64,
    hash: String,
}

struct Inner {
    path: PathBuf,
    key: AuditKey,
    files: Mutex<Files>,
}

/// Where decisions and outcomes are written: a file, or a stream in a shared state store.
/// Cloning shares the files (or the stream).
#[derive(Clone, Default)]
pub struct AuditLog {
    inner: Option<Arc<Inner>>,
    stream: Option<Arc<stream::StreamLog>>,
    /// Where a call that can change something is recorded before it runs.
    journal: Option<Arc<AuditLog>>,
}

/// A line on its way to a stream; the call's outcome is final once it completes.
pub(crate) type PendingLine = BoxFuture<'static, Result<(), AuditError>>;

impl AuditLog {
    /// No log (for embedders that record elsewhere).
    pub fn disabled() -> Self {
        AuditLog::default()
    }

    /// Lines go to `stream` in a state store that several replicas may share: one chain per
    /// stream, serialized by the store, keyed with `key` as the file's lines are.
    /// `codemode audit verify --state URL --stream NAME` checks it.
    pub fn stream(
        store: Arc<dyn StateStore>,
        stream: impl Into<String>,
        key: AuditKey,
    ) -> Result<Self, AuditError> {
        let stream = stream.into();
        if stream.is_empty() || stream.len() > 200 {
            return Err(AuditError::Open {
                path: format!("audit stream `{stream}`"),
                message: "a stream name has 1 to 200 characters".into(),
            });
        }
        if stream.ends_with(".started") {
            return Err(AuditError::Open {
                path: format!("audit stream `{stream}`"),
                message: "names ending in `.started` are the journals of other streams; choose another name".into(),
            });
        }
        let journal = AuditLog {
            inner: None,
            stream: Some(Arc::new(stream::StreamLog {
                store: store.clone(),
                stream: started_stream(&stream),
                key: key.clone(),
            })),
            journal: None,
        };
        Ok(AuditLog {
            inner: None,
            stream: Some(Arc::new(stream::StreamLog { store, stream, key })),
            journal: Some(Arc::new(journal)),
        })
    }

    /// The store the stream's lines go to, if they go to a stream.
    pub(crate) fn stream_store(&self) -> Option<&Arc<dyn StateStore>> {
        self.stream.as_ref().map(|s| &s.store)
    }

    /// Where lines go, for messages: the file's path or the stream and its store.
    pub fn describe(&self) -> Option<String> {
        match (&self.inner, &self.stream) {
            (Some(i), _) => Some(i.path.display().to_string()),
            (None, Some(s)) => Some(s.describe()),
            (None, None) => None,
        }
    }

    /// Appends one record to the file or the stream.
    pub async fn append_async(&self, record: Map<String, Value>) -> Result<(), AuditError> {
        match self.submit(record)? {
            Some(line) => line.await,
            None => Ok(()),
        }
    }

    /// Checks, before a call runs, that the log file is still the one this process writes and
    /// still holds its last line, so a call never runs onto a log that was cut behind the
    /// gate's back. A stream has nothing to check here (the store keeps its head).
    pub(crate) fn check_intact(&self) -> Result<(), AuditError> {
        if let Some(journal) = &self.journal {
            journal.check_intact()?;
        }
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        inner.lock().still_ours(&inner.path)
    }

    /// Whether calls are journalled before they run (a log or stream is set).
    pub(crate) fn has_journal(&self) -> bool {
        self.journal.is_some()
    }

    /// Writes a call's "started" record to the journal (nothing without a log); like
    /// [`AuditLog::submit`], a stream's line comes back as a future to await.
    pub(crate) fn submit_started(
        &self,
        record: Map<String, Value>,
    ) -> Result<Option<PendingLine>, AuditError> {
        // A start is followed by its call's outcome line, which flushes it (or by the stream's
        // next durable line, if the process dies first).
        match &self.journal {
            Some(journal) => journal.submit_with(record, Durability::Deferred),
            None => Ok(None),
        }
    }

    /// Writes a record: a file line at once; a stream line through the returned future, which
    /// the caller awaits (or spawns, where it cannot wait). The line is durable when the
    /// future completes.
    pub(crate) fn submit(
        &self,
        record: Map<String, Value>,
    ) -> Result<Option<PendingLine>, AuditError> {
        self.submit_with(record, Durability::Now)
    }

    /// [`AuditLog::submit`], saying when the line must be on the disk: a file's line is written
    /// at once either way, and flushed with everything before it for [`Durability::Now`].
    pub(crate) fn submit_with(
        &self,
        record: Map<String, Value>,
        durability: Durability,
    ) -> Result<Option<PendingLine>, AuditError> {
        if let Some(s) = &self.stream {
            return Ok(Some(s.append(record, durability)));
        }
        self.append(record)?;
        if durability == Durability::Now {
            self.sync_to_disk()?;
        }
        Ok(None)
    }

    /// Flushes the log, the journal and their heads to the disk, as a stream's durable line
    /// is: a line the model's answer waits for must survive a crash of the machine, and with it
    /// every line before it and the journal starts they name (a log whose outcomes outlived
    /// their starts, or whose head fell behind, would read as tampered with). Outside the
    /// append lock, so other processes do not wait for this disk flush.
    fn sync_to_disk(&self) -> Result<(), AuditError> {
        if let Some(journal) = &self.journal {
            journal.sync_to_disk()?;
        }
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        let (log, head) = {
            let files = inner.lock();
            (files.log.try_clone(), files.head.try_clone())
        };
        let flushed = log
            .and_then(|f| f.sync_data())
            .and_then(|()| head.and_then(|f| f.sync_data()));
        flushed.map_err(|e| AuditError::Write {
            path: inner.path.display().to_string(),
            message: format!("could not flush it to the disk: {e}"),
        })
    }

    /// Opens (or creates) the log keyed with the user's key at [`AuditKey::default_path`],
    /// creating that key on first use. Callers that keep the key elsewhere use
    /// [`AuditLog::open_with_key`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, AuditError> {
        let key_path = AuditKey::default_path().ok_or_else(|| AuditError::Key {
            path: "$XDG_STATE_HOME/codemode/audit.key".into(),
            problem: "neither XDG_STATE_HOME nor HOME is set, so the key has no place; set one"
                .into(),
        })?;
        Self::open_with_key(path, AuditKey::load_or_create(&key_path)?)
    }

    /// Opens (or creates) the log and continues its chain. The whole log is checked against the
    /// key and its head first; a log that does not verify is refused, so new lines are never
    /// chained onto a broken or forged one.
    pub fn open_with_key(path: impl AsRef<Path>, key: AuditKey) -> Result<Self, AuditError> {
        let named_as_journal = |p: &Path| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with(".started"))
        };
        let journal_name = |p: &Path| {
            AuditError::Open {
            path: p.display().to_string(),
            message: "a log's name must not end in `.started`, which names the journal beside a log (verifying would take the log for one); choose another name".into(),
        }
        };
        if named_as_journal(path.as_ref()) {
            return Err(journal_name(path.as_ref()));
        }
        let mut log = Self::open_chain(path.as_ref().to_path_buf(), key.clone())?;
        if let Some(real) = log.path().filter(|p| named_as_journal(p)) {
            return Err(journal_name(real));
        }
        // Beside the real file, not beside a symlink to it: head, journal and the protected
        // paths must be the same whichever name a process was given.
        let real = log.path().map(started_path).unwrap_or_default();
        log.journal = Some(Arc::new(Self::open_chain(real, key)?));
        Ok(log)
    }

    /// Opens one chained file (the log, or its journal).
    fn open_chain(path: PathBuf, key: AuditKey) -> Result<Self, AuditError> {
        let shown = path.display().to_string();
        let open_err = |e: std::io::Error| AuditError::Open {
            path: shown.clone(),
            message: e.to_string(),
        };
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).map_err(open_err)?;
        }
        let options = |append: bool| {
            let mut o = OpenOptions::new();
            o.create(true).read(true).mode(0o600);
            if append {
                o.append(true);
            } else {
                o.write(true);
            }
            o
        };
        let log = options(true).open(&path).map_err(open_err)?;
        let path = std::fs::canonicalize(&path).map_err(open_err)?;
        let head = options(false).open(head_path(&path)).map_err(open_err)?;
        let inner = Inner {
            path,
            key,
            files: Mutex::new(Files {
                log,
                head,
                written: None,
                gave_up: false,
            }),
        };
        {
            let files = inner.lock();
            let _lock = Flock::exclusive(&files.log, LOCK_WAIT).map_err(open_err)?;
            let report = verify::verify_open(&inner.path, &files.log, &files.head, &inner.key)?;
            if report.head_stale {
                // A process stopped between writing a line and its head: catch the head up.
                write_head(
                    &files.head,
                    &Head {
                        lines: report.lines,
                        hash: report.last_hash.clone(),
                    },
                    &inner.key,
                )
                .map_err(open_err)?;
            }
        }
        Ok(AuditLog {
            inner: Some(Arc::new(inner)),
            stream: None,
            journal: None,
        })
    }

    pub fn path(&self) -> Option<&Path> {
        self.inner.as_ref().map(|i| i.path.as_path())
    }

    /// Appends one record (a JSON object) with its chain fields, under the log's lock. A
    /// stream is written asynchronously: [`AuditLog::append_async`].
    pub fn append(&self, record: Map<String, Value>) -> Result<(), AuditError> {
        if let Some(s) = &self.stream {
            return Err(AuditError::Write {
                path: s.describe(),
                message: "a stream is written with append_async".into(),
            });
        }
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        let write_err = |message: String| AuditError::Write {
            path: inner.path.display().to_string(),
            message,
        };
        let mut guard = inner.lock();
        let files = &mut *guard;
        let wait = if files.gave_up {
            std::time::Duration::ZERO
        } else {
            LOCK_WAIT
        };
        let _lock = Flock::exclusive(&files.log, wait).map_err(|e| {
            files.gave_up = true;
            write_err(e.to_string())
        })?;
        files.still_ours(&inner.path)?;
        // Another process may have appended since our last line: the end is read from the file.
        let end = chain_end(&inner.path, &files.log, &files.head, &inner.key)?;
        let mut record = record;
        record.remove("prev");
        record.remove("hash");
        record.insert("prev".into(), Value::String(end.hash.clone()));
        let body = serde_json::to_string(&Value::Object(record))
            .map_err(|e| write_err(format!("the record is not JSON: {e}")))?;
        // `body` ends with `}`; the MAC covers everything before it.
        let head_text = &body[..body.len().saturating_sub(1)];
        let hash = inner.key.mac(head_text.as_bytes());
        let line = format!("{head_text},\"hash\":\"{hash}\"}}\n");
        (&files.log)
            .write_all(line.as_bytes())
            .map_err(|e| write_err(e.to_string()))?;
        let written_end = files
            .log
            .metadata()
            .map_err(|e| write_err(e.to_string()))?
            .len();
        write_head(
            &files.head,
            &Head {
                lines: end.lines + 1,
                hash: hash.clone(),
            },
            &inner.key,
        )
        .map_err(|e| write_err(format!("the head file could not be updated: {e}")))?;
        files.written = Some(Written {
            end: written_end,
            hash,
        });
        Ok(())
    }
}

impl Files {
    /// The path still names the files this process writes, and the log still ends its last
    /// line where this process put it.
    fn still_ours(&self, path: &Path) -> Result<(), AuditError> {
        same_file(path, &self.log)?;
        if let Some(w) = &self.written {
            same_file(&head_path(path), &self.head)?;
            still_there(path, &self.log, w)?;
        }
        Ok(())
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Files> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How long an append waits for the log's lock. Writers hold it for one line; anything longer
/// is a process that took it to stop codemode (a read-only descriptor is enough to take it).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// An advisory lock on a file, released when dropped.
pub(crate) struct Flock<'a>(&'a File);

impl<'a> Flock<'a> {
    /// Takes the lock, waiting at most `wait` ([`LOCK_WAIT`] but after a give-up): a call must
    /// fail, not hang (and hold a thread) while another process keeps the log locked.
    fn exclusive(file: &'a File, wait: std::time::Duration) -> std::io::Result<Self> {
        Self::take(file, wait, FlockOperation::NonBlockingLockExclusive)
    }

    /// A shared lock, for reading a log whole: writers hold the exclusive one while they write
    /// a line and its head, so a reader under this one never sees half a line or a head ahead
    /// of its log.
    pub(crate) fn shared(file: &'a File) -> std::io::Result<Self> {
        Self::take(file, LOCK_WAIT, FlockOperation::NonBlockingLockShared)
    }

    fn take(
        file: &'a File,
        wait: std::time::Duration,
        operation: FlockOperation,
    ) -> std::io::Result<Self> {
        let started = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(1);
        loop {
            match rustix::fs::flock(file, operation) {
                Ok(()) => return Ok(Flock(file)),
                Err(rustix::io::Errno::WOULDBLOCK) if started.elapsed() < wait => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(50));
                }
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    return Err(std::io::Error::other(format!(
                        "another process has held the log locked (flock) for more than {} s; find it with `fuser` or `lsof` on the file and stop it (a program a script started can take the lock), then restart codemode",
                        LOCK_WAIT.as_secs()
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        let _ = rustix::fs::flock(self.0, FlockOperation::Unlock);
    }
}

fn write_head(file: &File, head: &Head, key: &AuditKey) -> std::io::Result<()> {
    let text = head.text(key);
    file.write_all_at(text.as_bytes(), 0)?;
    file.set_len(text.len() as u64)
}

/// The end of the chain as the file has it now: the line count and the last hash. Trusts the
/// head when it names the file's last line (checked with the key), and reads the whole log
/// otherwise. Bytes that are not UTF-8 in the head or the last line are never decoded
/// lossily (they would read as U+FFFD, and a changed line could pass): the whole log is read
/// then, and refused.
fn chain_end(path: &Path, log: &File, head: &File, key: &AuditKey) -> Result<Head, AuditError> {
    let head_bytes = verify::read_whole(head).map_err(|e| AuditError::Open {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let last = last_line(log).map_err(|e| AuditError::Open {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let text = std::str::from_utf8(&head_bytes).ok();
    if let (Some(text), Some(Ok(line))) = (text, last.as_deref().map(std::str::from_utf8))
        && let Ok(head) = Head::parse(text, Some(key))
        && verify::line_hash(line, key).as_deref() == Some(head.hash.as_str())
    {
        return Ok(head);
    }
    if last.is_none() && text.is_some_and(|t| t.trim().is_empty()) {
        return Ok(Head {
            lines: 0,
            hash: GENESIS.to_string(),
        });
    }
    let report = verify::verify_open(path, log, head, key)?;
    Ok(Head {
        lines: report.lines,
        hash: report.last_hash,
    })
}

/// Checks that the path still names the file this process appends to: a log deleted or moved
/// away (and maybe replaced) would take every later line with it, out of sight.
fn same_file(path: &Path, log: &File) -> Result<(), AuditError> {
    use std::os::unix::fs::MetadataExt;
    let open = log.metadata();
    let named = std::fs::metadata(path);
    match (open, named) {
        (Ok(a), Ok(b)) if a.dev() == b.dev() && a.ino() == b.ino() => Ok(()),
        _ => Err(AuditError::Head {
            path: path.display().to_string(),
            problem: "it was deleted, moved or replaced while this process wrote to it, so its lines are out of sight; no more are added. Find the old file as evidence, and start a new log".into(),
        }),
    }
}

/// Checks that the line this process wrote last is still where it put it. Other writers only
/// ever add lines after it; a log that is shorter, or holds another line there, was cut,
/// truncated or replaced, and chaining onto it would hide that.
fn still_there(path: &Path, log: &File, w: &Written) -> Result<(), AuditError> {
    let broken = |problem: String| AuditError::Head {
        path: path.display().to_string(),
        problem,
    };
    let len = log
        .metadata()
        .map_err(|e| broken(format!("cannot read its size: {e}")))?
        .len();
    let cut = || {
        broken(format!(
            "it was cut, truncated or replaced since this process wrote its last line (which ended at byte {}; the file has {len} bytes now, not ending in that line): lines are missing, so no more are added to it. Keep this file as evidence and start a new log",
            w.end
        ))
    };
    if len < w.end {
        return Err(cut());
    }
    let start = w.end.saturating_sub(64 * 1024);
    let mut buf = vec![0u8; (w.end - start) as usize];
    log.read_exact_at(&mut buf, start)
        .map_err(|e| broken(format!("cannot read it back: {e}")))?;
    let body = buf.strip_suffix(b"\n").ok_or_else(cut)?;
    let line = match body.iter().rposition(|b| *b == b'\n') {
        Some(at) => &body[at + 1..],
        None => body,
    };
    let expected = format!("\"hash\":\"{}\"}}", w.hash);
    if line.ends_with(expected.as_bytes()) {
        Ok(())
    } else {
        Err(cut())
    }
}

/// The last complete line of the file, without its newline, as the file's bytes.
fn last_line(file: &File) -> std::io::Result<Option<Vec<u8>>> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(None);
    }
    let mut tail: Vec<u8> = Vec::new();
    let mut end = len;
    // Doubled each time: a long last line is read in O(its length), not a chunk at a time
    // with everything read so far copied again for each (a 0.5 MB line cost 33 MB of copying).
    let mut chunk = 4096u64;
    loop {
        let start = end.saturating_sub(chunk);
        let mut buf = vec![0u8; (end - start) as usize];
        file.read_exact_at(&mut buf, start)?;
        buf.extend_from_slice(&tail);
        tail = buf;
        // Skip the final newline, then look for the one before the last line.
        let body = tail.strip_suffix(b"\n").unwrap_or(&tail);
        if let Some(at) = body.iter().rposition(|b| *b == b'\n') {
            return Ok(Some(body[at + 1..].to_vec()));
        }
        if start == 0 {
            return Ok(Some(body.to_vec()));
        }
        end = start;
        chunk = chunk.saturating_mul(2);
    }
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod last_line_tests {
    use super::last_line;
    use std::io::Write;

    /// Lines across the doubling reads: shorter than one, across two, across several.
    #[test]
    fn the_last_line_is_found_whatever_its_length() {
        for len in [0usize, 1, 4095, 4096, 4097, 12_289, 100_000] {
            for final_newline in [true, false] {
                if len == 0 && !final_newline {
                    continue; // "x…\n" alone: its last line is the x's.
                }
                let mut f = tempfile::tempfile().unwrap();
                let last = "y".repeat(len);
                write!(f, "{}\n{last}", "x".repeat(5000)).unwrap();
                if final_newline {
                    f.write_all(b"\n").unwrap();
                }
                let got = last_line(&f).unwrap().unwrap();
                assert_eq!(got.len(), len, "len {len}, final newline {final_newline}");
                assert!(got.iter().all(|b| *b == b'y'));
            }
        }
        let empty = tempfile::tempfile().unwrap();
        assert_eq!(last_line(&empty).unwrap(), None);
    }
}
