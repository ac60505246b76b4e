//! One script run: from the model's text to the text the model reads back.

use std::collections::HashMap;
use std::path::PathBuf;

use codemode_gate::{CODEMODE_TOOL, CallRequest};
use codemode_sandbox::{Determinism, Script, ScriptResult};
use codemode_spec::{CallKind, Provenance, ToolOutput, ToolSpec, Usage};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::Codemode;
use crate::codemode_tool::script_facts;
use crate::globals::{DISCOVERY, MODEL_READERS};
use crate::host::{ReadOnlyView, RuntimeHost, ScriptIdentity};

/// What to run, for whom.
#[derive(Debug, Clone)]
pub struct ScriptRequest {
    /// The script exactly as the model wrote it, with its optional `// @options:` line.
    pub source: String,
    /// The session whose store, budgets and audit trail the script shares.
    pub session_id: String,
    /// The front end driving the session (an MCP client's name), for the audit log.
    pub client: Option<String>,
    /// The id of the `codemode` call that runs this script (the MCP request's, say); one is
    /// made up when absent. The script's calls name it as their parent.
    pub parent_call_id: Option<String>,
    /// Cancelling stops the script, even one that spins, and cancels its calls.
    pub abort: CancellationToken,
    pub determinism: Option<Determinism>,
    /// Write a log of the run's calls and results here.
    pub record: Option<PathBuf>,
    /// Serve the calls' results from this log instead of calling anything.
    pub replay: Option<PathBuf>,
    /// Told when each of the script's gated calls starts and ends (for progress reports).
    pub on_call: Option<CallObserver>,
}

/// A call of a running script starting or ending.
#[derive(Debug, Clone, PartialEq)]
pub enum CallEvent {
    Started { seq: u64, name: String },
    Finished { seq: u64, name: String, ok: bool },
}

/// Receives [`CallEvent`]s. Called on the path of every call: it must not block.
#[derive(Clone)]
pub struct CallObserver(std::sync::Arc<dyn Fn(CallEvent) + Send + Sync>);

impl CallObserver {
    pub fn new(observe: impl Fn(CallEvent) + Send + Sync + 'static) -> Self {
        CallObserver(std::sync::Arc::new(observe))
    }

    pub(crate) fn notify(&self, event: CallEvent) {
        (self.0)(event)
    }
}

impl std::fmt::Debug for CallObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallObserver")
    }
}

impl ScriptRequest {
    pub fn new(source: impl Into<String>, session_id: impl Into<String>) -> Self {
        ScriptRequest {
            source: source.into(),
            session_id: session_id.into(),
            client: None,
            parent_call_id: None,
            abort: CancellationToken::new(),
            determinism: None,
            record: None,
            replay: None,
            on_call: None,
        }
    }
}

/// Why a script's `store()` writes were not kept when its session ended while it ran.
const SESSION_ENDED: &str = "its session ended while the script ran (its client ended it, or it was idle past the limit); start a new session to keep values";

/// The outcome of a run: the text for the model and the structured result for programs.
#[derive(Debug, Clone)]
pub struct ScriptRun {
    pub script_id: String,
    /// The text the model reads.
    pub text: String,
    /// Where the whole text went when `text` had to be cut.
    pub full_output_path: Option<PathBuf>,
    pub is_error: bool,
    /// `None` when the input was refused before anything ran (a bad options line, no code).
    pub result: Option<ScriptResult>,
    /// What the script's model calls spent, summed.
    pub usage: Usage,
    /// Usage per call, by the call's id in the script.
    pub usage_by_call: HashMap<u64, Usage>,
    /// What the gate decided for each of the script's calls, in the order they reached it.
    pub gate_records: Vec<GateRecord>,
    /// Media for the front end to show beside `text`, as MCP content blocks, in order: the
    /// script's `image()` output, then images, audio and binary resources it returned (which
    /// the returned value and `text` name with a short note instead of their base64).
    pub media: Vec<Value>,
}

/// The gate's record of one call, with the call's id in the script.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GateRecord {
    /// The call's id in the script (its `seq`), when the gate saw one.
    pub id: Option<u64>,
    /// The gate's outcome of the call: the same value as its audit line.
    #[serde(flatten)]
    pub record: codemode_gate::CallRecord,
}

