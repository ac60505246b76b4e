//! Hooks: code that sees each call before it runs and each result before the caller does.

mod command;

use codemode_spec::{BoxFuture, CallKind, ModelFacts, Provenance, ScriptFacts, ToolOutput};
use serde_json::Value;

pub use command::{
    CommandHooks, HookCommand, HookConfigError, HookMatcher, HookSettings, MAX_HOOKS_AT_ONCE,
    PROJECT_DIR_ENV,
};

/// What a hook sees about one call.
#[derive(Debug, Clone)]
pub struct HookEvent {
    pub tool_name: String,
    pub kind: CallKind,
    /// The validated arguments (after earlier hooks' rewrites).
    pub args: Value,
    /// Resolved paths from the tool's facts.
    pub paths: Vec<String>,
    /// For a model call: the model it spends on.
    pub model: Option<ModelFacts>,
    /// For the `codemode` call: the script's SHA-256 and size.
    pub script: Option<ScriptFacts>,
    pub provenance: Provenance,
}

/// A before-hook's verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum HookDecision {
    Allow,
    /// Refuse the call; the reason goes back to the caller.
    Deny(String),
    /// Ask the approver; without one, the call is refused.
    Ask(String),
    /// Replace the arguments. The gate validates them again, and asks the policy again.
    Rewrite(Value),
}

/// An after-hook's verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum AfterDecision {
    Keep,
    /// Replace what the caller receives (redaction, summarising).
    Replace(ToolOutput),
    /// Withhold the result; the caller receives an error with this reason.
    Block(String),
}

/// A hook in the gate's pipeline. Hooks run in registration order; the first denial wins.
pub trait Hook: Send + Sync {
    fn before<'a>(&'a self, _ev: &'a HookEvent) -> BoxFuture<'a, HookDecision> {
        Box::pin(async { HookDecision::Allow })
    }

    fn after<'a>(
        &'a self,
        _ev: &'a HookEvent,
        _out: &'a ToolOutput,
    ) -> BoxFuture<'a, AfterDecision> {
        Box::pin(async { AfterDecision::Keep })
    }
}
