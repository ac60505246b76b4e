//! The audit log: one JSON line per call, chained by hashes so removed, changed or reordered
//! lines are detected.
//!
//! Each line is a JSON object whose last two fields are `prev` (the hash of the previous line,
//! 64 zeros for the first) and `hash` (SHA-256 of the line's text up to and including `prev`'s
//! value and its closing quote). A line is written with one `write` call on a file opened for
//! appending, so a crash loses at most the line being written.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

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
}

/// What `verify` found in an intact log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub lines: usize,
    /// Hash of the last line: keep it elsewhere to detect lines cut from the end.
    pub last_hash: String,
}

struct Writer {
    file: File,
    prev: String,
}

/// Where decisions and outcomes are written. Cloning shares the file.
#[derive(Clone, Default)]
pub struct AuditLog {
    inner: Option<Arc<(PathBuf, Mutex<Writer>)>>,
}

impl AuditLog {
    /// No log (for embedders that record elsewhere).
    pub fn disabled() -> Self {
        AuditLog { inner: None }
    }

    /// Opens (or creates) the log and continues its chain. A log whose last line is damaged is
    /// refused, so new lines are never chained onto a broken one.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, AuditError> {
        let path = path.as_ref().to_path_buf();
        let prev = if path.exists() {
            verify(&path)?.last_hash
        } else {
            GENESIS.to_string()
        };
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).map_err(|e| AuditError::Open {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| AuditError::Open {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
        Ok(AuditLog {
            inner: Some(Arc::new((path, Mutex::new(Writer { file, prev })))),
        })
    }

    /// A log writing to an already open file, starting a new chain (tests use a read-only file
    /// to simulate a disk that refuses writes).
    #[cfg(test)]
    pub(crate) fn with_file(path: PathBuf, file: File) -> Self {
        AuditLog {
            inner: Some(Arc::new((
                path,
                Mutex::new(Writer {
                    file,
                    prev: GENESIS.to_string(),
                }),
            ))),
        }
    }

    pub fn path(&self) -> Option<&Path> {
        self.inner.as_ref().map(|i| i.0.as_path())
    }

    /// Appends one record (a JSON object) with its chain fields.
    pub fn append(&self, record: Map<String, Value>) -> Result<(), AuditError> {
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        let mut w = inner.1.lock().unwrap_or_else(|e| e.into_inner());
        let mut record = record;
        record.remove("prev");
        record.remove("hash");
        record.insert("prev".into(), Value::String(w.prev.clone()));
        let body = serde_json::to_string(&Value::Object(record)).unwrap_or_default();
        // `body` ends with `}`; the hash covers everything before it.
        let head = &body[..body.len().saturating_sub(1)];
        let hash = sha256_hex(head.as_bytes());
        let line = format!("{head},\"hash\":\"{hash}\"}}\n");
        w.file
            .write_all(line.as_bytes())
            .and_then(|_| w.file.flush())
            .map_err(|e| AuditError::Write {
                path: inner.0.display().to_string(),
                message: e.to_string(),
            })?;
        w.prev = hash;
        Ok(())
    }
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Checks the whole chain. Says which line is the first that does not fit: a changed line fails
/// its own hash; a removed or reordered line breaks the `prev` link of the line after the gap.
pub fn verify(path: impl AsRef<Path>) -> Result<VerifyReport, AuditError> {
    let path = path.as_ref();
    let p = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| AuditError::Open {
        path: p.clone(),
        message: e.to_string(),
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let broken = |line: usize, problem: String| AuditError::Broken {
        path: p.clone(),
        line,
        problem,
    };
    let mut prev = GENESIS.to_string();
    let mut count = 0;
    let ends_cleanly = text.is_empty() || text.ends_with('\n');
    let lines: Vec<&str> = text.split_terminator('\n').collect();
    for (i, line) in lines.iter().enumerate() {
        let n = i + 1;
        let last = n == lines.len();
        if last && !ends_cleanly {
            return Err(broken(
                n,
                "the last line is truncated (a write was interrupted); remove it to continue the log".into(),
            ));
        }
        let value: Value = serde_json::from_str(line)
            .map_err(|e| broken(n, format!("not a JSON record ({e}); the line was changed")))?;
        let stated_hash = value
            .get("hash")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let suffix = format!(",\"hash\":\"{stated_hash}\"}}");
        let head = line.strip_suffix(&suffix).ok_or_else(|| {
            broken(
                n,
                "the hash is missing or not at the end of the line; the line was changed".into(),
            )
        })?;
        if sha256_hex(head.as_bytes()) != stated_hash {
            return Err(broken(
                n,
                "the line's content does not match its hash; the line was changed".into(),
            ));
        }
        let stated_prev = value
            .get("prev")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if stated_prev != prev {
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
        prev = stated_hash.to_string();
        count = n;
    }
    Ok(VerifyReport {
        lines: count,
        last_hash: prev,
    })
}
