//! Command hooks in Claude Code's settings convention, run as real processes.
//!
//! Each command gets the event as JSON on stdin. Exit 0 with empty stdout allows; exit 2 blocks
//! with stderr as the reason. Exit 0 with a JSON object may allow (`{"decision":"approve"}`,
//! `hookSpecificOutput.permissionDecision: "allow"`), block (`{"decision":"block","reason":..}`,
//! `"continue": false`, `permissionDecision: "deny"`), ask (`permissionDecision: "ask"`) or
//! rewrite (`hookSpecificOutput.updatedInput`). Anything else blocks the call: another exit
//! code, output that is not a JSON object, unknown fields or fields of the wrong type, an
//! object with no decision, a timeout. A broken or misread guard must not become an open door.
//! A hook's processes form a group that is killed when the hook ends, times out, or its call is
//! cancelled.
//!
//! Where a command starts is part of what it runs: `./check.sh`, and `npx` looking for a local
//! install, find their program in the starting directory. So each command starts in its own
//! [`HookCommand::start_dir`], which the configuration sets to a directory the command's author
//! controls (your configuration directory for your hooks), never the project a hook guards
//! unless that project is trusted. The project comes to the hook as data instead: `cwd` and
//! `project_dir` in its input and `$CODEMODE_PROJECT_DIR`. Its environment is codemode's own
//! without secrets (`codemode_childenv`).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use codemode_spec::{BoxFuture, ToolOutput};
use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{AfterDecision, Hook, HookDecision, HookEvent};

const DEFAULT_TIMEOUT_SECS: u64 = 60;

/// The `hooks` settings object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookSettings {
    #[serde(rename = "PreToolUse", default)]
    pub pre_tool_use: Vec<HookMatcher>,
    #[serde(rename = "PostToolUse", default)]
    pub post_tool_use: Vec<HookMatcher>,
}

impl HookSettings {
    pub fn is_empty(&self) -> bool {
        self.pre_tool_use.is_empty() && self.post_tool_use.is_empty()
    }
}

/// Commands for tools whose name matches `matcher` (a regex over the whole name; empty or `*`
/// matches every tool).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookMatcher {
    #[serde(default)]
    pub matcher: String,
    pub hooks: Vec<HookCommand>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookCommand {
    /// Only `command` is supported.
    #[serde(rename = "type")]
    pub kind: String,
    pub command: String,
    /// Seconds; 60 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    /// Where the command starts: a directory whoever wrote the command controls. Not read from
    /// JSON: the configuration sets it from the file the hook came from. `None` starts it in the
    /// process's current directory.
    #[serde(skip)]
    pub start_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookConfigError {
    #[error("hook matcher `{matcher}` is not a valid regular expression: {message}")]
    BadMatcher { matcher: String, message: String },
    #[error("hook type `{0}` is not supported; use \"type\": \"command\"")]
    BadType(String),
}

#[derive(Clone)]
struct Compiled {
    matcher: Regex,
    /// The matcher with MCP tool names as codemode registers them, when it names one as its
    /// server spells it (`mcp__db__delete-all` for the registered `mcp__db__delete_all`).
    spelled: Option<Regex>,
    /// The matcher read as a glob, as tool rules are written.
    glob: Option<globset::GlobMatcher>,
    commands: Vec<HookCommand>,
}

/// Command hooks ready to run. Added to the gate with `GateBuilder::command_hooks`.
pub struct CommandHooks {
    pre: Vec<Compiled>,
    post: Vec<Compiled>,
    project_dir: Option<PathBuf>,
    /// Hook processes running at once, for every call together: a script's `Promise.all` of
    /// thousands of calls would otherwise start thousands of processes and run out of
    /// descriptors. The others wait their turn (their calls' cancellation still ends the wait).
    at_once: std::sync::Arc<tokio::sync::Semaphore>,
}

/// Hook processes one gate runs at once.
pub const MAX_HOOKS_AT_ONCE: usize = 16;

impl CommandHooks {
    pub fn new(settings: &HookSettings) -> Result<Self, HookConfigError> {
        Ok(CommandHooks {
            pre: compile(&settings.pre_tool_use)?,
            post: compile(&settings.post_tool_use)?,
            project_dir: None,
            at_once: std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_HOOKS_AT_ONCE)),
        })
    }

    /// The project the gate guards, told to every command (`cwd` and `project_dir` in its input,
    /// `$CODEMODE_PROJECT_DIR`). Commands do not start there unless their `start_dir` says so.
    pub fn with_project_dir(mut self, dir: PathBuf) -> Self {
        self.project_dir = Some(dir);
        self
    }

    /// One hook per command, in their order. The gate prepares a rewritten call again before
    /// the next hook sees it, so each command is told the paths the call will really touch;
    /// chained inside one hook, a command after a rewrite saw the paths of the old arguments.
    pub(crate) fn one_per_command(self) -> Vec<CommandHooks> {
        let single = |c: &Compiled, cmd: &HookCommand| Compiled {
            commands: vec![cmd.clone()],
            ..c.clone()
        };
        let hook = |pre: Vec<Compiled>, post: Vec<Compiled>| CommandHooks {
            pre,
            post,
            project_dir: self.project_dir.clone(),
            at_once: self.at_once.clone(),
        };
        let mut each = Vec::new();
        for c in &self.pre {
            for cmd in &c.commands {
                each.push(hook(vec![single(c, cmd)], Vec::new()));
            }
        }
        for c in &self.post {
            for cmd in &c.commands {
                each.push(hook(Vec::new(), vec![single(c, cmd)]));
            }
        }
        each
    }

    fn matching<'a>(list: &'a [Compiled], tool: &'a str) -> impl Iterator<Item = &'a HookCommand> {
        list.iter()
            .filter(move |c| {
                c.matcher.is_match(tool)
                    || c.spelled.as_ref().is_some_and(|r| r.is_match(tool))
                    || c.glob.as_ref().is_some_and(|g| g.is_match(tool))
            })
            .flat_map(|c| c.commands.iter())
    }
}