impl ScriptRun {
    /// The structured result, with the field names of the reference package, plus `usage` on the
    /// calls that spent something and on the whole run.
    pub fn structured(&self) -> Value {
        let Some(result) = &self.result else {
            return json!({ "ok": false, "error": { "kind": "input", "name": "SourceError", "message": self.text } });
        };
        let mut value = serde_json::to_value(result).unwrap_or_else(|e| {
            json!({ "ok": false, "error": { "kind": "sandbox", "message": format!("the result could not be serialized: {e}") } })
        });
        if let Some(calls) = value.get_mut("calls").and_then(Value::as_array_mut) {
            let mut seen = std::collections::HashSet::new();
            for call in calls.iter_mut() {
                let id = call.get("id").and_then(Value::as_u64);
                if let Some(id) = id {
                    seen.insert(id);
                }
                if let Some(usage) = id.and_then(|id| self.usage_by_call.get(&id)) {
                    call["usage"] = json!(usage);
                }
                if let Some(r) = self
                    .gate_records
                    .iter()
                    .find(|r| r.id.is_some() && r.id == id)
                {
                    call["decision"] = json!(r.record.decision);
                    call["policyIds"] = json!(r.record.policy_ids);
                }
            }
            // Model calls and host globals are not among the sandbox's tool calls; the gate saw
            // them, so they are listed from its records, with what they spent.
            for r in &self.gate_records {
                if r.id.is_some_and(|id| seen.contains(&id)) {
                    continue;
                }
                calls.push(json!({
                    "id": r.id,
                    "name": r.record.tool,
                    "kind": if r.record.tool.starts_with("models.") { "model" } else { "global" },
                    "status": r.record.status,
                    "decision": r.record.decision,
                    "policyIds": r.record.policy_ids,
                    "durationMs": r.record.duration_ms,
                    "usage": r.record.usage,
                }));
            }
            calls.sort_by_key(|c| c.get("id").and_then(Value::as_u64).unwrap_or(u64::MAX));
        }
        if !self.usage.is_empty() {
            value["usage"] = json!(self.usage);
        }
        value
    }
}

/// Why a principal's script was not run: it already runs as many as it may.
fn principal_busy(principal: &str, limit: u32) -> String {
    format!(
        "The script was not run: `{principal}` already runs {limit} scripts at once in this codemode process, the most one token may (`cells.max_running_per_principal`), so that others can still run theirs. Run it again once one of them has ended, or ask the operator to raise `cells.max_running_per_principal` in settings.json"
    )
}

/// What a script can reach: the names under `tools` and the globals. Every name here either
/// passes the gate or is one of [`crate::READ_ONLY_GLOBALS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptSurface {
    pub tools: Vec<String>,
    pub globals: Vec<String>,
    /// Global name → the registered tool (of kind model or global) that the gate resolves.
    pub gated_globals: HashMap<String, String>,
}

impl Codemode {
    /// The names a script started now would see.
    pub fn script_surface(&self) -> ScriptSurface {
        self.surface_of(&self.script_view().callable)
    }

    fn surface_of(&self, callable: &[ToolSpec]) -> ScriptSurface {
        let tools = callable
            .iter()
            .filter(|s| s.kind == CallKind::Tool)
            .map(|s| s.name.clone())
            .collect();
        let mut globals: Vec<String> = DISCOVERY.iter().map(|s| s.to_string()).collect();
        if self.models_enabled() {
            globals.extend(MODEL_READERS.iter().map(|s| s.to_string()));
        }
        let mut gated_globals = HashMap::new();
        for spec in callable.iter().filter(|s| s.kind != CallKind::Tool) {
            // Model operations live under `models.`; skip them when the models API is off.
            if spec.kind == CallKind::Model && !self.models_enabled() {
                continue;
            }
            globals.push(spec.name.clone());
            gated_globals.insert(spec.name.clone(), spec.name.clone());
        }
        globals.sort();
        globals.dedup();
        ScriptSurface {
            tools,
            globals,
            gated_globals,
        }
    }

