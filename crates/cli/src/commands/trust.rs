//! `codemode trust`: let a project's settings widen what the user's allow.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use codemode_config::{ConfigPaths, trust};

#[derive(Args, Debug)]
pub struct TrustArgs {
    /// The project directory (default: the current directory).
    pub dir: Option<PathBuf>,
    /// Withdraw trust instead.
    #[arg(long)]
    pub revoke: bool,
    /// User configuration directory (default: $XDG_CONFIG_HOME/codemode or ~/.config/codemode).
    #[arg(long, value_name = "DIR")]
    pub config_dir: Option<PathBuf>,
}

pub fn run(args: TrustArgs) -> Result<ExitCode> {
    let dir = match args.dir {
        Some(d) => d,
        None => std::env::current_dir().context("could not read the current directory")?,
    };
    let dir = dir
        .canonicalize()
        .with_context(|| format!("{} is not a directory codemode can open", dir.display()))?;
    let config_dir = match args.config_dir {
        Some(d) => d,
        None => {
            ConfigPaths::config_dir_from_env().context("no home directory: pass --config-dir")?
        }
    };
    // The trust list lives in the configuration directory; the state directory is not used.
    let paths = ConfigPaths::new(config_dir.clone(), config_dir);
    if args.revoke {
        trust::untrust(&paths, &dir)?;
        println!(
            "{} is no longer trusted: its settings can only narrow yours.",
            dir.display()
        );
    } else {
        trust::trust(&paths, &dir)?;
        // It exists from now on, so codemode can keep it read-only for the programs it starts
        // in any project: settings they created here could widen yours.
        let settings_dir = dir.join(".codemode");
        std::fs::create_dir_all(&settings_dir)
            .with_context(|| format!("could not create {}", settings_dir.display()))?;
        println!(
            "{} is trusted: its settings may now widen yours.",
            dir.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
