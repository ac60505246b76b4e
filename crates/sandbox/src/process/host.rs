//! The host's handle on one worker process: starting it, running a script through it, and
//! stopping it when it does not stop, crashes or breaks the protocol.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::layers::{IsolationLayer, WorkerRlimits};
use super::nudge::Nudge;
use super::worker::{EXIT_BAD_ARGS, EXIT_PROTOCOL, EXIT_SETUP, WorkerArgs};
use crate::protocol::{
    End as RunEnd, Finish, PROTOCOL_VERSION, Start, ToHost, ToWorker, decode_to_host,
    encode_delivery, encode_to_worker,
};
use crate::ring::{
    FrameReader, ON_FUTEX, ON_SOCKET, Shm, SpinBudget, Yielder, drain_doorbell, ring_doorbell,
};
use crate::session::Session;
use crate::vm::Stop;

/// The argument that turns a binary linked with this crate into a worker.
pub(crate) const MARKER: &str = "--codemode-sandbox-worker";
/// The environment variable naming the worker executable, when the running one cannot be used.
pub const WORKER_ENV: &str = "CODEMODE_SANDBOX_WORKER";

/// The executable a worker process runs, and arguments placed before the worker's own.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkerProgram {
    pub path: PathBuf,
    #[serde(default)]
    pub args: Vec<String>,
}

/// Finds the worker executable: the configured one, then `$CODEMODE_SANDBOX_WORKER`, then the
/// running executable itself (every binary linked with this crate can act as a worker).
pub(crate) fn resolve_program(configured: Option<&WorkerProgram>) -> Result<WorkerProgram, String> {
    let (program, source) = if let Some(p) = configured {
        (p.clone(), "SandboxConfig::worker_program")
    } else if let Some(p) = std::env::var_os(WORKER_ENV).filter(|p| !p.is_empty()) {
        (
            WorkerProgram {
                path: PathBuf::from(p),
                args: Vec::new(),
            },
            WORKER_ENV,
        )
    } else {
        (
            WorkerProgram {
                path: PathBuf::from("/proc/self/exe"),
                args: Vec::new(),
            },
            "the running executable",
        )
    };
    match std::fs::metadata(&program.path) {
        Ok(m) if m.is_file() => Ok(program),
        Ok(_) => Err(format!(
            "the sandbox worker {} (from {source}) is not a file",
            program.path.display()
        )),
        Err(e) => Err(format!(
            "the sandbox worker {} (from {source}) cannot be used: {e}",
            program.path.display()
        )),
    }
}

/// Starts workers from one long-lived thread. A worker asks the kernel to kill it when the
/// thread that started it ends (`PR_SET_PDEATHSIG`), so that thread must live as long as the
/// sandbox: then no worker outlives its host, even when the host is killed.
pub(crate) struct Spawner {
    tx: std::sync::Mutex<
        std::sync::mpsc::Sender<std::sync::mpsc::Sender<Result<WorkerProcess, String>>>,
    >,
}

impl Spawner {
    pub fn new(
        program: WorkerProgram,
        rlimits: WorkerRlimits,
        arena_bytes: u64,
    ) -> Result<Spawner, String> {
        let (tx, rx) =
            std::sync::mpsc::channel::<std::sync::mpsc::Sender<Result<WorkerProcess, String>>>();
        std::thread::Builder::new()
            .name("codemode-spawn".into())
            .spawn(move || {
                for reply in rx {
                    let _ = reply.send(WorkerProcess::spawn(&program, rlimits, arena_bytes));
                }
            })
            .map_err(|e| format!("could not start the worker-spawning thread: {e}"))?;
        Ok(Spawner {
            tx: std::sync::Mutex::new(tx),
        })
    }

    pub fn spawn(&self) -> Result<WorkerProcess, String> {
        let (reply, answer) = std::sync::mpsc::channel();
        self.tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(reply)
            .map_err(|_| "the worker-spawning thread is gone".to_string())?;
        answer
            .recv()
            .map_err(|_| "the worker-spawning thread is gone".to_string())?
    }
}

/// Bytes of answers encoded for the worker ahead of what it has read.
const PENDING_AHEAD: usize = 4 << 20;

/// Longest the host blocks on the futex word before it checks for an abort or a dead worker.
const FUTEX_NAP: Duration = Duration::from_millis(5);

/// How long a new worker may take to put itself under its layers and say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);

