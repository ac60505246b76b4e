//! The isolation layers a worker process puts itself under, and the report of which took hold.
//!
//! Each layer is applied on a best-effort basis: where the kernel lacks a feature, the worker
//! still starts and the report says so, so the host can tell the operator exactly what holds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One isolation layer and whether it is in force in the workers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IsolationLayer {
    /// Short name: `no_new_privs`, `seccomp`, `landlock`, `rlimits`, `session`, `descriptors`,
    /// `environment`.
    pub name: String,
    pub active: bool,
    /// What the layer does here, or why it is not active.
    pub detail: String,
}

fn layer(name: &str, active: bool, detail: impl Into<String>) -> IsolationLayer {
    IsolationLayer {
        name: name.to_string(),
        active,
        detail: detail.into(),
    }
}

/// Resource limits of a worker process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WorkerRlimits {
    /// RLIMIT_DATA: private writable memory of the process.
    pub data_bytes: u64,
    /// RLIMIT_CPU over the worker's whole life, in seconds.
    pub cpu_seconds: u64,
    /// RLIMIT_STACK, so the main thread's stack can hold the VM's stack limit.
    pub stack_bytes: u64,
}

fn set_rlimit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> Result<(), String> {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: plain syscall with a local struct.
    if unsafe { libc::setrlimit(resource, &lim) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().to_string())
    }
}

fn get_rlimit(resource: libc::__rlimit_resource_t) -> libc::rlimit {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscall writing a local struct.
    unsafe { libc::getrlimit(resource, &mut lim) };
    lim
}

/// Resource limits: memory, CPU time, no core dumps, no file writes, and room for the stack.
pub(crate) fn apply_rlimits(r: &WorkerRlimits) -> IsolationLayer {
    let mut errors = Vec::new();
    let stack = get_rlimit(libc::RLIMIT_STACK);
    let want_stack = r.stack_bytes.min(stack.rlim_max);
    if want_stack > stack.rlim_cur
        && let Err(e) = set_rlimit(libc::RLIMIT_STACK, want_stack, stack.rlim_max)
    {
        errors.push(format!("stack: {e}"));
    }
    for (name, res, v) in [
        ("core", libc::RLIMIT_CORE, 0),
        ("file size", libc::RLIMIT_FSIZE, 0),
        ("data", libc::RLIMIT_DATA, r.data_bytes),
        ("cpu", libc::RLIMIT_CPU, r.cpu_seconds.max(1)),
    ] {
        if let Err(e) = set_rlimit(res, v, v) {
            errors.push(format!("{name}: {e}"));
        }
    }
    let detail = format!(
        "data {} MiB, CPU {} s over the worker's life, no core dumps, no file writes",
        r.data_bytes >> 20,
        r.cpu_seconds
    );
    if errors.is_empty() {
        layer("rlimits", true, detail)
    } else {
        layer(
            "rlimits",
            false,
            format!("{detail}; not set: {}", errors.join(", ")),
        )
    }
}

/// No file-system, network or cross-process access through Landlock, as far as the kernel goes.
pub(crate) fn apply_landlock() -> IsolationLayer {
    use landlock::{
        ABI, Access, AccessFs, AccessNet, LandlockStatus, Ruleset, RulesetAttr, RulesetStatus,
        Scope,
    };
    let abi = ABI::V6;
    let built = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| r.handle_access(AccessNet::from_all(abi)))
        .and_then(|r| r.scope(Scope::from_all(abi)))
        .and_then(|r| r.create())
        .and_then(|r| r.restrict_self());
    match built {
        Ok(status) => {
            let kernel = match status.landlock {
                LandlockStatus::Available { effective_abi, .. } => {
                    format!("kernel Landlock ABI {}", effective_abi as i32)
                }
                LandlockStatus::NotEnabled => "Landlock is built in but not enabled".into(),
                LandlockStatus::NotImplemented => "the kernel has no Landlock".into(),
            };
            match status.ruleset {
                RulesetStatus::FullyEnforced => layer(
                    "landlock",
                    true,
                    format!(
                        "no file-system access, no TCP, no signals or abstract sockets outside the worker ({kernel})"
                    ),
                ),
                RulesetStatus::PartiallyEnforced => layer(
                    "landlock",
                    true,
                    format!(
                        "partly: no file-system access; newer restrictions unsupported ({kernel})"
                    ),
                ),
                RulesetStatus::NotEnforced => {
                    layer("landlock", false, format!("not enforced ({kernel})"))
                }
            }
        }
        Err(e) => layer("landlock", false, format!("could not be applied: {e}")),
    }
}

