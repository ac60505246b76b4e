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
use std::time::Duration;

use sha2::{Digest, Sha256};

use codemode_sandbox::HostError;
use codemode_spec::{DeadlineClock, Usage};
use codemode_state::{ReplayEntry, StateStore};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::LiveCell;

/// Arguments over this size are logged by their SHA-256 only: the log needs them only to see
/// that a rebuilt script makes the same call, and a script must not make the shared store hold
/// a copy of every large argument it passes (refused calls included).
const MAX_LOGGED_ARGS: usize = 64 * 1024;

/// Arguments with more JSON values than this are logged by their SHA-256 only too: a short
/// text of many small values (`[0,0,0,…]`) is tens of times larger once a rebuilding process
/// decodes it.
const MAX_LOGGED_ARG_VALUES: u64 = 1024;

/// Most JSON values one cell's log may hold. The byte cap alone let a log of small values
/// decode to gigabytes in the process that takes the cell over (red team: 11 MB of log took
/// a process from 56 MB to 829 MB), and every process that took it over next died the same way.
const MAX_LOG_VALUES: u64 = 2_000_000;

/// JSON values in `v`, itself included; counting stops past `limit`.
fn value_count(v: &Value, limit: u64) -> u64 {
    let mut n = 0u64;
    let mut todo = vec![v];
    while let Some(v) = todo.pop() {
        n += 1;
        if n > limit {
            break;
        }
        match v {
            Value::Array(items) => todo.extend(items),
            Value::Object(map) => todo.extend(map.values()),
            _ => {}
        }
    }
    n
}

/// Most bytes one cell's replay log may hold. Past it the cell stops (it could not be rebuilt)
/// rather than fill the shared store, or the memory of whichever process rebuilds it.
const MAX_LOG_BYTES: u64 = 256 * 1024 * 1024;

/// What a call spent where it ran, which a rebuilt script counts again.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Charge {
    /// Whether the tool ran, even if the call then failed (a result withheld by a budget or
    /// blocked by an after-hook).
    pub ran: bool,
    /// Bytes of the result counted against `max_bytes`.
    #[serde(default)]
    pub bytes: u64,
    /// A model call's tokens and cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "lowercase")]
enum Step {
    Start {
        seq: u64,
        name: String,
        args: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        args_sha256: Option<String>,
        /// The script's running time (its deadline clock) when this was logged. Missing in
        /// logs written before it was recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        running_ms: Option<u64>,
    },
    End {
        seq: u64,
        name: String,
        args: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        args_sha256: Option<String>,
        ok: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<Box<HostError>>,
        /// What the call spent where it ran. Missing in logs written before it was recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        spent: Option<Charge>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        running_ms: Option<u64>,
    },
}

struct Logged {
    name: String,
    args: Value,
    args_sha256: Option<String>,
    result: Option<Result<Value, HostError>>,
    spent: Option<Charge>,
}

impl Logged {
    fn same_args(&self, args: &Value) -> bool {
        match &self.args_sha256 {
            Some(digest) => args_digest(args) == *digest,
            None => self.args == *args,
        }
    }

    fn args_preview(&self) -> String {
        match &self.args_sha256 {
            Some(digest) => format!("<arguments logged by SHA-256 {}…>", &digest[..12]),
            None => preview(&self.args),
        }
    }
}

/// The SHA-256 of arguments as the log keeps them: of their JSON text.
fn args_digest(args: &Value) -> String {
    text_digest(&args.to_string())
}

