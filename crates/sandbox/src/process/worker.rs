//! The worker process: puts itself under the isolation layers, then runs scripts one after
//! another, each in a fresh VM, talking to the host only through the bridge.
//!
//! The worker is single-threaded and never uses tokio: after start-up it needs only memory,
//! futexes, the clock and its doorbell, which is what its seccomp filter allows.

use std::cell::RefCell;
use std::hint::spin_loop;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use futures::future::LocalBoxFuture;

use super::layers::{self, IsolationLayer, WorkerRlimits};
use crate::engine::{Link, Waited};
use crate::host::HostCallKind;
use crate::protocol::{
    Delivery, End as RunEnd, Finish, PROTOCOL_VERSION, ToHost, ToWorker, decode_to_worker,
    encode_call, encode_to_host,
};
use crate::result::OutputItem;
use crate::ring::{
    End, FrameReader, ON_FUTEX, Shm, SpinBudget, Yielder, drain_doorbell, ring_doorbell,
};
use crate::vm::{ActiveLimits, Stop, Vm};

/// The doorbell socket: standard input of the worker.
const BELL: RawFd = 0;
/// The bridge memfd: standard output of the worker, closed once mapped.
const SHM_FD: RawFd = 1;
/// How long a sleeping worker waits before it checks that its host is still there.
const HOST_CHECK: Duration = Duration::from_secs(1);
/// The largest frame the host sends (a call result); bigger ones are refused.
const MAX_FROM_HOST: usize = 1 << 30;

/// Exit codes, for the host's crash report.
pub(crate) const EXIT_BAD_ARGS: i32 = 70;
pub(crate) const EXIT_SETUP: i32 = 71;
pub(crate) const EXIT_PROTOCOL: i32 = 72;

fn die(code: i32) -> ! {
    // SAFETY: _exit ends the process without running anything else.
    unsafe { libc::_exit(code) }
}

/// The worker's arguments after the marker.
pub(crate) struct WorkerArgs {
    pub host_pid: i32,
    pub rlimits: WorkerRlimits,
    /// Address space reserved for the VM's arena.
    pub arena_bytes: u64,
}

impl WorkerArgs {
    pub fn to_args(&self) -> Vec<String> {
        vec![
            self.host_pid.to_string(),
            self.rlimits.data_bytes.to_string(),
            self.rlimits.cpu_seconds.to_string(),
            self.rlimits.stack_bytes.to_string(),
            self.arena_bytes.to_string(),
        ]
    }
    pub fn parse(args: &[String]) -> Option<WorkerArgs> {
        let n = |i: usize| args.get(i)?.parse::<u64>().ok();
        Some(WorkerArgs {
            host_pid: args.first()?.parse().ok()?,
            rlimits: WorkerRlimits {
                data_bytes: n(1)?,
                cpu_seconds: n(2)?,
                stack_bytes: n(3)?,
            },
            arena_bytes: n(4)?,
        })
    }
}

/// Everything a worker does before its first script: the layers, the first VM, the hello.
/// Shared by the real worker and by test workers that misbehave later.
pub(crate) struct Prepared {
    pub channel: Rc<RefCell<Channel>>,
    pub stop: &'static AtomicU32,
    pub vm: Option<Vm>,
    pub arena_bytes: usize,
}

