//! The pipeline: resolve → validate → prepare → protected paths → reserve → policy → hooks →
//! approval → run → after-hooks → settle → audit, for every call whoever makes it.

mod admission;
mod protect;
mod script_lines;
mod session_memory;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use codemode_spec::{
    CallFacts, CallKind, CodemodeMode, DeadlineClock, Exposure, HeldMemory, Origin, PreparedCall,
    Provenance, Tool, ToolOutput, ToolSpec, Usage,
};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use admission::Admission;
use admission::Pending;
pub use protect::ProtectedPath;
pub use session_memory::SessionHold;
use session_memory::SessionMemory;

use crate::approval::{ApprovalAnswer, ApprovalRequest, Approver};
use crate::audit::AuditLog;
use crate::budget::{
    Budgets, DailyBudgets, Ledger, LedgerSnapshot, Principal, SharedLedger, estimate,
};
use crate::error::{GateError, Stage};
use crate::hooks::{CommandHooks, Hook, HookDecision, HookEvent};
use crate::model_rules::ModelRules;
use crate::observe::CallObserver;
use crate::outcome::CallRecord;
use crate::policy::{Decision, PolicyError, PolicyInput, PolicySchema, PolicySet, decide};
use crate::registry::{CODEMODE_TOOL, Lookup, Registry, Resolved};
use crate::validate::check_args;
use codemode_state::StateStore;
use tokio_util::task::TaskTracker;

/// One call as it arrives at the gate.
#[derive(Debug, Clone)]
pub struct CallRequest {
    /// The tool's raw name, or the identifier a script used for it.
    pub name: String,
    pub args: Value,
    pub provenance: Provenance,
    pub cancel: CancellationToken,
    /// The calling script's deadline clock, paused while a person approves.
    pub clock: Option<DeadlineClock>,
    /// Where the caller keeps results: the result's size is reserved there as soon as the tool
    /// returns it, so results on their way to a script count against what the script may hold.
    pub result_room: Option<ResultRoom>,
}

/// Reserves room for a call's result in what its caller may hold. Given the result's size in
/// bytes, a share to keep with the result (given back when the result is dropped), or the error
/// the caller gets instead of the result, which is then dropped at once.
#[derive(Clone)]
pub struct ResultRoom(Arc<dyn Fn(usize) -> Result<HeldMemory, String> + Send + Sync>);

impl ResultRoom {
    pub fn new(
        reserve: impl Fn(usize) -> Result<HeldMemory, String> + Send + Sync + 'static,
    ) -> Self {
        ResultRoom(Arc::new(reserve))
    }

    pub fn reserve(&self, bytes: usize) -> Result<HeldMemory, String> {
        (self.0)(bytes)
    }
}

impl std::fmt::Debug for ResultRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResultRoom")
    }
}

impl CallRequest {
    pub fn new(name: impl Into<String>, args: Value, provenance: Provenance) -> Self {
        CallRequest {
            name: name.into(),
            args,
            provenance,
            cancel: CancellationToken::new(),
            clock: None,
            result_room: None,
        }
    }
}

struct PolicyState {
    set: PolicySet,
    schema: PolicySchema,
}

impl Inner {
    /// Who a session acts for: the principal set for it, else the default one.
    pub(crate) fn principal_of(&self, session_id: &str) -> Option<Principal> {
        self.sessions
            .principal(session_id)
            .or_else(|| self.default_principal.clone())
    }

    /// Drops the session's "always" answers and counters (its principal goes with
    /// [`SessionMemory`], which calls this).
    fn forget_session_now(&self, session_id: &str) {
        // "Always" answers are kept per script ([`Gate::end_script`] forgets them).
        self.ledger.forget_session(session_id);
    }
}

pub(crate) struct Inner {
    registry: Registry,
    policy: RwLock<Arc<PolicyState>>,
    hooks: Vec<Arc<dyn Hook>>,
    approver: Option<Arc<dyn Approver>>,
    budgets: Budgets,
    audit: AuditLog,
    mode: CodemodeMode,
    ledger: Ledger,
    /// (script or session id, tool) pairs a person answered "always" for.
    always: Mutex<HashSet<(String, String)>>,
    /// Set when an audit line could not be written: later calls are refused rather than run
    /// unrecorded.
    audit_failure: Mutex<Option<String>>,
    models: ModelRules,
    max_depth: Option<u32>,
    /// The workspace root as text, for `context.in_workspace`.
    workspace: Option<String>,
    protected: Vec<ProtectedPath>,
    /// Budgets shared by every replica through a state store.
    pub(crate) shared: Option<SharedLedger>,
    /// Who each session acts for (HTTP token names), else `default_principal`; and which
    /// sessions still have a call or cell running, so their end waits for it.
    sessions: SessionMemory,
    default_principal: Option<Principal>,
    pub(crate) observer: Option<Arc<dyn CallObserver>>,
    /// Spans of calls in flight, by call id, so a nested call's span is the child of its
    /// parent's (as in the provenance) whichever task or thread it runs on.
    pub(crate) spans: Mutex<HashMap<String, tracing::Span>>,
    /// Record arguments in spans (`telemetry.include_arguments`); off by default.
    pub(crate) trace_arguments: bool,
    /// Audit lines and budget settlements that a dropped call left to finish in the background.
    pub(crate) background: TaskTracker,
    /// Outcome lines of running scripts' calls, written while the scripts go on.
    pub(crate) script_lines: script_lines::InFlightLines,
}

