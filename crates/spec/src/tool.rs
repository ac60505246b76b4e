//! What a tool is, and the trait every executor implements.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::{CallKind, Provenance, Schema, Usage};

pub type BoxFuture<'a, T> = futures::future::BoxFuture<'a, T>;

/// Who can see and call a tool.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Exposure {
    /// Declared to the model as its own tool (while active) and callable from scripts.
    Direct,
    /// Callable from scripts and listed in the codemode tool's description.
    #[default]
    Codemode,
    /// Callable from scripts and found by `searchTools`, never listed up front.
    Deferred,
    /// Callable by nobody.
    Hidden,
}

impl Exposure {
    /// How visible the exposure is: a larger number is more visible. Used by the narrowing rule,
    /// under which a project may only lower visibility.
    pub fn visibility(self) -> u8 {
        match self {
            Exposure::Hidden => 0,
            Exposure::Deferred => 1,
            Exposure::Codemode => 2,
            Exposure::Direct => 3,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Exposure::Direct => "direct",
            Exposure::Codemode => "codemode",
            Exposure::Deferred => "deferred",
            Exposure::Hidden => "hidden",
        }
    }
}

impl std::str::FromStr for Exposure {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "direct" => Ok(Exposure::Direct),
            "codemode" => Ok(Exposure::Codemode),
            "deferred" => Ok(Exposure::Deferred),
            "hidden" => Ok(Exposure::Hidden),
            other => Err(format!(
                "unknown exposure `{other}`; use one of direct, codemode, deferred, hidden"
            )),
        }
    }
}

/// Hints about a tool's behaviour, as MCP defines them. Absent means unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Annotations {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub title: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub read_only_hint: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub destructive_hint: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub idempotent_hint: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub open_world_hint: Option<bool>,
}

/// A tool as the registry, the declarations and the policy see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    /// The raw name (`read`, `mcp__github__search_code`, `models.classify`).
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the single argument. Shared: every copy of a spec (the registry's lists,
    /// a script's view, the search index) points at one text, so a server listing thousands
    /// of tools with large schemas costs the host one compact copy of them, not one per reader.
    pub input_schema: Schema,
    /// JSON Schema of the result, when known; shared like `input_schema`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub output_schema: Option<Schema>,
    /// The group the tool belongs to, such as one MCP server (`mcp__github`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub annotations: Annotations,
    #[serde(default)]
    pub exposure: Exposure,
    /// Tool, model operation or global; also the policy's action.
    #[serde(default = "default_kind")]
    pub kind: CallKind,
}

fn default_kind() -> CallKind {
    CallKind::Tool
}

impl ToolSpec {
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
    ) -> Self {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema: Schema::new(&input_schema),
            output_schema: None,
            namespace: None,
            annotations: Annotations::default(),
            exposure: Exposure::Codemode,
            kind: CallKind::Tool,
        }
    }

    /// `tools.<identifier>` for this tool.
    pub fn identifier(&self) -> String {
        crate::to_identifier(&self.name)
    }
}

/// A namespace: a group of tools with a shared description, such as one MCP server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceSpec {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub instructions: Option<String>,
    /// Why this namespace's tools are missing or failing now (an MCP server still starting, or
    /// down, and when it is tried again); `None` when it works. The description names it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub unavailable: Option<String>,
}

/// One block of content for the model: what a direct call shows, and what MCP carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ContentBlock {
    Text {
        text: String,
    },
    Image {
        /// Base64 data.
        data: String,
        #[serde(rename = "mimeType")]
        mime_type: String,
    },
}

/// One call handed to a tool in one step (prepare and run), for tests and embedders that check
/// calls elsewhere. The gate never uses it: it prepares, decides on the prepared call's facts,
/// and runs exactly what it decided on.
#[derive(Debug, Clone)]
pub struct ToolCall {
    pub args: Value,
    pub provenance: Provenance,
    /// Cancelled when the script ends, is aborted, or stops waiting for this call.
    pub cancel: CancellationToken,
}

