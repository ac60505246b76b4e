//! Where a provider's API key comes from: an environment variable or a command's output.
//!
//! Keys are read when a call needs them (not at load time), so a key set or rotated after start-up
//! is used, and `available_of_type` reflects the environment variables present now. A key
//! command runs only for a call the gate admitted, in the directory of the models.json that
//! names it, finding programs only in `PATH` directories no program codemode starts can change.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an `apiKeyCommand` may run before it is killed.
const KEY_COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// The shell's exit status for a command it could not find.
const NOT_FOUND: i32 = 127;

/// The source of a provider's key, as the user's models.json names it.
pub(crate) enum KeySource {
    /// The provider needs no key (a local llama.cpp or Ollama server).
    None,
    /// The key is the value of this environment variable.
    Env(String),
    /// The key is the trimmed standard output of this shell command. A successful result is
    /// cached, because password managers can be slow or ask the user.
    Command {
        command: String,
        /// Where it runs: beside the user's models.json.
        dir: Option<std::path::PathBuf>,
        cached: Mutex<Option<String>>,
    },
}

/// Names the source but never prints a cached key, so logging a catalog leaks nothing.
impl std::fmt::Debug for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySource::None => f.write_str("KeySource::None"),
            KeySource::Env(var) => write!(f, "KeySource::Env({var})"),
            KeySource::Command { .. } => f.write_str("KeySource::Command(..)"),
        }
    }
}

impl KeySource {
    pub(crate) fn command(command: String, dir: Option<std::path::PathBuf>) -> Self {
        KeySource::Command {
            command,
            dir,
            cached: Mutex::new(None),
        }
    }

    /// True when no key is needed or one can be had now. A key command is not run for this:
    /// only a call the gate admitted may start it (a script listing models must not).
    pub(crate) fn is_available(&self) -> bool {
        match self {
            KeySource::None | KeySource::Command { .. } => true,
            KeySource::Env(_) => self.resolve().is_ok(),
        }
    }

    /// The key, `None` when the provider needs none, or why it cannot be had.
    pub(crate) fn resolve(&self) -> Result<Option<String>, String> {
        match self {
            KeySource::None => Ok(None),
            KeySource::Env(var) => match std::env::var(var) {
                Ok(value) if !value.trim().is_empty() => Ok(Some(value.trim().to_string())),
                _ => Err(format!(
                    "the API key is missing: set the environment variable {var}"
                )),
            },
            KeySource::Command {
                command,
                dir,
                cached,
            } => {
                if let Ok(guard) = cached.lock()
                    && let Some(key) = guard.as_ref()
                {
                    return Ok(Some(key.clone()));
                }
                let key = run_key_command(command, dir.as_deref())?;
                if let Ok(mut guard) = cached.lock() {
                    *guard = Some(key.clone());
                }
                Ok(Some(key))
            }
        }
    }
}

/// Runs `/bin/sh -c command` and returns its trimmed stdout, refusing empty output, failure or
/// a hang. Programs are looked up only in `PATH` directories the programs codemode starts
/// cannot change (see [`codemode_childenv::path_children_cannot_change`]): this command runs
/// unconfined, with the user's authority.
fn run_key_command(command: &str, dir: Option<&std::path::Path>) -> Result<String, String> {
    let mut command_line = Command::new("/bin/sh");
    command_line.arg("-c").arg(command);
    if let Some(dir) = dir {
        command_line.current_dir(dir);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let (path, left_out) = codemode_childenv::path_children_cannot_change(&path);
    command_line.env("PATH", path);
    let mut child = command_line
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("the apiKeyCommand could not be started: {e}"))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > KEY_COMMAND_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "the apiKeyCommand did not finish within {} s",
                    KEY_COMMAND_TIMEOUT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("the apiKeyCommand could not be waited on: {e}")),
        }
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        stdout
            .read_to_string(&mut out)
            .map_err(|e| format!("the apiKeyCommand printed something unreadable: {e}"))?;
    }
    if status.code() == Some(NOT_FOUND) && !left_out.is_empty() {
        let dirs: Vec<String> = left_out.iter().map(|d| d.display().to_string()).collect();
        return Err(format!(
            "the apiKeyCommand failed ({status}: a program was not found). It looks programs up \
             only in PATH directories that the programs codemode starts cannot change, and left \
             out {}, where a script's `bash` could leave a program of the same name; name the \
             program by its absolute path, or keep it beside your models.json and name it \
             `./program`",
            dirs.join(", ")
        ));
    }
    if !status.success() {
        return Err(format!("the apiKeyCommand failed ({status})"));
    }
    let key = out.trim();
    if key.is_empty() {
        return Err("the apiKeyCommand printed no key".into());
    }
    Ok(key.to_string())
}
