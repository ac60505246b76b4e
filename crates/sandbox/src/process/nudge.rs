//! Moves the host's thread off its worker's CPU once, when the two keep handing over on one CPU.
//!
//! Two processes that wake each other through a futex tend to stay on one CPU: the kernel puts a
//! woken task next to its waker, and as only one of the pair is runnable at a time, the load
//! balancer never sees a reason to split them. Every call then costs two context switches
//! between processes (about 10 µs of CPU on this project's VM) where two CPUs spinning would
//! hand over in well under a microsecond. So when the host finds its worker runnable on its own
//! CPU several waits in a row, it moves itself to another allowed CPU and at once restores its
//! affinity: a single migration, not a pin; the scheduler stays free to move it back. At most
//! once per `EVERY`, so a machine busy with other work pays almost nothing for it.

use std::time::{Duration, Instant};

pub(crate) struct Nudge {
    same_cpu_waits: u32,
    last: Option<Instant>,
}

impl Nudge {
    /// Waits in a row with the worker on our CPU before a nudge.
    const AFTER: u32 = 4;
    const EVERY: Duration = Duration::from_millis(2);

    pub fn new() -> Nudge {
        Nudge {
            same_cpu_waits: 0,
            last: None,
        }
    }

    /// The worker was found running elsewhere.
    pub fn apart(&mut self) {
        self.same_cpu_waits = 0;
    }

    /// The worker waits for our CPU. Returns true when this thread moved to another CPU.
    pub fn shared(&mut self, my_cpu: u32) -> bool {
        self.same_cpu_waits = self.same_cpu_waits.saturating_add(1);
        if self.same_cpu_waits < Self::AFTER {
            return false;
        }
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Self::EVERY)
        {
            return false;
        }
        self.last = Some(now);
        self.same_cpu_waits = 0;
        move_off(my_cpu)
    }
}

/// Migrates the calling thread to another CPU of its affinity mask, then restores the mask.
fn move_off(my_cpu: u32) -> bool {
    // SAFETY: cpu_set_t is plain data; the calls read and write only the sets we pass.
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if libc::sched_getaffinity(0, size, &mut allowed) != 0 {
            return false;
        }
        let max = libc::CPU_SETSIZE as usize;
        let me = my_cpu as usize;
        let Some(other) = (me + 1..max)
            .chain(0..me.min(max))
            .find(|&c| libc::CPU_ISSET(c, &allowed))
        else {
            return false;
        };
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(other, &mut one);
        if libc::sched_setaffinity(0, size, &one) != 0 {
            return false;
        }
        // Restoring the mask does not move the thread back: it stays where it now runs.
        libc::sched_setaffinity(0, size, &allowed) == 0
    }
}
