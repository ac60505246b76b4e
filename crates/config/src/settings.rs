//! `settings.json`: its types, reading one file, and joining the user's and the project's.
//!
//! Unknown keys are errors, so a typo never silently drops a restriction. Each top-level section
//! is read on its own, so that a file with several mistakes reports all of them at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use codemode_spec::{CodemodeMode, Exposure};
use globset::Glob;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Problems;
use crate::narrow::Narrowing;
use crate::paths::relative_to_file;
use crate::{ConfigError, Problem};

/// Sandbox and gate limits, as plain numbers. `None` means "not set here".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// QuickJS heap of one script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_bytes: Option<u64>,
    /// Wall deadline of one script (approval waits do not count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    /// Budget of the text the model reads back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    /// Output a script may produce (`text()`, `console.*`, image data), counted per character.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// Calls one script may make.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls_in_flight: Option<u64>,
    /// How deeply calls may nest: the gate refuses a call whose provenance depth is greater
    /// (a model's call has depth 0, a script's calls depth 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<u64>,
}

impl Limits {
    /// Every key, in file order.
    pub const KEYS: [&'static str; 9] = [
        "heap_bytes",
        "stack_bytes",
        "timeout_ms",
        "cpu_ms",
        "max_output_tokens",
        "max_output_bytes",
        "max_calls",
        "max_calls_in_flight",
        "max_depth",
    ];

    fn slot(&mut self, key: &str) -> Option<&mut Option<u64>> {
        Some(match key {
            "heap_bytes" => &mut self.heap_bytes,
            "stack_bytes" => &mut self.stack_bytes,
            "timeout_ms" => &mut self.timeout_ms,
            "cpu_ms" => &mut self.cpu_ms,
            "max_output_tokens" => &mut self.max_output_tokens,
            "max_output_bytes" => &mut self.max_output_bytes,
            "max_calls" => &mut self.max_calls,
            "max_calls_in_flight" => &mut self.max_calls_in_flight,
            "max_depth" => &mut self.max_depth,
            _ => return None,
        })
    }

    /// The value of `key` (one of [`Limits::KEYS`]).
    pub fn get(&self, key: &str) -> Option<u64> {
        let mut copy = *self;
        copy.slot(key).and_then(|v| *v)
    }

    /// Sets `key` (one of [`Limits::KEYS`]); other names are ignored.
    pub fn set(&mut self, key: &str, value: Option<u64>) {
        if let Some(slot) = self.slot(key) {
            *slot = value;
        }
    }

    /// Each key of `self`, or of `fallback` where `self` has none.
    pub fn or(&self, fallback: &Limits) -> Limits {
        let mut out = *self;
        for key in Self::KEYS {
            if out.get(key).is_none() {
                out.set(key, fallback.get(key));
            }
        }
        out
    }
}

/// Limits for one scope of the gate's budgets. `None` means unlimited.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_calls: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

/// Budgets for each script and for each session; per principal and per team for each UTC day
/// (those need a shared `state.url` to mean anything across replicas).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budgets {
    #[serde(default)]
    pub script: BudgetLimits,
    #[serde(default)]
    pub session: BudgetLimits,
    #[serde(default)]
    pub principal: BudgetLimits,
    #[serde(default)]
    pub team: BudgetLimits,
}

/// The `state` object: where durable state lives (`memory:`, `sqlite:///path`,
/// `postgres://…`). Only your settings file may set it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The audit stream's name when the audit log is kept in the state store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_stream: Option<String>,
}

/// The `telemetry` object: OpenTelemetry traces and metrics, all off by default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    /// An OTLP/HTTP endpoint (`http://collector:4318`): traces and metrics are exported there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// Serve Prometheus metrics at `/metrics` on the HTTP listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<bool>,
    /// Put calls' arguments on their spans (they may hold secrets; off by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_arguments: Option<bool>,
}

/// The `hooks` object, in the `PreToolUse`/`PostToolUse` convention.
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