/// A running worker process.
pub(crate) struct WorkerProcess {
    child: Child,
    pid: i32,
    shm: Shm,
    bell_std: Option<std::os::unix::net::UnixStream>,
    bell: Option<tokio::net::UnixStream>,
    reader: FrameReader,
    positions: (u64, u64),
    pending_out: Vec<u8>,
    scratch: Vec<u8>,
    pub layers: Vec<IsolationLayer>,
    pub scripts: u32,
    /// Its exit status was collected: its pid may belong to another process now.
    reaped: bool,
    /// The worker hit a limit, was told to stop, or broke something: do not reuse it.
    pub spent: bool,
    spin: SpinBudget,
    yielder: Yielder,
    nudge: Nudge,
}

/// How a script's run on a worker ended.
pub(crate) enum Ended {
    /// The VM reported how it ended.
    Finished(Box<Finish>),
    /// The host stopped the VM for this reason and had to kill the worker to make it stop.
    Killed(Stop),
    /// The worker died on its own; the text says how.
    Died(String),
    /// The worker broke the protocol; the text says how. It has been killed.
    Broken(String),
}

fn io_err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// Describes how a worker process ended, naming the layer that stopped it when it is known.
pub(crate) fn describe_exit(status: Option<ExitStatus>) -> String {
    let Some(status) = status else {
        return "it ended, and its exit status could not be read".into();
    };
    if let Some(sig) = status.signal() {
        return match sig {
            libc::SIGSYS => "the seccomp filter stopped it: it made a system call the sandbox does not allow".into(),
            libc::SIGKILL => "it was killed (by the out-of-memory killer, its CPU-time limit, or another process)".into(),
            libc::SIGXCPU => "its CPU-time limit (RLIMIT_CPU) stopped it".into(),
            libc::SIGSEGV | libc::SIGBUS => "it hit a memory fault (signal SIGSEGV/SIGBUS)".into(),
            libc::SIGABRT => "it aborted (an allocation failed outside the heap limit, or an internal check failed)".into(),
            other => format!("it was stopped by signal {other}"),
        };
    }
    match status.code() {
        Some(EXIT_BAD_ARGS) => "it was started with arguments it does not understand".into(),
        Some(EXIT_SETUP) => {
            "it could not set itself up (its parent or bridge memory was not there)".into()
        }
        Some(EXIT_PROTOCOL) => "it found the bridge broken and exited".into(),
        Some(c) => format!("it exited with code {c}"),
        None => "it ended".into(),
    }
}

