//! Everything a command needs to run scripts: settings, tools, MCP servers, models, the gate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use codemode_gate::settings::{self, EffectiveSettings, SettingsPaths};
use codemode_gate::{AuditKey, AuditLog, CommandHooks, Gate, ProtectedPath, Registry};
use codemode_mcp::{ConnectOptions, McpConfig, McpHub};
use codemode_models::{Catalog, ModelsHttpConfig};
use codemode_runtime::Codemode;
use codemode_sandbox::{Limits, SandboxConfig};
use codemode_spec::CodemodeMode;
use codemode_tools::{ToolsConfig, builtin_tools};

use crate::SetupArgs;
use crate::approver::TerminalApprover;

/// Limits set on the command line. They are the operator's: a script may lower them, not raise them.
#[derive(Args, Clone, Debug, Default)]
pub struct LimitFlags {
    /// Wall-clock deadline of a script, in ms (approval waits do not count).
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// Heap limit of a script, in MiB.
    #[arg(long, value_name = "MIB")]
    pub heap_mb: Option<usize>,
    /// CPU budget for code that never yields, in ms.
    #[arg(long, value_name = "MS")]
    pub cpu_ms: Option<u64>,
    /// Cut the model's text to about this many tokens (the whole text goes to a private file).
    #[arg(long, value_name = "N")]
    pub max_output_tokens: Option<u64>,
    /// Most calls one script may make.
    #[arg(long, value_name = "N")]
    pub max_calls: Option<u64>,
}

pub struct Setup {
    pub codemode: Codemode,
    pub warnings: Vec<String>,
    eff: EffectiveSettings,
    /// Policy files from the command line, which replace the settings' policies.
    policy_files: Vec<PathBuf>,
    hub: Option<Arc<McpHub>>,
    refresher: Option<tokio::task::JoinHandle<()>>,
}

/// Called after the registry took in a changed MCP tool list.
pub type OnToolsChanged = Arc<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

impl Setup {
    /// Set-up for a command at a terminal: `ask` decisions go to the person there, if any.
    pub async fn build(args: &SetupArgs, flags: &LimitFlags) -> Result<Setup> {
        let approver = TerminalApprover::if_interactive()
            .map(|a| Arc::new(a) as Arc<dyn codemode_gate::Approver>);
        Self::build_with(args, flags, approver).await
    }

    /// Set-up with a given approver (`None`: every `ask` is denied, naming the policy).
    pub async fn build_with(
        args: &SetupArgs,
        flags: &LimitFlags,
        approver: Option<Arc<dyn codemode_gate::Approver>>,
    ) -> Result<Setup> {
        let workdir = match &args.workdir {
            Some(d) => d.clone(),
            None => std::env::current_dir().context("could not read the current directory")?,
        };
        let workdir = workdir.canonicalize().with_context(|| {
            format!("the working directory {} does not exist", workdir.display())
        })?;
        let paths = match &args.config_dir {
            Some(d) => SettingsPaths::new(d.clone()),
            None => SettingsPaths::from_env()
                .context("no home directory to find settings in: pass --config-dir")?,
        };
        let eff =
            settings::load(&paths, Some(&workdir)).context("the settings could not be read")?;
        let trusted = eff.trusted;
        let mut warnings = eff.warnings.clone();

        let registry = Registry::new();
        if !args.no_builtins {
            let tools = builtin_tools(&ToolsConfig::new(&workdir));
            for tool in tools {
                registry.register(tool)?;
            }
        }

        let hub = connect_mcp(args, &paths, &workdir, trusted, &registry, &mut warnings).await?;
        warnings.extend(eff.apply_tools(&registry));

        let mode = match args.mode.as_deref() {
            Some("on") => CodemodeMode::On,
            Some("only") => CodemodeMode::Only,
            Some(other) => bail!("unknown mode `{other}`: use `on` or `only`"),
            None => eff.settings.mode.unwrap_or_default(),
        };
        let policy = if args.policies.is_empty() {
            eff.load_policies()?
        } else {
            codemode_gate::PolicySet::load_files(&args.policies)?
        };
        let mut builder = Gate::builder()
            .registry(registry)
            .policy(policy)
            .budgets(eff.settings.budgets.clone())
            .models(eff.settings.models.clone())
            .mode(mode)
            .command_hooks(
                CommandHooks::new(&eff.settings.hooks)
                    .context("the hooks in the settings are not valid")?
                    .with_cwd(workdir.clone()),
            );
        if let Some(approver) = approver {
            builder = builder.approver(approver);
        }
        // The gate keeps its own configuration out of every tool's reach.
        builder = builder
            .workspace(&workdir)
            .protect(ProtectedPath::new(
                workdir.join(".codemode"),
                "the project's codemode configuration",
            ))
            .protect(ProtectedPath::new(
                &paths.user_dir,
                "your codemode configuration",
            ));
        if let Some(path) = args.audit.as_ref().or(eff.settings.audit.path.as_ref()) {
            let key_path = AuditKey::default_path()
                .context("no state directory for the audit key: set XDG_STATE_HOME or HOME")?;
            let key = AuditKey::load_or_create(&key_path)?;
            builder = builder.protect(ProtectedPath::new(&key_path, "the audit log's key"));
            let log = AuditLog::open_with_key(path, key)
                .with_context(|| format!("the audit log {} could not be opened", path.display()))?;
            builder = builder.audit(log);
        }
        let gate = builder.build()?;

        let mut codemode = Codemode::builder()
            .gate(gate)
            .sandbox_config(sandbox_config(&eff, flags, &mut warnings));
        if let Some(catalog) = load_models(args, &paths, &workdir, &eff, &mut warnings)? {
            codemode = codemode.models(Arc::new(catalog), ModelsHttpConfig::default());
        }
        let codemode = codemode.build()?;
        let hub = hub.map(Arc::new);
        Ok(Setup {
            codemode,
            warnings,
            eff,
            policy_files: args.policies.clone(),
            hub,
            refresher: None,
        })
    }

