//! The embedded SQLite backend: the default on one machine.
//!
//! One connection per store, owned by a thread of its own: SQLite calls block, so they never
//! run on the async runtime, and queued operations wait in a channel rather than holding
//! threads. WAL mode lets readers in other processes go on while one writes; writers (in this
//! or another process) take turns through SQLite's file lock and the busy timeout.
//!
//! Durability: `synchronous = NORMAL` by default. In WAL mode a commit survives a crash of the
//! process at once, and a power loss can undo the last commits but never corrupts the file;
//! [`SqliteOptions::synchronous_full`] syncs every commit to disk, at the cost of an fsync each.
//! An audit line appended [`Durability::Now`] is synced either way (its commit runs under
//! `FULL`), as the audit file and PostgreSQL do: a call's result never reaches the model with
//! its line still only in the page cache.

mod ops;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use futures::future::BoxFuture;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use serde_json::Value;

use crate::approval::{Answer, ApprovalQuery, ApprovalRecord, NewApproval};
use crate::audit::{self, AuditHead, AuditLineFn, AuditRecord, Durability};
use crate::budget::{
    Amounts, LedgerKey, LedgerSnapshot, Reservation, ReserveOutcome, ReserveRequest, SettleOutcome,
};
use crate::cell::{CellRecord, CellUpdate, NewCell, ReplayEntry};
use crate::clock::Clock;
use crate::error::{Result, StateError};
use crate::schema;
use crate::session::{self, SessionRecord, StoreChange};
use crate::store::StateStore;
use crate::validate::check_id;
use crate::watch::{Notifier, Topic, Watch};
use ops::OpError;

/// How to open a SQLite state file.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// How long a write waits for another process's write before failing as locked.
    pub busy_timeout: Duration,
    /// Sync every commit to disk (survives power loss, costs an fsync per write).
    pub synchronous_full: bool,
    /// Run `PRAGMA quick_check` at open, so a damaged file is refused at start rather than
    /// failing later mid-run.
    pub check_at_open: bool,
    /// How often a [`Watch`] looks again, for changes made by another process on the file.
    pub poll_interval: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            busy_timeout: Duration::from_secs(10),
            synchronous_full: false,
            check_at_open: true,
            poll_interval: Duration::from_millis(250),
        }
    }
}

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

pub struct SqliteStore {
    /// `None` only while dropping.
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    path: PathBuf,
    clock: Clock,
    notifier: Notifier,
    /// Every commit waits for the disk already (`synchronous = FULL`).
    synchronous_full: bool,
}

/// Maps a SQLite failure to what it means for the person running codemode.
fn sqlite_error(location: &str, e: rusqlite::Error) -> StateError {
    use rusqlite::ErrorCode as C;
    let detail = e.to_string();
    let location = location.to_string();
    match e.sqlite_error_code() {
        Some(C::DatabaseBusy | C::DatabaseLocked) => StateError::Locked { location, detail },
        Some(C::ReadOnly) => StateError::ReadOnly { location, detail },
        Some(C::NotADatabase | C::DatabaseCorrupt) => StateError::Corrupt { location, detail },
        Some(C::CannotOpen | C::PermissionDenied | C::SystemIoFailure | C::DiskFull) => {
            StateError::Unavailable { location, detail }
        }
        _ => StateError::Backend { location, detail },
    }
}

