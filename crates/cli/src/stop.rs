//! Stopping `codemode run` on a signal without losing what its calls did.
//!
//! The default action of SIGINT, SIGTERM, SIGHUP (and SIGUSR1, SIGUSR2, SIGALRM, SIGPWR) ends the
//! process at once: a tool call that
//! was running (a `bash` command, an MCP call) went on or was cut off with no audit line. Here
//! the first signal aborts the script, whose calls are then cancelled and audited like any
//! others, and the command exits with the usual 128 + signal number; a second signal exits at
//! once.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{Context, Result};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// The signals whose default action ends the process: each is caught instead, so that a
/// running call can be stopped and audited first. (SIGKILL and SIGSTOP cannot be caught.)
const ENDING: [(&str, i32); 7] = [
    ("SIGTERM", libc::SIGTERM),
    ("SIGINT", libc::SIGINT),
    ("SIGHUP", libc::SIGHUP),
    ("SIGUSR1", libc::SIGUSR1),
    ("SIGUSR2", libc::SIGUSR2),
    ("SIGALRM", libc::SIGALRM),
    ("SIGPWR", libc::SIGPWR),
];

/// Every ending signal, as (name, number), as they arrive.
pub fn ending_signals() -> Result<tokio::sync::mpsc::UnboundedReceiver<(&'static str, i32)>> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for (name, number) in ENDING {
        let mut stream =
            signal(SignalKind::from_raw(number)).with_context(|| format!("cannot watch {name}"))?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send((name, number)).is_err() {
                    return;
                }
            }
        });
    }
    Ok(rx)
}

pub struct Stop {
    signal: Arc<AtomicI32>,
    task: tokio::task::JoinHandle<()>,
}

impl Stop {
    /// Watches the signals; the first cancels `abort`.
    pub fn watch(abort: CancellationToken) -> Result<Stop> {
        let mut signals = ending_signals()?;
        let received = Arc::new(AtomicI32::new(0));
        let seen = received.clone();
        let task = tokio::spawn(async move {
            while let Some((name, number)) = signals.recv().await {
                if seen.swap(number, Ordering::SeqCst) == 0 {
                    eprintln!(
                        "codemode: {name}: stopping the script (its calls are cancelled and audited); send it again to exit at once"
                    );
                    abort.cancel();
                } else {
                    codemode_childenv::stop_confined_survivors();
                    std::process::exit(128 + number);
                }
            }
        });
        Ok(Stop {
            signal: received,
            task,
        })
    }

    /// The exit code the signal asks for, once one came.
    pub fn exit_code(&self) -> Option<u8> {
        match self.signal.load(Ordering::SeqCst) {
            0 => None,
            n => u8::try_from(128 + n).ok(),
        }
    }
}

impl Drop for Stop {
    fn drop(&mut self) {
        self.task.abort();
    }
}
