//! The user's own services that run commands on request, reached through Unix sockets.
//!
//! Confinement gives a program its own mount namespace, but a socket connects it to a process
//! outside: `tmux run-shell`, `screen -X exec`, `systemd-run --user` (through the user manager's
//! private socket or the session bus) start a command as the user, unconfined, that can read
//! the audit key. Their sockets are hidden from confined programs like the key is. A service
//! started after codemode, in a directory that did not exist then, is not covered. A bus on an
//! abstract socket (`unix:abstract=`), which no file names, is kept out of reach by the
//! confinement's Landlock scope instead, where the kernel has it
//! ([`crate::scopes_abstract_sockets`]).

use std::ffi::OsString;
use std::path::PathBuf;

/// Where the usual command-running services keep their sockets for this user, as this
/// process's environment says; paths that do not exist are the caller's to skip.
pub fn service_sockets() -> Vec<PathBuf> {
    service_sockets_in(|name| std::env::var_os(name))
}

fn service_sockets_in(var: impl Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let absolute = |p: PathBuf| p.is_absolute().then_some(p);
    let mut sockets = Vec::new();
    if let Some(runtime) = var("XDG_RUNTIME_DIR").map(PathBuf::from).and_then(absolute) {
        // systemd's user manager, and the session bus it also listens on.
        sockets.push(runtime.join("systemd"));
        sockets.push(runtime.join("bus"));
    }
    if let Some(address) = var("DBUS_SESSION_BUS_ADDRESS") {
        let address = address.to_string_lossy().into_owned();
        sockets.extend(
            address
                .split(';')
                .flat_map(|a| a.split(','))
                .filter_map(|part| part.split_once(':').map(|(_, kv)| kv).or(Some(part)))
                .filter_map(|kv| kv.strip_prefix("path="))
                .map(PathBuf::from)
                .filter_map(absolute),
        );
    }
    // tmux: its socket directory, and the one the `TMUX` variable of a pane names.
    let tmux_tmp = var("TMUX_TMPDIR")
        .map(PathBuf::from)
        .and_then(absolute)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    sockets.push(tmux_tmp.join(format!("tmux-{uid}")));
    if let Some(tmux) = var("TMUX") {
        let tmux = tmux.to_string_lossy().into_owned();
        if let Some(socket) = tmux.split(',').next().map(PathBuf::from).and_then(absolute) {
            sockets.extend(socket.parent().map(PathBuf::from));
        }
    }
    // GNU screen.
    match var("SCREENDIR").map(PathBuf::from).and_then(absolute) {
        Some(dir) => sockets.push(dir),
        None => {
            if let Some(user) = var("USER").or_else(|| var("LOGNAME")) {
                let mut name = OsString::from("S-");
                name.push(user);
                sockets.push(PathBuf::from("/run/screen").join(name));
            }
        }
    }
    sockets.sort();
    sockets.dedup();
    sockets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_follow_the_environment() {
        let env = |name: &str| {
            let value = match name {
                "XDG_RUNTIME_DIR" => "/run/user/1000",
                "DBUS_SESSION_BUS_ADDRESS" => {
                    "unix:path=/run/user/1000/bus2,guid=x;unix:abstract=/tmp/dbus-x"
                }
                "TMUX_TMPDIR" => "/var/tmux",
                "TMUX" => "/elsewhere/tmux-1000/default,1234,0",
                "USER" => "ada",
                _ => return None,
            };
            Some(OsString::from(value))
        };
        let sockets = service_sockets_in(env);
        for expected in [
            "/run/user/1000/systemd",
            "/run/user/1000/bus",
            "/run/user/1000/bus2",
            "/elsewhere/tmux-1000",
            "/run/screen/S-ada",
        ] {
            assert!(
                sockets.contains(&PathBuf::from(expected)),
                "{expected}: {sockets:?}"
            );
        }
        assert!(
            sockets.iter().any(|s| s.starts_with("/var/tmux/")),
            "{sockets:?}"
        );
        assert!(
            !sockets
                .iter()
                .any(|s| s.to_string_lossy().contains("abstract"))
        );
        // Relative values name nothing.
        let relative = |name: &str| (name == "XDG_RUNTIME_DIR").then(|| OsString::from("run"));
        assert!(
            !service_sockets_in(relative)
                .iter()
                .any(|s| s.starts_with("run"))
        );
    }
}
