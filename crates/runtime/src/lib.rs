//! The embeddable codemode library.
//!
//! [`Codemode`] wires one script run end to end: it takes the model's script, builds the script's
//! view of the tools from the gate's registry, runs it in the sandbox, and answers every call the
//! script makes by asking the gate. The sandbox never sees a tool; the tools never see the
//! sandbox; the gate sits between them on every path that carries authority.
//!
//! ```text
//! model ─► Codemode::run_script ─► Sandbox (QuickJS) ─► RuntimeHost ─► Gate ─► Tool
//!                                                         ▲ read-only helpers (searchTools, describeTool,
//!                                                           describeNamespace, models.getModelsOfType, …)
//! ```
//!
//! Start with [`Codemode::builder`]:
//!
//! ```no_run
//! use std::sync::Arc;
//! use codemode_gate::{Gate, PolicySet, Registry};
//! use codemode_runtime::{Codemode, ScriptRequest};
//! use codemode_tools::{ToolsConfig, builtin_tools};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Everything a script may call is registered in the gate's registry.
//! let registry = Registry::new();
//! for tool in builtin_tools(&ToolsConfig::new("/path/to/project")) {
//!     registry.register(tool)?;
//! }
//! let gate = Gate::builder()
//!     .registry(registry)
//!     .policy(PolicySet::defaults()) // read-only tools run; writes and bash are asked
//!     .build()?;
//! let codemode = Codemode::builder().gate(gate).build()?;
//!
//! // Declare `codemode` to the model with this description...
//! let description = codemode.description();
//! # let _ = description;
//! // ...and run what the model writes; `text` is what the model reads back.
//! let run = codemode
//!     .run_script(ScriptRequest::new("return (await tools.ls({})).entries.length", "session-1"))
//!     .await;
//! println!("{}", run.text);
//! # Ok(())
//! # }
//! ```

mod builder;
pub mod cells;
mod codemode_tool;
mod globals;
mod host;
mod media;
mod principal_share;
mod run;
mod store;
mod view;

pub use builder::{CodemodeBuilder, RuntimeError};
pub use cells::{CellError, CellReport, Cells, CellsConfig, PendingCall, WaitOptions};
/// The state store crate, for front ends that answer approvals or list cells.
pub use codemode_state;
pub use globals::READ_ONLY_GLOBALS;
pub use run::{CallEvent, CallObserver, GateRecord, ScriptRequest, ScriptRun, ScriptSurface};

use std::sync::Arc;

use codemode_declarations::{DescriptionInput, Globals, ToolIndex};
use codemode_gate::{CallRequest, Gate, GateError};
use codemode_models::Catalog;
use codemode_sandbox::Sandbox;
use codemode_spec::{CodemodeMode, Provenance, ToolOutput, ToolSpec};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// One codemode installation: a gate, a sandbox, and the sessions that use them.
///
/// Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Codemode {
    inner: Arc<Inner>,
}

struct Inner {
    gate: Gate,
    sandbox: Sandbox,
    catalog: Option<Arc<Catalog>>,
    /// `None`: chosen by the size of the catalog (see `default_inline_budget`).
    inline_budget_tokens: Option<usize>,
    offer_codemode_tool: bool,
    stores: store::SessionStores,
    cells: Option<cells::Cells>,
    /// Scripts running now, by principal; shared with the cells when there are any.
    share: Arc<principal_share::PrincipalShare>,
    /// Scripts one named principal may run at once here (`cells.max_running_per_principal`).
    max_running_per_principal: u32,
    next_id: std::sync::atomic::AtomicU64,
    /// What scripts see of the registry, kept while it stays the same.
    views: view::ViewCache,
}

impl Codemode {
    pub fn builder() -> CodemodeBuilder {
        CodemodeBuilder::default()
    }

    pub fn gate(&self) -> &Gate {
        &self.inner.gate
    }

    pub fn sandbox(&self) -> &Sandbox {
        &self.inner.sandbox
    }

    pub fn mode(&self) -> CodemodeMode {
        self.inner.gate.mode()
    }

    /// Whether the `codemode` tool is offered to the model at all.
    pub fn offers_codemode_tool(&self) -> bool {
        self.inner.offer_codemode_tool
    }

    /// Whether scripts get the `models` namespace.
    pub fn models_enabled(&self) -> bool {
        self.inner.catalog.is_some()
    }

    /// The tools a script may call as `tools.<name>` right now.
    pub fn script_tools(&self) -> Vec<ToolSpec> {
        self.script_view().tools.clone()
    }

    /// The description of the `codemode` tool, built from the tools a script can call now.
    /// The same tools give byte-identical text, whatever order they were registered in.
    pub fn description(&self) -> String {
        let tools = self.script_tools();
        let namespaces = self.inner.gate.registry().namespaces();
        let mut input = DescriptionInput {
            tools: &tools,
            namespaces: &namespaces,
            mode: self.mode(),
            globals: Globals {
                models: self.models_enabled(),
                models_doc: None,
                cells: self.inner.cells.is_some(),
            },
            inline_budget_tokens: 0,
        };
        input.inline_budget_tokens = match self.inner.inline_budget_tokens {
            Some(budget) => budget,
            None => codemode_declarations::default_inline_budget(&input),
        };
        codemode_declarations::codemode_description(&input)
    }

