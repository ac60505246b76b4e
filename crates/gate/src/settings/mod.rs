//! Settings: the user's file, the project's file, and the rule that joins them.
//!
//! The user file (`~/.config/codemode/settings.json`) says what is allowed. A project file
//! (`<project>/.codemode/settings.json`) may only narrow it, unless the user trusted the project
//! ([`trust`]); widening attempts are ignored with a warning naming the key. Unknown keys are
//! errors, so a typo never silently drops a restriction.

mod narrow;
mod trust;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use codemode_spec::{CodemodeMode, Exposure};
use globset::Glob;
use serde::{Deserialize, Serialize};

use crate::audit::{AuditError, AuditLog};
use crate::budget::{BudgetLimits, Budgets};
use crate::gate::GateBuilder;
use crate::hooks::{CommandHooks, HookConfigError, HookSettings};
use crate::policy::{PolicyError, PolicySet};
use crate::registry::Registry;

pub use narrow::Narrowing;
pub use trust::{is_trusted, trust, untrust};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("cannot read settings file {file}: {message}")]
    Io { file: String, message: String },
    #[error("settings file {file}: {message}")]
    Parse { file: String, message: String },
    #[error("settings file {file}: `{key}` is not a valid tool pattern: {message}")]
    Pattern {
        file: String,
        key: String,
        message: String,
    },
}

/// Why settings could not be turned into a gate.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Hooks(#[from] HookConfigError),
    #[error(transparent)]
    Audit(#[from] AuditError),
}

/// Where the user's configuration lives. Injectable so tests never touch the real home.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsPaths {
    pub user_dir: PathBuf,
}

impl SettingsPaths {
    pub fn new(user_dir: impl Into<PathBuf>) -> Self {
        SettingsPaths {
            user_dir: user_dir.into(),
        }
    }

    /// `$XDG_CONFIG_HOME/codemode`, else `$HOME/.config/codemode`.
    pub fn from_env() -> Option<Self> {
        let base = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
        Some(Self::new(base.join("codemode")))
    }

    pub fn user_file(&self) -> PathBuf {
        self.user_dir.join("settings.json")
    }

    pub fn trusted_file(&self) -> PathBuf {
        self.user_dir.join("trusted.json")
    }
}

/// `<project>/.codemode/settings.json`.
pub fn project_file(project_dir: &Path) -> PathBuf {
    project_dir.join(".codemode").join("settings.json")
}

/// Sandbox and runtime limits, as plain numbers; the runtime maps them to the sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls_in_flight: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<u64>,
}

/// Per tool name or glob pattern (`mcp__github__*`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposure: Option<Exposure>,
    /// `true` hides the tool from everybody.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelsSettings {
    /// Whether scripts may use `models.*` at all (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Model ids (`provider/id`) scripts may use; absent means every configured model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
}

/// One settings file as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    #[serde(default)]
    pub limits: Limits,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<CodemodeMode>,
    #[serde(default)]
    pub budgets: Budgets,
    #[serde(default)]
    pub hooks: HookSettings,
    /// Cedar policy files; relative paths are relative to the file that lists them.
    #[serde(default)]
    pub policy: Vec<PathBuf>,
    #[serde(default)]
    pub tools: BTreeMap<String, ToolRule>,
    #[serde(default)]
    pub models: ModelsSettings,
    #[serde(default)]
    pub audit: AuditSettings,
}

impl Settings {
    /// Reads one file; a missing file is `None`.
    pub fn read(path: &Path) -> Result<Option<Settings>, SettingsError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(SettingsError::Io {
                    file: path.display().to_string(),
                    message: e.to_string(),
                });
            }
        };
        Self::parse(&path.display().to_string(), &text).map(Some)
    }

    pub fn parse(file: &str, text: &str) -> Result<Settings, SettingsError> {
        let s: Settings = serde_json::from_str(text).map_err(|e| SettingsError::Parse {
            file: file.to_string(),
            message: e.to_string(),
        })?;
        for key in s.tools.keys() {
            Glob::new(key).map_err(|e| SettingsError::Pattern {
                file: file.to_string(),
                key: key.clone(),
                message: e.to_string(),
            })?;
        }
        Ok(s)
    }
}

/// A policy file to load, and whether it may only forbid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyFile {
    pub path: PathBuf,
    /// Set for files from an untrusted project: they may narrow (forbid) but not permit.
    pub forbid_only: bool,
}

