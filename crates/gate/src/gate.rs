//! The pipeline: resolve → validate → facts → policy → hooks → approval → budget → execute →
//! after-hooks → audit, for every call whoever makes it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use codemode_spec::{
    CallFacts, CallKind, CodemodeMode, DeadlineClock, Exposure, Origin, Provenance, Tool, ToolCall,
    ToolErrorKind, ToolOutput, ToolSpec,
};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::approval::{ApprovalAnswer, ApprovalRequest, Approver};
use crate::audit::{AuditLog, sha256_hex};
use crate::budget::{Budgets, CallRecord, Ledger, LedgerSnapshot};
use crate::error::{GateError, Stage};
use crate::hooks::{AfterDecision, CommandHooks, Hook, HookDecision, HookEvent};
use crate::model_rules::ModelRules;
use crate::policy::{Decision, PolicyError, PolicyInput, PolicySchema, PolicySet, decide};
use crate::registry::{CODEMODE_TOOL, Lookup, Registry, Resolved};
use crate::validate::check_args;

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
}

impl CallRequest {
    pub fn new(name: impl Into<String>, args: Value, provenance: Provenance) -> Self {
        CallRequest {
            name: name.into(),
            args,
            provenance,
            cancel: CancellationToken::new(),
            clock: None,
        }
    }
}

struct PolicyState {
    set: PolicySet,
    schema: PolicySchema,
}

struct Inner {
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
}

impl GateBuilder {
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
    pub fn command_hooks(mut self, hooks: CommandHooks) -> Self {
        self.hooks.push(Arc::new(hooks));
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

    /// Validates the policies against the schema of the tools registered now.
    pub fn build(self) -> Result<Gate, PolicyError> {
        let set = self.policy.unwrap_or_else(PolicySet::defaults);
        let schema = PolicySchema::for_registry(&self.registry)?;
        set.validate(&schema)?;
        Ok(Gate {
            inner: Arc::new(Inner {
                registry: self.registry,
                policy: RwLock::new(Arc::new(PolicyState { set, schema })),
                hooks: self.hooks,
                approver: self.approver,
                budgets: self.budgets,
                audit: self.audit,
                mode: self.mode,
                ledger: Ledger::default(),
                always: Mutex::new(HashSet::new()),
                audit_failure: Mutex::new(None),
                models: self.models,
                max_depth: self.max_depth,
            }),
        })
    }
}

/// What the pipeline learned about a call, for the audit line and the call record.
struct Trail {
    name: String,
    kind: Option<CallKind>,
    args: Value,
    paths: Vec<String>,
    decision: &'static str,
    policy_ids: Vec<String>,
    usage: Option<codemode_spec::Usage>,
    bytes: u64,
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
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.inner.registry
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
        crate::policy::explain(&state.set, Some(&state.schema), input)
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

    /// The whole pipeline for one call.
    pub async fn call(&self, req: CallRequest) -> Result<ToolOutput, GateError> {
        let started = Instant::now();
        let mut trail = Trail {
            name: req.name.clone(),
            kind: None,
            args: req.args.clone(),
            paths: Vec::new(),
            decision: "none",
            policy_ids: Vec::new(),
            usage: None,
            bytes: 0,
        };
        let result = self.run(&req, &mut trail).await;
        self.finish(&req, &trail, &result, started);
        result
    }

    async fn run(&self, req: &CallRequest, trail: &mut Trail) -> Result<ToolOutput, GateError> {
        if req.cancel.is_cancelled() {
            return Err(GateError::new(
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
                    "calls are refused because the audit log cannot be written ({e}); fix the log's location and restart"
                ),
            ));
        }
        if let Some(max) = self.inner.max_depth
            && req.provenance.depth > max
        {
            return Err(GateError::new(
                Stage::Resolve,
                format!(
                    "`{}` is refused: calls may nest at most {max} deep (`limits.max_depth` in settings), and this one is at depth {}",
                    req.name, req.provenance.depth
                ),
            ));
        }
        let resolved = self.resolve(&req.name, req.provenance.origin)?;
        let spec = resolved.spec.clone();
        trail.name = spec.name.clone();
        trail.kind = Some(spec.kind);
        let p = &req.provenance;

