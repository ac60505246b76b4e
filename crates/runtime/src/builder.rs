//! Putting a [`Codemode`] together.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use codemode_gate::{Gate, RegistryError};
use codemode_models::{Catalog, ModelsHttpConfig};
use codemode_sandbox::{Sandbox, SandboxConfig, SandboxError};

use crate::{Codemode, Inner, store::SessionStores};

/// Why a [`Codemode`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("no gate was given: call CodemodeBuilder::gate with the gate every call must pass")]
    MissingGate,
    #[error("the sandbox could not start: {0}")]
    Sandbox(#[from] SandboxError),
    #[error("a model tool could not be registered: {0}")]
    Registry(#[from] RegistryError),
}

/// Scripts a principal may run at once when nothing says otherwise (as for cells).
const DEFAULT_MAX_RUNNING_PER_PRINCIPAL: u32 = 32;

/// Builds a [`Codemode`]. Only the gate is required.
#[derive(Default)]
pub struct CodemodeBuilder {
    gate: Option<Gate>,
    sandbox: Option<Sandbox>,
    sandbox_config: Option<SandboxConfig>,
    models: Option<(Arc<Catalog>, ModelsHttpConfig)>,
    inline_budget_tokens: Option<usize>,
    codemode_tool_off: bool,
    cells: Option<crate::cells::Cells>,
    max_running_per_principal: Option<u32>,
}

impl CodemodeBuilder {
    /// Whether the `codemode` tool is offered to the model (default true). Off when nothing
    /// asked for it (see `codemode-setup`'s activation rule): front ends then declare only the
    /// direct tools.
    pub fn offer_codemode_tool(mut self, offer: bool) -> Self {
        self.codemode_tool_off = !offer;
        self
    }

    /// The gate every call passes. Its registry is what scripts can call.
    pub fn gate(mut self, gate: Gate) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Shares a running sandbox (its prepared runtimes) between several installations.
    pub fn sandbox(mut self, sandbox: Sandbox) -> Self {
        self.sandbox = Some(sandbox);
        self
    }

    /// Limits and pool size for a sandbox of this installation's own.
    pub fn sandbox_config(mut self, config: SandboxConfig) -> Self {
        self.sandbox_config = Some(config);
        self
    }

    /// Gives scripts the `models` namespace. Its spending operations are registered in the gate
    /// as model calls, so policy, hooks, approval, budgets and audit apply to them.
    pub fn models(mut self, catalog: Arc<Catalog>, http: ModelsHttpConfig) -> Self {
        self.models = Some((catalog, http));
        self
    }

    /// How many tokens of tool declarations the codemode description may list. Without it, the
    /// budget follows the catalog's size: 3000 tokens, or 1000 for a catalog too large to list.
    pub fn inline_budget_tokens(mut self, tokens: usize) -> Self {
        self.inline_budget_tokens = Some(tokens);
        self
    }

    /// Runs scripts as cells (see [`crate::cells`]) with durable state in `cells`' store. Give
    /// the gate `cells.approver(..)` as its approver for approvals that pause.
    pub fn cells(mut self, cells: crate::cells::Cells) -> Self {
        self.cells = Some(cells);
        self
    }

    /// Scripts one principal may run at once in this installation (default: the cells'
    /// `max_running_per_principal`, else 32; at least 1). Each holds a sandbox worker while it
    /// runs, a slow call or an approval included, so without a cap one token could hold the
    /// whole pool. Scripts acting for nobody (the command line, an embedder, a server without
    /// tokens) are not capped outside cells: they all belong to one user.
    pub fn max_running_per_principal(mut self, limit: u32) -> Self {
        self.max_running_per_principal = Some(limit.max(1));
        self
    }

    pub fn build(self) -> Result<Codemode, RuntimeError> {
        let gate = self.gate.ok_or(RuntimeError::MissingGate)?;
        // The `codemode` call itself passes the gate; several installations may share one.
        match gate
            .registry()
            .register(Arc::new(crate::codemode_tool::CodemodeTool::new()))
        {
            Ok(()) | Err(RegistryError::Duplicate(_)) => {}
            Err(e) => return Err(e.into()),
        }
        let sandbox = match self.sandbox {
            Some(s) => s,
            None => Sandbox::new(self.sandbox_config.unwrap_or_default())?,
        };
        let catalog = match self.models {
            Some((catalog, http)) => {
                for tool in codemode_models::model_tools(catalog.clone(), http) {
                    gate.registry().register(tool)?;
                }
                Some(catalog)
            }
            None => None,
        };
        // One count for a principal's scripts, whether they run as cells or not.
        let (share, cells_limit) = match &self.cells {
            Some(cells) => (
                cells.inner.share.clone(),
                Some(cells.config().max_running_per_principal),
            ),
            None => (Arc::default(), None),
        };
        let max_running_per_principal = self
            .max_running_per_principal
            .or(cells_limit)
            .unwrap_or(DEFAULT_MAX_RUNNING_PER_PRINCIPAL)
            .max(1);
        Ok(Codemode {
            inner: Arc::new(Inner {
                gate,
                sandbox,
                catalog,
                inline_budget_tokens: self.inline_budget_tokens,
                offer_codemode_tool: !self.codemode_tool_off,
                stores: SessionStores::default(),
                cells: self.cells,
                share,
                max_running_per_principal,
                next_id: AtomicU64::new(1),
                views: Default::default(),
            }),
        })
    }
}