/// The user's and the project's settings joined by the narrowing rule.
#[derive(Debug, Clone, Default)]
pub struct EffectiveSettings {
    /// The merged values. `tools` holds the user's rules; see [`EffectiveSettings::apply_tools`].
    pub settings: Settings,
    pub policy_files: Vec<PolicyFile>,
    /// Project tool rules, applied after the user's (narrowing-only unless trusted).
    pub project_tools: BTreeMap<String, ToolRule>,
    pub project_file: Option<PathBuf>,
    pub trusted: bool,
    /// One line per ignored widening attempt, naming the key.
    pub warnings: Vec<String>,
}

/// Reads the user file and, with `project_dir`, the project file, and joins them.
pub fn load(
    paths: &SettingsPaths,
    project_dir: Option<&Path>,
) -> Result<EffectiveSettings, SettingsError> {
    let user = Settings::read(&paths.user_file())?.unwrap_or_default();
    let mut eff = EffectiveSettings {
        policy_files: relative_to(&paths.user_dir, &user.policy, false),
        settings: user.clone(),
        ..Default::default()
    };
    eff.settings.policy = eff.policy_files.iter().map(|p| p.path.clone()).collect();
    let Some(dir) = project_dir else {
        return Ok(eff);
    };
    let file = project_file(dir);
    let Some(project) = Settings::read(&file)? else {
        return Ok(eff);
    };
    let trusted = is_trusted(paths, dir);
    Ok(merge(user, project, &paths.user_dir, dir, &file, trusted))
}

fn relative_to(base: &Path, files: &[PathBuf], forbid_only: bool) -> Vec<PolicyFile> {
    files
        .iter()
        .map(|p| PolicyFile {
            path: if p.is_absolute() {
                p.clone()
            } else {
                base.join(p)
            },
            forbid_only,
        })
        .collect()
}

/// Joins a project's settings over the user's. Exposed for callers with settings from elsewhere.
pub fn merge(
    user: Settings,
    project: Settings,
    user_dir: &Path,
    project_dir: &Path,
    project_file: &Path,
    trusted: bool,
) -> EffectiveSettings {
    let mut n = Narrowing::new(project_file.display().to_string(), trusted);
    let (u, p) = (user, project);

    let limits = Limits {
        heap_bytes: n.limit(
            "limits.heap_bytes",
            u.limits.heap_bytes,
            p.limits.heap_bytes,
        ),
        stack_bytes: n.limit(
            "limits.stack_bytes",
            u.limits.stack_bytes,
            p.limits.stack_bytes,
        ),
        timeout_ms: n.limit(
            "limits.timeout_ms",
            u.limits.timeout_ms,
            p.limits.timeout_ms,
        ),
        cpu_ms: n.limit("limits.cpu_ms", u.limits.cpu_ms, p.limits.cpu_ms),
        max_output_tokens: n.limit(
            "limits.max_output_tokens",
            u.limits.max_output_tokens,
            p.limits.max_output_tokens,
        ),
        max_output_bytes: n.limit(
            "limits.max_output_bytes",
            u.limits.max_output_bytes,
            p.limits.max_output_bytes,
        ),
        max_calls: n.limit("limits.max_calls", u.limits.max_calls, p.limits.max_calls),
        max_calls_in_flight: n.limit(
            "limits.max_calls_in_flight",
            u.limits.max_calls_in_flight,
            p.limits.max_calls_in_flight,
        ),
        max_depth: n.limit("limits.max_depth", u.limits.max_depth, p.limits.max_depth),
    };
    // `only` declares less to the model than `on`, so it is the narrower mode.
    let mode = n.narrow("mode", u.mode, p.mode, |p, _| *p == CodemodeMode::Only);
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
    };

    let mut hooks = u.hooks.clone();
    if !p.hooks.is_empty() {
        if trusted {
            hooks
                .pre_tool_use
                .extend(p.hooks.pre_tool_use.iter().cloned());
            hooks
                .post_tool_use
                .extend(p.hooks.post_tool_use.iter().cloned());
        } else {
            n.ignore(
                "hooks",
                "hooks run commands, which only the user or a trusted project may add",
            );
        }
    }

    let mut policy_files = relative_to(user_dir, &u.policy, false);
    policy_files.extend(relative_to(project_dir, &p.policy, !trusted));

    let models = ModelsSettings {
        enabled: n.switch_off("models.enabled", u.models.enabled, p.models.enabled, true),
        allow: n.allowlist(
            "models.allow",
            u.models.allow.clone(),
            p.models.allow.clone(),
        ),
    };
    let audit = AuditSettings {
        path: n.user_only(
            "audit.path",
            u.audit.path.clone(),
            p.audit.path.map(|a| {
                if a.is_absolute() {
                    a
                } else {
                    project_dir.join(a)
                }
            }),
        ),
    };

    EffectiveSettings {
        settings: Settings {
            limits,
            mode,
            budgets,
            hooks,
            policy: policy_files.iter().map(|f| f.path.clone()).collect(),
            tools: u.tools,
            models,
            audit,
        },
        policy_files,
        project_tools: p.tools,
        project_file: Some(project_file.to_path_buf()),
        trusted,
        warnings: n.into_warnings(),
    }
}

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

