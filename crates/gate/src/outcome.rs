//! One call's outcome, typed once: the audit line, the ledger's record and the run's call
//! record are all this value.

use codemode_spec::{CallKind, Effect, Provenance, ScriptFacts, Usage};
use serde::Serialize;

use crate::error::Stage;

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The tool ran and returned a result (which may itself report an error, `is_error`).
    Ok,
    /// The tool ran and failed.
    Error,
    /// The gate refused the call; nothing ran.
    Denied,
    /// The call was cancelled (the script ended or stopped waiting); `effect` says whether the
    /// tool's work happened anyway.
    Cancelled,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Error => "error",
            Status::Denied => "denied",
            Status::Cancelled => "cancelled",
        }
    }
}

/// Everything the gate records about one call. Serialized, it is the audit line (before the
/// chain fields); the ledger keeps it as the script's call record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallOutcome {
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    pub provenance: Provenance,
    /// Who the session acts for (under `serve --listen`, the name of the bearer token that
    /// began it), the principal its `budgets.principal` and `budgets.team` are charged to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// The tool's raw name (or the name asked for, when it did not resolve).
    pub tool: String,
    /// The tool's namespace, such as `mcp__github` for a server's tools: which server a call
    /// reached, in the line itself (server names cannot make two servers' tool names equal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub kind: Option<CallKind>,
    pub args_sha256: String,
    /// The arguments as JSON, cut to 200 characters.
    pub args_preview: String,
    /// The resolved paths the call was judged on.
    pub paths: Vec<String>,
    /// For the `codemode` call: the script it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub script: Option<ScriptFacts>,
    /// `allow`, `ask`, `deny`, or `none` when the call stopped before the policy.
    pub decision: String,
    pub policy_ids: Vec<String>,
    pub status: Status,
    /// The stage that refused or failed the call.
    pub stage: Option<Stage>,
    /// Why, cut to 500 characters.
    pub message: Option<String>,
    /// Whether the call's work happened.
    pub effect: Effect,
    pub duration_ms: u64,
    pub usage: Option<Usage>,
    /// JSON size of the result returned.
    pub bytes: u64,
    /// The id of the call's "started" line in the journal, written before it ran (unique, where
    /// call ids start again in every process): it pairs the two lines, and a log whose lines
    /// name journal lines while its journal is gone lost its journal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal_id: Option<String>,
}

/// The ledger's record of a call is its outcome.
pub type CallRecord = CallOutcome;

/// What a call whose name resolved to no registered tool is called in telemetry (its span's
/// name, its metrics' `tool` label): a caller may send any text as a name, and those names
/// must stay a small set. The audit line keeps the name asked for.
pub const UNRESOLVED_TOOL: &str = "(unresolved)";
