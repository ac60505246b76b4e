//! What the gate keeps out of every tool's reach, whatever the policy permits: every file the
//! configuration reads or runs. A script that could rewrite a policy file, a hook's program or
//! the state database would change what the next call (or run) is allowed to do, so protecting
//! only the configuration directories is not enough: a setting may point anywhere.

use std::path::{Path, PathBuf};

use codemode_config::mcp::ServerTransport;
use codemode_config::{Configuration, Sources};
use codemode_gate::ProtectedPath;
use codemode_state::StateUrl;

/// Every path to protect for `config`, read from `sources`, with hooks and servers resolving
/// relative programs against the directory each starts in (`workdir` when none is recorded).
pub(crate) fn configuration_paths(
    config: &Configuration,
    sources: &Sources,
    workdir: &Path,
) -> Vec<ProtectedPath> {
    let mut out = vec![
        ProtectedPath::new(
            workdir.join(".codemode"),
            "the project's codemode configuration",
        ),
        ProtectedPath::new(&sources.paths.config_dir, "your codemode configuration"),
        // The audit key, cells and their replay logs, paused approvals, budget ledgers and
        // `store()` values: wiping them would erase history and reset budgets.
        ProtectedPath::new(&sources.paths.state_dir, "codemode's state"),
    ];
    let settings = &config.settings;
    for file in sources.mcp_file.iter().chain(&sources.models_file) {
        out.push(ProtectedPath::new(
            file,
            "a configuration file codemode reads",
        ));
    }
    for policy in &settings.policies.sources {
        out.push(ProtectedPath::new(&policy.name, "a policy file in force"));
    }
    for url in [
        settings.state_url.as_deref(),
        Some(&settings.durable.state_url),
    ]
    .into_iter()
    .flatten()
    {
        if let Ok(StateUrl::Sqlite(db)) = StateUrl::parse(url) {
            out.extend(sqlite_files(&db).into_iter().map(|f| {
                ProtectedPath::new(f, "codemode's state database (audit, budgets, cells)")
            }));
        }
    }
    let hooks = &settings.hooks;
    for hook in hooks
        .pre_tool_use
        .iter()
        .chain(&hooks.post_tool_use)
        .flat_map(|m| &m.hooks)
    {
        let start = hook.start_dir.as_deref().unwrap_or(workdir);
        for file in files_named(hook.command.split_whitespace(), start) {
            out.push(ProtectedPath::new(file, "a program a hook runs"));
        }
    }
    for server in config.mcp.servers() {
        let project = server.project_dir.as_deref().unwrap_or(workdir);
        let lookup = |name: &str| match name {
            codemode_childenv::PROJECT_DIR_VAR => Some(project.display().to_string()),
            _ => std::env::var(name).ok(),
        };
        let Ok(ServerTransport::Stdio {
            command, args, cwd, ..
        }) = server.transport.expanded(&lookup)
        else {
            continue;
        };
        // Where the server starts (as the MCP client decides it), which relative names are
        // relative to.
        let start = server.start_dir.as_deref().unwrap_or(workdir);
        let base = cwd.map_or_else(|| start.to_path_buf(), |c| start.join(c));
        let words = std::iter::once(command.as_str()).chain(args.iter().map(String::as_str));
        for file in files_named(words, &base) {
            out.push(ProtectedPath::new(
                file,
                format!("a program MCP server `{}` runs", server.name),
            ));
        }
    }
    out
}

/// The database file and the companions SQLite writes beside it.
fn sqlite_files(db: &Path) -> Vec<PathBuf> {
    let mut out = vec![db.to_path_buf()];
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        out.push(PathBuf::from(name));
    }
    out
}

/// The words that name an existing regular file, relative ones against `base`. Directories are
/// left out on purpose: a server's arguments often name the directories it serves (the
/// workspace), which tools must still write in. Words looked up on `PATH` (`node`, `npx`) are
/// the system's programs, not the configuration's.
fn files_named<'a>(words: impl Iterator<Item = &'a str>, base: &Path) -> Vec<PathBuf> {
    words
        .map(|w| w.trim_matches(|c| c == '"' || c == '\''))
        .filter(|w| !w.is_empty() && !w.starts_with('-'))
        .map(|w| base.join(w))
        .filter(|p| p.is_file())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_named_keeps_existing_files_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("hook.sh"), "#!/bin/sh\n").expect("write");
        std::fs::create_dir(dir.path().join("served")).expect("mkdir");
        let words = [
            "python3",
            "./hook.sh",
            "'hook.sh'",
            "served",
            "--flag",
            "missing.py",
        ];
        let files = files_named(words.into_iter(), dir.path());
        assert_eq!(
            files,
            vec![dir.path().join("./hook.sh"), dir.path().join("hook.sh")]
        );
    }

    #[test]
    fn sqlite_companions_are_listed() {
        let files = sqlite_files(Path::new("/s/state.db"));
        let names: Vec<_> = files.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            names,
            [
                "/s/state.db",
                "/s/state.db-wal",
                "/s/state.db-shm",
                "/s/state.db-journal"
            ]
        );
    }
}
