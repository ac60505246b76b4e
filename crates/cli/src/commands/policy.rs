//! `codemode policy check | explain | default | schema`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Subcommand;
use codemode_gate::{ExplainInput, PolicySchema, PolicySet, Registry};
use codemode_tools::{ToolsConfig, builtin_tools};

use crate::SetupArgs;
use crate::setup::{self, LimitFlags};
use crate::terminal::{for_stderr, for_stdout};

#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// Parse a policy file and type-check it against the generated schema (built from the
    /// built-in tools, the MCP servers and the models of the current set-up).
    Check {
        file: PathBuf,
        #[command(flatten)]
        setup: SetupArgs,
    },
    /// Say which policies decide a call described in JSON: {"tool": "bash", "args": {...}, ...}.
    Explain {
        /// The call, as JSON (fields: tool, args, kind, exposure, namespace, annotations, model,
        /// paths, origin, depth, session_id, parent_call_id, script_hash, script, session).
        call: PathBuf,
        /// Policy files to use (default: the built-in policy).
        #[arg(long = "policy", value_name = "FILE")]
        policies: Vec<PathBuf>,
    },
    /// Print the built-in default policy, to copy and adapt.
    Default,
    /// Print the Cedar schema policies are checked against (built from the tools of the current
    /// set-up: the built-in tools, the MCP servers and the models).
    Schema {
        #[command(flatten)]
        setup: SetupArgs,
    },
}

pub async fn run(cmd: PolicyCommand) -> Result<ExitCode> {
    match cmd {
        PolicyCommand::Check { file, setup } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("could not read the policy file {}", file.display()))?;
            let name = file.display().to_string();
            let registry = registry_for(&setup).await;
            match codemode_gate::policy::check(&name, &text, &registry) {
                Ok(()) => {
                    for warning in unknown_tools(&name, &text, &registry) {
                        eprintln!("warning: {}", for_stderr(&warning));
                    }
                    println!("{}", for_stdout(&format!("{}: valid", file.display())));
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    // The policy's own text (a project's file) is quoted in the error.
                    eprintln!("{}", for_stderr(&e.to_string()));
                    Ok(ExitCode::from(1))
                }
            }
        }
        PolicyCommand::Explain { call, policies } => {
            let text = std::fs::read_to_string(&call)
                .with_context(|| format!("could not read {}", call.display()))?;
            let input: ExplainInput = serde_json::from_str(&text).with_context(|| {
                format!(
                    "{} is not a call description; expected JSON like {{\"tool\": \"bash\", \"args\": {{\"command\": \"ls\"}}}}",
                    call.display()
                )
            })?;
            let mut set = if policies.is_empty() {
                PolicySet::defaults()
            } else {
                PolicySet::empty()
            };
            for file in &policies {
                let text = std::fs::read_to_string(file).with_context(|| {
                    format!("could not read the policy file {}", file.display())
                })?;
                set.add_source(&file.display().to_string(), &text, false)?;
            }
            let schema = PolicySchema::for_registry(&builtin_registry()).ok();
            let explanation = codemode_gate::explain(&set, schema.as_ref(), &input);
            let shown = serde_json::to_string_pretty(&explanation)?;
            println!("{}", for_stdout(&shown));
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Default => {
            print!("{}", codemode_gate::policy::DEFAULT_POLICIES);
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Schema { setup } => {
            let schema = PolicySchema::for_registry(&registry_for(&setup).await)?;
            // Tool and argument names come from MCP servers.
            print!("{}", for_stdout(schema.text()));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The tools of the current set-up, so that policies may speak of any of their arguments; the
/// built-in tools alone when the set-up cannot be built (its own policies may be what is broken).
async fn registry_for(args: &SetupArgs) -> Registry {
    match setup::build_with(args, &LimitFlags::default(), None, false).await {
        Ok(installation) => {
            // Its own policies may not fit yet; the tools are what matters here.
            let _ = installation.servers_ready().await;
            let registry = Registry::new();
            for spec in installation.gate().registry().specs() {
                let _ = registry.register(std::sync::Arc::new(SpecOnly(spec)));
            }
            installation.shutdown().await;
            registry
        }
        Err(e) => {
            let why = format!("{e:#}");
            eprintln!(
                "warning: checking against the built-in tools only: {}",
                for_stderr(&why)
            );
            builtin_registry()
        }
    }
}

/// The `Tool::"…"` names of the file that no tool of the set-up has: Cedar accepts them, and
/// a policy naming one never applies.
fn unknown_tools(name: &str, text: &str, registry: &Registry) -> Vec<String> {
    let mut set = PolicySet::empty();
    if set.add_source(name, text, false).is_err() {
        return Vec::new();
    }
    set.tool_literals()
        .into_iter()
        .filter_map(|lit| {
            let close = registry.closest_if_unknown(&lit.name)?;
            let hint = close
                .first()
                .map(|c| format!(" (did you mean {}?)", lit.written_like(c)))
                .unwrap_or_default();
            Some(format!(
                "{} names {}, which no tool of the current set-up has, so the policy never \
                 applies{hint}; `codemode tools` lists the names",
                lit.at, lit.written
            ))
        })
        .collect()
}

/// A tool known only by its spec: enough to type-check policies, never called.
struct SpecOnly(codemode_spec::ToolSpec);

impl codemode_spec::Tool for SpecOnly {
    fn spec(&self) -> &codemode_spec::ToolSpec {
        &self.0
    }
    fn prepare(
        &self,
        _args: serde_json::Value,
    ) -> Result<Box<dyn codemode_spec::PreparedCall>, codemode_spec::ToolError> {
        Err(codemode_spec::ToolError::failed(
            "policy checking never calls tools",
        ))
    }
}

/// The built-in tools, so that policies naming them type-check.
fn builtin_registry() -> Registry {
    let registry = Registry::new();
    for tool in builtin_tools(&ToolsConfig::default()) {
        let _ = registry.register(tool);
    }
    registry
}