/// Sets up a worker process: descriptors, session, layers, a first VM, then the hello.
pub(crate) fn prepare(args: &[String]) -> Prepared {
    let Some(a) = WorkerArgs::parse(args) else {
        die(EXIT_BAD_ARGS)
    };
    let mut report: Vec<IsolationLayer> = Vec::new();
    // SAFETY: plain syscalls on the process's own state.
    unsafe {
        let closed = libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) == 0;
        report.push(IsolationLayer {
            name: "descriptors".into(),
            active: closed,
            detail: if closed {
                "nothing inherited but the bridge's doorbell and memory, and standard error".into()
            } else {
                "close_range failed: inherited descriptors may be open".into()
            },
        });
        let own = libc::setsid() >= 0;
        report.push(IsolationLayer {
            name: "session".into(),
            active: own,
            detail: if own {
                "own session and process group, killed as a group".into()
            } else {
                "setsid failed".into()
            },
        });
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        if libc::getppid() != a.host_pid {
            die(EXIT_SETUP);
        }
    }
    let env_empty = std::env::vars_os().next().is_none();
    report.push(IsolationLayer {
        name: "environment".into(),
        active: env_empty,
        detail: if env_empty {
            "empty: no variables inherited".into()
        } else {
            "variables were inherited".into()
        },
    });
    let shm = match Shm::map(SHM_FD) {
        Ok(s) if s.magic_ok() => s,
        _ => die(EXIT_SETUP),
    };
    // SAFETY: the descriptor is ours and no longer needed once mapped.
    unsafe { libc::close(SHM_FD) };
    let shm: &'static Shm = Box::leak(Box::new(shm));
    report.push(layers::apply_rlimits(&a.rlimits));
    report.push(layers::apply_no_new_privs());
    // The C library reads the time zone (/etc/localtime) at the first local-time conversion;
    // read now, while files may still be opened, it is never read again, so `new
    // Date().toString()` does not make a system call seccomp forbids.
    // SAFETY: tzset only sets the C library's own time-zone state.
    unsafe { tzset() };
    report.push(layers::apply_landlock());
    // The first VM touches, once, every code path that needs a system call (the prelude's
    // bytecode, the hash seeds), before the filter forbids them.
    let arena_bytes = usize::try_from(a.arena_bytes).unwrap_or(usize::MAX);
    let vm = Vm::prepare(arena_bytes).ok();
    report.push(layers::apply_seccomp());
    let channel = Rc::new(RefCell::new(Channel::new(shm)));
    let layers = serde_json::to_string(&report).unwrap_or_default();
    channel.borrow_mut().send(&ToHost::Hello {
        version: PROTOCOL_VERSION,
        layers,
    });
    Prepared {
        channel,
        stop: shm.stop(),
        vm,
        arena_bytes,
    }
}

/// The worker's main loop. Never returns.
pub(crate) fn main(args: &[String]) -> ! {
    let Prepared {
        channel,
        stop,
        mut vm,
        arena_bytes,
    } = prepare(args);
    loop {
        let start = loop {
            let msg = channel.borrow_mut().try_frame();
            match msg {
                Some(ToWorker::Start(s)) => break s,
                Some(ToWorker::Shutdown) => die(0),
                // A result for a script that has ended: ignore it.
                Some(ToWorker::Deliver(_) | ToWorker::Later(_)) => continue,
                None => channel
                    .borrow_mut()
                    .sleep_until(|e, _| e.inp.available() != Ok(0)),
            }
        };
        let current = match vm.take() {
            Some(v) => Ok(v),
            None => Vm::prepare(arena_bytes),
        };
        let (fin, used) = match current {
            Ok(v) => {
                channel.borrow_mut().stash.clear();
                let link: Rc<dyn Link> = Rc::new(RemoteLink {
                    channel: channel.clone(),
                    stop,
                    notify_idle: start.notify_idle,
                    in_place: start.in_place && !start.notify_idle,
                });
                let limits = ActiveLimits {
                    cpu: Duration::from_millis(start.limits.cpu_ms),
                    wall: None,
                    stop_flag: Some(stop),
                };
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    futures::executor::block_on(crate::engine::run(&v, *start, link, limits))
                }));
                match run {
                    Ok(fin) => (fin, Some(v)),
                    // A VM whose run panicked is not reset but dropped: Rust-side state may be
                    // half-updated.
                    Err(_) => (
                        Finish {
                            end: Some(RunEnd::Fatal),
                            fatal: Some(
                                "The sandbox engine failed while running the script.".into(),
                            ),
                            ..Default::default()
                        },
                        None,
                    ),
                }
            }
            Err(e) => (
                Finish {
                    end: Some(RunEnd::Fatal),
                    fatal: Some(e.to_string()),
                    ..Default::default()
                },
                None,
            ),
        };
        channel.borrow_mut().send(&ToHost::Finished(Box::new(fin)));
        // Resetting the VM happens after the host has its result.
        vm = match used {
            Some(v) => {
                let big = v.heap.peak.get() > crate::vm::TRIM_AFTER_BYTES;
                v.reset();
                if big {
                    crate::vm::trim();
                }
                Some(v)
            }
            None => Vm::prepare(arena_bytes).ok(),
        };
    }
}

