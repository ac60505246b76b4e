//! The VM side of a script run: setup, the job/await loop, limits inside the VM, and how the VM
//! ended. It knows nothing of hosts, records or files: calls, output and the end go through a
//! [`Link`], to the host session on the same thread (thread isolation) or over the bridge to the
//! host process (process isolation).

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use futures::future::LocalBoxFuture;
use rquickjs::context::EvalOptions;
use rquickjs::{Ctx, Exception, Function, Object, Value as JsValue, qjs};

use crate::host::HostCallKind;
use crate::protocol::{Delivery, End, Finish, Start, VmLimits};
use crate::result::OutputItem;
use crate::vm::{ActiveLimits, Stop, Vm};

/// Jobs run between checks of the deadline, abort and CPU budget.
const JOBS_PER_CHECK: u32 = 64;

/// What a wait for results ended with.
pub(crate) enum Waited {
    /// Results may have arrived: [`Link::poll_ready`] has them.
    Results,
    /// The host stopped the script.
    Stop(Stop),
}

/// Where the VM's calls, output and waits go.
pub(crate) trait Link {
    /// Sends a call. Returns its result when the host answered at once and the VM may take it
    /// now, in the middle of its turn (see [`crate::session::Session::take_immediate`]).
    /// `first_in_job` says no other call was made in the current job: a link that must wait
    /// for the answer waits only then, so calls made together in one job still go out together.
    fn call(
        &self,
        id: u64,
        kind: HostCallKind,
        name: &str,
        args: &str,
        first_in_job: bool,
    ) -> Option<String>;
    fn output(&self, item: OutputItem);
    /// Moves results that are ready now into `out`, in the order they must be delivered.
    fn poll_ready(&self, out: &mut Vec<Delivery>);
    /// Waits until results arrive or the host stops the script. Called with calls in flight and
    /// nothing ready, at the end of one turn of the event loop.
    fn wait(&self) -> LocalBoxFuture<'_, Waited>;
}

/// How the script ended, as reported by the prelude.
enum Done {
    Ok {
        value: Option<String>,
        writes: Option<String>,
    },
    Err {
        desc: Option<String>,
    },
}

/// Engine-side state of one run, reached by the prelude's host functions.
pub(crate) struct RunState {
    link: Rc<dyn Link>,
    limits: VmLimits,
    issued: Cell<u64>,
    in_flight: Cell<u64>,
    /// Calls made in the job running now.
    job_calls: Cell<u32>,
    done: RefCell<Option<Done>>,
    /// Immediate answers the VM could not take in place; delivered like any other result.
    deferred: RefCell<Vec<Delivery>>,
}

/// Holds the current script's state; empty between scripts.
#[derive(Default)]
pub(crate) struct BridgeSlot(
    RefCell<Option<Rc<RunState>>>,
    /// The VM's intrinsic prototypes, for the native JSON writer.
    pub(crate) Cell<crate::json_out::Protos>,
);

impl BridgeSlot {
    pub fn clear(&self) {
        self.0.borrow_mut().take();
    }
    fn get(&self) -> Option<Rc<RunState>> {
        self.0.borrow().clone()
    }
}

fn throw(ctx: &Ctx<'_>, message: &str) -> rquickjs::Error {
    Exception::throw_message(ctx, message)
}

