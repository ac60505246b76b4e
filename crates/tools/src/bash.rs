//! `bash`: run a shell command in the working directory, in its own process group.

use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use codemode_spec::{
    ContentBlock, Effect, PathUse, PreparedCall, Tool, ToolError, ToolOutput, ToolSpec, prepared,
};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::time::sleep_until;
use tokio_util::sync::CancellationToken;

use crate::args::parse;
use crate::paths::path_facts;
use crate::support::{Behaviour, Context, make_spec};
use crate::truncate::HeadTail;

/// How long background processes may keep the output open after the shell itself exited.
const BACKGROUND_GRACE: Duration = Duration::from_millis(250);
/// How long to collect the last output after the group was killed.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BashArgs {
    command: String,
    timeout_ms: Option<u64>,
}

pub(crate) struct BashTool {
    ctx: Arc<Context>,
    spec: ToolSpec,
}

impl BashTool {
    pub fn new(ctx: Arc<Context>) -> Self {
        let max = ctx.config.bash_timeout_ms;
        let spec = make_spec(
            &ctx,
            "bash",
            "Run shell command",
            &format!(
                "Run a command with `bash -c` in the working directory, with no standard input. Returns {{output, exit_code, truncated, wall_time_seconds}}: stdout and stderr merged in the order written; output beyond {} bytes keeps its beginning and end with a marker of what was cut. A non-zero exit is a result, not a failure. The command is stopped after `timeout_ms` (default and maximum {max} ms); then exit_code is null and `note` says why, and every process it started is killed. Background processes that still hold the output open shortly after the command ends are killed too; redirect their output (`cmd > log 2>&1 &`) to keep them running (until codemode stops).",
                ctx.config.max_output_bytes
            ),
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "minLength": 1, "description": "Shell command to run."},
                    "timeout_ms": {"type": "integer", "minimum": 1, "maximum": max, "description": format!("Stop the command after this many milliseconds (default and maximum {max}).")}
                },
                "required": ["command"],
                "additionalProperties": false
            }),
            Some(json!({
                "type": "object",
                "properties": {
                    "output": {"type": "string", "description": "stdout and stderr, merged."},
                    "exit_code": {"type": ["integer", "null"], "description": "Exit code; null when the command was killed (timeout or signal)."},
                    "truncated": {"type": "boolean", "description": "True when the middle of the output was cut."},
                    "wall_time_seconds": {"type": "number"},
                    "note": {"type": "string", "description": "Why the command ended abnormally, when it did."}
                },
                "required": ["output", "exit_code", "truncated", "wall_time_seconds"],
                "additionalProperties": false
            })),
            Behaviour::OpenWorld,
        );
        BashTool { ctx, spec }
    }
}

impl Tool for BashTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// The command can touch anything; the path the policy sees is where it runs.
    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let args: BashArgs = parse("bash", args)?;
        let mut facts = path_facts(&self.ctx.workdir)?;
        facts.path_use = PathUse::WorkingDirectory;
        let ctx = self.ctx.clone();
        Ok(prepared(facts, move |run_ctx| {
            Box::pin(async move { run(&ctx, &args, run_ctx.cancel).await })
        }))
    }
}

/// Kills the command's whole process group when dropped while armed, so a call that is dropped
/// or cancelled leaves no processes behind.
struct ProcessGroup {
    pgid: libc::pid_t,
    armed: bool,
}

