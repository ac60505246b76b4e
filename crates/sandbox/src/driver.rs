//! Runs one script on a prepared VM: setup, the job/await loop (approach B of rust-stack.md),
//! limits, cancellation of leftover calls, and the result.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use rquickjs::context::EvalOptions;
use rquickjs::{Ctx, Function, Object, Value as JsValue};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::bridge::{Completion, Done, RunState};
use crate::host::{HostError, Script};
use crate::limits::Limits;
use crate::replay::{LogEntry, Recorder, ReplayLog};
use crate::result::{CallStatus, ErrorKind, ScriptError, ScriptResult, StoreWrite};
use crate::setup::{check_globals, check_tools};
use crate::source::ParsedSource;
use crate::vm::{Stop, Vm};

/// Jobs run between checks of the deadline, abort and CPU budget.
const JOBS_PER_CHECK: u32 = 64;
/// Heap peak above which the worker returns freed memory to the system after the script.
const TRIM_AFTER_BYTES: usize = 8 << 20;

struct Det {
    start_ms: f64,
    began: Instant,
    /// Results waiting for earlier calls to be delivered first.
    buffered: BTreeMap<u64, Result<String, HostError>>,
}

/// Drops a used VM. After a big script, gives the memory back to the system instead of leaving
/// it in this thread's malloc arena, where no other worker can reuse it.
pub(crate) fn discard(vm: Vm) {
    let peak = vm.heap.peak.get();
    drop(vm);
    if peak > TRIM_AFTER_BYTES {
        // SAFETY: malloc_trim has no preconditions.
        unsafe { libc::malloc_trim(0) };
    }
}

/// Runs `script` on `vm` and builds the result. A VM serves one script: the caller discards it.
pub(crate) async fn run_script(
    vm: &Vm,
    script: Script,
    parsed: ParsedSource,
    limits: Limits,
    started: Instant,
) -> ScriptResult {
    let options = parsed.options.clone();
    let mut result = match execute(vm, script, parsed, &limits).await {
        Ok(r) => r,
        Err(error) => ScriptResult::failed(error, options.clone(), limits.clone()),
    };
    result.options = options;
    result.limits = limits;
    result.wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    result
}

fn sandbox_err(message: impl Into<String>) -> ScriptError {
    ScriptError::new(ErrorKind::Sandbox, message)
}