    /// Keeps the registry in step with the MCP servers' tool lists (`notifications/tools/
    /// list_changed`), re-applying the settings' tool rules, then calls `then`.
    pub fn follow_tool_changes(&mut self, then: Option<OnToolsChanged>) {
        let Some(hub) = self.hub.clone() else { return };
        let codemode = self.codemode.clone();
        let eff = self.eff.clone();
        let policy_files = self.policy_files.clone();
        let mut changes = hub.on_tools_changed();
        // What the hub has now is registered already; wait for the next change.
        changes.borrow_and_update();
        self.refresher = Some(tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                let registry = codemode.gate().registry();
                for warning in sync_mcp_tools(registry, &hub) {
                    tracing::warn!("{warning}");
                }
                for warning in eff.apply_tools(registry) {
                    tracing::warn!("{warning}");
                }
                // The policy schema types `context.args` from the registered tools: derive it
                // again so policies can speak of the new tools' arguments.
                let policies = if policy_files.is_empty() {
                    eff.load_policies()
                } else {
                    codemode_gate::PolicySet::load_files(&policy_files)
                };
                match policies.and_then(|set| codemode.gate().set_policy(set)) {
                    Ok(()) => {}
                    Err(e) => tracing::warn!(
                        "the policies were kept as they were: checking them against the new tools failed: {e}"
                    ),
                }
                if let Some(then) = &then {
                    then().await;
                }
            }
        }));
    }

    pub async fn shutdown(self) {
        if let Some(task) = self.refresher {
            task.abort();
            let _ = task.await;
        }
        if let Some(hub) = self.hub.and_then(|h| Arc::try_unwrap(h).ok()) {
            hub.shutdown().await;
        }
    }
}

/// Makes the registry's MCP tools match the hub's: new tools registered, vanished ones removed,
/// changed ones replaced. A changed tool is briefly absent while it is replaced.
fn sync_mcp_tools(registry: &Registry, hub: &McpHub) -> Vec<String> {
    let mut warnings = Vec::new();
    let fresh = hub.tools();
    let fresh_names: std::collections::HashSet<String> =
        fresh.iter().map(|t| t.spec().name.clone()).collect();
    let current = registry.specs();
    for spec in &current {
        let from_mcp = spec
            .namespace
            .as_deref()
            .is_some_and(|n| n.starts_with("mcp__"));
        if from_mcp && !fresh_names.contains(&spec.name) {
            registry.remove(&spec.name);
        }
    }
    for ns in hub.namespaces() {
        registry.add_namespace(ns);
    }
    for tool in fresh {
        let name = tool.spec().name.clone();
        if let Some(old) = current.iter().find(|s| s.name == name) {
            let same = old.input_schema == tool.spec().input_schema
                && old.description == tool.spec().description;
            if same {
                continue;
            }
            registry.remove(&name);
        }
        if let Err(e) = registry.register(tool) {
            warnings.push(format!("an MCP tool was left out: {e}"));
        }
    }
    warnings
}

