//! `codemode approvals list|show|approve|deny`: answering calls that paused for approval,
//! from a terminal on the machine whose state database they wait in.
//!
//! The answer goes into the state store (a compare-and-set bound to the call's hash), where
//! the process holding the cell sees it and carries on; this command writes the audit line
//! naming who answered through the `cli` channel.

use codemode_gate::{shown_arguments, shown_paths, shown_text};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use codemode_config::{ConfigPaths, Configuration, ProjectPaths, Sources};
use codemode_gate::{AuditKey, AuditLog};
use codemode_runtime::cells::answer_approval;
use codemode_runtime::codemode_state::{
    self, ApprovalQuery, ApprovalRecord, ApprovalState, Decision, StateStore, format_ms,
};
use serde_json::json;

use crate::SetupArgs;
use crate::setup::{LimitFlags, command_line, config_paths};

#[derive(Subcommand, Debug)]
pub enum ApprovalsCommand {
    /// List approvals: the pending ones, or all with --all.
    List {
        #[arg(long)]
        all: bool,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        setup: SetupArgs,
    },
    /// Show one approval: the call (tool and full arguments), the policy that asked, its cell.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        setup: SetupArgs,
    },
    /// Approve a paused call; its cell goes on.
    Approve(AnswerArgs),
    /// Deny a paused call; the script sees a refusal.
    Deny(AnswerArgs),
}

#[derive(Args, Debug)]
pub struct AnswerArgs {
    id: String,
    /// The call hash `show` printed: the answer then holds only for exactly that call.
    #[arg(long, value_name = "SHA256")]
    call_hash: Option<String>,
    /// Who answers, for the audit log (default: $USER).
    #[arg(long, value_name = "NAME")]
    by: Option<String>,
    #[command(flatten)]
    setup: SetupArgs,
}