        let mut args = req.args.clone();
        check_args(&spec.name, &resolved.validator, &args)
            .map_err(|m| GateError::new(Stage::Validate, m))?;
        let mut facts = facts_of(resolved.tool.as_ref(), &spec.name, &args)?;
        trail.paths = facts.paths.clone();

        self.check_model_settings(&spec, &facts)?;
        let policy = self.policy_state();
        let mut ask = self.ask_policy(&policy, &spec, &args, &facts, p, trail)?;

        for hook in &self.inner.hooks {
            let ev = HookEvent {
                tool_name: spec.name.clone(),
                kind: spec.kind,
                args: args.clone(),
                paths: facts.paths.clone(),
                model: facts.model.clone(),
                provenance: p.clone(),
            };
            match hook.before(&ev).await {
                HookDecision::Allow => {}
                HookDecision::Deny(reason) => {
                    return Err(GateError::new(
                        Stage::Hook,
                        format!("a hook blocked `{}`: {reason}", spec.name),
                    ));
                }
                HookDecision::Ask(reason) => {
                    let sep = if ask_is_empty(&ask) { "" } else { "; " };
                    ask.get_or_insert_with(|| (String::new(), Vec::new()))
                        .0
                        .push_str(&format!("{sep}{reason} (hook)"));
                }
                HookDecision::Rewrite(new_args) => {
                    check_args(&spec.name, &resolved.validator, &new_args).map_err(|m| {
                        GateError::new(
                            Stage::Hook,
                            format!("a hook rewrote the arguments into invalid ones, so the call is refused: {m}"),
                        )
                    })?;
                    args = new_args;
                    trail.args = args.clone();
                    // New arguments may touch other paths: the policy decides again.
                    facts = facts_of(resolved.tool.as_ref(), &spec.name, &args)?;
                    trail.paths = facts.paths.clone();
                    self.check_model_settings(&spec, &facts)?;
                    if let Some(again) = self.ask_policy(&policy, &spec, &args, &facts, p, trail)? {
                        ask = Some(again);
                    }
                }
            }
        }

        if let Some((reason, ids)) = ask {
            self.approve(req, &spec, &args, &facts, reason, ids).await?;
        }

        self.inner
            .ledger
            .reserve(&self.inner.budgets, p, spec.kind)
            .map_err(|m| GateError::new(Stage::Budget, m))?;

        let call = ToolCall {
            args: args.clone(),
            provenance: p.clone(),
            cancel: req.cancel.clone(),
        };
        let executed = tokio::select! {
            r = resolved.tool.call(call) => r,
            _ = req.cancel.cancelled() => Err(codemode_spec::ToolError::cancelled()),
        };
        let mut output = match executed {
            Ok(o) => o,
            Err(e) => {
                let mut err = GateError::new(
                    Stage::Execute,
                    format!("`{}` failed: {}", spec.name, e.message),
                );
                if e.kind == ToolErrorKind::Cancelled {
                    err.message = format!("`{}` was cancelled", spec.name);
                }
                err.tool_error = Some(e.kind);
                return Err(err);
            }
        };
        trail.usage = output.usage.clone();

        let ev = HookEvent {
            tool_name: spec.name.clone(),
            kind: spec.kind,
            args: args.clone(),
            paths: facts.paths.clone(),
            model: facts.model.clone(),
            provenance: p.clone(),
        };
        for hook in &self.inner.hooks {
            match hook.after(&ev, &output).await {
                AfterDecision::Keep => {}
                AfterDecision::Replace(mut o) => {
                    // Usage was spent whatever the hook shows the caller.
                    o.usage = output.usage.clone();
                    output = o;
                }
                AfterDecision::Block(reason) => {
                    let _ =
                        self.inner
                            .ledger
                            .charge(&self.inner.budgets, p, output.usage.as_ref(), 0);
                    return Err(GateError::new(
                        Stage::AfterHook,
                        format!("a hook withheld the result of `{}`: {reason}", spec.name),
                    ));
                }
            }
        }

