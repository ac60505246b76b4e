//! Giving freed memory back to the system while `serve` runs.
//!
//! glibc's allocator keeps what a burst freed: its per-thread arenas hold the pages, and large
//! blocks stop being returned once its mmap threshold has risen. After eight scripts at once
//! received a few hundred MiB of answers, `serve` stayed at about 0.5 GB for as long as it ran,
//! idle. Every few seconds, while the process holds more than a little, `malloc_trim` returns
//! the free pages of every arena.

use std::time::Duration;

/// How often the resident size is looked at.
const EVERY: Duration = Duration::from_secs(5);

/// Below this resident size nothing is trimmed: a small process has little to give back.
const ABOVE_BYTES: u64 = 128 << 20;

/// Starts the trimming task on the current runtime; it ends with the runtime.
pub fn spawn() {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return;
    }
    tokio::spawn(async {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if resident_bytes().is_some_and(|b| b > ABOVE_BYTES) {
                // It walks every arena under its lock: off the async workers.
                let _ = tokio::task::spawn_blocking(trim).await;
            }
        }
    });
}

fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib.saturating_mul(1024))
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim takes no pointers; glibc documents it as safe to call at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::{resident_bytes, trim};

    /// What many small blocks freed stays resident (a block allocated after them keeps the
    /// heap from shrinking on its own) until trimmed.
    #[test]
    fn trimming_gives_back_what_a_burst_freed() {
        let mib = |b: u64| b >> 20;
        let blocks: Vec<Vec<u8>> = (0..200_000u32).map(|i| vec![i as u8; 1000]).collect();
        let after_them = vec![1u8; 1000];
        let held = resident_bytes().unwrap();
        drop(blocks);
        let freed = resident_bytes().unwrap();
        trim();
        let trimmed = resident_bytes().unwrap();
        eprintln!(
            "held {} MiB, freed {} MiB, trimmed {} MiB",
            mib(held),
            mib(freed),
            mib(trimmed)
        );
        assert!(
            freed.saturating_sub(trimmed) > 100 << 20,
            "held {} MiB, freed {} MiB, trimmed {} MiB",
            mib(held),
            mib(freed),
            mib(trimmed)
        );
        assert_eq!(after_them[999], 1);
    }
}
