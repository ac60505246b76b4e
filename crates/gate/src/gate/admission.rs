//! A call between its admission and its outcome line, and the guard that makes sure the line is
//! written exactly once, whatever happens to the caller.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use codemode_spec::{
    CallFacts, CallKind, ContentBlock, Effect, HeldMemory, PreparedCall, Provenance, RunContext,
    ScriptFacts, ToolError, ToolErrorKind, ToolOutput, ToolSpec, Usage,
};
use codemode_state::Durability;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::script_lines::ScriptLines;
use super::{Admitted, CallRequest, Inner, ResultRoom, hook_event};
use crate::audit::{PendingLine, sha256_hex};
use crate::budget::{Reservation, SettleError, SharedHold};
use crate::error::{GateError, Stage};
use crate::hooks::AfterDecision;
use crate::outcome::{CallOutcome, Status};
use crate::policy::Decision;

/// What the gate has learned about a call so far, and the promise of its one outcome line: if
/// the call is dropped before [`Pending::write`] ran, `Drop` writes a `cancelled` line.
pub(crate) struct Pending {
    gate: Arc<Inner>,
    started: Instant,
    provenance: Provenance,
    tool: String,
    namespace: Option<String>,
    /// Why this call's own line could not be written, if it could not.
    line_failed: Option<String>,
    kind: Option<CallKind>,
    /// Shared with the admitted call: one copy of big arguments, not one per stage.
    args: Arc<Value>,
    paths: Vec<String>,
    script: Option<ScriptFacts>,
    decision: &'static str,
    policy_ids: Vec<String>,
    reservation: Option<Reservation>,
    /// The tool was started; `effect` is what it reported when it ended.
    ran: bool,
    effect: Option<Effect>,
    usage: Option<Usage>,
    /// Its start's id in the journal.
    journal_id: Option<String>,
    /// For a script's `codemode` call on a stream: its calls' lines still being written.
    script_lines: Option<Arc<ScriptLines>>,
    written: bool,
    /// Renews the shared hold while the call runs; dropping it stops that.
    hold_alive: Option<tokio_util::sync::DropGuard>,
    /// The call's span (disabled unless a subscriber wants `codemode::call`).
    pub span: tracing::Span,
    /// Keeps the session's principal and counters until the call's line is written, even if
    /// the session ends meanwhile (fields drop after `Drop` wrote the line).
    _session: super::SessionHold,
}

/// A span per call, the child of its parent call's span when that one is still in flight.
macro_rules! call_span {
    ($($parent:expr)?; $name:expr, $req:expr) => {
        tracing::info_span!(
            target: "codemode::call",
            $(parent: $parent,)?
            "codemode.call",
            otel.name = %$name,
            otel.status_code = tracing::field::Empty,
            codemode.tool = %$name,
            codemode.call_id = %$req.provenance.call_id,
            codemode.parent_call_id = $req.provenance.parent_call_id.as_deref(),
            codemode.session = %$req.provenance.session_id,
            codemode.origin = ?$req.provenance.origin,
            codemode.depth = $req.provenance.depth,
            codemode.decision = tracing::field::Empty,
            codemode.policy_ids = tracing::field::Empty,
            codemode.status = tracing::field::Empty,
            codemode.stage = tracing::field::Empty,
            codemode.effect = tracing::field::Empty,
            codemode.duration_ms = tracing::field::Empty,
            codemode.bytes = tracing::field::Empty,
            codemode.usage.input_tokens = tracing::field::Empty,
            codemode.usage.output_tokens = tracing::field::Empty,
            codemode.usage.cost_usd = tracing::field::Empty,
            codemode.args = tracing::field::Empty,
        )
    };
}