async fn execute(
    vm: &Vm,
    script: Script,
    parsed: ParsedSource,
    limits: &Limits,
) -> Result<ScriptResult, ScriptError> {
    if script.abort.is_cancelled() {
        return Err(ScriptError::new(
            ErrorKind::Aborted,
            "Execution aborted before the script started",
        ));
    }
    check_tools(&script.tools).map_err(sandbox_err)?;
    check_globals(&script.globals).map_err(sandbox_err)?;
    let sha = hex::encode(Sha256::digest(script.source.as_bytes()));

    let replay = match &script.replay {
        Some(p) => {
            let log = ReplayLog::read(p).map_err(sandbox_err)?;
            // Another script may replay the log (an edited script resuming a run): it follows
            // the log as long as it makes the same calls, and fails at the first that differs.
            if log.script_sha256 != sha {
                tracing::debug!(recorded = %log.script_sha256, running = %sha, "replaying another script's log");
            }
            Some(log)
        }
        None => None,
    };
    let determinism = match &replay {
        Some(log) => Some(crate::Determinism {
            seed: log.seed,
            start_ms: log.start_ms,
        }),
        None => script.determinism,
    };
    if let Some(d) = &determinism
        && !(d.start_ms.is_finite() && d.start_ms >= 0.0)
    {
        return Err(sandbox_err(
            "determinism.start_ms must be a finite, non-negative number of milliseconds since the epoch.",
        ));
    }
    let mut recorder = match &script.record {
        Some(p) => {
            let Some(d) = determinism else {
                return Err(sandbox_err(
                    "Recording needs a deterministic run: set `determinism` (seed and start time).",
                ));
            };
            let mut r = Recorder::create(p).map_err(sandbox_err)?;
            r.write(&LogEntry::Header {
                script_sha256: sha.clone(),
                seed: d.seed,
                start_ms: d.start_ms,
            });
            Some(r)
        }
        None => None,
    };

    let (tx, mut rx) = unbounded_channel::<Completion>();
    let state = Rc::new(RunState {
        host: script.host.clone(),
        clock: script.clock.clone(),
        limits: limits.clone(),
        abort: script.abort.clone(),
        next_id: Default::default(),
        inflight: Default::default(),
        calls: Default::default(),
        output: Default::default(),
        done: Default::default(),
        fatal: Default::default(),
        tx,
        ready: Default::default(),
        recorder: std::cell::RefCell::new(recorder.take()),
        replay: replay.map(std::cell::RefCell::new),
    });
    vm.slot.set(state.clone());
    vm.heap.set_limit(limits.heap_bytes);
    vm.runtime.set_max_stack_size(limits.stack_bytes);
    // Scripts are short-lived: collecting every few hundred KiB costs more than it saves.
    vm.runtime
        .set_gc_threshold((limits.heap_bytes / 8).clamp(1 << 20, 32 << 20));
    *vm.guard.active.borrow_mut() = Some(crate::vm::ActiveLimits {
        timeout: Duration::from_millis(limits.timeout_ms),
        cpu: Duration::from_millis(limits.cpu_ms),
        clock: script.clock.clone(),
        abort: script.abort.clone(),
    });

    let config = build_config(&script, limits, determinism.as_ref());
    let fns = vm
        .fns
        .as_ref()
        .ok_or_else(|| sandbox_err("the VM was already used"))?;

    // Setup and first run of the script body.
    vm.guard.enter();
    let setup = vm.context.with(|ctx| -> Result<(), ScriptError> {
        let init = fns
            .init
            .clone()
            .restore(&ctx)
            .map_err(|e| sandbox_err(e.to_string()))?;
        let run = fns
            .run
            .clone()
            .restore(&ctx)
            .map_err(|e| sandbox_err(e.to_string()))?;
        let env: Object = init.call((config,)).map_err(|e| {
            sandbox_err(format!(
                "sandbox setup failed: {}",
                crate::vm::describe(&ctx, e)
            ))
        })?;
        let tools: JsValue = env.get("tools").map_err(|e| sandbox_err(e.to_string()))?;
        let console: JsValue = env.get("console").map_err(|e| sandbox_err(e.to_string()))?;
        let wrapper = format!("(async (tools, console) => {{{}\n}})", parsed.code);
        let mut opts = EvalOptions::default();
        opts.strict = false;
        opts.filename = Some("codemode.js".into());
        match ctx.eval_with_options::<Function, _>(wrapper, opts) {
            Ok(f) => {
                if let Err(e) = run.call::<_, ()>((f, tools, console)) {
                    report_exception(&ctx, fns, e);
                }
            }
            Err(e) => report_exception(&ctx, fns, e),
        }
        Ok(())
    });
    vm.guard.leave();
    setup?;

    let mut det = determinism.map(|d| Det {
        start_ms: d.start_ms,
        began: Instant::now(),
        buffered: BTreeMap::new(),
    });
    let outcome = drive(vm, &state, &mut rx, det.as_mut()).await;
    finish(vm, &state, outcome)
}

/// Why the loop stopped.
enum Outcome {
    Done,
    Stopped(Stop),
    Stalled,
    Fatal,
}

fn report_exception(ctx: &Ctx<'_>, fns: &crate::vm::PreludeFns, e: rquickjs::Error) {
    let value = if matches!(e, rquickjs::Error::Exception) {
        ctx.catch()
    } else {
        match rquickjs::String::from_str(ctx.clone(), &e.to_string()) {
            Ok(s) => s.into_value(),
            Err(_) => JsValue::new_null(ctx.clone()),
        }
    };
    if let Ok(f) = fns.finish_err.clone().restore(ctx)
        && f.call::<_, ()>((value,)).is_err()
    {
        ctx.catch();
    }
}

fn build_config(script: &Script, limits: &Limits, det: Option<&crate::Determinism>) -> String {
    let tools: Vec<Value> = script
        .tools
        .iter()
        .map(|t| serde_json::json!([t.name, codemode_spec::to_identifier(&t.name), t.description]))
        .collect();
    let store: serde_json::Map<String, Value> = script
        .store
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.to_string())))
        .collect();
    serde_json::json!({
        "tools": tools,
        "globals": script.globals,
        "store": store,
        "limits": { "chars": limits.max_output_chars, "items": limits.max_output_items },
        "det": det.map(|d| serde_json::json!({ "seed": d.seed, "start": d.start_ms })),
    })
    .to_string()
}

