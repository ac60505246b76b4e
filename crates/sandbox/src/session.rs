//! The host side of one script run: the authority half. It checks what the VM asks for, calls
//! the [`Host`], keeps the call records, the record/replay log and the deterministic delivery
//! order, and turns how the VM ended into a [`ScriptResult`]. It lives in the host process in both
//! isolation modes; only the VM moves into a worker process.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use codemode_spec::DeadlineClock;
use futures::FutureExt;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio_util::sync::CancellationToken;

use crate::held::{AnswerRoom, HeldAnswers};
use crate::host::{Determinism, Host, HostCall, HostCallKind, HostError, Script};
use crate::limits::Limits;
use crate::protocol::{Delivery, End, Finish, Start, VmLimits};
use crate::replay::{LogEntry, Recorder, ReplayLog};
use crate::result::{
    CallRecord, CallStatus, ErrorKind, OutputItem, ScriptError, ScriptResult, StoreWrite,
};
use crate::setup::{check_globals, check_tools};
use crate::source::{ParsedSource, ScriptOptions};
use crate::vm::Stop;

/// A call result on its way back from a host future.
type Completion = (u64, Result<String, HostError>);

/// The VM asked for something no honest VM asks for. In process isolation the worker that did
/// it is stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Violation(pub String);

struct InFlight {
    started: Instant,
    token: CancellationToken,
    /// Index into `calls` for tools.
    record: Option<usize>,
    /// JSON values in its arguments, which the host holds while it runs.
    values: usize,
    /// Bytes of its arguments' JSON, which the host holds (and copies) while it runs.
    bytes: usize,
    /// Counts it in the deadline clock, which stands still only while every call in flight
    /// waits for a person.
    _active: codemode_spec::ActiveCall,
}

struct Det {
    start_ms: f64,
    began: Instant,
    /// Results waiting for earlier calls to be delivered first.
    buffered: BTreeMap<u64, Result<String, HostError>>,
}

pub(crate) struct Session {
    host: Arc<dyn Host>,
    pub clock: DeadlineClock,
    pub abort: CancellationToken,
    pub limits: Limits,
    options: ScriptOptions,
    started: Instant,
    names: HashSet<String>,
    last_id: u64,
    inflight: BTreeMap<u64, InFlight>,
    /// JSON values in the arguments of the calls in `inflight`, together.
    inflight_values: usize,
    /// Bytes of the arguments of the calls in `inflight`, together.
    inflight_bytes: usize,
    calls: Vec<CallRecord>,
    output: Vec<OutputItem>,
    output_bytes: usize,
    ready: VecDeque<Delivery>,
    tx: UnboundedSender<Completion>,
    rx: UnboundedReceiver<Completion>,
    recorder: Option<Recorder>,
    replay: Option<ReplayLog>,
    det: Option<Det>,
    /// Why the host ended the run early (replay divergence).
    fatal: Option<ScriptError>,
    on_output: Option<crate::host::OutputTap>,
    /// Host futures spawned on this thread whose results have not been taken yet.
    spawned: usize,
    /// Answers waiting for the VM, bounded.
    held: HeldAnswers,
}