fn span_for(gate: &Inner, req: &CallRequest) -> tracing::Span {
    let name = crate::preview(&req.name, 200);
    let parent = req
        .provenance
        .parent_call_id
        .as_ref()
        .and_then(|id| lock(&gate.spans).get(id).cloned());
    let span = match &parent {
        Some(parent) => call_span!(parent; name, req),
        None => call_span!(; name, req),
    };
    if !span.is_disabled() {
        lock(&gate.spans).insert(req.provenance.call_id.clone(), span.clone());
    }
    span
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pending {
    pub fn new(gate: Arc<Inner>, req: &CallRequest, args: Arc<Value>) -> Self {
        let span = span_for(&gate, req);
        Pending {
            _session: super::SessionHold::new(gate.clone(), &req.provenance.session_id),
            span,
            gate,
            started: Instant::now(),
            provenance: req.provenance.clone(),
            tool: crate::preview(&req.name, 200),
            namespace: None,
            line_failed: None,
            kind: None,
            args,
            paths: Vec::new(),
            script: None,
            decision: "none",
            policy_ids: Vec::new(),
            reservation: None,
            ran: false,
            effect: None,
            usage: None,
            journal_id: None,
            script_lines: None,
            written: false,
            hold_alive: None,
        }
    }

    /// The call starts running: from now on its shared hold is renewed until it ends.
    fn mark_ran(&mut self) {
        self.ran = true;
        if let (Some(shared), Some(hold)) = (
            &self.gate.shared,
            self.reservation.as_ref().and_then(|r| r.shared.as_ref()),
        ) {
            self.hold_alive = shared.keep_alive(hold);
        }
    }

    pub fn note_tool(&mut self, spec: &ToolSpec) {
        self.tool = spec.name.clone();
        self.namespace = spec.namespace.clone();
        self.kind = Some(spec.kind);
    }

    pub fn note_args(&mut self, args: &Arc<Value>) {
        self.args = Arc::clone(args);
    }

    pub fn note_facts(&mut self, facts: &CallFacts) {
        self.paths = facts.paths.clone();
        self.script = facts.script.clone();
    }

    pub fn note_reservation(&mut self, r: Reservation) {
        self.reservation = Some(r);
    }

    pub fn note_shared(&mut self, hold: Option<SharedHold>) {
        if let Some(r) = self.reservation.as_mut() {
            r.shared = hold;
        }
    }

    /// Takes the shared hold out, to be held again ([`Pending::note_shared`] puts it back).
    pub fn take_shared(&mut self) -> Option<SharedHold> {
        self.reservation.as_mut()?.shared.take()
    }

    /// The policy asked, and a person's earlier "always" in this script answered: nobody was
    /// asked this time, which the line says as decision `always`.
    pub fn note_earlier_always(&mut self) {
        self.decision = "always";
    }

    pub fn note_decision(&mut self, d: &Decision) {
        self.decision = d.as_str();
        self.policy_ids = d.policy_ids().to_vec();
    }

    /// A refusal before anything ran: the reservation is given back, the line written.
    pub async fn refuse(mut self, e: GateError) -> GateError {
        if let Some(r) = self.reservation.take() {
            self.gate.ledger.release(&self.provenance, &r);
            if let (Some(hold), Some(shared)) = (&r.shared, &self.gate.shared) {
                shared.release(hold).await;
            }
        }
        let status = if e.tool_error == Some(ToolErrorKind::Cancelled) {
            Status::Cancelled
        } else {
            Status::Denied
        };
        let line = self.write(status, Some(e.stage), Some(&e.message), Effect::None, 0);
        self.store_line(line).await;
        e
    }

    /// Replaces the reservation's estimate with what the call spent.
    async fn settle(&mut self, usage: Option<&Usage>, bytes: u64) -> Result<(), String> {
        self.hold_alive = None;
        self.usage = usage.cloned();
        let Some(r) = self.reservation.take() else {
            return Ok(());
        };
        let local = self
            .gate
            .ledger
            .settle(&self.gate.budgets, &self.provenance, &r, usage, bytes);
        let shared = match (&r.shared, &self.gate.shared) {
            // Every caller writes the call's line next and waits for it.
            (Some(hold), Some(shared)) => match shared.settle(hold, usage, bytes, true).await {
                Ok(()) => Ok(()),
                Err(SettleError::Overrun(m)) => Err(m),
                Err(SettleError::Store(m)) => {
                    let (gate, hold, usage) = (self.gate.clone(), hold.clone(), usage.cloned());
                    in_background(&self.gate, async move {
                        if let Some(shared) = &gate.shared {
                            shared.settle_later(&hold, usage.as_ref(), bytes).await;
                        }
                    });
                    Err(m)
                }
            },
            _ => Ok(()),
        };
        local.and(shared)
    }

    /// Counts a script call's arguments into its script's journal share: the refusal, when the
    /// share is spent (a limit of the script's, not a failure of the log: other calls go on).
    fn spend_journal_share(&self, args_bytes: usize) -> Option<String> {
        let script_id = self.provenance.script_id.as_ref()?;
        let bytes = args_bytes.min(WHOLE_ARGUMENTS) as u64;
        (!self.gate.ledger.journal(script_id, bytes)).then(|| {
            format!(
                "`{}` was not run: this script's calls have put {} bytes of arguments in the audit journal, the most one script may, so nothing was changed. No person was asked. Do the rest in another script, or pass less per call",
                self.tool,
                self.gate.ledger.journal_share()
            )
        })
    }

    /// Records in the journal that the call is about to run, before it can change anything, so
    /// a process killed while it runs still leaves a trace. An error means it must not run.
    async fn journal_start(&mut self, args_text: String) -> Result<(), crate::audit::AuditError> {
        let journal_id = uuid::Uuid::new_v4().simple().to_string();
        let mut record = serde_json::json!({
            "time": utc_now(),
            "event": "started",
            "journal_id": &journal_id,
            "provenance": &self.provenance,
            "tool": &self.tool,
            "namespace": &self.namespace,
            "kind": self.kind,
            "args_sha256": sha256_hex(args_text.as_bytes()),
            "args_preview": crate::preview(&args_text, 200),
            "paths": &self.paths,
            "decision": self.decision,
            "policy_ids": &self.policy_ids,
        });
        // The preview can be padded to look harmless; the journal keeps what will run.
        if let Value::Object(map) = &mut record {
            map.extend(whole_arguments(&args_text));
        }
        let Value::Object(record) = record else {
            return Ok(());
        };
        if let Some(line) = self.gate.audit.submit_started(record)? {
            line.await?;
        }
        self.journal_id = Some(journal_id);
        Ok(())
    }

    /// Waits for a stream's line; a line that cannot be stored refuses every later call. A
    /// script's line waits for its calls' lines first, so it follows them in the stream.
    async fn store_line(&mut self, line: Option<PendingLine>) {
        if let Some(lines) = self.script_lines.take() {
            self.gate.script_lines.close(&lines);
            let ours = async move {
                let theirs = lines.wait().await;
                let ours = match line {
                    Some(line) => line.await,
                    None => Ok(()),
                };
                (theirs, ours)
            };
            // On a task of its own: a caller that stops waiting here must not stop the
            // script's line, which is only handed to the store once its calls' lines are in.
            let (theirs, ours) = match tokio::runtime::Handle::try_current() {
                Ok(rt) => match self.gate.background.spawn_on(ours, &rt).await {
                    Ok(done) => done,
                    Err(e) => (Some(format!("the task writing them failed: {e}")), Ok(())),
                },
                Err(_) => ours.await,
            };
            if let Some(e) = theirs {
                self.line_failed = Some(format!("a line of a call the script made: {e}"));
            }
            if let Err(e) = ours {
                audit_failed(&self.gate, &e);
                self.line_failed = Some(e.to_string());
            }
            return;
        }
        if let Some(line) = line
            && let Err(e) = line.await
        {
            audit_failed(&self.gate, &e);
            self.line_failed = Some(e.to_string());
        }
    }

    /// Gives a journalled script call's outcome line to its script to wait for (see
    /// `script_lines`); returns the line if the call must wait for it itself.
    fn hand_to_script(&mut self, line: Option<PendingLine>) -> Option<PendingLine> {
        let line = line?;
        let parent = match &self.provenance.parent_call_id {
            Some(p) if self.journal_id.is_some() && self.provenance.depth > 0 => p.clone(),
            _ => return Some(line),
        };
        // Given back (`Err`) when the script is not open: the call then waits for it itself.
        self.gate
            .script_lines
            .hand_over(&self.gate, &self.provenance.session_id, &parent, line)
            .err()
    }

    /// The call's one outcome line, and its record on the script's ledger. A file's line is
    /// written here; a stream's is returned to be awaited.
    fn write(
        &mut self,
        status: Status,
        stage: Option<Stage>,
        message: Option<&str>,
        effect: Effect,
        bytes: u64,
    ) -> Option<PendingLine> {
        if self.written {
            return None;
        }
        self.written = true;
        let args_text = serde_json::to_string(&*self.args).unwrap_or_default();
        let outcome = CallOutcome {
            time: utc_now(),
            provenance: self.provenance.clone(),
            principal: self
                .gate
                .principal_of(&self.provenance.session_id)
                .map(|p| p.id),
            tool: self.tool.clone(),
            namespace: self.namespace.clone(),
            kind: self.kind,
            args_sha256: sha256_hex(args_text.as_bytes()),
            args_preview: crate::preview(&args_text, 200),
            paths: std::mem::take(&mut self.paths),
            script: self.script.take(),
            decision: self.decision.to_string(),
            policy_ids: std::mem::take(&mut self.policy_ids),
            status,
            stage,
            message: message.map(|m| crate::preview(m, 500)),
            effect,
            duration_ms: self.started.elapsed().as_millis() as u64,
            usage: self.usage.clone(),
            bytes,
            journal_id: self.journal_id.clone(),
        };
        self.trace(&outcome, &args_text);
        if let Some(observer) = &self.gate.observer {
            observer.finished(&outcome);
        }
        let mut pending = None;
        // A script's call is committed before its result goes back to the script, but its flush
        // to disk can wait for the script's own `codemode` line, which is durable and comes
        // after it: nothing the script did reaches the model before every line of it is on disk.
        let durability = if self.provenance.depth > 0 {
            Durability::Deferred
        } else {
            Durability::Now
        };
        if let Ok(Value::Object(record)) = serde_json::to_value(&outcome) {
            match self.gate.audit.submit_with(record, durability) {
                Ok(line) => pending = line,
                Err(e) => {
                    audit_failed(&self.gate, &e);
                    self.line_failed = Some(e.to_string());
                }
            }
        }
        if let Some(script_id) = &self.provenance.script_id {
            self.gate.ledger.record(script_id, outcome);
        }
        pending
    }

    /// Puts the outcome on the call's span, and ends the span's life as a parent.
    fn trace(&self, o: &CallOutcome, args_text: &str) {
        lock(&self.gate.spans).remove(&self.provenance.call_id);
        let span = &self.span;
        if span.is_disabled() {
            return;
        }
        span.record("codemode.tool", o.tool.as_str());
        let name = match o.kind {
            Some(_) => o.tool.as_str(),
            None => crate::UNRESOLVED_TOOL,
        };
        span.record("otel.name", name);
        span.record("codemode.decision", o.decision.as_str());
        span.record("codemode.policy_ids", o.policy_ids.join(",").as_str());
        span.record("codemode.status", o.status.as_str());
        if let Some(stage) = o.stage {
            span.record("codemode.stage", stage.as_str());
        }
        span.record(
            "codemode.effect",
            format!("{:?}", o.effect).to_lowercase().as_str(),
        );
        span.record("codemode.duration_ms", o.duration_ms);
        span.record("codemode.bytes", o.bytes);
        if let Some(u) = &o.usage {
            span.record("codemode.usage.input_tokens", u.input_tokens);
            span.record("codemode.usage.output_tokens", u.output_tokens);
            span.record("codemode.usage.cost_usd", u.cost_usd);
        }
        span.record(
            "otel.status_code",
            if matches!(o.status, Status::Ok) {
                "ok"
            } else {
                "error"
            },
        );
        if self.gate.trace_arguments {
            span.record("codemode.args", crate::preview(args_text, 2000).as_str());
        }
    }
}

pub(super) fn audit_failed(gate: &Inner, e: &crate::audit::AuditError) {
    tracing::error!("{e}");
    *lock(&gate.audit_failure) = Some(e.to_string());
}

/// Finishes in the background what a dropped call could not wait for.
fn in_background(gate: &Arc<Inner>, work: impl std::future::Future<Output = ()> + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            gate.background.spawn_on(work, &rt);
        }
        Err(_) => {
            // No runtime to finish on: nothing may go unrecorded, so later calls are refused.
            tracing::error!(
                "a dropped call's audit line or budget could not be finished: no async runtime"
            );
            *lock(&gate.audit_failure) =
                Some("a dropped call's line could not be written outside an async runtime".into());
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.hold_alive = None;
        // A script's line follows its calls' lines, here too; each of those reports its own
        // failure.
        let script_lines = self.script_lines.take();
        if let Some(lines) = &script_lines {
            self.gate.script_lines.close(lines);
        }
        if self.written {
            if let Some(lines) = script_lines {
                in_background(&self.gate, async move {
                    lines.wait().await;
                });
            }
            return;
        }
        // The caller stopped waiting. A call that never started gives its reservation back; one
        // that started keeps it, and is charged its estimate, since what it spent is unknown.
        let ran = self.ran;
        if let Some(r) = self.reservation.take() {
            let charged = r.charged_when_unknown();
            if ran {
                self.usage = charged.clone();
                let _ = self.gate.ledger.settle(
                    &self.gate.budgets,
                    &self.provenance,
                    &r,
                    charged.as_ref(),
                    0,
                );
            } else {
                self.gate.ledger.release(&self.provenance, &r);
            }
            if let Some(hold) = r.shared.clone() {
                let gate = self.gate.clone();
                in_background(&self.gate, async move {
                    if let Some(shared) = &gate.shared {
                        if ran {
                            // The line is written by another task, maybe first: settle durably.
                            if let Err(SettleError::Store(_)) =
                                shared.settle(&hold, charged.as_ref(), 0, false).await
                            {
                                shared.settle_later(&hold, charged.as_ref(), 0).await;
                            }
                        } else {
                            shared.release(&hold).await;
                        }
                    }
                });
            }
        }
        let (stage, effect) = if self.ran {
            (Stage::Execute, self.effect.unwrap_or(Effect::Unknown))
        } else {
            (Stage::Resolve, Effect::None)
        };
        let message = if self.ran {
            "the caller stopped waiting while the call ran"
        } else {
            "the caller stopped waiting before the call ran"
        };
        if let Some(line) = self.write(Status::Cancelled, Some(stage), Some(message), effect, 0) {
            let gate = self.gate.clone();
            in_background(&self.gate, async move {
                if let Some(lines) = script_lines {
                    lines.wait().await;
                }
                if let Err(e) = line.await {
                    audit_failed(&gate, &e);
                }
            });
        }
    }
}