        let bytes = serde_json::to_vec(&output.value)
            .map(|b| b.len() as u64)
            .unwrap_or(0);
        trail.bytes = bytes;
        self.inner
            .ledger
            .charge(&self.inner.budgets, p, output.usage.as_ref(), bytes)
            .map_err(|m| GateError::new(Stage::Budget, m))?;
        Ok(output)
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
                    "`{}` is refused: model operations are turned off in settings (`models.enabled`)",
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
                        "model `{id}` is not in `models.allow` in settings; use one of: {}",
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
                    format!("no tool named `{name}`; {hint}"),
                ));
            }
        };
        let spec = &found.spec;
        let id = spec.identifier();
        let refuse = |m: String| Err(GateError::new(Stage::Resolve, m));
        if spec.exposure == Exposure::Hidden {
            return refuse(format!(
                "`{}` is hidden by configuration; nobody may call it",
                spec.name
            ));
        }
        match origin {
            Origin::Model if spec.name == CODEMODE_TOOL => {}
            Origin::Model if self.inner.mode == CodemodeMode::Only => {
                return refuse(format!(
                    "`{}` cannot be called directly in codemode `only` mode; call it from a script instead: `await tools.{id}(...)` inside codemode",
                    spec.name
                ));
            }
            Origin::Model if spec.exposure == Exposure::Direct && found.active => {}
            Origin::Model => {
                return refuse(format!(
                    "`{}` is not one of your declared tools; call it from a script instead: `await tools.{id}(...)` inside codemode",
                    spec.name
                ));
            }
            Origin::Script if spec.exposure == Exposure::Direct && !found.active => {
                return refuse(format!(
                    "`{}` is not active now, so scripts cannot call it; it may have been deactivated while the script ran",
                    spec.name
                ));
            }
            Origin::Script => {}
        }
        Ok(found)
    }

    /// Runs the policy. `Ok(Some(..))` means approval is needed.
    #[allow(clippy::type_complexity)]
    fn ask_policy(
        &self,
        policy: &PolicyState,
        spec: &ToolSpec,
        args: &Value,
        facts: &CallFacts,
        p: &Provenance,
        trail: &mut Trail,
    ) -> Result<Option<(String, Vec<String>)>, GateError> {
        let (script, session) = self.inner.ledger.counts(p);
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
            },
        );
        trail.decision = decision.as_str();
        trail.policy_ids = decision.policy_ids().to_vec();
        match decision {
            Decision::Allow { .. } => Ok(None),
            Decision::Ask { reason, policy_ids } => Ok(Some((reason, policy_ids))),
            Decision::Deny {
                message,
                policy_ids,
            } => Err(GateError::new(Stage::Policy, message).with_policies(policy_ids)),
        }
    }

    async fn approve(
        &self,
        req: &CallRequest,
        spec: &ToolSpec,
        args: &Value,
        facts: &CallFacts,
        reason: String,
        policy_ids: Vec<String>,
    ) -> Result<(), GateError> {
        let p = &req.provenance;
        let scope = p.script_id.clone().unwrap_or_else(|| p.session_id.clone());
        let key = (scope, spec.name.clone());
        if self
            .inner
            .always
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&key)
        {
            return Ok(());
        }
        let unasked = |why: &str| {
            GateError::new(
                Stage::Approval,
                format!(
                    "`{}` needs the user's approval ({reason}), but could not ask: {why}. Ask the user to allow `{}` (a policy that permits it), or to use a client that can show approval requests",
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
            Some(ApprovalAnswer::Yes) => Ok(()),
            Some(ApprovalAnswer::Always) => {
                self.inner.always.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
                Ok(())
            }
            Some(ApprovalAnswer::No) => Err(GateError::new(
                Stage::Approval,
                format!("`{}` was not approved: the user was asked ({reason}) and said no. Do not retry it; find another way, or ask the user to allow `{}`", spec.name, spec.name),
            )
            .with_policies(policy_ids)),
            Some(ApprovalAnswer::Unasked(why)) => Err(unasked(why)),
            None => Err(GateError::new(Stage::Approval, "the call was cancelled while waiting for approval")
                .with_policies(policy_ids)),
        }
    }

    fn finish(
        &self,
        req: &CallRequest,
        trail: &Trail,
        result: &Result<ToolOutput, GateError>,
        started: Instant,
    ) {
        let duration_ms = started.elapsed().as_millis() as u64;
        let (status, stage, message) = match result {
            Ok(o) if o.is_error => ("error", None, None),
            Ok(_) => ("ok", None, None),
            Err(e) if e.stage == Stage::Execute => {
                ("error", Some(e.stage.as_str()), Some(e.message.clone()))
            }
            Err(e) => ("denied", Some(e.stage.as_str()), Some(e.message.clone())),
        };
        let p = &req.provenance;
        let args_text = serde_json::to_string(&trail.args).unwrap_or_default();
        let mut record = Map::new();
        record.insert("time".into(), json!(utc_now()));
        record.insert("provenance".into(), json!(p));
        record.insert("tool".into(), json!(trail.name));
        record.insert("kind".into(), json!(trail.kind));
        record.insert(
            "args_sha256".into(),
            json!(sha256_hex(args_text.as_bytes())),
        );
        record.insert(
            "args_preview".into(),
            json!(crate::preview(&args_text, 200)),
        );
        record.insert("paths".into(), json!(trail.paths));
        record.insert("decision".into(), json!(trail.decision));
        record.insert("policy_ids".into(), json!(trail.policy_ids));
        record.insert("status".into(), json!(status));
        record.insert("stage".into(), json!(stage));
        record.insert(
            "message".into(),
            json!(message.as_deref().map(|m| crate::preview(m, 500))),
        );
        record.insert("duration_ms".into(), json!(duration_ms));
        record.insert("usage".into(), json!(trail.usage));
        record.insert("bytes".into(), json!(trail.bytes));
        if let Err(e) = self.inner.audit.append(record) {
            tracing::error!("{e}");
            *self
                .inner
                .audit_failure
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
        }
        if let Some(script_id) = &p.script_id {
            self.inner.ledger.record(
                script_id,
                CallRecord {
                    call_id: p.call_id.clone(),
                    name: trail.name.clone(),
                    status,
                    stage,
                    decision: trail.decision.to_string(),
                    policy_ids: trail.policy_ids.clone(),
                    usage: trail.usage.clone(),
                    duration_ms,
                },
            );
        }
    }
}

