//! Budgets per script and per session, with reservations taken under one lock; with a shared
//! state store, also per session, principal and team across replicas ([`SharedLedger`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use codemode_spec::{CallKind, Provenance, Usage};
use codemode_state::{
    Amounts, BudgetRefusal, Counter, LedgerKey, Limits, Reservation as StoreReservation,
    ReserveOutcome, ReserveRequest, StateStore,
};
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
    /// Per-call records (scripts only; empty for session totals), the most recent
    /// [`KEPT_RECORDS`] to twice that: a call still out when its script ends ends last, so its
    /// record is among them.
    pub records: Vec<CallRecord>,
    /// Records let go to keep that bound (the calls' audit lines have them all).
    pub records_dropped: u64,
}

/// Per-call records a script keeps in memory: each is a kilobyte or two, and a script may make
/// 100,000 calls (350 MB of records, a red team measured, with no permission needed: refused
/// calls count).
pub const KEPT_RECORDS: usize = 5_000;

impl LedgerSnapshot {
    pub(crate) fn counts(&self) -> Counts {
        Counts {
            calls: self.calls,
            model_calls: self.model_calls,
            tokens: self
                .usage
                .total_tokens()
                .saturating_add(self.pending.total_tokens()),
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
    /// Bytes of arguments each live script's calls put in the journal.
    journalled: HashMap<String, u64>,
}

/// Most bytes of arguments one script's calls may put in the journal by default. Each line
/// keeps a call's arguments whole up to 256 KiB, so without a bound one script could write
/// gigabytes there.
pub const MAX_JOURNALLED_BYTES_PER_SCRIPT: u64 = 64 * 1024 * 1024;

/// Counters for every live script and session.
pub(crate) struct Ledger {
    inner: Mutex<Inner>,
    /// Most bytes of arguments one script's calls may put in the journal.
    journal_share: u64,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger::with_journal_share(MAX_JOURNALLED_BYTES_PER_SCRIPT)
    }
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

/// A refusal of a model call that does not fit in what is left of a limit.
fn too_big(
    scope: &str,
    what: &str,
    used: impl std::fmt::Display,
    limit: impl std::fmt::Display,
    wants: impl std::fmt::Display,
) -> String {
    format!(
        "the call was not run: it may use up to {wants}, more than is left of the {scope} budget `{what}` ({used} used or reserved of {limit}). No person was asked. Make the request smaller (less input, a lower max_tokens), or ask the user to raise budgets.{scope}.{what} in settings"
    )
}

/// Refuses a call once a limit is reached, and a model call whose reserved estimate would pass a
/// token or cost limit: the budget is a ceiling, not a line the last call may cross by its whole
/// size (the shared ledgers check the same way, `codemode_state::budget::check_room`).
fn check(
    scope: &str,
    s: &LedgerSnapshot,
    l: &BudgetLimits,
    kind: CallKind,
    estimate: &Usage,
) -> Result<(), String> {
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
        let tokens = s
            .usage
            .total_tokens()
            .saturating_add(s.pending.total_tokens());
        let cost = s.usage.cost_usd + s.pending.cost_usd;
        if let Some(max) = l.max_model_calls
            && s.model_calls >= max
        {
            return Err(over(scope, "max_model_calls", s.model_calls, max));
        }
        let wants_tokens = estimate.total_tokens();
        if let Some(max) = l.max_tokens {
            if tokens >= max {
                return Err(over(scope, "max_tokens", tokens, max));
            }
            if tokens.saturating_add(wants_tokens) > max {
                let wants = format!("{wants_tokens} tokens");
                return Err(too_big(scope, "max_tokens", tokens, max, wants));
            }
        }
        let wants_cost = estimate.cost_usd.max(0.0);
        if let Some(max) = l.max_cost_usd {
            if cost >= max {
                let used = format!("${cost:.6}");
                return Err(over(scope, "max_cost_usd", used, format!("${max}")));
            }
            if cost + wants_cost > max {
                let (used, wants) = (format!("${cost:.6}"), format!("${wants_cost:.6}"));
                return Err(too_big(
                    scope,
                    "max_cost_usd",
                    used,
                    format!("${max}"),
                    wants,
                ));
            }
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
    /// The hold on the shared ledgers, when the gate has a state store.
    pub shared: Option<SharedHold>,
}

impl Reservation {
    /// What was reserved: charged in full when a call that ran cannot say what it spent.
    pub(crate) fn charged_when_unknown(&self) -> Option<Usage> {
        (self.kind == CallKind::Model).then(|| Usage {
            estimated: true,
            ..self.estimate.clone()
        })
    }
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
        // Its price per image, and its token prices too where it has them: an image model may
        // bill both, and a reservation below what it can cost would let parallel calls pass
        // a cap together that only some fit under.
        let (input_tokens, output_tokens) = (model.max_input_tokens, model.max_output_tokens);
        return Usage {
            images: 1,
            input_tokens,
            output_tokens,
            cost_usd: model.image_price.max(0.0)
                + (input_tokens as f64 * model.input_price.max(0.0)
                    + output_tokens as f64 * model.output_price.max(0.0))
                    / 1_000_000.0,
            ..Usage::default()
        };
    }
    // The tool's own bound on what the request can be billed for, when it gives one; otherwise
    // about four bytes of JSON per input token, with the answer's tokens unknown.
    let input_tokens = if model.max_input_tokens > 0 {
        model.max_input_tokens
    } else {
        (serde_json::to_string(args).map(|s| s.len()).unwrap_or(0) / 4) as u64
    };
    let output_tokens = model.max_output_tokens;
    Usage {
        input_tokens,
        output_tokens,
        cost_usd: (input_tokens as f64 * model.input_price.max(0.0)
            + output_tokens as f64 * model.output_price.max(0.0))
            / 1_000_000.0,
        ..Usage::default()
    }
}

impl Ledger {
    pub(crate) fn with_journal_share(journal_share: u64) -> Self {
        Ledger {
            inner: Mutex::default(),
            journal_share,
        }
    }

    pub(crate) fn journal_share(&self) -> u64 {
        self.journal_share
    }

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
        check("session", session, &budgets.session, kind, &estimate)?;
        let session_counts = session.counts();
        let mut script_counts = Counts::default();
        if let Some(script_id) = &p.script_id {
            let script = inner.scripts.entry(script_id.clone()).or_default();
            check("script", script, &budgets.script, kind, &estimate)?;
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
            shared: None,
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

    /// Counts a call that ran elsewhere (see `Gate::count_replayed_call`), without checks.
    pub(crate) fn count_replayed(
        &self,
        session_id: &str,
        script_id: &str,
        kind: CallKind,
        bytes: u64,
        usage: Option<&Usage>,
    ) {
        let mut inner = self.lock();
        let nothing = Usage::default();
        let spent = usage.unwrap_or(&nothing);
        let script = inner.scripts.entry(script_id.to_string()).or_default();
        bump(script, kind, &nothing);
        script.bytes += bytes;
        script.usage.add(spent);
        let session = inner.sessions.entry(session_id.to_string()).or_default();
        bump(session, kind, &nothing);
        session.bytes += bytes;
        session.usage.add(spent);
    }

    pub(crate) fn record(&self, script_id: &str, record: CallRecord) {
        if let Some(s) = self.lock().scripts.get_mut(script_id) {
            // Dropped in halves, so a record costs O(1) over time.
            if s.records.len() >= 2 * KEPT_RECORDS {
                s.records.drain(..KEPT_RECORDS);
                s.records_dropped += KEPT_RECORDS as u64;
            }
            s.records.push(record);
        }
    }

    pub(crate) fn end_script(&self, script_id: &str) -> LedgerSnapshot {
        let mut inner = self.lock();
        inner.journalled.remove(script_id);
        inner.scripts.remove(script_id).unwrap_or_default()
    }

    /// Counts `bytes` of a call's arguments into its script's journal share; false (nothing
    /// counted) when they would pass it. Only for scripts this ledger counts (a call reserved
    /// here first).
    pub(crate) fn journal(&self, script_id: &str, bytes: u64) -> bool {
        let mut inner = self.lock();
        if !inner.scripts.contains_key(script_id) {
            return true;
        }
        let used = inner.journalled.entry(script_id.to_string()).or_default();
        if used.saturating_add(bytes) > self.journal_share {
            return false;
        }
        *used += bytes;
        true
    }

    pub(crate) fn records(&self, script_id: &str) -> Vec<CallRecord> {
        self.lock()
            .scripts
            .get(script_id)
            .map(|s| s.records.clone())
            .unwrap_or_default()
    }

    /// Drops an ended session's counters.
    pub(crate) fn forget_session(&self, session_id: &str) {
        self.lock().sessions.remove(session_id);
    }

    /// The sessions counted here.
    pub(crate) fn session_ids(&self) -> Vec<String> {
        self.lock().sessions.keys().cloned().collect()
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

/// Who a session acts for: budgets per principal and per team are kept per UTC day.
///
/// Under `codemode serve --listen`, the principal is the name of the bearer token the client
/// authenticated with (`--tokens-file`); otherwise it is whatever the embedder set with
/// [`crate::GateBuilder::principal`] (the CLI passes `--principal`, else nobody).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Principal {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
}

/// Ceilings per principal and per team, per UTC day. They need a shared state store
/// ([`crate::GateBuilder::shared_budgets`]): kept in one process they would be per replica.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DailyBudgets {
    #[serde(default)]
    pub principal: BudgetLimits,
    #[serde(default)]
    pub team: BudgetLimits,
}

impl BudgetLimits {
    fn is_unlimited(&self) -> bool {
        self == &BudgetLimits::default()
    }

    /// The store's limits for a call of `kind`: token and cost ceilings only stop model calls,
    /// as in the in-process ledger.
    fn store_limits(&self, kind: CallKind) -> Limits {
        let model = kind == CallKind::Model;
        Limits {
            calls: self.max_calls,
            model_calls: self.max_model_calls.filter(|_| model),
            tokens: self.max_tokens.filter(|_| model),
            cost_micro_usd: self.max_cost_usd.filter(|_| model).map(micro_usd_ceil),
            bytes: self.max_bytes,
        }
    }
}

/// A dollar ceiling in whole micro-dollars, never rounded up past what was allowed.
fn micro_usd_ceil(usd: f64) -> u64 {
    if usd.is_finite() && usd > 0.0 {
        (usd * 1_000_000.0).floor() as u64
    } else {
        0
    }
}

/// Budgets kept in a [`StateStore`] that several replicas share: the session's (sessions move
/// between replicas), and the principal's and team's of the day. A call charges only the
/// ledgers that have a limit, so calls with nothing to count touch no shared row.
pub(crate) struct SharedLedger {
    store: Arc<dyn StateStore>,
    daily: DailyBudgets,
    /// A hold a replica never settles (it died mid-call) gives its budget back after this;
    /// a call still running renews its hold ([`SharedLedger::keep_alive`]).
    pub(crate) hold_for: Duration,
    /// The audit stream is in the same store, so a call's settle is followed by its durable
    /// audit line there ([`StateStore::settle_before_audit`]).
    pub(crate) audit_follows: bool,
}

/// How long a refused settle is tried again ([`SharedLedger::settle_later`]); `Gate::flush`
/// waits for these tries.
const SETTLE_RETRY_FOR: Duration = Duration::from_secs(120);

/// Why a shared settle did not simply succeed.
#[derive(Debug)]
pub(crate) enum SettleError {
    /// The result crossed a `max_bytes` limit; the spending was charged.
    Overrun(String),
    /// The store did not take the charge; it is to be tried again.
    Store(String),
}

/// What a call holds in the shared store.
#[derive(Debug, Clone)]
pub(crate) struct SharedHold {
    reservation: StoreReservation,
    kind: CallKind,
}

impl SharedLedger {
    pub(crate) fn new(store: Arc<dyn StateStore>, daily: DailyBudgets) -> Self {
        SharedLedger {
            store,
            daily,
            hold_for: Duration::from_secs(15 * 60),
            audit_follows: false,
        }
    }

    pub(crate) fn store(&self) -> &Arc<dyn StateStore> {
        &self.store
    }

    /// Holds the call's count (and a model call's estimate) on every shared ledger with a
    /// limit, all or none. `Ok(None)`: no ledger to charge. A store that fails refuses the call.
    pub(crate) async fn reserve(
        &self,
        session: &BudgetLimits,
        p: &Provenance,
        who: Option<&Principal>,
        kind: CallKind,
        estimate: &Usage,
    ) -> Result<Option<SharedHold>, String> {
        let day = codemode_state::utc_day(codemode_state::Clock::system().now_ms());
        let mut ledgers = Vec::new();
        if !session.is_unlimited() {
            ledgers.push((
                LedgerKey::session(p.session_id.clone()),
                session.store_limits(kind),
            ));
        }
        if let Some(who) = who {
            if !self.daily.principal.is_unlimited() {
                ledgers.push((
                    LedgerKey::principal_day(who.id.clone(), day.clone()),
                    self.daily.principal.store_limits(kind),
                ));
            }
            if let Some(team) = &who.team
                && !self.daily.team.is_unlimited()
            {
                ledgers.push((
                    LedgerKey::team_day(team.clone(), day),
                    self.daily.team.store_limits(kind),
                ));
            }
        }
        if ledgers.is_empty() {
            return Ok(None);
        }
        let request = ReserveRequest {
            ledgers,
            amounts: amounts(kind, Some(estimate), 0),
            hold_for: self.hold_for,
        };
        match self.store.reserve(request).await {
            Ok(ReserveOutcome::Granted(reservation)) => Ok(Some(SharedHold { reservation, kind })),
            Ok(ReserveOutcome::Refused(r)) => Err(refusal(&r)),
            Err(e) => Err(format!(
                "the shared budget could not be charged, so the call was not run: {e}"
            )),
        }
    }

    /// Replaces the hold by what the call spent. An error names a `max_bytes` the result
    /// crossed (the gate withholds it), or says the store failed.
    ///
    /// `line_follows`: the caller writes the call's audit line next and waits for it, so when
    /// that line goes to this store the settle need not wait for the disk on its own.
    pub(crate) async fn settle(
        &self,
        hold: &SharedHold,
        usage: Option<&Usage>,
        bytes: u64,
        line_follows: bool,
    ) -> Result<(), SettleError> {
        let actual = amounts(hold.kind, usage, bytes);
        let settled = if line_follows && self.audit_follows {
            self.store
                .settle_before_audit(&hold.reservation, actual)
                .await
        } else {
            self.store.settle(&hold.reservation, actual).await
        };
        match settled {
            Ok(outcome) => match outcome
                .overruns
                .iter()
                .find(|o| o.counter == Counter::Bytes)
            {
                Some(o) => Err(SettleError::Overrun(format!(
                    "the result ({bytes} bytes) crosses the {} budget `max_bytes` ({} used of {}); it was withheld. Ask for less, or raise budgets.{}.max_bytes in settings",
                    scope_name(&o.ledger),
                    o.used,
                    o.limit,
                    scope_name(&o.ledger)
                ))),
                None => Ok(()),
            },
            Err(e) => {
                tracing::error!("settling a shared budget failed: {e}");
                Err(SettleError::Store(format!(
                    "what the call spent could not be charged to the shared budget ({e}); its result was withheld, and the charge is tried again while the store is away"
                )))
            }
        }
    }

    /// Charges a settle the store refused, trying again until it takes it, for up to
    /// [`SETTLE_RETRY_FOR`]. Left alone, the hold would run out and give the budget back,
    /// though the call ran and spent it. A hold the store no longer knows was settled or
    /// released after all (the refused attempt committed, but its answer was lost).
    pub(crate) async fn settle_later(&self, hold: &SharedHold, usage: Option<&Usage>, bytes: u64) {
        let actual = amounts(hold.kind, usage, bytes);
        let started = std::time::Instant::now();
        let mut wait = Duration::from_millis(100);
        loop {
            tokio::time::sleep(wait).await;
            match self.store.settle(&hold.reservation, actual).await {
                Ok(_) | Err(codemode_state::StateError::UnknownReservation { .. }) => return,
                Err(e) if started.elapsed() >= SETTLE_RETRY_FOR => {
                    tracing::error!(
                        "a call's spending was never charged to the shared budget: the store refused it for {} s ({e})",
                        SETTLE_RETRY_FOR.as_secs()
                    );
                    return;
                }
                Err(_) => wait = (wait * 2).min(Duration::from_secs(5)),
            }
        }
    }

    /// Holds a call's amounts again on the same ledgers, after a wait that may have outlasted
    /// its hold (a person's answer): the old hold is given back and a new one taken, refused
    /// when what the old one held was spent meanwhile. Never both held at once, so a call at
    /// the limit is not refused for its own hold.
    pub(crate) async fn renew(&self, hold: SharedHold) -> Result<SharedHold, String> {
        self.release(&hold).await;
        let request = ReserveRequest {
            ledgers: hold.reservation.ledgers.clone(),
            amounts: hold.reservation.amounts,
            hold_for: self.hold_for,
        };
        match self.store.reserve(request).await {
            Ok(ReserveOutcome::Granted(reservation)) => Ok(SharedHold {
                reservation,
                kind: hold.kind,
            }),
            Ok(ReserveOutcome::Refused(r)) => Err(format!(
                "the call was approved, but the budget it held ran out while it waited for the answer: {}",
                refusal(&r)
            )),
            Err(e) => Err(format!(
                "the call was approved, but the shared budget could not be charged again after the wait, so it was not run: {e}"
            )),
        }
    }

    /// Renews `hold` every quarter of its lifetime until the returned guard drops: a call
    /// that outlives its hold must not give back budget it is still spending, or another call
    /// could take it. The task stops by itself when the store no longer has the hold.
    pub(crate) fn keep_alive(&self, hold: &SharedHold) -> Option<tokio_util::sync::DropGuard> {
        // A grant from a budget lease is held in this process; the store renews the lease
        // while calls granted from it run.
        if hold.reservation.lease.is_some() {
            return None;
        }
        let rt = tokio::runtime::Handle::try_current().ok()?;
        let stop = tokio_util::sync::CancellationToken::new();
        let (store, hold_for) = (self.store.clone(), self.hold_for);
        let (hold, until_stopped) = (hold.clone(), stop.clone());
        rt.spawn(async move {
            let every = hold_for / 4;
            loop {
                tokio::select! {
                    () = until_stopped.cancelled() => return,
                    () = tokio::time::sleep(every) => {}
                }
                if let Err(e) = store.extend_hold(&hold.reservation, hold_for).await {
                    if !until_stopped.is_cancelled() {
                        tracing::warn!("renewing a running call's shared budget hold failed: {e}");
                    }
                    if matches!(e, codemode_state::StateError::UnknownReservation { .. }) {
                        return;
                    }
                }
            }
        });
        Some(stop.drop_guard())
    }

    pub(crate) async fn release(&self, hold: &SharedHold) {
        if let Err(e) = self.store.release(&hold.reservation).await {
            // The hold expires on its own; until then it only makes the budget stricter.
            tracing::warn!("giving back a shared budget hold failed: {e}");
        }
    }
}

fn scope_name(k: &LedgerKey) -> &'static str {
    k.scope.as_str()
}

fn amounts(kind: CallKind, usage: Option<&Usage>, bytes: u64) -> Amounts {
    let model = kind == CallKind::Model;
    Amounts {
        calls: 1,
        model_calls: u64::from(model),
        tokens: storable(usage.map_or(0, Usage::total_tokens)),
        cost_micro_usd: storable(usage.map_or(0, |u| micro_usd(u.cost_usd))),
        bytes: storable(bytes),
    }
}

/// The stores keep counters as signed 64-bit integers and refuse larger amounts. An absurd
/// count (a provider reporting `u64::MAX` tokens) is charged as the largest they hold, which
/// uses up any limit: refused, the settle would charge nothing and the hold would run out.
fn storable(n: u64) -> u64 {
    n.min(i64::MAX as u64)
}

fn refusal(r: &BudgetRefusal) -> String {
    let scope = scope_name(&r.ledger);
    let whose = match (&r.ledger.day, r.ledger.scope) {
        (Some(day), _) => format!(" of `{}` on {day} (UTC)", r.ledger.id),
        (None, _) => String::new(),
    };
    let key = match r.counter {
        Counter::Calls => "max_calls",
        Counter::ModelCalls => "max_model_calls",
        Counter::Tokens => "max_tokens",
        Counter::CostMicroUsd => "max_cost_usd",
        Counter::Bytes => "max_bytes",
    };
    let (used, held, limit) = if r.counter == Counter::CostMicroUsd {
        let usd = |m: u64| format!("${:.6}", m as f64 / 1e6);
        (usd(r.used), usd(r.reserved), usd(r.limit))
    } else {
        (
            r.used.to_string(),
            r.reserved.to_string(),
            r.limit.to_string(),
        )
    };
    format!(
        "the {scope} budget `{key}`{whose} is used up ({used} used and {held} held by calls in flight on every replica, of {limit}); the call was not run. Do the rest with fewer calls, or raise budgets.{scope}.{key} in settings"
    )
}
