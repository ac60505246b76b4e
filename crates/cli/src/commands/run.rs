//! `codemode run` and `codemode demo`.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use codemode_runtime::{ScriptRequest, ScriptRun};
use codemode_sandbox::Determinism;

use crate::SetupArgs;
use crate::setup::{self, LimitFlags};

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The script file, or `-` for standard input.
    #[arg(value_name = "FILE|-")]
    pub file: Option<PathBuf>,
    /// Print the structured result as one JSON object instead of the model's text.
    #[arg(long)]
    pub json: bool,
    /// Print a trace of every call to standard error.
    #[arg(short, long)]
    pub verbose: bool,
    /// Record the run's calls and results to this JSON Lines log (implies determinism).
    #[arg(long, value_name = "LOG")]
    pub record: Option<PathBuf>,
    /// Replay a recorded log: no tool is called; a different call than the log's is an error.
    #[arg(long, value_name = "LOG", conflicts_with = "record")]
    pub replay: Option<PathBuf>,
    /// Seed for Math.random (turns on deterministic mode).
    #[arg(long)]
    pub seed: Option<u32>,
    /// Start time of the virtual clock, in ms since the epoch (turns on deterministic mode).
    #[arg(long, value_name = "MS")]
    pub start_ms: Option<f64>,
    /// Session id: scripts of one session share `store()` values and session budgets.
    #[arg(long, default_value = "cli")]
    pub session: String,
    #[command(flatten)]
    pub limits: LimitFlags,
    #[command(flatten)]
    pub setup: SetupArgs,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Print the structured result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Leave the scratch project in place and print its path.
    #[arg(long)]
    pub keep: bool,
}

