//! Pool threads, each with a current-thread tokio runtime, and what each holds ready: a prepared
//! VM (thread isolation) or a worker process with a prepared VM (process isolation).
//!
//! QuickJS runtimes are `!Send`, so each VM is created on the thread or in the process that runs
//! it, ahead of the script that will use it. An idle pool thread takes the next script; without
//! one, a new one is started up to `max_concurrent`; past that, scripts wait in a queue. The host
//! side of every script (its session with the `Host`) runs on the pool thread in both modes.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::future::LocalBoxFuture;
use tokio::sync::oneshot;

use crate::engine::{Link, Waited};
use crate::host::{HostCallKind, Script};
use crate::limits::Limits;
use crate::process::host::{Ended, Spawner, WorkerProcess};
use crate::protocol::Delivery;
use crate::result::{ErrorKind, OutputItem, ScriptError, ScriptResult};
use crate::session::Session;
use crate::source::ParsedSource;
use crate::vm::{ActiveLimits, Vm, Wall};

/// Most workers preparing a VM at once before a new script waits for one instead of starting
/// another worker.
const MAX_PREPARING: usize = 8;

/// Workers above the warm count exit after this long without work.
const IDLE_EXIT: Duration = Duration::from_secs(30);

pub(crate) struct Job {
    /// Tells this job apart in the queue, for [`Pool::withdraw`].
    pub id: u64,
    pub script: Script,
    pub parsed: ParsedSource,
    pub limits: Limits,
    pub started: Instant,
    pub reply: oneshot::Sender<ScriptResult>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    idle: usize,
    /// The wake-up of each waiting thread, the most recently idle last. A script goes to the
    /// thread that finished last: its VM and worker are warm in the caches, and the others
    /// keep their memory small.
    waiting: Vec<Arc<Condvar>>,
    /// Workers preparing a VM; they will be idle shortly.
    preparing: usize,
    threads: usize,
    shutdown: bool,
}

/// What the pool's threads run scripts on.
pub(crate) enum Kind {
    /// The bytes of address space each VM's arena reserves.
    Thread(usize),
    Process(ProcessSettings),
}

pub(crate) struct ProcessSettings {
    pub spawner: Spawner,
    pub max_scripts: u32,
    pub grace: Duration,
    /// Workers started before any pool thread (the one `Sandbox::new` checks), for threads to adopt.
    pub spare: Mutex<Vec<WorkerProcess>>,
    /// Process ids of the live workers, for tests that kill one from outside.
    pub live: Mutex<Vec<i32>>,
}

impl ProcessSettings {
    fn adopt_or_spawn(&self) -> Result<WorkerProcess, String> {
        let spare = self.spare.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let w = match spare {
            Some(w) => w,
            None => self.spawner.spawn()?,
        };
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(w.pid());
        Ok(w)
    }
    fn retire(&self, w: WorkerProcess) {
        let pid = w.pid();
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|p| *p != pid);
        drop(w);
    }
}

pub(crate) struct Pool {
    state: Mutex<State>,
    warm: usize,
    max: usize,
    thread_stack: usize,
    pub kind: Kind,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    pub fn new(warm: usize, max: usize, max_stack_bytes: usize, kind: Kind) -> Arc<Pool> {
        let thread_stack = match kind {
            // QuickJS's stack limit must fit well inside the thread's own stack.
            Kind::Thread(_) => max_stack_bytes.saturating_mul(2).max(1 << 20) + (2 << 20),
            // Only host futures run here.
            Kind::Process(_) => 4 << 20,
        };
        let pool = Arc::new(Pool {
            state: Mutex::new(State::default()),
            warm,
            max: max.max(1),
            thread_stack,
            kind,
        });
        for _ in 0..warm.min(pool.max) {
            let mut s = lock(&pool.state);
            if !Pool::spawn(&pool, &mut s) {
                break;
            }
        }
        pool
    }

    fn spawn(pool: &Arc<Pool>, s: &mut State) -> bool {
        let p = pool.clone();
        let spawned = std::thread::Builder::new()
            .name("codemode-js".into())
            .stack_size(pool.thread_stack)
            .spawn(move || match p.kind {
                Kind::Thread(_) => thread_worker(p),
                Kind::Process(_) => process_worker(p),
            })
            .is_ok();
        if spawned {
            s.threads += 1;
            s.preparing += 1;
        }
        spawned
    }

