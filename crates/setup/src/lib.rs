//! One set-up for everything that runs scripts: the CLI's `run`, `serve`, `tools` and `policy`,
//! and any program embedding codemode.
//!
//! An [`Installation`] reads the effective configuration (`codemode-config`: your files, the
//! project's, the trust list, the command line) and turns it into a ready [`Codemode`] whose
//! [`Gate`] holds the built-in tools, the model catalog and the MCP servers' tools, with the
//! settings' tool rules, policies, hooks, budgets, limits and audit log. MCP servers connect in
//! the background: the installation is usable at once, [`Installation::servers_ready`] waits
//! for them, and [`Installation::tools_changed`] says when their tools arrived or changed (the
//! registry, tool rules and policy schema are already updated then).
//!
//! ```no_run
//! use codemode_runtime::ScriptRequest;
//! use codemode_setup::Installation;
//!
//! # async fn demo() -> Result<(), codemode_setup::SetupError> {
//! let installation = Installation::builder("/path/to/project").build().await?;
//! installation.servers_ready().await?;
//! let run = installation
//!     .codemode()
//!     .run_script(ScriptRequest::new("return 1 + 1", "session-1"))
//!     .await;
//! println!("{}", run.text);
//! installation.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod convert;
mod mcp;
mod protected;
mod shared_state;
mod wiring;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use codemode_config::{
    Activation, CommandLine, ConfigError, ConfigPaths, Configuration, ProjectPaths, Sources,
};
use codemode_gate::hooks::HookConfigError;
use codemode_gate::{
    Approver, AuditKey, AuditLog, CommandHooks, Gate, Hook, PolicyError, ProtectedPath, Registry,
    RegistryError,
};
use codemode_mcp::{ConnectOptions, ServerStatus};
use codemode_models::{Catalog, ModelsHttpConfig};
use codemode_runtime::{Codemode, RuntimeError};
use codemode_spec::{CodemodeMode, Tool, ToolSpec};
use codemode_tools::{ToolsConfig, builtin_tools};
use tokio::sync::watch;

pub use codemode_config;
pub use convert::builtin_limits;

use mcp::McpServers;
use wiring::Wiring;

/// Why an installation could not be set up. Each names what to fix. (The messages carry their
/// causes' text, so none is also a `source`: printing the chain would say everything twice.)
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "no home directory to find the configuration in: set HOME, or pass the configuration directory explicitly (--config-dir)"
    )]
    NoHome,
    #[error("the working directory {path} cannot be used: {message}")]
    Workdir { path: PathBuf, message: String },
    #[error("a policy is not valid: {0}")]
    Policy(PolicyError),
    #[error("the hooks in the settings are not valid: {0}")]
    Hooks(HookConfigError),
    #[error("the audit log {path} cannot be opened: {message}")]
    Audit { path: PathBuf, message: String },
    #[error("a tool could not be registered: {0}")]
    Registry(RegistryError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("the state store cannot be used: {0}")]
    State(#[from] codemode_state::StateError),
    #[error(
        "the SQLite state database {db} is in {dir}, which holds the project {workdir}. Every file in a state database's directory is kept from tool calls and from the programs codemode starts (one that could create a file there could plant a `-journal`, which SQLite plays back into the database), so nothing in the project could be written. Keep the database in a directory of its own (`state.url`), or leave `state.url` out to use the one in your state directory"
    )]
    StateDatabaseDir {
        db: PathBuf,
        dir: PathBuf,
        workdir: PathBuf,
    },
}

impl From<PolicyError> for SetupError {
    fn from(e: PolicyError) -> Self {
        SetupError::Policy(e)
    }
}

impl From<HookConfigError> for SetupError {
    fn from(e: HookConfigError) -> Self {
        SetupError::Hooks(e)
    }
}

impl From<RegistryError> for SetupError {
    fn from(e: RegistryError) -> Self {
        SetupError::Registry(e)
    }
}

/// A tool as listings show it: its effective spec and, when hidden, why.
#[derive(Debug, Clone)]
pub struct ListedTool {
    pub spec: ToolSpec,
    pub hidden_by: Option<String>,
}

