//! `codemode tools`: what a script can call, and what the model reads about it.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use codemode_declarations::{
    Encoding, RenderOptions, count_tokens, direct_definitions_json, render_declaration,
};
use codemode_gate::{ExplainInput, Gate};
use codemode_spec::{Exposure, ToolSpec};
use serde_json::json;

use crate::SetupArgs;
use crate::setup::{self, LimitFlags};

#[derive(Args, Debug)]
pub struct ToolsArgs {
    /// Print the exact description of the codemode tool.
    #[arg(long)]
    pub describe: bool,
    /// Print token counts: the codemode description, and the same tools declared directly.
    #[arg(long)]
    pub tokens: bool,
    #[command(flatten)]
    pub setup: SetupArgs,
}

pub async fn run(args: ToolsArgs) -> Result<ExitCode> {
    let installation = setup::build(&args.setup, &LimitFlags::default()).await?;
    let ready = installation.servers_ready().await;
    let codemode = installation.codemode();
    // Built whole, then written once: a reader that closes the pipe early (`| head`) ends the
    // output, not the process (`println!` panics on a closed pipe).
    let mut out = String::new();
    if args.describe {
        let _ = writeln!(out, "{}", codemode.description());
    } else if args.tokens {
        let description = codemode.description();
        let declared = codemode.model_declared_tools();
        let all = codemode.gate().registry().script_callable();
        let direct_all = direct_definitions_json(&all);
        let direct_declared = direct_definitions_json(&declared);
        let _ = writeln!(out, "{:<52} {:>10} {:>12}", "", "o200k_base", "cl100k_base");
        let mut row = |label: &str, text: &str| {
            let _ = writeln!(
                out,
                "{:<52} {:>10} {:>12}",
                label,
                count_tokens(text, Encoding::O200kBase),
                count_tokens(text, Encoding::Cl100kBase)
            );
        };
        row("codemode tool description", &description);
        row(
            &format!("direct tools still declared beside it ({})", declared.len()),
            &direct_declared,
        );
        row(
            &format!("all {} tools declared directly, no codemode", all.len()),
            &direct_all,
        );
    } else {
        let _ = writeln!(
            out,
            "{:<40} {:<9} {:<24} {:>7}  policy for a script's call, or why hidden",
            "tool", "exposure", "namespace", "tokens"
        );
        for tool in installation.tools() {
            let spec = &tool.spec;
            let note = match &tool.hidden_by {
                Some(why) => format!("hidden: {why}"),
                None if spec.exposure == Exposure::Hidden => "hidden".to_string(),
                None => policy_note(installation.gate(), spec),
            };
            let declaration = render_declaration(spec, &RenderOptions::default());
            let _ = writeln!(
                out,
                "{:<40} {:<9} {:<24} {:>7}  {note}",
                spec.name,
                spec.exposure.as_str(),
                spec.namespace.as_deref().unwrap_or("-"),
                count_tokens(&declaration, Encoding::O200kBase),
            );
        }
        if !installation.activation().codemode {
            let _ = writeln!(
                out,
                "\nThe codemode tool is not offered: nothing asked for it (see the warnings)."
            );
        }
    }
    let written = write_stdout(&crate::terminal::for_stdout(&out));
    for warning in installation.warnings() {
        eprintln!("warning: {}", crate::terminal::for_stderr(&warning));
    }
    installation.shutdown().await;
    written?;
    ready?;
    Ok(ExitCode::SUCCESS)
}

/// Writes `text` to standard output. A closed pipe is a reader that has seen enough, not an error.
pub(crate) fn write_stdout(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to standard output"),
    }
}

/// What the policies decide for a script's call of `spec` without arguments: `allow`, `ask`
/// or `deny`, with the deciding policies.
fn policy_note(gate: &Gate, spec: &ToolSpec) -> String {
    let input: Result<ExplainInput, _> = serde_json::from_value(json!({
        "tool": spec.name,
        "kind": spec.kind,
        "exposure": spec.exposure,
        "namespace": spec.namespace,
        "annotations": spec.annotations,
        "origin": "script",
    }));
    let Ok(input) = input else {
        return String::new();
    };
    let explanation = gate.explain(&input);
    let ids: Vec<&str> = explanation.policies.iter().map(|p| p.id.as_str()).collect();
    if ids.is_empty() {
        explanation.decision.to_string()
    } else {
        format!("{} ({})", explanation.decision, ids.join(", "))
    }
}