fn matches(pattern: &str, name: &str) -> bool {
    pattern == name
        || Glob::new(pattern)
            .map(|g| g.compile_matcher().is_match(name))
            .unwrap_or(false)
}

impl EffectiveSettings {
    /// Applies the tool rules to every registered tool: the user's first, then the project's
    /// (which may only lower visibility unless trusted). Returns the warnings for ignored project
    /// rules. Call again after new tools are registered (an MCP server connected).
    pub fn apply_tools(&self, registry: &Registry) -> Vec<String> {
        let source = self
            .project_file
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let mut n = Narrowing::new(source, self.trusted);
        let current: BTreeMap<String, Exposure> = registry
            .specs()
            .into_iter()
            .map(|s| (s.name, s.exposure))
            .collect();
        for spec in registry.declared_specs() {
            let declared = spec.exposure;
            let mut exposure = declared;
            for (pattern, rule) in &self.settings.tools {
                if matches(pattern, &spec.name) {
                    if let Some(e) = rule.exposure {
                        exposure = e;
                    }
                    if rule.disabled == Some(true) {
                        exposure = Exposure::Hidden;
                    }
                }
            }
            for (pattern, rule) in &self.project_tools {
                if !matches(pattern, &spec.name) {
                    continue;
                }
                match rule.disabled {
                    Some(true) => exposure = Exposure::Hidden,
                    Some(false) if exposure == Exposure::Hidden && declared != Exposure::Hidden => {
                        if self.trusted {
                            exposure = declared;
                        } else {
                            n.ignore(
                                &format!("tools.{pattern}.disabled"),
                                "the user disabled or hid this tool",
                            );
                        }
                    }
                    _ => {}
                }
                if rule.exposure.is_some() {
                    exposure = n.visibility(
                        &format!("tools.{pattern}.exposure"),
                        exposure,
                        rule.exposure,
                    );
                }
            }
            if current.get(&spec.name) != Some(&exposure)
                && let Err(e) = registry.set_exposure(&spec.name, exposure)
            {
                n.ignore(&format!("tools.{}", spec.name), &e.to_string());
            }
        }
        n.into_warnings()
    }

    /// Sets everything the gate takes from settings on `builder`, for the tools in `registry`:
    /// tool rules (applied to the registry now), policies, command hooks (run in the project
    /// directory), budgets, the audit log, the mode and the model switches. Returns the builder
    /// and the warnings of [`EffectiveSettings::apply_tools`].
    pub fn configure(
        &self,
        builder: GateBuilder,
        registry: &Registry,
    ) -> Result<(GateBuilder, Vec<String>), ApplyError> {
        let warnings = self.apply_tools(registry);
        let mut hooks = CommandHooks::new(&self.settings.hooks)?;
        if let Some(dir) = self
            .project_file
            .as_ref()
            .and_then(|f| f.parent())
            .and_then(Path::parent)
        {
            hooks = hooks.with_cwd(dir.to_path_buf());
        }
        let mut builder = builder
            .registry(registry.clone())
            .policy(self.load_policies()?)
            .budgets(self.settings.budgets.clone())
            .mode(self.settings.mode.unwrap_or_default())
            .models(self.settings.models.clone());
        if !self.settings.hooks.is_empty() {
            builder = builder.command_hooks(hooks);
        }
        if let Some(path) = &self.settings.audit.path {
            builder = builder.audit(AuditLog::open(path)?);
        }
        Ok((builder, warnings))
    }

    /// Loads the policy files, or the default policies when none are listed. Files from an
    /// untrusted project add forbids on top (the defaults stay when only they are listed).
    pub fn load_policies(&self) -> Result<PolicySet, PolicyError> {
        let user_listed = self.policy_files.iter().any(|f| !f.forbid_only);
        let mut set = if user_listed {
            PolicySet::empty()
        } else {
            PolicySet::defaults()
        };
        for f in &self.policy_files {
            set.add_file(&f.path, f.forbid_only)?;
        }
        Ok(set)
    }
}