/// The worker's end of the bridge.
pub(crate) struct Channel {
    end: End<'static>,
    stop: &'static AtomicU32,
    reader: FrameReader,
    scratch: Vec<u8>,
    spin: SpinBudget,
    yielder: Yielder,
    /// Results read while waiting in place that were not the awaited one, in arrival order.
    stash: Vec<Delivery>,
}

impl Channel {
    fn new(shm: &'static Shm) -> Channel {
        Channel {
            end: shm.worker_end(),
            stop: shm.stop(),
            reader: FrameReader::new(),
            scratch: Vec::with_capacity(4096),
            spin: SpinBudget::new(),
            yielder: Yielder::new(),
            stash: Vec::new(),
        }
    }

    /// Waits for the host's word on call `id`, sent with `waits`: its result when the host
    /// answered at once, or [`ToWorker::Later`]. The host sends one or the other as soon as it
    /// has read the call, so this waits no longer than the host takes to read and answer; it
    /// spins or sleeps as [`Channel::sleep_until`] does. Results of other calls that come first
    /// are kept for the end of the turn.
    fn answer_in_place(&mut self, id: u64) -> Answer {
        loop {
            match self.try_frame() {
                Some(ToWorker::Deliver(d)) if d.id == id => {
                    if d.at_ms.is_none() && d.result.is_ok() {
                        return Answer::Here(d.result.unwrap_or_default());
                    }
                    self.stash.push(d);
                    return Answer::Later;
                }
                Some(ToWorker::Deliver(d)) => self.stash.push(d),
                Some(ToWorker::Later(later)) if later == id => return Answer::Later,
                Some(ToWorker::Later(_)) => {}
                Some(ToWorker::Shutdown) => die(0),
                Some(ToWorker::Start(_)) => die(EXIT_PROTOCOL),
                None => {
                    if self.stop.load(Ordering::Relaxed) != 0 {
                        return Answer::Later;
                    }
                    self.sleep_until(|e, stop| {
                        e.inp.available() != Ok(0) || stop.load(Ordering::Relaxed) != 0
                    });
                }
            }
        }
    }

    /// Spins while the host runs on another CPU, then sleeps on the futex word, until `ready`
    /// holds. A closed doorbell means the host is gone: the worker exits.
    pub fn sleep_until(&mut self, ready: impl Fn(&End<'static>, &AtomicU32) -> bool) {
        loop {
            if ready(&self.end, self.stop) {
                return;
            }
            self.end.note_cpu();
            if self.end.peer_runs_elsewhere() {
                let t = Instant::now();
                let budget = self.spin.get();
                let mut i: u32 = 0;
                loop {
                    if ready(&self.end, self.stop) {
                        self.spin.caught();
                        return;
                    }
                    i = i.wrapping_add(1);
                    if i.is_multiple_of(64) {
                        if t.elapsed() > budget {
                            self.spin.missed();
                            break;
                        }
                        if !self.end.peer_runs_elsewhere() {
                            break;
                        }
                    }
                    spin_loop();
                }
            } else if self.end.peer_shares_cpu() {
                let (end, stop) = (&self.end, self.stop);
                if self.yielder.hand_over(end, || ready(end, stop)) {
                    return;
                }
                if self.end.peer_runs_elsewhere() {
                    continue;
                }
            }
            let seen = self.end.bell();
            self.end.going_to_sleep(ON_FUTEX);
            if ready(&self.end, self.stop) {
                self.end.awake();
                return;
            }
            let t = Instant::now();
            self.end.wait(seen, HOST_CHECK);
            self.end.awake();
            if t.elapsed() >= HOST_CHECK && matches!(drain_doorbell(BELL), Ok(false) | Err(_)) {
                die(0);
            }
        }
    }

    /// Writes the frame in `self.scratch`, waiting for room as needed.
    fn send_scratch(&mut self) {
        let mut at = 0;
        while at < self.scratch.len() {
            match self.end.out.write_some(&self.scratch[at..]) {
                Ok(n) => at += n,
                Err(_) => die(EXIT_PROTOCOL),
            }
            if at < self.scratch.len() {
                self.wake_host();
                self.sleep_until(|e, _| !e.out.full());
            }
        }
        self.wake_host();
    }

    fn wake_host(&self) {
        if self.end.wake_peer() {
            ring_doorbell(BELL);
        }
    }

    pub fn send(&mut self, msg: &ToHost) {
        encode_to_host(msg, &mut self.scratch);
        self.send_scratch();
    }

    /// Sends raw bytes (test workers use it to misbehave).
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.scratch.clear();
        self.scratch.extend_from_slice(bytes);
        self.send_scratch();
    }