    /// Runs one script to the end and renders what the model reads.
    ///
    /// The script is itself a call: the `codemode` call (origin model, depth 0, facts: the
    /// script's SHA-256 and size) passes the gate first, so a policy can forbid or ask for it,
    /// hooks with matcher `codemode` see it, and the audit log has its line, which the script's
    /// own calls name as their parent. Calls still running when the script ends are cancelled
    /// and waited for, so each writes its outcome line before the run returns.
    pub async fn run_script(&self, req: ScriptRequest) -> ScriptRun {
        let (admission, source, call_id) = match self.admit_script(&req).await {
            Ok(admitted) => admitted,
            Err(run) => return run,
        };
        let script_id = self.next_call_id("script");
        // A named principal's running scripts hold pool workers: past its share a script is
        // refused, so that one token's scripts never fill the pool everyone's wait for.
        let slot = match self.gate().principal_of(&req.session_id) {
            Some(principal) => {
                let limit = self.inner.max_running_per_principal;
                match self.inner.share.take(&principal.id, limit) {
                    Some(slot) => Some(slot),
                    None => {
                        let run =
                            ScriptRun::refused(script_id, principal_busy(&principal.id, limit));
                        return self.finish_admission(admission, run).await;
                    }
                }
            }
            None => None,
        };
        let run = self.execute(&req, source, script_id, call_id, None).await;
        drop(slot);
        self.finish_admission(admission, run).await
    }

    /// The `codemode` call passes the gate: returns its admission (begun), the source to run
    /// (a hook may have rewritten it) and the call's id; or the refused run.
    pub(crate) async fn admit_script(
        &self,
        req: &ScriptRequest,
    ) -> Result<(codemode_gate::Admission, String, String), ScriptRun> {
        let call_id = req
            .parent_call_id
            .clone()
            .unwrap_or_else(|| self.next_call_id("codemode"));
        let mut provenance = Provenance::model(call_id.clone(), req.session_id.clone());
        provenance.client = req.client.clone();
        provenance.script_hash = Some(script_facts(&req.source).sha256);
        let admitted = self
            .gate()
            .admit(CallRequest {
                name: CODEMODE_TOOL.to_string(),
                args: json!({ "code": req.source }),
                provenance,
                cancel: req.abort.clone(),
                clock: None,
                result_room: None,
            })
            .await;
        let mut admission = match admitted {
            Ok(a) => a,
            Err(e) => return Err(ScriptRun::refused(self.next_call_id("script"), e.message)),
        };
        // A hook may have rewritten the script: what runs is what was decided on.
        let source = admission
            .args()
            .get("code")
            .and_then(Value::as_str)
            .unwrap_or(&req.source)
            .to_string();
        if let Err(e) = admission.begin().await {
            let message = match admission.finish(Err(e)).await {
                Err(refused) => refused.message,
                Ok(_) => "the script was not run: the audit log cannot record it".to_string(),
            };
            return Err(ScriptRun::refused(self.next_call_id("script"), message));
        }
        Ok((admission, source, call_id))
    }