/// Runs pending jobs until none are left or something must stop.
fn drain(vm: &Vm, state: &RunState) -> Option<Outcome> {
    let guard = &vm.guard;
    guard.enter();
    let mut n: u32 = 0;
    let outcome = vm.context.with(|ctx| {
        loop {
            if state.fatal.borrow().is_some() {
                return Some(Outcome::Fatal);
            }
            if state.done.borrow().is_some() {
                return Some(Outcome::Done);
            }
            if let Some(r) = guard.reason.get() {
                return Some(stop_outcome(r));
            }
            n = n.wrapping_add(1);
            if n.is_multiple_of(JOBS_PER_CHECK)
                && let Some(r) = guard.check()
            {
                return Some(stop_outcome(r));
            }
            if !ctx.execute_pending_job() {
                return None;
            }
        }
    });
    guard.leave();
    outcome
}

fn stop_outcome(r: Stop) -> Outcome {
    match r {
        Stop::Finished => Outcome::Done,
        other => Outcome::Stopped(other),
    }
}

async fn drive(
    vm: &Vm,
    state: &RunState,
    rx: &mut UnboundedReceiver<Completion>,
    mut det: Option<&mut Det>,
) -> Outcome {
    let deadline = tokio::time::sleep(remaining(vm));
    tokio::pin!(deadline);
    loop {
        if let Some(o) = drain(vm, state) {
            if state.fatal.borrow().is_some() {
                return Outcome::Fatal;
            }
            // An interrupt inside the script body surfaces as a rejection; the reason we stopped
            // it is what the caller needs to see.
            if let Some(stop @ (Stop::Timeout | Stop::Cpu | Stop::Aborted)) = vm.guard.reason.get()
            {
                return Outcome::Stopped(stop);
            }
            return o;
        }
        let ready = std::mem::take(&mut *state.ready.borrow_mut());
        if !ready.is_empty() {
            for (id, r) in ready {
                receive(vm, state, id, r, det.as_deref_mut());
            }
            continue;
        }
        if state.inflight.borrow().is_empty() {
            return Outcome::Stalled;
        }
        // Replay: the next logged result is the next thing that happens.
        if let Some(log) = &state.replay {
            let next = log.borrow_mut().results.pop_front();
            match next {
                Some((id, at_ms, r)) if state.inflight.borrow().contains_key(&id) => {
                    let r = r.map(|v| v.to_string());
                    deliver(vm, state, id, r, Some(at_ms));
                    continue;
                }
                Some((id, _, _)) => {
                    state.fail_fatal(&vm.guard, format!(
                        "Replay diverged: the log delivers the result of call {id}, but the script is not waiting for call {id}."
                    ));
                    return Outcome::Fatal;
                }
                None => {
                    state.fail_fatal(&vm.guard, "Replay diverged: the script is waiting for a call result that the log does not have.".to_string());
                    return Outcome::Fatal;
                }
            }
        }
        let abort = state.abort.clone();
        tokio::select! {
            got = rx.recv() => {
                let Some((id, r)) = got else { return Outcome::Stalled };
                receive(vm, state, id, r, det.as_deref_mut());
                // Deliver whatever else is ready in the same turn.
                while let Ok((id, r)) = rx.try_recv() {
                    receive(vm, state, id, r, det.as_deref_mut());
                }
            }
            _ = &mut deadline => {
                if let Some(r) = vm.guard.check() {
                    return stop_outcome(r);
                }
                // The clock was paused (approval): wait for the rest.
                deadline.as_mut().reset(tokio::time::Instant::now() + remaining(vm));
            }
            _ = abort.cancelled() => {
                vm.guard.reason.set(Some(Stop::Aborted));
                return Outcome::Stopped(Stop::Aborted);
            }
        }
    }
}

/// Deadline time left, by the script's (pausable) clock.
fn remaining(vm: &Vm) -> Duration {
    let active = vm.guard.active.borrow();
    match active.as_ref() {
        Some(a) => a.timeout.saturating_sub(a.clock.running()),
        None => Duration::from_secs(3600),
    }
}