/// Commands for the tools whose name matches `matcher` (a regular expression over the whole
/// name; empty or `*` matches every tool).
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
    /// Where the command starts, set when the files are merged (never written in a file): the
    /// directory of your settings file for your hooks, the project for a trusted project's. A
    /// project never chooses the program one of your hooks runs.
    #[serde(skip)]
    pub start_dir: Option<PathBuf>,
}

/// A rule for a tool name or glob pattern (`mcp__github__*`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposure: Option<Exposure>,
    /// `true` hides the tool from everybody.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
}

/// The `models` object: whether scripts may use models, and which.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRules {
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `provider/id` names; absent means every model of the catalog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSettings {
    /// Relative paths: against the state directory in your file, against `.codemode/` in a
    /// trusted project's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
}

/// The `environment` object: what the programs codemode starts (`bash`, command hooks, stdio
/// MCP servers) inherit. They get codemode's environment without its secrets (see
/// `codemode_childenv`); `pass` names variables they get anyway. `confine: false` starts them
/// without the confinement that keeps codemode's configuration read-only and its audit key
/// hidden from them (for programs that need `sudo`); a project may only turn it on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentSettings {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pass: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confine: Option<bool>,
}

/// One settings file as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SettingsFile {
    pub limits: Limits,
    pub mode: Option<CodemodeMode>,
    pub budgets: Budgets,
    pub hooks: HookSettings,
    /// Cedar policy files, relative to the directory of the file that lists them.
    pub policy: Vec<PathBuf>,
    pub tools: BTreeMap<String, ToolRule>,
    pub models: ModelRules,
    pub audit: AuditSettings,
    pub state: StateSettings,
    pub approvals: crate::durable::ApprovalSettings,
    pub cells: crate::durable::CellSettings,
    pub telemetry: TelemetrySettings,
    pub environment: EnvironmentSettings,
}

const SECTIONS: [&str; 13] = [
    "limits",
    "mode",
    "budgets",
    "hooks",
    "policy",
    "tools",
    "models",
    "audit",
    "state",
    "approvals",
    "cells",
    "telemetry",
    "environment",
];

impl SettingsFile {
    /// Reads one file; a missing file is `None`.
    pub fn read(path: &Path) -> Result<Option<SettingsFile>, ConfigError> {
        match crate::jsonc::read(path)? {
            Some(v) => Self::from_value(&path.display().to_string(), &v).map(Some),
            None => Ok(None),
        }
    }

    /// Parses JSON (comments and trailing commas allowed); `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<SettingsFile, ConfigError> {
        Self::from_value(file, &crate::jsonc::parse(file, text)?)
    }

    pub fn from_value(file: &str, value: &Value) -> Result<SettingsFile, ConfigError> {
        let Some(root) = value.as_object() else {
            return Err(Problem::new(
                file,
                "",
                "expected a JSON object such as {\"limits\": {\"timeout_ms\": 30000}}",
            )
            .into());
        };
        let mut problems = Problems::default();
        let mut s = SettingsFile::default();
        for (key, v) in root {
            match key.as_str() {
                "limits" => section(file, key, v, &mut problems, &mut s.limits),
                "mode" => section(file, key, v, &mut problems, &mut s.mode),
                "budgets" => section(file, key, v, &mut problems, &mut s.budgets),
                "hooks" => section(file, key, v, &mut problems, &mut s.hooks),
                "policy" => section(file, key, v, &mut problems, &mut s.policy),
                "tools" => section(file, key, v, &mut problems, &mut s.tools),
                "models" => section(file, key, v, &mut problems, &mut s.models),
                "audit" => section(file, key, v, &mut problems, &mut s.audit),
                "state" => section(file, key, v, &mut problems, &mut s.state),
                "approvals" => section(file, key, v, &mut problems, &mut s.approvals),
                "cells" => section(file, key, v, &mut problems, &mut s.cells),
                "telemetry" => section(file, key, v, &mut problems, &mut s.telemetry),
                "environment" => section(file, key, v, &mut problems, &mut s.environment),
                other => problems.push(Problem::new(
                    file,
                    other,
                    format!("unknown key; a settings file has {}", SECTIONS.join(", ")),
                )),
            }
        }
        for pattern in s.tools.keys() {
            if let Err(e) = Glob::new(pattern) {
                problems.push(Problem::new(
                    file,
                    format!("tools.{pattern}"),
                    format!("not a valid tool name or glob pattern: {e}"),
                ));
            }
        }
        check_hooks(file, &s.hooks, &mut problems);
        for (key, least, what) in [
            ("heap_bytes", 1024 * 1024, "1 MiB"),
            ("stack_bytes", 64 * 1024, "64 KiB"),
        ] {
            if s.limits.get(key).is_some_and(|v| v > 0 && v < least) {
                problems.push(Problem::new(
                    file,
                    format!("limits.{key}"),
                    format!("the sandbox needs at least {what} ({least}); raise it"),
                ));
            }
        }
        for key in Limits::KEYS {
            if s.limits.get(key) == Some(0) && key != "max_depth" {
                problems.push(Problem::new(
                    file,
                    format!("limits.{key}"),
                    "0 would stop every script; give a positive number, or remove the key for the default",
                ));
            }
        }
        problems.into_result(s)
    }
}

