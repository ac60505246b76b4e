//! `codemode-sandbox` runs one untrusted, model-written JavaScript script in native QuickJS.
//!
//! The sandbox knows nothing of what a tool means: a script's only powers are calls into a
//! [`Host`]. The environment matches the reference codemode so its scripts run unchanged:
//! `tools` (frozen, a miss explained by the proxy behind it; identifiers from
//! [`to_identifier`]), `ALL_TOOLS`, `text`, `image`, `console`, `exit`, `store`/`load`, and host
//! globals such as `searchTools` or `models.classify`.
//!
//! Design, and why:
//! * **The VM runs in a sandboxed worker process** ([`Isolation::Process`], the default): seccomp,
//!   Landlock, rlimits, no descriptors or environment; the host keeps the session (every call,
//!   records, logs) and all authority. [`Isolation::Thread`] runs the VM on a host thread instead,
//!   for embedders who accept that native built-ins can outrun its deadline there.
//! * **A fresh VM state per script.** Nothing of one script (globals, prototypes, heap) can reach
//!   the next. A VM is prepared once (runtime, prelude, every reachable built-in frozen) in an
//!   arena holding all its memory; that image is saved and copied back after every script.
//! * **Host calls run on the pool thread of the script.** A host future is polled once when the
//!   call arrives (most answers are immediate) and otherwise spawned on that thread's `LocalSet`;
//!   results go back as JSON text ([`Host::call_json`]) and are parsed straight into the VM. An
//!   immediate answer resolves the script's promise in place, without a turn of the event loop
//!   (not in deterministic runs), and plain-data arguments become JSON natively.
//! * **Limits are enforced from outside the script:** heap (counting allocator), stack, CPU budget
//!   through the interrupt handler; the wall deadline by the pausable
//!   [`codemode_spec::DeadlineClock`] and abort through the host's stop flag, then SIGKILL of the
//!   worker; output and call counts on both sides of the bridge.
//! * **Failures are results, never panics or Rust errors:** [`Sandbox::run`] always yields a
//!   [`ScriptResult`]. Invalid input (see [`parse_source`]) is reported as a script error named
//!   `SourceError`; callers that want the bare message call [`parse_source`] first.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use codemode_sandbox::*;
//! # async fn demo(host: Arc<dyn Host>) -> Result<(), SandboxError> {
//! let sandbox = Sandbox::new(SandboxConfig::default())?;
//! let script = Script::new("return await tools.echo({ hi: 1 })", host).with_tools([("echo", "Echo")]);
//! let result = sandbox.run(script).await;
//! let text = render_model_text(&result, result.limits.max_output_tokens);
//! # Ok(()) }
//! ```

mod arena;
mod cpu_clock;
mod engine;
mod held;
mod host;
mod json_in;
mod json_out;
mod limits;
mod model_text;
mod native;
mod output_budget;
mod pool;
mod process;
mod protocol;
mod replay;
mod result;
mod ring;
mod session;
mod setup;
mod source;
mod vm;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use codemode_spec::to_identifier;
pub use held::{AnswerRoom, AnswerShare};
pub use host::{
    Determinism, Host, HostCall, HostCallKind, HostError, OutputTap, Script, ToolEntry,
};
pub use limits::{Isolation, Limits, SandboxConfig};
pub use model_text::{
    ModelText, escape_script_text, media_refusal, media_shown, media_tokens, render_model_text,
    render_model_text_with_media,
};
pub use process::host::{WORKER_ENV, WorkerProgram};
pub use process::layers::IsolationLayer;
pub use replay::LogEntry;
pub use result::{
    CallRecord, CallStatus, ErrorKind, OutputItem, ScriptError, ScriptResult, StoreWrite,
};
pub use source::{ParsedSource, ScriptOptions, SourceError, parse_source};

use pool::{Job, Kind, Pool, ProcessSettings};

/// Building blocks for test workers that misbehave on purpose. The production worker never uses
/// them to misbehave; tests start their own binary as the worker (`SandboxConfig::worker_program`)
/// and decide there what goes wrong.
#[doc(hidden)]
pub mod testing {
    use crate::process::worker::{self, Prepared};
    use crate::protocol::ToWorker;

    /// The argument before a worker's own arguments.
    pub const MARKER: &str = crate::process::host::MARKER;

    /// A worker set up exactly as the real one: descriptors, session, all isolation layers, hello.
    pub struct TestWorker(Prepared);