impl ProcessGroup {
    fn kill(&mut self) {
        if self.armed {
            // SAFETY: killpg only sends a signal; pgid is the group our child leads.
            unsafe {
                libc::killpg(self.pgid, libc::SIGKILL);
            }
        }
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How the command ended, beyond its exit status.
enum Ending {
    Finished,
    TimedOut,
    BackgroundKilled,
}

async fn run(
    ctx: &Context,
    args: &BashArgs,
    cancel: CancellationToken,
) -> Result<ToolOutput, ToolError> {
    let max_timeout = ctx.config.bash_timeout_ms;
    let timeout_ms = args.timeout_ms.unwrap_or(max_timeout);
    if timeout_ms == 0 || timeout_ms > max_timeout {
        return Err(ToolError::invalid(format!(
            "timeout_ms must be between 1 and {max_timeout} (the configured maximum); got {timeout_ms}"
        )));
    }
    if args.command.trim().is_empty() {
        return Err(ToolError::invalid(
            "the command is empty; give a shell command to run",
        ));
    }
    // One pipe for both streams keeps stdout and stderr in the order they were written.
    let (reader, writer) = std::io::pipe()
        .map_err(|e| ToolError::failed(format!("cannot create an output pipe: {e}")))?;
    let writer_err = writer
        .try_clone()
        .map_err(|e| ToolError::failed(format!("cannot create an output pipe: {e}")))?;
    let started = Instant::now();
    let spawned = {
        let mut command = tokio::process::Command::new("bash");
        command
            .arg("-c")
            .arg(&args.command)
            .current_dir(&ctx.workdir)
            // codemode's environment without its secrets (provider keys, the serve token):
            // a script can print whatever bash sees.
            .env_clear()
            .envs(codemode_childenv::vars())
            .stdin(Stdio::null())
            .stdout(Stdio::from(writer))
            .stderr(Stdio::from(writer_err))
            .process_group(0);
        // It cannot read the audit key or change codemode's configuration, whatever it runs
        // (see `codemode_childenv::confine_children`).
        codemode_childenv::confine(command.as_std_mut()).and_then(|()| command.spawn())
        // `command` drops here, closing our copies of the pipe's write end, so EOF can arrive.
    };
    let mut child = spawned.map_err(|e| {
        ToolError::failed(format!(
            "cannot start bash in {}: {e}; check that bash is installed and the working directory exists{}",
            ctx.workdir.display(),
            codemode_childenv::start_failure_hint()
        ))
    })?;
    let pid = child
        .id()
        .ok_or_else(|| ToolError::failed("bash exited before its process id could be read"))?;
    codemode_childenv::started_confined(pid);
    let mut group = ProcessGroup {
        pgid: pid as libc::pid_t,
        armed: true,
    };
    let mut pipe = pipe::Receiver::from_owned_fd(OwnedFd::from(reader))
        .map_err(|e| ToolError::failed(format!("cannot read the command's output: {e}")))?;

    let deadline = tokio::time::Instant::from_std(started + Duration::from_millis(timeout_ms));
    let mut output = HeadTail::new(ctx.config.max_output_bytes);
    let mut buf = vec![0u8; 16 * 1024];
    let mut status: Option<ExitStatus> = None;
    let mut eof = false;
    let mut grace_until: Option<tokio::time::Instant> = None;
    let mut ending = Ending::Finished;

    while status.is_none() || !eof {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                group.kill();
                let _ = child.wait().await;
                group.disarm();
                // The command was running: what it did before it was killed stays done.
                return Err(ToolError::cancelled().with_effect(Effect::Unknown));
            }
            _ = sleep_until(deadline) => {
                ending = Ending::TimedOut;
                break;
            }
            _ = sleep_until(grace_until.unwrap_or(deadline)), if grace_until.is_some() => {
                ending = Ending::BackgroundKilled;
                break;
            }
            waited = child.wait(), if status.is_none() => {
                let exit = waited.map_err(|e| ToolError::failed(format!("cannot wait for bash: {e}")))?;
                status = Some(exit);
                if !eof {
                    grace_until = Some(tokio::time::Instant::now() + BACKGROUND_GRACE);
                }
            }
            read = pipe.read(&mut buf), if !eof => match read {
                Ok(0) | Err(_) => eof = true,
                Ok(n) => output.push(&buf[..n]),
            },
        }
    }

    if !matches!(ending, Ending::Finished) {
        tracing::debug!(
            pgid = group.pgid,
            timed_out = matches!(ending, Ending::TimedOut),
            "killing the command's process group"
        );
        group.kill();
        if status.is_none() {
            status = child.wait().await.ok();
        }
        // The killed processes close the pipe as they die; collect what they wrote before that.
        let _ = tokio::time::timeout(DRAIN_AFTER_KILL, async {
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                output.push(&buf[..n]);
            }
        })
        .await;
    }
    group.disarm();
    Ok(result(
        output,
        status,
        &ending,
        timeout_ms,
        started.elapsed(),
    ))
}

fn result(
    output: HeadTail,
    status: Option<ExitStatus>,
    ending: &Ending,
    timeout_ms: u64,
    elapsed: Duration,
) -> ToolOutput {
    let truncated = output.truncated();
    let text = output.finish();
    let (exit_code, note) = match ending {
        Ending::TimedOut => (
            None,
            Some(format!(
                "The command timed out after {timeout_ms} ms; it and every process it started were killed. Give a larger timeout_ms, or run long jobs in the background with their output redirected to a file."
            )),
        ),
        Ending::Finished | Ending::BackgroundKilled => {
            let code = status.and_then(|s| s.code());
            let mut note = match status.and_then(|s| s.signal()) {
                Some(signal) if code.is_none() => {
                    Some(format!("The command was killed by signal {signal}."))
                }
                _ => None,
            };
            if matches!(ending, Ending::BackgroundKilled) {
                note = Some(format!(
                    "{}Background processes still held the output open after the command ended, so they were killed. To keep one running, redirect its output (`cmd > log 2>&1 &`).",
                    note.map(|n| format!("{n} ")).unwrap_or_default()
                ));
            }
            (code, note)
        }
    };
    let wall_time_seconds = (elapsed.as_secs_f64() * 1000.0).round() / 1000.0;
    let mut value = json!({
        "output": text,
        "exit_code": exit_code,
        "truncated": truncated,
        "wall_time_seconds": wall_time_seconds,
    });
    if let (Some(note), Some(map)) = (&note, value.as_object_mut()) {
        map.insert("note".into(), Value::String(note.clone()));
    }
    let status_line = match (exit_code, &note) {
        (Some(code), None) => format!("[exit code {code}]"),
        (Some(code), Some(note)) => format!("[exit code {code}] {note}"),
        (None, Some(note)) => note.clone(),
        (None, None) => "[no exit code]".to_owned(),
    };
    let shown = if text.is_empty() {
        format!("(no output)\n\n{status_line}")
    } else {
        format!("{text}\n\n{status_line}")
    };
    ToolOutput {
        value,
        content: Some(vec![ContentBlock::Text { text: shown }]),
        is_error: exit_code != Some(0),
        usage: None,
        held: Default::default(),
    }
}
