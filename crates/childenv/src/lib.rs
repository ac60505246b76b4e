//! What codemode hands to the programs it starts (the `bash` tool, command hooks,
//! stdio MCP servers): the host's environment and file system, without the secrets codemode
//! holds for itself. The file system's part is in [`confine_children`]; the environment's
//! follows.
//!
//! codemode runs with provider keys, a serve token and perhaps a state URL with a password in
//! its environment. A program it starts on a script's or a configuration's behalf must not
//! inherit them: a script could otherwise print them with `env`. Left out are
//!
//! - every `CODEMODE_*` variable (the serve token, the state URL, ...);
//! - every name [`add_secret_names`] was told about (the keys the models catalog names);
//! - names that look like secrets: a `_`-separated part ending in `TOKEN` or `KEY` (and their
//!   plurals), or containing `SECRET`, `PASSWORD`, `PASSWD`, `PASSPHRASE` or `CREDENTIAL`
//!   (`OPENAI_API_KEY`, `GITHUB_TOKEN`, `AWS_SECRET_ACCESS_KEY`, `PGPASSWORD`,
//!   `GOOGLE_APPLICATION_CREDENTIALS`);
//!
//! unless [`add_passed_names`] names them (the user's `environment.pass` setting). `PATH` loses
//! its relative entries (`.`, an empty entry, `bin`): a program looked up through one would be
//! found in whatever directory the child starts in, which may be a project's.
//!
//! The sets are process-wide and only grow: the configuration is read once at startup, and
//! hiding a variable more often than needed is safe where hiding it less is not.

mod confine;
mod services;
mod unchangeable;

pub use confine::{
    ConfinementUnavailable, confine, confine_children, confinement_gap, is_confining,
    scopes_abstract_sockets, start_failure_hint, started_confined, stop_confined_survivors,
};
pub use services::service_sockets;
pub use unchangeable::path_children_cannot_change;

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The variable through which a command hook or a stdio MCP server learns the project codemode
/// works in (they do not start there; see the README's "Where programs start").
pub const PROJECT_DIR_VAR: &str = "CODEMODE_PROJECT_DIR";

#[derive(Default)]
struct Names {
    secret: BTreeSet<String>,
    passed: BTreeSet<String>,
}

static NAMES: Mutex<Names> = Mutex::new(Names {
    secret: BTreeSet::new(),
    passed: BTreeSet::new(),
});

fn names() -> MutexGuard<'static, Names> {
    // The sets stay valid whatever a panicking holder did: they are only ever extended.
    NAMES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Variables that are secrets whatever their names look like (a models catalog's `apiKeyEnv`).
pub fn add_secret_names<I, S>(list: I)
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    names().secret.extend(list.into_iter().map(Into::into));
}

/// Variables the user wants children to get even though they look like secrets.
pub fn add_passed_names<I, S>(list: I)
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    names().passed.extend(list.into_iter().map(Into::into));
}

/// Whether `name` looks like a secret by its name alone (no configuration consulted).
pub fn looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    if upper.starts_with("CODEMODE_") {
        return true;
    }
    const INSIDE: [&str; 5] = ["SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL"];
    if INSIDE.iter().any(|w| upper.contains(w)) {
        return true;
    }
    const ENDINGS: [&str; 4] = ["TOKEN", "TOKENS", "KEY", "KEYS"];
    upper
        .split(['_', '-', '.'])
        .any(|part| ENDINGS.iter().any(|e| part.ends_with(e)))
}

/// Whether a child is denied `name`: it looks like a secret or was named one, and the user did
/// not pass it.
pub fn is_withheld(name: &str) -> bool {
    let names = names();
    if names.passed.contains(name) {
        return false;
    }
    names.secret.contains(name) || looks_secret(name)
}

/// `PATH` with its relative entries removed; `None` when nothing is left.
pub fn absolute_path(path: &OsStr) -> Option<OsString> {
    let kept: Vec<_> = std::env::split_paths(path)
        .filter(|p| p.is_absolute())
        .collect();
    if kept.is_empty() {
        return None;
    }
    std::env::join_paths(kept).ok()
}

/// The environment for a child: the host's, minus what [`is_withheld`] names, with `PATH`'s
/// relative entries removed. Start the child with `env_clear()` and then these.
pub fn vars() -> Vec<(OsString, OsString)> {
    std::env::vars_os()
        .filter_map(|(k, v)| {
            let name = k.to_str()?;
            if is_withheld(name) {
                return None;
            }
            if name == "PATH" {
                return absolute_path(&v).map(|p| (k, p));
            }
            Some((k, v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_looking_names() {
        for name in [
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "GITHUB_TOKEN",
            "GH_TOKEN",
            "NPM_TOKENS",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "PGPASSWORD",
            "DB_PASSWD",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "CLIENTSECRET",
            "CODEMODE_SERVE_TOKEN",
            "CODEMODE_STATE_URL",
            "openai_api_key",
            "MY.APIKEY",
        ] {
            assert!(looks_secret(name), "{name} should look secret");
        }
        for name in [
            "PATH",
            "HOME",
            "LANG",
            "TERM",
            "SSH_AUTH_SOCK",
            "TOKENIZERS_PARALLELISM",
            "KEYBOARD_LAYOUT",
            "PWD",
            "USER",
        ] {
            assert!(!looks_secret(name), "{name} should not look secret");
        }
    }

    #[test]
    fn named_secrets_and_passes() {
        add_secret_names(["CHILDENV_TEST_PLAIN_NAME"]);
        assert!(is_withheld("CHILDENV_TEST_PLAIN_NAME"));
        assert!(!is_withheld("CHILDENV_TEST_OTHER_NAME"));
        add_passed_names(["CHILDENV_TEST_PASSED_TOKEN"]);
        assert!(!is_withheld("CHILDENV_TEST_PASSED_TOKEN"));
        assert!(is_withheld("CHILDENV_TEST_UNPASSED_TOKEN"));
    }

    #[test]
    fn relative_path_entries_are_dropped() {
        let p = absolute_path(OsStr::new(".:/usr/bin::bin:/bin:./node_modules/.bin")).unwrap();
        assert_eq!(p, OsString::from("/usr/bin:/bin"));
        assert_eq!(absolute_path(OsStr::new(".::x")), None);
    }
}