    impl TestWorker {
        /// `args` are the arguments after [`MARKER`].
        pub fn prepare(args: &[String]) -> TestWorker {
            TestWorker(worker::prepare(args))
        }

        /// Blocks until the host sends a script.
        pub fn wait_for_start(&mut self) {
            loop {
                let msg = self.0.channel.borrow_mut().try_frame();
                match msg {
                    Some(ToWorker::Start(_)) => return,
                    Some(_) => continue,
                    None => self
                        .0
                        .channel
                        .borrow_mut()
                        .sleep_until(|e, _| e.inp.available() != Ok(0)),
                }
            }
        }

        /// Writes bytes to the bridge as they are, framing and all.
        pub fn send_raw(&mut self, bytes: &[u8]) {
            self.0.channel.borrow_mut().send_raw(bytes);
        }

        /// Sends a well-formed call message.
        pub fn send_call(&mut self, id: u64, name: &str, args: &str) {
            self.0
                .channel
                .borrow_mut()
                .send(&crate::protocol::ToHost::Call {
                    id,
                    kind: crate::HostCallKind::Tool,
                    name: name.into(),
                    args: args.into(),
                    waits: false,
                });
        }
    }
}

/// The configuration cannot work.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("invalid sandbox configuration: {0}")]
    Config(String),
    /// Process isolation was asked for, and no worker process could be started.
    #[error(
        "the sandbox could not start a worker process: {0}. Point SandboxConfig::worker_program or ${WORKER_ENV} at a binary linked with codemode-sandbox (the codemode binary works), or choose thread isolation if you accept its risks"
    )]
    Worker(String),
}

/// Finds the worker executable and starts one worker, so that a sandbox that cannot isolate
/// scripts fails here, clearly, instead of at the first script. Never falls back to threads.
fn process_settings(
    config: &SandboxConfig,
) -> Result<(ProcessSettings, Vec<IsolationLayer>), SandboxError> {
    process::link_entry();
    let program = process::host::resolve_program(config.worker_program.as_ref())
        .map_err(SandboxError::Worker)?;
    let max = &config.maximum;
    let arena = arena_bytes(config) as u64;
    let data_bytes = config
        .worker_memory_bytes
        .unwrap_or(arena.saturating_add(256 << 20));
    let rlimits = process::layers::WorkerRlimits {
        data_bytes,
        // The host stops each script at its own budget; this only ends a worker that escaped it.
        cpu_seconds: (max.cpu_ms / 1000)
            .saturating_add(60)
            .saturating_mul(u64::from(config.worker_max_scripts.max(1))),
        stack_bytes: (max.stack_bytes as u64).saturating_mul(2) + (8 << 20),
    };
    // The arena counts against the data limit even where untouched: leave room for the rest.
    let arena = arena.min(data_bytes.saturating_sub(64 << 20)).max(16 << 20);
    let spawner =
        process::host::Spawner::new(program, rlimits, arena).map_err(SandboxError::Worker)?;
    let first = spawner.spawn().map_err(SandboxError::Worker)?;
    let layers = first.layers.clone();
    for l in layers.iter().filter(|l| !l.active) {
        tracing::warn!(layer = %l.name, "sandbox isolation layer not active: {}", l.detail);
    }
    Ok((
        ProcessSettings {
            spawner,
            max_scripts: config.worker_max_scripts.max(1),
            grace: std::time::Duration::from_millis(config.kill_grace_ms),
            spare: std::sync::Mutex::new(vec![first]),
            live: Default::default(),
        },
        layers,
    ))
}

/// Address space reserved for each VM's arena: the largest heap a script may ask for, plus room
/// for the allocator's rounding and the prepared environment. Only touched pages use memory.
fn arena_bytes(config: &SandboxConfig) -> usize {
    let heap = config.maximum.heap_bytes;
    heap.saturating_add(heap / 4).saturating_add(32 << 20)
}

struct Inner {
    config: SandboxConfig,
    pool: Arc<Pool>,
    layers: Option<Vec<IsolationLayer>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.pool.shutdown();
    }
}