/// Deserializes one section, recording a problem that names the full key on failure.
fn section<T: DeserializeOwned>(
    file: &str,
    key: &str,
    value: &Value,
    problems: &mut Problems,
    out: &mut T,
) {
    match serde_path_to_error::deserialize::<_, T>(value.clone()) {
        Ok(v) => *out = v,
        Err(e) => {
            let inner = e.path().to_string();
            let at = if inner == "." || inner.is_empty() {
                key.to_string()
            } else {
                format!("{key}.{inner}")
            };
            problems.push(Problem::new(file, at, e.into_inner().to_string()));
        }
    }
}

fn check_hooks(file: &str, hooks: &HookSettings, problems: &mut Problems) {
    for (event, list) in [
        ("PreToolUse", &hooks.pre_tool_use),
        ("PostToolUse", &hooks.post_tool_use),
    ] {
        for (i, m) in list.iter().enumerate() {
            let at = format!("hooks.{event}[{i}]");
            if !(m.matcher.is_empty() || m.matcher == "*")
                && let Err(e) = regex::Regex::new(&format!("^(?:{})$", m.matcher))
            {
                problems.push(Problem::new(
                    file,
                    format!("{at}.matcher"),
                    format!("not a valid regular expression: {e}"),
                ));
            }
            for (j, h) in m.hooks.iter().enumerate() {
                if h.kind != "command" {
                    problems.push(Problem::new(
                        file,
                        format!("{at}.hooks[{j}].type"),
                        format!("hook type {:?} is not supported; use \"command\"", h.kind),
                    ));
                }
                if h.command.trim().is_empty() {
                    problems.push(Problem::new(
                        file,
                        format!("{at}.hooks[{j}].command"),
                        "empty; give the command to run",
                    ));
                }
                if h.timeout == Some(0) {
                    problems.push(Problem::new(
                        file,
                        format!("{at}.hooks[{j}].timeout"),
                        "0 seconds would block every call; give a positive number of seconds",
                    ));
                }
            }
        }
    }
}

/// A Cedar policy file's text and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySource {
    /// The file's path, naming it in errors and policy ids.
    pub name: String,
    pub text: String,
    /// From an untrusted project: only its `forbid` policies apply.
    pub forbids_only: bool,
}

/// Which policies apply: the built-in ones unless you (or a trusted project) listed files,
/// then every listed file in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policies {
    pub use_builtin: bool,
    pub sources: Vec<PolicySource>,
}

/// Why a tool ended up hidden, for listings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolVerdict {
    pub exposure: Exposure,
    /// When hidden by a rule: which rule, in words (`disabled in settings.json (tools.bash)`).
    pub hidden_by: Option<String>,
}

/// The `tools` rules of both files. They apply to tools as they are registered, so they are
/// kept as rules rather than applied once.
#[derive(Debug, Clone, Default)]
pub struct ToolRules {
    user: BTreeMap<String, ToolRule>,
    user_source: String,
    project: BTreeMap<String, ToolRule>,
    project_source: String,
    trusted: bool,
}

