//! Stopping `codemode run` on a signal without losing what its calls did.
//!
//! The default action of SIGINT, SIGTERM and SIGHUP ends the process at once: a tool call that
//! was running (a `bash` command, an MCP call) went on or was cut off with no audit line. Here
//! the first signal aborts the script, whose calls are then cancelled and audited like any
//! others, and the command exits with the usual 128 + signal number; a second signal exits at
//! once.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{Context, Result};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

pub struct Stop {
    signal: Arc<AtomicI32>,
    task: tokio::task::JoinHandle<()>,
}

impl Stop {
    /// Watches the signals; the first cancels `abort`.
    pub fn watch(abort: CancellationToken) -> Result<Stop> {
        let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
        let mut hup = signal(SignalKind::hangup()).context("cannot watch SIGHUP")?;
        let received = Arc::new(AtomicI32::new(0));
        let seen = received.clone();
        let task = tokio::spawn(async move {
            loop {
                let (name, number) = tokio::select! {
                    _ = term.recv() => ("SIGTERM", libc::SIGTERM),
                    _ = int.recv() => ("SIGINT", libc::SIGINT),
                    _ = hup.recv() => ("SIGHUP", libc::SIGHUP),
                };
                if seen.swap(number, Ordering::SeqCst) == 0 {
                    eprintln!(
                        "codemode: {name}: stopping the script (its calls are cancelled and audited); send it again to exit at once"
                    );
                    abort.cancel();
                } else {
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