    /// The next whole message from the host, if one has arrived.
    pub fn try_frame(&mut self) -> Option<ToWorker> {
        let got = match self.reader.next(&mut self.end.inp, MAX_FROM_HOST) {
            Ok(Some(payload)) => match decode_to_worker(payload) {
                Ok(m) => Some(m),
                Err(_) => die(EXIT_PROTOCOL),
            },
            Ok(None) => None,
            Err(_) => die(EXIT_PROTOCOL),
        };
        // The host may be waiting for room to write the rest of a large result.
        self.wake_host();
        got
    }
}

/// What a wait in place found.
enum Answer {
    /// The awaited call's result.
    Here(String),
    /// Not now: the result comes the usual way.
    Later,
}

/// The engine's link in a worker: calls and output go over the bridge.
struct RemoteLink {
    channel: Rc<RefCell<Channel>>,
    stop: &'static AtomicU32,
    notify_idle: bool,
    /// Whether a call may wait in place for its answer in this run.
    in_place: bool,
}

impl Link for RemoteLink {
    fn call(
        &self,
        id: u64,
        kind: HostCallKind,
        name: &str,
        args: &str,
        first_in_job: bool,
    ) -> Option<String> {
        let mut c = self.channel.borrow_mut();
        // Only the first call of a job waits: calls made together (a `Promise.all`) go out
        // together, and their answers come at the end of the turn.
        let waits = first_in_job && self.in_place;
        let mut buf = std::mem::take(&mut c.scratch);
        encode_call(id, kind, name, args, waits, &mut buf);
        c.scratch = buf;
        c.send_scratch();
        if !waits {
            return None;
        }
        match c.answer_in_place(id) {
            Answer::Here(json) => Some(json),
            Answer::Later => None,
        }
    }

    fn output(&self, item: OutputItem) {
        self.channel.borrow_mut().send(&ToHost::Output(item));
    }

    fn poll_ready(&self, out: &mut Vec<Delivery>) {
        let mut c = self.channel.borrow_mut();
        out.append(&mut c.stash);
        loop {
            match c.try_frame() {
                Some(ToWorker::Deliver(d)) => out.push(d),
                // For a call that stopped waiting already.
                Some(ToWorker::Later(_)) => {}
                Some(ToWorker::Shutdown) => die(0),
                Some(ToWorker::Start(_)) => die(EXIT_PROTOCOL),
                None => return,
            }
        }
    }

    fn wait(&self) -> LocalBoxFuture<'_, Waited> {
        let mut c = self.channel.borrow_mut();
        if self.notify_idle {
            c.send(&ToHost::Idle);
        }
        c.sleep_until(|e, stop| e.inp.available() != Ok(0) || stop.load(Ordering::Relaxed) != 0);
        let waited = match Stop::from_flag(self.stop.load(Ordering::Acquire)) {
            Some(s) => Waited::Stop(s),
            None => Waited::Results,
        };
        Box::pin(async move { waited })
    }
}

unsafe extern "C" {
    /// POSIX `tzset`, which the libc crate does not declare.
    fn tzset();
}
