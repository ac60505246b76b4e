//! Command hooks in Claude Code's settings convention, run as real processes.
//!
//! Each command gets the event as JSON on stdin. Exit 0 with empty stdout allows; exit 2 blocks
//! with stderr as the reason; stdout JSON may block (`{"decision":"block","reason":..}`,
//! `hookSpecificOutput.permissionDecision` = deny/ask/allow) or rewrite
//! (`hookSpecificOutput.updatedInput`). Anything else (another exit code, output that is not
//! JSON, a timeout) blocks the call: a broken guard must not become an open door.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use codemode_spec::{BoxFuture, ToolOutput};
use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

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
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookConfigError {
    #[error("hook matcher `{matcher}` is not a valid regular expression: {message}")]
    BadMatcher { matcher: String, message: String },
    #[error("hook type `{0}` is not supported; use \"type\": \"command\"")]
    BadType(String),
}

struct Compiled {
    matcher: Regex,
    commands: Vec<HookCommand>,
}

/// Command hooks ready to run. Added to the gate with `GateBuilder::command_hooks`.
pub struct CommandHooks {
    pre: Vec<Compiled>,
    post: Vec<Compiled>,
    cwd: Option<PathBuf>,
}

impl CommandHooks {
    pub fn new(settings: &HookSettings) -> Result<Self, HookConfigError> {
        Ok(CommandHooks {
            pre: compile(&settings.pre_tool_use)?,
            post: compile(&settings.post_tool_use)?,
            cwd: None,
        })
    }

    /// Directory the commands run in (the project), instead of the current one.
    pub fn with_cwd(mut self, dir: PathBuf) -> Self {
        self.cwd = Some(dir);
        self
    }

    fn matching<'a>(list: &'a [Compiled], tool: &'a str) -> impl Iterator<Item = &'a HookCommand> {
        list.iter()
            .filter(move |c| c.matcher.is_match(tool))
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
            let matcher = Regex::new(&format!("^(?:{pattern})$")).map_err(|e| {
                HookConfigError::BadMatcher {
                    matcher: m.matcher.clone(),
                    message: e.to_string(),
                }
            })?;
            Ok(Compiled {
                matcher,
                commands: m.hooks.clone(),
            })
        })
        .collect()
}