/// Builds an [`Installation`]. Everything but the project directory has a default.
pub struct InstallationBuilder {
    workdir: PathBuf,
    paths: Option<ConfigPaths>,
    mcp_file: Option<PathBuf>,
    models_file: Option<PathBuf>,
    command_line: CommandLine,
    builtins: bool,
    tools: Vec<Arc<dyn Tool>>,
    hooks: Vec<Arc<dyn Hook>>,
    approver: Option<Arc<dyn Approver>>,
    connect: Option<ConnectOptions>,
    codemode_requested: bool,
    cells: bool,
    gate_extras: shared_state::GateExtras,
    state_store: Option<Arc<dyn codemode_state::StateStore>>,
}

impl InstallationBuilder {
    /// Runs scripts as cells that may yield and wait for approvals (`codemode serve` asks for
    /// this), unless the settings turn cells off (`cells.enabled: false`). Cells keep durable
    /// state in `state.url` (an SQLite file in your state directory by default), opened at
    /// build: a locked, read-only or damaged database is an error here.
    pub fn cells(mut self, on: bool) -> Self {
        self.cells = on;
        self
    }

    /// Who the sessions act for, for `budgets.principal` and `budgets.team` (HTTP sessions
    /// may say otherwise per session, with [`Gate::set_principal`]).
    pub fn principal(mut self, principal: Option<codemode_gate::Principal>) -> Self {
        self.gate_extras.principal = principal;
        self
    }

    /// Told about every call's outcome (metrics).
    pub fn call_observer(mut self, observer: Arc<dyn codemode_gate::CallObserver>) -> Self {
        self.gate_extras.observer = Some(observer);
        self
    }

    /// A state store opened by the embedder, used instead of `state.url`.
    pub fn state_store(mut self, store: Arc<dyn codemode_state::StateStore>) -> Self {
        self.state_store = Some(store);
        self
    }

    /// Your configuration and state directories (default: from `XDG_*` and `HOME`).
    pub fn config_paths(mut self, paths: ConfigPaths) -> Self {
        self.paths = Some(paths);
        self
    }

    /// An MCP file read instead of your `mcp.json`.
    pub fn mcp_config(mut self, file: impl Into<PathBuf>) -> Self {
        self.mcp_file = Some(file.into());
        self
    }

    /// A models file read instead of your `models.json`.
    pub fn models_config(mut self, file: impl Into<PathBuf>) -> Self {
        self.models_file = Some(file.into());
        self
    }

    /// The operator's choices: policy files replacing yours, the audit log, the mode, and
    /// limits that may only lower the files'.
    pub fn command_line(mut self, command_line: CommandLine) -> Self {
        self.command_line = command_line;
        self
    }

    /// Whether to register the built-in coding tools (default true).
    pub fn builtins(mut self, on: bool) -> Self {
        self.builtins = on;
        self
    }