impl WorkerProcess {
    /// Starts a worker and waits for its hello.
    pub fn spawn(
        program: &WorkerProgram,
        rlimits: WorkerRlimits,
        arena_bytes: u64,
    ) -> Result<WorkerProcess, String> {
        let (shm, memfd) = Shm::create().map_err(|e| io_err("creating the bridge memory", e))?;
        let (host_bell, worker_bell) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| io_err("creating the bridge doorbell", e))?;
        // The host sleeps until the hello, so the worker rings.
        shm.host_end((0, 0)).going_to_sleep(ON_SOCKET);
        let args = WorkerArgs {
            // SAFETY: getpid has no preconditions.
            host_pid: unsafe { libc::getpid() },
            rlimits,
            arena_bytes,
        };
        let debug = std::env::var_os("CODEMODE_SANDBOX_DEBUG").is_some();
        let mut cmd = Command::new(&program.path);
        cmd.args(&program.args)
            .arg(MARKER)
            .args(args.to_args())
            .env_clear()
            .stdin(Stdio::from(OwnedFd::from(worker_bell)))
            .stdout(Stdio::from(memfd))
            .stderr(if debug {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        let spawned = cmd.spawn();
        // The command holds our copies of the worker's descriptors: closed now, the doorbell
        // reads end-of-file as soon as the worker dies.
        drop(cmd);
        let mut child = spawned.map_err(|e| {
            format!(
                "could not start the sandbox worker {}: {e}",
                program.path.display()
            )
        })?;
        let pid = child.id() as i32;
        let deadline = Instant::now() + HELLO_TIMEOUT;
        let mut reader = FrameReader::new();
        let mut positions = (0, 0);
        let hello = loop {
            let mut end = shm.host_end(positions);
            let frame = reader.next(&mut end.inp, 1 << 20);
            positions = end.positions();
            match frame {
                Ok(Some(payload)) => break decode_to_host(payload).map_err(|e| e.0),
                Ok(None) => {}
                Err(e) => break Err(e.to_string()),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err("it did not say hello in time".into());
            }
            let mut pfd = libc::pollfd {
                fd: host_bell.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: polling one descriptor we own.
            unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(1000) as i32) };
            if let Ok(false) = drain_doorbell(host_bell.as_raw_fd()) {
                let _ = child.kill();
                let status = child.wait().ok();
                break Err(describe_exit(status));
            }
            shm.host_end(positions).going_to_sleep(ON_SOCKET);
        };
        let layers = match hello {
            Ok(ToHost::Hello { version, layers }) if version == PROTOCOL_VERSION => {
                serde_json::from_str(&layers).unwrap_or_default()
            }
            Ok(ToHost::Hello { version, .. }) => {
                kill_group(pid);
                let _ = child.wait();
                return Err(format!(
                    "the sandbox worker {} speaks bridge protocol {version}, this host speaks {PROTOCOL_VERSION}: it is another build of codemode",
                    program.path.display()
                ));
            }
            Ok(_) => Err("its first message was not a hello".to_string())?,
            Err(e) => {
                kill_group(pid);
                let _ = child.wait();
                return Err(format!(
                    "the sandbox worker {} did not start: {e}",
                    program.path.display()
                ));
            }
        };
        shm.host_end(positions).awake();
        host_bell
            .set_nonblocking(true)
            .map_err(|e| io_err("setting up the bridge doorbell", e))?;
        Ok(WorkerProcess {
            child,
            pid,
            shm,
            bell_std: Some(host_bell),
            bell: None,
            reader,
            positions,
            pending_out: Vec::new(),
            scratch: Vec::new(),
            layers,
            scripts: 0,
            reaped: false,
            spent: false,
            spin: SpinBudget::new(),
            yielder: Yielder::new(),
            nudge: Nudge::new(),
        })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// False when the worker died while idle (killed from outside, or by the kernel).
    pub fn alive(&mut self) -> bool {
        !self.reaped && matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the worker and returns how it ended.
    fn kill_and_reap(&mut self) -> Option<ExitStatus> {
        self.spent = true;
        if self.reaped {
            return None;
        }
        kill_group(self.pid);
        self.reaped = true;
        self.child.wait().ok()
    }

    /// Runs one script. The session stays with the host; the worker only runs the VM.
    pub async fn run(&mut self, session: &mut Session, start: &Start, grace: Duration) -> Ended {
        self.scripts += 1;
        let mut frame = Vec::new();
        encode_to_worker(&ToWorker::Start(Box::new(start.clone())), &mut frame);
        self.pending_out.clear();
        self.pending_out.extend_from_slice(&frame);
        let ended = self.drive(session, grace).await;
        match &ended {
            Ended::Finished(f) => {
                if self.spent || f.oom || !matches!(f.end, Some(RunEnd::Reported | RunEnd::Stalled))
                {
                    self.spent = true;
                }
            }
            _ => self.spent = true,
        }
        ended
    }

    async fn drive(&mut self, session: &mut Session, grace: Duration) -> Ended {
        // The doorbell joins the tokio runtime of the thread that runs scripts on this worker.
        if self.bell.is_none()
            && let Some(std_bell) = self.bell_std.take()
        {
            match tokio::net::UnixStream::from_std(std_bell) {
                Ok(b) => self.bell = Some(b),
                Err(e) => {
                    return self.broken(format!("the doorbell could not join the runtime: {e}"));
                }
            }
        }
        let Some(bell_fd) = self.bell.as_ref().map(|b| b.as_raw_fd()) else {
            return self.broken("the doorbell is gone".into());
        };
        let max = session.max_message();
        let cpu_budget = Duration::from_millis(session.limits.cpu_ms);
        let cpu_start = crate::cpu_clock::of_process(self.pid).unwrap_or_default();
        // The worker's CPU time counts on the deadline clock while it stands still for a
        // person: a script computing meanwhile is not waiting for anyone.
        let pid = self.pid;
        let _metered = session.clock.metered_by(std::sync::Arc::new(move || {
            crate::cpu_clock::of_process(pid).unwrap_or_default()
        }));
        let mut next_cpu_check = Instant::now() + cpu_budget;
        let mut stop_sent: Option<Stop> = None;
        let mut kill_at: Option<Instant> = None;
        let mut spin_since: Option<Instant> = None;
        let mut out_at = 0usize;
        loop {
            let mut progress = false;
            let mut end = self.shm.host_end(self.positions);
            // 1. Everything the worker sent. Reading part of a long frame frees room the worker
            // may be waiting for, so it counts as progress too.
            let read_from = end.positions().1;
            loop {
                let payload = match self.reader.next(&mut end.inp, max) {
                    Ok(Some(p)) => p,
                    Ok(None) => break,
                    Err(e) => {
                        self.positions = end.positions();
                        return self.broken(e.to_string());
                    }
                };
                progress = true;
                let msg = match decode_to_host(payload) {
                    Ok(m) => m,
                    Err(e) => {
                        self.positions = end.positions();
                        return self.broken(e.0);
                    }
                };
                let handled = match msg {
                    ToHost::Call {
                        id,
                        kind,
                        name,
                        args,
                        waits,
                    } => {
                        let r = session.on_call(id, kind, &name, &args).map_err(|v| v.0);
                        // The VM waits for this answer: if it was not ready at once, say so
                        // now, so the VM goes on with its turn.
                        if r.is_ok() && waits && session.in_flight(id) {
                            encode_to_worker(&ToWorker::Later(id), &mut self.scratch);
                            self.pending_out.extend_from_slice(&self.scratch);
                        }
                        r
                    }
                    ToHost::Output(item) => session.on_output(item).map_err(|v| v.0),
                    ToHost::Idle => {
                        session.on_idle();
                        Ok(())
                    }
                    ToHost::Finished(f) => {
                        self.positions = end.positions();
                        if stop_sent.is_some() {
                            self.spent = true;
                        }
                        return Ended::Finished(f);
                    }
                    ToHost::Hello { .. } => Err("it said hello twice".into()),
                };
                if let Err(why) = handled {
                    self.positions = end.positions();
                    return self.broken(why);
                }
            }
            progress |= end.positions().1 != read_from;
            // 2. Results: host futures that finished elsewhere, then everything ready, in order.
            session.pull_completions();
            // Only a little ahead of what the worker reads: the rest waits in the session,
            // where it counts against the script's bound on answers held.
            while self.pending_out.len() - out_at < PENDING_AHEAD
                && let Some(d) = session.take_ready()
            {
                encode_delivery(&d, &mut self.scratch);
                self.pending_out.extend_from_slice(&self.scratch);
            }
            if out_at < self.pending_out.len() {
                match end.out.write_some(&self.pending_out[out_at..]) {
                    Ok(n) => {
                        out_at += n;
                        progress |= n > 0;
                    }
                    Err(e) => {
                        self.positions = end.positions();
                        return self.broken(e.to_string());
                    }
                }
                if out_at == self.pending_out.len() {
                    self.pending_out.clear();
                    out_at = 0;
                }
            }
            if progress && end.wake_peer() {
                ring_doorbell(bell_fd);
            }
            // 3. Limits the host enforces: deadline, abort, replay divergence, CPU time.
            let now = Instant::now();
            if stop_sent.is_none() {
                let mut due = session.due_stop();
                if due.is_none() && now >= next_cpu_check {
                    let used = crate::cpu_clock::of_process(self.pid)
                        .unwrap_or_default()
                        .saturating_sub(cpu_start);
                    if used >= cpu_budget {
                        due = Some(Stop::Cpu);
                    } else {
                        next_cpu_check = now + (cpu_budget - used).max(Duration::from_millis(5));
                    }
                }
                if let Some(stop) = due {
                    self.shm.stop().store(stop.flag(), Ordering::Release);
                    if end.wake_peer() {
                        ring_doorbell(bell_fd);
                    }
                    stop_sent = Some(stop);
                    kill_at = Some(now + grace);
                    self.spent = true;
                }
            }
            if let (Some(k), Some(stop)) = (kill_at, stop_sent)
                && now >= k
            {
                self.positions = end.positions();
                let status = self.kill_and_reap();
                tracing::debug!(
                    pid = self.pid,
                    ?status,
                    ?stop,
                    "killed a sandbox worker that did not stop"
                );
                return Ended::Killed(stop);
            }
            self.positions = end.positions();
            if progress {
                spin_since = None;
                continue;
            }
            // 4. Nothing happened: spin while the worker runs on another CPU; when it waits for
            // this one, move off it (now and then) or hand it over; then sleep.
            end.note_cpu();
            if end.peer_runs_elsewhere() {
                self.nudge.apart();
                let since = *spin_since.get_or_insert(now);
                if now.duration_since(since) < self.spin.get() {
                    // A pause takes about 30 ns on this machine's CPUs: look at the ring after
                    // each one, and at the clock and host futures only every 64.
                    for _ in 0..64 {
                        if end.inp.available() != Ok(0) {
                            break;
                        }
                        std::hint::spin_loop();
                    }
                    if session.has_completions() || end.inp.available() != Ok(0) {
                        spin_since = None;
                        self.spin.caught();
                    }
                    continue;
                }
                self.spin.missed();
            } else if end.peer_shares_cpu() {
                if self.nudge.shared(end.my_cpu()) {
                    end.note_cpu();
                    continue;
                }
                if self.yielder.hand_over(&end, || {
                    session.has_completions() || end.inp.available() != Ok(0)
                }) {
                    continue;
                }
            }
            spin_since = None;
            let mut wake_at = now + session.remaining().max(Duration::from_millis(1));
            if stop_sent.is_none() {
                wake_at = wake_at.min(next_cpu_check);
            }
            if let Some(k) = kill_at {
                wake_at = wake_at.min(k);
            }
            if !session.host_futures_running() {
                // Only the worker can bring work: block on the futex word, waking now and then
                // to notice an abort or a dead worker.
                let seen = end.bell();
                end.going_to_sleep(ON_FUTEX);
                if end.inp.available() != Ok(0) || session.has_ready() {
                    end.awake();
                    continue;
                }
                let nap = wake_at
                    .saturating_duration_since(now)
                    .min(FUTEX_NAP)
                    .max(Duration::from_micros(100));
                end.wait(seen, nap);
                end.awake();
                // A raw read: tokio's readiness for the socket is stale while this thread blocks.
                if Instant::now() >= now + nap && !matches!(drain_doorbell(bell_fd), Ok(true)) {
                    return self.worker_gone(session, stop_sent, max);
                }
                continue;
            }
            end.going_to_sleep(ON_SOCKET);
            if end.inp.available() != Ok(0) || session.has_completions() || session.has_ready() {
                end.awake();
                continue;
            }
            let abort = session.abort.clone();
            let Some(bell) = self.bell.as_ref() else {
                return self.broken("the doorbell is gone".into());
            };
            let bell_closed = tokio::select! {
                r = bell.readable() => match r {
                    Ok(()) => !drain_async_bell(bell),
                    Err(_) => true,
                },
                _ = session.next_completion() => false,
                _ = tokio::time::sleep_until(wake_at.into()) => false,
                _ = abort.cancelled(), if stop_sent.is_none() => false,
            };
            end.awake();
            if bell_closed {
                return self.worker_gone(session, stop_sent, max);
            }
        }
    }

    /// The worker's doorbell closed: it died. Whatever it managed to send before still counts.
    fn worker_gone(&mut self, session: &mut Session, stop_sent: Option<Stop>, max: usize) -> Ended {
        let mut end = self.shm.host_end(self.positions);
        while let Ok(Some(p)) = self.reader.next(&mut end.inp, max) {
            if let Ok(ToHost::Output(item)) = decode_to_host(p) {
                let _ = session.on_output(item);
            }
        }
        self.positions = end.positions();
        let status = self.kill_and_reap();
        if let Some(stop) = stop_sent {
            return Ended::Killed(stop);
        }
        let how = describe_exit(status);
        tracing::warn!(pid = self.pid, "a sandbox worker crashed: {how}");
        Ended::Died(how)
    }

    fn broken(&mut self, why: String) -> Ended {
        let status = self.kill_and_reap();
        tracing::warn!(
            pid = self.pid,
            ?status,
            "stopped a sandbox worker that broke the bridge protocol: {why}"
        );
        Ended::Broken(why)
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.kill_and_reap();
    }
}

/// Reads every pending doorbell byte through tokio, so its readiness is cleared. Returns false
/// when the worker's end is closed.
fn drain_async_bell(bell: &tokio::net::UnixStream) -> bool {
    let mut b = [0u8; 64];
    loop {
        match bell.try_read(&mut b) {
            Ok(0) => return false,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
}

/// SIGKILL to the worker's process group and to the worker itself (in case it had not yet made
/// its own group).
fn kill_group(pid: i32) {
    // SAFETY: signals to a process we started and have not reaped.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
        libc::kill(pid, libc::SIGKILL);
    }
}
