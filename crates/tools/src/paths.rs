//! Turning a path argument into the one real path a call touches.

use std::path::{Component, Path, PathBuf};

use codemode_spec::ToolError;

/// Most symlinks followed while resolving one path, as Linux's own limit; more means a loop.
const MAX_SYMLINK_HOPS: u32 = 40;

/// Resolves a path argument to an absolute path with `..` applied and every symlink resolved.
///
/// Relative paths are taken relative to `workdir`; `~` and `~/…` mean the home directory. For a path
/// that does not exist yet (a file `write` is about to create), the deepest existing ancestor is
/// resolved and the rest appended, so the result names where the file would land. `..` is applied
/// to the already-resolved prefix, which is how the kernel applies it, so `link/..` means the
/// parent of the link's target. The tools operate on the returned path, never on the raw one, which
/// is why a path rule that checks this path cannot be bypassed.
pub fn resolve_path(workdir: &Path, raw: &str) -> Result<PathBuf, ToolError> {
    if raw.is_empty() {
        return Err(ToolError::invalid(
            "the path is empty; give a file or directory path, relative to the working directory or absolute",
        ));
    }
    if raw.contains('\0') {
        return Err(ToolError::invalid(
            "the path contains a NUL character, which no file name can hold; remove it",
        ));
    }
    let expanded = expand_home(raw)?;
    let mut hops = 0;
    if expanded.is_absolute() {
        resolve_from(PathBuf::from("/"), &expanded, &mut hops)
    } else {
        let base = resolve_workdir(workdir)?;
        resolve_from(base, &expanded, &mut hops)
    }
}

/// Resolves the working directory itself: absolute, `..` applied, symlinks resolved.
pub(crate) fn resolve_workdir(workdir: &Path) -> Result<PathBuf, ToolError> {
    let absolute = if workdir.is_absolute() {
        workdir.to_path_buf()
    } else {
        let cwd = std::env::current_dir().map_err(|e| {
            ToolError::failed(format!(
                "cannot read the current directory to place the relative working directory {}: {e}; configure an absolute workdir",
                workdir.display()
            ))
        })?;
        cwd.join(workdir)
    };
    let mut hops = 0;
    resolve_from(PathBuf::from("/"), &absolute, &mut hops)
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
        model: None,
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

/// Applies `rel` component by component on top of `base`, which is already resolved.
fn resolve_from(mut current: PathBuf, rel: &Path, hops: &mut u32) -> Result<PathBuf, ToolError> {
    for component in rel.components() {
        match component {
            Component::Prefix(_) | Component::CurDir => {}
            Component::RootDir => current = PathBuf::from("/"),
            // `current` is resolved, so popping it is the kernel's meaning of `..`.
            Component::ParentDir => {
                current.pop();
            }
            Component::Normal(name) => {
                current.push(name);
                current = follow_symlink(current, hops)?;
            }
        }
    }
    Ok(current)
}

/// If `path` (whose parent is resolved) is a symlink, replaces it with its resolved target.
/// Dangling links resolve too: writing through one creates its target, so the target is what the
/// call touches.
fn follow_symlink(path: PathBuf, hops: &mut u32) -> Result<PathBuf, ToolError> {
    let is_link = std::fs::symlink_metadata(&path)
        .map(|m| m.file_type().is_symlink())
        .unwrap_or(false);
    if !is_link {
        return Ok(path);
    }
    *hops += 1;
    if *hops > MAX_SYMLINK_HOPS {
        return Err(ToolError::invalid(format!(
            "too many symlinks while resolving {} (more than {MAX_SYMLINK_HOPS}); there is probably a symlink loop",
            path.display()
        )));
    }
    let target = std::fs::read_link(&path).map_err(|e| {
        ToolError::failed(format!("cannot read the symlink {}: {e}", path.display()))
    })?;
    let mut parent = path;
    parent.pop();
    resolve_from(parent, &target, hops)
}
