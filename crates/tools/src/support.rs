//! What every built-in tool shares: the resolved working directory, spec building, and running
//! blocking file-system work off the async runtime.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use codemode_spec::{Annotations, CallKind, ContentBlock, ToolError, ToolOutput, ToolSpec};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::ToolsConfig;
use crate::fs::{Resolved, SecretFiles};
use crate::held_bytes::ByteBudget;
use crate::paths::{resolve_arg, resolve_workdir};

/// Settings plus the working directory resolved once.
#[derive(Debug)]
pub(crate) struct Context {
    pub config: ToolsConfig,
    /// Absolute, symlink-resolved working directory.
    pub workdir: PathBuf,
    /// What image results hold (see [`ToolsConfig::max_image_memory_bytes`]).
    pub image_memory: Arc<ByteBudget>,
}

impl Context {
    pub fn new(config: &ToolsConfig) -> Self {
        // If even the working directory cannot be placed, keep it as given: every later
        // resolution will fail with a message naming it.
        let workdir = resolve_workdir(&config.workdir).unwrap_or_else(|_| config.workdir.clone());
        Context {
            config: config.clone(),
            workdir,
            image_memory: Arc::new(ByteBudget::new(config.max_image_memory_bytes)),
        }
    }

    /// The files no tool may read, identified as they are now.
    pub fn secrets(&self) -> SecretFiles {
        SecretFiles::now(&self.config.secret_files)
    }

    /// Resolves a path argument once, keeping the handles the tool will work on.
    pub fn resolve(&self, raw: &str) -> Result<Resolved, ToolError> {
        resolve_arg(&self.workdir, raw)
    }

    /// The searched root of ls/find/grep: the given path, or the working directory.
    pub fn resolve_root(&self, raw: Option<&str>) -> Result<Resolved, ToolError> {
        self.resolve(raw.unwrap_or("."))
    }

    /// A path as shown to the model: relative to the working directory when inside it, so it can
    /// be passed straight back to another tool, else absolute.
    pub fn display(&self, path: &Path) -> String {
        match path.strip_prefix(&self.workdir) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
            Ok(rel) => rel.to_string_lossy().into_owned(),
            Err(_) => path.to_string_lossy().into_owned(),
        }
    }
}

/// How a tool behaves, for its annotations.
#[derive(Clone, Copy)]
pub(crate) enum Behaviour {
    ReadOnly,
    Destructive,
    OpenWorld,
}

pub(crate) fn make_spec(
    ctx: &Context,
    name: &str,
    title: &str,
    description: &str,
    input_schema: Value,
    output_schema: Option<Value>,
    behaviour: Behaviour,
) -> ToolSpec {
    let annotations = match behaviour {
        Behaviour::ReadOnly => Annotations {
            title: Some(title.to_owned()),
            read_only_hint: Some(true),
            destructive_hint: Some(false),
            idempotent_hint: Some(true),
            open_world_hint: Some(false),
        },
        Behaviour::Destructive => Annotations {
            title: Some(title.to_owned()),
            read_only_hint: Some(false),
            destructive_hint: Some(true),
            idempotent_hint: Some(false),
            open_world_hint: Some(false),
        },
        Behaviour::OpenWorld => Annotations {
            title: Some(title.to_owned()),
            read_only_hint: Some(false),
            destructive_hint: Some(true),
            idempotent_hint: Some(false),
            open_world_hint: Some(true),
        },
    };
    ToolSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        input_schema: input_schema.into(),
        output_schema: output_schema.map(Into::into),
        namespace: None,
        annotations,
        exposure: ctx.config.exposure,
        kind: CallKind::Tool,
    }
}

/// A text result: the script gets the string, a direct call shows it as plain text.
pub(crate) fn text_output(text: String) -> ToolOutput {
    ToolOutput {
        content: Some(vec![ContentBlock::Text { text: text.clone() }]),
        value: Value::String(text),
        is_error: false,
        usage: None,
        held: Default::default(),
    }
}

/// A structured result: the script gets `value`, a direct call shows `text`, written for a reader.
pub(crate) fn structured_output(value: Value, text: String) -> ToolOutput {
    ToolOutput {
        content: Some(vec![ContentBlock::Text { text }]),
        value,
        is_error: false,
        usage: None,
        held: Default::default(),
    }
}

/// Set when the call is cancelled, so long walks stop early instead of finishing for nobody.
#[derive(Clone, Default)]
pub(crate) struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
    pub(crate) fn set(&self) {
        self.0.store(true, Ordering::Relaxed)
    }
}

/// Runs file-system work on the blocking pool so it never stalls the async runtime, and returns
/// as soon as the call is cancelled.
pub(crate) async fn run_blocking<T, F>(cancel: CancellationToken, work: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce(StopFlag) -> Result<T, ToolError> + Send + 'static,
{
    if cancel.is_cancelled() {
        return Err(ToolError::cancelled());
    }
    let stop = StopFlag::default();
    let task = tokio::task::spawn_blocking({
        let stop = stop.clone();
        move || work(stop)
    });
    tokio::select! {
        biased;
        _ = cancel.cancelled() => {
            stop.set();
            Err(ToolError::cancelled())
        }
        joined = task => joined.map_err(|e| ToolError::failed(format!("the tool's worker stopped unexpectedly: {e}")))?,
    }
}

/// Runs a change to the file system on the blocking pool. Cancellation is honoured only before
/// the change starts: once a write is under way it finishes, so the caller is never told
/// "cancelled" about a file that was in fact changed.
pub(crate) async fn run_change<T, F>(cancel: CancellationToken, work: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ToolError> + Send + 'static,
{
    if cancel.is_cancelled() {
        return Err(ToolError::cancelled());
    }
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ToolError::failed(format!("the tool's worker stopped unexpectedly: {e}")))?
}

/// Describes an I/O error on a path in words that say what to do.
pub(crate) fn io_error(action: &str, path: &Path, err: &std::io::Error) -> ToolError {
    use std::io::ErrorKind;
    let hint = match err.kind() {
        ErrorKind::NotFound => "; check the path (ls or find can show what exists)",
        ErrorKind::PermissionDenied => "; the process lacks permission for this path",
        _ => "",
    };
    ToolError::failed(format!("cannot {action} {}: {err}{hint}", path.display()))
}

/// The first `max` characters of `s`, with how much was left out: error messages never echo a
/// huge argument back.
pub(crate) fn preview(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((at, _)) => format!("{}… ({} bytes in all)", &s[..at], s.len()),
    }
}