fn compile(list: &[HookMatcher]) -> Result<Vec<Compiled>, HookConfigError> {
    list.iter()
        .map(|m| {
            for h in &m.hooks {
                if h.kind != "command" {
                    return Err(HookConfigError::BadType(h.kind.clone()));
                }
            }
            let pattern = if m.matcher.is_empty() || m.matcher == "*" {
                ".*".to_string()
            } else {
                m.matcher.clone()
            };
            // Case-insensitive: settings written for other agents name tools `Write|Edit|Bash`,
            // and a blocking hook that silently matched nothing would fail open.
            let matcher = Regex::new(&format!("(?i)^(?:{pattern})$")).map_err(|e| {
                HookConfigError::BadMatcher {
                    matcher: m.matcher.clone(),
                    message: e.to_string(),
                }
            })?;
            // A blocking hook written with an MCP tool's name as its server spells it must not
            // silently match nothing (tool rules and policies read such names the same way).
            let spelled =
                mcp_spelling(&pattern).and_then(|p| Regex::new(&format!("(?i)^(?:{p})$")).ok());
            // Tool rules are globs, so `mcp__db__*` is written here too; read as a regex it
            // matches no real tool and a blocking hook never runs. A matcher also matches what
            // it matches read as a glob: a guard that matches more fails safe.
            let glob = globset::GlobBuilder::new(&m.matcher)
                .case_insensitive(true)
                .build()
                .ok()
                .filter(|_| !m.matcher.is_empty())
                .map(|g| g.compile_matcher());
            Ok(Compiled {
                matcher,
                spelled,
                glob,
                commands: m.hooks.clone(),
            })
        })
        .collect()
}

/// `pattern` with every literal character an MCP tool's registered name cannot hold (outside
/// letters, digits, `_` and regex syntax, and outside character classes) replaced by `_`, as
/// codemode registers those names; `None` when it names no MCP tool or nothing changes.
fn mcp_spelling(pattern: &str) -> Option<String> {
    if !pattern.to_ascii_lowercase().contains("mcp__") {
        return None;
    }
    let mut out = String::with_capacity(pattern.len());
    let (mut in_class, mut escaped) = (false, false);
    for c in pattern.chars() {
        let literal_outside = !in_class && !escaped;
        let keep = c.is_ascii_alphanumeric() || c == '_' || "\\.+*?()|[]{}^$".contains(c);
        out.push(if literal_outside && !keep { '_' } else { c });
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '[' => in_class = true,
            ']' => in_class = false,
            _ => {}
        }
    }
    (out != pattern).then_some(out)
}

