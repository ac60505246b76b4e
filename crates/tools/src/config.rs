//! How the built-in tools are set up.

use std::path::PathBuf;

use codemode_spec::Exposure;

/// Settings shared by all built-in tools.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolsConfig {
    /// Directory that relative paths are resolved against and in which `bash` runs.
    /// A relative workdir is taken relative to the process's current directory.
    pub workdir: PathBuf,
    /// Longest a `bash` call may run, in milliseconds. It is both the default and the maximum a
    /// call may ask for, so a script cannot lift the limit the host set.
    pub bash_timeout_ms: u64,
    /// Most bytes of output a tool returns. Longer `bash` output keeps its head and tail with a
    /// marker of what was cut; `read` stops early and says how to read on.
    pub max_output_bytes: usize,
    /// Who sees the built-in tools (see [`Exposure`]).
    pub exposure: Exposure,
    /// Files no built-in tool reads, whatever the policy permits: by any path, through a hard
    /// link, or while searching a directory that holds them (`grep` skips them). Compared by
    /// identity (device and inode), taken when each call runs. For codemode's audit key, whose
    /// holder could forge the audit log.
    pub secret_files: Vec<PathBuf>,
    /// Most memory the image results of `read` may hold at once, across every call of these
    /// tools: from the read until the result is dropped. A read that would pass it waits. One
    /// image is bounded on its own; this bounds many read in parallel.
    pub max_image_memory_bytes: u64,
}

impl ToolsConfig {
    /// Default settings for a working directory.
    pub fn new(workdir: impl Into<PathBuf>) -> Self {
        ToolsConfig {
            workdir: workdir.into(),
            ..Default::default()
        }
    }
}

impl Default for ToolsConfig {
    fn default() -> Self {
        ToolsConfig {
            workdir: PathBuf::from("."),
            bash_timeout_ms: 120_000,
            max_output_bytes: 50 * 1024,
            exposure: Exposure::Direct,
            secret_files: Vec::new(),
            max_image_memory_bytes: 192 * 1024 * 1024,
        }
    }
}