/// Records a completion and delivers it (in call-id order for deterministic runs).
fn receive(
    vm: &Vm,
    state: &RunState,
    id: u64,
    r: Result<String, HostError>,
    det: Option<&mut Det>,
) {
    let Some(det) = det else {
        deliver(vm, state, id, r, None);
        return;
    };
    det.buffered.insert(id, r);
    loop {
        let first = state.inflight.borrow().keys().next().copied();
        let Some(first) = first else { return };
        let Some(r) = det.buffered.remove(&first) else {
            return;
        };
        let at_ms = det.start_ms + det.began.elapsed().as_millis() as f64;
        deliver(vm, state, first, r, Some(at_ms));
        if state.done.borrow().is_some() || state.fatal.borrow().is_some() {
            return;
        }
    }
}

fn deliver(vm: &Vm, state: &RunState, id: u64, r: Result<String, HostError>, at_ms: Option<f64>) {
    let Some(inflight) = state.inflight.borrow_mut().remove(&id) else {
        return;
    };
    if let Some(i) = inflight.record
        && let Some(rec) = state.calls.borrow_mut().get_mut(i)
    {
        {
            rec.duration_ms = inflight.started.elapsed().as_secs_f64() * 1000.0;
            match &r {
                Ok(_) => rec.status = CallStatus::Ok,
                Err(e) => {
                    rec.status = CallStatus::Error;
                    rec.error = Some(crate::bridge::preview(&e.message, 500));
                }
            }
        }
    }
    if let Some(rec) = state.recorder.borrow_mut().as_mut() {
        rec.write(&LogEntry::Result {
            id,
            at_ms: at_ms.unwrap_or_default(),
            ok: r.is_ok(),
            value: r
                .as_ref()
                .ok()
                .map(|j| serde_json::from_str(j).unwrap_or(Value::Null)),
            error: r.as_ref().err().cloned(),
        });
    }
    let Some(fns) = vm.fns.as_ref() else { return };
    vm.guard.enter();
    vm.context.with(|ctx| {
        let Ok(settle) = fns.settle.clone().restore(&ctx) else {
            return;
        };
        let now = at_ms.map(|v| JsValue::new_float(ctx.clone(), v));
        let res = match r {
            // Parsed straight from the Rust text: no intermediate JS string.
            Ok(json) => match ctx.json_parse(json) {
                Ok(value) => settle.call::<_, ()>((id as i32, true, value, (), (), now)),
                Err(_) => {
                    ctx.catch();
                    settle.call::<_, ()>((
                        id as i32,
                        false,
                        format!("The host answered call {id} with text that is not valid JSON."),
                        "TypeError",
                        (),
                        now,
                    ))
                }
            },
            Err(e) => {
                let props = if e.properties.is_empty() {
                    None
                } else {
                    serde_json::to_string(&e.properties).ok()
                };
                settle.call::<_, ()>((id as i32, false, e.message, e.name, props, now))
            }
        };
        if let Err(e) = res {
            if vm.guard.reason.get().is_none() {
                report_exception(&ctx, fns, e);
            } else {
                ctx.catch();
            }
        }
    });
    vm.guard.leave();
}

#[derive(Deserialize)]
struct ErrorDesc {
    #[serde(default)]
    name: Option<String>,
    message: String,
    #[serde(default)]
    stack: Option<String>,
    #[serde(default, rename = "isNull")]
    is_null: bool,
}

fn oom_error(limits: &Limits) -> ScriptError {
    ScriptError {
        kind: ErrorKind::Script,
        name: Some("InternalError".into()),
        message: format!(
            "out of memory: the script needed more than its heap limit of {} bytes. Keep less data in memory at once (process it in pieces, or summarize).",
            limits.heap_bytes
        ),
        stack: None,
    }
}

