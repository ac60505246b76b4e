//! Asking a person.

use codemode_spec::{BoxFuture, CallKind, Provenance};
use serde::Serialize;
use serde_json::Value;

/// The question put to the approver.
#[derive(Debug, Clone, Serialize)]
pub struct ApprovalRequest {
    pub tool_name: String,
    pub kind: CallKind,
    pub args: Value,
    pub paths: Vec<String>,
    pub provenance: Provenance,
    /// Why approval is needed (the `@ask` text or the hook's reason).
    pub reason: String,
    /// The policies that asked, if a policy did.
    pub policy_ids: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalAnswer {
    Yes,
    No,
    /// Yes, and do not ask again for this tool in this script.
    Always,
    /// Nobody could be asked; says why, for the model (for example "this client cannot show
    /// approval requests"). The call is refused, but not as a person's "no".
    Unasked(&'static str),
}

/// Whoever answers approval questions: a terminal prompt, an MCP elicitation, a test.
///
/// The gate pauses the script's deadline clock while `approve` runs.
pub trait Approver: Send + Sync {
    fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, ApprovalAnswer>;
}
