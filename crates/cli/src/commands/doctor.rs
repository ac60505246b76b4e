//! `codemode doctor`: which isolation layers hold scripts, and the programs codemode starts,
//! on this machine.

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
    println!("Programs codemode starts (bash, hooks, stdio MCP servers):");
    match children_confinement() {
        Ok(()) => {
            println!(
                "  active   namespace     own user and mount namespace: configuration read-only, audit key covered"
            );
            // Not counted as missing: only services on abstract sockets depend on it.
            match codemode_childenv::scopes_abstract_sockets() {
                true => println!(
                    "  active   sockets       abstract sockets made outside are out of reach (Landlock scope)"
                ),
                false => println!(
                    "  absent   sockets       abstract sockets made outside stay reachable (needs Landlock ABI 6, Linux 6.12)"
                ),
            }
        }
        Err(why) => {
            all = false;
            println!("  MISSING  namespace     they run unconfined: {why}");
        }
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

/// Tries the confinement on a throwaway directory and key, as setup does with the real ones.
fn children_confinement() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("cannot make a test directory: {e}"))?;
    let key = dir.path().join("key");
    std::fs::write(&key, "test").map_err(|e| format!("cannot write a test file: {e}"))?;
    codemode_childenv::confine_children([key], [dir.path().to_path_buf()]).map_err(|e| e.0)
}
