//! From command-line flags to an [`Installation`]: the flags become the configuration's
//! command-line layer; everything else is `codemode-setup`'s.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use codemode_config::{CommandLine, ConfigPaths, Limits};
use codemode_setup::Installation;
use codemode_spec::CodemodeMode;

use crate::SetupArgs;
use crate::approver::TerminalApprover;

/// Limits set on the command line. They may lower the limits of the settings (and the built-in
/// defaults), never raise them; a script may lower them again, not raise them.
#[derive(Args, Clone, Debug, Default)]
pub struct LimitFlags {
    /// Wall-clock deadline of a script, in ms (approval waits do not count).
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// Heap limit of a script, in MiB.
    #[arg(long, value_name = "MIB")]
    pub heap_mb: Option<u64>,
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

impl LimitFlags {
    fn limits(&self) -> Limits {
        Limits {
            timeout_ms: self.timeout_ms,
            heap_bytes: self.heap_mb.map(|mb| mb.saturating_mul(1024 * 1024)),
            cpu_ms: self.cpu_ms,
            max_output_tokens: self.max_output_tokens,
            max_calls: self.max_calls,
            ..Limits::default()
        }
    }
}

fn mode(flag: Option<&str>) -> Result<Option<CodemodeMode>> {
    Ok(match flag {
        None => None,
        Some("on") => Some(CodemodeMode::On),
        Some("only") => Some(CodemodeMode::Only),
        Some(other) => bail!("unknown mode `{other}`: use `on` or `only`"),
    })
}

/// The flags' layer of the configuration.
pub fn command_line(args: &SetupArgs, flags: &LimitFlags) -> Result<CommandLine> {
    Ok(CommandLine {
        policy_files: args.policies.clone(),
        audit_path: args.audit.clone(),
        mode: mode(args.mode.as_deref())?,
        limits: flags.limits(),
        state_url: args.state_url.clone(),
    })
}

/// The user's directories: the flags, else the environment.
pub fn config_paths(
    config_dir: Option<&PathBuf>,
    state_dir: Option<&PathBuf>,
) -> Result<ConfigPaths> {
    let config_dir = match config_dir {
        Some(d) => d.clone(),
        None => ConfigPaths::config_dir_from_env()
            .context("no home directory to find settings in: pass --config-dir")?,
    };
    let state_dir = match state_dir {
        Some(d) => d.clone(),
        None => ConfigPaths::state_dir_from_env()
            .context("no home directory for codemode's state: pass --state-dir")?,
    };
    Ok(ConfigPaths::new(config_dir, state_dir))
}

/// An installation for a command at a terminal: `ask` decisions go to the person there, if any.
pub async fn build(args: &SetupArgs, flags: &LimitFlags) -> Result<Installation> {
    let approver =
        TerminalApprover::if_interactive().map(|a| Arc::new(a) as Arc<dyn codemode_gate::Approver>);
    build_with(args, flags, approver, false).await
}

/// An installation with a given approver (`None`: every `ask` is denied, naming the policy).
pub async fn build_with(
    args: &SetupArgs,
    flags: &LimitFlags,
    approver: Option<Arc<dyn codemode_gate::Approver>>,
    cells: bool,
) -> Result<Installation> {
    build_observed(args, flags, approver, cells, None).await
}

/// As [`build_with`], with an observer of every call (metrics).
pub async fn build_observed(
    args: &SetupArgs,
    flags: &LimitFlags,
    approver: Option<Arc<dyn codemode_gate::Approver>>,
    cells: bool,
    observer: Option<Arc<dyn codemode_gate::CallObserver>>,
) -> Result<Installation> {
    let workdir = match &args.workdir {
        Some(d) => d.clone(),
        None => std::env::current_dir().context("could not read the current directory")?,
    };
    let mut builder = Installation::builder(workdir)
        .config_paths(config_paths(
            args.config_dir.as_ref(),
            args.state_dir.as_ref(),
        )?)
        .builtins(!args.no_builtins)
        .cells(cells)
        .command_line(command_line(args, flags)?)
        .principal(args.principal.as_ref().map(|id| codemode_gate::Principal {
            id: id.clone(),
            team: args.team.clone(),
        }));
    if let Some(o) = observer {
        builder = builder.call_observer(o);
    }
    if let Some(f) = &args.mcp_config {
        builder = builder.mcp_config(f);
    }
    if let Some(f) = &args.models_config {
        builder = builder.models_config(f);
    }
    if let Some(a) = approver {
        builder = builder.approver(a);
    }
    Ok(builder.build().await?)
}