/// Runs scripts on a pool of worker threads. Cheap to clone; all clones share the pool.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    /// Starts `config.warm` workers, each preparing a VM right away.
    pub fn new(config: SandboxConfig) -> Result<Sandbox, SandboxError> {
        if config.max_concurrent == 0 {
            return Err(SandboxError::Config(
                "max_concurrent must be at least 1".into(),
            ));
        }
        let d = config.defaults.clamped_to(&config.maximum);
        if d.heap_bytes < 1024 * 1024 || d.stack_bytes < 64 * 1024 {
            return Err(SandboxError::Config(
                "heap_bytes must be at least 1 MiB and stack_bytes at least 64 KiB".into(),
            ));
        }
        let (kind, layers) = match config.isolation {
            Isolation::Thread => (Kind::Thread(arena_bytes(&config)), None),
            Isolation::Process => {
                let (settings, layers) = process_settings(&config)?;
                (Kind::Process(settings), Some(layers))
            }
        };
        let pool = Pool::new(
            config.warm,
            config.max_concurrent,
            config.maximum.stack_bytes,
            kind,
        );
        Ok(Sandbox {
            inner: Arc::new(Inner {
                config,
                pool,
                layers,
            }),
        })
    }

    /// The isolation layers in force in the worker processes, as the first worker reported them
    /// (`None` under thread isolation).
    pub fn isolation_layers(&self) -> Option<&[IsolationLayer]> {
        self.inner.layers.as_deref()
    }

    /// Process ids of the live worker processes. For tests that stop a worker from outside.
    #[doc(hidden)]
    pub fn worker_pids(&self) -> Vec<i32> {
        match &self.inner.pool.kind {
            Kind::Process(p) => p.live.lock().map(|l| l.clone()).unwrap_or_default(),
            Kind::Thread(_) => Vec::new(),
        }
    }

    pub fn config(&self) -> &SandboxConfig {
        &self.inner.config
    }

    /// Runs one script. Never fails as a future: every failure is a result with `ok: false`.
    /// The future is `Send + 'static`, so any tokio runtime can await it.
    pub fn run(&self, script: Script) -> impl Future<Output = ScriptResult> + Send + 'static {
        let inner = self.inner.clone();
        async move {
            let started = Instant::now();
            let cfg = &inner.config;
            let parsed = match parse_source(&script.source) {
                Ok(p) => p,
                Err(e) => {
                    let mut r = ScriptResult::failed(
                        ScriptError {
                            kind: ErrorKind::Script,
                            name: Some("SourceError".into()),
                            message: e.message,
                            stack: None,
                        },
                        ScriptOptions::default(),
                        cfg.defaults.clamped_to(&cfg.maximum),
                    );
                    r.wall_ms = started.elapsed().as_secs_f64() * 1000.0;
                    return r;
                }
            };
            let limits = Limits::effective(&cfg.defaults, &cfg.maximum, &parsed.options);
            let options = parsed.options.clone();
            let (tx, rx) = tokio::sync::oneshot::channel();
            static NEXT_JOB: AtomicU64 = AtomicU64::new(0);
            let id = NEXT_JOB.fetch_add(1, Ordering::Relaxed);
            let clock = script.clock.clone();
            let job = Job {
                id,
                script,
                parsed,
                limits: limits.clone(),
                started,
                reply: tx,
            };
            let fail = |message: &str| {
                let mut r = ScriptResult::failed(
                    ScriptError::new(ErrorKind::Sandbox, message),
                    options.clone(),
                    limits.clone(),
                );
                r.wall_ms = started.elapsed().as_secs_f64() * 1000.0;
                r
            };
            if Pool::submit(&inner.pool, job).is_err() {
                return fail("No sandbox worker could be started for this script.");
            }
            // The timeout covers the wait for a worker too: a script still queued when it passes
            // is taken back, so a caller behind workers held by long calls or paused approvals
            // gets an answer within its timeout rather than whenever one frees.
            let timeout = Duration::from_millis(limits.timeout_ms);
            let mut rx = rx;
            let queued_until = tokio::time::sleep(timeout.saturating_sub(clock.running()));
            let answer = tokio::select! {
                r = &mut rx => r,
                () = queued_until => match inner.pool.withdraw(id) {
                    Some(_) => {
                        let mut r = ScriptResult::failed(
                            session::never_started(&clock, limits.timeout_ms),
                            options.clone(),
                            limits.clone(),
                        );
                        r.wall_ms = started.elapsed().as_secs_f64() * 1000.0;
                        return r;
                    }
                    None => rx.await,
                },
            };
            match answer {
                Ok(mut r) => {
                    // The host's word on what the script ran with, not the worker's.
                    r.options = options;
                    r.limits = limits;
                    r
                }
                Err(_) => fail("The sandbox worker stopped before the script finished."),
            }
        }
    }
}