    pub fn submit(pool: &Arc<Pool>, job: Job) -> Result<(), Box<Job>> {
        let mut s = lock(&pool.state);
        if s.shutdown {
            return Err(Box::new(job));
        }
        s.queue.push_back(job);
        // Start another worker only for scripts that no idle or preparing worker will take: a
        // worker is ready again within about 0.1 ms of its last script (its VM is
        // reset, not rebuilt), while a new one costs a process start and a VM preparation. The
        // cap keeps a burst from starting a thread per script.
        if s.idle + s.preparing < s.queue.len()
            && s.preparing < MAX_PREPARING
            && s.threads < pool.max
            && !Pool::spawn(pool, &mut s)
            && s.threads == 0
        {
            let job = s.queue.pop_back();
            drop(s);
            return match job {
                Some(j) => Err(Box::new(j)),
                None => Ok(()),
            };
        }
        if let Some(next) = s.waiting.pop() {
            next.notify_one();
        }
        drop(s);
        Ok(())
    }

    /// Starts workers for queued scripts that no idle or preparing worker will take, as far
    /// as the caps allow. `submit` starts one per script; this catches up once a preparing
    /// worker is ready, since scripts of a burst that arrived while `MAX_PREPARING` workers
    /// were preparing started none, and would wait for a worker to finish a script, which
    /// one held by a long call or a paused approval may not do for an hour.
    fn grow(pool: &Arc<Pool>, s: &mut State) {
        while !s.shutdown
            && s.idle + s.preparing < s.queue.len()
            && s.preparing < MAX_PREPARING
            && s.threads < pool.max
        {
            if !Pool::spawn(pool, s) {
                return;
            }
        }
    }

    /// Takes back the queued job `id`, if no worker has taken it yet.
    pub fn withdraw(&self, id: u64) -> Option<Job> {
        let mut s = lock(&self.state);
        let at = s.queue.iter().position(|j| j.id == id)?;
        s.queue.remove(at)
    }

    pub fn shutdown(&self) {
        let mut s = lock(&self.state);
        s.shutdown = true;
        for w in s.waiting.drain(..) {
            w.notify_one();
        }
    }

    /// A thread about to hand back a result: it counts as preparing until it waits again, and
    /// it goes on top of the waiting stack now, so that a script submitted as soon as the
    /// result arrives comes back to it (it finds the script in the queue when it looks).
    fn finishing(&self, wake: &Arc<Condvar>) {
        let mut s = lock(&self.state);
        s.preparing += 1;
        s.waiting.retain(|w| !Arc::ptr_eq(w, wake));
        s.waiting.push(wake.clone());
    }

    /// Waits for the next job; `None` when this worker should exit.
    fn next_job(self: &Arc<Self>, wake: &Arc<Condvar>) -> Option<Job> {
        let mut s = lock(&self.state);
        s.preparing = s.preparing.saturating_sub(1);
        s.idle += 1;
        Pool::grow(self, &mut s);
        let mut since = Instant::now();
        loop {
            if let Some(job) = s.queue.pop_front() {
                s.idle -= 1;
                s.waiting.retain(|w| !Arc::ptr_eq(w, wake));
                return Some(job);
            }
            if s.shutdown || (s.threads > self.warm && since.elapsed() >= IDLE_EXIT) {
                s.idle -= 1;
                s.threads -= 1;
                s.waiting.retain(|w| !Arc::ptr_eq(w, wake));
                return None;
            }
            if s.waiting.last().is_none_or(|w| !Arc::ptr_eq(w, wake))
                && !s.waiting.iter().any(|w| Arc::ptr_eq(w, wake))
            {
                s.waiting.push(wake.clone());
            }
            let (next, timeout) = wake
                .wait_timeout(s, IDLE_EXIT)
                .unwrap_or_else(|e| e.into_inner());
            s = next;
            if !timeout.timed_out() {
                since = Instant::now();
            }
        }
    }
}

fn runtime(pool: &Pool) -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            tracing::error!("codemode sandbox worker could not start tokio: {e}");
            let mut s = lock(&pool.state);
            s.threads -= 1;
            s.preparing = s.preparing.saturating_sub(1);
            None
        }
    }
}

