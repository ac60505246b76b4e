//! The three host functions the prelude calls (`hostCall`, `hostOutput`, `hostDone`) and the
//! per-script state they write into.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use codemode_spec::DeadlineClock;
use futures::FutureExt;
use rquickjs::{Ctx, Exception, Function};
use serde_json::Value;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::host::{Host, HostCall, HostCallKind, HostError};
use crate::limits::Limits;
use crate::replay::{Recorder, ReplayLog};
use crate::result::{CallRecord, CallStatus, ErrorKind, OutputItem, ScriptError};
use crate::vm::Guard;

/// A call result on its way back to the driver.
pub(crate) type Completion = (u64, Result<String, HostError>);

/// A call that has not been delivered to the script yet.
pub(crate) struct InFlight {
    pub started: Instant,
    pub token: CancellationToken,
    /// Index into `RunState::calls` for tools.
    pub record: Option<usize>,
}

/// How the script ended, as reported by the prelude.
pub(crate) enum Done {
    Ok {
        value: Option<String>,
        writes: Option<String>,
    },
    Err {
        desc: Option<String>,
    },
}

/// Everything one script run accumulates. Lives on the worker thread only.
pub(crate) struct RunState {
    pub host: Arc<dyn Host>,
    pub clock: DeadlineClock,
    pub limits: Limits,
    pub abort: CancellationToken,
    pub next_id: Cell<u64>,
    pub inflight: RefCell<BTreeMap<u64, InFlight>>,
    pub calls: RefCell<Vec<CallRecord>>,
    pub output: RefCell<Vec<OutputItem>>,
    pub done: RefCell<Option<Done>>,
    pub fatal: RefCell<Option<ScriptError>>,
    pub tx: UnboundedSender<Completion>,
    /// Results of calls whose future finished on its first poll, inside the call itself.
    pub ready: RefCell<Vec<Completion>>,
    pub recorder: RefCell<Option<Recorder>>,
    pub replay: Option<RefCell<ReplayLog>>,
}

impl RunState {
    /// Ends the run with a sandbox-level error (broken bridge, replay divergence).
    pub fn fail_fatal(&self, guard: &Guard, message: String) {
        if self.fatal.borrow().is_none() {
            *self.fatal.borrow_mut() = Some(ScriptError::new(ErrorKind::Sandbox, message));
        }
        guard.finished.set(true);
    }
}

/// Holds the current script's state; empty between scripts.
#[derive(Default)]
pub(crate) struct BridgeSlot(RefCell<Option<Rc<RunState>>>);

impl BridgeSlot {
    pub fn set(&self, state: Rc<RunState>) {
        *self.0.borrow_mut() = Some(state);
    }
    pub fn clear(&self) {
        self.0.borrow_mut().take();
    }
    fn get(&self) -> Option<Rc<RunState>> {
        self.0.borrow().clone()
    }
}

/// Parses JSON text from the VM. `JSON.stringify` writes a lone surrogate as a `\uD8xx` escape,
/// which is valid JavaScript but not valid Unicode; such escapes become U+FFFD.
pub(crate) fn parse_vm_json(json: &str) -> Result<Value, serde_json::Error> {
    match serde_json::from_str(json) {
        Ok(v) => Ok(v),
        Err(e)
            if json.contains("\\u")
                || json.contains("\\U")
                || e.to_string().contains("surrogate") =>
        {
            serde_json::from_str(&repair_lone_surrogates(json))
        }
        Err(e) => Err(e),
    }
}

fn hex4(b: &[u8]) -> Option<u16> {
    let s = std::str::from_utf8(b.get(..4)?).ok()?;
    u16::from_str_radix(s, 16).ok()
}

/// Rewrites `\uXXXX` escapes of unpaired surrogates to `\ufffd`, leaving everything else alone.
fn repair_lone_surrogates(json: &str) -> String {
    let b = json.as_bytes();
    let mut out = String::with_capacity(json.len());
    let mut i = 0;
    let mut copied = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            i += 1;
            continue;
        }
        if b.get(i + 1) != Some(&b'u') {
            i += 2;
            continue;
        }
        let Some(unit) = hex4(&b[i + 2..]) else {
            i += 2;
            continue;
        };
        let is_high = (0xD800..0xDC00).contains(&unit);
        let is_low = (0xDC00..0xE000).contains(&unit);
        if is_high {
            let next_low = b.get(i + 6) == Some(&b'\\')
                && b.get(i + 7) == Some(&b'u')
                && b.get(i + 8..)
                    .and_then(hex4)
                    .is_some_and(|u| (0xDC00..0xE000).contains(&u));
            if next_low {
                i += 12;
                continue;
            }
        }
        if is_high || is_low {
            out.push_str(&json[copied..i]);
            out.push_str("\\ufffd");
            i += 6;
            copied = i;
            continue;
        }
        i += 6;
    }
    out.push_str(&json[copied..]);
    out
}

/// Short argument preview for call records.
pub(crate) fn preview(json: &str, max: usize) -> String {
    if json.chars().count() <= max {
        return json.to_string();
    }
    let mut s: String = json.chars().take(max.saturating_sub(3)).collect();
    s.push_str("...");
    s
}