    /// Registers a tool of the embedder's own; it passes the gate like any other. Registering
    /// one asks for the `codemode` tool.
    pub fn tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.push(tool);
        self
    }

    /// Adds a hook after the settings' command hooks.
    pub fn hook(mut self, hook: Arc<dyn Hook>) -> Self {
        self.hooks.push(hook);
        self
    }

    /// Who answers `ask` decisions (without one, each `ask` is a denial naming the policy).
    pub fn approver(mut self, approver: Arc<dyn Approver>) -> Self {
        self.approver = Some(approver);
        self
    }

    /// Timeouts for MCP servers (the connect timeout of `mcp.json` wins when set).
    pub fn connect_options(mut self, opts: ConnectOptions) -> Self {
        self.connect = Some(opts);
        self
    }

    /// Offers the `codemode` tool whatever the configuration says.
    pub fn request_codemode(mut self) -> Self {
        self.codemode_requested = true;
        self
    }

    /// Reads the configuration and builds the installation. MCP servers start connecting and
    /// are not waited for.
    pub async fn build(self) -> Result<Installation, SetupError> {
        let workdir = self
            .workdir
            .canonicalize()
            .map_err(|e| SetupError::Workdir {
                path: self.workdir.clone(),
                message: e.to_string(),
            })?;
        let paths = match self.paths {
            Some(p) => p,
            None => ConfigPaths::from_env().ok_or(SetupError::NoHome)?,
        };
        let sources = Sources {
            paths,
            project: Some(ProjectPaths::new(&workdir)),
            mcp_file: self.mcp_file,
            models_file: self.models_file,
        };
        let config = Configuration::load(&sources, &self.command_line, &builtin_limits())?;
        let mut warnings = config.warnings.clone();
        let settings = &config.settings;
        if config.trusted {
            // A trusted project's settings may widen yours, so its `.codemode/` must exist to be
            // kept read-only for the programs codemode starts: else `bash` could create one
            // that the next run would trust.
            let _ = std::fs::create_dir(workdir.join(".codemode"));
        }

        // Whoever reads the audit key can forge the log: no tool reads it, by any path.
        let audit_key_path = sources.paths.state_dir.join("audit.key");
        // They exist from the start, so that the programs codemode starts find them read-only
        // rather than absent: `bash` must not make a state directory with a key of its choosing,
        // or a configuration directory that a later run would read.
        for dir in [&sources.paths.state_dir, &sources.paths.config_dir] {
            use std::os::unix::fs::DirBuilderExt;
            let _ = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir);
        }
        let registry = Registry::new();
        if self.builtins {
            let tools = ToolsConfig {
                secret_files: vec![audit_key_path.clone()],
                ..ToolsConfig::new(&workdir)
            };
            for tool in builtin_tools(&tools) {
                registry.register(tool)?;
            }
        }
        let embedder_tools = !self.tools.is_empty();
        for tool in self.tools {
            registry.register(tool)?;
        }

        let policy = convert::policy_set(&settings.policies, &mut warnings)?;
        // The policies are checked against every tool once registered; until then nothing is
        // permitted.
        let mut gate = Gate::builder()
            .registry(registry)
            .policy(codemode_gate::PolicySet::empty())
            .budgets(convert::budgets(&settings.budgets))
            .models(convert::model_rules(&settings.models))
            .mode(settings.mode.unwrap_or_default())
            .max_depth(convert::max_depth(&settings.limits));
        if !settings.hooks.is_empty() {
            let hooks = CommandHooks::new(&convert::hooks(&settings.hooks))?
                .with_project_dir(workdir.clone());
            gate = gate.command_hooks(hooks);
        }
        for hook in self.hooks {
            gate = gate.hook(hook);
        }
        let durable = &settings.durable;
        let cells_on = durable.cells_enabled.unwrap_or(self.cells)
            || durable.when_nobody_can_answer == codemode_config::WhenNobodyCanAnswer::Pause;
        // The gate keeps its own configuration out of every tool's reach, whatever the policy:
        // the configuration directories and every file a setting points at.
        match broad_workspace(&workdir) {
            None => gate = gate.workspace(&workdir),
            Some(why) => warnings.push(format!(
                "the workspace {} {why}, so no path counts as inside it (the default policy \
                 then asks before every read); start codemode in the project, or pass \
                 --workdir DIR",
                workdir.display()
            )),
        }
        for path in protected::configuration_paths(&config, &sources, &workdir)? {
            gate = gate.protect(path);
        }
        gate = gate.protect(ProtectedPath::secret(
            &audit_key_path,
            "the audit log's key",
        ));
        let state = match self.state_store {
            Some(store) => Some(store),
            None => shared_state::open_store(settings).await?,
        };
        let (wired, stream_audit) = shared_state::wire(
            gate,
            state.as_ref(),
            settings,
            &audit_key_path,
            self.gate_extras,
            &mut warnings,
        )?;
        gate = wired;
        let mut audit = stream_audit.clone().unwrap_or_else(AuditLog::disabled);
        if let Some(path) = settings
            .audit_path
            .as_ref()
            .filter(|_| stream_audit.is_none())
        {
            // The chain is keyed with a key of the user's, never the project's.
            let audit_error = |e: codemode_gate::AuditError| SetupError::Audit {
                path: path.clone(),
                message: e.to_string(),
            };
            let key = AuditKey::load_or_create(&audit_key_path).map_err(audit_error)?;
            let log = AuditLog::open_with_key(path, key).map_err(audit_error)?;
            gate = gate.audit(log.clone());
            audit = log;
        }
        let cells = match cells_on {
            true => Some(open_cells(durable, state.clone(), audit, &workdir).await?),
            false => None,
        };
        match (&cells, self.approver) {
            (Some(cells), approver) => gate = gate.approver(cells.approver(approver)),
            (None, Some(approver)) => gate = gate.approver(approver),
            (None, None) => {}
        }
        let gate = gate.build()?;
        match settings.confine_children {
            true => confine_children(&gate, &sources.paths, &mut warnings),
            false => warnings.push(
                "the programs codemode starts (`bash`, hooks, stdio MCP servers) run unconfined, \
                 as your setting `environment.confine: false` asks: they can read the audit key \
                 and change codemode's configuration"
                    .into(),
            ),
        }

        let catalog = models_catalog(&config);
        let activation = config.activation(
            self.codemode_requested || self.builtins || embedder_tools || catalog.is_some(),
        );
        warnings.extend(activation.warning.clone());
        let mut codemode = Codemode::builder()
            .gate(gate)
            .sandbox_config(convert::sandbox_config(&settings.limits))
            .offer_codemode_tool(activation.codemode)
            // The same cap with cells off: a token's scripts then hold workers on slow calls.
            .max_running_per_principal(durable.max_running_per_principal);
        if let Some(catalog) = catalog {
            codemode = codemode.models(Arc::new(catalog), ModelsHttpConfig::default());
        }
        if let Some(cells) = cells {
            codemode = codemode.cells(cells);
        }
        let codemode = codemode.build()?;

        let wiring = Arc::new(Wiring::new(
            codemode.clone(),
            settings.tools.clone(),
            policy,
            config.mcp.clone(),
        ));
        warnings.extend(wiring.apply_tool_rules());
        let has_servers = config.mcp.servers().iter().any(|s| s.enabled);
        if let Err(e) = codemode.gate().set_policy(wiring.policy.clone()) {
            if !has_servers {
                return Err(e.into());
            }
            // MCP tools may be what the policies speak of: decide once they arrived.
            wiring.policy_pending(e);
        }
        warnings.extend(wiring.unknown_policy_tools());
        wiring.warn(warnings, false);

        let (changed_tx, changed) = watch::channel(0u64);
        let servers = has_servers.then(|| {
            let mut opts = self.connect.unwrap_or_default();
            if let Some(timeout) = config.mcp.connect_timeout_setting() {
                opts.connect_timeout = timeout;
            }
            McpServers::start(&config.mcp, opts, wiring.clone(), changed_tx)
        });
        Ok(Installation {
            codemode,
            config,
            activation,
            workdir,
            wiring,
            servers,
            changed,
        })
    }
}

