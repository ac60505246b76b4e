//! `codemode audit verify`: an audit log file, or a stream in a shared state store.

use std::io::Write;
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
            let mut say = Say::default();
            let code = match (file, state, stream) {
                // Head and journal sit beside the real file, whatever name was given.
                (Some(file), None, None) => verify(
                    &mut say,
                    &std::fs::canonicalize(&file).unwrap_or(file),
                    key.as_ref(),
                ),
                (None, Some(url), Some(stream)) => {
                    verify_stream(&mut say, &url, &stream, key.as_ref()).await?
                }
                _ => bail!("give an audit log FILE, or --state URL and --stream NAME"),
            };
            say.finish(code)
        }
    }
}

/// Where a verification prints, line by line. A reader that stops early (`| head`) closes
/// standard output: that is a reader that has seen enough, not an error, so the rest of the
/// report is dropped quietly and the check still ends with its own exit code. Any other
/// failure to write the report fails the command once the check is done.
#[derive(Default)]
struct Say {
    /// Standard output is closed or failed: nothing more is written to it.
    stopped: bool,
    failed: Option<std::io::Error>,
}

impl Say {
    fn out(&mut self, line: impl std::fmt::Display) {
        if self.stopped {
            return;
        }
        let line = line.to_string();
        let line = crate::terminal::for_stdout(&line);
        if let Err(e) = writeln!(std::io::stdout().lock(), "{line}") {
            self.stop(e);
        }
    }

    /// A failure on standard error has nowhere to be reported; it never ends the check.
    fn err(&mut self, line: impl std::fmt::Display) {
        let line = line.to_string();
        let _ = writeln!(
            std::io::stderr().lock(),
            "{}",
            crate::terminal::for_stderr(&line)
        );
    }

    fn stop(&mut self, e: std::io::Error) {
        self.stopped = true;
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            self.failed = Some(e);
        }
    }

    fn finish(mut self, code: ExitCode) -> Result<ExitCode> {
        if !self.stopped
            && let Err(e) = std::io::stdout().lock().flush()
        {
            self.stop(e);
        }
        match self.failed {
            Some(e) => Err(anyhow::Error::new(e).context("writing the report to standard output")),
            None => Ok(code),
        }
    }
}

fn print(
    say: &mut Say,
    what: &str,
    lines: u64,
    last: &str,
    proves: Vec<String>,
    cannot: Vec<String>,
) {
    say.out(format_args!(
        "{what}: intact, {lines} lines; last hash {last}"
    ));
    for p in proves {
        say.out(format_args!("  proven: {p}"));
    }
    for c in cannot {
        say.out(format_args!("  not proven: {c}"));
    }
}

/// The journal's part of a verification: calls that started and never ended. They do not make
/// the log less intact, but each is a call whose effect nobody recorded, so they are shown
/// after the log's result; a journal that does not verify fails the check.
fn print_unfinished(
    say: &mut Say,
    journal: &str,
    found: Result<Vec<codemode_gate::UnfinishedCall>, codemode_gate::AuditError>,
) -> ExitCode {
    match found {
        Ok(calls) if calls.is_empty() => ExitCode::SUCCESS,
        Ok(calls) => {
            say.out(format_args!(
                "UNFINISHED: {} call(s) in the journal {journal} started and have no outcome line: \
                 the process stopped (killed or crashed) while they ran, so whether and what \
                 they changed is unknown:",
                calls.len()
            ));
            for call in &calls {
                say.out(format_args!("  {}", call.summary()));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            say.err(format_args!("the journal {journal}: {e}"));
            ExitCode::from(1)
        }
    }
}

fn verify(say: &mut Say, file: &std::path::Path, key: Option<&AuditKey>) -> ExitCode {
    match codemode_gate::verify(file, key) {
        Ok(report) if report.head == codemode_gate::HeadCheck::Missing && report.lines > 0 => {
            // Opening the log to append refuses it too: cut lines and a deleted head look the
            // same as a head that was never written.
            say.out(format_args!(
                "{}: NOT VERIFIED, {} lines: its head file {} is missing or empty, so lines cut \
                 from the end cannot be ruled out; restore the head from a backup, or keep the \
                 log aside and start a new one",
                file.display(),
                report.lines,
                codemode_gate::head_path(file).display()
            ));
            for p in report.proves() {
                say.out(format_args!("  proven: {p}"));
            }
            for c in report.cannot_prove() {
                say.out(format_args!("  not proven: {c}"));
            }
            ExitCode::from(1)
        }
        Ok(report) => {
            print(
                say,
                &file.display().to_string(),
                report.lines as u64,
                &report.last_hash,
                report.proves(),
                report.cannot_prove(),
            );
            let journal = codemode_gate::started_path(file);
            if !journal.exists() && report.lines > 0 {
                say.out(format_args!(
                    "  not proven: there is no journal beside the log ({}), so a call whose \
                     process was killed while it ran would leave no trace (logs written before \
                     journals existed have none)",
                    journal.display()
                ));
            }
            print_unfinished(
                say,
                &journal.display().to_string(),
                codemode_gate::unfinished_calls(file, key),
            )
        }
        Err(e) => {
            say.err(format_args!("{}: {e}", file.display()));
            ExitCode::from(1)
        }
    }
}

async fn verify_stream(
    say: &mut Say,
    url: &str,
    stream: &str,
    key: Option<&AuditKey>,
) -> Result<ExitCode> {
    let store = codemode_state::open(url, codemode_state::OpenOptions::default())
        .await
        .map_err(|e| anyhow::anyhow!("--state {}: {e}", codemode_state::redact(url)))?;
    let shown = format!("audit stream `{stream}` in {}", store.describe());
    if !store.audit_streams().await?.iter().any(|s| s == stream) {
        say.err(format_args!(
            "{shown}: no such stream; the streams there are: {}",
            store.audit_streams().await?.join(", ")
        ));
        return Ok(ExitCode::from(1));
    }
    match codemode_gate::verify_stream(store.as_ref(), stream, key).await {
        Ok(report) => {
            print(
                say,
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
                say,
                &journal,
                codemode_gate::unfinished_stream_calls(store.as_ref(), stream, key).await,
            ))
        }
        Err(e) => {
            say.err(format_args!("{e}"));
            Ok(ExitCode::from(1))
        }
    }
}
