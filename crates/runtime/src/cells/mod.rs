//! Cells: script runs that outlive a turn, and approvals that pause them instead of failing.
//!
//! A cell is one script run with an id. It may *yield*: after its yield time the caller gets
//! the output so far and `status: running`, and the script keeps running on the embedder's
//! runtime; [`Codemode::wait_cell`](crate::Codemode::wait_cell) returns more output and, once it
//! ended, the result, or terminates it. It is still one sandbox run, so its deadline (which
//! stands still while a person is asked) and its script budget hold across every yield.
//!
//! Everything needed to rebuild a live cell is in the state store ([`codemode_state`]): its
//! source, options (seed and start time, so the run is deterministic) and a replay log of its
//! calls, written before the script sees each result. A process that starts while a cell has
//! no live holder (its server was killed) claims it and runs the script again, answering each
//! recorded call from the log (no tool runs twice) until the script goes past the log; a call
//! that differs from the log fails the cell naming the step.
//!
//! When a policy asks and nobody can answer now, [`PausingApprover`] (with `pause` chosen)
//! records a pending approval bound to the call's hash and the cell waits for it; an answer
//! from any process (the CLI, an MCP client's elicitation, the library) resumes it, and an
//! approval that expires counts as a denial. Each answer and expiry is an audit line.

mod approver;
mod live;
pub(crate) mod record;
mod report;
mod run;
mod session_end;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use codemode_gate::AuditLog;
use codemode_state::{StateError, StateStore};

pub use approver::PausingApprover;
pub use report::{CellReport, PendingCall, WaitOptions};
pub use run::{answer_approval, expire_in};

pub(crate) use live::LiveCell;
pub(crate) use record::CellLink;

/// How cells behave; built by `codemode-setup` from the settings.
#[derive(Clone)]
pub struct CellsConfig {
    /// Where cells, approvals, replay logs and `store()` values live.
    pub store: Arc<dyn StateStore>,
    /// This process's name on cells it holds. Unique per process: several processes may share
    /// one database, and a cell is driven by one of them at a time.
    pub replica: String,
    /// How long a holder's claim on a cell lasts without renewal; after that, another process
    /// may take the cell over (rebuild it by replay).
    pub lease: Duration,
    /// The yield time for scripts that do not ask for one, and the most one may ask for.
    pub yield_after: Duration,
    /// Live cells one session may have at once.
    pub max_live_per_session: u32,
    /// Cells one principal may run at once in this process, over all its sessions: each holds
    /// a sandbox worker while it runs (see `crate::principal_share`). The count is shared with
    /// the installation's scripts run without cells.
    pub max_running_per_principal: u32,
    /// Pause (rather than deny) an `ask` that nobody can answer now.
    pub pause_approvals: bool,
    /// A paused approval unanswered for this long counts as a denial.
    pub approval_expiry: Duration,
    /// Where answers and expiries are recorded: the gate's audit log.
    pub audit: AuditLog,
    /// Which installation the cells belong to (`codemode-setup` uses the project directory):
    /// a process takes over only cells of its own scope, never those of another project run
    /// with other tools and policies on the same state database.
    pub scope: String,
}

impl CellsConfig {
    /// Defaults around a store: 10 s yield, 8 cells a session, 32 running cells a principal,
    /// 15 s lease, deny, 1 h expiry.
    pub fn new(store: Arc<dyn StateStore>) -> Self {
        CellsConfig {
            store,
            replica: replica_name(),
            lease: Duration::from_secs(15),
            yield_after: Duration::from_secs(10),
            max_live_per_session: 8,
            max_running_per_principal: 32,
            pause_approvals: false,
            approval_expiry: Duration::from_secs(3600),
            audit: AuditLog::disabled(),
            scope: String::new(),
        }
    }
}

/// `host-pid-random`: unique per process, readable in `codemode approvals show`.
pub fn replica_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &random[..8])
}

/// Why a cell request failed. Messages say what to do.
#[derive(Debug, thiserror::Error)]
pub enum CellError {
    #[error("cells are not enabled in this installation; run scripts with run_script")]
    Disabled,
    #[error("there is no cell `{0}` in this session; `wait` takes the id a codemode call returned")]
    Unknown(String),
    #[error(
        "cell `{id}` has already {status} and its result was returned; start a new run instead"
    )]
    Finished { id: String, status: String },
    #[error(
        "cell `{id}` is run by another codemode process ({owner}); `terminate` works only through that process, or through this one once that process has stopped. Ending the session (HTTP DELETE) stops all its cells, wherever they run"
    )]
    HeldElsewhere { id: String, owner: String },
    #[error(
        "{who} already runs {limit} scripts at once in this codemode process, the most one token may (`cells.max_running_per_principal`), so that others can still run theirs; wait for one to end (`wait`, or `wait` with \"terminate\": true to stop one), or ask the operator to raise `cells.max_running_per_principal` in settings.json"
    )]
    PrincipalBusy { who: String, limit: u32 },
    #[error("{0}")]
    Replay(String),
    #[error(transparent)]
    State(#[from] StateError),
}

