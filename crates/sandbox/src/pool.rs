//! Worker threads, each with a current-thread tokio runtime and one prepared VM.
//!
//! QuickJS runtimes are `!Send`, so each VM is created on the thread that runs it, ahead of the
//! script that will use it. An idle worker takes the next script; without one, a new worker is
//! started up to `max_concurrent`; past that, scripts wait in a queue.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::host::Script;
use crate::limits::Limits;
use crate::result::{ErrorKind, ScriptError, ScriptResult};
use crate::source::ParsedSource;
use crate::vm::Vm;

/// Most workers preparing a VM at once before a new script waits for one instead of starting
/// another worker.
const MAX_PREPARING: usize = 8;

/// Workers above the warm count exit after this long without work.
const IDLE_EXIT: Duration = Duration::from_secs(30);

pub(crate) struct Job {
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
    /// Workers preparing a VM; they will be idle shortly.
    preparing: usize,
    threads: usize,
    shutdown: bool,
}

pub(crate) struct Pool {
    state: Mutex<State>,
    ready: Condvar,
    warm: usize,
    max: usize,
    thread_stack: usize,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    pub fn new(warm: usize, max: usize, max_stack_bytes: usize) -> Arc<Pool> {
        let pool = Arc::new(Pool {
            state: Mutex::new(State::default()),
            ready: Condvar::new(),
            warm,
            max: max.max(1),
            // QuickJS's stack limit must fit well inside the thread's own stack.
            thread_stack: max_stack_bytes.saturating_mul(2).max(1 << 20) + (2 << 20),
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
            .spawn(move || worker(p))
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
        // Without an idle worker, start another even while some are preparing: a VM takes about
        // half a millisecond of CPU to prepare, and a burst of scripts should find VMs ready
        // rather than wait for one. The cap keeps a burst from starting a thread per script.
        if s.idle < s.queue.len()
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
        drop(s);
        pool.ready.notify_one();
        Ok(())
    }

    pub fn shutdown(&self) {
        lock(&self.state).shutdown = true;
        self.ready.notify_all();
    }

    /// Waits for the next job; `None` when this worker should exit.
    fn next_job(&self) -> Option<Job> {
        let mut s = lock(&self.state);
        s.preparing = s.preparing.saturating_sub(1);
        s.idle += 1;
        let mut since = Instant::now();
        loop {
            if let Some(job) = s.queue.pop_front() {
                s.idle -= 1;
                return Some(job);
            }
            if s.shutdown || (s.threads > self.warm && since.elapsed() >= IDLE_EXIT) {
                s.idle -= 1;
                s.threads -= 1;
                return None;
            }
            let (next, timeout) = self
                .ready
                .wait_timeout(s, IDLE_EXIT)
                .unwrap_or_else(|e| e.into_inner());
            s = next;
            if !timeout.timed_out() {
                since = Instant::now();
            }
        }
    }
}

fn worker(pool: Arc<Pool>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("codemode sandbox worker could not start tokio: {e}");
            let mut s = lock(&pool.state);
            s.threads -= 1;
            s.preparing = s.preparing.saturating_sub(1);
            return;
        }
    };
    loop {
        let vm = Vm::prepare();
        let Some(job) = pool.next_job() else { return };
        let Job {
            script,
            parsed,
            limits,
            started,
            reply,
        } = job;
        let (result, used) = match vm {
            Ok(vm) => {
                let local = tokio::task::LocalSet::new();
                let run = crate::driver::run_script(&vm, script, parsed, limits.clone(), started);
                let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    let r = rt.block_on(local.run_until(run));
                    // Let cancelled calls see their token once before their tasks are dropped.
                    rt.block_on(local.run_until(tokio::task::yield_now()));
                    drop(local);
                    r
                }));
                let result = match outcome {
                    Ok(r) => r,
                    Err(_) => ScriptResult::failed(
                        ScriptError::new(
                            ErrorKind::Sandbox,
                            "The sandbox worker failed while running the script.",
                        ),
                        Default::default(),
                        limits,
                    ),
                };
                (result, Some(vm))
            }
            Err(e) => (
                ScriptResult::failed(
                    ScriptError::new(ErrorKind::Sandbox, e.to_string()),
                    Default::default(),
                    limits,
                ),
                None,
            ),
        };
        let _ = reply.send(result);
        lock(&pool.state).preparing += 1;
        // Freeing the VM happens after the caller has its result.
        if let Some(vm) = used {
            crate::driver::discard(vm);
        }
    }
}
