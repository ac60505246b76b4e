//! Durable state for codemode, behind one small trait ([`StateStore`]) with three backends:
//! in memory (tests, single-process embedders), embedded SQLite (the default on one machine)
//! and PostgreSQL (several `codemode serve` replicas sharing one state).
//!
//! What it keeps, and why:
//! - **sessions** and their `store()` values, keyed by session id, so a client session can move
//!   between replicas;
//! - **cells** (script runs that outlive a turn), each held by one replica through a lease, and
//!   the **replay log** of each live cell, so a restarted server rebuilds it without running a
//!   tool twice ([`cell`]);
//! - **pending approvals**, bound to one exact call by hash and answered by compare-and-set,
//!   so of two approvers exactly one wins ([`approval`]);
//! - **budget ledgers** per script, session, and principal or team per day, charged by
//!   reserve-then-settle across several ledgers at once ([`budget`]);
//! - **audit streams**, opaque lines chained by hash, whose head is serialized in the database so
//!   replicas appending at once make one chain ([`audit`]).
//!
//! Every writing method is one transaction. Decisions (is there budget left, is this approval
//! still pending, does this replica hold the cell) are taken on rows locked for the
//! transaction (`SELECT … FOR UPDATE` on PostgreSQL, an `IMMEDIATE` transaction on SQLite, one
//! mutex in memory), never on a value read earlier, so they hold across threads, processes and
//! replicas. The rules are shared Rust code, so every backend decides alike; the one exception
//! is budget charging and audit appends on PostgreSQL, which run in SQL functions (installed by
//! the migrations) so that a ledger or stream head every call shares stays locked for
//! microseconds rather than round trips. An audit line there is made on the head this replica
//! last wrote and stored only if that is still the head (else made again on the new one).
//! One test suite runs against all three backends to hold them to the same behaviour.
//!
//! Where state lives: `memory:` in the process; `sqlite:///path` in one file (WAL mode) that
//! several processes on one machine may share; `postgres://…` in one database (optionally a
//! schema of it) that every replica shares, with `LISTEN`/`NOTIFY` to wake waiters on the
//! other replicas ([`StateStore::watch`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), codemode_state::StateError> {
//! use codemode_state::{open, OpenOptions};
//! let store = open("sqlite:///home/me/.local/state/codemode/state.db", OpenOptions::default()).await?;
//! store.open_session("session-1", Some("alice")).await?;
//! store.touch_session("session-1").await?;
//! # Ok(()) }
//! ```

pub mod approval;
pub mod audit;
pub mod budget;
pub mod cell;
mod clock;
mod error;
mod memory;
mod postgres;
mod schema;
pub mod session;
mod sqlite;
mod store;
mod url;
mod validate;
mod watch;

use std::sync::Arc;

pub use approval::{
    Answer, ApprovalQuery, ApprovalRecord, ApprovalState, Decision, NewApproval, call_hash,
    call_hash_with_paths,
};
pub use audit::{AuditHead, AuditLine, AuditLineFn, AuditRecord, Durability};
pub use budget::{
    Amounts, BudgetRefusal, Counter, LeaseTicket, LedgerKey, LedgerScope, LedgerSnapshot, Limits,
    Overrun, Reservation, ReserveOutcome, ReserveRequest, SettleOutcome,
};
pub use cell::{CellRecord, CellStatus, CellUpdate, NewCell, ReplayEntry};
pub use clock::{Clock, ManualClock, format_ms, utc_day};
pub use error::{Result, StateError};
pub use memory::MemoryStore;
pub use postgres::{LeaseOptions, PostgresOptions, PostgresStore};
pub use session::{
    ENDED_SESSION_KEPT, MAX_STORE_TOTAL_CHARS, MAX_STORE_VALUE_CHARS, SessionRecord, StoreChange,
};
pub use sqlite::{SqliteOptions, SqliteStore};
pub use store::StateStore;
pub use url::{StateUrl, redact};
pub use validate::MAX_ID_BYTES;
pub use watch::{Topic, Watch};

/// Options for [`open`]; each backend reads its own part.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    pub clock: Clock,
    pub sqlite: SqliteOptions,
    pub postgres: PostgresOptions,
}

/// Opens the store a URL names: `memory:`, `sqlite:///path/state.db` or `postgres://…`.
/// Fails with a clear error when the URL is unknown or the database cannot be used.
pub async fn open(url: &str, options: OpenOptions) -> Result<Arc<dyn StateStore>> {
    Ok(match StateUrl::parse(url)? {
        StateUrl::Memory => Arc::new(MemoryStore::new(options.clock)),
        StateUrl::Sqlite(path) => {
            Arc::new(SqliteStore::open(path, options.sqlite, options.clock).await?)
        }
        StateUrl::Postgres(url) => {
            Arc::new(PostgresStore::open(&url, options.postgres, options.clock).await?)
        }
    })
}
