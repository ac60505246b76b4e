//! A CPU quota for one process, through a cgroup of its own (v2 `cpu.max`, or v1
//! `cpu.cfs_quota_us`). It lets a 2-core machine measure how replicas scale as if each had a
//! core share of its own: capped, one replica cannot take the cores the other would need, so
//! what limits two replicas together is the shared state, not the machine.

use std::path::{Path, PathBuf};

const PERIOD_US: u64 = 100_000;

pub struct CpuCap {
    dir: PathBuf,
}

impl CpuCap {
    /// A new cgroup limited to `cores` (such as 0.4) of one core, or why there can be none.
    pub fn new(name: &str, cores: f64) -> Result<CpuCap, String> {
        let quota = (cores * PERIOD_US as f64).round() as u64;
        if quota < 1_000 {
            return Err(format!(
                "{cores} of a core is below the 1 ms per period cgroups allow"
            ));
        }
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        let (dir, file, value) = if std::fs::read_to_string(v2).is_ok_and(|c| c.contains("cpu")) {
            (
                PathBuf::from("/sys/fs/cgroup").join(name),
                "cpu.max",
                format!("{quota} {PERIOD_US}"),
            )
        } else {
            (
                PathBuf::from("/sys/fs/cgroup/cpu").join(name),
                "cpu.cfs_quota_us",
                quota.to_string(),
            )
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create the cgroup {}: {e}", dir.display()))?;
        let cap = CpuCap { dir };
        if file == "cpu.cfs_quota_us" {
            cap.write("cpu.cfs_period_us", &PERIOD_US.to_string())?;
        }
        cap.write(file, &value)?;
        Ok(cap)
    }

    /// Moves the process (all its threads, and what it starts later) into the cgroup.
    pub fn add(&self, pid: u32) -> Result<(), String> {
        self.write("cgroup.procs", &pid.to_string())
    }

    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        let path = self.dir.join(file);
        std::fs::write(&path, value).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }
}

impl Drop for CpuCap {
    fn drop(&mut self) {
        // Only an empty cgroup can go: the caller drops this after its process exited.
        let _ = std::fs::remove_dir(&self.dir);
    }
}
