//! The `codemode` command line.

mod approver;
mod commands;
mod demo;
mod setup;
mod stop;
mod terminal;
mod trim;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "codemode",
    version,
    about = "Run model-written JavaScript whose only powers are tool calls that pass one gate",
    long_about = "Run model-written JavaScript whose only powers are tool calls that pass one gate.\n\n\
Scripts call the built-in coding tools (read, write, edit, ls, find, grep, bash), the tools of \
the MCP servers given with --mcp-config, and models from the catalog given with --models-config. \
Every call is resolved, validated, decided by the Cedar policy, shown to hooks, approved when the \
policy asks, charged to budgets and audited."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a script and print the text the model would read.
    Run(commands::run::RunArgs),
    /// Run a demo script against the built-in tools in a scratch project.
    Demo(commands::run::DemoArgs),
    /// List the tools a script can call, or print the codemode tool's description.
    Tools(commands::tools::ToolsArgs),
    /// Check, explain or print policies.
    #[command(subcommand)]
    Policy(commands::policy::PolicyCommand),
    /// Verify an audit log.
    #[command(subcommand)]
    Audit(commands::audit::AuditCommand),
    /// Trust a project, so that its settings may widen what your user settings allow.
    Trust(commands::trust::TrustArgs),
    /// Serve codemode over MCP (stdio by default, streamable HTTP with --listen).
    Serve(commands::serve::ServeArgs),
    /// List, show, approve or deny calls that paused for a person's approval.
    #[command(subcommand)]
    Approvals(commands::approvals::ApprovalsCommand),
    /// Show which isolation layers (seccomp, Landlock, rlimits, ...) hold scripts on this machine.
    Doctor,
}

/// Options every command that runs tools shares.
#[derive(Args, Clone, Debug, Default)]
pub struct SetupArgs {
    /// Working directory for the built-in tools and the project whose settings apply.
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// The user's configuration directory, holding settings.json, mcp.json, models.json and the
    /// list of trusted projects (default: $XDG_CONFIG_HOME/codemode or ~/.config/codemode).
    #[arg(long, value_name = "DIR")]
    pub config_dir: Option<PathBuf>,
    /// The user's state directory, where relative audit log paths of your settings go
    /// (default: $XDG_STATE_HOME/codemode or ~/.local/state/codemode).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// MCP servers, in the `mcpServers` JSON format other clients use (default: mcp.json in the
    /// configuration directory, if present).
    #[arg(long, value_name = "FILE")]
    pub mcp_config: Option<PathBuf>,
    /// Model catalog for `models.*` in scripts (default: models.json in the configuration
    /// directory, if present).
    #[arg(long, value_name = "FILE")]
    pub models_config: Option<PathBuf>,
    /// Cedar policy files; they replace your settings' policy files (default: the built-in
    /// policy), never a project's forbids.
    #[arg(long = "policy", value_name = "FILE")]
    pub policies: Vec<PathBuf>,
    /// Append every decision and outcome to this hash-chained audit log.
    #[arg(long, value_name = "FILE")]
    pub audit: Option<PathBuf>,
    /// Codemode mode: `on` keeps direct tools declared, `only` refuses them outside scripts.
    #[arg(long, value_name = "on|only")]
    pub mode: Option<String>,
    /// Leave out the built-in coding tools.
    #[arg(long)]
    pub no_builtins: bool,
    /// Where durable state lives: `sqlite:///path/state.db`, `postgres://user@host/db` or
    /// `memory:`. Replaces `state.url` of your settings. Set (here or there), budgets and, with
    /// `state.audit_stream`, the audit log are kept in it and shared by every replica that uses
    /// it; unset, cells keep state in state.db in your state directory.
    #[arg(long = "state", value_name = "URL", env = "CODEMODE_STATE_URL")]
    pub state_url: Option<String>,
    /// Who the calls are for, for `budgets.principal` and the audit lines (under
    /// `serve --listen --tokens-file`, a session begun with a named token acts for that token's
    /// name and team instead; --principal is for the sessions of the unnamed --token).
    #[arg(long, value_name = "NAME")]
    pub principal: Option<String>,
    /// The principal's team, for `budgets.team`.
    #[arg(long, value_name = "NAME", requires = "principal")]
    pub team: Option<String>,
}

/// Where `serve` connects call spans to an OTLP exporter.
pub(crate) static TRACES: std::sync::OnceLock<codemode_telemetry::TraceSwitch> =
    std::sync::OnceLock::new();

/// Keeps programs of the same user out of this process: no `/proc/<pid>/environ` or `mem`
/// reads, no ptrace, no core dump. `bash` and command hooks run as the user, and this process
/// holds provider keys and the serve token in its environment and memory. What it starts is
/// dumpable again after `exec` (the sandbox workers, hooks, servers), which is what lets them
/// be started at all.
fn refuse_same_user_inspection() {
    #[cfg(target_os = "linux")]
    if let Err(e) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        eprintln!(
            "codemode: warning: could not make this process non-dumpable ({e}); programs it starts may read its environment from /proc"
        );
    }
}

/// The log filter when `CODEMODE_LOG` is unset: warnings, but only errors from rmcp's message
/// loop, which logs every message it did not expect (a notification before the handshake, an
/// error answer) whole at `warn`: a server could write gigabytes to the host's stderr. What
/// codemode itself says about a server (its log messages, cut and rate-limited) stays.
const DEFAULT_LOG: &str = "warn,rmcp::service=error";

#[tokio::main]
async fn main() -> ExitCode {
    refuse_same_user_inspection();
    // Log lines to stderr as CODEMODE_LOG says; call spans go to OTLP once `serve` reads the
    // telemetry settings. Colour codes only for a person at a terminal, never in a log file.
    let traces = codemode_telemetry::install(
        tracing_subscriber::EnvFilter::try_from_env("CODEMODE_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG)),
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
    );
    let _ = TRACES.set(traces);
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => commands::run::run(args).await,
        Command::Demo(args) => commands::run::demo(args).await,
        Command::Tools(args) => commands::tools::run(args).await,
        Command::Policy(cmd) => commands::policy::run(cmd).await,
        Command::Audit(cmd) => commands::audit::run(cmd).await,
        Command::Trust(args) => commands::trust::run(args),
        Command::Serve(args) => commands::serve::run(args).await,
        Command::Approvals(cmd) => commands::approvals::run(cmd).await,
        Command::Doctor => commands::doctor::run(),
    };
    // What a command left running in the background keeps its confined view of the files only
    // while codemode runs (see `codemode_childenv::stop_confined_survivors`).
    let stopped = codemode_childenv::stop_confined_survivors();
    if stopped > 0 {
        tracing::info!("stopped {stopped} process(es) that programs codemode started left running");
    }
    match result {
        Ok(code) => code,
        Err(e) => {
            // An error can quote a server's message or a file's text.
            eprintln!("codemode: {}", terminal::for_stderr(&format!("{e:#}")));
            ExitCode::from(2)
        }
    }
}