fn ask_is_empty(ask: &Option<(String, Vec<String>)>) -> bool {
    ask.as_ref().is_none_or(|(r, _)| r.is_empty())
}

fn facts_of(tool: &dyn Tool, name: &str, args: &Value) -> Result<CallFacts, GateError> {
    tool.facts(args).map_err(|e| {
        GateError::new(
            Stage::Facts,
            format!("`{name}` refused these arguments: {}", e.message),
        )
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use codemode_spec::{BoxFuture, ToolError};

    struct Echo(ToolSpec);
    impl Tool for Echo {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }
        fn call(&self, call: ToolCall) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
            Box::pin(async move { Ok(ToolOutput::value(call.args)) })
        }
    }

    #[tokio::test]
    async fn calls_are_refused_once_an_audit_line_cannot_be_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        std::fs::write(&path, "").unwrap();
        let read_only = std::fs::File::open(&path).unwrap();
        let reg = Registry::new();
        reg.register(Arc::new(Echo(ToolSpec::new("t", "", json!({})))))
            .unwrap();
        let policy = PolicySet::parse("p", "permit(principal, action, resource);").unwrap();
        let gate = Gate::builder()
            .registry(reg)
            .policy(policy)
            .audit(AuditLog::with_file(path, read_only))
            .build()
            .unwrap();
        let p = Provenance::model("c1", "s");
        let mut spec_call = CallRequest::new("t", json!({}), p.clone());
        spec_call.provenance.origin = Origin::Script;
        gate.call(spec_call.clone()).await.unwrap();
        let err = gate.call(spec_call).await.unwrap_err();
        assert_eq!(err.stage, Stage::Resolve);
        assert!(
            err.message.contains("audit log cannot be written"),
            "{}",
            err.message
        );
    }
}