/// A call from the prelude. Returns the call's id, which the prelude turns into a pending
/// promise, or, when the host answered at once, a promise already fulfilled with the result.
fn host_call<'js>(
    ctx: &Ctx<'js>,
    slot: &BridgeSlot,
    kind: i32,
    name: &str,
    json: &str,
) -> rquickjs::Result<JsValue<'js>> {
    let Some(state) = slot.get() else {
        return Err(throw(ctx, "The sandbox is not running a script."));
    };
    let issued = state.issued.get();
    if issued >= state.limits.max_calls {
        return Err(throw(
            ctx,
            &format!(
                "Call limit reached: this script may make at most {} tool and global calls. Do the rest in another script, or use fewer, larger calls.",
                state.limits.max_calls
            ),
        ));
    }
    let running = state.in_flight.get();
    if running >= state.limits.max_calls_in_flight {
        return Err(throw(
            ctx,
            &format!(
                "Too many calls at once: {running} are still running, the limit is {}. Await some of them before starting more.",
                state.limits.max_calls_in_flight
            ),
        ));
    }
    let id = issued + 1;
    // Small integers keep the prelude's pending-call table fast.
    let Ok(js_id) = i32::try_from(id) else {
        return Err(throw(
            ctx,
            "Call limit reached: too many calls in one script.",
        ));
    };
    state.issued.set(id);
    state.in_flight.set(running + 1);
    let first_in_job = state.job_calls.get() == 0;
    state.job_calls.set(state.job_calls.get().saturating_add(1));
    let kind = if kind == 0 {
        HostCallKind::Tool
    } else {
        HostCallKind::Global
    };
    let Some(json) = state.link.call(id, kind, name, json, first_in_job) else {
        return Ok(JsValue::new_int(ctx.clone(), js_id));
    };
    // Answered at once: the script's `await` resumes on the next job, without a turn of the
    // event loop and a trip through the pending-call table. What the builder does not take
    // (invalid JSON, a result past the heap limit) is delivered the usual way, whose errors say
    // what went wrong.
    match crate::json_in::build(ctx, &json) {
        Ok(value) => {
            // SAFETY: a valid context; the value is borrowed, the promise returned owned.
            let promise =
                unsafe { qjs::JS_NewSettledPromise(ctx.as_raw().as_ptr(), false, value.as_raw()) };
            // SAFETY: checking the tag of a value just returned by QuickJS.
            if unsafe { qjs::JS_IsException(promise) } {
                return Err(rquickjs::Error::Exception);
            }
            state.in_flight.set(running);
            // SAFETY: an owned value of this context, handed to rquickjs, which frees it.
            Ok(unsafe { JsValue::from_raw(ctx.clone(), promise) })
        }
        Err(_) => {
            state.deferred.borrow_mut().push(Delivery {
                id,
                result: Ok(json),
                at_ms: None,
            });
            Ok(JsValue::new_int(ctx.clone(), js_id))
        }
    }
}

/// Creates the prelude's host functions bound to `slot`.
pub(crate) fn install_bridge<'js>(
    ctx: &Ctx<'js>,
    slot: Rc<BridgeSlot>,
    guard: Rc<crate::vm::Guard>,
) -> rquickjs::Result<(Function<'js>, Function<'js>, Function<'js>)> {
    let s1 = slot.clone();
    let call = Function::new(
        ctx.clone(),
        move |ctx: Ctx<'js>,
              kind: i32,
              name: rquickjs::String<'js>,
              value: JsValue<'js>,
              json: Option<rquickjs::String<'js>>| {
            // The arguments come as a value, turned into JSON here when they are plain data,
            // or as the text of JSON.stringify when this declined (by answering null).
            let json = match json {
                Some(j) => j.to_string()?,
                None => {
                    let raw = ctx.as_raw().as_ptr();
                    match crate::json_out::plain_json(raw, s1.1.get(), value.as_raw()) {
                        Some(j) => j,
                        None => return Ok(JsValue::new_null(ctx.clone())),
                    }
                }
            };
            let name = name.to_string()?;
            host_call(&ctx, &s1, kind, &name, &json)
        },
    )?;
    let s2 = slot.clone();
    let output = Function::new(
        ctx.clone(),
        move |kind: i32, text: String, mime: Option<String>| {
            if let Some(state) = s2.get() {
                let item = match kind {
                    0 | 1 => OutputItem::Text {
                        text,
                        console: kind == 1,
                    },
                    _ => OutputItem::Image {
                        data: text,
                        mime_type: mime.unwrap_or_default(),
                    },
                };
                state.link.output(item);
            }
        },
    )?;
    let (s3, g3) = (slot, guard);
    let done = Function::new(
        ctx.clone(),
        move |ok: bool, a: Option<String>, b: Option<String>| {
            if let Some(state) = s3.get() {
                let mut done = state.done.borrow_mut();
                if done.is_none() {
                    *done = Some(if ok {
                        Done::Ok {
                            value: a,
                            writes: b,
                        }
                    } else {
                        Done::Err { desc: a }
                    });
                }
                g3.finished.set(true);
            }
        },
    )?;
    Ok((call, output, done))
}

