//! Asking the person at the terminal.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;

use codemode_gate::{ApprovalAnswer, ApprovalRequest, Approver};
use codemode_spec::BoxFuture;
use futures::FutureExt;

/// Asks y/n/always on the controlling terminal. One question at a time, however many calls wait.
pub struct TerminalApprover {
    one_at_a_time: Arc<tokio::sync::Mutex<()>>,
}

impl TerminalApprover {
    /// An approver when a person can answer (a terminal is attached), else `None`: then an `ask`
    /// becomes a denial that names the policy.
    pub fn if_interactive() -> Option<TerminalApprover> {
        let tty = std::fs::File::open("/dev/tty").is_ok();
        (tty && std::io::stderr().is_terminal()).then(|| TerminalApprover {
            one_at_a_time: Arc::new(tokio::sync::Mutex::new(())),
        })
    }
}

impl Approver for TerminalApprover {
    fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, ApprovalAnswer> {
        let question = question(req);
        // "Always" lasts for one script; a direct call has none to last for.
        let in_script = req.provenance.script_id.is_some();
        let lock = self.one_at_a_time.clone();
        async move {
            let _turn = lock.lock().await;
            tokio::task::spawn_blocking(move || ask(&question, in_script))
                .await
                .unwrap_or(ApprovalAnswer::No)
        }
        .boxed()
    }
}

fn ask(question: &str, in_script: bool) -> ApprovalAnswer {
    let Ok(tty) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
    else {
        return ApprovalAnswer::No;
    };
    let mut out = &tty;
    let choices = match in_script {
        true => "[y]es / [n]o / [a]lways for this script",
        false => "[y]es / [n]o",
    };
    let _ = write!(out, "\n{question}\nAllow? {choices}: ");
    let _ = out.flush();
    let mut line = String::new();
    if std::io::BufReader::new(&tty).read_line(&mut line).is_err() {
        return ApprovalAnswer::No;
    }
    match line.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => ApprovalAnswer::Yes,
        "a" | "always" if in_script => ApprovalAnswer::Always,
        _ => ApprovalAnswer::No,
    }
}

/// The question, with the call's arguments whole: a person cannot approve what they were not
/// shown (a cut after N characters let padding hide the end of a command). Characters that
/// could move the cursor, recolour or reorder the terminal's text are escaped, so what is shown
/// is what runs.
fn question(req: &ApprovalRequest) -> String {
    let args = req.shown_arguments();
    let policies = if req
        .policy_ids
        .iter()
        .all(|id| req.reason.contains(id.as_str()))
    {
        String::new()
    } else {
        format!(" (policy {})", req.policy_ids.join(", "))
    };
    let paths = match req.shown_paths() {
        p if p.is_empty() => String::new(),
        p => format!("\nPaths it reaches (resolved, links followed):\n{p}"),
    };
    format!(
        "codemode: a script wants to call `{}` with ({} characters):\n{args}{paths}\nReason: {}{policies}",
        codemode_gate::shown_text(&req.tool_name),
        args.chars().count(),
        codemode_gate::shown_text(&req.reason)
    )
}