    /// The `codemode` call's after-hooks and audit line, once its script ended.
    pub(crate) async fn finish_admission(
        &self,
        admission: codemode_gate::Admission,
        mut run: ScriptRun,
    ) -> ScriptRun {
        let output = ToolOutput {
            value: Value::String(run.text.clone()),
            content: None,
            is_error: run.is_error,
            // What the script's calls spent is on their own lines; counting it here again
            // would charge it twice.
            usage: None,
            held: Default::default(),
        };
        match admission.finish(Ok(output)).await {
            Ok(out) => {
                if out.value != Value::String(run.text.clone()) {
                    // An after-hook replaced what the model reads.
                    run.text = match out.value {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                }
            }
            Err(e) => {
                run.text = e.message;
                run.is_error = true;
            }
        }
        run
    }

    pub(crate) async fn execute(
        &self,
        req: &ScriptRequest,
        source: String,
        script_id: String,
        call_id: String,
        cell: Option<std::sync::Arc<crate::cells::CellLink>>,
    ) -> ScriptRun {
        let parsed = match codemode_sandbox::parse_source(&source) {
            Ok(parsed) => parsed,
            // Refused input never reaches the sandbox and has no "script failed" header.
            Err(e) => return ScriptRun::refused(script_id, e.to_string()),
        };
        // The CPU budget the sandbox will give the script, which its read-only globals share.
        let config = self.sandbox().config();
        let cpu_ms =
            codemode_sandbox::Limits::effective(&config.defaults, &config.maximum, &parsed.options)
                .cpu_ms;
        let identity = ScriptIdentity {
            session_id: req.session_id.clone(),
            client: req.client.clone(),
            parent_call_id: Some(call_id),
            script_id: script_id.clone(),
            script_hash: script_facts(&source).sha256,
            depth: 1,
            on_call: req.on_call.clone(),
            cell: cell.clone(),
        };

        let view = self.script_view();
        let surface = self.surface_of(&view.callable);
        let tools = view.entries.clone();
        let host = RuntimeHost::new(
            self.gate().clone(),
            tokio::runtime::Handle::try_current().ok(),
            identity,
            ReadOnlyView {
                view,
                catalog: self.inner.catalog.clone(),
                budget: std::time::Duration::from_millis(cpu_ms),
            },
            surface.gated_globals.clone(),
        );
        let spent = host.spent_handle();
        let in_flight = host.in_flight();
        let on_output = cell.as_ref().map(|link| {
            let live = link.cell.clone();
            codemode_sandbox::OutputTap::new(move |item| live.push_output(item))
        });
        let store = match self.durable_store() {
            Some(durable) => match durable.load_store(&req.session_id).await {
                Ok(values) => values,
                Err(e) => {
                    return ScriptRun::refused(
                        script_id,
                        format!("The session's stored values could not be read: {e}"),
                    );
                }
            },
            None => self.inner.stores.snapshot(&req.session_id),
        };
        let script = Script {
            source,
            tools,
            globals: surface.globals.clone(),
            host: std::sync::Arc::new(host),
            store,
            determinism: req.determinism,
            record: req.record.clone(),
            replay: req.replay.clone(),
            abort: req.abort.clone(),
            clock: cell
                .as_ref()
                .map_or_else(codemode_spec::DeadlineClock::new, |l| l.clock()),
            on_output,
        };
        let mut result = self.sandbox().run(script).await;
        // A rebuilt cell that ended without making every logged call again went another way:
        // it fails before its result or store() writes count.
        if result.ok
            && let Some(message) = cell.as_ref().and_then(|l| l.fail_if_calls_were_skipped())
        {
            result.ok = false;
            result.store_writes.clear();
            result.error = Some(codemode_sandbox::ScriptError::new(
                codemode_sandbox::ErrorKind::Sandbox,
                message,
            ));
        }
        // The sandbox cancelled the calls still out; let each finish and write its line.
        in_flight.close();
        if tokio::time::timeout(CALLS_DRAIN, in_flight.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                script_id,
                "calls of a finished script are still running after {CALLS_DRAIN:?}; they will write their audit lines when they end"
            );
        }
        let ledger = self.gate().end_script(&script_id);
        settle_unawaited(&mut result.calls, &ledger.records);
        let mut media: Vec<Value> = result
            .output
            .iter()
            .filter_map(|item| match item {
                codemode_sandbox::OutputItem::Image { data, mime_type } => {
                    Some(json!({"type": "image", "data": data, "mimeType": mime_type}))
                }
                _ => None,
            })
            .collect();
        let lifted = match result.value.as_mut() {
            Some(value) => crate::media::lift_media(value),
            None => Vec::new(),
        };
        let lifted_tokens: Vec<u64> = lifted.iter().map(codemode_sandbox::media_tokens).collect();
        media.extend(lifted);
        let spent = spent.take();

        if result.ok {
            // A session that ended while the script ran keeps nothing: its values would be
            // kept for nobody, and never dropped.
            let writes = !result.store_writes.is_empty();
            let ended = || writes && self.gate().session_has_ended(&req.session_id);
            // The durable store first: writes it refuses are kept nowhere.
            let saved = match self.durable_store() {
                Some(_) if ended() => Err(SESSION_ENDED.to_string()),
                Some(durable) => {
                    let changes = crate::store::changes(&result.store_writes);
                    let applied = durable
                        .apply_store(&req.session_id, &changes)
                        .await
                        .map_err(|e| e.to_string());
                    // Ended meanwhile: its delete may have run before these writes.
                    if applied.is_ok() && ended() {
                        if let Err(e) = durable.delete_session(&req.session_id).await {
                            tracing::warn!(session = %req.session_id, "could not delete an ended session's stored values: {e}");
                        }
                        Err(SESSION_ENDED.to_string())
                    } else {
                        applied
                    }
                }
                None => Ok(()),
            }
            .and_then(|()| {
                // With a durable store, scripts load from it: a copy here would only hold
                // every session's values in memory a second time.
                if self.durable_store().is_some() {
                    return Ok(());
                }
                self.inner.stores.apply(
                    &req.session_id,
                    &result.store_writes,
                    ended,
                    SESSION_ENDED,
                )
            });
            if let Err(e) = saved {
                result.ok = false;
                result.error = Some(codemode_sandbox::ScriptError::new(
                    codemode_sandbox::ErrorKind::Sandbox,
                    format!(
                        "The script's store() writes could not be saved, and none was kept: {e}"
                    ),
                ));
            }
        }
        // Lifted blocks the budget leaves out say so in the returned value the model reads.
        let shown =
            codemode_sandbox::media_shown(&result, result.limits.max_output_tokens, &lifted_tokens);
        let script_images = media.len() - lifted_tokens.len();
        if shown < media.len()
            && let Some(value) = result.value.as_mut()
        {
            crate::media::mark_unsent(value, shown.saturating_sub(script_images) + 1);
        }
        // The limits already hold what the options line lowered; the line cannot raise them.
        let rendered = codemode_sandbox::render_model_text_with_media(
            &result,
            result.limits.max_output_tokens,
            &lifted_tokens,
        );
        let mut text = rendered.text;
        if media.len() > rendered.images_shown {
            text.push_str(&format!(
                "\nNote: {} of the {} media blocks were not sent: media may take half of the output budget ({} tokens); raise `max_output_tokens` to see more.",
                media.len() - rendered.images_shown,
                media.len(),
                result.limits.max_output_tokens,
            ));
            media.truncate(rendered.images_shown);
        }
        let usage = ledger.usage.clone();
        if !usage.is_empty() {
            text.push_str(&format!(
                "\nModel usage: {} input tokens, {} output tokens, {} images, ${:.6}.",
                usage.input_tokens, usage.output_tokens, usage.images, usage.cost_usd
            ));
        }
        let unshown = unshown_images(&result, &spent.generated_images);
        if unshown > 0 {
            let noun = if unshown == 1 { "image" } else { "images" };
            text.push_str(&format!(
                "\nNote: models.generateImages() made {unshown} {noun} that the script did not show; pass each image block of result.output to image() to show it."
            ));
        }
        ScriptRun {
            script_id,
            text,
            full_output_path: rendered.full_output_path,
            is_error: !result.ok,
            result: Some(result),
            usage,
            usage_by_call: spent.usage_by_call,
            gate_records: ledger
                .records
                .iter()
                .map(|r| GateRecord {
                    id: r.provenance.seq,
                    record: r.clone(),
                })
                .collect(),
            media,
        }
    }
}