/// The one place that decides every call. Cheap to clone; share it between the runtime, the MCP
/// front end and nested scripts.
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

/// Assembles a [`Gate`]. Without `.policy(..)`, the embedded default policies apply.
pub struct GateBuilder {
    registry: Registry,
    policy: Option<PolicySet>,
    hooks: Vec<Arc<dyn Hook>>,
    approver: Option<Arc<dyn Approver>>,
    budgets: Budgets,
    audit: AuditLog,
    mode: CodemodeMode,
    models: ModelRules,
    max_depth: Option<u32>,
    workspace: Option<PathBuf>,
    protected: Vec<ProtectedPath>,
    shared: Option<SharedLedger>,
    shared_hold_for: Option<std::time::Duration>,
    journal_share: Option<u64>,
    principal: Option<Principal>,
    observer: Option<Arc<dyn CallObserver>>,
    trace_arguments: bool,
}

impl GateBuilder {
    /// Keeps the session's budget, and the principal's and team's of the day, in `store`, which
    /// several replicas may share: a reservation there is atomic across them. Script budgets
    /// stay in the process that runs the script.
    pub fn shared_budgets(mut self, store: Arc<dyn StateStore>, daily: DailyBudgets) -> Self {
        self.shared = Some(SharedLedger::new(store, daily));
        self
    }
    /// How long a shared budget hold lasts without being renewed: what a replica that dies
    /// mid-call keeps from the budget until it expires. A running call renews its hold every
    /// quarter of this, so a call may run longer. Default 15 minutes.
    pub fn shared_hold_for(mut self, hold_for: std::time::Duration) -> Self {
        self.shared_hold_for = Some(hold_for);
        self
    }
    /// Most bytes of arguments one script's calls may put in the audit journal (each call's
    /// whole arguments, up to 256 KiB, are journalled before it runs); past it the script's
    /// calls are refused, and the log and other scripts go on. Default 64 MiB.
    pub fn max_journalled_bytes_per_script(mut self, bytes: u64) -> Self {
        self.journal_share = Some(bytes);
        self
    }
    /// Who sessions act for when nobody said otherwise with [`Gate::set_principal`].
    pub fn principal(mut self, principal: Option<Principal>) -> Self {
        self.principal = principal;
        self
    }
    /// Told about every call's outcome (metrics).
    pub fn observer(mut self, observer: Arc<dyn CallObserver>) -> Self {
        self.observer = Some(observer);
        self
    }
    /// Puts each call's arguments (cut to 2,000 characters) on its span. Off by default:
    /// arguments may hold secrets and personal data.
    pub fn trace_arguments(mut self, on: bool) -> Self {
        self.trace_arguments = on;
        self
    }
    /// Which model operations may run at all (`models.enabled`, `models.allow` in settings),
    /// checked before the policy for every model call.
    pub fn models(mut self, models: ModelRules) -> Self {
        self.models = models;
        self
    }
    /// Refuses calls nested deeper than this (`limits.max_depth`): a model's own call has depth
    /// 0, a script's calls depth 1.
    pub fn max_depth(mut self, depth: Option<u32>) -> Self {
        self.max_depth = depth;
        self
    }
    pub fn registry(mut self, registry: Registry) -> Self {
        self.registry = registry;
        self
    }
    pub fn policy(mut self, policy: PolicySet) -> Self {
        self.policy = Some(policy);
        self
    }
    /// Adds a hook; hooks run in the order they were added.
    pub fn hook(mut self, hook: Arc<dyn Hook>) -> Self {
        self.hooks.push(hook);
        self
    }
    /// Adds command hooks, each command as a hook of its own (see `CommandHooks`).
    pub fn command_hooks(mut self, hooks: CommandHooks) -> Self {
        for hook in hooks.one_per_command() {
            self.hooks.push(Arc::new(hook));
        }
        self
    }
    pub fn approver(mut self, approver: Arc<dyn Approver>) -> Self {
        self.approver = Some(approver);
        self
    }
    pub fn budgets(mut self, budgets: Budgets) -> Self {
        self.budgets = budgets;
        self
    }
    pub fn audit(mut self, audit: AuditLog) -> Self {
        self.audit = audit;
        self
    }
    pub fn mode(mut self, mode: CodemodeMode) -> Self {
        self.mode = mode;
        self
    }
    /// The project the tools work in. Policies see `context.in_workspace` for each path; the
    /// default policy lets read-only tools read inside it and asks outside it.
    pub fn workspace(mut self, root: impl Into<PathBuf>) -> Self {
        self.workspace = Some(root.into());
        self
    }
    /// Paths no tool call may change, whatever the policy permits: checked on the call's
    /// resolved paths before the policy is asked (see [`ProtectedPath`]).
    pub fn protect(mut self, path: ProtectedPath) -> Self {
        self.protected.push(path);
        self
    }