/// A call the gate admitted: decided on, counted, not yet run. [`Admission::finish`] writes its
/// outcome; dropping it unfinished records it as cancelled.
pub struct Admission {
    pending: Pending,
    spec: ToolSpec,
    args: Arc<Value>,
    facts: CallFacts,
    prepared: Option<Box<dyn PreparedCall>>,
    provenance: Provenance,
    cancel: CancellationToken,
    result_room: Option<ResultRoom>,
}

impl Admission {
    pub(crate) fn new(pending: Pending, admitted: Admitted, req: CallRequest) -> Self {
        Admission {
            pending,
            facts: admitted.prepared.facts().clone(),
            spec: admitted.spec,
            args: admitted.args,
            prepared: Some(admitted.prepared),
            provenance: req.provenance,
            cancel: req.cancel,
            result_room: req.result_room,
        }
    }

    /// The call's id: what nested calls name as their parent.
    pub fn call_id(&self) -> &str {
        &self.provenance.call_id
    }

    /// The id of the call's "started" line in the journal, once [`Admission::begin`] or
    /// [`Admission::execute`] wrote it: whoever writes the call's outcome line elsewhere (a
    /// replica finishing a taken-over cell) names it there.
    pub fn journal_id(&self) -> Option<&str> {
        self.pending.journal_id.as_deref()
    }