fn text_digest(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// `args` as the log keeps them: whole, or by their digest when large.
fn logged_args(args: &Value) -> (Value, Option<String>) {
    let text = args.to_string();
    if text.len() <= MAX_LOGGED_ARGS
        && value_count(args, MAX_LOGGED_ARG_VALUES) <= MAX_LOGGED_ARG_VALUES
    {
        (args.clone(), None)
    } else {
        (Value::Null, Some(text_digest(&text)))
    }
}

/// What the log says about a call the script makes now.
pub(crate) enum Replayed {
    /// Not in the log: run it.
    Live,
    /// In the log with its result: the script gets that, nothing runs. `spent`: what the call
    /// spent where it ran (`None` in logs that did not record it).
    Result {
        result: Result<Value, HostError>,
        spent: Option<Charge>,
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
    /// Logged calls the rebuilt script made again.
    reached: std::sync::Mutex<std::collections::HashSet<u64>>,
    /// The log's end; held while appending, so steps stay consecutive.
    tail: tokio::sync::Mutex<Tail>,
    max_log_bytes: u64,
    max_log_values: u64,
    /// The script's deadline clock; a rebuilt cell's starts at the running time its log
    /// last recorded, so a takeover does not hand the script a fresh timeout.
    clock: DeadlineClock,
}

struct Tail {
    /// The next step's number.
    next: u64,
    /// Bytes the log holds.
    bytes: u64,
    /// JSON values the log holds.
    values: u64,
}

impl CellLink {
    /// `entries`: the log read back when the cell is rebuilt (empty for a new cell).
    pub fn new(
        cell: Arc<LiveCell>,
        store: Arc<dyn StateStore>,
        replica: String,
        entries: Vec<ReplayEntry>,
    ) -> Result<CellLink, String> {
        let mut logged: HashMap<u64, Logged> = HashMap::new();
        let mut bytes = 0u64;
        let mut values = 0u64;
        let last = entries.last().map(|e| e.step).unwrap_or(0);
        let mut ran_ms = 0u64;
        // Taken by value: a log near its bounds is not held twice while it is read.
        for e in entries {
            bytes += e.entry.to_string().len() as u64;
            values += value_count(&e.entry, u64::MAX);
            let step: Step = serde_json::from_value(e.entry).map_err(|err| {
                format!(
                    "step {} of the cell's replay log cannot be read ({err}); the cell cannot be rebuilt",
                    e.step
                )
            })?;
            match step {
                Step::Start {
                    seq,
                    name,
                    args,
                    args_sha256,
                    running_ms,
                } => {
                    ran_ms = ran_ms.max(running_ms.unwrap_or(0));
                    logged.entry(seq).or_insert(Logged {
                        name,
                        args,
                        args_sha256,
                        result: None,
                        spent: None,
                    });
                }
                Step::End {
                    seq,
                    name,
                    args,
                    args_sha256,
                    ok,
                    value,
                    error,
                    spent,
                    running_ms,
                } => {
                    ran_ms = ran_ms.max(running_ms.unwrap_or(0));
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
                            args_sha256,
                            result: Some(result),
                            spent,
                        },
                    );
                }
            }
        }
        Ok(CellLink {
            cell,
            store,
            replica,
            logged: std::sync::Mutex::new(logged),
            reached: std::sync::Mutex::new(std::collections::HashSet::new()),
            tail: tokio::sync::Mutex::new(Tail {
                next: last + 1,
                bytes,
                values,
            }),
            max_log_bytes: MAX_LOG_BYTES,
            max_log_values: MAX_LOG_VALUES,
            clock: DeadlineClock::carrying(Duration::from_millis(ran_ms)),
        })
    }

    /// The clock the script's deadline runs on (shared: the script's run uses this one).
    pub fn clock(&self) -> DeadlineClock {
        self.clock.clone()
    }

    fn running_ms(&self) -> Option<u64> {
        Some(u64::try_from(self.clock.running().as_millis()).unwrap_or(u64::MAX))
    }

    #[cfg(test)]
    fn with_max_log_bytes(mut self, max: u64) -> Self {
        self.max_log_bytes = max;
        self
    }

    #[cfg(test)]
    fn with_max_log_values(mut self, max: u64) -> Self {
        self.max_log_values = max;
        self
    }

    /// Checks call `seq` against the log.
    pub fn replay(&self, seq: u64, name: &str, args: &Value) -> Replayed {
        let logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = logged.get(&seq) else {
            // Past the log: the time it carried counts from here on.
            self.clock.catch_up();
            return Replayed::Live;
        };
        {
            let mut reached = self.reached.lock().unwrap_or_else(|e| e.into_inner());
            reached.insert(seq);
            if reached.len() >= logged.len() {
                self.clock.catch_up();
            }
        }
        if entry.name != name || !entry.same_args(args) {
            let message = format!(
                "Rebuilding cell {} diverged at step {seq}: the script called {name}({}), but the log has {}({}). The script behaves differently when run again (does it depend on time, randomness or a value it did not get from a call?), so the cell cannot continue; run it again as a new script.",
                self.cell.id,
                preview(args),
                entry.name,
                entry.args_preview()
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
                    spent: entry.spent.clone(),
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

    /// After the rebuilt script ended: fails the cell when it never made a logged call again.
    /// That call ran before the takeover and its effect stands; a script that ends without it
    /// would report, and store, as if it had not (a retry could then do it twice).
    pub fn fail_if_calls_were_skipped(&self) -> Option<String> {
        let logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        let reached = self.reached.lock().unwrap_or_else(|e| e.into_inner());
        let first = logged.keys().filter(|s| !reached.contains(s)).min()?;
        let entry = &logged[first];
        let message = format!(
            "Rebuilding cell {} diverged: the script ended without making call {first} again ({}({})), which ran before the takeover, so its effect stands. The script behaves differently when run again (does it depend on time, randomness or a value it did not get from a call?), so the cell cannot continue and its result and store() writes are dropped; check that call's effect by hand, then run the rest as a new script.",
            self.cell.id,
            entry.name,
            entry.args_preview()
        );
        drop(reached);
        drop(logged);
        self.cell.fail(message.clone());
        Some(message)
    }

    /// Logs that call `seq` is about to run.
    pub async fn started(&self, seq: u64, name: &str, args: &Value) -> Result<(), String> {
        let (args, args_sha256) = logged_args(args);
        self.append(Step::Start {
            seq,
            name: name.to_string(),
            args,
            args_sha256,
            running_ms: self.running_ms(),
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
        spent: Charge,
    ) -> Result<(), String> {
        let (args, args_sha256) = logged_args(args);
        self.append(Step::End {
            seq,
            name: name.to_string(),
            args,
            args_sha256,
            ok: result.is_ok(),
            value: result.as_ref().ok().cloned(),
            error: result.as_ref().err().cloned().map(Box::new),
            spent: Some(spent),
            running_ms: self.running_ms(),
        })
        .await
    }

    async fn append(&self, step: Step) -> Result<(), String> {
        if self.cell.is_abandoned() {
            return Err("this process let go of the cell; another one carries it on".into());
        }
        let entry = serde_json::to_value(&step).map_err(|e| e.to_string())?;
        let size = entry.to_string().len() as u64;
        let values = value_count(&entry, self.max_log_values);
        let mut tail = self.tail.lock().await;
        if tail.values + values > self.max_log_values {
            let message = format!(
                "The cell's replay log would pass {} JSON values with this call's {values} (it logs every call's arguments and result, so that the cell can be rebuilt), so the cell was stopped. Run a script that moves this much data without cells, or have it return less per call.",
                self.max_log_values
            );
            self.cell.fail(message.clone());
            return Err(message);
        }
        if tail.bytes + size > self.max_log_bytes {
            let message = format!(
                "The cell's replay log would pass {} bytes with this call's {size} (it logs every call's arguments and result, so that the cell can be rebuilt), so the cell was stopped. Run a script that moves this much data without cells, or have it return less per call.",
                self.max_log_bytes
            );
            self.cell.fail(message.clone());
            return Err(message);
        }
        let written = self
            .store
            .append_replay(
                &self.cell.id,
                &self.replica,
                &[ReplayEntry {
                    step: tail.next,
                    entry,
                }],
            )
            .await;
        match written {
            Ok(()) => {
                tail.next += 1;
                tail.bytes += size;
                tail.values += values;
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

#[cfg(test)]
mod tests {
    use super::*;
    use codemode_state::{MemoryStore, NewCell};
    use serde_json::json;

    /// A cell `c` of session `s` held by `r` in a fresh store, and its live side.
    async fn a_cell() -> (Arc<dyn StateStore>, Arc<LiveCell>) {
        let store: Arc<dyn StateStore> = Arc::new(MemoryStore::default());
        store
            .create_cell(NewCell {
                id: "c".into(),
                session_id: "s".into(),
                source: "".into(),
                source_hash: "0".repeat(64),
                options: json!({}),
                owner: "r".into(),
                lease: std::time::Duration::from_secs(60),
                max_live_per_session: None,
            })
            .await
            .unwrap();
        let live = Arc::new(LiveCell::new(
            "c".into(),
            "s".into(),
            tokio_util::sync::CancellationToken::new(),
        ));
        (store, live)
    }

    #[tokio::test]
    async fn a_log_past_its_bound_stops_the_cell_and_keeps_nothing_more() {
        let (store, live) = a_cell().await;
        let link = CellLink::new(live.clone(), store.clone(), "r".into(), Vec::new())
            .unwrap()
            .with_max_log_bytes(1_000);
        link.started(1, "t", &json!({})).await.unwrap();
        let big = Ok(json!("z".repeat(2_000)));
        let refused = link
            .ended(1, "t", &json!({}), &big, Charge::default())
            .await
            .unwrap_err();
        assert!(
            refused.contains("replay log would pass 1000 bytes"),
            "{refused}"
        );
        assert!(live.failure().is_some_and(|f| f.contains("was stopped")));
        assert_eq!(store.read_replay("c").await.unwrap().len(), 1);
    }

    /// Red team: refused calls with 64 KB of `[0,0,…]` each passed the byte cap and decoded to
    /// gigabytes where the cell was rebuilt. Such arguments are logged by digest, and the log
    /// counts its values.
    #[tokio::test]
    async fn a_log_of_many_small_values_is_bounded_by_its_values() {
        let (store, live) = a_cell().await;
        let link = CellLink::new(live.clone(), store.clone(), "r".into(), Vec::new())
            .unwrap()
            .with_max_log_values(5_000);
        // Many-valued arguments are logged by digest: a small entry.
        let zeros = json!(vec![0; 30_000]);
        link.started(1, "t", &zeros).await.unwrap();
        let logged = store.read_replay("c").await.unwrap();
        assert!(logged[0].entry["args"].is_null(), "{}", logged[0].entry);
        assert!(logged[0].entry["args_sha256"].is_string());
        // A result of many values is logged whole, within the log's count.
        let many = Ok(json!(vec![1; 3_000]));
        link.ended(1, "t", &zeros, &many, Charge::default())
            .await
            .unwrap();
        link.started(2, "t", &json!({})).await.unwrap();
        let refused = link
            .ended(2, "t", &json!({}), &many, Charge::default())
            .await
            .unwrap_err();
        assert!(refused.contains("5000 JSON values"), "{refused}");
        assert!(live.failure().is_some_and(|f| f.contains("was stopped")));
        // Rebuilt, the log it left counts the same.
        let entries = store.read_replay("c").await.unwrap();
        assert_eq!(entries.len(), 3);
        let total: u64 = entries
            .iter()
            .map(|e| value_count(&e.entry, u64::MAX))
            .sum();
        assert!(total <= 5_000, "{total}");
    }
}
