//! Configuration values into the typed inputs of the gate and the sandbox.

use codemode_config::settings::{self, Policies};
use codemode_config::{Limits, Narrowing};
use codemode_gate::hooks::{HookCommand, HookMatcher};
use codemode_gate::{BudgetLimits, Budgets, HookSettings, ModelRules, PolicyError, PolicySet};
use codemode_sandbox::SandboxConfig;

/// The limits that apply where nobody set one: the sandbox's defaults. A project may only go
/// below them.
pub fn builtin_limits() -> Limits {
    let d = codemode_sandbox::Limits::default();
    Limits {
        heap_bytes: Some(d.heap_bytes as u64),
        stack_bytes: Some(d.stack_bytes as u64),
        timeout_ms: Some(d.timeout_ms),
        cpu_ms: Some(d.cpu_ms),
        max_output_tokens: Some(d.max_output_tokens),
        max_output_bytes: Some(d.max_output_chars as u64),
        max_calls: Some(d.max_calls),
        max_calls_in_flight: Some(d.max_calls_in_flight as u64),
        // Unlimited by default: a script's calls have depth 1 and nothing nests deeper today.
        max_depth: None,
    }
}

fn size(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// The operator's limits as both the sandbox's defaults and its maximum, so that a script's
/// `// @options:` line can only lower them.
pub fn sandbox_config(limits: &Limits) -> SandboxConfig {
    let mut l = codemode_sandbox::Limits::default();
    if let Some(v) = limits.heap_bytes {
        l.heap_bytes = size(v);
    }
    if let Some(v) = limits.stack_bytes {
        l.stack_bytes = size(v);
    }
    if let Some(v) = limits.timeout_ms {
        l.timeout_ms = v;
    }
    if let Some(v) = limits.cpu_ms {
        l.cpu_ms = v;
    }
    if let Some(v) = limits.max_output_tokens {
        l.max_output_tokens = v;
    }
    if let Some(v) = limits.max_output_bytes {
        // The sandbox counts output in characters; each counts at least one byte.
        l.max_output_chars = size(v);
    }
    if let Some(v) = limits.max_calls {
        l.max_calls = v;
    }
    if let Some(v) = limits.max_calls_in_flight {
        l.max_calls_in_flight = size(v);
    }
    SandboxConfig {
        defaults: l.clone(),
        maximum: l,
        ..SandboxConfig::default()
    }
}

pub fn max_depth(limits: &Limits) -> Option<u32> {
    limits
        .max_depth
        .map(|d| u32::try_from(d).unwrap_or(u32::MAX))
}

fn budget_limits(l: &settings::BudgetLimits) -> BudgetLimits {
    BudgetLimits {
        max_calls: l.max_calls,
        max_model_calls: l.max_model_calls,
        max_tokens: l.max_tokens,
        max_cost_usd: l.max_cost_usd,
        max_bytes: l.max_bytes,
    }
}

pub fn budgets(b: &settings::Budgets) -> Budgets {
    Budgets {
        script: budget_limits(&b.script),
        session: budget_limits(&b.session),
    }
}

/// The per-day budgets, which only a shared state store keeps.
pub fn daily_budgets(b: &settings::Budgets) -> codemode_gate::DailyBudgets {
    codemode_gate::DailyBudgets {
        principal: budget_limits(&b.principal),
        team: budget_limits(&b.team),
    }
}

pub fn hooks(h: &settings::HookSettings) -> HookSettings {
    let list = |l: &[settings::HookMatcher]| {
        l.iter()
            .map(|m| HookMatcher {
                matcher: m.matcher.clone(),
                hooks: m
                    .hooks
                    .iter()
                    .map(|c| HookCommand {
                        kind: c.kind.clone(),
                        command: c.command.clone(),
                        timeout: c.timeout,
                        start_dir: c.start_dir.clone(),
                    })
                    .collect(),
            })
            .collect()
    };
    HookSettings {
        pre_tool_use: list(&h.pre_tool_use),
        post_tool_use: list(&h.post_tool_use),
    }
}

pub fn model_rules(m: &settings::ModelRules) -> ModelRules {
    ModelRules {
        enabled: m.enabled,
        allow: m.allow.clone(),
    }
}

/// The policy set: the built-in policies unless files replace them, then every file. An
/// untrusted project's permits are left out with the same warning as any other widening.
pub fn policy_set(p: &Policies, warnings: &mut Vec<String>) -> Result<PolicySet, PolicyError> {
    let mut set = if p.use_builtin {
        PolicySet::defaults()
    } else {
        PolicySet::empty()
    };
    for source in &p.sources {
        if source.forbids_only {
            let mut n = Narrowing::new(source.name.clone(), false);
            for (id, line) in set.add_forbids(&source.name, &source.text)? {
                n.ignore(
                    &format!("permit policy `{id}` (line {line})"),
                    "a permit would widen what you allow; its forbids still apply",
                );
            }
            warnings.extend(n.into_warnings());
        } else {
            set.add_source(&source.name, &source.text, false)?;
        }
    }
    Ok(set)
}
