//! `codemode audit verify`: an audit log file, or a stream in a shared state store.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::Subcommand;
use codemode_gate::AuditKey;

#[derive(Subcommand, Debug)]
pub enum AuditCommand {
    /// Check that no line of an audit log was removed, changed, reordered, forged or cut from
    /// the end, and say what the check proves. Give a FILE, or --state URL --stream NAME for
    /// the log replicas keep in a shared database.
    Verify {
        /// The audit log (JSON Lines, each line carrying the keyed hash of the one before).
        #[arg(required_unless_present = "state", conflicts_with = "state")]
        file: Option<PathBuf>,
        /// The state store holding the stream: `sqlite:///path/state.db` or
        /// `postgres://user@host/db`.
        #[arg(long = "state", value_name = "URL", requires = "stream")]
        state: Option<String>,
        /// The stream's name (`state.audit_stream` in the settings of the replicas).
        #[arg(long, value_name = "NAME", requires = "state")]
        stream: Option<String>,
        /// The key the log was written with (default: $XDG_STATE_HOME/codemode/audit.key, when
        /// it exists). Without a key only the chain's shape is checked.
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
    },
}

pub async fn run(cmd: AuditCommand) -> Result<ExitCode> {
    match cmd {
        AuditCommand::Verify {
            file,
            state,
            stream,
            key,
        } => {
            let key_path = key.or_else(|| AuditKey::default_path().filter(|p| p.exists()));
            let key = match &key_path {
                Some(p) => Some(AuditKey::load(p)?),
                None => None,
            };
            match (file, state, stream) {
                // Head and journal sit beside the real file, whatever name was given.
                (Some(file), None, None) => {
                    verify(&std::fs::canonicalize(&file).unwrap_or(file), key.as_ref())
                }
                (None, Some(url), Some(stream)) => verify_stream(&url, &stream, key.as_ref()).await,
                _ => bail!("give an audit log FILE, or --state URL and --stream NAME"),
            }
        }
    }
}

fn print(what: &str, lines: u64, last: &str, proves: Vec<String>, cannot: Vec<String>) {
    println!("{what}: intact, {lines} lines; last hash {last}");
    for p in proves {
        println!("  proven: {p}");
    }
    for c in cannot {
        println!("  not proven: {c}");
    }
}

/// The journal's part of a verification: calls that started and never ended. They do not make
/// the log less intact, but each is a call whose effect nobody recorded, so they are shown
/// after the log's result; a journal that does not verify fails the check.
fn print_unfinished(
    journal: &str,
    found: Result<Vec<codemode_gate::UnfinishedCall>, codemode_gate::AuditError>,
) -> ExitCode {
    match found {
        Ok(calls) if calls.is_empty() => ExitCode::SUCCESS,
        Ok(calls) => {
            println!(
                "UNFINISHED: {} call(s) in the journal {journal} started and have no outcome line: \
                 the process stopped (killed or crashed) while they ran, so whether and what \
                 they changed is unknown:",
                calls.len()
            );
            for call in &calls {
                println!("  {}", call.summary());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("the journal {journal}: {e}");
            ExitCode::from(1)
        }
    }
}

fn verify(file: &std::path::Path, key: Option<&AuditKey>) -> Result<ExitCode> {
    match codemode_gate::verify(file, key) {
        Ok(report) if report.head == codemode_gate::HeadCheck::Missing && report.lines > 0 => {
            // Opening the log to append refuses it too: cut lines and a deleted head look the
            // same as a head that was never written.
            println!(
                "{}: NOT VERIFIED, {} lines: its head file {} is missing or empty, so lines cut \
                 from the end cannot be ruled out; restore the head from a backup, or keep the \
                 log aside and start a new one",
                file.display(),
                report.lines,
                codemode_gate::head_path(file).display()
            );
            for p in report.proves() {
                println!("  proven: {p}");
            }
            for c in report.cannot_prove() {
                println!("  not proven: {c}");
            }
            Ok(ExitCode::from(1))
        }
        Ok(report) => {
            print(
                &file.display().to_string(),
                report.lines as u64,
                &report.last_hash,
                report.proves(),
                report.cannot_prove(),
            );
            let journal = codemode_gate::started_path(file);
            if !journal.exists() && report.lines > 0 {
                println!(
                    "  not proven: there is no journal beside the log ({}), so a call whose \
                     process was killed while it ran would leave no trace (logs written before \
                     journals existed have none)",
                    journal.display()
                );
            }
            Ok(print_unfinished(
                &journal.display().to_string(),
                codemode_gate::unfinished_calls(file, key),
            ))
        }
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            Ok(ExitCode::from(1))
        }
    }
}

async fn verify_stream(url: &str, stream: &str, key: Option<&AuditKey>) -> Result<ExitCode> {
    let store = codemode_state::open(url, codemode_state::OpenOptions::default())
        .await
        .map_err(|e| anyhow::anyhow!("--state {}: {e}", codemode_state::redact(url)))?;
    let shown = format!("audit stream `{stream}` in {}", store.describe());
    if !store.audit_streams().await?.iter().any(|s| s == stream) {
        eprintln!(
            "{shown}: no such stream; the streams there are: {}",
            store.audit_streams().await?.join(", ")
        );
        return Ok(ExitCode::from(1));
    }
    match codemode_gate::verify_stream(store.as_ref(), stream, key).await {
        Ok(report) => {
            print(
                &shown,
                report.lines,
                &report.last_hash,
                report.proves(),
                report.cannot_prove(),
            );
            let journal = format!(
                "audit stream `{}` in {}",
                codemode_gate::started_stream(stream),
                store.describe()
            );
            Ok(print_unfinished(
                &journal,
                codemode_gate::unfinished_stream_calls(store.as_ref(), stream, key).await,
            ))
        }
        Err(e) => {
            eprintln!("{e}");
            Ok(ExitCode::from(1))
        }
    }
}