    pub fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// The arguments the call was decided on (after any hook's rewrite).
    pub fn args(&self) -> &Value {
        &self.args
    }

    /// The facts the call was decided on.
    pub fn facts(&self) -> &CallFacts {
        &self.facts
    }

    /// Marks the call as started, for work done by the caller instead of the prepared tool
    /// (the runtime runs the `codemode` call's script itself). Like [`Admission::execute`], it
    /// journals the call first, so a script whose process is killed leaves its own start (its
    /// hash and first lines) beside its calls'. An error means the work must not start; the
    /// call's outcome line is written when the error is passed to [`Admission::finish`].
    pub async fn begin(&mut self) -> Result<(), ToolError> {
        self.record_start().await?;
        self.pending.mark_ran();
        if self.spec.name == crate::registry::CODEMODE_TOOL
            && self.pending.gate.audit.stream_store().is_some()
        {
            let lines = self
                .pending
                .gate
                .script_lines
                .open(&self.provenance.session_id, &self.provenance.call_id);
            self.pending.script_lines = lines;
        }
        Ok(())
    }

    /// Checks the log and journals the call (unless the tool is read-only).
    async fn record_start(&mut self) -> Result<(), ToolError> {
        // A server's read-only hint is its own claim about a program codemode does not run:
        // only tools registered in this process (no namespace) are taken at their word.
        let trusted_read_only =
            self.spec.annotations.read_only_hint == Some(true) && self.spec.namespace.is_none();
        let recorded = match self.pending.gate.audit.check_intact() {
            Ok(()) if !trusted_read_only && self.pending.gate.audit.has_journal() => {
                let args_text = serde_json::to_string(&*self.pending.args).unwrap_or_default();
                if let Some(why) = self.pending.spend_journal_share(args_text.len()) {
                    return Err(ToolError::failed(why).with_effect(Effect::None));
                }
                self.pending.journal_start(args_text).await
            }
            other => other,
        };
        if let Err(e) = recorded {
            audit_failed(&self.pending.gate, &e);
            return Err(ToolError::failed(format!(
                "`{}` was not run: the audit log cannot record it ({e}), so every later call is refused too. No person was asked. Tell the user: the audit log must be fixed and codemode restarted",
                self.spec.name
            ))
            .with_effect(Effect::None));
        }
        Ok(())
    }