    /// Validates the policies against the schema of the tools registered now.
    pub fn build(self) -> Result<Gate, PolicyError> {
        let set = with_codemode_permit(self.policy.unwrap_or_else(PolicySet::defaults))?;
        let schema = PolicySchema::for_registry(&self.registry)?;
        set.validate(&schema)?;
        let mut protected = self.protected;
        // The audit log and its head belong to the gate: no tool may change them.
        if let Some(log) = self.audit.path() {
            protected.push(ProtectedPath::new(log, "the audit log"));
            protected.push(ProtectedPath::new(
                crate::audit::head_path(log),
                "the audit log's head",
            ));
            let journal = crate::audit::started_path(log);
            protected.push(ProtectedPath::new(
                crate::audit::head_path(&journal),
                "the audit log's journal head",
            ));
            protected.push(ProtectedPath::new(journal, "the audit log's journal"));
        }
        // A call's settle is followed by its line in the same store: one disk flush for both.
        let hold_for = self.shared_hold_for;
        let shared = self.shared.map(|mut shared| {
            if let Some(d) = hold_for {
                shared.hold_for = d.max(std::time::Duration::from_millis(100));
            }
            shared.audit_follows = self
                .audit
                .stream_store()
                .is_some_and(|a| same_store(a, shared.store()));
            shared
        });
        Ok(Gate {
            inner: Arc::new(Inner {
                registry: self.registry,
                policy: RwLock::new(Arc::new(PolicyState { set, schema })),
                hooks: self.hooks,
                approver: self.approver,
                budgets: self.budgets,
                audit: self.audit,
                mode: self.mode,
                ledger: Ledger::with_journal_share(
                    self.journal_share
                        .unwrap_or(crate::budget::MAX_JOURNALLED_BYTES_PER_SCRIPT),
                ),
                always: Mutex::new(HashSet::new()),
                audit_failure: Mutex::new(None),
                models: self.models,
                max_depth: self.max_depth,
                // A root that is not UTF-8 has no text form: a lossy one would be another
                // directory's name, so nothing counts as inside it (tools refuse such paths).
                workspace: self
                    .workspace
                    .and_then(|w| protect::resolved(&w).to_str().map(str::to_owned)),
                protected,
                shared,
                sessions: SessionMemory::default(),
                default_principal: self.principal,
                observer: self.observer,
                spans: Mutex::new(HashMap::new()),
                trace_arguments: self.trace_arguments,
                background: TaskTracker::new(),
                script_lines: Default::default(),
            }),
        })
    }
}

/// Id of the built-in policy that lets scripts start (each of their calls is still judged).
pub const CODEMODE_PERMIT_ID: &str = "builtin-codemode-scripts";