fn matches(pattern: &str, name: &str) -> bool {
    // Case-insensitive: settings written for other agents name tools `Bash` and `Write`, and a
    // rule that disables a tool must not silently match nothing.
    let glob = |p: &str| {
        p.eq_ignore_ascii_case(name)
            || globset::GlobBuilder::new(p)
                .case_insensitive(true)
                .build()
                .map(|g| g.compile_matcher().is_match(name))
                .unwrap_or(false)
    };
    if glob(pattern) {
        return true;
    }
    // An MCP tool is registered with every character other than letters, digits and `_`
    // replaced by `_`; a rule written with the name as its server spells it
    // (`mcp__db__delete-all`) means that tool, and must not silently match nothing.
    let spelled = mcp_spelling(pattern);
    spelled != pattern && glob(&spelled)
}

/// `pattern` with the characters MCP tool names cannot hold replaced as they are in those
/// names, keeping glob syntax; unchanged unless it is an MCP pattern (`mcp__…`).
fn mcp_spelling(pattern: &str) -> std::borrow::Cow<'_, str> {
    if !pattern.starts_with("mcp__") {
        return pattern.into();
    }
    let keep = |c: char| c.is_ascii_alphanumeric() || "_*?[]{}!,\\".contains(c);
    if pattern.chars().all(keep) {
        return pattern.into();
    }
    pattern
        .chars()
        .map(|c| if keep(c) { c } else { '_' })
        .collect::<String>()
        .into()
}

impl ToolRules {
    pub fn is_empty(&self) -> bool {
        self.user.is_empty() && self.project.is_empty()
    }

    /// The exposure of the tool `name`, which its source declared as `declared`. Your rules
    /// apply first, then the project's (which may only lower visibility unless trusted). A tool
    /// its source declared hidden stays hidden whatever a rule says. Ignored project rules are
    /// recorded in `warnings`.
    pub fn decide(
        &self,
        name: &str,
        declared: Exposure,
        warnings: &mut Vec<String>,
    ) -> ToolVerdict {
        if declared == Exposure::Hidden {
            return ToolVerdict {
                exposure: Exposure::Hidden,
                hidden_by: None,
            };
        }
        let mut exposure = declared;
        let mut hidden_by = None;
        let hide = |why: String, hidden_by: &mut Option<String>| *hidden_by = Some(why);
        for (pattern, rule) in &self.user {
            if !matches(pattern, name) {
                continue;
            }
            if let Some(e) = rule.exposure {
                exposure = e;
                if e == Exposure::Hidden {
                    hide(
                        format!("exposure hidden in {} (tools.{pattern})", self.user_source),
                        &mut hidden_by,
                    );
                } else {
                    hidden_by = None;
                }
            }
            if rule.disabled == Some(true) {
                exposure = Exposure::Hidden;
                hide(
                    format!("disabled in {} (tools.{pattern})", self.user_source),
                    &mut hidden_by,
                );
            }
        }
        let mut n = Narrowing::new(self.project_source.clone(), self.trusted);
        for (pattern, rule) in &self.project {
            if !matches(pattern, name) {
                continue;
            }
            match rule.disabled {
                Some(true) => {
                    exposure = Exposure::Hidden;
                    hide(
                        format!("disabled in {} (tools.{pattern})", self.project_source),
                        &mut hidden_by,
                    );
                }
                Some(false)
                    if exposure == Exposure::Hidden
                        && n.only_if_trusted(
                            &format!("tools.{pattern}.disabled"),
                            "you disabled or hid this tool",
                        ) =>
                {
                    exposure = declared;
                    hidden_by = None;
                }
                _ => {}
            }
            if rule.exposure.is_some() {
                let before = exposure;
                exposure = n.visibility(
                    &format!("tools.{pattern}.exposure"),
                    exposure,
                    rule.exposure,
                );
                if exposure == Exposure::Hidden && before != Exposure::Hidden {
                    hide(
                        format!(
                            "exposure hidden in {} (tools.{pattern})",
                            self.project_source
                        ),
                        &mut hidden_by,
                    );
                } else if exposure != Exposure::Hidden {
                    hidden_by = None;
                }
            }
        }
        warnings.extend(n.into_warnings());
        ToolVerdict {
            exposure,
            hidden_by,
        }
    }
}