fn op_error(location: &str, e: OpError) -> StateError {
    match e {
        OpError::Sqlite(e) => sqlite_error(location, e),
        // Rows that do not parse are reported by the ops without knowing the file.
        OpError::State(StateError::Corrupt {
            location: l,
            detail,
        }) if l.is_empty() => StateError::Corrupt {
            location: location.to_string(),
            detail,
        },
        OpError::State(e) => e,
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the state file at `path` and brings its schema up to date.
    /// A file that is locked, read-only, damaged or from a newer codemode is refused here,
    /// with an error saying what to do; nothing in it is changed or removed.
    pub async fn open(
        path: impl AsRef<Path>,
        options: SqliteOptions,
        clock: Clock,
    ) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let location = format!("sqlite://{}", path.display());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (jobs, rx) = mpsc::channel::<Job>();
        let thread_path = path.clone();
        let thread_options = options.clone();
        let thread = std::thread::Builder::new()
            .name("codemode-state-sqlite".into())
            .spawn(move || {
                let mut conn = match open_connection(&thread_path, &thread_options) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                // Ends when the store (the only sender) is dropped.
                while let Ok(job) = rx.recv() {
                    job(&mut conn);
                }
            })
            .map_err(|e| StateError::Backend {
                location: location.clone(),
                detail: format!("cannot start its thread: {e}"),
            })?;
        ready_rx.await.map_err(|_| StateError::Backend {
            location: location.clone(),
            detail: "its thread stopped while opening".into(),
        })??;
        Ok(SqliteStore {
            jobs: Some(jobs),
            thread: Some(thread),
            path,
            clock,
            notifier: Notifier::new(Some(options.poll_interval)),
            synchronous_full: options.synchronous_full,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the connection's thread. The write happens even if the caller stops
    /// waiting: dropping the returned future does not roll back a commit.
    fn run<'a, T: Send + 'static>(
        &'a self,
        f: impl FnOnce(&mut Connection) -> ops::OpResult<T> + Send + 'static,
    ) -> BoxFuture<'a, Result<T>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(conn)));
            // A panic (in a caller's audit closure, say) must not kill the thread; rusqlite
            // rolls back the open transaction when it is dropped during the unwind.
            let r = r.unwrap_or_else(|_| {
                Err(OpError::State(StateError::Backend {
                    location: String::new(),
                    detail: "an operation panicked; it was rolled back".into(),
                }))
            });
            let _ = tx.send(r);
        });
        let sent = self.jobs.as_ref().map(|j| j.send(job));
        Box::pin(async move {
            let location = self.describe();
            if !matches!(sent, Some(Ok(()))) {
                return Err(StateError::Backend {
                    location,
                    detail: "its thread has stopped".into(),
                });
            }
            match rx.await {
                Ok(r) => r.map_err(|e| op_error(&location, e)),
                Err(_) => Err(StateError::Backend {
                    location,
                    detail: "its thread stopped during the operation".into(),
                }),
            }
        })
    }

    fn notify_after<'a, T: Send + 'a>(
        &'a self,
        fut: BoxFuture<'a, Result<T>>,
        topic: impl FnOnce(&T) -> Topic + Send + 'a,
    ) -> BoxFuture<'a, Result<T>> {
        Box::pin(async move {
            let r = fut.await;
            if let Ok(v) = &r {
                self.notifier.notify(topic(v));
            }
            r
        })
    }
}

impl Drop for SqliteStore {
    /// Waits for queued operations to finish and the connection to close (SQLite checkpoints
    /// the WAL then), so that once a store is dropped the file is complete and quiet.
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn fail<'a, T: Send + 'a>(e: StateError) -> BoxFuture<'a, Result<T>> {
    Box::pin(std::future::ready(Err(e)))
}

fn open_connection(path: &Path, options: &SqliteOptions) -> Result<Connection> {
    let location = format!("sqlite://{}", path.display());
    let err = |e: rusqlite::Error| sqlite_error(&location, e);
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| StateError::Unavailable {
                location: location.clone(),
                detail: format!("cannot create its directory {}: {e}", dir.display()),
            })?;
    }
    // It holds paused calls' arguments, logged results and `store()` values: readable by its
    // owner only, as the audit log is, whatever the umask. SQLite gives its `-wal` and `-shm`
    // files the database file's mode. An existing file is left as it is.
    {
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path);
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(err)?;
    // SQLite quietly opens a file it may not write read-only; refuse that here, not at the
    // first write in the middle of a run.
    if conn.is_readonly(rusqlite::MAIN_DB).map_err(err)? {
        return Err(StateError::ReadOnly {
            location,
            detail: "the file cannot be opened for writing".into(),
        });
    }
    conn.busy_timeout(options.busy_timeout).map_err(err)?;
    // Every statement the store runs stays prepared.
    conn.set_prepared_statement_cache_capacity(64);
    // Refuse someone else's database, or a newer codemode's, before changing anything in it
    // (switching to WAL rewrites the header).
    if let Err(e) = check_ownership(&conn, &location) {
        // Another process may be creating this new file right now: judge again once its
        // writes are done (an IMMEDIATE transaction waits for them), before calling it damaged.
        let settled = rusqlite::Transaction::new_unchecked(&conn, TransactionBehavior::Immediate)
            .map_err(err)
            .and_then(|tx| {
                let verdict = check_ownership(&tx, &location);
                tx.rollback().map_err(err)?;
                verdict
            });
        if settled.is_err() {
            return Err(e);
        }
    }
    if options.check_at_open {
        let verdict: String = conn
            .pragma_query_value(None, "quick_check", |r| r.get(0))
            .map_err(err)?;
        if verdict != "ok" {
            return Err(StateError::Corrupt {
                location,
                detail: format!("quick_check says: {verdict}"),
            });
        }
    }
    // WAL needs `-wal` and `-shm` files beside the database: a directory this user may not
    // write refuses them.
    let wal_refused = |detail: String| StateError::ReadOnly {
        location: location.clone(),
        detail: format!("SQLite cannot create its write-ahead log beside the file ({detail})"),
    };
    // Switching to WAL takes an exclusive lock, and SQLite answers "busy" at once (its busy
    // handler is not asked) when another process opening the same new file holds one: try
    // again for as long as the busy timeout allows.
    let started = std::time::Instant::now();
    let mode: String = loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get::<_, String>(0)) {
            Err(e)
                if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy)
                    && started.elapsed() < options.busy_timeout =>
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::CannotOpen) => {
                return Err(wal_refused(e.to_string()));
            }
            other => break other.map_err(err)?,
        }
    };
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(wal_refused(format!("the journal mode stayed `{mode}`")));
    }
    let sync = if options.synchronous_full {
        "FULL"
    } else {
        "NORMAL"
    };
    conn.pragma_update(None, "synchronous", sync).map_err(err)?;
    migrate(&conn, &location)?;
    Ok(conn)
}

