//! Errors the gate returns, each naming the stage that refused the call.

use serde::Serialize;

/// The pipeline stage that refused or failed a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Resolve,
    Validate,
    Facts,
    /// A change to a path the gate protects (its configuration, the audit log).
    Protected,
    Policy,
    Hook,
    Approval,
    Budget,
    Execute,
    AfterHook,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Resolve => "resolve",
            Stage::Validate => "validate",
            Stage::Facts => "facts",
            Stage::Protected => "protected",
            Stage::Policy => "policy",
            Stage::Hook => "hook",
            Stage::Approval => "approval",
            Stage::Budget => "budget",
            Stage::Execute => "execute",
            Stage::AfterHook => "after_hook",
        }
    }
}

/// Why the gate did not return a tool's output.
///
/// `message` is written for the script author or the model: it says what was wrong and how to do
/// better. `policy_ids` names the Cedar policies that decided, when a policy did.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct GateError {
    pub stage: Stage,
    pub message: String,
    pub policy_ids: Vec<String>,
    /// For `Stage::Execute`: the tool's own error kind.
    pub tool_error: Option<codemode_spec::ToolErrorKind>,
}

impl GateError {
    pub fn new(stage: Stage, message: impl Into<String>) -> Self {
        GateError {
            stage,
            message: message.into(),
            policy_ids: Vec::new(),
            tool_error: None,
        }
    }

    pub fn with_policies(mut self, ids: Vec<String>) -> Self {
        self.policy_ids = ids;
        self
    }
}

/// Why the registry refused a change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("a tool named `{0}` is already registered; remove it first or pick another name")]
    Duplicate(String),
    #[error(
        "tools `{existing}` and `{new}` both become `tools.{identifier}` in scripts; rename one of them"
    )]
    IdentifierCollision {
        existing: String,
        new: String,
        identifier: String,
    },
    #[error("no tool named `{0}` is registered")]
    Unknown(String),
    #[error(
        "`{name}` has exposure `{exposure}`; only direct tools have an active state (codemode and deferred tools are always callable from scripts)"
    )]
    NotDirect { name: String, exposure: String },
}