pub async fn run(cmd: ApprovalsCommand) -> Result<ExitCode> {
    match cmd {
        ApprovalsCommand::List { all, json, setup } => {
            let (store, audit) = open(&setup).await?;
            codemode_runtime::cells::expire_in(store.as_ref(), &audit).await;
            let query = if all {
                ApprovalQuery::default()
            } else {
                ApprovalQuery::pending()
            };
            let list = store.list_approvals(query).await?;
            if json {
                for a in &list {
                    println!("{}", serde_json::to_string(a)?);
                }
            } else if list.is_empty() {
                println!("no {}approvals", if all { "" } else { "pending " });
            } else {
                for a in &list {
                    println!(
                        "{}  {:<8}  {}  {}  (expires {})",
                        a.id,
                        a.state.as_str(),
                        shown_text(&a.tool),
                        cut(&shown_arguments(&a.arguments), LISTED_ARGUMENTS),
                        format_ms(a.expires_at_ms)
                    );
                    // Whole, under the line: approving from this list must not hide where a
                    // linked path really lands.
                    if !a.paths.is_empty() {
                        println!("    Paths it reaches (resolved, links followed):");
                        for line in shown_paths(&a.paths).lines() {
                            println!("    {line}");
                        }
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ApprovalsCommand::Show { id, json, setup } => {
            let (store, audit) = open(&setup).await?;
            codemode_runtime::cells::expire_in(store.as_ref(), &audit).await;
            let a = store
                .get_approval(&id)
                .await?
                .ok_or(codemode_state::StateError::UnknownApproval { id: id.clone() })?;
            let cell = match &a.cell_id {
                Some(c) => store.get_cell(c).await?,
                None => None,
            };
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({
                        "approval": a,
                        "cell": cell.as_ref().map(|c| json!({"id": c.id, "status": c.status.as_str(), "owner": c.owner})),
                    }))?
                );
            } else {
                show(&a, cell.as_ref());
            }
            Ok(ExitCode::SUCCESS)
        }
        ApprovalsCommand::Approve(args) => answer(args, Decision::Approve).await,
        ApprovalsCommand::Deny(args) => answer(args, Decision::Deny).await,
    }
}

async fn answer(args: AnswerArgs, decision: Decision) -> Result<ExitCode> {
    let (store, audit) = open(&args.setup).await?;
    // An answer is an audited act: with no log to write it in, it is not given.
    if audit.describe().is_none() {
        bail!(
            "the answer was not given: no audit log is configured here, and every answer must be \
             audited; pass --audit FILE (the log the paused codemode writes) or set audit.path \
             in your settings"
        );
    }
    // `list` cuts long arguments: a person approving from it would approve what they did not
    // read (padding can push the dangerous part past the cut). Such an approval names the call
    // by the hash `show` prints beside the whole arguments.
    if decision == Decision::Approve
        && args.call_hash.is_none()
        && let Some(a) = store.get_approval(&args.id).await?
        && shown_arguments(&a.arguments).chars().count() > LISTED_ARGUMENTS
    {
        bail!(
            "not approved: the arguments of {} are longer than `codemode approvals list` shows; \
             read them whole with `codemode approvals show {}`, then approve with the \
             `--call-hash` it prints",
            a.id,
            a.id
        );
    }
    let by = args
        .by
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .filter(|b| !b.trim().is_empty())
        .unwrap_or_else(|| "cli-user".into());
    let a = answer_approval(
        store.as_ref(),
        &audit,
        &args.id,
        decision,
        &by,
        "cli",
        args.call_hash.as_deref(),
    )
    .await?;
    // Escaped as `list` shows them: the arguments are the script's.
    println!(
        "{} {}: `{}` with {}",
        a.state.as_str(),
        a.id,
        shown_text(&a.tool),
        cut(&shown_arguments(&a.arguments), 200)
    );
    if a.state == ApprovalState::Approved
        && let Some(cell) = &a.cell_id
    {
        println!("cell {cell} goes on in the codemode that holds it");
    }
    Ok(ExitCode::SUCCESS)
}

fn show(a: &ApprovalRecord, cell: Option<&codemode_state::CellRecord>) {
    println!("approval   {}", a.id);
    println!("state      {}", a.state.as_str());
    // The arguments and the reason come from the script and from hooks: shown escaped, so
    // no character in them reorders or recolours what the person reads.
    println!("tool       {}", shown_text(&a.tool));
    println!("arguments  {}", shown_arguments(&a.arguments));
    // Where the call really lands: `notes/x.txt` in the arguments may reach outside the
    // project through a link. Worded as the live question words it.
    if !a.paths.is_empty() {
        println!(
            "Paths it reaches (resolved, links followed):\n{}",
            shown_paths(&a.paths)
        );
    }
    println!("why        {}", shown_text(&a.reason));
    println!(
        "policies   {}",
        if a.policy_ids.is_empty() {
            "-".to_string()
        } else {
            a.policy_ids.join(", ")
        }
    );
    println!("session    {}", shown_text(&a.session_id));
    if let Some(c) = cell {
        println!(
            "cell       {} ({}, held by {})",
            c.id,
            c.status.as_str(),
            c.owner.as_deref().unwrap_or("nobody")
        );
    }
    println!("asked      {}", format_ms(a.created_at_ms));
    println!("expires    {}", format_ms(a.expires_at_ms));
    println!("call hash  {}", a.call_hash);
    if let (Some(by), Some(channel)) = (&a.answered_by, &a.answered_channel) {
        println!(
            "answered   by {} through {}",
            shown_text(by),
            shown_text(channel)
        );
    }
}

/// The state store and audit log the configuration names, without starting anything else.
async fn open(setup: &SetupArgs) -> Result<(std::sync::Arc<dyn StateStore>, AuditLog)> {
    let paths: ConfigPaths = config_paths(setup.config_dir.as_ref(), setup.state_dir.as_ref())?;
    let workdir = match &setup.workdir {
        Some(d) => d.clone(),
        None => std::env::current_dir().context("could not read the current directory")?,
    };
    let sources = Sources {
        project: Some(ProjectPaths::new(&workdir)),
        mcp_file: None,
        models_file: None,
        paths: paths.clone(),
    };
    let config = Configuration::load(
        &sources,
        &command_line(setup, &LimitFlags::default())?,
        &codemode_setup::builtin_limits(),
    )?;
    let url = &config.settings.durable.state_url;
    if let Ok(codemode_state::StateUrl::Sqlite(path)) = codemode_state::StateUrl::parse(url)
        && !path.exists()
    {
        bail!(
            "no state database at {} yet: nothing has paused there (codemode serve, or settings with approvals.when_nobody_can_answer: \"pause\", create it)",
            path.display()
        );
    }
    let store = codemode_state::open(url, Default::default()).await?;
    let key_path = paths.state_dir.join("audit.key");
    let audit = match (&config.settings.audit_stream, &config.settings.audit_path) {
        // Replicas on one shared store keep one audit stream in it: answers go there too, as
        // `codemode serve` writes them (same stream, same key).
        (Some(stream), _) if config.settings.state_url.is_some() => AuditLog::stream(
            store.clone(),
            stream.clone(),
            AuditKey::load_or_create(&key_path)?,
        )?,
        (_, Some(path)) => {
            let key = AuditKey::load_or_create(&key_path)?;
            AuditLog::open_with_key(path, key)?
        }
        _ => AuditLog::disabled(),
    };
    Ok((store, audit))
}

/// Characters of a call's arguments `list` shows.
const LISTED_ARGUMENTS: usize = 80;

fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push('…');
    out
}