fn table_count(conn: &Connection, location: &str) -> Result<i64> {
    conn.query_row(
        "SELECT count(*) FROM sqlite_schema WHERE type = 'table'",
        [],
        |r| r.get(0),
    )
    .map_err(|e| sqlite_error(location, e))
}

/// Is this a codemode state file (or an empty one) of a schema this build knows?
fn check_ownership(conn: &Connection, location: &str) -> Result<()> {
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|e| sqlite_error(location, e))?;
    if version > schema::latest() {
        return Err(StateError::TooNew {
            location: location.to_string(),
            found: version,
            known: schema::latest(),
        });
    }
    if version == 0 {
        let tables = table_count(conn, location)?;
        if tables > 0 {
            return Err(StateError::Corrupt {
                location: location.to_string(),
                detail: format!(
                    "it is a SQLite database with {tables} tables that codemode did not create"
                ),
            });
        }
    }
    Ok(())
}

/// Applies missing migrations, each with its version in `user_version`, in one `IMMEDIATE`
/// transaction so that two processes opening a new file at once apply them once.
fn migrate(conn: &Connection, location: &str) -> Result<()> {
    let err = |e: rusqlite::Error| sqlite_error(location, e);
    let tx =
        rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate).map_err(err)?;
    let mut version: i64 = tx
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(err)?;
    if version > schema::latest() || (version == 0 && table_count(&tx, location)? > 0) {
        // Another process changed the file since check_ownership; let it say why.
        return check_ownership(&tx, location);
    }
    for (v, sql) in schema::MIGRATIONS {
        if *v > version {
            tx.execute_batch(sql).map_err(err)?;
            tx.pragma_update(None, "user_version", v).map_err(err)?;
            version = *v;
        }
    }
    tx.commit().map_err(err)
}

impl StateStore for SqliteStore {
    fn describe(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }

    fn ping(&self) -> BoxFuture<'_, Result<()>> {
        self.run(|conn| {
            conn.query_row("SELECT 1", [], |_| Ok(()))?;
            Ok(())
        })
    }

    fn watch(&self, topic: Topic) -> Watch {
        self.notifier.watch(topic)
    }

    fn open_session<'a>(
        &'a self,
        id: &'a str,
        principal: Option<&'a str>,
    ) -> BoxFuture<'a, Result<SessionRecord>> {
        if let Err(e) = check_id("session id", id) {
            return fail(e);
        }
        let (id, principal, now) = (
            id.to_string(),
            principal.map(str::to_string),
            self.clock.now_ms(),
        );
        self.run(move |c| ops::open_session(c, &id, principal.as_deref(), now))
    }

    fn touch_session<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<SessionRecord>> {
        if let Err(e) = check_id("session id", id) {
            return fail(e);
        }
        let (id, now) = (id.to_string(), self.clock.now_ms());
        self.run(move |c| ops::touch_session(c, &id, now))
    }

    fn get_session<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<SessionRecord>>> {
        let id = id.to_string();
        self.run(move |c| ops::get_session(c, &id))
    }

    fn delete_session<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool>> {
        let id = id.to_string();
        self.run(move |c| ops::delete_session(c, &id))
    }

    fn load_store<'a>(
        &'a self,
        session: &'a str,
    ) -> BoxFuture<'a, Result<std::collections::BTreeMap<String, Value>>> {
        let session = session.to_string();
        self.run(move |c| ops::load_store(c, &session))
    }

    fn apply_store<'a>(
        &'a self,
        session: &'a str,
        changes: &'a [StoreChange],
    ) -> BoxFuture<'a, Result<()>> {
        if let Err(e) = session::validate_changes(session, changes) {
            return fail(e);
        }
        let (session, changes) = (session.to_string(), changes.to_vec());
        self.run(move |c| ops::apply_store(c, &session, &changes))
    }

    fn create_cell(&self, cell: NewCell) -> BoxFuture<'_, Result<CellRecord>> {
        if let Err(e) = cell.validate() {
            return fail(e);
        }
        let now = self.clock.now_ms();
        let fut = self.run(move |c| ops::create_cell(c, cell, now));
        self.notify_after(fut, |c| Topic::Cell(c.id.clone()))
    }

    fn get_cell<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<CellRecord>>> {
        let id = id.to_string();
        self.run(move |c| ops::get_cell(c, &id))
    }

    fn list_cells<'a>(&'a self, session: &'a str) -> BoxFuture<'a, Result<Vec<CellRecord>>> {
        let session = session.to_string();
        self.run(move |c| ops::list_cells(c, &session))
    }

    fn claim_cell<'a>(
        &'a self,
        id: &'a str,
        replica: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<CellRecord>> {
        if let Err(e) = check_id("replica id", replica) {
            return fail(e);
        }
        let (id, replica, now) = (id.to_string(), replica.to_string(), self.clock.now_ms());
        let lease_ms = crate::budget::hold_ms(lease);
        let fut = self.run(move |c| ops::claim_cell(c, &id, &replica, lease_ms, now));
        self.notify_after(fut, |c| Topic::Cell(c.id.clone()))
    }

    fn update_cell<'a>(
        &'a self,
        id: &'a str,
        replica: &'a str,
        update: CellUpdate,
    ) -> BoxFuture<'a, Result<CellRecord>> {
        if let Err(e) = update.validate() {
            return fail(e);
        }
        let (id, replica, now) = (id.to_string(), replica.to_string(), self.clock.now_ms());
        let fut = self.run(move |c| ops::update_cell(c, &id, &replica, &update, now));
        self.notify_after(fut, |c| Topic::Cell(c.id.clone()))
    }

    fn claimable_cells(&self) -> BoxFuture<'_, Result<Vec<CellRecord>>> {
        let now = self.clock.now_ms();
        self.run(move |c| ops::claimable_cells(c, now))
    }

    fn end_session_cells<'a>(
        &'a self,
        session: &'a str,
        except: &'a str,
        result: Value,
    ) -> BoxFuture<'a, Result<Vec<CellRecord>>> {
        if let Err(e) = check_id("session id", session) {
            return fail(e);
        }
        let (session, except, now) = (session.to_string(), except.to_string(), self.clock.now_ms());
        let fut = self.run(move |c| ops::end_session_cells(c, &session, &except, &result, now));
        Box::pin(async move {
            let ended = fut.await?;
            for c in &ended {
                self.notifier.notify(Topic::Cell(c.id.clone()));
            }
            Ok(ended)
        })
    }

    fn delete_cell<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool>> {
        let owned = id.to_string();
        let fut = self.run(move |c| ops::delete_cell(c, &owned));
        let id = id.to_string();
        self.notify_after(fut, move |_| Topic::Cell(id))
    }

    fn prune_ended(&self, before_ms: i64) -> BoxFuture<'_, Result<u64>> {
        self.run(move |c| ops::prune_ended(c, before_ms))
    }

    fn append_replay<'a>(
        &'a self,
        cell: &'a str,
        replica: &'a str,
        entries: &'a [ReplayEntry],
    ) -> BoxFuture<'a, Result<()>> {
        let (cell, replica, entries) = (cell.to_string(), replica.to_string(), entries.to_vec());
        self.run(move |c| ops::append_replay(c, &cell, &replica, &entries))
    }

    fn read_replay<'a>(&'a self, cell: &'a str) -> BoxFuture<'a, Result<Vec<ReplayEntry>>> {
        let cell = cell.to_string();
        self.run(move |c| ops::read_replay(c, &cell))
    }

    fn create_approval(&self, approval: NewApproval) -> BoxFuture<'_, Result<ApprovalRecord>> {
        if let Err(e) = approval.validate() {
            return fail(e);
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let now = self.clock.now_ms();
        let fut = self.run(move |c| ops::create_approval(c, approval, id, now));
        self.notify_after(fut, |a| Topic::Approval(a.id.clone()))
    }

    fn get_approval<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<ApprovalRecord>>> {
        let id = id.to_string();
        self.run(move |c| ops::get_approval(c, &id))
    }

    fn list_approvals(&self, query: ApprovalQuery) -> BoxFuture<'_, Result<Vec<ApprovalRecord>>> {
        self.run(move |c| ops::list_approvals(c, &query))
    }

    fn answer_approval<'a>(
        &'a self,
        id: &'a str,
        answer: Answer,
    ) -> BoxFuture<'a, Result<ApprovalRecord>> {
        if let Err(e) = answer.validate() {
            return fail(e);
        }
        let (id, now) = (id.to_string(), self.clock.now_ms());
        let fut = self.run(move |c| ops::answer_approval(c, &id, &answer, now));
        self.notify_after(fut, |a| Topic::Approval(a.id.clone()))
    }

    fn expire_approvals(&self) -> BoxFuture<'_, Result<Vec<ApprovalRecord>>> {
        let now = self.clock.now_ms();
        let fut = self.run(move |c| ops::expire_approvals(c, now));
        Box::pin(async move {
            let expired = fut.await?;
            for a in &expired {
                self.notifier.notify(Topic::Approval(a.id.clone()));
            }
            Ok(expired)
        })
    }

    fn reserve(&self, request: ReserveRequest) -> BoxFuture<'_, Result<ReserveOutcome>> {
        if let Err(e) = request.validate() {
            return fail(e);
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let now = self.clock.now_ms();
        self.run(move |c| ops::reserve(c, &request, id, now))
    }

    fn extend_hold<'a>(
        &'a self,
        reservation: &'a Reservation,
        hold_for: std::time::Duration,
    ) -> BoxFuture<'a, Result<()>> {
        let id = reservation.id.clone();
        let now = self.clock.now_ms();
        self.run(move |c| ops::extend_hold(c, &id, now, hold_for))
    }

    fn settle<'a>(
        &'a self,
        reservation: &'a Reservation,
        actual: Amounts,
    ) -> BoxFuture<'a, Result<SettleOutcome>> {
        if let Err(e) = actual.validate("settled amounts") {
            return fail(e);
        }
        let r = reservation.clone();
        self.run(move |c| ops::settle(c, &r, &actual))
    }

    fn release<'a>(&'a self, reservation: &'a Reservation) -> BoxFuture<'a, Result<()>> {
        let r = reservation.clone();
        self.run(move |c| ops::release(c, &r))
    }

    fn get_ledger<'a>(&'a self, key: &'a LedgerKey) -> BoxFuture<'a, Result<LedgerSnapshot>> {
        if let Err(e) = key.validate() {
            return fail(e);
        }
        let (key, now) = (key.clone(), self.clock.now_ms());
        self.run(move |c| ops::get_ledger(c, &key, now))
    }

    fn append_audit<'a>(
        &'a self,
        stream: &'a str,
        make: AuditLineFn,
    ) -> BoxFuture<'a, Result<AuditRecord>> {
        if let Err(e) = audit::validate_stream(stream) {
            return fail(e);
        }
        let (stream, now) = (stream.to_string(), self.clock.now_ms());
        self.run(move |c| ops::append_audit(c, &stream, make, now))
    }

    /// A line appended [`Durability::Now`] waits for the disk even under `synchronous =
    /// NORMAL`, where a power loss could undo the last commits: the connection syncs this
    /// commit (and the ones before it) and goes back to NORMAL.
    fn append_audit_with<'a>(
        &'a self,
        stream: &'a str,
        make: AuditLineFn,
        durability: Durability,
    ) -> BoxFuture<'a, Result<AuditRecord>> {
        if self.synchronous_full || durability == Durability::Deferred {
            return self.append_audit(stream, make);
        }
        if let Err(e) = audit::validate_stream(stream) {
            return fail(e);
        }
        let (stream, now) = (stream.to_string(), self.clock.now_ms());
        self.run(move |c| ops::append_audit_synced(c, &stream, make, now))
    }

    fn read_audit<'a>(
        &'a self,
        stream: &'a str,
        after_seq: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<AuditRecord>>> {
        let stream = stream.to_string();
        self.run(move |c| ops::read_audit(c, &stream, after_seq, limit))
    }

    fn audit_head<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<AuditHead>> {
        let stream = stream.to_string();
        self.run(move |c| ops::audit_head(c, &stream))
    }

    fn audit_streams(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        self.run(ops::audit_streams)
    }
}