/// The cells of one installation. Cheap to clone.
#[derive(Clone)]
pub struct Cells {
    pub(crate) inner: Arc<CellsInner>,
}

pub(crate) struct CellsInner {
    pub config: CellsConfig,
    /// Cells this process runs, by id (a cell's script id is its cell id).
    pub live: Mutex<HashMap<String, Arc<LiveCell>>>,
    /// How many cells each principal runs here now.
    pub share: Arc<crate::principal_share::PrincipalShare>,
    /// Sessions their clients ended for good, and when: a cell still being started for one
    /// (its request raced the end) is terminated as soon as it is registered.
    ended_sessions: Mutex<HashMap<String, std::time::Instant>>,
    background: std::sync::OnceLock<()>,
}

/// How long an ended session is remembered: longer than any request that raced its end.
const ENDED_SESSION_MEMORY: std::time::Duration = std::time::Duration::from_secs(600);

impl Cells {
    pub fn new(config: CellsConfig) -> Self {
        Cells {
            inner: Arc::new(CellsInner {
                config,
                live: Mutex::new(HashMap::new()),
                share: Arc::default(),
                ended_sessions: Mutex::new(HashMap::new()),
                background: std::sync::OnceLock::new(),
            }),
        }
    }

    pub fn config(&self) -> &CellsConfig {
        &self.inner.config
    }

    pub fn store(&self) -> &Arc<dyn StateStore> {
        &self.inner.config.store
    }

    /// An approver for the gate: asks `inner` first, and pauses the call when nobody could be
    /// asked and pausing is on (see [`PausingApprover`]).
    pub fn approver(
        &self,
        inner: Option<Arc<dyn codemode_gate::Approver>>,
    ) -> Arc<dyn codemode_gate::Approver> {
        Arc::new(PausingApprover::new(self.clone(), inner))
    }

    /// Stops driving every cell here without recording their ends, as if this process had
    /// died: their leases lapse and another process (or a later start) rebuilds them by replay.
    /// Calls in flight are cancelled and, having no logged result, make their cell fail when it
    /// is rebuilt; calls waiting for approval wait again. For tests of take-over, and a
    /// shutdown that leaves cells to the next start.
    pub fn abandon(&self) {
        let live: Vec<Arc<LiveCell>> = self.lock().values().cloned().collect();
        for cell in live.iter().filter(|c| !c.is_done()) {
            cell.abandon();
        }
    }

    /// Abandons every cell (see [`Cells::abandon`]) and waits until each one's driver stopped,
    /// which is when its calls in flight were cancelled and their audit lines written, or until
    /// `limit` passes. True when all stopped. For a shutdown: without it, a yielded cell's call
    /// that was running when the process exited left no audit line.
    pub async fn abandon_and_wait(&self, limit: std::time::Duration) -> bool {
        self.abandon();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // An abandoned cell leaves the table when its driver returns.
            if self.lock().values().all(|c| c.is_done()) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Terminates the cells of `session_id` that this process drives: their calls in flight
    /// are cancelled and audited. For a session its client ended for good: its cells would
    /// otherwise run on, unreachable, and a client could end and reopen sessions to run more
    /// cells than `max_per_session` allows.
    pub fn terminate_session(&self, session_id: &str) -> usize {
        self.terminate_session_cells(session_id).len()
    }

    /// [`Cells::terminate_session`], returning the ids of the cells it terminated.
    fn terminate_session_cells(&self, session_id: &str) -> Vec<String> {
        {
            // First remembered, then the live cells scanned: a cell registered meanwhile finds
            // the session ended (`Cells::register`), so none escapes both.
            let mut ended = self
                .inner
                .ended_sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            ended.retain(|_, at| at.elapsed() < ENDED_SESSION_MEMORY);
            ended.insert(session_id.to_string(), std::time::Instant::now());
        }
        let live: Vec<Arc<LiveCell>> = self
            .lock()
            .values()
            .filter(|c| c.session_id == session_id && !c.is_done())
            .cloned()
            .collect();
        for cell in &live {
            cell.terminate();
        }
        live.iter().map(|c| c.id.clone()).collect()
    }

    /// The sessions that have a cell this process drives now.
    pub fn sessions_with_live_cells(&self) -> std::collections::HashSet<String> {
        self.lock()
            .values()
            .filter(|c| !c.is_done())
            .map(|c| c.session_id.clone())
            .collect()
    }

    /// The ids of the cells this process drives now.
    pub fn live_ids(&self) -> Vec<String> {
        self.lock()
            .values()
            .filter(|c| !c.is_done())
            .map(|c| c.id.clone())
            .collect()
    }

    /// Registers a cell this process now drives; one whose session its client already ended is
    /// terminated at once.
    pub(crate) fn register(&self, cell: Arc<LiveCell>) {
        self.lock().insert(cell.id.clone(), cell.clone());
        let ended = self
            .inner
            .ended_sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&cell.session_id);
        if ended {
            cell.terminate();
        }
    }