/// Keeps what the gate protects from the programs codemode starts (`bash`, hooks, stdio MCP
/// servers), which open files without asking the gate: secret paths hidden, the rest read-only.
/// One list for both (`protected::configuration_paths`): every trusted project's `.codemode/`
/// (its settings may widen yours in the next run there) and the programs key commands name.
fn confine_children(
    gate: &codemode_gate::Gate,
    config_paths: &codemode_config::ConfigPaths,
    warnings: &mut Vec<String>,
) {
    let (hidden, read_only): (Vec<_>, Vec<_>) =
        gate.protected_paths().iter().partition(|p| p.is_secret());
    let paths = |list: Vec<&ProtectedPath>| {
        list.into_iter()
            .map(|p| p.named().to_path_buf())
            .collect::<Vec<_>>()
    };
    // A trusted project's `.codemode/` that is gone (`git clean -fdx` removes it when empty)
    // cannot be kept read-only, and a command could make one that the next run there would
    // trust: it is made again, empty, as `codemode trust` made it.
    let trusted = codemode_config::trust::trusted_projects(config_paths)
        .into_iter()
        .filter(|project| project.is_dir())
        .map(|project| project.join(".codemode"))
        .inspect(|dir| {
            let _ = std::fs::create_dir(dir);
        });
    // The gate's list already has the key commands' programs and the trusted projects'
    // `.codemode/`; a missing one of the latter is made above so it can be kept.
    let read_only = paths(read_only).into_iter().chain(trusted);
    // Services of yours that run commands on request (tmux, screen, systemd) would run them
    // outside the confinement: their sockets are hidden like the key.
    let hidden = paths(hidden)
        .into_iter()
        .chain(codemode_childenv::service_sockets());
    let confined = codemode_childenv::confine_children(hidden, read_only);
    warnings.extend(codemode_childenv::confinement_gap());
    if let Err(why) = confined {
        warnings.push(format!(
            "the programs codemode starts (`bash`, hooks, stdio MCP servers) run unconfined, \
             so they can read the audit key and change codemode's configuration: {why}; allow \
             unprivileged user namespaces, or do not let scripts run `bash`"
        ));
    }
}

