//! Outcome lines of a script's calls that the script does not wait for.
//!
//! On a shared store every audit line is a round trip. A script's call that can change something
//! already has its start in the journal before it runs, so a process that dies before the
//! call's outcome line is stored still leaves the call on record (as unfinished). Its outcome
//! line can therefore be written while the script goes on, as long as the script's own
//! `codemode` line waits for all of them first: that line is durable and follows them, so the
//! model gets nothing from a script until every line of it is stored, and a line that could not
//! be written withholds the script's result. Calls not journalled (read-only tools) keep
//! waiting for their line: it is their only record.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio_util::task::TaskTracker;

use super::Inner;
use super::admission::audit_failed;
use crate::audit::PendingLine;

/// The lines still being written for one running script.
pub(crate) struct ScriptLines {
    key: Key,
    tracker: TaskTracker,
    failed: Mutex<Option<String>>,
}

impl ScriptLines {
    /// Waits for every line handed over so far; the first failure, if any.
    pub(crate) async fn wait(&self) -> Option<String> {
        self.tracker.close();
        self.tracker.wait().await;
        lock(&self.failed).take()
    }
}

/// A script by its session and its `codemode` call's id: call ids are unique per front end,
/// not per process, and a call of one session must never count as another session's.
type Key = (String, String);

/// Open scripts.
#[derive(Default)]
pub(crate) struct InFlightLines {
    open: Mutex<HashMap<Key, Arc<ScriptLines>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl InFlightLines {
    /// Opens the set of the script run by the call `call_id` of `session`; `None` if another
    /// running script of the session has that call id (its calls then wait for their own lines).
    pub(crate) fn open(&self, session: &str, call_id: &str) -> Option<Arc<ScriptLines>> {
        let key = (session.to_string(), call_id.to_string());
        let mut open = lock(&self.open);
        if open.contains_key(&key) {
            return None;
        }
        let lines = Arc::new(ScriptLines {
            key: key.clone(),
            tracker: TaskTracker::new(),
            failed: Mutex::new(None),
        });
        open.insert(key, lines.clone());
        Some(lines)
    }

    /// Closes the set: calls that end from now on wait for their own lines. Only the set that
    /// was opened is removed (a call id reused by another script keeps its own).
    pub(crate) fn close(&self, lines: &Arc<ScriptLines>) {
        let mut open = lock(&self.open);
        if open.get(&lines.key).is_some_and(|l| Arc::ptr_eq(l, lines)) {
            open.remove(&lines.key);
        }
    }

    /// Writes `line` on the set of the open script `parent` of `session`, and `Ok`; or gives
    /// it back when that script is not open (not a script, already finished, or no runtime to
    /// write it on). A line that fails refuses every later call, as one waited for would.
    pub(crate) fn hand_over(
        &self,
        gate: &Arc<Inner>,
        session: &str,
        parent: &str,
        line: PendingLine,
    ) -> Result<(), PendingLine> {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return Err(line);
        };
        // Under the lock, so a script that is closing either waits for this line or was closed
        // before it and makes the call wait for it itself.
        let open = lock(&self.open);
        let key = (session.to_string(), parent.to_string());
        let Some(lines) = open.get(&key).cloned() else {
            return Err(line);
        };
        let gate = gate.clone();
        let tracker = lines.tracker.clone();
        tracker.spawn_on(
            async move {
                if let Err(e) = line.await {
                    audit_failed(&gate, &e);
                    lock(&lines.failed).get_or_insert(e.to_string());
                }
            },
            &rt,
        );
        Ok(())
    }
}
