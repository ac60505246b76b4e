//! The one trait every backend implements.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::approval::{Answer, ApprovalQuery, ApprovalRecord, NewApproval};
use crate::audit::{AuditHead, AuditLineFn, AuditRecord, Durability};
use crate::budget::{
    Amounts, LedgerKey, LedgerSnapshot, Reservation, ReserveOutcome, ReserveRequest, SettleOutcome,
};
use crate::cell::{CellRecord, CellUpdate, NewCell, ReplayEntry};
use crate::error::Result;
use crate::session::{SessionRecord, StoreChange};
use crate::watch::{Topic, Watch};

/// Durable state shared by every replica that opens the same database.
///
/// Object-safe (methods return boxed futures), so the runtime holds an `Arc<dyn StateStore>`
/// chosen at start by URL ([`crate::open`]). Every method that writes is one transaction:
/// it commits whole or not at all.
pub trait StateStore: Send + Sync + 'static {
    /// Where the state lives, for logs and errors (never with a password).
    fn describe(&self) -> String;

    /// Checks that the database answers (for `/readyz`).
    fn ping(&self) -> BoxFuture<'_, Result<()>>;

    /// Gives back what this store holds for itself before the process ends (PostgreSQL's
    /// budget leases; without it they expire and count as spent). The store stays usable.
    fn close(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    /// Subscribes to changes of a cell or an approval; see [`Watch`].
    fn watch(&self, topic: Topic) -> Watch;

    // --- sessions -------------------------------------------------------------------------

    /// Records that a session is begun or seen now, creating it (with `principal`) the first
    /// time. Only for a session's first sight; refused with [`StateError::SessionEnded`] once
    /// [`end_session_cells`](Self::end_session_cells) ended it, so it never comes back.
    ///
    /// [`StateError::SessionEnded`]: crate::StateError::SessionEnded
    fn open_session<'a>(
        &'a self,
        id: &'a str,
        principal: Option<&'a str>,
    ) -> BoxFuture<'a, Result<SessionRecord>>;

    /// Records that a live session was seen now. Never creates one: a session whose row is
    /// gone (deleted, ended) is refused with [`StateError::SessionEnded`], and the caller ends
    /// it too. A touch racing a delete thus cannot bring the session back.
    ///
    /// [`StateError::SessionEnded`]: crate::StateError::SessionEnded
    fn touch_session<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<SessionRecord>>;

    /// The live session `id` (`None` once deleted or ended).
    fn get_session<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<SessionRecord>>>;

    /// Removes a session and its `store()` values. Returns whether it existed. The mark of a
    /// session [`end_session_cells`](Self::end_session_cells) ended stays, so that it is not
    /// begun again.
    fn delete_session<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool>>;

    /// The session's `store()` values (empty for an unknown session).
    fn load_store<'a>(&'a self, session: &'a str)
    -> BoxFuture<'a, Result<BTreeMap<String, Value>>>;

    /// Applies a script's `store()` writes in order, all together.
    fn apply_store<'a>(
        &'a self,
        session: &'a str,
        changes: &'a [StoreChange],
    ) -> BoxFuture<'a, Result<()>>;

    // --- cells ----------------------------------------------------------------------------

    /// Creates a running cell held by `cell.owner`; refused with
    /// [`StateError::SessionEnded`](crate::StateError::SessionEnded) when its session was
    /// ended, checked in the same transaction, so no cell is created after the end.
    fn create_cell(&self, cell: NewCell) -> BoxFuture<'_, Result<CellRecord>>;

    fn get_cell<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<CellRecord>>>;

    /// A session's cells, oldest first.
    fn list_cells<'a>(&'a self, session: &'a str) -> BoxFuture<'a, Result<Vec<CellRecord>>>;

    /// Takes the cell for `replica` (or renews its lease) when nobody else holds a live lease.
    fn claim_cell<'a>(
        &'a self,
        id: &'a str,
        replica: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<CellRecord>>;

    /// Sets the status (and approval, result) of a cell `replica` holds. A terminal status
    /// releases the cell and drops its replay log.
    fn update_cell<'a>(
        &'a self,
        id: &'a str,
        replica: &'a str,
        update: CellUpdate,
    ) -> BoxFuture<'a, Result<CellRecord>>;

    /// Live cells nobody holds a live lease on: what a starting replica may pick up.
    fn claimable_cells(&self) -> BoxFuture<'_, Result<Vec<CellRecord>>>;

    /// Ends, in one write, every live cell of `session` that `except` (the calling replica,
    /// which stops its own) does not hold, because the session ended for good: each becomes
    /// `terminated` with `result`, held by nobody, and its replay log is dropped. Its holder's
    /// next write (a call's log line, a lease renewal) is refused, so none of its calls starts
    /// after this returns, and nobody takes it over. In the same write the session is marked
    /// ended: from then on it cannot be opened, touched or given a new cell, on any replica
    /// (the mark is kept for [`ENDED_SESSION_KEPT`](crate::ENDED_SESSION_KEPT)). Returns each
    /// cell as it was before.
    fn end_session_cells<'a>(
        &'a self,
        session: &'a str,
        except: &'a str,
        result: Value,
    ) -> BoxFuture<'a, Result<Vec<CellRecord>>>;

    /// Deletes a cell and its replay log. Returns whether it existed.
    fn delete_cell<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool>>;

    /// Appends steps to the replay log of a cell `replica` holds; they must continue it.
    fn append_replay<'a>(
        &'a self,
        cell: &'a str,
        replica: &'a str,
        entries: &'a [ReplayEntry],
    ) -> BoxFuture<'a, Result<()>>;

    fn read_replay<'a>(&'a self, cell: &'a str) -> BoxFuture<'a, Result<Vec<ReplayEntry>>>;

    /// Deletes cells that ended, and approvals answered or expired, before `before_ms`: each
    /// holds a script (up to 4 MiB) or a call's whole arguments, and nothing else removes
    /// them. Their audit lines keep what happened. Returns how many rows went.
    fn prune_ended(&self, before_ms: i64) -> BoxFuture<'_, Result<u64>>;

    // --- approvals ------------------------------------------------------------------------

    fn create_approval(&self, approval: NewApproval) -> BoxFuture<'_, Result<ApprovalRecord>>;

    fn get_approval<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<ApprovalRecord>>>;

    /// Oldest first.
    fn list_approvals(&self, query: ApprovalQuery) -> BoxFuture<'_, Result<Vec<ApprovalRecord>>>;

    /// Answers a pending approval: a compare-and-set, so of two answers at once one wins.
    fn answer_approval<'a>(
        &'a self,
        id: &'a str,
        answer: Answer,
    ) -> BoxFuture<'a, Result<ApprovalRecord>>;

    /// Marks every pending approval past its time as expired and returns them (each needs an
    /// audit line). Approvals expire only here, so each expiry is returned exactly once.
    fn expire_approvals(&self) -> BoxFuture<'_, Result<Vec<ApprovalRecord>>>;

    // --- budgets --------------------------------------------------------------------------

    /// Holds the amounts on every ledger, or refuses naming the first that has no room.
    fn reserve(&self, request: ReserveRequest) -> BoxFuture<'_, Result<ReserveOutcome>>;

    /// Replaces a hold by what the call spent.
    fn settle<'a>(
        &'a self,
        reservation: &'a Reservation,
        actual: Amounts,
    ) -> BoxFuture<'a, Result<SettleOutcome>>;

    /// [`settle`](Self::settle), for a caller that next appends an audit line to this same
    /// store and waits for it: the backend may commit the settle without waiting for the disk,
    /// since the line's durable commit makes it durable too (PostgreSQL flushes its log in
    /// order). The default settles as `settle` does.
    fn settle_before_audit<'a>(
        &'a self,
        reservation: &'a Reservation,
        actual: Amounts,
    ) -> BoxFuture<'a, Result<SettleOutcome>> {
        self.settle(reservation, actual)
    }

    /// Drops a hold for a call that did not run.
    fn release<'a>(&'a self, reservation: &'a Reservation) -> BoxFuture<'a, Result<()>>;

    /// Keeps a hold for a call that is still running: it now expires `hold_for` from now.
    /// A hold's expiry is for a replica that died mid-call; one whose call outlives it must
    /// not give its budget back while the call still spends. [`StateError::UnknownReservation`]
    /// when the hold was settled, released or has already expired.
    fn extend_hold<'a>(
        &'a self,
        reservation: &'a Reservation,
        hold_for: std::time::Duration,
    ) -> BoxFuture<'a, Result<()>>;

    /// A ledger as stored now (zeros for one never charged).
    fn get_ledger<'a>(&'a self, key: &'a LedgerKey) -> BoxFuture<'a, Result<LedgerSnapshot>>;

    // --- audit ----------------------------------------------------------------------------

    /// Appends the line `make` builds on the stream's current head, serialized with every
    /// other append to the stream, on every replica. `make` may run more than once (see
    /// [`AuditLineFn`]); the line stored is the one made on the head it follows.
    fn append_audit<'a>(
        &'a self,
        stream: &'a str,
        make: AuditLineFn,
    ) -> BoxFuture<'a, Result<AuditRecord>>;

    /// [`StateStore::append_audit`], saying when the line must be on disk. The default writes
    /// every line as `append_audit` does (the memory store has no disk); SQLite under
    /// `synchronous = NORMAL` syncs a `Now` line's commit, PostgreSQL waits for its flush.
    fn append_audit_with<'a>(
        &'a self,
        stream: &'a str,
        make: AuditLineFn,
        durability: Durability,
    ) -> BoxFuture<'a, Result<AuditRecord>> {
        let _ = durability;
        self.append_audit(stream, make)
    }

    /// Up to `limit` lines with `seq > after_seq`, in order.
    fn read_audit<'a>(
        &'a self,
        stream: &'a str,
        after_seq: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<AuditRecord>>>;

    fn audit_head<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<AuditHead>>;

    fn audit_streams(&self) -> BoxFuture<'_, Result<Vec<String>>>;
}
