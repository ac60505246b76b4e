//! The bridge from the sandbox to the gate: every call a script makes arrives here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use codemode_gate::{CallRequest, Gate, GateError};
use codemode_models::Catalog;
use codemode_sandbox::{Host, HostCall, HostCallKind, HostError};
use codemode_spec::{HeldMemory, Origin, Provenance, Usage};
use futures::FutureExt;
use futures::future::LocalBoxFuture;
use serde_json::{Map, Value, json};
use tokio_util::task::TaskTracker;

use crate::cells::record::Charge;
use crate::globals;
use crate::view::ScriptView;

/// Who is running the script; stamped on every call it makes.
#[derive(Clone)]
pub(crate) struct ScriptIdentity {
    pub session_id: String,
    pub client: Option<String>,
    pub parent_call_id: Option<String>,
    pub script_id: String,
    pub script_hash: String,
    pub depth: u32,
    /// Told when each gated call starts and ends.
    pub on_call: Option<crate::CallObserver>,
    /// The cell this run is: its calls are answered from its replay log while the log has
    /// them, and logged before the script sees each result.
    pub cell: Option<Arc<crate::cells::CellLink>>,
}

pub(crate) struct RuntimeHost {
    state: Arc<HostState>,
}

struct HostState {
    gate: Gate,
    /// The embedder's runtime. Calls run there, not on the sandbox's worker thread: tools such as
    /// HTTP clients and MCP connections spawn tasks on the runtime that first polls them, and a
    /// sandbox worker stops polling its runtime between scripts, which would strand those tasks.
    io: Option<tokio::runtime::Handle>,
    identity: ScriptIdentity,
    /// Tools and namespaces as the script saw them at start, for the discovery helpers.
    view: Arc<ScriptView>,
    catalog: Option<Arc<Catalog>>,
    /// Host time the read-only globals may take for this script: its CPU budget. They run
    /// outside the VM, where the budget is not counted.
    read_only_budget: Duration,
    /// Host time they took so far, in nanoseconds.
    read_only_spent: AtomicU64,
    /// Global name → registered tool name, for globals that carry authority.
    gated_globals: HashMap<String, String>,
    spent: Mutex<Spent>,
    on_call: Option<crate::CallObserver>,
    /// The calls running on the embedder's runtime, waited for when the script ends.
    in_flight: TaskTracker,
}

/// What the script's calls spent, by sandbox call id, and the images models generated for it.
#[derive(Default)]
pub(crate) struct Spent {
    pub usage_by_call: HashMap<u64, Usage>,
    pub generated_images: Vec<String>,
}

/// What the read-only globals answer from, and the host time they may take.
pub(crate) struct ReadOnlyView {
    pub view: Arc<ScriptView>,
    pub catalog: Option<Arc<Catalog>>,
    /// The script's CPU budget.
    pub budget: Duration,
}

impl RuntimeHost {
    pub(crate) fn new(
        gate: Gate,
        io: Option<tokio::runtime::Handle>,
        identity: ScriptIdentity,
        view: ReadOnlyView,
        gated_globals: HashMap<String, String>,
    ) -> Self {
        let ReadOnlyView {
            view,
            catalog,
            budget: read_only_budget,
        } = view;
        let on_call = identity.on_call.clone();
        RuntimeHost {
            state: Arc::new(HostState {
                gate,
                io,
                identity,
                view,
                catalog,
                read_only_budget,
                read_only_spent: AtomicU64::new(0),
                gated_globals,
                spent: Mutex::new(Spent::default()),
                on_call,
                in_flight: TaskTracker::new(),
            }),
        }
    }

    /// A handle that reads what was spent after the run, while the sandbox owns the host.
    pub(crate) fn spent_handle(&self) -> SpentHandle {
        SpentHandle(self.state.clone())
    }

    /// The script's calls still running: close and wait on it after the script ends.
    pub(crate) fn in_flight(&self) -> TaskTracker {
        self.state.in_flight.clone()
    }
}

pub(crate) struct SpentHandle(Arc<HostState>);

impl SpentHandle {
    pub(crate) fn take(&self) -> Spent {
        std::mem::take(&mut *lock(&self.0.spent))
    }
}

