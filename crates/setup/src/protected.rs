//! What the gate keeps out of every tool's reach, whatever the policy permits: every file the
//! configuration reads or runs. A script that could rewrite a policy file, a hook's program or
//! the state database would change what the next call (or run) is allowed to do, so protecting
//! only the configuration directories is not enough: a setting may point anywhere.

use std::path::{Path, PathBuf};

use codemode_config::mcp::ServerTransport;
use codemode_config::{Configuration, Sources};
use codemode_gate::ProtectedPath;
use codemode_state::StateUrl;

use crate::SetupError;

/// Every path to protect for `config`, read from `sources`, with hooks and servers resolving
/// relative programs against the directory each starts in (`workdir` when none is recorded).
pub(crate) fn configuration_paths(
    config: &Configuration,
    sources: &Sources,
    workdir: &Path,
) -> Result<Vec<ProtectedPath>, SetupError> {
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
            let dir = ProtectedPath::new(
                database_dir(&db),
                "the directory of codemode's state database (audit, budgets, cells)",
            );
            let workdir = ProtectedPath::new(workdir, "").path().to_path_buf();
            let state_dir = ProtectedPath::new(&sources.paths.state_dir, "");
            if workdir.starts_with(dir.path()) && !dir.path().starts_with(state_dir.path()) {
                return Err(SetupError::StateDatabaseDir {
                    db,
                    dir: dir.path().to_path_buf(),
                    workdir,
                });
            }
            out.push(dir);
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
        // A hook runs with `$CODEMODE_PROJECT_DIR` set to the project, and codemode's own
        // environment otherwise.
        let vars = |name: &str| match name {
            codemode_childenv::PROJECT_DIR_VAR => Some(workdir.display().to_string()),
            _ => std::env::var(name).ok(),
        };
        for file in files_named(std::iter::once(hook.command.as_str()), start, &vars) {
            out.push(ProtectedPath::new(file, "a program a hook runs"));
        }
    }
    // A key command runs unconfined with your authority: every program and script it names
    // (`sh /abs/getkey.sh`, `./key.sh` beside models.json) is kept, not only its first word.
    for provider in config.models.iter().flat_map(|m| &m.providers) {
        let codemode_config::models::KeySpec::Command(command, dir) = &provider.key else {
            continue;
        };
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let base = dir.as_deref().unwrap_or(&cwd);
        let vars = |name: &str| std::env::var(name).ok();
        for file in files_named(std::iter::once(command.as_str()), base, &vars) {
            out.push(ProtectedPath::new(
                file,
                format!(
                    "a program the key command of model provider `{}` runs",
                    provider.name
                ),
            ));
        }
    }
    // Other trusted projects' configuration: written, it would be trusted there next run.
    for project in codemode_config::trust::trusted_projects(&sources.paths) {
        out.push(ProtectedPath::new(
            project.join(".codemode"),
            "a trusted project's codemode configuration",
        ));
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
        for file in files_named(words, &base, &lookup) {
            out.push(ProtectedPath::new(
                file,
                format!("a program MCP server `{}` runs", server.name),
            ));
        }
    }
    Ok(out)
}

