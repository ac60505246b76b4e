//! The JSON Lines log of a deterministic run: written with `Script::record`, served back with
//! `Script::replay` so the same script makes the same calls and gets the same answers without a host.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::host::{HostCallKind, HostError};

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum LogEntry {
    Header {
        #[serde(rename = "scriptSha256")]
        script_sha256: String,
        seed: u32,
        #[serde(rename = "startMs")]
        start_ms: f64,
    },
    Call {
        id: u64,
        name: String,
        kind: HostCallKind,
        args: Value,
    },
    Result {
        id: u64,
        /// Virtual `Date.now()` when the result was delivered.
        #[serde(rename = "atMs")]
        at_ms: f64,
        ok: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<HostError>,
    },
}

/// Appends entries to a log file. Write errors are remembered and reported with the result.
pub(crate) struct Recorder {
    out: BufWriter<File>,
    pub error: Option<String>,
}

impl Recorder {
    pub fn create(path: &Path) -> Result<Recorder, String> {
        File::create(path)
            .map(|f| Recorder {
                out: BufWriter::new(f),
                error: None,
            })
            .map_err(|e| format!("could not create the record log {}: {e}", path.display()))
    }

    pub fn write(&mut self, entry: &LogEntry) {
        if self.error.is_some() {
            return;
        }
        let line = match serde_json::to_string(entry) {
            Ok(l) => l,
            Err(e) => {
                self.error = Some(e.to_string());
                return;
            }
        };
        if let Err(e) = writeln!(self.out, "{line}") {
            self.error = Some(e.to_string());
        }
    }

    pub fn call(&mut self, id: u64, name: &str, kind: HostCallKind, args: &Value) {
        self.write(&LogEntry::Call {
            id,
            name: name.to_string(),
            kind,
            args: args.clone(),
        });
    }

    pub fn finish(&mut self) -> Option<String> {
        if let Err(e) = self.out.flush() {
            self.error.get_or_insert(e.to_string());
        }
        self.error.clone()
    }
}

/// A log read back for replay.
#[derive(Debug, Clone)]
pub(crate) struct ReplayLog {
    pub seed: u32,
    pub start_ms: f64,
    pub script_sha256: String,
    calls: Vec<(u64, String, HostCallKind, Value)>,
    pub results: VecDeque<(u64, f64, Result<Value, HostError>)>,
}

impl ReplayLog {
    pub fn read(path: &Path) -> Result<ReplayLog, String> {
        let file = File::open(path)
            .map_err(|e| format!("could not open the replay log {}: {e}", path.display()))?;
        let mut header = None;
        let mut calls = Vec::new();
        let mut results = VecDeque::new();
        for (n, line) in BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|e| format!("could not read the replay log: {e}"))?;
            if line.trim().is_empty() {
                continue;
            }
            let entry: LogEntry = serde_json::from_str(&line)
                .map_err(|e| format!("line {} of the replay log is not a log entry: {e}", n + 1))?;
            match entry {
                LogEntry::Header {
                    script_sha256,
                    seed,
                    start_ms,
                } => header = Some((script_sha256, seed, start_ms)),
                LogEntry::Call {
                    id,
                    name,
                    kind,
                    args,
                } => calls.push((id, name, kind, args)),
                LogEntry::Result {
                    id,
                    at_ms,
                    ok,
                    value,
                    error,
                } => {
                    let r = if ok {
                        Ok(value.unwrap_or(Value::Null))
                    } else {
                        Err(error.unwrap_or_else(|| HostError::new("call failed")))
                    };
                    results.push_back((id, at_ms, r));
                }
            }
        }
        let Some((script_sha256, seed, start_ms)) = header else {
            return Err("the replay log has no header line; record it with `record` first".into());
        };
        Ok(ReplayLog {
            seed,
            start_ms,
            script_sha256,
            calls,
            results,
        })
    }

    /// Checks call number `id` against the log.
    pub fn check_call(
        &self,
        id: u64,
        name: &str,
        kind: HostCallKind,
        args: &Value,
    ) -> Result<(), String> {
        let made = format!("{name}({})", compact(args));
        // Calls are logged in id order, so call `id` is normally at index id - 1.
        let at = usize::try_from(id.saturating_sub(1)).ok();
        let logged = at
            .and_then(|i| self.calls.get(i))
            .filter(|c| c.0 == id)
            .or_else(|| self.calls.iter().find(|c| c.0 == id));
        match logged {
            None => Err(format!(
                "Replay diverged at call {id}: the script called {made}, but the log has no call {id}."
            )),
            Some((_, n, k, a)) if n != name || *k != kind || a != args => Err(format!(
                "Replay diverged at call {id}: the script called {made}, but the log has {n}({}).",
                compact(a)
            )),
            Some(_) => Ok(()),
        }
    }
}

fn compact(v: &Value) -> String {
    crate::session::preview(&v.to_string(), 200)
}