fn finish(vm: &Vm, state: &RunState, outcome: Outcome) -> Result<ScriptResult, ScriptError> {
    // Stop any JavaScript that could still run, then cancel calls that are still out.
    vm.guard.finished.set(true);
    let leftovers: Vec<_> = std::mem::take(&mut *state.inflight.borrow_mut())
        .into_values()
        .collect();
    {
        let mut calls = state.calls.borrow_mut();
        for f in leftovers {
            f.token.cancel();
            if let Some(rec) = f.record.and_then(|i| calls.get_mut(i)) {
                rec.status = CallStatus::Cancelled;
                rec.duration_ms = f.started.elapsed().as_secs_f64() * 1000.0;
            }
        }
    }
    let record_error = state
        .recorder
        .borrow_mut()
        .as_mut()
        .and_then(|r| r.finish());
    let limits = &state.limits;
    let mut res = ScriptResult {
        ok: false,
        value: None,
        output: std::mem::take(&mut *state.output.borrow_mut()),
        calls: std::mem::take(&mut *state.calls.borrow_mut()),
        store_writes: Vec::new(),
        error: None,
        wall_ms: 0.0,
        options: Default::default(),
        limits: limits.clone(),
    };
    let oom = vm.heap.hit_limit.get();
    let error = match outcome {
        Outcome::Fatal => state.fatal.borrow().clone(),
        Outcome::Stopped(Stop::Timeout) => Some(ScriptError::new(
            ErrorKind::Timeout,
            format!("Execution timed out after {} ms", limits.timeout_ms),
        )),
        Outcome::Stopped(Stop::Cpu) => Some(ScriptError::new(
            ErrorKind::Timeout,
            format!(
                "Execution used up its CPU budget of {} ms without finishing",
                limits.cpu_ms
            ),
        )),
        Outcome::Stopped(Stop::Aborted) => {
            Some(ScriptError::new(ErrorKind::Aborted, "Execution aborted"))
        }
        Outcome::Stopped(Stop::Finished) | Outcome::Done => None,
        Outcome::Stalled if oom => Some(oom_error(limits)),
        Outcome::Stalled => Some(ScriptError {
            kind: ErrorKind::Script,
            name: Some("Error".into()),
            message: "The script is waiting on a promise that nothing can settle: no tool call is pending, and there are no timers here.".into(),
            stack: None,
        }),
    };
    if let Some(e) = error {
        res.error = Some(e);
        return Ok(res);
    }
    match state.done.borrow_mut().take() {
        Some(Done::Ok { value, writes }) => {
            res.ok = true;
            if let Some(v) = value {
                res.value = Some(crate::bridge::parse_vm_json(&v).map_err(|e| {
                    sandbox_err(format!("Sandbox bridge broken: the returned value is not valid JSON ({e}). The script may have modified built-ins."))
                })?);
            }
            res.store_writes = decode_writes(writes.as_deref())?;
        }
        Some(Done::Err { desc }) => {
            let desc: Option<ErrorDesc> = desc.and_then(|d| serde_json::from_str(&d).ok());
            res.error = Some(match desc {
                None if oom => oom_error(limits),
                None => sandbox_err("The script failed, and its error could not be described."),
                Some(d)
                    if oom
                        && (d.is_null
                            || (d.name.as_deref() == Some("InternalError")
                                && d.message.contains("out of memory"))) =>
                {
                    oom_error(limits)
                }
                Some(d) => ScriptError {
                    kind: ErrorKind::Script,
                    name: d.name,
                    message: d.message,
                    stack: d.stack,
                },
            });
        }
        None => {
            res.error = Some(sandbox_err("The script ended without reporting a result."));
        }
    }
    if let Some(e) = record_error {
        res.ok = false;
        res.error = Some(sandbox_err(format!("Writing the record log failed: {e}")));
    }
    if !res.ok {
        res.store_writes.clear();
        res.value = None;
    }
    Ok(res)
}

fn decode_writes(writes: Option<&str>) -> Result<Vec<StoreWrite>, ScriptError> {
    let Some(w) = writes else {
        return Ok(Vec::new());
    };
    let raw: Vec<Vec<String>> = serde_json::from_str(w).map_err(|e| {
        sandbox_err(format!(
            "Sandbox bridge broken: store writes are not valid JSON ({e})."
        ))
    })?;
    let mut out = Vec::with_capacity(raw.len());
    for entry in raw {
        let mut it = entry.into_iter();
        let Some(key) = it.next() else { continue };
        match it.next() {
            Some(json) => {
                let value = crate::bridge::parse_vm_json(&json).map_err(|e| {
                    sandbox_err(format!(
                        "Sandbox bridge broken: the stored value of {key} is not valid JSON ({e})."
                    ))
                })?;
                out.push(StoreWrite::Set { key, value });
            }
            None => out.push(StoreWrite::Delete { key, delete: true }),
        }
    }
    Ok(out)
}
