//! What a script may call: the host, and the description of one script run.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use codemode_spec::DeadlineClock;
use futures::future::LocalBoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::held::AnswerRoom;

/// The sandbox's only power: every `tools.x(...)` and host global call lands here.
///
/// The returned future is polled on the script's own worker thread (that is what makes a call
/// cheap), so it need not be `Send`; it may hop to another runtime itself if it has to. It
/// should, when the call spawns tasks that outlive it (a pooled HTTP connection, a client's
/// background reader): such tasks land on the worker's runtime, which is not polled while the
/// worker waits for its next script. `codemode-runtime` runs every gated call on the
/// embedder's runtime for this reason.
pub trait Host: Send + Sync + 'static {
    fn call(&self, call: HostCall) -> LocalBoxFuture<'static, Result<Value, HostError>>;

    /// Like [`Host::call`], but answers with JSON text. The sandbox hands the text to the script
    /// as is, so a host that already holds serialized JSON (an MCP response, a cached result)
    /// overrides this to skip building and serializing a `Value`. The text must be valid JSON;
    /// if it is not, the script's call rejects with a `TypeError`.
    fn call_json(&self, call: HostCall) -> LocalBoxFuture<'static, Result<String, HostError>> {
        let fut = self.call(call);
        Box::pin(async move {
            let value = fut.await?;
            serde_json::to_string(&value).map_err(|e| {
                HostError::new(format!(
                    "The host's answer cannot be sent to the script as JSON: {e}"
                ))
            })
        })
    }

    /// A call the sandbox refused before reading its arguments: more JSON values, bytes or
    /// nesting than the host decodes. `call.args` is `null`; nothing may run. The host may
    /// record the refusal (`codemode-runtime` writes it to the audit log); the script gets
    /// `error` whatever this returns. By default, nothing is recorded.
    fn refused(&self, call: HostCall, error: HostError) -> LocalBoxFuture<'static, ()> {
        let _ = (call, error);
        Box::pin(async {})
    }
}

/// Whether a call came from `tools.<name>` or from a host global such as `models.classify`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostCallKind {
    Tool,
    Global,
}

/// One call from the script.
#[derive(Debug, Clone)]
pub struct HostCall {
    /// 1-based position among the script's calls (tools and globals).
    pub id: u64,
    /// Raw tool name, or the global's full name (`models.classify`).
    pub name: String,
    pub kind: HostCallKind,
    /// Tools: the first argument (`null` when omitted). Globals: all arguments as an array.
    pub args: Value,
    /// Cancelled when the script ends before the call does, or when the run is aborted.
    pub cancel: CancellationToken,
    /// The script's deadline clock; hold `clock.pause()` while waiting for a person.
    pub clock: DeadlineClock,
    /// Where the call's result waits for the script: reserve its size as soon as it exists.
    pub room: AnswerRoom,
}

/// A failed call. The script's `await` rejects with an `Error` carrying this message, name and
/// properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostError {
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub properties: Map<String, Value>,
}

impl HostError {
    pub fn new(message: impl Into<String>) -> Self {
        HostError {
            message: message.into(),
            ..Default::default()
        }
    }
}

/// A tool as the script sees it: `tools.<to_identifier(name)>` and `tools["<name>"]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolEntry {
    pub name: String,
    pub description: String,
}

/// Seeded randomness and a virtual clock, for runs that can be replayed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Determinism {
    pub seed: u32,
    /// `Date.now()` at the start, in ms since the epoch.
    pub start_ms: f64,
}

/// One script run.
#[derive(Clone)]
pub struct Script {
    /// Exactly what the model wrote, optional options line included.
    pub source: String,
    pub tools: Vec<ToolEntry>,
    /// Host globals such as `searchTools` or `models.classify` (at most one dot).
    pub globals: Vec<String>,
    pub host: Arc<dyn Host>,
    /// Snapshot served by `load()`.
    pub store: BTreeMap<String, Value>,
    pub determinism: Option<Determinism>,
    /// Write a JSON Lines log of calls and results here.
    pub record: Option<PathBuf>,
    /// Serve results from such a log instead of calling the host.
    pub replay: Option<PathBuf>,
    pub abort: CancellationToken,
    pub clock: DeadlineClock,
    /// Told of each output item the host accepted, as it comes (for runs that report their
    /// output before they end). Called on the script's pool thread: it must not block.
    pub on_output: Option<OutputTap>,
}

/// Receives output items while the script runs; see [`Script::on_output`].
#[derive(Clone)]
pub struct OutputTap(Arc<dyn Fn(&crate::OutputItem) + Send + Sync>);

impl OutputTap {
    pub fn new(tap: impl Fn(&crate::OutputItem) + Send + Sync + 'static) -> Self {
        OutputTap(Arc::new(tap))
    }

    pub(crate) fn tell(&self, item: &crate::OutputItem) {
        (self.0)(item)
    }
}

impl Script {
    /// A script with no tools, globals or store, a fresh clock and its own abort token.
    pub fn new(source: impl Into<String>, host: Arc<dyn Host>) -> Script {
        Script {
            source: source.into(),
            tools: Vec::new(),
            globals: Vec::new(),
            host,
            store: BTreeMap::new(),
            determinism: None,
            record: None,
            replay: None,
            abort: CancellationToken::new(),
            clock: DeadlineClock::new(),
            on_output: None,
        }
    }

    /// Adds tools by name and description.
    pub fn with_tools<'a>(mut self, tools: impl IntoIterator<Item = (&'a str, &'a str)>) -> Script {
        self.tools.extend(tools.into_iter().map(|(n, d)| ToolEntry {
            name: n.to_string(),
            description: d.to_string(),
        }));
        self
    }
}

impl std::fmt::Debug for Script {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Script")
            .field("source", &self.source)
            .field("tools", &self.tools)
            .field("globals", &self.globals)
            .field("determinism", &self.determinism)
            .finish_non_exhaustive()
    }
}