impl Host for RuntimeHost {
    fn call(&self, call: HostCall) -> LocalBoxFuture<'static, Result<Value, HostError>> {
        let state = self.state.clone();
        async move { state.dispatch(call).await }.boxed_local()
    }

    fn refused(&self, call: HostCall, error: HostError) -> LocalBoxFuture<'static, ()> {
        let state = self.state.clone();
        async move { state.record_refused(call, error).await }.boxed_local()
    }
}

impl HostState {
    async fn dispatch(&self, call: HostCall) -> Result<Value, HostError> {
        match call.kind {
            HostCallKind::Tool => {
                let name = call.name.clone();
                self.through_gate(call, name, None).await
            }
            HostCallKind::Global => {
                let args = match &call.args {
                    Value::Array(a) => a.clone(),
                    other => vec![other.clone()],
                };
                if let Some(tool) = self.gated_globals.get(&call.name).cloned() {
                    let args = global_arguments(&call.name, args);
                    return self.through_gate(call, tool, Some(args)).await;
                }
                let spent = Duration::from_nanos(self.read_only_spent.load(Ordering::Relaxed));
                if spent >= self.read_only_budget {
                    return Err(host_error(
                        format!(
                            "{}: searchTools, describeTool, describeNamespace and the model catalog readers have used up this script's CPU budget of {} ms on the host. Search once and keep what you found, or split the work over several scripts.",
                            call.name,
                            self.read_only_budget.as_millis()
                        ),
                        "RangeError",
                        Map::new(),
                    ));
                }
                // Building the index is charged too: a server listing thousands of tools with
                // long descriptions makes it seconds of host CPU.
                let started = Instant::now();
                let index = self.view.index();
                let answer = globals::answer(&call.name, &args, index, self.catalog.as_deref());
                let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.read_only_spent.fetch_add(took, Ordering::Relaxed);
                match answer {
                    Some(Ok(v)) => Ok(v),
                    Some(Err(message)) => Err(host_error(message, "TypeError", Map::new())),
                    None => Err(host_error(
                        format!("{} is not available in this installation", call.name),
                        "TypeError",
                        Map::new(),
                    )),
                }
            }
        }
    }

    /// Writes the audit line of a call the sandbox refused unread (see [`Host::refused`]).
    /// Ungated globals (`searchTools`, …) have no line, as when they run.
    async fn record_refused(&self, call: HostCall, error: HostError) {
        let tool = match call.kind {
            HostCallKind::Tool => call.name.clone(),
            HostCallKind::Global => match self.gated_globals.get(&call.name) {
                Some(tool) => tool.clone(),
                None => return,
            },
        };
        let request = CallRequest {
            name: tool,
            args: Value::Null,
            provenance: self.provenance(call.id),
            cancel: call.cancel.clone(),
            clock: Some(call.clock.clone()),
            result_room: None,
        };
        let gate = self.gate.clone();
        let write = async move { gate.record_unread(request, &error.message).await };
        match &self.io {
            // On the embedder's runtime, like every gated call: the worker's is not polled once
            // the script ends, and `run_script` waits for these tasks.
            Some(io) => {
                let _ = self.in_flight.spawn_on(write, io).await;
            }
            None => write.await,
        }
    }

    fn provenance(&self, seq: u64) -> Provenance {
        let id = &self.identity;
        let parent = id
            .parent_call_id
            .clone()
            .unwrap_or_else(|| id.script_id.clone());
        Provenance {
            call_id: format!("{parent}/{seq}"),
            parent_call_id: id.parent_call_id.clone(),
            depth: id.depth,
            origin: Origin::Script,
            script_id: Some(id.script_id.clone()),
            script_hash: Some(id.script_hash.clone()),
            session_id: id.session_id.clone(),
            seq: Some(seq),
            client: id.client.clone(),
        }
    }