impl ScriptRun {
    /// A run refused before the sandbox: bad input, or the `codemode` call was not admitted.
    pub(crate) fn refused(script_id: String, text: String) -> Self {
        ScriptRun {
            script_id,
            text,
            full_output_path: None,
            is_error: true,
            result: None,
            usage: Usage::default(),
            usage_by_call: HashMap::new(),
            gate_records: Vec::new(),
            media: Vec::new(),
        }
    }
}

/// How long a finished script waits for its cancelled calls to write their outcome lines.
const CALLS_DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

fn unshown_images(result: &ScriptResult, generated: &[String]) -> usize {
    let shown: std::collections::HashSet<&str> = result
        .output
        .iter()
        .filter_map(|item| match item {
            codemode_sandbox::OutputItem::Image { data, .. } => Some(data.as_str()),
            _ => None,
        })
        .collect();
    generated
        .iter()
        .filter(|d| !shown.contains(d.as_str()))
        .count()
}

/// Calls still out when the script ended were cancelled from the script's side, but a call may
/// have run to its end anyway (most finish in their first poll). The record says what the gate
/// saw, so the model is not told "cancelled" of a write that happened and retries it.
fn settle_unawaited(
    calls: &mut [codemode_sandbox::CallRecord],
    seen: &[codemode_gate::CallOutcome],
) {
    use codemode_gate::Status;
    use codemode_sandbox::CallStatus;
    use codemode_spec::Effect;
    for call in calls.iter_mut().filter(|c| !c.awaited) {
        let Some(outcome) = seen.iter().find(|o| o.provenance.seq == Some(call.id)) else {
            continue;
        };
        let (status, note) = match (outcome.status, outcome.effect) {
            (Status::Ok, _) => (CallStatus::Ok, "it ran to its end"),
            (Status::Error, _) => (CallStatus::Error, "it failed"),
            (Status::Denied, _) => (CallStatus::Error, "the gate refused it"),
            (Status::Cancelled, Effect::Applied) => {
                (CallStatus::Cancelled, "its effect took place")
            }
            (Status::Cancelled, Effect::Unknown) => {
                (CallStatus::Cancelled, "its effect may have taken place")
            }
            (Status::Cancelled, Effect::None) => (CallStatus::Cancelled, "nothing was changed"),
        };
        call.status = status;
        call.error = Some(note.to_string());
    }
}