fn throw(ctx: &Ctx<'_>, message: &str) -> rquickjs::Error {
    Exception::throw_message(ctx, message)
}

fn host_call<'js>(
    ctx: &Ctx<'js>,
    slot: &BridgeSlot,
    guard: &Guard,
    kind: i32,
    name: String,
    json: String,
) -> rquickjs::Result<i32> {
    let Some(state) = slot.get() else {
        return Err(throw(ctx, "The sandbox is not running a script."));
    };
    let kind = if kind == 0 {
        HostCallKind::Tool
    } else {
        HostCallKind::Global
    };
    let issued = state.next_id.get();
    if issued >= state.limits.max_calls {
        return Err(throw(
            ctx,
            &format!(
                "Call limit reached: this script may make at most {} tool and global calls. Do the rest in another script, or use fewer, larger calls.",
                state.limits.max_calls
            ),
        ));
    }
    let running = state.inflight.borrow().len();
    if running >= state.limits.max_calls_in_flight {
        return Err(throw(
            ctx,
            &format!(
                "Too many calls at once: {running} are still running, the limit is {}. Await some of them before starting more.",
                state.limits.max_calls_in_flight
            ),
        ));
    }
    let args: Value = match parse_vm_json(&json) {
        Ok(v) => v,
        Err(e) => {
            state.fail_fatal(
                guard,
                format!("Sandbox bridge broken: the arguments of a call to {name} are not valid JSON ({e})."),
            );
            return Err(throw(ctx, "sandbox bridge broken"));
        }
    };
    let id = issued + 1;
    // Small integers keep the prelude's pending-call Map fast (float keys hash badly).
    let Ok(js_id) = i32::try_from(id) else {
        return Err(throw(
            ctx,
            "Call limit reached: too many calls in one script.",
        ));
    };
    state.next_id.set(id);
    if let Some(rec) = state.recorder.borrow_mut().as_mut() {
        rec.call(id, &name, kind, &args);
    }
    let record = if kind == HostCallKind::Tool {
        let mut calls = state.calls.borrow_mut();
        calls.push(CallRecord {
            id,
            name: name.clone(),
            kind,
            args: preview(&json, 200),
            status: CallStatus::Cancelled,
            duration_ms: 0.0,
            error: None,
        });
        Some(calls.len() - 1)
    } else {
        None
    };
    let token = state.abort.child_token();
    state.inflight.borrow_mut().insert(
        id,
        InFlight {
            started: Instant::now(),
            token: token.clone(),
            record,
        },
    );
    if let Some(log) = &state.replay {
        if let Err(message) = log.borrow().check_call(id, &name, kind, &args) {
            state.fail_fatal(guard, message);
            return Err(throw(ctx, "replay diverged"));
        }
        return Ok(js_id);
    }
    let call = HostCall {
        id,
        name,
        kind,
        args,
        cancel: token,
        clock: state.clock.clone(),
    };
    let host = state.host.clone();
    let Ok(mut fut) = std::panic::catch_unwind(AssertUnwindSafe(|| host.call_json(call))) else {
        state.ready.borrow_mut().push((
            id,
            Err(HostError::new("The host failed while starting this call.")),
        ));
        return Ok(js_id);
    };
    // Most host answers are immediate; polling once here saves a task and a wake-up per call.
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(&mut cx))) {
        Ok(std::task::Poll::Ready(r)) => {
            state.ready.borrow_mut().push((id, r));
            return Ok(js_id);
        }
        Ok(std::task::Poll::Pending) => {}
        Err(_) => {
            state.ready.borrow_mut().push((
                id,
                Err(HostError::new("The host failed while running this call.")),
            ));
            return Ok(js_id);
        }
    }
    let tx = state.tx.clone();
    tokio::task::spawn_local(async move {
        let result = match AssertUnwindSafe(fut).catch_unwind().await {
            Ok(r) => r,
            Err(_) => Err(HostError::new("The host failed while running this call.")),
        };
        let _ = tx.send((id, result));
    });
    Ok(js_id)
}

/// Creates the bridge functions bound to `slot`.
pub(crate) fn install_bridge<'js>(
    ctx: &Ctx<'js>,
    slot: Rc<BridgeSlot>,
    guard: Rc<Guard>,
) -> rquickjs::Result<(Function<'js>, Function<'js>, Function<'js>)> {
    let (s1, g1) = (slot.clone(), guard.clone());
    let call = Function::new(
        ctx.clone(),
        move |ctx: Ctx<'js>, kind: i32, name: String, json: String| {
            host_call(&ctx, &s1, &g1, kind, name, json)
        },
    )?;
    let s2 = slot.clone();
    let output = Function::new(
        ctx.clone(),
        move |kind: i32, text: String, mime: Option<String>| {
            if let Some(state) = s2.get() {
                let item = match kind {
                    0 => OutputItem::Text {
                        text,
                        console: false,
                    },
                    1 => OutputItem::Text {
                        text,
                        console: true,
                    },
                    _ => OutputItem::Image {
                        data: text,
                        mime_type: mime.unwrap_or_default(),
                    },
                };
                state.output.borrow_mut().push(item);
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
