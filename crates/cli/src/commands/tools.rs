//! `codemode tools`: what a script can call, and what the model reads about it.

use std::process::ExitCode;

use anyhow::Result;
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
    if args.describe {
        println!("{}", codemode.description());
    } else if args.tokens {
        let description = codemode.description();
        let declared = codemode.model_declared_tools();
        let all = codemode.gate().registry().script_callable();
        let direct_all = direct_definitions_json(&all);
        let direct_declared = direct_definitions_json(&declared);
        println!("{:<52} {:>10} {:>12}", "", "o200k_base", "cl100k_base");
        let row = |label: &str, text: &str| {
            println!(
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
        println!(
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
            println!(
                "{:<40} {:<9} {:<24} {:>7}  {note}",
                spec.name,
                spec.exposure.as_str(),
                spec.namespace.as_deref().unwrap_or("-"),
                count_tokens(&declaration, Encoding::O200kBase),
            );
        }
        if !installation.activation().codemode {
            println!(
                "\nThe codemode tool is not offered: nothing asked for it (see the warnings)."
            );
        }
    }
    for warning in installation.warnings() {
        eprintln!("warning: {warning}");
    }
    installation.shutdown().await;
    ready?;
    Ok(ExitCode::SUCCESS)
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
