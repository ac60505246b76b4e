//! `codemode audit verify`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Subcommand;
use codemode_gate::AuditKey;

#[derive(Subcommand, Debug)]
pub enum AuditCommand {
    /// Check that no line of an audit log was removed, changed, reordered, forged or cut from
    /// the end, and say what the check proves.
    Verify {
        /// The audit log (JSON Lines, each line carrying the keyed hash of the one before).
        file: PathBuf,
        /// The key the log was written with (default: $XDG_STATE_HOME/codemode/audit.key, when
        /// it exists). Without a key only the chain's shape is checked.
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
    },
}

pub fn run(cmd: AuditCommand) -> Result<ExitCode> {
    match cmd {
        AuditCommand::Verify { file, key } => {
            let key_path = key.or_else(|| AuditKey::default_path().filter(|p| p.exists()));
            let key = match &key_path {
                Some(p) => Some(AuditKey::load(p)?),
                None => None,
            };
            verify(&file, key.as_ref())
        }
    }
}

fn verify(file: &std::path::Path, key: Option<&AuditKey>) -> Result<ExitCode> {
    match codemode_gate::verify(file, key) {
        Ok(report) => {
            println!(
                "{}: intact, {} lines; last hash {}",
                file.display(),
                report.lines,
                report.last_hash
            );
            for p in report.proves() {
                println!("  proven: {p}");
            }
            for c in report.cannot_prove() {
                println!("  not proven: {c}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            Ok(ExitCode::from(1))
        }
    }
}