/// Every policy set gets a permit for the `codemode` call itself, so scripts run unless a
/// policy forbids them or asks (`@ask` on a permit) first. What a script does is judged call by
/// call; a script with no permitted calls can change nothing.
/// Whether two handles are the same store (not merely the same database).
fn same_store(a: &Arc<dyn StateStore>, b: &Arc<dyn StateStore>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

fn with_codemode_permit(mut set: PolicySet) -> Result<PolicySet, PolicyError> {
    if set.ids().iter().any(|id| id == CODEMODE_PERMIT_ID) {
        return Ok(set);
    }
    set.add_source(
        "<built-in>",
        &format!(
            "@id(\"{CODEMODE_PERMIT_ID}\")\npermit (principal, action == Action::\"tool_call\", resource == Tool::\"{CODEMODE_TOOL}\");\n"
        ),
        false,
    )?;
    Ok(set)
}

impl Gate {
    pub fn builder() -> GateBuilder {
        GateBuilder {
            registry: Registry::new(),
            policy: None,
            hooks: Vec::new(),
            approver: None,
            budgets: Budgets::default(),
            audit: AuditLog::disabled(),
            mode: CodemodeMode::On,
            models: ModelRules::default(),
            max_depth: None,
            workspace: None,
            protected: Vec::new(),
            shared: None,
            shared_hold_for: None,
            journal_share: None,
            principal: None,
            observer: None,
            trace_arguments: false,
        }
    }

    /// Why every call is refused, once an audit line could not be written (the gate stays
    /// closed until the process restarts): for readiness probes, which must not call such a
    /// process ready.
    pub fn audit_failure(&self) -> Option<String> {
        self.inner
            .audit_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The state store shared budgets are kept in, if any.
    pub fn state_store(&self) -> Option<&Arc<dyn StateStore>> {
        self.inner.shared.as_ref().map(SharedLedger::store)
    }

    /// Says who a session acts for (under `serve --listen`, the name of its bearer token).
    pub fn set_principal(&self, session_id: &str, principal: Principal) {
        self.inner.sessions.set_principal(session_id, principal);
    }

    /// Says who a session acts for only while a call or cell of it runs here (see
    /// [`Gate::hold_session`]): for a cell taken over from a stopped process, whose client may
    /// never reach this one. With the last hold the gate forgets the session, as if it had
    /// ended, unless a client began it here meanwhile ([`Gate::set_principal`]). A session
    /// this process already knows keeps its principal.
    pub fn lend_principal(&self, session_id: &str, principal: Principal) {
        self.inner.sessions.lend_principal(session_id, principal);
    }

    /// Who a session acts for.
    pub fn principal_of(&self, session_id: &str) -> Option<Principal> {
        self.inner.principal_of(session_id)
    }

    /// Forgets what the gate keeps about a session in this process (its principal, "always"
    /// answers, counters), because the session ended. A call or a cell of the session still
    /// running here keeps all of it until the last of them ends (see [`Gate::hold_session`]).
    pub fn forget_session(&self, session_id: &str) {
        let inner = &self.inner;
        inner
            .sessions
            .end(session_id, |id| inner.forget_session_now(id));
    }

    /// Whether `session_id` ended ([`Gate::forget_session`]) while a call or cell of it still
    /// runs here: what it would keep for the session (`store()` values) is kept for nobody.
    pub fn session_has_ended(&self, session_id: &str) -> bool {
        self.inner.sessions.has_ended(session_id)
    }

    /// Keeps what the gate knows of a session (its principal, counters) while the returned
    /// hold lives, even past [`Gate::forget_session`]: for a cell that runs on after the request
    /// that started it. Every call holds its session by itself.
    pub fn hold_session(&self, session_id: &str) -> SessionHold {
        SessionHold::new(self.inner.clone(), session_id)
    }

    /// How many sessions (or scripts still running) the gate keeps something for in this
    /// process: a principal, "always" answers, counters. For tests of what ended sessions leave
    /// behind.
    pub fn remembered_sessions(&self) -> usize {
        let mut ids: HashSet<String> = self.inner.ledger.session_ids().into_iter().collect();
        ids.extend(self.inner.sessions.with_principal());
        let always = self.inner.always.lock();
        let always = always.unwrap_or_else(|e| e.into_inner());
        ids.extend(always.iter().map(|(scope, _)| scope.clone()));
        ids.len()
    }

    /// Waits for audit lines and settlements that dropped calls left to finish in the
    /// background, then gives back the budget leases the state store holds (call before the
    /// process exits; leases not given back expire and count as spent).
    pub async fn flush(&self) {
        self.inner.background.close();
        self.inner.background.wait().await;
        self.inner.background.reopen();
        if let Some(store) = self.state_store()
            && let Err(e) = store.close().await
        {
            tracing::warn!("{e}");
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// Counts, in a script's (and its session's) budget, a call the script got from its replay
    /// log instead of running it: the call ran, and was counted, in the process that started
    /// the script, whose counters are gone. Without this a script rebuilt in another process
    /// would start its budget again. `usage`: what it spent there (a model call's tokens and
    /// cost). Counted, never refused: the call already ran.
    pub fn count_replayed_call(
        &self,
        tool: &str,
        session_id: &str,
        script_id: &str,
        bytes: u64,
        usage: Option<&Usage>,
    ) {
        let kind = self.inner.registry.kind_of(tool).unwrap_or(CallKind::Tool);
        self.inner
            .ledger
            .count_replayed(session_id, script_id, kind, bytes, usage);
    }

    /// The paths no tool call may change (or, for secret ones, read), the audit log's included:
    /// what the programs codemode starts must be kept from too.
    pub fn protected_paths(&self) -> &[ProtectedPath] {
        &self.inner.protected
    }

    pub fn mode(&self) -> CodemodeMode {
        self.inner.mode
    }

    /// The Cedar schema the current policies were validated against.
    pub fn policy_schema(&self) -> PolicySchema {
        self.policy_state().schema.clone()
    }

    /// Replaces the policies (after tools were added, or settings changed). The new set is
    /// validated against a schema of the tools registered now; on error the old set stays.
    pub fn set_policy(&self, set: PolicySet) -> Result<(), PolicyError> {
        let set = with_codemode_permit(set)?;
        let schema = PolicySchema::for_registry(&self.inner.registry)?;
        set.validate(&schema)?;
        *self.inner.policy.write().unwrap_or_else(|e| e.into_inner()) =
            Arc::new(PolicyState { set, schema });
        Ok(())
    }

    /// Which of the current policies decide the described call, typed against the current
    /// schema (for `codemode policy explain CALL.json` inside a running session).
    pub fn explain(&self, input: &crate::policy::ExplainInput) -> crate::policy::Explanation {
        let state = self.policy_state();
        let mut input = input.clone();
        if input.workspace.is_none() {
            input.workspace = self.inner.workspace.clone();
        }
        crate::policy::explain(&state.set, Some(&state.schema), &input)
    }

    fn policy_state(&self) -> Arc<PolicyState> {
        self.inner
            .policy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Forgets a script's counters and "always" answers, returning what it used and its calls.
    pub fn end_script(&self, script_id: &str) -> LedgerSnapshot {
        self.inner
            .always
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(scope, _)| scope != script_id);
        self.inner.ledger.end_script(script_id)
    }

    /// Per-call records of a script still running (or not yet ended).
    pub fn records_for_script(&self, script_id: &str) -> Vec<CallRecord> {
        self.inner.ledger.records(script_id)
    }

    /// Everything a session has used so far.
    pub fn session_totals(&self, session_id: &str) -> LedgerSnapshot {
        self.inner.ledger.session(session_id)
    }

    /// The whole pipeline for one call: admit it, run what was admitted, finish (after-hooks,
    /// budgets, one audit line). If this future is dropped part way, the call's audit line is
    /// still written, saying it was cancelled and whether the tool had started.
    pub async fn call(&self, req: CallRequest) -> Result<ToolOutput, GateError> {
        let mut admitted = self.admit(req).await?;
        let executed = admitted.execute().await;
        admitted.finish(executed).await
    }

    /// Everything before a call runs. On refusal, the call's audit line is written here. The
    /// returned [`Admission`] holds the prepared call; whoever holds it must
    /// [`finish`](Admission::finish) it (dropping it records the call as cancelled).
    ///
    /// `Gate::call` runs the prepared tool in between; the runtime admits the `codemode` call
    /// itself this way and runs the script in between.
    pub async fn admit(&self, mut req: CallRequest) -> Result<Admission, GateError> {
        // Moved, not copied: arguments can be large, and each copy costs about 60 bytes a
        // value. The audit line, the hooks and the admitted call share this one.
        let args = Arc::new(std::mem::take(&mut req.args));
        let mut pending = Pending::new(self.inner.clone(), &req, Arc::clone(&args));
        match self.admit_steps(&req, args, &mut pending).await {
            Ok(admitted) => Ok(Admission::new(pending, admitted, req)),
            Err(e) => Err(pending.refuse(e).await),
        }
    }

    /// Records a call refused before its arguments were read (the sandbox does not decode
    /// more than the host's bounds): one audit line, status `denied` at the validate stage,
    /// with `null` arguments. Nothing runs and nothing is counted.
    pub async fn record_unread(&self, req: CallRequest, why: &str) {
        let mut pending = Pending::new(self.inner.clone(), &req, Arc::new(Value::Null));
        if let Ok(resolved) = self.resolve(&req.name, req.provenance.origin) {
            pending.note_tool(&resolved.spec);
        }
        let why = format!("its arguments were not read: {why}");
        pending.refuse(GateError::new(Stage::Validate, why)).await;
    }

    async fn admit_steps(
        &self,
        req: &CallRequest,
        mut args: Arc<Value>,
        call: &mut Pending,
    ) -> Result<Admitted, GateError> {
        let p = &req.provenance;
        if let Err(e) = self.check_open(req) {
            // Named when the name resolves, so the refusal is counted under its tool, not as
            // a made-up name.
            if let Ok(resolved) = self.resolve(&req.name, p.origin) {
                call.note_tool(&resolved.spec);
            }
            return Err(e);
        }
        let resolved = self.resolve(&req.name, p.origin)?;
        let spec = resolved.spec.clone();
        call.note_tool(&spec);

        check_args(&spec.name, resolved.validator.get(), &args)
            .map_err(|m| GateError::new(Stage::Validate, m))?;
        let mut prepared = prepare(resolved.tool.as_ref(), &spec.name, (*args).clone())?;
        call.note_facts(prepared.facts());
        self.check_facts(&spec, prepared.facts())?;

        // Counted before the policy decides, so parallel calls see each other.
        let reservation = self
            .inner
            .ledger
            .reserve(
                &self.inner.budgets,
                p,
                spec.kind,
                estimate(spec.kind, prepared.facts(), &args),
            )
            .map_err(|m| GateError::new(Stage::Budget, m))?;
        let counts = reservation.counts;
        call.note_reservation(reservation);
        if let Some(shared) = &self.inner.shared {
            let who = self.principal_of(&p.session_id);
            let estimate = estimate(spec.kind, prepared.facts(), &args);
            let hold = shared
                .reserve(
                    &self.inner.budgets.session,
                    p,
                    who.as_ref(),
                    spec.kind,
                    &estimate,
                )
                .await
                .map_err(|m| GateError::new(Stage::Budget, m))?;
            call.note_shared(hold);
        }
        let policy = self.policy_state();
        let mut ask = self.ask_policy(&policy, &spec, &args, prepared.facts(), p, counts, call)?;

        for hook in &self.inner.hooks {
            let ev = hook_event(&spec, &args, prepared.facts(), p);
            let decision = tokio::select! {
                d = hook.before(&ev) => d,
                _ = req.cancel.cancelled() => {
                    return Err(cancelled(Stage::Hook, "the call was cancelled while its hooks ran"));
                }
            };
            match decision {
                HookDecision::Allow => {}
                HookDecision::Deny(reason) => {
                    return Err(GateError::new(
                        Stage::Hook,
                        format!(
                            "a hook blocked `{}`: {reason}. No person was asked. Do not retry it unchanged; find another way",
                            spec.name
                        ),
                    ));
                }
                HookDecision::Ask(reason) => add_ask(&mut ask, format!("{reason} (hook)")),
                HookDecision::Rewrite(new_args) => {
                    check_args(&spec.name, resolved.validator.get(), &new_args).map_err(|m| {
                        GateError::new(
                            Stage::Hook,
                            format!("a hook rewrote the arguments into invalid ones, so the call is refused: {m}. No person was asked"),
                        )
                    })?;
                    // New arguments may touch other paths: prepare and decide again.
                    args = Arc::new(new_args);
                    call.note_args(&args);
                    prepared = prepare(resolved.tool.as_ref(), &spec.name, (*args).clone())?;
                    call.note_facts(prepared.facts());
                    self.check_facts(&spec, prepared.facts())?;
                    if let Some(again) =
                        self.ask_policy(&policy, &spec, &args, prepared.facts(), p, counts, call)?
                    {
                        ask = Some(again);
                    }
                }
            }
        }

        if let Some((reason, ids)) = ask {
            let asked = self
                .approve(req, &spec, &args, prepared.facts(), reason, ids)
                .await?;
            match asked {
                true => self.hold_again(call).await?,
                false => call.note_earlier_always(),
            }
        }
        Ok(Admitted {
            spec,
            args,
            prepared,
        })
    }

    /// Refuses every call once the audit log could not be written, and calls cancelled already.
    fn check_open(&self, req: &CallRequest) -> Result<(), GateError> {
        if req.cancel.is_cancelled() {
            return Err(cancelled(
                Stage::Resolve,
                "the call was cancelled before it started",
            ));
        }
        if let Some(e) = self
            .inner
            .audit_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            return Err(GateError::new(
                Stage::Resolve,
                format!(
                    "`{}` was refused: the audit log cannot be written ({e}), so every call is refused. No person was asked. Tell the user: the log's location must be fixed and codemode restarted",
                    req.name
                ),
            ));
        }
        if let Some(max) = self.inner.max_depth
            && req.provenance.depth > max
        {
            return Err(GateError::new(
                Stage::Resolve,
                format!(
                    "`{}` was refused: calls may nest at most {max} deep (`limits.max_depth` in settings), and this one is at depth {}. No person was asked. Make the call from a shallower level",
                    req.name, req.provenance.depth
                ),
            ));
        }
        Ok(())
    }

    /// What is refused on the facts alone, before any policy: model calls the settings switch
    /// off, and changes to protected paths.
    fn check_facts(&self, spec: &ToolSpec, facts: &CallFacts) -> Result<(), GateError> {
        self.check_model_settings(spec, facts)?;
        protect::check(&self.inner.protected, spec, facts)
    }

    /// Applies `models.enabled` and `models.allow` from settings to model calls.
    fn check_model_settings(&self, spec: &ToolSpec, facts: &CallFacts) -> Result<(), GateError> {
        if spec.kind != CallKind::Model {
            return Ok(());
        }
        let m = &self.inner.models;
        if m.enabled == Some(false) {
            return Err(GateError::new(
                Stage::Policy,
                format!(
                    "`{}` was refused: model operations are turned off in settings (`models.enabled`). No person was asked. Do without them, or ask the user to turn them on",
                    spec.name
                ),
            ));
        }
        if let Some(allow) = &m.allow {
            let id = facts
                .model
                .as_ref()
                .map(|f| format!("{}/{}", f.provider, f.id))
                .unwrap_or_default();
            if !allow.contains(&id) {
                return Err(GateError::new(
                    Stage::Policy,
                    format!(
                        "`{}` was refused: model `{id}` is not in `models.allow` in settings. No person was asked. Use one of: {}",
                        spec.name,
                        allow.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Finds the tool and checks that this caller may reach it at all.
    fn resolve(&self, name: &str, origin: Origin) -> Result<Resolved, GateError> {
        let found = match self.inner.registry.lookup(name) {
            Lookup::Found(r) => *r,
            Lookup::Missing { suggestions } => {
                let hint = if suggestions.is_empty() {
                    "`await searchTools(\"...\")` lists the tools that exist".to_string()
                } else {
                    format!(
                        "did you mean {}?",
                        suggestions
                            .iter()
                            .map(|s| format!("`{s}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                return Err(GateError::new(
                    Stage::Resolve,
                    format!("no tool named `{}`; {hint}", crate::preview(name, 100)),
                ));
            }
        };
        let spec = &found.spec;
        let id = spec.identifier();
        let refuse = |m: String| Err(GateError::new(Stage::Resolve, m));
        if spec.exposure == Exposure::Hidden {
            return refuse(format!(
                "`{}` was refused: it is hidden by configuration, so nobody may call it. No person was asked. Use another tool",
                spec.name
            ));
        }
        match origin {
            Origin::Model if spec.name == CODEMODE_TOOL => {}
            Origin::Script if spec.name == CODEMODE_TOOL => {
                return refuse(
                    "`codemode` was refused: a script cannot start another codemode script. No person was asked. Call the tools directly from this script"
                        .to_string(),
                );
            }
            Origin::Model if self.inner.mode == CodemodeMode::Only => {
                return refuse(format!(
                    "`{}` was refused: it cannot be called directly in codemode `only` mode. No person was asked. Call it from a script instead: `await tools.{id}(...)` inside codemode",
                    spec.name
                ));
            }
            Origin::Model if spec.exposure == Exposure::Direct && found.active => {}
            Origin::Model => {
                return refuse(format!(
                    "`{}` was refused: it is not one of your declared tools. No person was asked. Call it from a script instead: `await tools.{id}(...)` inside codemode",
                    spec.name
                ));
            }
            Origin::Script if spec.exposure == Exposure::Direct && !found.active => {
                return refuse(format!(
                    "`{}` was refused: it is not active now, so scripts cannot call it (it may have been deactivated while the script ran). No person was asked. Use another tool, or ask the user to activate it",
                    spec.name
                ));
            }
            Origin::Script => {}
            // The client's own request (a resource the person chose to read): not the model's
            // declared tools, so exposure does not apply; policy, hooks and audit still do.
            Origin::Client if spec.name == CODEMODE_TOOL => {
                return refuse(
                    "`codemode` was refused: it runs only as the model's tool call. No person was asked"
                        .to_string(),
                );
            }
            Origin::Client => {}
        }
        Ok(found)
    }

    /// Runs the policy on the counts reserved for this call. `Ok(Some(..))` means approval is
    /// needed.
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn ask_policy(
        &self,
        policy: &PolicyState,
        spec: &ToolSpec,
        args: &Value,
        facts: &CallFacts,
        p: &Provenance,
        (script, session): (crate::policy::Counts, crate::policy::Counts),
        call: &mut Pending,
    ) -> Result<Option<(String, Vec<String>)>, GateError> {
        let decision = decide(
            &policy.set,
            Some(&policy.schema),
            &PolicyInput {
                spec,
                args,
                facts,
                provenance: p,
                script,
                session,
                workspace: self.inner.workspace.as_deref(),
            },
        );
        call.note_decision(&decision);
        match decision {
            Decision::Allow { .. } => Ok(None),
            Decision::Ask { reason, policy_ids } => Ok(Some((reason, policy_ids))),
            Decision::Deny {
                message,
                policy_ids,
            } => Err(GateError::new(Stage::Policy, message).with_policies(policy_ids)),
        }
    }

    /// A person may answer after the shared hold expired (it does, so that a dead replica's
    /// budget comes back), and the budget may have been spent meanwhile: the approved call is
    /// held again before it runs, and refused if there is no room left.
    async fn hold_again(&self, call: &mut Pending) -> Result<(), GateError> {
        let (Some(shared), Some(hold)) = (&self.inner.shared, call.take_shared()) else {
            return Ok(());
        };
        let renewed = shared
            .renew(hold)
            .await
            .map_err(|m| GateError::new(Stage::Budget, m))?;
        call.note_shared(Some(renewed));
        Ok(())
    }

    /// Asks a person when needed. `Ok(true)`: a person was asked and agreed; `Ok(false)`: an
    /// earlier "always" in the same script covers the call.
    async fn approve(
        &self,
        req: &CallRequest,
        spec: &ToolSpec,
        args: &Value,
        facts: &CallFacts,
        reason: String,
        policy_ids: Vec<String>,
    ) -> Result<bool, GateError> {
        let p = &req.provenance;
        // "Always" holds for the rest of one script. A direct or client call has no script, so
        // there it approves that call alone: a session-wide "always" given on a harmless
        // direct `bash` would let the model run any command unasked for the rest of the session.
        let key = p
            .script_id
            .clone()
            .map(|script| (script, spec.name.clone()));
        if let Some(key) = &key
            && self
                .inner
                .always
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(key)
        {
            return Ok(false);
        }
        let unasked = |why: &str| {
            GateError::new(
                Stage::Approval,
                format!(
                    "`{}` was not run: it needs the user's approval ({reason}), but codemode could not ask: {why}. No person was asked. Do not retry it; ask the user to allow `{}` (a policy that permits it), or to use a client that can show approval requests",
                    spec.name, spec.name
                ),
            )
            .with_policies(policy_ids.clone())
        };
        let Some(approver) = &self.inner.approver else {
            return Err(unasked("nobody is available to approve calls here"));
        };
        let question = ApprovalRequest {
            tool_name: spec.name.clone(),
            kind: spec.kind,
            args: args.clone(),
            paths: facts.paths.clone(),
            provenance: p.clone(),
            reason: reason.clone(),
            policy_ids: policy_ids.clone(),
        };
        // The script's deadline stands still while a person reads the question.
        let _pause = req.clock.as_ref().map(DeadlineClock::pause);
        let answer = tokio::select! {
            a = approver.approve(&question) => Some(a),
            _ = req.cancel.cancelled() => None,
        };
        match answer {
            Some(ApprovalAnswer::Yes) => Ok(true),
            Some(ApprovalAnswer::Always) => {
                if let Some(key) = key {
                    self.inner.always.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
                }
                Ok(true)
            }
            Some(ApprovalAnswer::No) => Err(GateError::new(
                Stage::Approval,
                format!("`{}` was not approved: the user was asked ({reason}) and said no, so it was not run. Do not retry it; find another way, or ask the user to allow `{}`", spec.name, spec.name),
            )
            .with_policies(policy_ids)),
            Some(ApprovalAnswer::Unasked(why)) => Err(unasked(why)),
            None => Err(cancelled(Stage::Approval, "the call was cancelled while waiting for approval")
                .with_policies(policy_ids)),
        }
    }
}

/// What admission hands to the run: the resolved spec, the final arguments and the prepared
/// call the decision was made on.
pub(crate) struct Admitted {
    pub spec: ToolSpec,
    pub args: Arc<Value>,
    pub prepared: Box<dyn PreparedCall>,
}

/// A refusal because the caller cancelled: recorded as `cancelled`, not `denied`.
fn cancelled(stage: Stage, message: &str) -> GateError {
    let mut e = GateError::new(stage, message);
    e.tool_error = Some(codemode_spec::ToolErrorKind::Cancelled);
    e
}

fn add_ask(ask: &mut Option<(String, Vec<String>)>, reason: String) {
    match ask {
        Some((r, _)) if !r.is_empty() => {
            r.push_str("; ");
            r.push_str(&reason);
        }
        Some((r, _)) => *r = reason,
        None => *ask = Some((reason, Vec::new())),
    }
}

pub(crate) fn hook_event(
    spec: &ToolSpec,
    args: &Value,
    facts: &CallFacts,
    p: &Provenance,
) -> HookEvent {
    HookEvent {
        tool_name: spec.name.clone(),
        kind: spec.kind,
        args: args.clone(),
        paths: facts.paths.clone(),
        model: facts.model.clone(),
        script: facts.script.clone(),
        provenance: p.clone(),
    }
}

fn prepare(tool: &dyn Tool, name: &str, args: Value) -> Result<Box<dyn PreparedCall>, GateError> {
    tool.prepare(args).map_err(|e| {
        GateError::new(
            Stage::Facts,
            format!("`{name}` refused these arguments: {}", e.message),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AuditKey;
    use codemode_spec::{ToolError, prepared};
    use serde_json::json;

    struct Echo(ToolSpec);
    impl Tool for Echo {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
            Ok(prepared(CallFacts::default(), move |_| {
                Box::pin(async move { Ok(ToolOutput::value(args)) })
            }))
        }
    }

    #[tokio::test]
    async fn calls_are_refused_once_an_audit_line_cannot_be_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open_with_key(&path, AuditKey::from_bytes([7; 32])).unwrap();
        let reg = Registry::new();
        reg.register(Arc::new(Echo(ToolSpec::new("t", "", json!({})))))
            .unwrap();
        let policy = PolicySet::parse("p", "permit(principal, action, resource);").unwrap();
        let gate = Gate::builder()
            .registry(reg)
            .policy(policy)
            .audit(log)
            .build()
            .unwrap();
        let mut call = CallRequest::new("t", json!({}), Provenance::model("c1", "s"));
        call.provenance.origin = Origin::Script;
        gate.call(call.clone()).await.unwrap();
        // Something else wrote a line the chain cannot continue from: the next line fails.
        use std::io::Write;
        let mut raw = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        raw.write_all(b"{\"forged\":true}\n").unwrap();
        let _ = gate.call(call.clone()).await;
        let err = gate.call(call).await.unwrap_err();
        assert_eq!(err.stage, Stage::Resolve);
        assert!(
            err.message.contains("audit log cannot be written"),
            "{}",
            err.message
        );
    }
}