/// Both settings files joined by the narrowing rule, with the command line's choices applied.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Every limit: the minimum of the built-in default (or your value, when you set one), the
    /// project's and the command line's. `None` only for limits that are unlimited by default.
    pub limits: Limits,
    /// `None` when no file and no flag chose a mode.
    pub mode: Option<CodemodeMode>,
    pub budgets: Budgets,
    pub hooks: HookSettings,
    pub tools: ToolRules,
    pub models: ModelRules,
    pub audit_path: Option<PathBuf>,
    pub policies: Policies,
    /// Durable state, paused approvals and cells.
    pub durable: crate::durable::Durable,
    /// `state.url` as set (yours or the command line's; a project's is ignored with a warning).
    /// Set, budgets are kept in that store too, shared by every process that uses it; unset,
    /// cells keep state in `durable.state_url` (an SQLite file) and budgets stay in memory.
    pub state_url: Option<String>,
    /// `state.audit_stream`: with a state URL, the audit log is this stream in it.
    pub audit_stream: Option<String>,
    /// Yours only: a project cannot send your calls' traces elsewhere.
    pub telemetry: TelemetrySettings,
    /// Variables the programs codemode starts get although they look like secrets: yours, and a
    /// trusted project's.
    pub pass_env: Vec<String>,
    /// Whether the programs codemode starts are confined (`environment.confine`, default on).
    pub confine_children: bool,
}

/// Where each file is, for the merge.
pub(crate) struct SettingsInputs<'a> {
    /// Your settings file, read or not: named in messages, and the base of relative paths.
    pub user_file: PathBuf,
    pub user: Option<SettingsFile>,
    pub project: Option<(SettingsFile, PathBuf)>,
    pub trusted: bool,
    pub state_dir: &'a Path,
    pub builtin_limits: &'a Limits,
}

/// What the operator chose on the command line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CommandLine {
    /// Policy files that replace yours (never a project's forbids).
    pub policy_files: Vec<PathBuf>,
    pub audit_path: Option<PathBuf>,
    pub mode: Option<CodemodeMode>,
    /// May only lower the limits of the files (and the built-in defaults).
    pub limits: Limits,
    /// `--state URL`: replaces `state.url` of the files.
    pub state_url: Option<String>,
}