fn event_json(
    name: &str,
    ev: &HookEvent,
    response: Option<&ToolOutput>,
    project_dir: Option<&PathBuf>,
) -> Value {
    let mut v = json!({
        "hook_event_name": name,
        "tool_name": ev.tool_name,
        "tool_input": ev.args,
        "session_id": ev.provenance.session_id,
        "paths": ev.paths,
        "model": ev.model,
        "provenance": ev.provenance,
    });
    if let Some(dir) = project_dir {
        let dir = Value::String(dir.display().to_string());
        v["cwd"] = dir.clone();
        v["project_dir"] = dir;
    }
    if let Some(out) = response {
        v["tool_response"] = out.value.clone();
        v["tool_response_is_error"] = Value::Bool(out.is_error);
    }
    v
}

/// How one command ended.
enum Outcome {
    Ok(String),
    Block(String),
    Failed(String),
}

/// Most bytes of a hook's stdout or stderr that are kept; a hook that writes more blocks the
/// call (its answer past the cut could say anything, "block" included).
const MAX_HOOK_OUTPUT: u64 = 1024 * 1024;

/// Kills a hook's whole process group when dropped: when the hook ends, times out, or the call
/// (or the script that made it) is cancelled and stops waiting for it.
struct GroupGuard(Option<i32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            // SAFETY: killpg only sends a signal; a group that is already gone returns ESRCH.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

/// The variable that names the project to a hook.
pub use codemode_childenv::PROJECT_DIR_VAR as PROJECT_DIR_ENV;

async fn run(
    cmd: &HookCommand,
    project_dir: Option<&PathBuf>,
    input: &Value,
    at_once: &tokio::sync::Semaphore,
) -> Outcome {
    let Ok(_turn) = at_once.acquire().await else {
        return Outcome::Failed("could not start: the hooks were shut down".to_string());
    };
    let secs = cmd.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS);
    let mut command = tokio::process::Command::new("sh");
    command
        .arg("-c")
        .arg(&cmd.command)
        .env_clear()
        .envs(codemode_childenv::vars())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so everything the hook started can be killed with it.
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = project_dir {
        command.env(PROJECT_DIR_ENV, dir);
    }
    if let Some(dir) = &cmd.start_dir {
        command.current_dir(dir);
    }
    // Like any program codemode starts, the hook cannot read the audit key or change the
    // configuration (see `codemode_childenv::confine_children`).
    if let Err(e) = codemode_childenv::confine(command.as_std_mut()) {
        return Outcome::Failed(format!("could not be confined: {e}"));
    }
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Outcome::Failed(format!(
                "could not start: {e}{}",
                codemode_childenv::start_failure_hint()
            ));
        }
    };
    if let Some(pid) = child.id() {
        codemode_childenv::started_confined(pid);
    }
    let _group = GroupGuard(child.id().and_then(|id| i32::try_from(id).ok()));
    if let Some(mut stdin) = child.stdin.take() {
        let bytes = serde_json::to_vec(input).unwrap_or_default();
        tokio::spawn(async move {
            // A hook that exits without reading its input is fine.
            let _ = stdin.write_all(&bytes).await;
        });
    }
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Outcome::Failed("could not be connected to".to_string());
    };
    let collect = async {
        // One byte past the limit is read to tell a full answer from a cut one.
        let read_all = |r: Box<dyn tokio::io::AsyncRead + Unpin + Send>| async move {
            let mut buf = Vec::new();
            let _ = r.take(MAX_HOOK_OUTPUT + 1).read_to_end(&mut buf).await;
            buf
        };
        let (out, err, status) = tokio::join!(
            read_all(Box::new(stdout)),
            read_all(Box::new(stderr)),
            child.wait()
        );
        (out, err, status)
    };
    let (stdout, stderr, status) = match tokio::time::timeout(Duration::from_secs(secs), collect)
        .await
    {
        Err(_) => {
            return Outcome::Failed(format!(
                "timed out after {secs} s and was killed; make it faster or raise its \"timeout\""
            ));
        }
        Ok((_, _, Err(e))) => return Outcome::Failed(format!("could not be waited for: {e}")),
        Ok((out, err, Ok(status))) => (out, err, status),
    };
    if stdout.len() as u64 > MAX_HOOK_OUTPUT {
        return Outcome::Failed(format!(
            "wrote more than {MAX_HOOK_OUTPUT} bytes to stdout, so its answer cannot be read whole; a hook answers with one short JSON object"
        ));
    }
    let stdout = String::from_utf8_lossy(&stdout).trim().to_string();
    let stderr = String::from_utf8_lossy(&stderr).trim().to_string();
    match status.code() {
        Some(0) => Outcome::Ok(stdout),
        Some(2) => Outcome::Block(if stderr.is_empty() {
            "blocked by a hook (exit 2, no reason given)".to_string()
        } else {
            crate::preview(&stderr, 1000)
        }),
        Some(code) => Outcome::Failed(format!(
            "exited with status {code}{}",
            if stderr.is_empty() {
                String::new()
            } else {
                format!(": {}", crate::preview(&stderr, 300))
            }
        )),
        None => Outcome::Failed("was killed by a signal".to_string()),
    }
}