fn event_json(name: &str, ev: &HookEvent, response: Option<&ToolOutput>) -> Value {
    let mut v = json!({
        "hook_event_name": name,
        "tool_name": ev.tool_name,
        "tool_input": ev.args,
        "session_id": ev.provenance.session_id,
        "paths": ev.paths,
        "model": ev.model,
        "provenance": ev.provenance,
    });
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

async fn run(cmd: &HookCommand, cwd: Option<&PathBuf>, input: &Value) -> Outcome {
    let secs = cmd.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS);
    let mut command = tokio::process::Command::new("sh");
    command
        .arg("-c")
        .arg(&cmd.command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a timeout kills everything the hook started.
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = cwd {
        command.current_dir(dir);
    }
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => return Outcome::Failed(format!("could not start: {e}")),
    };
    let pgid = child.id();
    if let Some(mut stdin) = child.stdin.take() {
        let bytes = serde_json::to_vec(input).unwrap_or_default();
        tokio::spawn(async move {
            // A hook that exits without reading its input is fine.
            let _ = stdin.write_all(&bytes).await;
        });
    }
    let result = tokio::time::timeout(Duration::from_secs(secs), child.wait_with_output()).await;
    if let Some(pgid) = pgid {
        kill_group(pgid);
    }
    let output = match result {
        Err(_) => {
            return Outcome::Failed(format!(
                "timed out after {secs} s and was killed; make it faster or raise its \"timeout\""
            ));
        }
        Ok(Err(e)) => return Outcome::Failed(format!("could not be waited for: {e}")),
        Ok(Ok(o)) => o,
    };
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    match output.status.code() {
        Some(0) => Outcome::Ok(stdout),
        Some(2) => Outcome::Block(if stderr.is_empty() {
            "blocked by a hook (exit 2, no reason given)".to_string()
        } else {
            stderr
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

fn kill_group(pgid: u32) {
    if let Ok(pgid) = i32::try_from(pgid) {
        // SAFETY: killpg only sends a signal; a group that is already gone returns ESRCH.
        unsafe {
            libc::killpg(pgid, libc::SIGKILL);
        }
    }
}

fn parse_stdout(stdout: &str) -> Result<Option<Value>, String> {
    if stdout.is_empty() {
        return Ok(None);
    }
    serde_json::from_str::<Value>(stdout)
        .map(Some)
        .map_err(|e| {
            format!(
                "wrote output that is not JSON ({e}): {}",
                crate::preview(stdout, 200)
            )
        })
}

fn reason_of(v: &Value, keys: &[&str]) -> String {
    keys.iter()
        .find_map(|k| v.pointer(k).and_then(Value::as_str))
        .unwrap_or("no reason given")
        .to_string()
}

fn before_decision(stdout: &str) -> Result<HookDecision, String> {
    let Some(v) = parse_stdout(stdout)? else {
        return Ok(HookDecision::Allow);
    };
    if v.get("continue") == Some(&Value::Bool(false)) {
        return Ok(HookDecision::Deny(reason_of(
            &v,
            &["/stopReason", "/reason"],
        )));
    }
    if v.get("decision").and_then(Value::as_str) == Some("block") {
        return Ok(HookDecision::Deny(reason_of(&v, &["/reason"])));
    }
    let specific = v.get("hookSpecificOutput");
    match specific
        .and_then(|s| s.get("permissionDecision"))
        .and_then(Value::as_str)
    {
        Some("deny") => {
            return Ok(HookDecision::Deny(reason_of(
                &v,
                &["/hookSpecificOutput/permissionDecisionReason", "/reason"],
            )));
        }
        Some("ask") => {
            return Ok(HookDecision::Ask(reason_of(
                &v,
                &["/hookSpecificOutput/permissionDecisionReason", "/reason"],
            )));
        }
        Some("allow") | None => {}
        Some(other) => {
            return Err(format!(
                "answered permissionDecision `{other}`; use allow, deny or ask"
            ));
        }
    }
    if let Some(updated) = specific.and_then(|s| s.get("updatedInput")) {
        return Ok(HookDecision::Rewrite(updated.clone()));
    }
    Ok(HookDecision::Allow)
}

fn after_decision(stdout: &str) -> Result<AfterDecision, String> {
    let Some(v) = parse_stdout(stdout)? else {
        return Ok(AfterDecision::Keep);
    };
    if v.get("decision").and_then(Value::as_str) == Some("block")
        || v.get("continue") == Some(&Value::Bool(false))
    {
        return Ok(AfterDecision::Block(reason_of(
            &v,
            &["/reason", "/stopReason"],
        )));
    }
    if let Some(updated) = v.pointer("/hookSpecificOutput/updatedToolOutput") {
        return Ok(AfterDecision::Replace(ToolOutput::value(updated.clone())));
    }
    Ok(AfterDecision::Keep)
}

impl Hook for CommandHooks {
    fn before<'a>(&'a self, ev: &'a HookEvent) -> BoxFuture<'a, HookDecision> {
        Box::pin(async move {
            let mut ev = ev.clone();
            let mut rewritten = None;
            for cmd in Self::matching(&self.pre, &ev.tool_name) {
                let input = event_json("PreToolUse", &ev, None);
                let decision = match run(cmd, self.cwd.as_ref(), &input).await {
                    Outcome::Ok(stdout) => before_decision(&stdout)
                        .unwrap_or_else(|e| HookDecision::Deny(failed(cmd, &e))),
                    Outcome::Block(reason) => HookDecision::Deny(reason),
                    Outcome::Failed(e) => HookDecision::Deny(failed(cmd, &e)),
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
                let input = event_json("PostToolUse", ev, Some(current.as_ref().unwrap_or(out)));
                let decision = match run(cmd, self.cwd.as_ref(), &input).await {
                    Outcome::Ok(stdout) => after_decision(&stdout)
                        .unwrap_or_else(|e| AfterDecision::Block(failed(cmd, &e))),
                    Outcome::Block(reason) => AfterDecision::Block(reason),
                    Outcome::Failed(e) => AfterDecision::Block(failed(cmd, &e)),
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