impl Settings {
    /// Joins the files. Reads the policy files they list; problems are collected.
    pub(crate) fn merge(
        input: SettingsInputs<'_>,
        cli: &CommandLine,
        warnings: &mut Vec<String>,
        problems: &mut Problems,
    ) -> Settings {
        let u = input.user.clone().unwrap_or_default();
        let user_file = input.user_file.clone();
        let user_name = user_file.display().to_string();
        let (p, project_file) = input
            .project
            .clone()
            .unwrap_or_else(|| (SettingsFile::default(), PathBuf::new()));
        let project_name = project_file.display().to_string();
        let trusted = input.trusted;
        let mut n = Narrowing::new(project_name.clone(), trusted);

        // The built-in defaults are your values where you set none: a project may only go below.
        let mut limits = Limits::default();
        let yours = u.limits.or(input.builtin_limits);
        for key in Limits::KEYS {
            let merged = n.limit(&format!("limits.{key}"), yours.get(key), p.limits.get(key));
            limits.set(key, merged);
        }
        for key in Limits::KEYS {
            if let Some(asked) = cli.limits.get(key) {
                match limits.get(key) {
                    Some(current) if asked > current => warnings.push(format!(
                        "the command line asks for {key} = {asked}, above the limit of {current} from the settings or the built-in default, so {current} applies; raise `limits.{key}` in {user_name} to allow more"
                    )),
                    _ => limits.set(key, Some(asked)),
                }
            }
        }

        // `only` declares less to the model than `on`, so it is the narrower mode; but any mode
        // turns code mode on, so where you set none a project's is a widening.
        let mode = n.narrow("mode", u.mode, p.mode, |p, u| {
            u.is_some() && *p == CodemodeMode::Only
        });
        let mode = cli.mode.or(mode);
        let budgets = Budgets {
            script: narrow_budget(
                &mut n,
                "budgets.script",
                &u.budgets.script,
                &p.budgets.script,
            ),
            session: narrow_budget(
                &mut n,
                "budgets.session",
                &u.budgets.session,
                &p.budgets.session,
            ),
            principal: narrow_budget(
                &mut n,
                "budgets.principal",
                &u.budgets.principal,
                &p.budgets.principal,
            ),
            team: narrow_budget(&mut n, "budgets.team", &u.budgets.team, &p.budgets.team),
        };
        let state_url = cli
            .state_url
            .clone()
            .or_else(|| n.user_only("state.url", u.state.url.clone(), p.state.url.clone()));
        let audit_stream = n.user_only(
            "state.audit_stream",
            u.state.audit_stream.clone(),
            p.state.audit_stream.clone(),
        );
        let telemetry = if p.telemetry == TelemetrySettings::default() {
            u.telemetry.clone()
        } else {
            n.user_only(
                "telemetry",
                Some(u.telemetry.clone()),
                Some(p.telemetry.clone()),
            )
            .unwrap_or_default()
        };

        // Your hooks start in your configuration directory, so `./check.sh` is yours; a
        // trusted project's start in the project.
        let mut hooks = started_in(&u.hooks, user_file.parent());
        if !p.hooks.is_empty()
            && n.only_if_trusted(
                "hooks",
                "hooks run commands, which only you or a trusted project may add",
            )
        {
            let project_dir = project_file.parent().and_then(Path::parent);
            let theirs = started_in(&p.hooks, project_dir);
            hooks.pre_tool_use.extend(theirs.pre_tool_use);
            hooks.post_tool_use.extend(theirs.post_tool_use);
        }
        let mut pass_env = u.environment.pass.clone();
        if !p.environment.pass.is_empty()
            && n.only_if_trusted(
                "environment.pass",
                "it would hand your secrets to the programs codemode starts",
            )
        {
            pass_env.extend(p.environment.pass.iter().cloned());
        }

        let confine_children = n
            .narrow(
                "environment.confine",
                u.environment.confine,
                p.environment.confine,
                |p, _| *p,
            )
            .unwrap_or(true);

        let models = ModelRules {
            enabled: n.switch_off("models.enabled", u.models.enabled, p.models.enabled, true),
            allow: n.allowlist(
                "models.allow",
                u.models.allow.clone(),
                p.models.allow.clone(),
            ),
        };
        let user_audit = u.audit.path.as_ref().map(|a| input.state_dir.join(a));
        let project_audit = p
            .audit
            .path
            .as_ref()
            .map(|a| relative_to_file(&project_file, a));
        let audit_path = cli
            .audit_path
            .clone()
            .or_else(|| n.user_only("audit.path", user_audit, project_audit));

        let policies = policies(&u, &user_file, &p, &project_file, trusted, cli, problems);
        let durable = crate::durable::merge(
            &mut n,
            input.state_dir,
            state_url.as_deref(),
            &u.approvals,
            &p.approvals,
            &u.cells,
            &p.cells,
        );

        warnings.extend(n.into_warnings());
        Settings {
            limits,
            mode,
            budgets,
            hooks,
            tools: ToolRules {
                user: u.tools,
                user_source: user_name,
                project: p.tools,
                project_source: project_name,
                trusted,
            },
            models,
            audit_path,
            policies,
            durable,
            state_url,
            audit_stream,
            telemetry,
            pass_env,
            confine_children,
        }
    }
}

/// `hooks` with every command starting in `dir`.
fn started_in(hooks: &HookSettings, dir: Option<&Path>) -> HookSettings {
    let list = |l: &[HookMatcher]| {
        l.iter()
            .map(|m| HookMatcher {
                matcher: m.matcher.clone(),
                hooks: m
                    .hooks
                    .iter()
                    .map(|c| HookCommand {
                        start_dir: dir.and_then(|d| std::path::absolute(d).ok()),
                        ..c.clone()
                    })
                    .collect(),
            })
            .collect()
    };
    HookSettings {
        pre_tool_use: list(&hooks.pre_tool_use),
        post_tool_use: list(&hooks.post_tool_use),
    }
}