    /// Whether this process keeps the cell in memory (running, or ended and not yet let go).
    pub fn holds(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    pub(crate) fn live(&self, id: &str) -> Option<Arc<LiveCell>> {
        self.lock().get(id).cloned()
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<LiveCell>>> {
        self.inner.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the lease renewer and the expiry sweeper once, on the current runtime.
    pub(crate) fn ensure_background(&self) {
        let weak = Arc::downgrade(&self.inner);
        self.inner.background.get_or_init(|| {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(background(weak));
            }
        });
    }
}

/// Renews the leases of the cells this process holds, expires approvals past their time (each
/// expiry is one audit line, written by whoever expired it), and forgets ended cells whose
/// result nobody collected for an hour.
async fn background(cells: Weak<CellsInner>) {
    let mut last_renew = tokio::time::Instant::now();
    let mut last_prune: Option<tokio::time::Instant> = None;
    loop {
        let Some(inner) = cells.upgrade() else { return };
        let cells = Cells { inner };
        let lease = cells.config().lease;
        let every = (lease / 3).max(Duration::from_millis(100));
        if last_renew.elapsed() >= every {
            last_renew = tokio::time::Instant::now();
            let live: Vec<Arc<LiveCell>> = cells.lock().values().cloned().collect();
            for cell in live.iter().filter(|c| !c.is_done() && !c.is_abandoned()) {
                let claim = cells
                    .store()
                    .claim_cell(&cell.id, &cells.config().replica, lease)
                    .await;
                if let Err(e) = claim {
                    let by_session_end = match e {
                        StateError::CellFinished { .. } => {
                            session_end::ended_elsewhere(cells.store().as_ref(), &cell.id).await
                        }
                        _ => None,
                    };
                    if let Some(why) = by_session_end {
                        // Its session ended on another process, which recorded the end.
                        tracing::info!(cell = %cell.id, "stopping the cell: {why}");
                        cell.end_elsewhere(why);
                        continue;
                    }
                    match e {
                        StateError::CellHeld { .. }
                        | StateError::NotCellOwner { .. }
                        | StateError::CellFinished { .. } => {
                            // Another process took the cell over: stop driving it here.
                            tracing::warn!(cell = %cell.id, "lost the cell's lease: {e}");
                            cell.lost_lease(e.to_string());
                        }
                        e => {
                            tracing::warn!(cell = %cell.id, "could not renew the cell's lease: {e}")
                        }
                    }
                }
            }
        }
        run::expire_due(&cells).await;
        if last_prune.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
            last_prune = Some(tokio::time::Instant::now());
            let before = codemode_state::Clock::system()
                .now_ms()
                .saturating_sub(KEEP_ENDED_ROWS_MS);
            match cells.store().prune_ended(before).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    "deleted {n} ended cells and answered approvals older than 7 days"
                ),
                Err(e) => tracing::warn!("pruning ended cells and answered approvals failed: {e}"),
            }
        }
        forget_ended(&mut cells.lock());
        drop(cells);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// How long the state store keeps ended cells and answered approvals (their audit lines keep
/// what happened), and how often they are pruned.
const KEEP_ENDED_ROWS_MS: i64 = 7 * 24 * 3600 * 1000;
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Ended cells whose result nobody collected that one session keeps in memory; past it the
/// oldest are let go (their result stays in the state store, where `wait` then reads it).
const KEPT_ENDED_PER_SESSION: usize = 16;

/// Forgets ended cells: collected ones after a minute (only to say "already collected"),
/// uncollected ones after an hour, or sooner past [`KEPT_ENDED_PER_SESSION`] in a session. A
/// client that starts cells and never reads them kept each one's whole output for an hour.
fn forget_ended(live: &mut HashMap<String, Arc<LiveCell>>) {
    live.retain(|_, c| {
        let limit = if c.collected() { 60 } else { 3600 };
        !c.is_done() || c.done_for() < Duration::from_secs(limit)
    });
    let mut by_session: HashMap<&str, Vec<(Duration, &String)>> = HashMap::new();
    for (id, c) in live.iter() {
        if c.is_done() && !c.collected() {
            by_session
                .entry(c.session_id.as_str())
                .or_default()
                .push((c.done_for(), id));
        }
    }
    let mut gone: Vec<String> = Vec::new();
    for (_, mut ended) in by_session {
        if ended.len() > KEPT_ENDED_PER_SESSION {
            // Longest ended first.
            ended.sort_by_key(|e| std::cmp::Reverse(e.0));
            let extra = ended.len() - KEPT_ENDED_PER_SESSION;
            gone.extend(ended.into_iter().take(extra).map(|(_, id)| id.clone()));
        }
    }
    for id in gone {
        live.remove(&id);
    }
}