    async fn through_gate(
        &self,
        call: HostCall,
        tool: String,
        args: Option<Value>,
    ) -> Result<Value, HostError> {
        if let Some(link) = &self.identity.cell {
            match link.replay(call.id, &call.name, &call.args) {
                crate::cells::record::Replayed::Live => {}
                crate::cells::record::Replayed::Result { result: r, spent } => {
                    // What ran is counted again here, with what it spent (a refusal was not
                    // counted where it ran). Logs that did not record it are read by the
                    // result: a value, or a failure of the tool itself, means it ran.
                    let spent = spent.unwrap_or_else(|| Charge {
                        ran: match &r {
                            Ok(_) => true,
                            Err(e) => e.properties.get("stage") == Some(&Value::from("execute")),
                        },
                        bytes: r
                            .as_ref()
                            .map_or(0, |v| serde_json::to_vec(v).map_or(0, |b| b.len() as u64)),
                        usage: None,
                    });
                    if spent.ran {
                        self.gate.count_replayed_call(
                            &tool,
                            &self.identity.session_id,
                            &self.identity.script_id,
                            spent.bytes,
                            spent.usage.as_ref(),
                        );
                        if let Some(usage) = spent.usage.filter(|u| !u.is_empty()) {
                            lock(&self.spent).usage_by_call.insert(call.id, usage);
                        }
                    }
                    return r;
                }
                crate::cells::record::Replayed::Stop(message) => {
                    return Err(host_error(message, "Error", Map::new()));
                }
            }
        }
        let logged = self
            .identity
            .cell
            .clone()
            .map(|link| (link, call.name.clone(), call.args.clone()));
        let provenance = self.provenance(call.id);
        let seq = call.id;
        if let Some(observe) = &self.on_call {
            observe.notify(crate::CallEvent::Started {
                seq,
                name: tool.clone(),
            });
        }
        let observed_name = self.on_call.as_ref().map(|_| tool.clone());
        let request = CallRequest {
            name: tool,
            args: args.unwrap_or(call.args),
            provenance,
            cancel: call.cancel.clone(),
            clock: Some(call.clock.clone()),
            result_room: Some(result_room(&call.room)),
        };
        let gate = self.gate.clone();
        let logged_call = logged.clone();
        let run = async move {
            match logged_call {
                Some((link, name, args)) => {
                    logged_gate_call(gate, request, &link, &name, &args).await
                }
                None => gate.call(request).await.map_err(gate_error),
            }
        };
        let outcome = match &self.io {
            Some(io) => {
                // Most calls (a built-in tool, a denial) finish in their first poll: run that
                // poll here, on the thread that read the call, inside the embedder's runtime so
                // that anything it spawns or registers (timers, sockets, tasks) lands there.
                // That saves two cross-thread wake-ups per call: the spawn and the join.
                let mut run = Box::pin(run);
                let first = {
                    let _inside = io.enter();
                    let waker = futures::task::noop_waker();
                    run.as_mut()
                        .poll(&mut std::task::Context::from_waker(&waker))
                };
                match first {
                    std::task::Poll::Ready(outcome) => outcome,
                    // The rest runs on the embedder's runtime, whose waker it registers at its
                    // next poll. Not aborted when the script stops waiting: the sandbox cancels
                    // the call's token, the tool stops cooperatively, and the gate writes the
                    // call's outcome line; `run_script` waits for these tasks before it returns.
                    std::task::Poll::Pending => match self.in_flight.spawn_on(run, io).await {
                        Ok(outcome) => outcome,
                        Err(e) => {
                            return Err(host_error(
                                format!("the call stopped unexpectedly: {e}"),
                                "Error",
                                Map::new(),
                            ));
                        }
                    },
                }
            }
            // Not inside a tokio runtime: the call runs on the sandbox's worker.
            None => run.await,
        };
        if let (Some(observe), Some(name)) = (&self.on_call, observed_name) {
            observe.notify(crate::CallEvent::Finished {
                seq,
                name,
                ok: outcome.is_ok(),
            });
        }
        match outcome {
            Ok(output) => {
                let mut spent = lock(&self.spent);
                if let Some(usage) = output.usage.as_ref().filter(|u| !u.is_empty()) {
                    spent.usage_by_call.insert(call.id, usage.clone());
                }
                collect_images(&output.value, &mut spent.generated_images, &call.name);
                Ok(output.value)
            }
            Err(e) => Err(e),
        }
    }
}