    /// Runs the prepared call: exactly what was decided on. Cancellation is cooperative: the
    /// tool sees the call's token and says in its error whether its effect happened.
    pub async fn execute(&mut self) -> Result<ToolOutput, ToolError> {
        let Some(prepared) = self.prepared.take() else {
            return Err(ToolError::failed("the call was already run").with_effect(Effect::None));
        };
        // Admission can take long (a schema check of a huge argument, a person asked): a call
        // whose script stopped meanwhile must not go out after it.
        if self.cancel.is_cancelled() {
            return Err(ToolError::cancelled());
        }
        // A read-only call killed with its process leaves nothing to account for: its result
        // dies with the process. Every other call is journalled before it runs, and so is every
        // MCP call, whatever its server says.
        self.record_start().await?;
        self.pending.mark_ran();
        let result = tracing::Instrument::instrument(
            prepared.run(RunContext {
                provenance: self.provenance.clone(),
                cancel: self.cancel.clone(),
            }),
            self.pending.span.clone(),
        )
        .await;
        self.pending.effect = Some(match &result {
            Ok(_) => Effect::Applied,
            Err(e) => e.effect,
        });
        result
    }

    /// Ends the call in this process because another one carries it on (this process let go
    /// of the cell it runs, or another took it over): its line says so, `cancelled` with
    /// `why`, rather than the error the stopped run would show, which read as if the script
    /// had failed. The process that carries it on writes how it ended, naming the same journal
    /// line. What the call held is charged as spent: it ran here.
    pub async fn hand_over(mut self, why: &str) {
        let charged = self
            .pending
            .reservation
            .as_ref()
            .and_then(|r| r.charged_when_unknown());
        let _ = self.pending.settle(charged.as_ref(), 0).await;
        let line = self.pending.write(
            Status::Cancelled,
            Some(Stage::Execute),
            Some(why),
            Effect::Unknown,
            0,
        );
        self.pending.store_line(line).await;
    }

