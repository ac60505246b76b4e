//! The gate: the one place that decides every call.
//!
//! Whoever makes a call (the model directly, a script, a nested script) and whatever it is (a
//! tool, a model operation, a host global), it passes [`Gate::call`]: resolve against the
//! registry as it is now, validate the arguments against the tool's schema, ask the tool for
//! prepare the call (its facts: resolved paths, the model it spends on), refuse changes to
//! protected paths, reserve the budget, ask the Cedar policies, run the hooks, ask a person when
//! a policy or hook says so, run exactly the prepared call, run the after-hooks, and write one
//! audit line. Nothing is allowed unless a policy permits it, and every failure of a
//! guard (a hook that crashes, a policy that cannot be evaluated) refuses the call.

pub mod approval;
pub mod audit;
pub mod budget;
pub mod error;
mod gate;
pub mod hooks;
mod model_rules;
pub mod observe;
pub mod outcome;
pub mod policy;
pub mod registry;
mod schema_size;
mod suggest;
mod unique_items;
mod validate;

pub use approval::{
    ApprovalAnswer, ApprovalRequest, Approver, shown_arguments, shown_paths, shown_text,
};
pub use audit::{
    AuditError, AuditKey, AuditLog, HeadCheck, StreamReport, UnfinishedCall, VerifyReport,
    head_path, started_path, started_stream, unfinished_calls, unfinished_stream_calls, verify,
    verify_stream,
};
pub use budget::{BudgetLimits, Budgets, DailyBudgets, KEPT_RECORDS, LedgerSnapshot, Principal};
pub use error::{GateError, RegistryError, Stage};
pub use gate::{
    Admission, CODEMODE_PERMIT_ID, CallRequest, Gate, GateBuilder, ProtectedPath, ResultRoom,
    SessionHold,
};
pub use hooks::{
    AfterDecision, CommandHooks, Hook, HookDecision, HookEvent, HookSettings, MAX_HOOKS_AT_ONCE,
};
pub use model_rules::ModelRules;
pub use observe::CallObserver;
pub use outcome::{CallOutcome, CallRecord, Status, UNRESOLVED_TOOL};
pub use policy::{
    Decision, ExplainInput, Explanation, PolicyError, PolicySchema, PolicySet, ToolLiteral, check,
    explain,
};
pub use registry::{CODEMODE_TOOL, Registry};

/// The first `max` characters of `s`, with an ellipsis when cut.
pub(crate) fn preview(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push('…');
    out
}