/// Runs one script on `vm` and reports how the VM ended. Afterwards the caller resets the VM to
/// its prepared image (or drops it); every JS value of the run is gone by then. `wall` carries
/// the deadline and abort the VM checks itself (thread isolation); without it, only the host's
/// stop flag and the CPU budget apply.
pub(crate) async fn run(vm: &Vm, start: Start, link: Rc<dyn Link>, limits: ActiveLimits) -> Finish {
    let state = Rc::new(RunState {
        link: link.clone(),
        limits: start.limits.clone(),
        issued: Cell::new(0),
        in_flight: Cell::new(0),
        job_calls: Cell::new(0),
        done: RefCell::new(None),
        deferred: RefCell::new(Vec::new()),
    });
    *vm.slot.0.borrow_mut() = Some(state.clone());
    let l = &start.limits;
    vm.heap
        .set_limit(usize::try_from(l.heap_bytes).unwrap_or(usize::MAX));
    vm.runtime
        .set_max_stack_size(usize::try_from(l.stack_bytes).unwrap_or(usize::MAX));
    // Scripts are short-lived: collecting every few hundred KiB costs more than it saves.
    vm.runtime.set_gc_threshold(
        (usize::try_from(l.heap_bytes).unwrap_or(usize::MAX) / 8).clamp(1 << 20, 32 << 20),
    );
    *vm.guard.active.borrow_mut() = Some(limits);

    let mut finish = Finish::default();
    let Some(fns) = vm.fns.as_ref() else {
        finish.end = Some(End::Fatal);
        finish.fatal = Some("the VM was already used".into());
        return finish;
    };

    vm.guard.enter();
    let setup = vm.context.with(|ctx| -> Result<(), String> {
        let init = fns.init.clone().restore(&ctx).map_err(|e| e.to_string())?;
        let run = fns.run.clone().restore(&ctx).map_err(|e| e.to_string())?;
        let env: Object = init
            .call((start.config.as_str(),))
            .map_err(|e| format!("sandbox setup failed: {}", crate::vm::describe(&ctx, e)))?;
        let tools: JsValue = env.get("tools").map_err(|e| e.to_string())?;
        let console: JsValue = env.get("console").map_err(|e| e.to_string())?;
        let wrapper = format!("(async (tools, console) => {{{}\n}})", start.code);
        let mut opts = EvalOptions::default();
        opts.strict = false;
        opts.filename = Some("codemode.js".into());
        match ctx.eval_with_options::<Function, _>(wrapper, opts) {
            Ok(f) => {
                if let Err(e) = run.call::<_, ()>((f, tools, console)) {
                    report_exception(&ctx, fns, e);
                }
            }
            Err(e) => {
                // QuickJS reports a failed allocation in its parser as a SyntaxError; the truth is
                // that the script was too large for its heap.
                if vm.heap.hit_limit.get() {
                    ctx.catch();
                    finish.oom_compiling = true;
                    vm.guard.finished.set(true);
                } else {
                    report_exception(&ctx, fns, e)
                }
            }
        }
        Ok(())
    });
    vm.guard.leave();
    if let Err(message) = setup {
        finish.end = Some(End::Fatal);
        finish.fatal = Some(message);
        return finish;
    }

    let end = drive(vm, &state, &*link).await;
    finish.end = Some(end);
    finish.oom = vm.heap.hit_limit.get();
    if let Some(done) = state.done.borrow_mut().take() {
        match done {
            Done::Ok { value, writes } => {
                finish.ok = true;
                finish.value = value;
                finish.writes = writes;
            }
            Done::Err { desc } => finish.desc = desc,
        }
    }
    vm.slot.clear();
    finish
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

/// Why the job loop stopped.
enum Drained {
    Done,
    Stopped(Stop),
}

/// Runs pending jobs until none are left (`None`) or something must stop.
fn drain(vm: &Vm, state: &RunState) -> Option<Drained> {
    let guard = &vm.guard;
    guard.enter();
    let mut n: u32 = 0;
    let outcome = vm.context.with(|ctx| {
        loop {
            if state.done.borrow().is_some() {
                return Some(Drained::Done);
            }
            if let Some(r) = guard.reason.get() {
                return Some(stopped(r));
            }
            n = n.wrapping_add(1);
            if n.is_multiple_of(JOBS_PER_CHECK)
                && let Some(r) = guard.check()
            {
                return Some(stopped(r));
            }
            state.job_calls.set(0);
            if !ctx.execute_pending_job() {
                return None;
            }
        }
    });
    guard.leave();
    outcome
}

fn stopped(r: Stop) -> Drained {
    match r {
        Stop::Finished => Drained::Done,
        other => Drained::Stopped(other),
    }
}

fn end_of(stop: Stop) -> End {
    match stop {
        Stop::Timeout => End::Timeout,
        Stop::Cpu => End::Cpu,
        Stop::Aborted => End::Aborted,
        Stop::Fatal => End::Fatal,
        Stop::Finished => End::Reported,
    }
}

async fn drive(vm: &Vm, state: &RunState, link: &dyn Link) -> End {
    let mut ready: Vec<Delivery> = Vec::new();
    loop {
        if let Some(o) = drain(vm, state) {
            // An interrupt inside the script body surfaces as a rejection; the reason we stopped
            // it is what the caller needs to see.
            if let Some(stop @ (Stop::Timeout | Stop::Cpu | Stop::Aborted | Stop::Fatal)) =
                vm.guard.reason.get()
            {
                return end_of(stop);
            }
            return match o {
                Drained::Done => End::Reported,
                Drained::Stopped(s) => end_of(s),
            };
        }
        ready.append(&mut state.deferred.borrow_mut());
        link.poll_ready(&mut ready);
        if !ready.is_empty() {
            for d in ready.drain(..) {
                deliver(vm, state, d);
            }
            continue;
        }
        if state.in_flight.get() == 0 {
            return End::Stalled;
        }
        match link.wait().await {
            Waited::Results => {}
            Waited::Stop(stop) => {
                vm.guard.reason.set(Some(stop));
                return end_of(stop);
            }
        }
        if let Some(r) = vm.guard.check() {
            return match stopped(r) {
                Drained::Done => End::Reported,
                Drained::Stopped(s) => end_of(s),
            };
        }
    }
}

/// Parses JSON text straight into the VM, without the copy and scan of a `CString`.
fn parse_json<'js>(ctx: &Ctx<'js>, json: String) -> rquickjs::Result<JsValue<'js>> {
    let mut bytes = json.into_bytes();
    let len = bytes.len();
    bytes.push(0);
    // SAFETY: `bytes` is NUL-terminated as JS_ParseJSON requires; the returned value is owned.
    unsafe {
        let v = qjs::JS_ParseJSON(
            ctx.as_raw().as_ptr(),
            bytes.as_ptr().cast(),
            len as _,
            c"<result>".as_ptr(),
        );
        if qjs::JS_IsException(v) {
            return Err(rquickjs::Error::Exception);
        }
        Ok(JsValue::from_raw(ctx.clone(), v))
    }
}