    /// After-hooks, budgets settled with what the call spent, and its one audit line.
    pub async fn finish(
        mut self,
        executed: Result<ToolOutput, ToolError>,
    ) -> Result<ToolOutput, GateError> {
        let name = self.spec.name.clone();
        let mut output = match executed {
            Ok(o) => o,
            Err(e) => {
                let cancelled = e.kind == ToolErrorKind::Cancelled;
                let mut err = GateError::new(
                    Stage::Execute,
                    if cancelled {
                        format!("`{name}` was cancelled")
                    } else {
                        format!("`{name}` failed: {}", e.message)
                    },
                );
                err.tool_error = Some(e.kind);
                // A model call whose request may have gone out is charged its reservation: the
                // provider may bill it, and it must not come free.
                let charged = match e.effect {
                    Effect::None => None,
                    _ => self
                        .pending
                        .reservation
                        .as_ref()
                        .and_then(Reservation::charged_when_unknown),
                };
                let _ = self.pending.settle(charged.as_ref(), 0).await;
                let status = if cancelled {
                    Status::Cancelled
                } else {
                    Status::Error
                };
                let line = self.pending.write(
                    status,
                    Some(Stage::Execute),
                    Some(&err.message),
                    e.effect,
                    0,
                );
                self.pending.store_line(line).await;
                return Err(err);
            }
        };
        self.pending.effect = Some(Effect::Applied);
        // Counted where the caller keeps results from now on: hooks, the audit line and the way
        // back may take a while, and a script can have thousands of calls ending at once.
        if let Some(room) = self.result_room.take() {
            match room.reserve(result_size(&output)) {
                Ok(share) => {
                    output.held = HeldMemory::new((std::mem::take(&mut output.held), share));
                }
                Err(message) => {
                    let usage = output.usage.take();
                    drop(output);
                    let _ = self.pending.settle(usage.as_ref(), 0).await;
                    let line = self.pending.write(
                        Status::Error,
                        Some(Stage::Execute),
                        Some(&message),
                        Effect::Applied,
                        0,
                    );
                    self.pending.store_line(line).await;
                    return Err(GateError::new(Stage::Execute, message));
                }
            }
        }
        let ev = hook_event(&self.spec, &self.args, &self.facts, &self.provenance);
        let gate = self.pending.gate.clone();
        for hook in &gate.hooks {
            match hook.after(&ev, &output).await {
                AfterDecision::Keep => {}
                AfterDecision::Replace(mut o) => {
                    // Usage was spent whatever the hook shows the caller; the room reserved
                    // stays held with what the caller gets.
                    o.usage = output.usage.clone();
                    o.held = output.held.clone();
                    output = o;
                }
                AfterDecision::Block(reason) => {
                    let _ = self.pending.settle(output.usage.as_ref(), 0).await;
                    let err = GateError::new(
                        Stage::AfterHook,
                        format!("a hook withheld the result of `{name}`: {reason}"),
                    );
                    let line = self.pending.write(
                        Status::Denied,
                        Some(Stage::AfterHook),
                        Some(&err.message),
                        Effect::Applied,
                        0,
                    );
                    self.pending.store_line(line).await;
                    return Err(err);
                }
            }
        }
        // A script's text is made of its calls' results, which were counted as they returned.
        let bytes = if self.spec.name == crate::registry::CODEMODE_TOOL {
            0
        } else {
            codemode_spec::json_text_len(&output.value) as u64
        };
        if let Err(m) = self.pending.settle(output.usage.as_ref(), bytes).await {
            let err = GateError::new(Stage::Budget, m);
            let line = self.pending.write(
                Status::Denied,
                Some(Stage::Budget),
                Some(&err.message),
                Effect::Applied,
                bytes,
            );
            self.pending.store_line(line).await;
            return Err(err);
        }
        let status = if output.is_error {
            Status::Error
        } else {
            Status::Ok
        };
        let line = self
            .pending
            .write(status, None, None, Effect::Applied, bytes);
        let line = self.pending.hand_to_script(line);
        self.pending.store_line(line).await;
        if let Some(e) = self.pending.line_failed.take() {
            // "Every call that ran is in the audit log" cannot hold for this one: say so rather
            // than hand back a result nobody can account for.
            return Err(GateError::new(
                Stage::Execute,
                format!(
                    "`{name}` ran, and what it did stands, but its audit line could not be written ({e}), so its result is withheld and every later call is refused. No person was asked. Tell the user: the audit log must be fixed and codemode restarted"
                ),
            ));
        }
        Ok(output)
    }
}