/// Sets `PR_SET_NO_NEW_PRIVS`: nothing the worker executes can gain privileges.
pub(crate) fn apply_no_new_privs() -> IsolationLayer {
    // SAFETY: plain prctl.
    let ok = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } == 0;
    layer(
        "no_new_privs",
        ok,
        if ok {
            "set"
        } else {
            "prctl(PR_SET_NO_NEW_PRIVS) failed"
        },
    )
}

/// The system calls the worker makes after start-up. Everything else kills the process
/// (SIGSYS), so a compromised engine cannot open files, sockets or processes.
fn seccomp_rules(
    pid: i32,
) -> Result<BTreeMap<i64, Vec<seccompiler::SeccompRule>>, seccompiler::BackendError> {
    use seccompiler::{
        SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond, SeccompRule as Rule,
    };
    let fd_is = |fd: u64| -> Result<Vec<Rule>, seccompiler::BackendError> {
        Ok(vec![Rule::new(vec![Cond::new(
            0,
            Len::Dword,
            Op::Eq,
            fd,
        )?])?])
    };
    let no_exec = |arg: u8| -> Result<Vec<Rule>, seccompiler::BackendError> {
        Ok(vec![Rule::new(vec![Cond::new(
            arg,
            Len::Dword,
            Op::MaskedEq(libc::PROT_EXEC as u64),
            0,
        )?])?])
    };
    let mut rules: BTreeMap<i64, Vec<Rule>> = BTreeMap::new();
    // The doorbell (fd 0) and diagnostics on standard error (fd 2); no other descriptor.
    rules.insert(libc::SYS_recvfrom, fd_is(0)?);
    rules.insert(libc::SYS_sendto, fd_is(0)?);
    rules.insert(libc::SYS_write, fd_is(2)?);
    rules.insert(libc::SYS_writev, fd_is(2)?);
    // Memory, never executable: QuickJS has no JIT.
    rules.insert(libc::SYS_mmap, no_exec(2)?);
    rules.insert(libc::SYS_mprotect, no_exec(2)?);
    // Signals only to itself (abort() raises SIGABRT on its own thread).
    rules.insert(
        libc::SYS_tgkill,
        vec![Rule::new(vec![Cond::new(
            0,
            Len::Dword,
            Op::Eq,
            pid as u64,
        )?])?],
    );
    for sys in [
        libc::SYS_munmap,
        libc::SYS_mremap,
        libc::SYS_brk,
        libc::SYS_madvise,
        // Which of its own pages are resident, so a VM reset zeroes those instead of
        // faulting them in again (arena.rs).
        libc::SYS_mincore,
        libc::SYS_futex,
        libc::SYS_clock_gettime,
        libc::SYS_clock_getres,
        libc::SYS_gettimeofday,
        libc::SYS_sched_yield,
        libc::SYS_getrandom,
        libc::SYS_getpid,
        libc::SYS_gettid,
        libc::SYS_rt_sigprocmask,
        libc::SYS_rt_sigreturn,
        libc::SYS_sigaltstack,
        libc::SYS_restart_syscall,
        libc::SYS_close,
        libc::SYS_exit,
        libc::SYS_exit_group,
    ] {
        rules.insert(sys, vec![]);
    }
    Ok(rules)
}

/// Installs the seccomp allow-list (which also sets `PR_SET_NO_NEW_PRIVS`).
pub(crate) fn apply_seccomp() -> IsolationLayer {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let arch: seccompiler::TargetArch = match std::env::consts::ARCH.try_into() {
        Ok(a) => a,
        Err(e) => return layer("seccomp", false, format!("unsupported architecture: {e}")),
    };
    let program: Result<seccompiler::BpfProgram, seccompiler::BackendError> = seccomp_rules(pid)
        .and_then(|rules| {
            seccompiler::SeccompFilter::new(
                rules,
                seccompiler::SeccompAction::KillProcess,
                seccompiler::SeccompAction::Allow,
                arch,
            )
        })
        .and_then(|f| f.try_into());
    match program.map(|p| (seccompiler::apply_filter(&p), p.len())) {
        Ok((Ok(()), n)) => layer(
            "seccomp",
            true,
            format!(
                "allow-list of memory, futex, clock and the bridge's descriptors ({n} BPF instructions); any other system call kills the worker"
            ),
        ),
        Ok((Err(e), _)) => layer(
            "seccomp",
            false,
            format!("the kernel refused the filter: {e}"),
        ),
        Err(e) => layer(
            "seccomp",
            false,
            format!("the filter could not be built: {e}"),
        ),
    }
}