    /// The direct tools to declare to the model beside `codemode`: none in mode `only`. Each one's
    /// description gains a line saying what `tools.<name>()` resolves to inside a script.
    pub fn model_declared_tools(&self) -> Vec<ToolSpec> {
        let mut specs = self.inner.gate.registry().model_declared(self.mode());
        specs.retain(|s| s.name != codemode_gate::CODEMODE_TOOL);
        for spec in &mut specs {
            let note = codemode_declarations::direct_tool_note(spec);
            spec.description = format!("{}\n\n{}", spec.description.trim_end(), note);
        }
        specs
    }

    /// A search index over what scripts can call now (also what `searchTools` uses).
    pub fn tool_index(&self) -> ToolIndex {
        let tools = self.script_tools();
        ToolIndex::new(&tools, &self.inner.gate.registry().namespaces())
    }

    /// A call the model makes directly, as a declared tool. It passes the same gate as a script's
    /// call; in mode `only` the gate refuses it and says to call the tool from a script. A call
    /// of `codemode` itself runs the script (see [`Codemode::run_script`]). Cancelling `cancel`
    /// (the client's `notifications/cancelled`, a shutdown) cancels the call or the script.
    pub async fn call_direct(
        &self,
        name: &str,
        args: Value,
        session_id: &str,
        client: Option<String>,
        cancel: CancellationToken,
    ) -> Result<ToolOutput, GateError> {
        if name == codemode_gate::CODEMODE_TOOL {
            let Some(code) = args.get("code").and_then(Value::as_str) else {
                return Err(GateError::new(
                    codemode_gate::Stage::Validate,
                    "the codemode tool takes {\"code\": \"<JavaScript>\"}; `code` is missing or not a string",
                ));
            };
            let mut req = ScriptRequest::new(code, session_id);
            req.client = client;
            req.abort = cancel;
            let run = self.run_script(req).await;
            return Ok(ToolOutput {
                value: run.structured(),
                content: Some(vec![codemode_spec::ContentBlock::Text { text: run.text }]),
                is_error: run.is_error,
                usage: (!run.usage.is_empty()).then_some(run.usage),
                held: Default::default(),
            });
        }
        let mut provenance = Provenance::model(self.next_call_id("call"), session_id);
        provenance.client = client;
        self.inner
            .gate
            .call(CallRequest {
                name: name.to_string(),
                args,
                provenance,
                cancel,
                clock: None,
                result_room: None,
            })
            .await
    }

    /// A request the MCP client makes itself, not the model (a resource the person chose to
    /// read): passes the gate like any call (policy, hooks, approval, audit) with origin
    /// `client`, whatever the tool's exposure.
    pub async fn call_for_client(
        &self,
        name: &str,
        args: Value,
        session_id: &str,
        client: Option<String>,
        cancel: CancellationToken,
    ) -> Result<ToolOutput, GateError> {
        let mut provenance = Provenance::client(self.next_call_id("call"), session_id);
        provenance.client = client;
        self.inner
            .gate
            .call(CallRequest {
                name: name.to_string(),
                args,
                provenance,
                cancel,
                clock: None,
                result_room: None,
            })
            .await
    }

    /// Ends a session (for example when an MCP session ends): drops its store, in the state
    /// store too, and what the gate keeps for it (see [`codemode_gate::Gate::forget_session`]).
    pub fn end_session(&self, session_id: &str) {
        // The gate first: a script of the session that ends after this sees the session ended
        // and keeps no `store()` write for it (see `run.rs`).
        self.gate().forget_session(session_id);
        self.inner.stores.remove(session_id);
        if let Some(durable) = self.durable_store().cloned()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let id = session_id.to_string();
            rt.spawn(async move {
                if let Err(e) = durable.delete_session(&id).await {
                    tracing::warn!(session = %id, "could not delete the session's stored values: {e}");
                }
            });
        }
    }

    /// The state store, when this installation keeps durable state (cells, `store()` values).
    pub fn durable_store(&self) -> Option<&Arc<dyn codemode_state::StateStore>> {
        self.inner.cells.as_ref().map(|c| c.store())
    }

    /// The session's stored values, as `load()` sees them, when there is no durable store;
    /// with one, `load()` reads that ([`Codemode::durable_store`], `load_store`), and this is
    /// empty.
    pub fn session_store(&self, session_id: &str) -> std::collections::BTreeMap<String, Value> {
        self.inner.stores.snapshot(session_id)
    }

    fn next_call_id(&self, prefix: &str) -> String {
        let n = self
            .inner
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{prefix}_{n}")
    }
}
