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
        self.same_cpu_waits = 0;
        let moved = move_off(my_cpu);
        // From when the move ended: under load a migration itself can take milliseconds.
        self.last = Some(Instant::now());
        moved
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
        // Restoring the mask does not move the thread back: it stays where it now runs. Should
        // the old mask be refused (its CPUs were taken away meanwhile), every CPU the kernel
        // allows will do: the thread must not stay pinned.
        if libc::sched_setaffinity(0, size, &allowed) != 0 {
            let mut any: libc::cpu_set_t = std::mem::zeroed();
            for c in 0..max {
                libc::CPU_SET(c, &mut any);
            }
            if libc::sched_setaffinity(0, size, &any) != 0 {
                tracing::warn!("could not restore the CPU affinity of a sandbox pool thread");
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mask() -> Vec<usize> {
        // SAFETY: as in move_off.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
                0
            );
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    }

    #[test]
    fn a_nudge_moves_the_thread_and_leaves_its_affinity_as_it_was() {
        std::thread::spawn(|| {
            let before = mask();
            // SAFETY: no preconditions.
            let cpu = unsafe { libc::sched_getcpu() } as u32;
            let mut n = Nudge::new();
            // Not before AFTER waits in a row, and not again within EVERY.
            for _ in 1..Nudge::AFTER {
                assert!(!n.shared(cpu));
            }
            let t = Instant::now();
            let moved = n.shared(cpu);
            assert_eq!(moved, before.len() > 1, "allowed CPUs: {before:?}");
            for _ in 0..Nudge::AFTER {
                if n.shared(cpu) {
                    assert!(t.elapsed() >= Nudge::EVERY, "a second nudge too soon");
                }
            }
            assert_eq!(mask(), before, "the affinity mask was not restored");
        })
        .join()
        .unwrap();
    }
}
