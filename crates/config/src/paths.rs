//! Where configuration and state live.
//!
//! The user's configuration directory holds `settings.json`, `mcp.json`, `models.json` and the
//! trust list; the state directory holds what codemode writes for itself (the audit log by
//! default, its key). A project's files sit in `<project>/.codemode/`. Both user directories are
//! injectable so that tests never touch a real home.

use std::path::{Path, PathBuf};

/// The user's directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigPaths {
    /// `$XDG_CONFIG_HOME/codemode`, else `$HOME/.config/codemode`.
    pub config_dir: PathBuf,
    /// `$XDG_STATE_HOME/codemode`, else `$HOME/.local/state/codemode`.
    pub state_dir: PathBuf,
}

impl ConfigPaths {
    pub fn new(config_dir: impl Into<PathBuf>, state_dir: impl Into<PathBuf>) -> Self {
        ConfigPaths {
            config_dir: config_dir.into(),
            state_dir: state_dir.into(),
        }
    }

    /// Both directories from the environment; `None` without `HOME` or the XDG variables.
    pub fn from_env() -> Option<Self> {
        Some(ConfigPaths {
            config_dir: Self::config_dir_from_env()?,
            state_dir: Self::state_dir_from_env()?,
        })
    }

    pub fn config_dir_from_env() -> Option<PathBuf> {
        xdg_dir("XDG_CONFIG_HOME", ".config")
    }

    pub fn state_dir_from_env() -> Option<PathBuf> {
        xdg_dir("XDG_STATE_HOME", ".local/state")
    }

    pub fn settings_file(&self) -> PathBuf {
        self.config_dir.join("settings.json")
    }

    pub fn mcp_file(&self) -> PathBuf {
        self.config_dir.join("mcp.json")
    }

    pub fn models_file(&self) -> PathBuf {
        self.config_dir.join("models.json")
    }

    pub fn trusted_file(&self) -> PathBuf {
        self.config_dir.join("trusted.json")
    }
}

/// `$VAR/codemode` when `VAR` is set to an absolute path (the XDG rule), else
/// `$HOME/<fallback>/codemode`.
fn xdg_dir(var: &str, fallback: &str) -> Option<PathBuf> {
    let base = std::env::var_os(var)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(fallback))
        })?;
    Some(base.join("codemode"))
}

/// A project's configuration directory and files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectPaths {
    /// The project (the working directory of the built-in tools).
    pub dir: PathBuf,
}

impl ProjectPaths {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ProjectPaths { dir: dir.into() }
    }

    /// `<project>/.codemode`: relative paths in the project's files resolve against it.
    pub fn config_dir(&self) -> PathBuf {
        self.dir.join(".codemode")
    }

    pub fn settings_file(&self) -> PathBuf {
        self.config_dir().join("settings.json")
    }

    pub fn mcp_file(&self) -> PathBuf {
        self.config_dir().join("mcp.json")
    }

    pub fn models_file(&self) -> PathBuf {
        self.config_dir().join("models.json")
    }
}

/// `path` as written in the file `listed_in`, made absolute against that file's directory.
pub fn relative_to_file(listed_in: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        return path.to_path_buf();
    }
    listed_in
        .parent()
        .map(|dir| dir.join(path))
        .unwrap_or_else(|| path.to_path_buf())
}