/// A cell's call: admitted by the gate (approval included), logged as started, run, logged with
/// its result, and only then handed to the script. A log that cannot be written stops the cell
/// (it could not be rebuilt) and, before the tool ran, the call too.
async fn logged_gate_call(
    gate: Gate,
    request: CallRequest,
    link: &crate::cells::CellLink,
    name: &str,
    args: &Value,
) -> Result<codemode_spec::ToolOutput, HostError> {
    let seq = request.provenance.seq.unwrap_or_default();
    let mut admission = match gate.admit(request).await {
        Ok(a) => a,
        Err(e) => {
            let e = gate_error(e);
            link.ended(seq, name, args, &Err(e.clone()), Charge::default())
                .await
                .map_err(plain_error)?;
            return Err(e);
        }
    };
    link.started(seq, name, args).await.map_err(plain_error)?;
    let executed = admission.execute().await;
    // What the tool returned, in case the gate then withholds it (a budget, an after-hook):
    // it ran and spent all the same.
    let ran = executed
        .as_ref()
        .ok()
        .map(|o| (size_of_json(&o.value), o.usage.clone()));
    let outcome = admission.finish(executed).await;
    let spent = match (&outcome, ran) {
        (Ok(o), _) => Charge {
            ran: true,
            bytes: size_of_json(&o.value),
            usage: o.usage.clone(),
        },
        // Withheld for crossing `max_bytes`: those bytes were counted.
        (Err(e), Some((bytes, usage))) if e.stage == codemode_gate::Stage::Budget => Charge {
            ran: true,
            bytes,
            usage,
        },
        (Err(_), Some((_, usage))) => Charge {
            ran: true,
            bytes: 0,
            usage,
        },
        // The tool failed: it ran, and returned nothing to count.
        (Err(_), None) => Charge {
            ran: true,
            bytes: 0,
            usage: None,
        },
    };
    let outcome = outcome.map_err(gate_error);
    let seen = outcome
        .as_ref()
        .map(|o| o.value.clone())
        .map_err(Clone::clone);
    link.ended(seq, name, args, &seen, spent)
        .await
        .map_err(plain_error)?;
    outcome
}

fn size_of_json(value: &Value) -> u64 {
    serde_json::to_vec(value).map_or(0, |b| b.len() as u64)
}

fn plain_error(message: String) -> HostError {
    host_error(message, "Error", Map::new())
}

/// Maps a global's JavaScript arguments to the registered tool's single JSON argument.
fn global_arguments(global: &str, args: Vec<Value>) -> Value {
    if global.starts_with("models.") {
        let mut it = args.into_iter();
        let model = it.next().unwrap_or(Value::Null);
        let context = it.next().unwrap_or(Value::Null);
        return json!({ "model": model, "context": context });
    }
    args.into_iter().next().unwrap_or_else(|| json!({}))
}

/// Remembers images a model generated, so the result can say which ones the script never showed.
fn collect_images(value: &Value, into: &mut Vec<String>, global: &str) {
    if global != "models.generateImages" {
        return;
    }
    if let Some(blocks) = value.get("output").and_then(Value::as_array) {
        for block in blocks {
            if block.get("type").and_then(Value::as_str) == Some("image")
                && let Some(data) = block.get("data").and_then(Value::as_str)
            {
                into.push(data.to_string());
            }
        }
    }
}

fn gate_error(e: GateError) -> HostError {
    let mut props = Map::new();
    props.insert("stage".into(), json!(e.stage.as_str()));
    if !e.policy_ids.is_empty() {
        props.insert("policyIds".into(), json!(e.policy_ids));
    }
    host_error(e.message, "Error", props)
}

fn host_error(message: String, name: &str, properties: Map<String, Value>) -> HostError {
    HostError {
        message,
        name: Some(name.to_string()),
        properties,
    }
}

fn lock(m: &Mutex<Spent>) -> std::sync::MutexGuard<'_, Spent> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The script's room for answers, as the gate reserves it: the share is held with the result.
fn result_room(room: &codemode_sandbox::AnswerRoom) -> codemode_gate::ResultRoom {
    let room = room.clone();
    codemode_gate::ResultRoom::new(move |bytes| room.reserve(bytes).map(HeldMemory::new))
}