/// What a prepared call gets when it runs.
#[derive(Debug, Clone)]
pub struct RunContext {
    pub provenance: Provenance,
    /// Cancelled when the script ends, is aborted, or stops waiting for this call. Tools stop
    /// cooperatively and say, in [`ToolError::effect`], whether their effect happened.
    pub cancel: CancellationToken,
}

/// What a tool returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolOutput {
    /// The JSON value a script's call resolves to.
    pub value: Value,
    /// What a direct (model) call shows; `None` means the value as JSON text.
    pub content: Option<Vec<ContentBlock>>,
    /// True when the tool reports a failure in its result (MCP `isError`), as opposed to failing.
    pub is_error: bool,
    /// What the call spent.
    pub usage: Option<Usage>,
    /// Memory the result holds in a budget of its tool's, given back when the output (every
    /// clone of it) is dropped: a large result waiting for its script still counts.
    pub held: HeldMemory,
}

/// A share of a memory budget that a result holds while it exists; empty for most results.
/// Not part of what the result means: equal whatever it holds.
#[derive(Clone, Default)]
pub struct HeldMemory(Option<std::sync::Arc<dyn Send + Sync>>);

impl HeldMemory {
    /// Holds `share` (released when dropped) for as long as the output exists.
    pub fn new(share: impl Send + Sync + 'static) -> Self {
        HeldMemory(Some(std::sync::Arc::new(share)))
    }
}

impl PartialEq for HeldMemory {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for HeldMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(_) => f.write_str("HeldMemory(held)"),
            None => f.write_str("HeldMemory(none)"),
        }
    }
}

impl ToolOutput {
    pub fn value(value: Value) -> Self {
        ToolOutput {
            value,
            ..Default::default()
        }
    }
}

/// Facts about a specific call that the policy decides on, known before it runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallFacts {
    /// Absolute, symlink-resolved paths the call would touch. Path rules see these, never the raw
    /// arguments, so `..` and symlinks cannot slip past them.
    pub paths: Vec<String>,
    /// Whether `paths` are what the call reads or changes, or only where it runs.
    pub path_use: PathUse,
    /// For a model call: the model it spends on.
    pub model: Option<ModelFacts>,
    /// For the `codemode` call: the script it runs.
    pub script: Option<ScriptFacts>,
}

/// What a call's paths are to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathUse {
    /// The files and directories the call reads or changes (as its tool's annotations say).
    #[default]
    Touched,
    /// Only where the call runs (`bash`'s working directory): what it changes is not known
    /// before it runs, so protected paths cannot be checked on it.
    WorkingDirectory,
}

/// The script a `codemode` call runs, as the policy, the hooks and the audit log see it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptFacts {
    /// SHA-256 (hex) of the script's source, options line included.
    pub sha256: String,
    /// Length of the source in bytes.
    pub bytes: u64,
}

/// The model a model call spends on, as the policy and the budgets see it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelFacts {
    pub provider: String,
    pub id: String,
    /// `classifier`, `image` or `chat`.
    pub model_type: String,
    /// USD per million input tokens.
    #[serde(default)]
    pub input_price: f64,
    /// USD per million output tokens.
    #[serde(default)]
    pub output_price: f64,
    /// USD per generated image.
    #[serde(default)]
    pub image_price: f64,
    /// Most input tokens the request can be billed for (0: unknown). Reserved before the call,
    /// so parallel calls cannot pass a cost cap only some of them fit under.
    #[serde(default)]
    pub max_input_tokens: u64,
    /// Most output tokens the request allows (its `max_tokens`; 0: unknown).
    #[serde(default)]
    pub max_output_tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolErrorKind {
    /// The arguments are wrong in a way the schema could not say.
    InvalidArguments,
    /// The tool ran and failed.
    Failed,
    /// The call was cancelled.
    Cancelled,
    /// The call did not finish in time.
    Timeout,
}

/// Whether a call that ended without a result changed anything, as the audit log records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Nothing was changed: the call stopped before its effect, or it has none.
    None,
    /// The effect happened (a file was replaced, a command ran to its end).
    Applied,
    /// It may or may not have happened (a request was sent and its answer never came).
    Unknown,
}

