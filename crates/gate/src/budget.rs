//! Budgets per script and per session, with reservations taken under one lock.

use std::collections::HashMap;
use std::sync::Mutex;

use codemode_spec::{CallKind, Provenance, Usage};
use serde::{Deserialize, Serialize};

use crate::outcome::CallRecord;
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

/// What a script or session used.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LedgerSnapshot {
    /// Calls counted so far: those that ran and those admitted and still in flight.
    pub calls: u64,
    pub model_calls: u64,
    pub usage: Usage,
    /// What calls in flight are estimated to spend; settled when they end.
    pub pending: Usage,
    pub bytes: u64,
    /// Per-call records (scripts only; empty for session totals).
    pub records: Vec<CallRecord>,
}

impl LedgerSnapshot {
    pub(crate) fn counts(&self) -> Counts {
        Counts {
            calls: self.calls,
            model_calls: self.model_calls,
            tokens: self.usage.total_tokens() + self.pending.total_tokens(),
            cost_micro_usd: micro_usd(self.usage.cost_usd + self.pending.cost_usd),
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
        "the call was not run: the {scope} budget `{what}` is used up ({used} used of {limit}). No person was asked. Do the rest with fewer calls, or ask the user to raise budgets.{scope}.{what} in settings"
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
        let tokens = s.usage.total_tokens() + s.pending.total_tokens();
        let cost = s.usage.cost_usd + s.pending.cost_usd;
        if let Some(max) = l.max_model_calls
            && s.model_calls >= max
        {
            return Err(over(scope, "max_model_calls", s.model_calls, max));
        }
        if let Some(max) = l.max_tokens
            && tokens >= max
        {
            return Err(over(scope, "max_tokens", tokens, max));
        }
        if let Some(max) = l.max_cost_usd
            && cost >= max
        {
            return Err(over(
                scope,
                "max_cost_usd",
                format!("${cost:.6}"),
                format!("${max}"),
            ));
        }
    }
    Ok(())
}

/// A call counted before the policy decides on it: released if it is refused, settled when it
/// ends.
#[derive(Debug, Clone)]
pub(crate) struct Reservation {
    kind: CallKind,
    estimate: Usage,
    /// What was counted before this call, as the policy sees it (script, session).
    pub counts: (Counts, Counts),
}

/// What a call is expected to spend before it runs, reserved against the cost and token caps
/// so that parallel calls cannot all pass a cap only some of them fit under.
pub(crate) fn estimate(
    kind: CallKind,
    facts: &codemode_spec::CallFacts,
    args: &serde_json::Value,
) -> Usage {
    let Some(model) = facts.model.as_ref().filter(|_| kind == CallKind::Model) else {
        return Usage::default();
    };
    if model.model_type == "image" {
        return Usage {
            images: 1,
            cost_usd: model.image_price.max(0.0),
            ..Usage::default()
        };
    }
    // About four bytes of JSON per input token; the answer's tokens are not known yet.
    let input_tokens = (serde_json::to_string(args).map(|s| s.len()).unwrap_or(0) / 4) as u64;
    Usage {
        input_tokens,
        cost_usd: input_tokens as f64 * model.input_price.max(0.0) / 1_000_000.0,
        ..Usage::default()
    }
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks both scopes and counts the call (and its estimated spend) in both, in one critical
    /// section, before the policy decides: concurrent calls cannot all pass a check, or a policy
    /// rule on the counts, that only some of them should.
    pub(crate) fn reserve(
        &self,
        budgets: &Budgets,
        p: &Provenance,
        kind: CallKind,
        estimate: Usage,
    ) -> Result<Reservation, String> {
        let mut inner = self.lock();
        let session = inner.sessions.entry(p.session_id.clone()).or_default();
        check("session", session, &budgets.session, kind)?;
        let session_counts = session.counts();
        let mut script_counts = Counts::default();
        if let Some(script_id) = &p.script_id {
            let script = inner.scripts.entry(script_id.clone()).or_default();
            check("script", script, &budgets.script, kind)?;
            script_counts = script.counts();
            bump(script, kind, &estimate);
        }
        if let Some(session) = inner.sessions.get_mut(&p.session_id) {
            bump(session, kind, &estimate);
        }
        Ok(Reservation {
            kind,
            estimate,
            counts: (script_counts, session_counts),
        })
    }

    /// Gives back a reservation of a call that did not run.
    pub(crate) fn release(&self, p: &Provenance, r: &Reservation) {
        let mut inner = self.lock();
        let undo = |s: &mut LedgerSnapshot| {
            s.calls = s.calls.saturating_sub(1);
            if r.kind == CallKind::Model {
                s.model_calls = s.model_calls.saturating_sub(1);
            }
            sub(&mut s.pending, &r.estimate);
        };
        if let Some(s) = inner.sessions.get_mut(&p.session_id) {
            undo(s);
        }
        if let Some(s) = p
            .script_id
            .as_ref()
            .and_then(|id| inner.scripts.get_mut(id))
        {
            undo(s);
        }
    }

    /// Replaces a ran call's estimate with what it spent. Returns an error naming the budget
    /// when the returned bytes cross a limit (the gate then withholds the result).
    pub(crate) fn settle(
        &self,
        budgets: &Budgets,
        p: &Provenance,
        r: &Reservation,
        usage: Option<&Usage>,
        bytes: u64,
    ) -> Result<(), String> {
        let mut inner = self.lock();
        let mut crossed = None;
        let mut apply = |scope: &str, s: &mut LedgerSnapshot, l: &BudgetLimits| {
            sub(&mut s.pending, &r.estimate);
            if let Some(u) = usage {
                s.usage.add(u);
            }
            s.bytes += bytes;
            if let Some(max) = l.max_bytes
                && s.bytes > max
                && crossed.is_none()
            {
                crossed = Some(format!(
                    "the call ran, but its result was withheld: the result ({bytes} bytes) crosses the {scope} budget `max_bytes` ({} used of {max}). No person was asked. Ask for less (filter or slice the data in the tool call), or ask the user to raise budgets.{scope}.max_bytes in settings",
                    s.bytes
                ));
            }
        };
        if let Some(session) = inner.sessions.get_mut(&p.session_id) {
            apply("session", session, &budgets.session);
        }
        // A script that already ended keeps no counters: nothing to settle there.
        if let Some(script) = p
            .script_id
            .as_ref()
            .and_then(|id| inner.scripts.get_mut(id))
        {
            apply("script", script, &budgets.script);
        }
        crossed.map_or(Ok(()), Err)
    }

    pub(crate) fn record(&self, script_id: &str, record: CallRecord) {
        if let Some(s) = self.lock().scripts.get_mut(script_id) {
            s.records.push(record);
        }
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

fn bump(s: &mut LedgerSnapshot, kind: CallKind, estimate: &Usage) {
    s.calls += 1;
    if kind == CallKind::Model {
        s.model_calls += 1;
    }
    s.pending.add(estimate);
}

fn sub(into: &mut Usage, u: &Usage) {
    into.input_tokens = into.input_tokens.saturating_sub(u.input_tokens);
    into.output_tokens = into.output_tokens.saturating_sub(u.output_tokens);
    into.images = into.images.saturating_sub(u.images);
    into.cost_usd = (into.cost_usd - u.cost_usd).max(0.0);
}
