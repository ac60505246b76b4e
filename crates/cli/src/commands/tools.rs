//! `codemode tools`: what a script can call, and what the model reads about it.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use codemode_declarations::{
    Encoding, RenderOptions, count_tokens, direct_definitions_json, render_declaration,
};

use crate::SetupArgs;
use crate::setup::{LimitFlags, Setup};

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
    let setup = Setup::build(&args.setup, &LimitFlags::default()).await?;
    let codemode = &setup.codemode;
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
            "{:<40} {:<9} {:<24} {:>7}",
            "tool", "exposure", "namespace", "tokens"
        );
        for spec in codemode.gate().registry().specs() {
            let declaration = render_declaration(&spec, &RenderOptions::default());
            println!(
                "{:<40} {:<9} {:<24} {:>7}",
                spec.name,
                spec.exposure.as_str(),
                spec.namespace.as_deref().unwrap_or("-"),
                count_tokens(&declaration, Encoding::O200kBase)
            );
        }
    }
    for warning in &setup.warnings {
        eprintln!("warning: {warning}");
    }
    setup.shutdown().await;
    Ok(ExitCode::SUCCESS)
}
