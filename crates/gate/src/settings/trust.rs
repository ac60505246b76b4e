//! Which projects the user trusts to widen their settings.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{SettingsError, SettingsPaths};

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrustFile {
    #[serde(default)]
    projects: Vec<PathBuf>,
}

fn canonical(project_dir: &Path) -> PathBuf {
    std::fs::canonicalize(project_dir).unwrap_or_else(|_| project_dir.to_path_buf())
}

fn read(paths: &SettingsPaths) -> Result<TrustFile, SettingsError> {
    let file = paths.trusted_file();
    match std::fs::read_to_string(&file) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| SettingsError::Parse {
            file: file.display().to_string(),
            message: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TrustFile::default()),
        Err(e) => Err(SettingsError::Io {
            file: file.display().to_string(),
            message: e.to_string(),
        }),
    }
}

/// True when the user has trusted `project_dir` (compared after resolving symlinks).
/// An unreadable trust file trusts nothing.
pub fn is_trusted(paths: &SettingsPaths, project_dir: &Path) -> bool {
    let dir = canonical(project_dir);
    read(paths)
        .map(|t| t.projects.contains(&dir))
        .unwrap_or(false)
}

/// Records that the user trusts `project_dir`. The file is replaced atomically.
pub fn trust(paths: &SettingsPaths, project_dir: &Path) -> Result<(), SettingsError> {
    write_with(paths, |t| {
        let dir = canonical(project_dir);
        if !t.projects.contains(&dir) {
            t.projects.push(dir);
        }
    })
}

/// Withdraws trust from `project_dir`.
pub fn untrust(paths: &SettingsPaths, project_dir: &Path) -> Result<(), SettingsError> {
    let dir = canonical(project_dir);
    write_with(paths, |t| t.projects.retain(|p| *p != dir))
}

fn write_with(
    paths: &SettingsPaths,
    change: impl FnOnce(&mut TrustFile),
) -> Result<(), SettingsError> {
    let mut t = read(paths)?;
    change(&mut t);
    let file = paths.trusted_file();
    let io = |e: std::io::Error| SettingsError::Io {
        file: file.display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(&paths.user_dir).map_err(io)?;
    let tmp = file.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(&t).unwrap_or_default();
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, &file).map_err(io)
}
