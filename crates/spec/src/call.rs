//! Where a call comes from and what it spent.

use serde::{Deserialize, Serialize};

/// The kind of a call, which is also the policy's action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    /// A tool: built-in, from an MCP server, or registered by the embedding code.
    Tool,
    /// A model operation that spends credentials (`models.classify`, `models.generateImages`).
    Model,
    /// A host global with side effects, registered by the embedding code.
    Global,
}

/// Who asked for the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// The model called the tool directly, as a declared tool.
    Model,
    /// A codemode script called it (`depth` says how deeply nested).
    Script,
    /// The MCP client asked for it itself, not through a tool call of the model: a resource
    /// the person chose to read (`resources/read`, proxied in mode `on`).
    Client,
}

/// Everything the gate, the hooks and the audit log know about where a call came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    /// Unique id of this call.
    pub call_id: String,
    /// The call that caused this one: for a script's call, the `codemode` call that ran the script.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub parent_call_id: Option<String>,
    /// 0 for a call the model made, 1 for a call from a script, and one more per nesting level.
    pub depth: u32,
    pub origin: Origin,
    /// Id of the script run that made the call.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub script_id: Option<String>,
    /// SHA-256 (hex) of the script's source.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub script_hash: Option<String>,
    pub session_id: String,
    /// 1-based position of the call among the script's calls.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub seq: Option<u64>,
    /// The MCP client (or other front end) that drives the session, when known.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub client: Option<String>,
}

impl Provenance {
    /// A request of the MCP client itself (see [`Origin::Client`]), at depth 0.
    pub fn client(call_id: impl Into<String>, session_id: impl Into<String>) -> Self {
        Provenance {
            origin: Origin::Client,
            ..Provenance::model(call_id, session_id)
        }
    }

    /// Provenance of a call the model made directly.
    pub fn model(call_id: impl Into<String>, session_id: impl Into<String>) -> Self {
        Provenance {
            call_id: call_id.into(),
            parent_call_id: None,
            depth: 0,
            origin: Origin::Model,
            script_id: None,
            script_hash: None,
            session_id: session_id.into(),
            seq: None,
            client: None,
        }
    }
}

/// What a call spent. Model calls fill the token and cost fields; any call may report bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub images: u64,
    /// Cost in US dollars.
    #[serde(default)]
    pub cost_usd: f64,
    /// Some of these numbers are codemode's own count, not the provider's: it reported no
    /// usage, or less than was sent, or the call was cut off after its request went out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

impl Usage {
    /// Adds `other`. Counts saturate: a provider reporting an absurd count (up to `u64::MAX`)
    /// must make the total larger, never wrap it to a small number a budget lets through.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.images = self.images.saturating_add(other.images);
        self.cost_usd += other.cost_usd;
        self.estimated |= other.estimated;
    }

    pub fn total_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    pub fn is_empty(&self) -> bool {
        self.input_tokens == 0
            && self.output_tokens == 0
            && self.images == 0
            && self.cost_usd == 0.0
    }
}
