//! One error type for every backend. Messages say what happened and what to do about it.

use crate::clock::format_ms;

#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    // --- configuration and start-up ---
    #[error(
        "unsupported state URL `{url}`: use `memory:`, `sqlite:///absolute/path/state.db` (or `sqlite:relative/path.db`), or `postgres://user:password@host:port/database`"
    )]
    BadUrl { url: String },

    #[error("invalid {what}: {problem}")]
    Invalid { what: &'static str, problem: String },

    #[error(
        "the state database {location} is locked by another process ({detail}); stop the other codemode that uses it, or give this one its own state file"
    )]
    Locked { location: String, detail: String },

    #[error(
        "the state database {location} is read-only ({detail}); make the file and its directory writable by this user (SQLite also writes `-wal` and `-shm` files beside it), or point state.url elsewhere"
    )]
    ReadOnly { location: String, detail: String },

    #[error(
        "the state database {location} is damaged or is not a codemode state database ({detail}); move it aside (keep it: committed data may be recoverable with `sqlite3 .recover`), then start again or restore a backup"
    )]
    Corrupt { location: String, detail: String },

    #[error(
        "the state database {location} has schema version {found}, newer than this codemode knows ({known}); upgrade codemode, or use another database"
    )]
    TooNew {
        location: String,
        found: i64,
        known: i64,
    },

    #[error(
        "cannot use the state database {location}: {detail}; check that it exists and this user may reach it (for PostgreSQL: that the server runs, and the URL, user and password are right)"
    )]
    Unavailable { location: String, detail: String },

    #[error("the state database {location} failed: {detail}")]
    Backend { location: String, detail: String },

    // --- approvals ---
    #[error("there is no approval `{id}`; `codemode approvals list` shows the pending ones")]
    UnknownApproval { id: String },

    #[error(
        "approval `{id}` was already answered ({decision} by {by} through {channel}); nothing was changed"
    )]
    ApprovalAnswered {
        id: String,
        decision: String,
        by: String,
        channel: String,
    },

    #[error(
        "approval `{id}` expired at {} and counts as a denial; run the script again to be asked anew",
        format_ms(*expired_at_ms)
    )]
    ApprovalExpired { id: String, expired_at_ms: i64 },

    #[error(
        "approval `{id}` is for a different call than the one answered (the call hash does not match); show it again and answer the call it names"
    )]
    ApprovalMismatch { id: String },

    #[error(
        "approval `{id}` was not given: the audit log, which must name who approves a call before the approval counts, cannot be written ({detail}); fix the log's location, then answer again"
    )]
    ApprovalNotAudited { id: String, detail: String },

    // --- sessions ---
    #[error(
        "session `{id}` has ended (its client ended it, it was idle too long, or it was never begun on a replica sharing this store); begin a new session"
    )]
    SessionEnded { id: String },

    // --- cells ---
    #[error("there is no cell `{id}`; it never existed or was deleted")]
    UnknownCell { id: String },

    #[error("cell `{id}` has already {status}; start a new run instead")]
    CellFinished { id: String, status: String },

    #[error(
        "cell `{id}` is held by replica `{owner}` until {}; it can be taken over once that lease runs out",
        format_ms(*until_ms)
    )]
    CellHeld {
        id: String,
        owner: String,
        until_ms: i64,
    },

    #[error(
        "replica `{replica}` no longer holds cell `{id}` (now held by {}); stop working on it, its new holder carries on",
        owner.as_deref().unwrap_or("nobody")
    )]
    NotCellOwner {
        id: String,
        replica: String,
        owner: Option<String>,
    },

    #[error(
        "session `{session}` already has {limit} live cells, the most it may have; wait for one to finish or terminate one"
    )]
    CellLimit { session: String, limit: u32 },

    #[error(
        "replay log of cell `{cell}`: step {got} was written out of order (the next step is {expected}); two runs of the cell are writing at once, or a step was lost"
    )]
    ReplayOutOfOrder {
        cell: String,
        expected: u64,
        got: u64,
    },

    // --- generic ---
    #[error("{what} `{id}` already exists; choose another id")]
    Duplicate { what: &'static str, id: String },

    // --- budgets ---
    #[error(
        "budget reservation `{id}` is not held any more (it was already settled or released); a reservation is settled or released exactly once"
    )]
    UnknownReservation { id: String },

    // --- audit ---
    #[error("could not make the next line of audit stream `{stream}`: {message}")]
    AuditLine { stream: String, message: String },
}

impl StateError {
    pub(crate) fn invalid(what: &'static str, problem: impl Into<String>) -> Self {
        StateError::Invalid {
            what,
            problem: problem.into(),
        }
    }
}

pub type Result<T, E = StateError> = std::result::Result<T, E>;