/// Your policy files (or the command line's, which replace them), then the project's: only its
/// forbids unless trusted. Each path resolves against the directory of the file listing it.
fn policies(
    u: &SettingsFile,
    user_file: &Path,
    p: &SettingsFile,
    project_file: &Path,
    trusted: bool,
    cli: &CommandLine,
    problems: &mut Problems,
) -> Policies {
    let user_name = user_file.display().to_string();
    let project_name = project_file.display().to_string();
    let mut listed: Vec<(PathBuf, String, String, bool)> = Vec::new();
    if cli.policy_files.is_empty() {
        for (i, path) in u.policy.iter().enumerate() {
            listed.push((
                relative_to_file(user_file, path),
                user_name.clone(),
                format!("policy[{i}]"),
                false,
            ));
        }
    } else {
        for path in &cli.policy_files {
            listed.push((path.clone(), "--policy".into(), String::new(), false));
        }
    }
    for (i, path) in p.policy.iter().enumerate() {
        listed.push((
            relative_to_file(project_file, path),
            project_name.clone(),
            format!("policy[{i}]"),
            !trusted,
        ));
    }
    let use_builtin = !listed.iter().any(|(.., forbids_only)| !forbids_only);
    // A file listed again adds nothing; a project listing thousands of files (or one file
    // thousands of times) must not make set-up read gigabytes.
    let mut seen = std::collections::HashSet::new();
    listed.retain(|(path, _, _, forbids_only)| seen.insert((path.clone(), *forbids_only)));
    if listed.len() > MAX_POLICY_FILES {
        problems.push(Problem::new(
            listed[MAX_POLICY_FILES].1.clone(),
            "policy",
            format!(
                "{} policy files are listed in all; at most {MAX_POLICY_FILES} are read. Put the policies in fewer files",
                listed.len()
            ),
        ));
        listed.truncate(MAX_POLICY_FILES);
    }
    let mut sources = Vec::new();
    let mut total = 0usize;
    for (path, listed_by, key, forbids_only) in listed {
        match crate::jsonc::read_text(&path, &listed_by, &key) {
            Ok(text) => {
                total += text.len();
                if total > MAX_POLICY_BYTES {
                    problems.push(Problem::new(
                        listed_by,
                        key,
                        format!(
                            "the policy files listed come to more than {MAX_POLICY_BYTES} bytes together; {} is not read. Keep policies shorter",
                            path.display()
                        ),
                    ));
                    break;
                }
                sources.push(PolicySource {
                    name: path.display().to_string(),
                    text,
                    forbids_only,
                });
            }
            Err(problem) => problems.push(problem),
        }
    }
    Policies {
        use_builtin,
        sources,
    }
}

/// Most policy files read, user's and project's together.
const MAX_POLICY_FILES: usize = 64;

/// Most bytes of policy text read, all files together.
const MAX_POLICY_BYTES: usize = 16 * 1024 * 1024;

fn narrow_budget(
    n: &mut Narrowing,
    scope: &str,
    u: &BudgetLimits,
    p: &BudgetLimits,
) -> BudgetLimits {
    BudgetLimits {
        max_calls: n.limit(&format!("{scope}.max_calls"), u.max_calls, p.max_calls),
        max_model_calls: n.limit(
            &format!("{scope}.max_model_calls"),
            u.max_model_calls,
            p.max_model_calls,
        ),
        max_tokens: n.limit(&format!("{scope}.max_tokens"), u.max_tokens, p.max_tokens),
        max_cost_usd: n.limit(
            &format!("{scope}.max_cost_usd"),
            u.max_cost_usd,
            p.max_cost_usd,
        ),
        max_bytes: n.limit(&format!("{scope}.max_bytes"), u.max_bytes, p.max_bytes),
    }
}