/// What a result holds in memory, near enough: its value as JSON text, and the text and data
/// a direct call would show (an MCP result carries its text twice).
fn result_size(output: &ToolOutput) -> usize {
    let shown: usize = output
        .content
        .iter()
        .flatten()
        .map(|block| match block {
            ContentBlock::Text { text } => text.len(),
            ContentBlock::Image { data, mime_type } => data.len() + mime_type.len(),
        })
        .sum();
    codemode_spec::json_text_len(&output.value).saturating_add(shown)
}

/// Arguments' JSON text up to this size is journalled whole. A `bash` command is at most
/// 128 KiB (Linux refuses a longer single argument), but JSON writes a control byte as six
/// (`\u0001`): 100 KB of them around a payload made 600 KB of text, and at 256 KiB the payload
/// in the middle was in neither the log nor the journal. 1 MiB holds any command whole.
const WHOLE_ARGUMENTS: usize = 1024 * 1024;

/// The arguments' JSON text for the journal: whole when it fits, else its first and last
/// 512 KiB with its size, so padding in the middle cannot hide both ends.
fn whole_arguments(text: &str) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    if text.len() <= WHOLE_ARGUMENTS {
        out.insert("args_text".into(), Value::String(text.to_string()));
        return out;
    }
    let half = WHOLE_ARGUMENTS / 2;
    let mut start = half;
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = text.len() - half;
    while !text.is_char_boundary(end) {
        end += 1;
    }
    out.insert("args_bytes".into(), Value::from(text.len()));
    out.insert(
        "args_text_start".into(),
        Value::String(text[..start].to_string()),
    );
    out.insert(
        "args_text_end".into(),
        Value::String(text[end..].to_string()),
    );
    out
}

/// Current UTC time as RFC 3339 with milliseconds.
fn utc_now() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        now.subsec_millis()
    )
}