pub async fn run(args: RunArgs) -> Result<ExitCode> {
    let source = read_source(args.file.as_ref())?;
    if let Err(e) = codemode_sandbox::parse_source(&source) {
        eprintln!("codemode: the script was refused before it ran: {e}");
        return Ok(ExitCode::from(2));
    }
    let installation = setup::build(&args.setup, &args.limits).await?;
    let ready = installation.servers_ready().await;
    for warning in installation.warnings() {
        eprintln!("warning: {}", crate::terminal::for_stderr(&warning));
    }
    if let Err(e) = ready {
        installation.shutdown().await;
        return Err(e.into());
    }
    let determinism = determinism(&args);
    let abort = tokio_util::sync::CancellationToken::new();
    let stop = crate::stop::Stop::watch(abort.clone())?;
    let mut request = ScriptRequest::new(source, args.session.clone());
    request.abort = abort.clone();
    request.determinism = determinism;
    request.record = args.record.clone();
    request.replay = args.replay.clone();
    let pausing = installation
        .codemode()
        .cells()
        .is_some_and(|c| c.config().pause_approvals);
    let run = match pausing && request.record.is_none() && request.replay.is_none() {
        true => run_pausing(installation.codemode(), request, abort).await?,
        false => installation.codemode().run_script(request).await,
    };
    if args.verbose {
        print_trace(&run);
    }
    print_run(&run, args.json)?;
    installation.shutdown().await;
    if let Some(code) = stop.exit_code() {
        return Ok(ExitCode::from(code));
    }
    Ok(if run.is_error {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// With `approvals.when_nobody_can_answer: "pause"`, the script runs as a cell: a call that
/// needs approval waits (its id and the command that answers it go to stderr) until someone
/// answers with `codemode approvals` from another terminal, or the approval expires.
async fn run_pausing(
    codemode: &codemode_runtime::Codemode,
    request: ScriptRequest,
    abort: tokio_util::sync::CancellationToken,
) -> Result<codemode_runtime::ScriptRun> {
    let session = request.session_id.clone();
    let mut report = codemode.start_cell(request).await?;
    let mut told = std::collections::HashSet::new();
    loop {
        if let Some(run) = report.run.take() {
            return Ok(run);
        }
        for p in &report.pending {
            if told.insert(p.approval_id.clone()) {
                // A person decides on what this says: shown as `codemode approvals` shows it,
                // escaped and whole, whether or not standard error is a terminal, with the
                // paths the call really reaches (`approve` takes short arguments unhashed).
                let paths = match codemode_gate::shown_paths(&p.paths) {
                    p if p.is_empty() => String::new(),
                    p => format!("\nPaths it reaches (resolved, links followed):\n{p}"),
                };
                eprintln!(
                    "codemode: `{}` waits for approval ({}): {}{paths}\n  answer with: codemode approvals approve {} (or deny)",
                    codemode_gate::shown_text(&p.tool),
                    codemode_gate::shown_text(&p.reason),
                    codemode_gate::shown_arguments(&p.arguments),
                    codemode_gate::shown_text(&p.approval_id)
                );
            }
        }
        let wait = codemode_runtime::WaitOptions {
            timeout: Some(std::time::Duration::from_secs(3600)),
            terminate: false,
        };
        report = tokio::select! {
            r = codemode.wait_cell(&session, &report.cell, wait) => r?,
            _ = abort.cancelled() => {
                // A signal: end the cell here (its calls cancelled and audited), rather than
                // leave it for a later start to take over.
                let stop = codemode_runtime::WaitOptions {
                    timeout: Some(std::time::Duration::from_secs(10)),
                    terminate: true,
                };
                codemode.wait_cell(&session, &report.cell, stop).await?
            }
        };
    }
}

pub async fn demo(args: DemoArgs) -> Result<ExitCode> {
    let dir = tempfile::Builder::new()
        .prefix("codemode-demo-")
        .tempdir()
        .context("could not make a scratch directory for the demo")?;
    crate::demo::make_project(dir.path()).context("could not write the demo project")?;
    let setup_args = SetupArgs {
        workdir: Some(dir.path().to_path_buf()),
        ..Default::default()
    };
    let installation = setup::build(&setup_args, &LimitFlags::default()).await?;
    println!(
        "codemode demo: running this script in {}\n",
        dir.path().display()
    );
    for line in crate::demo::DEMO_SCRIPT.lines() {
        println!("  | {line}");
    }
    println!("\n--- what the model reads ---");
    let run = installation
        .codemode()
        .run_script(ScriptRequest::new(crate::demo::DEMO_SCRIPT, "demo"))
        .await;
    print_run(&run, args.json)?;
    println!("\n--- every call, as the gate saw it ---");
    let mut trace = Vec::new();
    print_trace_to(&run, &mut trace);
    super::tools::write_stdout(&crate::terminal::for_stdout(&String::from_utf8_lossy(
        &trace,
    )))?;
    installation.shutdown().await;
    if args.keep {
        let kept = dir.keep();
        println!("\nThe demo project is kept at {}", kept.display());
    }
    Ok(if run.is_error {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn determinism(args: &RunArgs) -> Option<Determinism> {
    if args.seed.is_none() && args.start_ms.is_none() && args.record.is_none() {
        return None;
    }
    Some(Determinism {
        seed: args.seed.unwrap_or(0),
        start_ms: args.start_ms.unwrap_or(0.0),
    })
}

fn read_source(file: Option<&PathBuf>) -> Result<String> {
    match file {
        None => anyhow::bail!(
            "no script given: name a file, or `-` to read the script from standard input"
        ),
        Some(p) if p.as_os_str() == "-" => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("could not read the script from standard input")?;
            Ok(s)
        }
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("could not read the script {}", p.display())),
    }
}

fn print_run(run: &ScriptRun, json: bool) -> Result<()> {
    let text = if json {
        serde_json::to_string(&run.structured())?
    } else {
        run.text.clone()
    };
    super::tools::write_stdout(&crate::terminal::for_stdout(&format!("{text}\n")))
}

fn print_trace(run: &ScriptRun) {
    let mut trace = Vec::new();
    print_trace_to(run, &mut trace);
    let trace = String::from_utf8_lossy(&trace);
    eprint!("{}", crate::terminal::for_stderr(&trace));
}

/// Every call as the gate saw it, one line each; the caller escapes it for a terminal.
fn print_trace_to(run: &ScriptRun, out: &mut dyn std::io::Write) {
    let structured = run.structured();
    let Some(calls) = structured.get("calls").and_then(|c| c.as_array()) else {
        return;
    };
    for call in calls {
        let field = |k: &str| {
            call.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string()
        };
        let policies = call
            .get("policyIds")
            .and_then(|p| p.as_array())
            .filter(|p| !p.is_empty())
            .map(|p| {
                let ids: Vec<&str> = p.iter().filter_map(|i| i.as_str()).collect();
                format!(" by {}", ids.join(", "))
            })
            .unwrap_or_default();
        let usage = call
            .get("usage")
            .filter(|u| !u.is_null())
            .map(|u| {
                format!(
                    " [{} in / {} out tokens, ${:.6}]",
                    u["inputTokens"],
                    u["outputTokens"],
                    u["costUsd"].as_f64().unwrap_or(0.0)
                )
            })
            .unwrap_or_default();
        let error = call
            .get("error")
            .and_then(|e| e.as_str())
            .map(|e| format!(" — {e}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "#{} {} {} {} (gate: {}{policies}) {:.2} ms{usage}{error}",
            call.get("id").map(|i| i.to_string()).unwrap_or_default(),
            field("name"),
            field("args"),
            field("status"),
            if field("decision").is_empty() {
                "-".to_string()
            } else {
                field("decision")
            },
            call.get("durationMs")
                .and_then(|d| d.as_f64())
                .unwrap_or(0.0),
        );
    }
}
