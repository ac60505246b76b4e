//! A cell this process runs: what it printed so far, what it waits for, how it ended.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use codemode_sandbox::OutputItem;
use codemode_state::{ApprovalRecord, CellStatus};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::ScriptRun;

pub(crate) struct LiveCell {
    pub id: String,
    pub session_id: String,
    /// Stops the script (terminate, lost lease, shutdown); its calls are cancelled.
    pub abort: CancellationToken,
    /// Calls answered from the replay log when the cell was rebuilt.
    pub replayed: std::sync::atomic::AtomicU64,
    abandoned: std::sync::atomic::AtomicBool,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    output: Vec<OutputItem>,
    /// Output items already handed to a caller.
    reported: usize,
    /// Reports handed out so far.
    reports: usize,
    /// Approvals the script's calls wait for now.
    pending: Vec<ApprovalRecord>,
    terminated: bool,
    /// Why the cell cannot go on (replay divergence, a lost lease, a log that cannot be
    /// written); it fails with this message.
    failure: Option<String>,
    /// Why another process ended the cell (its session ended there); the store has the end.
    ended_elsewhere: Option<String>,
    /// Another process claimed the cell: it carries the script on and writes its end.
    carried_on_elsewhere: bool,
    end: Option<End>,
}

struct End {
    status: CellStatus,
    run: ScriptRun,
    at: Instant,
    collected: bool,
}

/// What a report takes from the cell.
pub(crate) struct Snapshot {
    pub status: CellStatus,
    /// Output since the last report.
    pub new_output: Vec<OutputItem>,
    pub pending: Vec<ApprovalRecord>,
    /// The run, the first time it is reported after the cell ended.
    pub run: Option<(ScriptRun, usize)>,
    /// No report was handed out before this one (the run did not yield).
    pub first: bool,
}

impl LiveCell {
    pub fn new(id: String, session_id: String, abort: CancellationToken) -> Self {
        LiveCell {
            id,
            session_id,
            abort,
            replayed: std::sync::atomic::AtomicU64::new(0),
            abandoned: std::sync::atomic::AtomicBool::new(false),
            state: Mutex::new(State::default()),
            changed: watch::channel(0).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn push_output(&self, item: &OutputItem) {
        self.lock().output.push(item.clone());
        self.bump();
    }

    pub fn add_pending(&self, approval: ApprovalRecord) {
        self.lock().pending.push(approval);
        self.bump();
    }

    /// Removes an approval that was answered; returns how many remain.
    pub fn remove_pending(&self, approval_id: &str) -> usize {
        let left = {
            let mut s = self.lock();
            s.pending.retain(|a| a.id != approval_id);
            s.pending.len()
        };
        self.bump();
        left
    }

    /// Stops driving the cell without recording an end, as if this process had died: its
    /// lease lapses and another process may rebuild it.
    pub fn abandon(&self) {
        self.abandoned
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.abort.cancel();
        self.bump();
    }

    pub fn is_abandoned(&self) -> bool {
        self.abandoned.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn terminate(&self) {
        self.lock().terminated = true;
        self.abort.cancel();
        self.bump();
    }

    pub fn was_terminated(&self) -> bool {
        self.lock().terminated
    }

    /// Fails the cell: the script is stopped and ends with `message`.
    pub fn fail(&self, message: String) {
        self.lock().failure.get_or_insert(message);
        self.abort.cancel();
        self.bump();
    }

    /// Stops the script because another process ended the cell in the store (its session
    /// ended there): it ends `terminated` with `message`, which the store holds already.
    pub fn end_elsewhere(&self, message: String) {
        {
            let mut s = self.lock();
            s.terminated = true;
            s.ended_elsewhere.get_or_insert(message);
        }
        self.abort.cancel();
        self.bump();
    }

    pub fn ended_elsewhere(&self) -> Option<String> {
        self.lock().ended_elsewhere.clone()
    }

    pub fn lost_lease(&self, message: String) {
        self.lock().carried_on_elsewhere = true;
        self.fail(format!(
            "This codemode process lost its hold on the cell and stopped running it: {message}"
        ));
    }

    /// This process let go of the cell (abandoned it) or another one claimed it: whoever
    /// holds it now writes the end of the script's call, so this one must not.
    pub fn handed_over(&self) -> bool {
        self.is_abandoned() || self.lock().carried_on_elsewhere
    }

    pub fn failure(&self) -> Option<String> {
        self.lock().failure.clone()
    }

    pub fn finish(&self, status: CellStatus, run: ScriptRun) {
        self.lock().end = Some(End {
            status,
            run,
            at: Instant::now(),
            collected: false,
        });
        self.bump();
    }

    pub fn is_done(&self) -> bool {
        self.lock().end.is_some()
    }

    /// How long ago the cell ended (zero while it runs).
    pub fn done_for(&self) -> Duration {
        self.lock()
            .end
            .as_ref()
            .map(|e| e.at.elapsed())
            .unwrap_or_default()
    }

    /// Whether the ended cell's result was handed out already.
    pub fn collected(&self) -> bool {
        self.lock().end.as_ref().is_some_and(|e| e.collected)
    }

    /// What a caller has not seen yet; marks it seen.
    pub fn take_report(&self) -> Snapshot {
        let mut s = self.lock();
        let from = s.reported;
        let first = s.reports == 0;
        s.reports += 1;
        let new_output = s.output[from..].to_vec();
        s.reported = s.output.len();
        let pending = s.pending.clone();
        let (status, run) = match s.end.as_mut() {
            Some(end) => {
                // Handed out once: what it printed and its run are not kept past that (a
                // script that printed 15 MB kept it all for an hour after it was read).
                let run = (!end.collected).then(|| {
                    (
                        std::mem::replace(
                            &mut end.run,
                            ScriptRun::refused(String::new(), String::new()),
                        ),
                        from,
                    )
                });
                end.collected = true;
                let status = end.status;
                s.output = Vec::new();
                s.reported = 0;
                (status, run)
            }
            None if !pending.is_empty() => (CellStatus::WaitingForApproval, None),
            None => (CellStatus::Running, None),
        };
        Snapshot {
            status,
            new_output,
            pending,
            run,
            first,
        }
    }

    /// The status now.
    pub fn status(&self) -> CellStatus {
        let s = self.lock();
        match &s.end {
            Some(end) => end.status,
            None if !s.pending.is_empty() => CellStatus::WaitingForApproval,
            None => CellStatus::Running,
        }
    }

    /// Waits until the cell ends or its status moves away from `from` (it starts or stops
    /// waiting for a person), or `limit` passes.
    pub async fn settle(&self, from: CellStatus, limit: Duration) {
        let mut rx = self.subscribe();
        let ready = |c: &LiveCell| {
            let now = c.status();
            now.is_terminal() || now != from
        };
        let wait = async {
            loop {
                if ready(self) {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(limit, wait).await;
    }

    /// Waits until the cell ended.
    pub async fn ended(&self) {
        let mut rx = self.subscribe();
        while !self.is_done() {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}
