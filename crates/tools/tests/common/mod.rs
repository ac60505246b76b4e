#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use codemode_spec::{Provenance, Tool, ToolCall, ToolError, ToolOutput};
use codemode_tools::{ToolsConfig, builtin_tools};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// A temporary working directory with the built-in tools set up on it.
pub struct Bench {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub tools: Vec<Arc<dyn Tool>>,
}

impl Bench {
    pub fn new() -> Self {
        Self::with(|_| {})
    }

    pub fn with(adjust: impl FnOnce(&mut ToolsConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let mut config = ToolsConfig::new(&root);
        adjust(&mut config);
        let tools = builtin_tools(&config);
        Bench { dir, root, tools }
    }

    pub fn tool(&self, name: &str) -> Arc<dyn Tool> {
        self.tools
            .iter()
            .find(|t| t.spec().name == name)
            .cloned()
            .unwrap_or_else(|| panic!("no tool {name}"))
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub fn put(&self, rel: &str, content: impl AsRef<[u8]>) -> PathBuf {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
        path
    }

    pub async fn call(&self, name: &str, args: Value) -> Result<ToolOutput, ToolError> {
        self.call_with(name, args, CancellationToken::new()).await
    }

    pub async fn call_with(
        &self,
        name: &str,
        args: Value,
        cancel: CancellationToken,
    ) -> Result<ToolOutput, ToolError> {
        let tool = self.tool(name);
        tool.call(ToolCall {
            args,
            provenance: Provenance::model("call-1", "session-1"),
            cancel,
        })
        .await
    }

    /// The text a direct call of a successful tool shows (its one text block, or its value
    /// when that is a string).
    pub async fn text(&self, name: &str, args: Value) -> String {
        match self.call(name, args).await {
            Ok(out) => shown_text(&out),
            Err(e) => panic!("{name} failed: {e}"),
        }
    }

    /// What a script's call of a successful tool resolves to.
    pub async fn value(&self, name: &str, args: Value) -> Value {
        match self.call(name, args).await {
            Ok(out) => out.value,
            Err(e) => panic!("{name} failed: {e}"),
        }
    }

    pub async fn error(&self, name: &str, args: Value) -> ToolError {
        match self.call(name, args).await {
            Ok(out) => panic!("{name} should have failed but returned {:?}", out.value),
            Err(e) => e,
        }
    }
}

/// True once the process is gone: no longer in /proc, or a zombie waiting for its reaper.
pub fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
    }
}

/// Waits (up to a generous bound) for every pid to be gone.
pub async fn all_gone(pids: &[i32]) -> bool {
    for _ in 0..100 {
        if pids.iter().all(|p| process_gone(*p)) {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    false
}

pub fn read_pids(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect()
}

/// The text a direct call shows.
pub fn shown_text(out: &ToolOutput) -> String {
    match out.content.as_deref() {
        Some([codemode_spec::ContentBlock::Text { text }]) => text.clone(),
        _ => out.value.as_str().expect("a text result").to_owned(),
    }
}

/// An ignore file of distinct rules, `rule(n)` for n counting up from `first`, one a line, as
/// many as fit in `max_bytes`.
pub fn ignore_file(first: usize, max_bytes: usize, rule: impl Fn(usize) -> String) -> String {
    let mut text = String::new();
    for n in first.. {
        let line = rule(n);
        if text.len() + line.len() + 1 > max_bytes {
            break;
        }
        text.push_str(&line);
        text.push('\n');
    }
    text
}

/// `count` rules of the costliest kind measured: each `<hex>*.c` compiles to a regex of its own,
/// ~11 KB apiece.
pub fn costly_rules(count: usize) -> String {
    (0..count).map(|n| format!("{n:x}*.c\n")).collect()
}

/// The largest ignore file the walk reads (1 MiB) of short distinct names (hex numbers from
/// `first`): a compiled copy takes over 100 MB.
pub fn huge_ignore_file(first: usize) -> String {
    ignore_file(first, 1024 * 1024, |n| format!("{n:x}"))
}