/// A call result as a JS value: built natively, or by `JSON.parse` for what the builder does not
/// take (so odd but valid JSON still works, and invalid JSON gets JSON.parse's verdict).
fn result_value<'js>(ctx: &Ctx<'js>, json: String) -> rquickjs::Result<JsValue<'js>> {
    match crate::json_in::build(ctx, &json) {
        Ok(v) => Ok(v),
        Err(crate::json_in::BuildError::OutOfMemory) => Err(rquickjs::Error::Exception),
        Err(crate::json_in::BuildError::Unsupported) => parse_json(ctx, json),
    }
}

fn deliver(vm: &Vm, state: &RunState, d: Delivery) {
    let Some(fns) = vm.fns.as_ref() else { return };
    state.in_flight.set(state.in_flight.get().saturating_sub(1));
    let id = d.id as i32;
    vm.guard.enter();
    vm.context.with(|ctx| {
        let Ok(settle) = fns.settle.clone().restore(&ctx) else {
            return;
        };
        let now = d.at_ms.map(|v| JsValue::new_float(ctx.clone(), v));
        let res = match d.result {
            Ok(json) => match result_value(&ctx, json) {
                Ok(value) => settle.call::<_, ()>((id, true, value, (), (), now)),
                Err(_) => {
                    ctx.catch();
                    let message = if vm.heap.hit_limit.get() {
                        format!(
                            "The result of call {} does not fit in the script's heap limit of {} bytes. Ask the tool for less (a filter, a page, a limit).",
                            d.id, state.limits.heap_bytes
                        )
                    } else {
                        format!("The host answered call {} with text that is not valid JSON.", d.id)
                    };
                    let name = if vm.heap.hit_limit.get() { "RangeError" } else { "TypeError" };
                    settle.call::<_, ()>((id, false, message, name, (), now))
                }
            },
            Err(e) => {
                let props = if e.properties.is_empty() {
                    None
                } else {
                    serde_json::to_string(&e.properties).ok()
                };
                settle.call::<_, ()>((id, false, e.message, e.name, props, now))
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