/// Sets cells up from the settings. `shared` is the store `state.url` (or the embedder) gave:
/// used when there is one, so that cells, approvals and budgets live in one place.
async fn open_cells(
    durable: &codemode_config::Durable,
    shared: Option<Arc<dyn codemode_state::StateStore>>,
    audit: AuditLog,
    workdir: &Path,
) -> Result<codemode_runtime::Cells, SetupError> {
    let store = match shared {
        Some(store) => store,
        None => open_default_store(&durable.state_url).await?,
    };
    let mut config = codemode_runtime::CellsConfig::new(store);
    config.yield_after = std::time::Duration::from_millis(durable.yield_after_ms);
    config.max_live_per_session = durable.max_cells_per_session;
    // Zero would refuse every script; one is the least that lets a token work.
    config.max_running_per_principal = durable.max_running_per_principal.max(1);
    config.pause_approvals =
        durable.when_nobody_can_answer == codemode_config::WhenNobodyCanAnswer::Pause;
    config.approval_expiry = durable.approval_expiry;
    config.audit = audit;
    config.scope = workdir.display().to_string();
    if let Some(ms) = std::env::var("CODEMODE_CELL_LEASE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms >= 100)
    {
        // How soon a restarted process may take over cells of one that died (default 15 s).
        config.lease = std::time::Duration::from_millis(ms);
    }
    Ok(codemode_runtime::Cells::new(config))
}

/// The cells' own store when no `state.url` is set: an SQLite file in the state directory.
async fn open_default_store(
    state_url: &str,
) -> Result<Arc<dyn codemode_state::StateStore>, SetupError> {
    if let codemode_state::StateUrl::Sqlite(path) = codemode_state::StateUrl::parse(state_url)?
        && let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
        && !dir.exists()
    {
        // The state directory may not exist yet on a fresh machine.
        let _ = std::fs::create_dir_all(dir);
    }
    Ok(codemode_state::open(state_url, codemode_state::OpenOptions::default()).await?)
}

/// The catalog from the models files, restricted by `models.enabled` and `models.allow`; `None`
/// when there is none or models are off.
fn models_catalog(config: &Configuration) -> Option<Catalog> {
    let models = config.models.as_ref()?;
    let rules = &config.settings.models;
    if rules.enabled == Some(false) {
        return None;
    }
    let mut catalog = Catalog::new(models);
    catalog.restrict(true, rules.allow.as_deref());
    Some(catalog)
}

/// A ready codemode: configuration, gate, runtime and MCP servers, kept in step.
pub struct Installation {
    codemode: Codemode,
    config: Configuration,
    activation: Activation,
    workdir: PathBuf,
    wiring: Arc<Wiring>,
    servers: Option<McpServers>,
    changed: watch::Receiver<u64>,
}

impl Installation {
    /// A builder for the project in `workdir` (the built-in tools work there, and its
    /// `.codemode/` files apply).
    pub fn builder(workdir: impl AsRef<Path>) -> InstallationBuilder {
        InstallationBuilder {
            workdir: workdir.as_ref().to_path_buf(),
            paths: None,
            mcp_file: None,
            models_file: None,
            command_line: CommandLine::default(),
            builtins: true,
            tools: Vec::new(),
            hooks: Vec::new(),
            approver: None,
            connect: None,
            codemode_requested: false,
            cells: false,
            gate_extras: Default::default(),
            state_store: None,
        }
    }

    /// The shared state store the gate keeps budgets (and perhaps the audit log) in.
    pub fn state_store(&self) -> Option<Arc<dyn codemode_state::StateStore>> {
        self.gate().state_store().cloned()
    }

    pub fn codemode(&self) -> &Codemode {
        &self.codemode
    }

    pub fn gate(&self) -> &Gate {
        self.codemode.gate()
    }

    pub fn configuration(&self) -> &Configuration {
        &self.config
    }

    /// The project directory, resolved.
    pub fn workdir(&self) -> &Path {
        &self.workdir
    }

    pub fn mode(&self) -> CodemodeMode {
        self.codemode.mode()
    }

    /// Whether the `codemode` tool is offered to the model, and the warning when MCP tools
    /// can only be reached through it but it is off.
    pub fn activation(&self) -> &Activation {
        &self.activation
    }

    /// Every warning so far: ignored project settings, skipped servers, servers that failed
    /// to connect. Each names its file and key.
    pub fn warnings(&self) -> Vec<String> {
        self.wiring.warnings()
    }

    /// Waits until every enabled MCP server connected or failed once, and their tools are
    /// registered. Fails when the policies still do not fit the tools (then every call is
    /// denied): a policy that refers to what does not exist stops start-up.
    pub async fn servers_ready(&self) -> Result<(), SetupError> {
        if let Some(servers) = &self.servers {
            servers.ready().await;
        }
        match self.wiring.policy_error() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Resolves once every enabled MCP server connected or failed once and the registry took
    /// in their tools; borrows nothing, for a task of its own.
    pub fn when_servers_ready(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let ready = self.servers.as_ref().map(|s| s.when_ready());
        async move {
            if let Some(ready) = ready {
                ready.await;
            }
        }
    }

    /// Goes up after each change to the MCP tools was taken into the registry (tool rules and
    /// policy schema included). Tell the model: the codemode description may have changed.
    pub fn tools_changed(&self) -> watch::Receiver<u64> {
        self.changed.clone()
    }

    /// The MCP hub, when servers are configured: for front ends that proxy its resources and
    /// prompts, show its servers' states, or stop its processes.
    pub fn hub(&self) -> Option<Arc<codemode_mcp::McpHub>> {
        self.servers.as_ref().map(McpServers::hub)
    }

    /// Each configured MCP server's state.
    pub fn mcp_status(&self) -> Vec<ServerStatus> {
        self.servers
            .as_ref()
            .map(McpServers::status)
            .unwrap_or_default()
    }

    /// Every registered tool, hidden ones included with the reason.
    pub fn tools(&self) -> Vec<ListedTool> {
        self.gate()
            .registry()
            .specs()
            .into_iter()
            .map(|spec| ListedTool {
                hidden_by: self.wiring.hidden_reason(&spec.name),
                spec,
            })
            .collect()
    }

    /// Closes the MCP connections and stops their server processes.
    pub async fn shutdown(self) {
        if let Some(servers) = self.servers {
            servers.shutdown().await;
        }
    }
}

/// The README's examples, compiled with the tests so that they keep working.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExamples;

/// Why `workdir` is too broad to be a workspace, if it is: a workspace that holds the user's
/// home would put `~/.ssh` and `~/.aws` "inside" it for the policies. Some MCP clients start
/// servers in `/`, and a terminal opens in `~`.
fn broad_workspace(workdir: &Path) -> Option<&'static str> {
    if workdir.parent().is_none() {
        return Some("is the file system's root");
    }
    if workdir.to_str().is_none() {
        return Some("is not valid UTF-8, which path rules cannot check");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .and_then(|h| h.canonicalize().ok())?;
    if home.starts_with(workdir) {
        return Some("holds your home directory");
    }
    None
}
