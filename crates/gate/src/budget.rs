//! Budgets per script and per session, with reservations taken under one lock.

use std::collections::HashMap;
use std::sync::Mutex;

use codemode_spec::{CallKind, Provenance, Usage};
use serde::{Deserialize, Serialize};

use crate::policy::Counts;

/// Limits for one scope. `None` means unlimited.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetLimits {
    /// Calls of any kind (tools, model operations, globals) that reached execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_calls: Option<u64>,
    /// Input plus output tokens of model calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Bytes of results returned to callers (JSON size of each result value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

/// Budgets for each script and for each session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budgets {
    #[serde(default)]
    pub script: BudgetLimits,
    #[serde(default)]
    pub session: BudgetLimits,
}

/// One call as the runtime records it on its script's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallRecord {
    pub call_id: String,
    pub name: String,
    /// `ok`, `error` (the tool failed or reported an error) or `denied` (the gate refused).
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<&'static str>,
    /// `allow`, `ask`, `deny`, or `none` when the call stopped before the policy.
    pub decision: String,
    pub policy_ids: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    pub duration_ms: u64,
}

/// What a script or session used.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LedgerSnapshot {
    pub calls: u64,
    pub model_calls: u64,
    pub usage: Usage,
    pub bytes: u64,
    /// Per-call records (scripts only; empty for session totals).
    pub records: Vec<CallRecord>,
}

impl LedgerSnapshot {
    pub(crate) fn counts(&self) -> Counts {
        Counts {
            calls: self.calls,
            model_calls: self.model_calls,
            tokens: self.usage.total_tokens(),
            cost_micro_usd: micro_usd(self.usage.cost_usd),
        }
    }
}

fn micro_usd(usd: f64) -> u64 {
    if usd.is_finite() && usd > 0.0 {
        (usd * 1_000_000.0).round() as u64
    } else {
        0
    }
}

#[derive(Default)]
struct Inner {
    scripts: HashMap<String, LedgerSnapshot>,
    sessions: HashMap<String, LedgerSnapshot>,
}

/// Counters for every live script and session.
#[derive(Default)]
pub(crate) struct Ledger {
    inner: Mutex<Inner>,
}

fn over(
    scope: &str,
    what: &str,
    used: impl std::fmt::Display,
    limit: impl std::fmt::Display,
) -> String {
    format!(
        "the {scope} budget `{what}` is used up ({used} used of {limit}); the call was not run. Do the rest with fewer calls, or raise budgets.{scope}.{what} in settings"
    )
}

fn check(scope: &str, s: &LedgerSnapshot, l: &BudgetLimits, kind: CallKind) -> Result<(), String> {
    if let Some(max) = l.max_calls
        && s.calls >= max
    {
        return Err(over(scope, "max_calls", s.calls, max));
    }
    if let Some(max) = l.max_bytes
        && s.bytes >= max
    {
        return Err(over(scope, "max_bytes", s.bytes, max));
    }
    if kind == CallKind::Model {
        if let Some(max) = l.max_model_calls
            && s.model_calls >= max
        {
            return Err(over(scope, "max_model_calls", s.model_calls, max));
        }
        if let Some(max) = l.max_tokens
            && s.usage.total_tokens() >= max
        {
            return Err(over(scope, "max_tokens", s.usage.total_tokens(), max));
        }
        if let Some(max) = l.max_cost_usd
            && s.usage.cost_usd >= max
        {
            return Err(over(
                scope,
                "max_cost_usd",
                format!("${:.6}", s.usage.cost_usd),
                format!("${max}"),
            ));
        }
    }
    Ok(())
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks both scopes and counts the call in both, in one critical section, so concurrent
    /// calls cannot all pass a check that only one of them should.
    pub(crate) fn reserve(
        &self,
        budgets: &Budgets,
        p: &Provenance,
        kind: CallKind,
    ) -> Result<(), String> {
        let mut inner = self.lock();
        let session = inner.sessions.entry(p.session_id.clone()).or_default();
        check("session", session, &budgets.session, kind)?;
        if let Some(script_id) = &p.script_id {
            let script = inner.scripts.entry(script_id.clone()).or_default();
            check("script", script, &budgets.script, kind)?;
            bump(script, kind);
        }
        if let Some(session) = inner.sessions.get_mut(&p.session_id) {
            bump(session, kind);
        }
        Ok(())
    }

    /// Adds what an executed call spent. Returns an error naming the budget when the returned
    /// bytes cross a limit (the gate then withholds the result).
    pub(crate) fn charge(
        &self,
        budgets: &Budgets,
        p: &Provenance,
        usage: Option<&Usage>,
        bytes: u64,
    ) -> Result<(), String> {
        let mut inner = self.lock();
        let mut crossed = None;
        let mut apply = |scope: &str, s: &mut LedgerSnapshot, l: &BudgetLimits| {
            if let Some(u) = usage {
                s.usage.add(u);
            }
            s.bytes += bytes;
            if let Some(max) = l.max_bytes
                && s.bytes > max
                && crossed.is_none()
            {
                crossed = Some(format!(
                    "the result ({bytes} bytes) crosses the {scope} budget `max_bytes` ({} used of {max}); it was withheld. Ask for less (filter or slice the data in the tool call), or raise budgets.{scope}.max_bytes in settings",
                    s.bytes
                ));
            }
        };
        let session = inner.sessions.entry(p.session_id.clone()).or_default();
        apply("session", session, &budgets.session);
        if let Some(script_id) = &p.script_id {
            let script = inner.scripts.entry(script_id.clone()).or_default();
            apply("script", script, &budgets.script);
        }
        crossed.map_or(Ok(()), Err)
    }

    pub(crate) fn record(&self, script_id: &str, record: CallRecord) {
        self.lock()
            .scripts
            .entry(script_id.to_string())
            .or_default()
            .records
            .push(record);
    }

    pub(crate) fn counts(&self, p: &Provenance) -> (Counts, Counts) {
        let inner = self.lock();
        let script = p
            .script_id
            .as_ref()
            .and_then(|s| inner.scripts.get(s))
            .map(LedgerSnapshot::counts)
            .unwrap_or_default();
        let session = inner
            .sessions
            .get(&p.session_id)
            .map(LedgerSnapshot::counts)
            .unwrap_or_default();
        (script, session)
    }

    pub(crate) fn end_script(&self, script_id: &str) -> LedgerSnapshot {
        self.lock().scripts.remove(script_id).unwrap_or_default()
    }

    pub(crate) fn records(&self, script_id: &str) -> Vec<CallRecord> {
        self.lock()
            .scripts
            .get(script_id)
            .map(|s| s.records.clone())
            .unwrap_or_default()
    }

    pub(crate) fn session(&self, session_id: &str) -> LedgerSnapshot {
        let inner = self.lock();
        let mut s = inner.sessions.get(session_id).cloned().unwrap_or_default();
        s.records.clear();
        s
    }
}

fn bump(s: &mut LedgerSnapshot, kind: CallKind) {
    s.calls += 1;
    if kind == CallKind::Model {
        s.model_calls += 1;
    }
}