/// A tool's failure. The message goes back to the script or the model, so it should say what went
/// wrong and how to do better.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    pub kind: ToolErrorKind,
    pub message: String,
    /// What the failed call did to the world. [`ToolError::failed`] and [`ToolError::timeout`]
    /// assume [`Effect::Unknown`]; a tool that knows better says so with
    /// [`ToolError::with_effect`].
    pub effect: Effect,
}

impl ToolError {
    pub fn failed(message: impl Into<String>) -> Self {
        ToolError {
            kind: ToolErrorKind::Failed,
            message: message.into(),
            effect: Effect::Unknown,
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        ToolError {
            kind: ToolErrorKind::InvalidArguments,
            message: message.into(),
            effect: Effect::None,
        }
    }
    /// Cancelled before anything was changed.
    pub fn cancelled() -> Self {
        ToolError {
            kind: ToolErrorKind::Cancelled,
            message: "the call was cancelled".into(),
            effect: Effect::None,
        }
    }
    pub fn timeout(message: impl Into<String>) -> Self {
        ToolError {
            kind: ToolErrorKind::Timeout,
            message: message.into(),
            effect: Effect::Unknown,
        }
    }
    pub fn with_effect(mut self, effect: Effect) -> Self {
        self.effect = effect;
        self
    }
}

/// An executor behind the gate.
///
/// A call is prepared once: [`Tool::prepare`] parses the arguments, resolves what the call will
/// touch (opening paths without following symlinks and keeping the handles) and returns a
/// [`PreparedCall`] whose [`facts`](PreparedCall::facts) the policy, the hooks and the audit log
/// judge. The gate then runs that same prepared call, so what was judged is what is used: a
/// symlink swapped in between cannot redirect it. Only the gate runs prepared calls.
pub trait Tool: Send + Sync {
    fn spec(&self) -> &ToolSpec;

    /// Parses and checks the arguments and resolves what the call touches. Runs after schema
    /// validation and before the policy, so it must not change anything. An error refuses the
    /// call.
    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError>;

    /// The facts a call with these arguments would be judged on (for tests and explanations).
    fn facts(&self, args: &Value) -> Result<CallFacts, ToolError> {
        Ok(self.prepare(args.clone())?.facts().clone())
    }

    /// Prepares and runs in one step, without any gate: for tests and embedders only.
    fn call(&self, call: ToolCall) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        match self.prepare(call.args) {
            Ok(prepared) => prepared.run(RunContext {
                provenance: call.provenance,
                cancel: call.cancel,
            }),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }
}

/// A call that a tool has prepared: its facts, and the work that runs on exactly those facts.
pub trait PreparedCall: Send {
    /// What the call touches, as resolved once in [`Tool::prepare`].
    fn facts(&self) -> &CallFacts;

    /// Does the work. Tools that hold handles refuse here if what they hold no longer is what
    /// the facts name (a path that was swapped after it was judged).
    fn run(self: Box<Self>, ctx: RunContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>>;
}

/// A prepared call from facts and a closure: for tools whose facts need no handles (MCP tools,
/// model operations), `prepare` is one line:
/// `Ok(prepared(CallFacts::default(), move |ctx| Box::pin(async move { ... })))`.
pub fn prepared<F>(facts: CallFacts, run: F) -> Box<dyn PreparedCall>
where
    F: FnOnce(RunContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> + Send + 'static,
{
    Box::new(PreparedFn { facts, run })
}

struct PreparedFn<F> {
    facts: CallFacts,
    run: F,
}

impl<F> PreparedCall for PreparedFn<F>
where
    F: FnOnce(RunContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> + Send + 'static,
{
    fn facts(&self) -> &CallFacts {
        &self.facts
    }

    fn run(self: Box<Self>, ctx: RunContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        (self.run)(ctx)
    }
}

/// How the codemode tool relates to the direct tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CodemodeMode {
    /// Direct tools stay declared to the model beside `codemode`.
    #[default]
    On,
    /// Only `codemode` is declared; a direct call of any other tool by the model is refused
    /// (scripts may still call it).
    Only,
}
