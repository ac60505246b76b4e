//! CPU-time clocks of a worker process or a VM thread, read from any thread.

use std::time::Duration;

/// The CPU time a process has used.
pub(crate) fn of_process(pid: i32) -> Option<Duration> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: asks for a process's clock id, written to a local.
    if unsafe { libc::clock_getcpuclockid(pid, &mut clock) } != 0 {
        return None;
    }
    read(clock)
}

/// A reader of the calling thread's CPU time that any thread may call, for as long as the
/// thread lives.
pub(crate) fn this_thread() -> Option<codemode_spec::Meter> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: asks for the calling thread's clock id, written to a local.
    if unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) } != 0 {
        return None;
    }
    Some(std::sync::Arc::new(move || read(clock).unwrap_or_default()))
}

fn read(clock: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: reads a clock into a local.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    ))
}
