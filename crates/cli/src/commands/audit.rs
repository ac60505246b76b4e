//! `codemode audit verify`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum AuditCommand {
    /// Check that no line of an audit log was removed, changed or reordered.
    Verify {
        /// The audit log (JSON Lines, each line carrying the hash of the one before).
        file: PathBuf,
    },
}

pub fn run(cmd: AuditCommand) -> Result<ExitCode> {
    match cmd {
        AuditCommand::Verify { file } => match codemode_gate::verify(&file) {
            Ok(report) => {
                println!(
                    "{}: intact, {} lines; last hash {} (keep it elsewhere to notice lines cut from the end)",
                    file.display(),
                    report.lines,
                    report.last_hash
                );
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => {
                eprintln!("{}: {e}", file.display());
                Ok(ExitCode::from(1))
            }
        },
    }
}
