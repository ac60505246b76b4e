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
        for file in files_named(std::iter::once(hook.command.as_str()), start) {
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

/// The existing regular files a command line names, relative ones against `base` (or against a
/// directory the command `cd`s into). Each word is split as a shell would at spaces and
/// operators (`sh -c "exec node srv.js"`, `hook.sh</dev/null`, `cd d && ./hook.sh`), an option's
/// or assignment's value is read after its `=` (`--import=/x.js`, `FOO=/x`), and `-m module`
/// names the module's Python files. Directories are left out on purpose: a server's arguments
/// often name the directories it serves (the workspace), which tools must still write in. Words
/// looked up on `PATH` (`node`, `npx`) are the system's programs, not the configuration's.
fn files_named<'a>(words: impl Iterator<Item = &'a str>, base: &Path) -> Vec<PathBuf> {
    let tokens: Vec<&str> = words.flat_map(shell_tokens).collect();
    let mut bases = vec![base.to_path_buf()];
    for pair in tokens.windows(2) {
        if matches!(pair[0], "cd" | "pushd") {
            bases.push(base.join(pair[1]));
        }
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let mut names: Vec<String> = Vec::new();
        if !token.starts_with('-') {
            names.push(token.to_string());
        }
        if let Some((_, value)) = token.split_once('=') {
            names.push(value.to_string());
        }
        if i > 0 && tokens[i - 1] == "-m" {
            let module = token.replace('.', "/");
            for file in [".py", "/__main__.py", "/__init__.py"] {
                names.push(format!("{module}{file}"));
            }
        }
        for name in names.iter().filter(|n| !n.is_empty()) {
            for b in &bases {
                let path = b.join(name);
                if path.is_file() && !out.contains(&path) {
                    out.push(path);
                }
            }
        }
    }
    out
}

/// A word split where a shell would split it, quotes dropped.
fn shell_tokens(word: &str) -> impl Iterator<Item = &str> {
    word.split(|c: char| c.is_whitespace() || "&|;<>()`".contains(c))
        .map(|t| t.trim_matches(|c| c == '"' || c == '\''))
        .filter(|t| !t.is_empty())
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
        // `./hook.sh` and `'hook.sh'` are one file.
        assert_eq!(files, vec![dir.path().join("hook.sh")]);
    }

    /// The command forms a red-team run wrote to: each names a file that must be protected.
    #[test]
    fn files_named_sees_through_shell_syntax_options_and_modules() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        std::fs::create_dir_all(d.join("hooks")).expect("mkdir");
        std::fs::create_dir_all(d.join("pkg/srv")).expect("mkdir");
        for f in [
            "hooks/hook_cd.sh",
            "hook_redir.sh",
            "srv.js",
            "x.js",
            "srv_mod.py",
            "pkg/srv/__main__.py",
        ] {
            std::fs::write(d.join(f), "").expect("write");
        }
        let named = |words: &[&str]| files_named(words.iter().copied(), d);
        assert_eq!(
            named(&["cd hooks && ./hook_cd.sh"]),
            [d.join("hooks").join("./hook_cd.sh")]
        );
        assert_eq!(
            named(&["./hook_redir.sh</dev/null"]),
            [d.join("./hook_redir.sh")]
        );
        assert_eq!(
            named(&["sh", "-c", "exec node 'srv.js'"]),
            [d.join("srv.js")]
        );
        assert_eq!(
            named(&["node", "--import=x.js", "srv.js"]),
            [d.join("x.js"), d.join("srv.js")]
        );
        assert_eq!(named(&["python3", "-m", "srv_mod"]), [d.join("srv_mod.py")]);
        assert_eq!(
            named(&["python3", "-m", "pkg.srv"]),
            [d.join("pkg/srv/__main__.py")]
        );
        assert!(named(&["npx", "-y", "pkg", "--root", "hooks"]).is_empty());
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
