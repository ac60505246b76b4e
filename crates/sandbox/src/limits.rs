//! Operator limits and how a script's options may lower them.

use serde::{Deserialize, Serialize};

use crate::source::ScriptOptions;

/// Resource limits for one script. The operator sets defaults and a maximum; a script's
/// `// @options:` line may lower `timeout_ms` / `max_output_tokens` below the defaults, never
/// raise them: the defaults are what the operator chose (built in, settings or command line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// QuickJS heap limit in bytes. Past it the script sees a catchable `InternalError: out of memory`.
    pub heap_bytes: usize,
    /// QuickJS stack limit in bytes. Past it the script sees a catchable `RangeError`.
    pub stack_bytes: usize,
    /// Wall deadline, counted by `DeadlineClock::running` so approval pauses do not count.
    pub timeout_ms: u64,
    /// Budget for time spent running JavaScript (code that never yields to a call).
    pub cpu_ms: u64,
    /// Characters of text and base64 image data the script may output.
    pub max_output_chars: usize,
    /// Number of `text()`, `image()` and `console.*` calls.
    pub max_output_items: usize,
    /// Host calls (tools and globals) one script may make in total.
    pub max_calls: u64,
    /// Host calls that may be running at once.
    pub max_calls_in_flight: usize,
    /// Budget of what the model reads, in o200k tokens: the text, and the images at what each
    /// costs for its size (they may take half).
    pub max_output_tokens: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            heap_bytes: 256 * 1024 * 1024,
            stack_bytes: 1024 * 1024,
            timeout_ms: 60_000,
            cpu_ms: 60_000,
            max_output_chars: 16 * 1024 * 1024,
            max_output_items: 100_000,
            max_calls: 100_000,
            max_calls_in_flight: 4_096,
            max_output_tokens: 10_000,
        }
    }
}

impl Limits {
    /// Every field clamped to `maximum`.
    pub fn clamped_to(&self, maximum: &Limits) -> Limits {
        Limits {
            heap_bytes: self.heap_bytes.min(maximum.heap_bytes),
            stack_bytes: self.stack_bytes.min(maximum.stack_bytes),
            timeout_ms: self.timeout_ms.min(maximum.timeout_ms),
            cpu_ms: self.cpu_ms.min(maximum.cpu_ms),
            max_output_chars: self.max_output_chars.min(maximum.max_output_chars),
            max_output_items: self.max_output_items.min(maximum.max_output_items),
            max_calls: self.max_calls.min(maximum.max_calls),
            max_calls_in_flight: self.max_calls_in_flight.min(maximum.max_calls_in_flight),
            max_output_tokens: self.max_output_tokens.min(maximum.max_output_tokens),
        }
    }

    /// The limits one script runs with: the defaults within `maximum`, each lowered (never
    /// raised) by the script's options. The script is untrusted input; the operator's choice is
    /// the ceiling, whichever layer set it.
    pub fn effective(defaults: &Limits, maximum: &Limits, options: &ScriptOptions) -> Limits {
        let mut l = defaults.clamped_to(maximum);
        if let Some(t) = options.timeout_ms {
            l.timeout_ms = l.timeout_ms.min(t);
        }
        if let Some(t) = options.max_output_tokens {
            l.max_output_tokens = l.max_output_tokens.min(t);
        }
        l
    }
}

/// Where scripts' VMs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// In worker processes under no_new_privs, a seccomp allow-list, Landlock and resource
    /// limits, killed by the host when they overrun. The default.
    #[default]
    Process,
    /// On threads of the host process. Faster to start, but a script that spins inside a native
    /// built-in overruns its deadline and CPU budget (a thread cannot be killed), and a memory
    /// bug in the engine exposes the host's memory: its keys, connections and files. For
    /// embedders who accept that risk.
    Thread,
}

/// How the sandbox is run: limits, isolation and the size of the worker pool.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct SandboxConfig {
    pub defaults: Limits,
    pub maximum: Limits,
    pub isolation: Isolation,
    /// Workers started up front, each holding a prepared VM.
    pub warm: usize,
    /// Scripts that may run at once; more wait in a queue.
    pub max_concurrent: usize,
    /// Process isolation: the worker executable. Default: `$CODEMODE_SANDBOX_WORKER`, else the
    /// running executable, which becomes a worker when started with the worker marker.
    pub worker_program: Option<crate::WorkerProgram>,
    /// Process isolation: a worker is replaced after this many scripts (and after any script
    /// that hit a limit or crashed).
    pub worker_max_scripts: u32,
    /// Process isolation: the worker's data limit (RLIMIT_DATA). Default: the maximum heap plus
    /// 256 MiB for the engine itself.
    pub worker_memory_bytes: Option<u64>,
    /// Process isolation: how long a VM told to stop may take before its worker is killed.
    pub kill_grace_ms: u64,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            defaults: Limits::default(),
            maximum: Limits {
                heap_bytes: 1024 * 1024 * 1024,
                stack_bytes: 8 * 1024 * 1024,
                timeout_ms: 3_600_000,
                cpu_ms: 3_600_000,
                max_output_tokens: 1_000_000,
                ..Limits::default()
            },
            isolation: Isolation::Process,
            warm: 2,
            max_concurrent: 64,
            worker_program: None,
            worker_max_scripts: 500,
            worker_memory_bytes: None,
            kill_grace_ms: 100,
        }
    }
}