async fn connect_mcp(
    args: &SetupArgs,
    paths: &SettingsPaths,
    workdir: &Path,
    trusted: bool,
    registry: &Registry,
    warnings: &mut Vec<String>,
) -> Result<Option<McpHub>> {
    let user_file = args
        .mcp_config
        .clone()
        .unwrap_or_else(|| paths.user_dir.join("mcp.json"));
    let project_file = workdir.join(".codemode").join("mcp.json");
    if !user_file.exists() && !project_file.exists() {
        if let Some(f) = &args.mcp_config {
            bail!("the MCP config {} does not exist", f.display());
        }
        return Ok(None);
    }
    let (config, config_warnings) =
        McpConfig::load(Some(&user_file), Some(&project_file), trusted)?;
    warnings.extend(config_warnings);
    if config.servers().is_empty() {
        return Ok(None);
    }
    let hub = McpHub::connect(&config, ConnectOptions::default()).await;
    for status in hub.status() {
        if let codemode_mcp::ServerState::Failed(problem) = &status.state {
            warnings.push(format!(
                "MCP server `{}` is not connected: {problem}",
                status.name
            ));
        }
    }
    for ns in hub.namespaces() {
        registry.add_namespace(ns);
    }
    for tool in hub.tools() {
        if let Err(e) = registry.register(tool) {
            warnings.push(format!("an MCP tool was left out: {e}"));
        }
    }
    Ok(Some(hub))
}

fn load_models(
    args: &SetupArgs,
    paths: &SettingsPaths,
    workdir: &Path,
    eff: &EffectiveSettings,
    warnings: &mut Vec<String>,
) -> Result<Option<Catalog>> {
    let user_file: PathBuf = args
        .models_config
        .clone()
        .unwrap_or_else(|| paths.user_dir.join("models.json"));
    let project_file = workdir.join(".codemode").join("models.json");
    if !user_file.exists() && !project_file.exists() {
        if let Some(f) = &args.models_config {
            bail!("the models config {} does not exist", f.display());
        }
        return Ok(None);
    }
    let (mut catalog, catalog_warnings) =
        Catalog::load(Some(&user_file), Some(&project_file), eff.trusted)?;
    warnings.extend(catalog_warnings);
    let models = &eff.settings.models;
    catalog.restrict(models.enabled.unwrap_or(true), models.allow.as_deref());
    if models.enabled == Some(false) {
        return Ok(None);
    }
    Ok(Some(catalog))
}

/// Settings limits are the operator's maximum and default; command-line flags set the default
/// and may not pass the maximum.
fn sandbox_config(
    eff: &EffectiveSettings,
    flags: &LimitFlags,
    warnings: &mut Vec<String>,
) -> SandboxConfig {
    let mut config = SandboxConfig::default();
    let s = &eff.settings.limits;
    let apply = |l: &mut Limits| {
        if let Some(v) = s.heap_bytes {
            l.heap_bytes = v as usize;
        }
        if let Some(v) = s.stack_bytes {
            l.stack_bytes = v as usize;
        }
        if let Some(v) = s.timeout_ms {
            l.timeout_ms = v;
        }
        if let Some(v) = s.cpu_ms {
            l.cpu_ms = v;
        }
        if let Some(v) = s.max_output_tokens {
            l.max_output_tokens = v;
        }
        if let Some(v) = s.max_calls {
            l.max_calls = v;
        }
        if let Some(v) = s.max_calls_in_flight {
            l.max_calls_in_flight = v as usize;
        }
    };
    apply(&mut config.maximum);
    apply(&mut config.defaults);
    let mut wanted = config.defaults.clone();
    if let Some(v) = flags.timeout_ms {
        wanted.timeout_ms = v;
    }
    if let Some(v) = flags.heap_mb {
        wanted.heap_bytes = v.saturating_mul(1024 * 1024);
    }
    if let Some(v) = flags.cpu_ms {
        wanted.cpu_ms = v;
    }
    if let Some(v) = flags.max_output_tokens {
        wanted.max_output_tokens = v;
    }
    if let Some(v) = flags.max_calls {
        wanted.max_calls = v;
    }
    let clamped = wanted.clamped_to(&config.maximum);
    if clamped != wanted {
        warnings.push(
            "a limit on the command line is above the maximum in the settings; the maximum applies"
                .into(),
        );
    }
    config.defaults = clamped;
    config
}