fn failed(limits: Limits, message: impl Into<String>) -> ScriptResult {
    ScriptResult::failed(
        ScriptError::new(ErrorKind::Sandbox, message),
        Default::default(),
        limits,
    )
}

/// Thread isolation: the VM, the engine and the session share this thread. The VM is prepared
/// once and reset to its prepared image after each script.
fn thread_worker(pool: Arc<Pool>) {
    let Kind::Thread(arena_bytes) = pool.kind else {
        return;
    };
    let Some(rt) = runtime(&pool) else { return };
    let wake = Arc::new(Condvar::new());
    let mut vm = None;
    loop {
        if vm.is_none() {
            vm = Some(Vm::prepare(arena_bytes));
        }
        let Some(job) = pool.next_job(&wake) else {
            return;
        };
        let Job {
            script,
            parsed,
            limits,
            started,
            reply,
            ..
        } = job;
        let (result, reusable) = match vm.as_ref() {
            Some(Ok(v)) => run_in_thread(&rt, v, script, parsed, limits, started),
            Some(Err(e)) => (failed(limits, e.to_string()), false),
            None => (failed(limits, "no VM"), false),
        };
        pool.finishing(&wake);
        let _ = reply.send(result);
        // Resetting the VM happens after the caller has its result.
        match vm.as_ref() {
            Some(Ok(v)) if reusable => {
                let big = v.heap.peak.get() > crate::vm::TRIM_AFTER_BYTES;
                v.reset();
                if big {
                    crate::vm::trim();
                }
            }
            _ => vm = None,
        }
    }
}

fn run_in_thread(
    rt: &tokio::runtime::Runtime,
    vm: &Vm,
    script: Script,
    parsed: ParsedSource,
    limits: Limits,
    started: Instant,
) -> (ScriptResult, bool) {
    let (session, start) = match Session::open(script, parsed, limits.clone(), started) {
        Ok(x) => x,
        Err(r) => return (*r, true),
    };
    // This thread's CPU time counts on the deadline clock while it stands still for a person:
    // a script computing meanwhile is not waiting for anyone.
    let _metered = crate::cpu_clock::this_thread().map(|meter| session.clock.metered_by(meter));
    let active = ActiveLimits {
        cpu: Duration::from_millis(limits.cpu_ms),
        wall: Some(Wall {
            timeout: Duration::from_millis(limits.timeout_ms),
            clock: session.clock.clone(),
            abort: session.abort.clone(),
        }),
        stop_flag: None,
    };
    let link = Rc::new(ThreadLink {
        session: RefCell::new(session),
    });
    let local = tokio::task::LocalSet::new();
    let l: Rc<dyn Link> = link.clone();
    let fin = std::panic::catch_unwind(AssertUnwindSafe(|| {
        rt.block_on(local.run_until(crate::engine::run(vm, start, l, active)))
    }));
    let reusable = fin.is_ok();
    let result = {
        let mut session = link.session.borrow_mut();
        match fin {
            Ok(fin) => session.finish(fin),
            Err(_) => session.fail(ScriptError::new(
                ErrorKind::Sandbox,
                "The sandbox worker failed while running the script.",
            )),
        }
    };
    let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
        rt.block_on(local.run_until(tokio::task::yield_now()))
    }));
    drop(local);
    (result, reusable)
}

/// The engine's link in thread isolation: straight into the session on the same thread.
struct ThreadLink {
    session: RefCell<Session>,
}

impl Link for ThreadLink {
    fn call(
        &self,
        id: u64,
        kind: HostCallKind,
        name: &str,
        args: &str,
        _first_in_job: bool,
    ) -> Option<String> {
        let mut s = self.session.borrow_mut();
        if let Err(v) = s.on_call(id, kind, name, args) {
            s.set_fatal(format!("The sandbox bridge refused a call: {v}"));
            return None;
        }
        s.take_immediate(id)
    }

    fn output(&self, item: OutputItem) {
        let mut s = self.session.borrow_mut();
        if let Err(v) = s.on_output(item) {
            s.set_fatal(format!("The sandbox bridge refused output: {v}"));
        }
    }

    fn poll_ready(&self, out: &mut Vec<Delivery>) {
        let mut s = self.session.borrow_mut();
        s.pull_completions();
        while let Some(d) = s.take_ready() {
            out.push(d);
        }
    }

