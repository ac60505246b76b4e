//! `codemode doctor`: which isolation layers hold scripts on this machine.

use std::process::ExitCode;

use anyhow::{Context, Result};
use codemode_sandbox::{Sandbox, SandboxConfig};

/// Starts one sandbox worker and prints the isolation layers it reports. Exits 1 when a layer
/// is not active, so scripts can check a machine before trusting it.
pub fn run() -> Result<ExitCode> {
    let sandbox = Sandbox::new(SandboxConfig {
        warm: 0,
        ..Default::default()
    })
    .context("process isolation is not available")?;
    let layers = sandbox.isolation_layers().unwrap_or_default();
    let mut all = true;
    println!("Script isolation: worker processes");
    for l in layers {
        all &= l.active;
        let mark = if l.active { "active " } else { "MISSING" };
        println!("  {mark}  {:<13} {}", l.name, l.detail);
    }
    if all {
        println!("Every layer is active.");
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "Some layers are missing on this machine; scripts still run, with less protection."
        );
        Ok(ExitCode::from(1))
    }
}