/// The directory holding an SQLite database, all of which is kept. Its companions alone would
/// not do: a `-journal` that does not exist yet cannot be covered, and SQLite plays back a hot
/// `-journal` it finds beside the database when it opens it, WAL mode or not, so whoever could
/// create that name could write the database's pages.
fn database_dir(db: &Path) -> PathBuf {
    match db.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The existing regular files a command line names, relative ones against `base` (or against a
/// directory the command `cd`s into). Each word is split as a shell would at spaces and
/// operators (`sh -c "exec node srv.js"`, `hook.sh</dev/null`, `cd d && ./hook.sh`), `~` and
/// `$NAME`/`${NAME}` are expanded with `vars` (`$CODEMODE_PROJECT_DIR/hooks/check.sh`,
/// `~/h.sh`; a bare `cd` goes home), an option's or assignment's value is read after its `=`
/// (`--import=/x.js`, `FOO=/x`), and `-m module` names the module's Python files. Directories
/// are left out on purpose: a server's arguments often name the directories it serves (the
/// workspace), which tools must still write in. Words looked up on `PATH` (`node`, `npx`) are
/// the system's programs, not the configuration's.
fn files_named<'a>(
    words: impl Iterator<Item = &'a str>,
    base: &Path,
    vars: &dyn Fn(&str) -> Option<String>,
) -> Vec<PathBuf> {
    let tokens: Vec<String> = words
        .flat_map(shell_tokens)
        .map(|t| expand(t, vars))
        .collect();
    let home = vars("HOME").map(PathBuf::from);
    let mut bases = vec![base.to_path_buf()];
    for (i, token) in tokens.iter().enumerate() {
        if matches!(token.as_str(), "cd" | "pushd") {
            bases.extend(home.clone());
            if let Some(dir) = tokens.get(i + 1) {
                bases.push(base.join(dir));
            }
        }
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let mut names: Vec<String> = Vec::new();
        if !token.starts_with('-') {
            names.push(token.clone());
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

/// `~` at the start and `$NAME`/`${NAME}` anywhere, as the shell would expand them; a name
/// `vars` does not know is left as written.
fn expand(token: &str, vars: &dyn Fn(&str) -> Option<String>) -> String {
    let token = token.replace("\\$", "$");
    let token = match token.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => match vars("HOME") {
            Some(home) => format!("{home}{rest}"),
            None => token.clone(),
        },
        _ => token.clone(),
    };
    let mut out = String::new();
    let mut rest = token.as_str();
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, tail) = match after.strip_prefix('{') {
            Some(inner) => match inner.find('}') {
                Some(end) => (&inner[..end], &inner[end + 1..]),
                None => ("", after),
            },
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], &after[end..])
            }
        };
        match (!name.is_empty()).then(|| vars(name)).flatten() {
            Some(value) => out.push_str(&value),
            None => out.push_str(&rest[at..rest.len() - tail.len()]),
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_vars(_: &str) -> Option<String> {
        None
    }

    /// Names written with variables and `~`, as a red-team run wrote them: each program must be
    /// found.
    #[test]
    fn files_named_expands_variables_home_and_a_bare_cd() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let home = d.join("home");
        let project = d.join("project");
        std::fs::create_dir_all(home.join("srv")).expect("mkdir");
        std::fs::create_dir_all(project.join("hooks")).expect("mkdir");
        for f in ["h1.sh", "h4.sh", "srv/s3.js"] {
            std::fs::write(home.join(f), "").expect("write");
        }
        std::fs::write(project.join("hooks/check.sh"), "").expect("write");
        let (h, p) = (home.display().to_string(), project.display().to_string());
        let vars = move |name: &str| match name {
            "HOME" => Some(h.clone()),
            "CODEMODE_PROJECT_DIR" => Some(p.clone()),
            _ => None,
        };
        let named = |line: &str| files_named(std::iter::once(line), &d.join("elsewhere"), &vars);
        let check = project.join("hooks/check.sh");
        assert_eq!(
            named("$CODEMODE_PROJECT_DIR/hooks/check.sh"),
            std::slice::from_ref(&check)
        );
        assert_eq!(named("\"${CODEMODE_PROJECT_DIR}/hooks/check.sh\""), [check]);
        for line in ["$HOME/h1.sh", "${HOME}/h1.sh", "~/h1.sh"] {
            assert_eq!(named(line), [home.join("h1.sh")], "{line}");
        }
        for line in [
            "cd ~ && ./h4.sh",
            "cd && ./h4.sh",
            "cd \"$HOME\" && sh h4.sh",
            "sh -c \"cd \\$HOME; ./h4.sh\"",
        ] {
            assert_eq!(named(line), [home.join("./h4.sh")], "{line}");
        }
        assert_eq!(
            named("sh -c \"exec node $HOME/srv/s3.js stdio\""),
            [home.join("srv/s3.js")]
        );
        assert!(named("$NOT_SET/h1.sh").is_empty());
    }

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
        let files = files_named(words.into_iter(), dir.path(), &no_vars);
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
        let named = |words: &[&str]| files_named(words.iter().copied(), d, &no_vars);
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
    fn a_databases_whole_directory_is_kept() {
        assert_eq!(database_dir(Path::new("/s/state.db")), Path::new("/s"));
        assert_eq!(database_dir(Path::new("state.db")), Path::new("."));
        assert_eq!(database_dir(Path::new("data/state.db")), Path::new("data"));
    }
}