fn sandbox_err(message: impl Into<String>) -> ScriptError {
    ScriptError::new(ErrorKind::Sandbox, message)
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

/// Most JSON values the host decodes from one call's arguments or a returned value. A decoded
/// value takes 32 bytes and more where its text may take 2 (`0,`): a script within its heap
/// limit could otherwise make the host hold gigabytes.
const MAX_DECODED_VALUES: usize = 1 << 20;

/// Most JSON values the host holds for a script's calls in flight together: twice the largest
/// call, so that calls waiting together cannot multiply what one may take.
const MAX_INFLIGHT_VALUES: usize = 2 * MAX_DECODED_VALUES;

/// Most bytes of argument JSON the host holds for a script's calls in flight together. A long
/// string is one value, so the value count does not bound it, and a call waiting (for a person,
/// a hook, a slow server) keeps a few copies of its arguments on the way through the gate.
const MAX_INFLIGHT_BYTES: usize = 64 * 1024 * 1024;

fn count_values(json: &str, limit: usize) -> usize {
    codemode_spec::count_json_values(json.as_bytes(), limit)
}

/// Whether `json` holds more than `limit` values.
fn more_values_than(json: &str, limit: usize) -> bool {
    count_values(json, limit) > limit
}

/// Whether a JSON error is serde_json's nesting limit (128 levels).
fn too_deep(e: &serde_json::Error) -> bool {
    e.to_string().contains("recursion limit")
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
    if json.len() <= max {
        return json.to_string();
    }
    let mut s: String = json.chars().take(max.saturating_sub(3)).collect();
    if s.len() == json.len() {
        return s;
    }
    s.push_str("...");
    s
}

/// The most bytes of UTF-8 one UTF-16 unit of script output can become (a control character
/// escaped in JSON as `\u0000`).
const BYTES_PER_CHAR: usize = 6;

/// The error of a script whose timeout passed before it started: while it waited for a worker
/// (none of it ran), or, for a script resumed from a log, in the process that ran it before.
pub(crate) fn never_started(clock: &DeadlineClock, timeout_ms: u64) -> ScriptError {
    let carried = clock.carried();
    if carried >= Duration::from_millis(timeout_ms) {
        return ScriptError::new(
            ErrorKind::Timeout,
            format!(
                "The script was not resumed: it had already run {} ms of its {timeout_ms} ms \
                 timeout before the process running it stopped. Its calls that ran stand; run \
                 it again with a longer timeout_ms to finish the work.",
                carried.as_millis()
            ),
        );
    }
    let waited = clock.running().saturating_sub(carried);
    ScriptError::new(
        ErrorKind::Timeout,
        format!(
            "The script did not start: it waited {} ms for a sandbox worker, all of which were \
             running other scripts, and its timeout of {timeout_ms} ms passed first. None of it \
             ran; run it again when fewer scripts are running.",
            waited.as_millis()
        ),
    )
}

impl Session {
    /// Checks the script and opens its logs. Returns the session and what the VM needs to start.
    pub fn open(
        script: Script,
        parsed: ParsedSource,
        limits: Limits,
        started: Instant,
    ) -> Result<(Session, Start), Box<ScriptResult>> {
        let options = parsed.options.clone();
        let fail = |e: ScriptError| {
            let mut r = ScriptResult::failed(e, options.clone(), limits.clone());
            r.wall_ms = started.elapsed().as_secs_f64() * 1000.0;
            Box::new(r)
        };
        if script.abort.is_cancelled() {
            return Err(fail(ScriptError::new(
                ErrorKind::Aborted,
                "Execution aborted before the script started",
            )));
        }
        // A worker took the script only after its timeout passed in the queue.
        let waited = script.clock.running();
        if waited >= Duration::from_millis(limits.timeout_ms) {
            return Err(fail(never_started(&script.clock, limits.timeout_ms)));
        }
        check_tools(&script.tools).map_err(|e| fail(sandbox_err(e)))?;
        check_globals(&script.globals).map_err(|e| fail(sandbox_err(e)))?;
        let sha = hex::encode(Sha256::digest(script.source.as_bytes()));
        let replay = match &script.replay {
            Some(p) => {
                let log = ReplayLog::read(p).map_err(|e| fail(sandbox_err(e)))?;
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
            Some(log) => Some(Determinism {
                seed: log.seed,
                start_ms: log.start_ms,
            }),
            None => script.determinism,
        };
        if let Some(d) = &determinism
            && !(d.start_ms.is_finite() && d.start_ms >= 0.0)
        {
            return Err(fail(sandbox_err(
                "determinism.start_ms must be a finite, non-negative number of milliseconds since the epoch.",
            )));
        }
        let recorder = match &script.record {
            Some(p) => {
                let Some(d) = determinism else {
                    return Err(fail(sandbox_err(
                        "Recording needs a deterministic run: set `determinism` (seed and start time).",
                    )));
                };
                let mut r = Recorder::create(p).map_err(|e| fail(sandbox_err(e)))?;
                r.write(&LogEntry::Header {
                    script_sha256: sha.clone(),
                    seed: d.seed,
                    start_ms: d.start_ms,
                });
                Some(r)
            }
            None => None,
        };
        let start = Start {
            limits: VmLimits {
                heap_bytes: limits.heap_bytes as u64,
                stack_bytes: limits.stack_bytes as u64,
                cpu_ms: limits.cpu_ms,
                max_output_chars: limits.max_output_chars as u64,
                max_output_items: limits.max_output_items as u64,
                max_calls: limits.max_calls,
                max_calls_in_flight: limits.max_calls_in_flight as u64,
            },
            config: build_config(&script, &limits, determinism.as_ref()),
            code: parsed.code,
            notify_idle: replay.is_some(),
            in_place: determinism.is_none(),
        };
        let mut names: HashSet<String> = script.tools.iter().map(|t| t.name.clone()).collect();
        names.extend(script.globals.iter().cloned());
        let (tx, rx) = unbounded_channel();
        let held = HeldAnswers::new(limits.heap_bytes);
        let session = Session {
            on_output: script.on_output,
            host: script.host,
            clock: script.clock,
            abort: script.abort,
            limits,
            options,
            started,
            names,
            last_id: 0,
            inflight: BTreeMap::new(),
            inflight_values: 0,
            inflight_bytes: 0,
            calls: Vec::new(),
            output: Vec::new(),
            output_bytes: 0,
            ready: VecDeque::new(),
            tx,
            rx,
            recorder,
            replay,
            det: determinism.map(|d| Det {
                start_ms: d.start_ms,
                began: Instant::now(),
                buffered: BTreeMap::new(),
            }),
            fatal: None,
            spawned: 0,
            held,
        };
        Ok((session, start))
    }

    /// Wall time left before the deadline, by the script's pausable clock.
    pub fn remaining(&self) -> Duration {
        Duration::from_millis(self.limits.timeout_ms).saturating_sub(self.clock.running())
    }

    pub fn set_fatal(&mut self, message: String) {
        if self.fatal.is_none() {
            self.fatal = Some(sandbox_err(message));
        }
    }

    /// A call the VM made. The VM checked the limits already; here they are enforced again,
    /// because in process isolation the VM may be compromised.
    pub fn on_call(
        &mut self,
        id: u64,
        kind: HostCallKind,
        name: &str,
        args_json: &str,
    ) -> Result<(), Violation> {
        if id != self.last_id + 1 {
            return Err(Violation(format!(
                "call ids must count up from 1, but call {id} followed call {}",
                self.last_id
            )));
        }
        if id > self.limits.max_calls {
            return Err(Violation(format!("call {id} is past the call limit")));
        }
        if self.inflight.len() >= self.limits.max_calls_in_flight {
            return Err(Violation(
                "more calls in flight than the limit allows".into(),
            ));
        }
        if !self.names.contains(name) {
            return Err(Violation(format!(
                "the script called {:?}, which it was not given",
                preview(name, 100)
            )));
        }
        self.last_id = id;
        let token = self.abort.child_token();
        let record = if kind == HostCallKind::Tool {
            self.calls.push(CallRecord {
                id,
                name: name.to_string(),
                kind,
                args: preview(args_json, 200),
                status: CallStatus::Cancelled,
                duration_ms: 0.0,
                error: None,
                awaited: true,
            });
            Some(self.calls.len() - 1)
        } else {
            None
        };
        let values = count_values(args_json, MAX_DECODED_VALUES);
        // What the host would hold for calls in flight together, this one decoded too.
        let held = self.inflight_values.saturating_add(values);
        let bytes = args_json.len();
        let held_bytes = self.inflight_bytes.saturating_add(bytes);
        let admitted = values <= MAX_DECODED_VALUES
            && held <= MAX_INFLIGHT_VALUES
            && held_bytes <= MAX_INFLIGHT_BYTES;
        self.inflight.insert(
            id,
            InFlight {
                started: Instant::now(),
                token: token.clone(),
                record,
                values: if admitted { values } else { 0 },
                bytes: if admitted { bytes } else { 0 },
                _active: self.clock.call_active(),
            },
        );
        if !admitted {
            let message = if bytes > MAX_INFLIGHT_BYTES {
                format!(
                    "The arguments of {name} are {bytes} bytes of JSON, more than the {MAX_INFLIGHT_BYTES} the host keeps for a script's calls. Pass less at once (a file's path rather than its content, say)."
                )
            } else if held_bytes > MAX_INFLIGHT_BYTES {
                format!(
                    "The arguments of the calls running at once would be more than {MAX_INFLIGHT_BYTES} bytes of JSON together, more than the host keeps. Await some of them before starting more, or pass less at once."
                )
            } else if values > MAX_DECODED_VALUES {
                format!(
                    "The arguments of {name} hold more than {MAX_DECODED_VALUES} JSON values, more than the host reads. Pass less at once, or large data as one string."
                )
            } else {
                format!(
                    "The arguments of the calls running at once would hold more than {MAX_INFLIGHT_VALUES} JSON values together, more than the host keeps. Await some of them before starting more, or pass less at once."
                )
            };
            let mut err = HostError::new(message);
            err.name = Some("RangeError".into());
            self.refuse_call(id, kind, name, token, err);
            return Ok(());
        }
        self.inflight_values = held;
        self.inflight_bytes = held_bytes;
        let args = match parse_vm_json(args_json) {
            Ok(v) => v,
            Err(e) => {
                let message = if too_deep(&e) {
                    format!(
                        "The arguments of {name} are nested more than 127 levels deep, which the host cannot read. Pass flatter data (for example a JSON string of the deep part)."
                    )
                } else {
                    format!("The arguments of {name} are not valid JSON ({e}).")
                };
                let mut err = HostError::new(message);
                err.name = Some("TypeError".into());
                self.refuse_call(id, kind, name, token, err);
                return Ok(());
            }
        };
        if let Some(rec) = self.recorder.as_mut() {
            rec.call(id, name, kind, &args);
        }
        if let Some(log) = &self.replay {
            if let Err(message) = log.check_call(id, name, kind, &args) {
                self.set_fatal(message);
            }
            return Ok(());
        }
        let call = HostCall {
            id,
            name: name.to_string(),
            kind,
            args,
            cancel: token,
            clock: self.clock.clone(),
            room: AnswerRoom(self.held.clone()),
        };
        let host = self.host.clone();
        let Ok(fut) = std::panic::catch_unwind(AssertUnwindSafe(|| host.call_json(call))) else {
            self.fail_call(
                id,
                HostError::new("The host failed while starting this call."),
            );
            return Ok(());
        };
        self.launch(id, fut);
        Ok(())
    }

    /// Fails a call whose arguments the host does not read, and lets the host record that
    /// (every refusal is on record, not only the gate's). A replay calls no host.
    fn refuse_call(
        &mut self,
        id: u64,
        kind: HostCallKind,
        name: &str,
        cancel: CancellationToken,
        err: HostError,
    ) {
        if self.replay.is_some() {
            self.fail_call(id, err);
            return;
        }
        let call = HostCall {
            id,
            name: name.to_string(),
            kind,
            args: Value::Null,
            cancel,
            clock: self.clock.clone(),
            room: AnswerRoom(self.held.clone()),
        };
        let host = self.host.clone();
        let told = err.clone();
        let Ok(recorded) = std::panic::catch_unwind(AssertUnwindSafe(|| host.refused(call, told)))
        else {
            self.fail_call(id, err);
            return;
        };
        self.launch(id, Box::pin(recorded.map(move |()| Err(err))));
    }

    /// Runs a host future for call `id` and hands its answer to the script.
    fn launch(
        &mut self,
        id: u64,
        mut fut: futures::future::LocalBoxFuture<'static, Result<String, HostError>>,
    ) {
        // Most host answers are immediate; polling once here saves a task and a wake-up per call.
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(&mut cx))) {
            Ok(std::task::Poll::Ready(r)) => {
                let r = self.held.admit(r);
                self.complete(id, r);
                return;
            }
            Ok(std::task::Poll::Pending) => {}
            Err(_) => {
                self.fail_call(
                    id,
                    HostError::new("The host failed while running this call."),
                );
                return;
            }
        }
        let tx = self.tx.clone();
        let held = self.held.clone();
        self.spawned += 1;
        tokio::task::spawn_local(async move {
            let result = match AssertUnwindSafe(fut).catch_unwind().await {
                Ok(r) => r,
                Err(_) => Err(HostError::new("The host failed while running this call.")),
            };
            // Counted (or dropped) as it arrives: completions may wait in the channel too.
            let _ = tx.send((id, held.admit(result)));
        });
    }

    /// Output from the VM, capped here too.
    pub fn on_output(&mut self, item: OutputItem) -> Result<(), Violation> {
        let bytes = match &item {
            OutputItem::Text { text, .. } => text.len(),
            OutputItem::Image { data, mime_type } => data.len() + mime_type.len(),
        };
        self.output_bytes = self.output_bytes.saturating_add(bytes);
        if self.output.len() >= self.limits.max_output_items
            || self.output_bytes > self.limits.max_output_chars.saturating_mul(BYTES_PER_CHAR)
        {
            return Err(Violation("more output than the output limits allow".into()));
        }
        if let Some(tap) = &self.on_output {
            tap.tell(&item);
        }
        self.output.push(item);
        Ok(())
    }

    /// The largest frame a worker may send for this script.
    pub fn max_message(&self) -> usize {
        self.limits
            .max_output_chars
            .saturating_mul(BYTES_PER_CHAR)
            .saturating_add(1 << 20)
            .max(64 << 20)
    }

    /// Call `id` fails before the host answered: its error is counted as an answer that arrived.
    fn fail_call(&mut self, id: u64, err: HostError) {
        let r = self.held.admit(Err(err));
        self.complete(id, r);
    }

    /// A host future finished, its answer counted by `held`.
    pub fn complete(&mut self, id: u64, r: Result<String, HostError>) {
        // After an abort, calls end because their tokens were cancelled: they count as
        // cancelled, not as failed, and the script gets no more results.
        if !self.inflight.contains_key(&id) || self.abort.is_cancelled() {
            self.held.release(&r);
            return;
        }
        let Some(det) = self.det.as_mut() else {
            self.push_ready(id, r, None);
            return;
        };
        det.buffered.insert(id, r);
        // Deliver in call order: only the oldest call in flight may go next.
        loop {
            let Some(first) = self.inflight.keys().next().copied() else {
                return;
            };
            let Some(det) = self.det.as_mut() else { return };
            let Some(r) = det.buffered.remove(&first) else {
                return;
            };
            let at_ms = det.start_ms + det.began.elapsed().as_millis() as f64;
            self.push_ready(first, r, Some(at_ms));
        }
    }

    /// Results of host futures that finished on other tasks.
    pub fn pull_completions(&mut self) -> bool {
        let mut any = false;
        while let Ok((id, r)) = self.rx.try_recv() {
            self.spawned = self.spawned.saturating_sub(1);
            self.complete(id, r);
            any = true;
        }
        any
    }

    /// Whether host futures are running on this thread: then the thread must wait in tokio, which
    /// drives them, rather than block.
    pub fn host_futures_running(&self) -> bool {
        self.spawned > 0
    }

    /// Waits for the next host future to finish.
    pub async fn next_completion(&mut self) {
        if let Some((id, r)) = self.rx.recv().await {
            self.spawned = self.spawned.saturating_sub(1);
            self.complete(id, r);
        }
    }

    pub fn has_completions(&self) -> bool {
        !self.rx.is_empty()
    }

    /// Records a result and queues it for the VM.
    fn push_ready(&mut self, id: u64, r: Result<String, HostError>, at_ms: Option<f64>) {
        let Some(inflight) = self.inflight.remove(&id) else {
            self.held.release(&r);
            return;
        };
        self.inflight_values = self.inflight_values.saturating_sub(inflight.values);
        self.inflight_bytes = self.inflight_bytes.saturating_sub(inflight.bytes);
        if let Some(rec) = inflight.record.and_then(|i| self.calls.get_mut(i)) {
            rec.duration_ms = inflight.started.elapsed().as_secs_f64() * 1000.0;
            match &r {
                Ok(_) => rec.status = CallStatus::Ok,
                Err(e) => {
                    rec.status = CallStatus::Error;
                    rec.error = Some(preview(&e.message, 500));
                }
            }
        }
        if let Some(rec) = self.recorder.as_mut() {
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
        self.ready.push_back(Delivery {
            id,
            result: r,
            at_ms,
        });
    }

    /// The result of call `id` if the host answered it at once and successfully, taken out of
    /// the queue for the VM to use in the middle of its turn. Not in deterministic runs: there
    /// results keep call order, carry the virtual time, and are recorded or replayed turn by turn.
    pub fn take_immediate(&mut self, id: u64) -> Option<String> {
        if self.det.is_some() || self.replay.is_some() {
            return None;
        }
        match self.ready.back() {
            Some(d) if d.id == id && d.at_ms.is_none() && d.result.is_ok() => {}
            _ => return None,
        }
        let d = self.ready.pop_back()?;
        self.held.release(&d.result);
        d.result.ok()
    }

    /// Whether call `id` is still waiting for its result (it was not answered at once).
    pub fn in_flight(&self, id: u64) -> bool {
        self.inflight.contains_key(&id)
    }

    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    pub fn take_ready(&mut self) -> Option<Delivery> {
        let d = self.ready.pop_front()?;
        self.held.release(&d.result);
        Some(d)
    }

    /// The VM waits and nothing is ready. In replay, the next logged result is the next thing
    /// that happens; a result for a call the VM has not made means the script went another way.
    pub fn on_idle(&mut self) {
        if self.ready.is_empty()
            && self.fatal.is_none()
            && let Some(log) = self.replay.as_mut()
        {
            match log.results.pop_front() {
                Some((id, at_ms, r)) if self.inflight.contains_key(&id) => {
                    let r = r.map(|v| v.to_string());
                    // The recorded run got this answer: replay delivers it whatever its size.
                    self.held.count(&r);
                    self.push_ready(id, r, Some(at_ms));
                }
                Some((id, _, _)) => self.set_fatal(format!(
                    "Replay diverged: the log delivers the result of call {id}, but the script is not waiting for call {id}."
                )),
                None => self.set_fatal(
                    "Replay diverged: the script is waiting for a call result that the log does not have.".into(),
                ),
            }
        }
    }

    /// What the host must do now, if anything: stop for the deadline, an abort or a fatal error.
    pub fn due_stop(&self) -> Option<Stop> {
        if self.fatal.is_some() {
            Some(Stop::Fatal)
        } else if self.abort.is_cancelled() {
            Some(Stop::Aborted)
        } else if self.clock.running() >= Duration::from_millis(self.limits.timeout_ms) {
            Some(Stop::Timeout)
        } else {
            None
        }
    }

    fn base_result(&mut self) -> ScriptResult {
        // Cancel calls that are still out: the script no longer waits for them.
        self.inflight_values = 0;
        self.inflight_bytes = 0;
        for f in std::mem::take(&mut self.inflight).into_values() {
            f.token.cancel();
            if let Some(rec) = f.record.and_then(|i| self.calls.get_mut(i)) {
                rec.status = CallStatus::Cancelled;
                rec.awaited = false;
                rec.duration_ms = f.started.elapsed().as_secs_f64() * 1000.0;
            }
        }
        ScriptResult {
            ok: false,
            value: None,
            output: std::mem::take(&mut self.output),
            calls: std::mem::take(&mut self.calls),
            store_writes: Vec::new(),
            error: None,
            wall_ms: 0.0,
            options: self.options.clone(),
            limits: self.limits.clone(),
        }
    }

    fn seal(&mut self, mut res: ScriptResult) -> ScriptResult {
        if let Some(e) = self.recorder.as_mut().and_then(|r| r.finish()) {
            res.ok = false;
            res.error = Some(sandbox_err(format!("Writing the record log failed: {e}")));
        }
        if !res.ok {
            res.store_writes.clear();
            res.value = None;
        }
        res.wall_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        res
    }

    /// The run ended without a report from the VM: it crashed, was killed, or broke the bridge.
    pub fn fail(&mut self, error: ScriptError) -> ScriptResult {
        let mut res = self.base_result();
        res.error = Some(error);
        self.seal(res)
    }

    /// The error a stop from outside the VM stands for.
    pub fn stop_error(&self, stop: Stop) -> ScriptError {
        match stop {
            Stop::Timeout => ScriptError::new(
                ErrorKind::Timeout,
                format!("Execution timed out after {} ms", self.limits.timeout_ms),
            ),
            Stop::Cpu => ScriptError::new(
                ErrorKind::Timeout,
                format!(
                    "Execution used up its CPU budget of {} ms without finishing",
                    self.limits.cpu_ms
                ),
            ),
            Stop::Aborted => ScriptError::new(ErrorKind::Aborted, "Execution aborted"),
            Stop::Fatal | Stop::Finished => self
                .fatal
                .clone()
                .unwrap_or_else(|| sandbox_err("The sandbox stopped the script.")),
        }
    }

    /// Turns the VM's report into the result.
    pub fn finish(&mut self, fin: Finish) -> ScriptResult {
        let mut res = self.base_result();
        let limits = self.limits.clone();
        let oom = fin.oom;
        let error = match fin.end {
            _ if self.fatal.is_some() => self.fatal.clone(),
            None | Some(End::Fatal) => Some(sandbox_err(
                fin.fatal
                    .clone()
                    .unwrap_or_else(|| "The sandbox stopped the script.".into()),
            )),
            Some(End::Timeout) => Some(self.stop_error(Stop::Timeout)),
            Some(End::Cpu) => Some(self.stop_error(Stop::Cpu)),
            Some(End::Aborted) => Some(self.stop_error(Stop::Aborted)),
            Some(End::Stalled) if oom => Some(oom_error(&limits)),
            Some(End::Stalled) => Some(ScriptError {
                kind: ErrorKind::Script,
                name: Some("Error".into()),
                message: "The script is waiting on a promise that nothing can settle: no tool call is pending, and there are no timers here.".into(),
                stack: None,
            }),
            Some(End::Reported) if fin.oom_compiling => Some(ScriptError {
                kind: ErrorKind::Script,
                name: Some("InternalError".into()),
                message: format!(
                    "out of memory while compiling the script: its source needs more than the heap limit of {} bytes. Send a shorter script, and load large data with a tool instead of writing it into the source.",
                    limits.heap_bytes
                ),
                stack: None,
            }),
            Some(End::Reported) => None,
        };
        if let Some(e) = error {
            res.error = Some(e);
            return self.seal(res);
        }
        if fin.ok {
            res.ok = true;
            if let Some(v) = &fin.value
                && more_values_than(v, MAX_DECODED_VALUES)
            {
                res.ok = false;
                res.error = Some(ScriptError {
                    kind: ErrorKind::Script,
                    name: Some("RangeError".into()),
                    message: format!(
                        "The returned value holds more than {MAX_DECODED_VALUES} JSON values, more than the host reads. Return a summary, or JSON.stringify(value) and return the string."
                    ),
                    stack: None,
                });
                return self.seal(res);
            }
            if let Some(v) = &fin.value {
                match parse_vm_json(v) {
                    Ok(value) => res.value = Some(value),
                    Err(e) => {
                        res.ok = false;
                        res.error = Some(if too_deep(&e) {
                            ScriptError {
                                kind: ErrorKind::Script,
                                name: Some("RangeError".into()),
                                message: "The returned value is nested more than 127 levels deep, which the host cannot read. Return flatter data, or JSON.stringify(value) and return the string.".into(),
                                stack: None,
                            }
                        } else {
                            sandbox_err(format!("The returned value could not be read ({e})."))
                        });
                    }
                }
            }
            if res.ok {
                match decode_writes(fin.writes.as_deref()) {
                    Ok(w) => res.store_writes = w,
                    Err(e) => {
                        res.ok = false;
                        res.error = Some(e);
                    }
                }
            }
        } else {
            let desc: Option<ErrorDesc> = fin
                .desc
                .as_deref()
                .and_then(|d| serde_json::from_str(d).ok());
            res.error = Some(match desc {
                None if oom => oom_error(&limits),
                None => sandbox_err("The script failed, and its error could not be described."),
                Some(d)
                    if oom
                        && (d.is_null
                            || (d.name.as_deref() == Some("InternalError")
                                && d.message.contains("out of memory"))) =>
                {
                    oom_error(&limits)
                }
                Some(d) => ScriptError {
                    kind: ErrorKind::Script,
                    name: d.name,
                    message: d.message,
                    stack: d.stack,
                },
            });
        }
        self.seal(res)
    }
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

fn decode_writes(writes: Option<&str>) -> Result<Vec<StoreWrite>, ScriptError> {
    let Some(w) = writes else {
        return Ok(Vec::new());
    };
    // The writes and every value in them count against one bound. The VM sends the last write
    // of each key only, within the store's limits; this holds for a worker that did not.
    let too_many = || ScriptError {
        kind: ErrorKind::Script,
        name: Some("RangeError".into()),
        message: format!(
            "The script's store() writes hold more than {MAX_DECODED_VALUES} JSON values together, more than the host reads. Store fewer keys and smaller values, and keep big data elsewhere."
        ),
        stack: None,
    };
    let mut left = MAX_DECODED_VALUES
        .checked_sub(count_values(w, MAX_DECODED_VALUES))
        .ok_or_else(too_many)?;
    // Through `parse_vm_json`: a lone surrogate in a key is replaced as in a value.
    let raw: Vec<Vec<String>> = parse_vm_json(w)
        .and_then(serde_json::from_value)
        .map_err(|e| sandbox_err(format!("The store writes could not be read ({e}).")))?;
    let mut out = Vec::with_capacity(raw.len());
    for entry in raw {
        let mut it = entry.into_iter();
        let Some(key) = it.next() else { continue };
        match it.next() {
            Some(json) => {
                left = left
                    .checked_sub(count_values(&json, left))
                    .ok_or_else(too_many)?;
                let value = parse_vm_json(&json).map_err(|e| {
                    if too_deep(&e) {
                        ScriptError {
                            kind: ErrorKind::Script,
                            name: Some("RangeError".into()),
                            message: format!("The value stored under {key:?} is nested more than 127 levels deep, which the host cannot keep. Store flatter data, or a JSON string of it."),
                            stack: None,
                        }
                    } else {
                        sandbox_err(format!("The value stored under {key:?} could not be read ({e})."))
                    }
                })?;
                out.push(StoreWrite::Set { key, value });
            }
            None => out.push(StoreWrite::Delete { key, delete: true }),
        }
    }
    Ok(out)
}

/// A fresh seed for a script's `Math.random` (not for secrets: `Math.random` is no CSPRNG).
fn random_seed() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.finish() as u32
}

fn build_config(script: &Script, limits: &Limits, det: Option<&Determinism>) -> String {
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
        "rng": random_seed(),
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::more_values_than;

    #[test]
    fn values_are_counted_outside_strings_only() {
        assert!(!more_values_than("0", 1));
        assert!(more_values_than("[0]", 1));
        assert!(!more_values_than("[0,1]", 3));
        assert!(more_values_than("[0,1,2]", 3));
        assert!(more_values_than(r#"{"a":[],"b":{}}"#, 4));
        // Commas, brackets and escaped quotes inside a string are text, not values.
        assert!(!more_values_than(r#"["a,b,[{c\",d"]"#, 2));
        // An escaped backslash does not escape the quote after it.
        assert!(more_values_than(r#"["\\",[1]]"#, 3));
    }
}