    // The session stays borrowed while this waits: nothing else touches it meanwhile. The engine
    // is parked in this very call, and host futures run as separate tasks that only send their
    // results down the session's channel.
    #[allow(clippy::await_holding_refcell_ref)]
    fn wait(&self) -> LocalBoxFuture<'_, Waited> {
        Box::pin(async move {
            let mut s = self.session.borrow_mut();
            loop {
                s.on_idle();
                if s.has_ready() {
                    return Waited::Results;
                }
                if let Some(stop) = s.due_stop() {
                    return Waited::Stop(stop);
                }
                let remaining = s.remaining();
                let abort = s.abort.clone();
                tokio::select! {
                    _ = s.next_completion() => {}
                    _ = tokio::time::sleep(remaining) => {}
                    _ = abort.cancelled() => {}
                }
            }
        })
    }
}

/// Process isolation: the session runs here, the VM in a worker process this thread owns.
fn process_worker(pool: Arc<Pool>) {
    let Kind::Process(settings) = &pool.kind else {
        return;
    };
    let Some(rt) = runtime(&pool) else { return };
    let wake = Arc::new(Condvar::new());
    let mut worker: Option<WorkerProcess> = None;
    let mut spawn_error = String::new();
    loop {
        if worker.is_none() {
            match settings.adopt_or_spawn() {
                Ok(w) => worker = Some(w),
                Err(e) => {
                    tracing::error!("a sandbox worker process could not start: {e}");
                    spawn_error = e;
                }
            }
        }
        let Some(job) = pool.next_job(&wake) else {
            if let Some(w) = worker.take() {
                settings.retire(w);
            }
            return;
        };
        let Job {
            script,
            parsed,
            limits,
            started,
            reply,
            ..
        } = job;
        // A worker that died while this thread waited for work is replaced before it gets a script.
        if worker.as_mut().is_some_and(|w| !w.alive()) {
            if let Some(w) = worker.take() {
                settings.retire(w);
            }
            match settings.adopt_or_spawn() {
                Ok(w) => worker = Some(w),
                Err(e) => spawn_error = e,
            }
        }
        let result = match worker.as_mut() {
            Some(w) => run_on_worker(&rt, w, settings.grace, script, parsed, limits, started),
            None => failed(
                limits,
                format!(
                    "No sandbox worker process could be started: {spawn_error}. Point SandboxConfig::worker_program or ${} at a codemode binary, or choose thread isolation if you accept its risks.",
                    crate::process::host::WORKER_ENV
                ),
            ),
        };
        pool.finishing(&wake);
        let _ = reply.send(result);
        if let Some(w) = worker.take() {
            if w.spent || w.scripts >= settings.max_scripts {
                settings.retire(w);
            } else {
                worker = Some(w);
            }
        }
    }
}

fn run_on_worker(
    rt: &tokio::runtime::Runtime,
    w: &mut WorkerProcess,
    grace: Duration,
    script: Script,
    parsed: ParsedSource,
    limits: Limits,
    started: Instant,
) -> ScriptResult {
    let (mut session, start) = match Session::open(script, parsed, limits.clone(), started) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let local = tokio::task::LocalSet::new();
    let ended = std::panic::catch_unwind(AssertUnwindSafe(|| {
        rt.block_on(local.run_until(w.run(&mut session, &start, grace)))
    }));
    let result = match ended {
        Ok(Ended::Finished(fin)) => session.finish(*fin),
        Ok(Ended::Killed(stop)) => {
            let e = session.stop_error(stop);
            session.fail(e)
        }
        Ok(Ended::Died(how)) => session.fail(ScriptError::new(
            ErrorKind::Sandbox,
            format!(
                "The sandbox crashed while running the script: {how}. Only this script failed; the sandbox replaced its worker."
            ),
        )),
        Ok(Ended::Broken(why)) => session.fail(ScriptError::new(
            ErrorKind::Sandbox,
            format!(
                "The sandbox worker broke the bridge protocol ({why}) and was stopped. Only this script failed."
            ),
        )),
        Err(_) => {
            w.spent = true;
            session.fail(ScriptError::new(
                ErrorKind::Sandbox,
                "The sandbox host failed while running the script.",
            ))
        }
    };
    let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
        rt.block_on(local.run_until(tokio::task::yield_now()))
    }));
    drop(local);
    result
}
