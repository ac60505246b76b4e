//! Turning a path argument into the one real path a call touches.

use std::path::{Path, PathBuf};

use codemode_spec::ToolError;

use crate::fs::{Resolved, resolve};

/// Longest path argument accepted, as Linux's `PATH_MAX`.
const MAX_PATH_BYTES: usize = 4096;

/// Resolves a path argument to an absolute path with `..` applied and every symlink resolved.
///
/// Relative paths are taken relative to `workdir`; `~` and `~/…` mean the home directory. For a path
/// that does not exist yet (a file `write` is about to create), the deepest existing ancestor is
/// resolved and the rest appended, so the result names where the file would land. `..` is applied
/// to the already-resolved prefix, which is how the kernel applies it, so `link/..` means the
/// parent of the link's target.
pub fn resolve_path(workdir: &Path, raw: &str) -> Result<PathBuf, ToolError> {
    Ok(resolve_arg(workdir, raw)?.path)
}

/// Resolves a path argument and keeps the handles opened on the way (see [`Resolved`]): the
/// tools work on these handles, never on the path again.
pub(crate) fn resolve_arg(workdir: &Path, raw: &str) -> Result<Resolved, ToolError> {
    if raw.is_empty() {
        return Err(ToolError::invalid(
            "the path is empty; give a file or directory path, relative to the working directory or absolute",
        ));
    }
    if raw.len() > MAX_PATH_BYTES {
        return Err(ToolError::invalid(format!(
            "the path is {} bytes long, more than the {MAX_PATH_BYTES} a path may have; give a shorter path",
            raw.len()
        )));
    }
    if raw.contains('\0') {
        return Err(ToolError::invalid(
            "the path contains a NUL character, which no file name can hold; remove it",
        ));
    }
    let expanded = expand_home(raw)?;
    let base = if expanded.is_absolute() {
        PathBuf::from("/")
    } else {
        absolute_workdir(workdir)?
    };
    let resolved = resolve(&base, &expanded)?;
    path_text(&resolved.path)?;
    Ok(resolved)
}

fn absolute_workdir(workdir: &Path) -> Result<PathBuf, ToolError> {
    if workdir.is_absolute() {
        return Ok(workdir.to_path_buf());
    }
    let cwd = std::env::current_dir().map_err(|e| {
        ToolError::failed(format!(
            "cannot read the current directory to place the relative working directory {}: {e}; configure an absolute workdir",
            workdir.display()
        ))
    })?;
    Ok(cwd.join(workdir))
}

/// Resolves the working directory itself: absolute, `..` applied, symlinks resolved.
pub(crate) fn resolve_workdir(workdir: &Path) -> Result<PathBuf, ToolError> {
    Ok(resolve(Path::new("/"), &absolute_workdir(workdir)?)?.path)
}

/// The resolved path as text for the policy. Non-UTF-8 paths are refused rather than mangled,
/// because a lossy conversion could make two different files look alike to a path rule.
pub(crate) fn path_text(path: &Path) -> Result<String, ToolError> {
    path.to_str().map(str::to_owned).ok_or_else(|| {
        ToolError::invalid(format!(
            "the path {} is not valid UTF-8, which path rules cannot check; rename the file or use another path",
            path.display()
        ))
    })
}

/// The facts of a call that touches one resolved path: what path rules in the policy judge.
pub(crate) fn path_facts(path: &Path) -> Result<codemode_spec::CallFacts, ToolError> {
    Ok(codemode_spec::CallFacts {
        paths: vec![path_text(path)?],
        ..Default::default()
    })
}

fn expand_home(raw: &str) -> Result<PathBuf, ToolError> {
    let rest = if raw == "~" {
        ""
    } else if let Some(rest) = raw.strip_prefix("~/") {
        rest
    } else {
        return Ok(PathBuf::from(raw));
    };
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .ok_or_else(|| {
            ToolError::invalid(
                "the path starts with ~ but HOME is not set; give an absolute path instead",
            )
        })?;
    Ok(PathBuf::from(home).join(rest))
}