/// A hook's JSON answer, as far as codemode understands one. Unknown fields and fields of the
/// wrong type make the answer invalid, which blocks: a guard whose answer is misread must not
/// become an open door.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Answer {
    #[serde(rename = "continue")]
    continue_: Option<bool>,
    stop_reason: Option<String>,
    // Accepted (and type-checked) for compatibility; they do not change the decision.
    #[allow(dead_code)]
    suppress_output: Option<bool>,
    #[allow(dead_code)]
    system_message: Option<String>,
    decision: Option<String>,
    reason: Option<String>,
    hook_specific_output: Option<Specific>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Specific {
    #[allow(dead_code)]
    hook_event_name: Option<String>,
    permission_decision: Option<String>,
    permission_decision_reason: Option<String>,
    updated_input: Option<Value>,
    updated_tool_output: Option<Value>,
    #[allow(dead_code)]
    additional_context: Option<String>,
}

fn parse_answer(stdout: &str) -> Result<Option<Answer>, String> {
    if stdout.is_empty() {
        return Ok(None);
    }
    let value: Value = serde_json::from_str(stdout).map_err(|e| {
        format!(
            "wrote output that is not JSON ({e}): {}",
            crate::preview(stdout, 200)
        )
    })?;
    if !value.is_object() {
        return Err(format!(
            "answered {}, which is not a JSON object; exit 0 with no output allows, {{\"decision\": \"block\"}} blocks",
            crate::preview(stdout, 100)
        ));
    }
    serde_json::from_value::<Answer>(value)
        .map(Some)
        .map_err(|e| {
            format!("answered JSON codemode does not recognise ({e}); exit 0 with no output allows")
        })
}

fn reason(a: &Answer) -> String {
    a.hook_specific_output
        .as_ref()
        .and_then(|s| s.permission_decision_reason.clone())
        .or_else(|| a.reason.clone())
        .or_else(|| a.stop_reason.clone())
        .unwrap_or_else(|| "no reason given".to_string())
}

/// Only recognised answers allow: no output, `"decision": "approve"`, or
/// `permissionDecision: "allow"` (possibly with `updatedInput`). Everything else blocks.
fn before_decision(stdout: &str) -> Result<HookDecision, String> {
    let Some(a) = parse_answer(stdout)? else {
        return Ok(HookDecision::Allow);
    };
    if a.continue_ == Some(false) {
        return Ok(HookDecision::Deny(reason(&a)));
    }
    let specific = a.hook_specific_output.as_ref();
    let permission = specific.and_then(|s| s.permission_decision.as_deref());
    match (a.decision.as_deref(), permission) {
        (Some("block" | "deny"), _) | (_, Some("deny")) => Ok(HookDecision::Deny(reason(&a))),
        (_, Some("ask")) => Ok(HookDecision::Ask(reason(&a))),
        (Some("approve" | "allow") | None, Some("allow") | None) => {
            match specific.and_then(|s| s.updated_input.clone()) {
                Some(updated) => Ok(HookDecision::Rewrite(updated)),
                None if a.decision.is_some() || permission.is_some() => Ok(HookDecision::Allow),
                None => Err(
                    "answered without a decision; exit 0 with no output allows, or say {\"decision\": \"approve\"}"
                        .to_string(),
                ),
            }
        }
        (Some(other), _) => Err(format!(
            "answered decision `{}`; use approve or block",
            crate::preview(other, 40)
        )),
        (_, Some(other)) => Err(format!(
            "answered permissionDecision `{}`; use allow, deny or ask",
            crate::preview(other, 40)
        )),
    }
}

