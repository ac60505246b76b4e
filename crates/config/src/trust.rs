//! Which projects the user trusts to widen their settings.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{ConfigPaths, Problem};

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrustFile {
    #[serde(default)]
    projects: Vec<PathBuf>,
}

fn canonical(project_dir: &Path) -> PathBuf {
    std::fs::canonicalize(project_dir).unwrap_or_else(|_| project_dir.to_path_buf())
}

fn read(paths: &ConfigPaths) -> Result<TrustFile, Problem> {
    let file = paths.trusted_file();
    let Some(value) = crate::jsonc::read(&file)? else {
        return Ok(TrustFile::default());
    };
    serde_json::from_value(value).map_err(|e| {
        Problem::new(
            file.display().to_string(),
            "",
            format!("{e}; expected {{\"projects\": [\"/path/to/project\"]}}"),
        )
    })
}

/// True when the user has trusted `project_dir` (compared after resolving symlinks).
/// An unreadable trust file trusts nothing.
pub fn is_trusted(paths: &ConfigPaths, project_dir: &Path) -> bool {
    let dir = canonical(project_dir);
    read(paths)
        .map(|t| t.projects.contains(&dir))
        .unwrap_or(false)
}

/// Every project the user trusts, as recorded (an unreadable trust file lists none).
pub fn trusted_projects(paths: &ConfigPaths) -> Vec<PathBuf> {
    read(paths).map(|t| t.projects).unwrap_or_default()
}

/// Records that the user trusts `project_dir`. The file is replaced atomically.
pub fn trust(paths: &ConfigPaths, project_dir: &Path) -> Result<(), Problem> {
    let dir = canonical(project_dir);
    write_with(paths, |t| {
        if !t.projects.contains(&dir) {
            t.projects.push(dir);
        }
    })
}

/// Withdraws trust from `project_dir`.
pub fn untrust(paths: &ConfigPaths, project_dir: &Path) -> Result<(), Problem> {
    let dir = canonical(project_dir);
    write_with(paths, |t| t.projects.retain(|p| *p != dir))
}

fn write_with(paths: &ConfigPaths, change: impl FnOnce(&mut TrustFile)) -> Result<(), Problem> {
    let mut t = read(paths)?;
    change(&mut t);
    let file = paths.trusted_file();
    let io = |e: std::io::Error| {
        Problem::new(
            file.display().to_string(),
            "",
            format!("cannot be written: {e}"),
        )
    };
    std::fs::create_dir_all(&paths.config_dir).map_err(io)?;
    let tmp = file.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(&t).map_err(|e| io(std::io::Error::other(e)))?;
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, &file).map_err(io)
}
