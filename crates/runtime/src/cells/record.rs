//! A cell's replay log: each call the script made and what it got back, written to the state
//! store before the script sees the result, and served back when the cell is rebuilt.
//!
//! A call that runs a tool is logged twice: `start` once the gate admitted it (after any
//! approval) and just before the tool runs, then `end` with the result. A rebuilt cell that
//! meets a call with a `start` but no `end` cannot know whether its effect happened, so it
//! fails naming the call rather than run it a second time.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use codemode_sandbox::HostError;
use codemode_spec::Usage;
use codemode_state::{ReplayEntry, StateStore};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::LiveCell;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "lowercase")]
enum Step {
    Start {
        seq: u64,
        name: String,
        args: Value,
    },
    End {
        seq: u64,
        name: String,
        args: Value,
        ok: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<Box<HostError>>,
        /// What the call spent (a model call's tokens and cost): a rebuilt script counts it
        /// against its budget again. Missing in logs written before it was recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<Usage>,
    },
}

struct Logged {
    name: String,
    args: Value,
    result: Option<Result<Value, HostError>>,
    usage: Option<Usage>,
}

/// What the log says about a call the script makes now.
pub(crate) enum Replayed {
    /// Not in the log: run it.
    Live,
    /// In the log with its result: the script gets that, nothing runs. `usage`: what the call
    /// spent where it ran.
    Result {
        result: Result<Value, HostError>,
        usage: Option<Usage>,
    },
    /// The cell cannot go on (the message says why); it has been failed.
    Stop(String),
}

/// Ties a script run to its cell: the log to serve from, the store to write to.
pub(crate) struct CellLink {
    pub cell: Arc<LiveCell>,
    store: Arc<dyn StateStore>,
    replica: String,
    logged: std::sync::Mutex<HashMap<u64, Logged>>,
    /// The next step's number; held while appending, so steps stay consecutive.
    next_step: tokio::sync::Mutex<u64>,
}

impl CellLink {
    /// `entries`: the log read back when the cell is rebuilt (empty for a new cell).
    pub fn new(
        cell: Arc<LiveCell>,
        store: Arc<dyn StateStore>,
        replica: String,
        entries: &[ReplayEntry],
    ) -> Result<CellLink, String> {
        let mut logged: HashMap<u64, Logged> = HashMap::new();
        for e in entries {
            let step: Step = serde_json::from_value(e.entry.clone()).map_err(|err| {
                format!(
                    "step {} of the cell's replay log cannot be read ({err}); the cell cannot be rebuilt",
                    e.step
                )
            })?;
            match step {
                Step::Start { seq, name, args } => {
                    logged.entry(seq).or_insert(Logged {
                        name,
                        args,
                        result: None,
                        usage: None,
                    });
                }
                Step::End {
                    seq,
                    name,
                    args,
                    ok,
                    value,
                    error,
                    usage,
                } => {
                    let result = if ok {
                        Ok(value.unwrap_or(Value::Null))
                    } else {
                        Err(error.map_or_else(|| HostError::new("call failed"), |e| *e))
                    };
                    logged.insert(
                        seq,
                        Logged {
                            name,
                            args,
                            result: Some(result),
                            usage,
                        },
                    );
                }
            }
        }
        let last = entries.last().map(|e| e.step).unwrap_or(0);
        Ok(CellLink {
            cell,
            store,
            replica,
            logged: std::sync::Mutex::new(logged),
            next_step: tokio::sync::Mutex::new(last + 1),
        })
    }

    /// Checks call `seq` against the log.
    pub fn replay(&self, seq: u64, name: &str, args: &Value) -> Replayed {
        let logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = logged.get(&seq) else {
            return Replayed::Live;
        };
        if entry.name != name || entry.args != *args {
            let message = format!(
                "Rebuilding cell {} diverged at step {seq}: the script called {name}({}), but the log has {}({}). The script behaves differently when run again (does it depend on time, randomness or a value it did not get from a call?), so the cell cannot continue; run it again as a new script.",
                self.cell.id,
                preview(args),
                entry.name,
                preview(&entry.args)
            );
            drop(logged);
            self.cell.fail(message.clone());
            return Replayed::Stop(message);
        }
        match &entry.result {
            Some(r) => {
                self.cell.replayed.fetch_add(1, Ordering::Relaxed);
                Replayed::Result {
                    result: r.clone(),
                    usage: entry.usage.clone(),
                }
            }
            None => {
                let message = format!(
                    "Cell {} cannot be rebuilt: call {seq} ({name}) was running when the codemode process holding the cell stopped, so whether it took effect is unknown, and running it again could do it twice. Check its effect by hand, then run the rest as a new script.",
                    self.cell.id
                );
                drop(logged);
                self.cell.fail(message.clone());
                Replayed::Stop(message)
            }
        }
    }

    /// Logs that call `seq` is about to run.
    pub async fn started(&self, seq: u64, name: &str, args: &Value) -> Result<(), String> {
        self.append(Step::Start {
            seq,
            name: name.to_string(),
            args: args.clone(),
        })
        .await
    }

    /// Logs what call `seq` returned (a refusal included) and what it spent.
    pub async fn ended(
        &self,
        seq: u64,
        name: &str,
        args: &Value,
        result: &Result<Value, HostError>,
        usage: Option<&Usage>,
    ) -> Result<(), String> {
        self.append(Step::End {
            seq,
            name: name.to_string(),
            args: args.clone(),
            ok: result.is_ok(),
            value: result.as_ref().ok().cloned(),
            error: result.as_ref().err().cloned().map(Box::new),
            usage: usage.filter(|u| !u.is_empty()).cloned(),
        })
        .await
    }

    async fn append(&self, step: Step) -> Result<(), String> {
        if self.cell.is_abandoned() {
            return Err("this process let go of the cell; another one carries it on".into());
        }
        let entry = serde_json::to_value(&step).map_err(|e| e.to_string())?;
        let mut next = self.next_step.lock().await;
        let written = self
            .store
            .append_replay(
                &self.cell.id,
                &self.replica,
                &[ReplayEntry { step: *next, entry }],
            )
            .await;
        match written {
            Ok(()) => {
                *next += 1;
                Ok(())
            }
            Err(e) => {
                if let codemode_state::StateError::CellFinished { .. } = e
                    && let Some(why) =
                        super::session_end::ended_elsewhere(self.store.as_ref(), &self.cell.id)
                            .await
                {
                    // Its session ended on another process: this call does not run.
                    self.cell.end_elsewhere(why.clone());
                    return Err(why);
                }
                let message = format!(
                    "The cell's replay log could not be written ({e}), so the cell could not be rebuilt after a restart; it was stopped."
                );
                self.cell.fail(message.clone());
                Err(message)
            }
        }
    }
}

fn preview(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() <= 200 {
        return s;
    }
    let mut out: String = s.chars().take(200).collect();
    out.push('…');
    out
}