/// After a call: no output keeps the result, `updatedToolOutput` replaces it, `"decision":
/// "approve"` keeps it; a block, or anything not recognised, withholds it.
fn after_decision(stdout: &str) -> Result<AfterDecision, String> {
    let Some(a) = parse_answer(stdout)? else {
        return Ok(AfterDecision::Keep);
    };
    if a.continue_ == Some(false) || matches!(a.decision.as_deref(), Some("block" | "deny")) {
        return Ok(AfterDecision::Block(reason(&a)));
    }
    if let Some(updated) = a
        .hook_specific_output
        .as_ref()
        .and_then(|s| s.updated_tool_output.clone())
    {
        return Ok(AfterDecision::Replace(ToolOutput::value(updated)));
    }
    match a.decision.as_deref() {
        Some("approve" | "allow") => Ok(AfterDecision::Keep),
        Some(other) => Err(format!(
            "answered decision `{}`; use approve or block",
            crate::preview(other, 40)
        )),
        None => {
            Err("answered without a decision; exit 0 with no output keeps the result".to_string())
        }
    }
}

impl Hook for CommandHooks {
    fn before<'a>(&'a self, ev: &'a HookEvent) -> BoxFuture<'a, HookDecision> {
        Box::pin(async move {
            let mut ev = ev.clone();
            let mut rewritten = None;
            for cmd in Self::matching(&self.pre, &ev.tool_name) {
                let input = event_json("PreToolUse", &ev, None, self.project_dir.as_ref());
                let decision =
                    match run(cmd, self.project_dir.as_ref(), &input, &self.at_once).await {
                        Outcome::Ok(stdout) => before_decision(&stdout)
                            .unwrap_or_else(|e| HookDecision::Deny(failed(cmd, &e))),
                        Outcome::Block(reason) => HookDecision::Deny(reason),
                        Outcome::Failed(e) => HookDecision::Deny(failed(cmd, &e)),
                    };
                let decision = match decision {
                    HookDecision::Deny(r) if !r.contains("hook `") => {
                        HookDecision::Deny(blocked_by(cmd, &r))
                    }
                    HookDecision::Ask(r) => HookDecision::Ask(blocked_by(cmd, &r)),
                    other => other,
                };
                match decision {
                    HookDecision::Allow => {}
                    HookDecision::Rewrite(args) => {
                        ev.args = args.clone();
                        rewritten = Some(args);
                    }
                    other => return other,
                }
            }
            rewritten.map_or(HookDecision::Allow, HookDecision::Rewrite)
        })
    }

    fn after<'a>(&'a self, ev: &'a HookEvent, out: &'a ToolOutput) -> BoxFuture<'a, AfterDecision> {
        Box::pin(async move {
            let mut current: Option<ToolOutput> = None;
            for cmd in Self::matching(&self.post, &ev.tool_name) {
                let input = event_json(
                    "PostToolUse",
                    ev,
                    Some(current.as_ref().unwrap_or(out)),
                    self.project_dir.as_ref(),
                );
                let decision =
                    match run(cmd, self.project_dir.as_ref(), &input, &self.at_once).await {
                        Outcome::Ok(stdout) => after_decision(&stdout)
                            .unwrap_or_else(|e| AfterDecision::Block(failed(cmd, &e))),
                        Outcome::Block(reason) => AfterDecision::Block(blocked_by(cmd, &reason)),
                        Outcome::Failed(e) => AfterDecision::Block(failed(cmd, &e)),
                    };
                let decision = match decision {
                    AfterDecision::Block(r) if !r.contains("hook `") => {
                        AfterDecision::Block(blocked_by(cmd, &r))
                    }
                    other => other,
                };
                match decision {
                    AfterDecision::Keep => {}
                    AfterDecision::Replace(o) => current = Some(o),
                    block => return block,
                }
            }
            current.map_or(AfterDecision::Keep, AfterDecision::Replace)
        })
    }
}

fn failed(cmd: &HookCommand, e: &str) -> String {
    format!(
        "hook `{}` failed, so the call is blocked: it {e}",
        crate::preview(&cmd.command, 80)
    )
}

/// A block a hook asked for, naming the hook.
fn blocked_by(cmd: &HookCommand, reason: &str) -> String {
    format!("{reason} (hook `{}`)", crate::preview(&cmd.command, 80))
}
