//! Attacks on the confinement of the programs codemode starts: a command running as this
//! process's user tries every way we know to read the hidden key or change a read-only file.
//! The plan is process-wide, so this file is its own process and every test adds its own
//! temporary paths.

use std::path::{Path, PathBuf};
use std::process::Command;

const SECRET: &str = "5ecret-key-bytes-0123456789abcdef";

struct Home {
    _dir: tempfile::TempDir,
    root: PathBuf,
    state: PathBuf,
    key: PathBuf,
    config: PathBuf,
    work: PathBuf,
}

/// A state directory with a key, a configuration file, and a working directory beside them,
/// confined; `None` (with a line saying so) where the kernel does not allow confinement.
fn home() -> Option<Home> {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().canonicalize().expect("canonical");
    let state = root.join("state");
    let config = root.join("config");
    let work = root.join("work");
    for d in [&state, &config, &work] {
        std::fs::create_dir(d).expect("mkdir");
    }
    let key = state.join("audit.key");
    std::fs::write(&key, SECRET).expect("key");
    std::fs::write(
        config.join("policy.cedar"),
        "permit(principal, action, resource);",
    )
    .expect("policy");
    match codemode_childenv::confine_children([key.clone()], [state.clone(), config.clone()]) {
        Ok(()) => {}
        Err(why) => {
            eprintln!("SKIPPED: confinement is unavailable here: {why}");
            return None;
        }
    }
    Some(Home {
        _dir: dir,
        root,
        state,
        key,
        config,
        work,
    })
}

/// Runs `script` with bash, confined, in `cwd`; returns (exit code, stdout and stderr).
fn run(cwd: &Path, script: &str, vars: &[(&str, &Path)]) -> (Option<i32>, String) {
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(script).current_dir(cwd);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    codemode_childenv::confine(&mut cmd).expect("confine");
    let out = cmd.output().expect("bash runs confined");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

fn vars(h: &Home) -> Vec<(&'static str, &Path)> {
    vec![
        ("KEY", h.key.as_path()),
        ("STATE", h.state.as_path()),
        ("CONFIG", h.config.as_path()),
        ("ROOT", h.root.as_path()),
    ]
}

#[test]
fn the_key_cannot_be_read_by_name_copy_or_link() {
    let Some(h) = home() else { return };
    let (_, out) = run(
        &h.work,
        r#"cat "$KEY"; cp "$KEY" copy && cat copy; ln "$KEY" link && cat link;
           ln -s "$KEY" sym && cat sym; (cd "$STATE" && cat audit.key); cat "$STATE"/*;
           dd if="$KEY" 2>&1; head -c 100 < "$KEY"; echo done"#,
        &vars(&h),
    );
    assert!(out.contains("done"), "the script ran to its end: {out}");
    assert!(!out.contains(SECRET), "the key leaked: {out}");
    assert!(
        out.contains("Permission denied"),
        "opening the key is refused: {out}"
    );
    // Outside the confinement the key is still there, unchanged.
    assert_eq!(std::fs::read_to_string(&h.key).unwrap(), SECRET);
}

#[test]
fn other_processes_proc_entries_do_not_show_the_host_files() {
    let Some(h) = home() else { return };
    // This test process runs as the same user, unconfined: its /proc entry is the obvious door.
    let (_, out) = run(
        &h.work,
        r#"for p in /proc/[0-9]*; do cat "$p/root$KEY" 2>/dev/null; cat "$p/cwd/../state/audit.key" 2>/dev/null; done;
           cat "/proc/$PPID/root$KEY"; ls "/proc/$PPID/fd" >/dev/null; echo done"#,
        &vars(&h),
    );
    assert!(out.contains("done"), "{out}");
    assert!(!out.contains(SECRET), "the key leaked through /proc: {out}");
}

#[test]
fn the_cover_cannot_be_removed_or_bypassed_with_namespaces() {
    let Some(h) = home() else { return };
    let (_, out) = run(
        &h.work,
        r#"umount "$KEY"; umount -l "$KEY"; umount "$STATE"; cat "$KEY";
           unshare -Urm bash -c 'umount "$KEY"; umount -l "$KEY"; cat "$KEY";
             mkdir -p /tmp/cm-peek; mount --bind "$STATE" /tmp/cm-peek && cat /tmp/cm-peek/audit.key;
             mount --bind / /tmp/cm-peek && cat "/tmp/cm-peek$KEY";
             mount --bind "$ROOT" /tmp/cm-peek && cat /tmp/cm-peek/state/audit.key';
           echo done"#,
        &vars(&h),
    );
    assert!(out.contains("done"), "{out}");
    assert!(!out.contains(SECRET), "the key was uncovered: {out}");
}

#[test]
fn configuration_and_state_are_read_only_and_the_workspace_is_not() {
    let Some(h) = home() else { return };
    let policy = h.config.join("policy.cedar");
    let before = std::fs::read_to_string(&policy).unwrap();
    let (_, out) = run(
        &h.work,
        r#"echo 'forbid(principal, action, resource);' >> "$CONFIG/policy.cedar";
           rm -f "$CONFIG/policy.cedar"; mv "$CONFIG/policy.cedar" "$CONFIG/old";
           touch "$CONFIG/new.toml" "$STATE/new"; echo x > "$KEY"; rm -f "$KEY";
           chmod 777 "$CONFIG"; echo written > notes.txt; cat notes.txt; echo done"#,
        &vars(&h),
    );
    assert!(
        out.contains("written"),
        "the workspace stays writable: {out}"
    );
    assert!(out.contains("Read-only file system"), "{out}");
    assert_eq!(std::fs::read_to_string(&policy).unwrap(), before);
    assert!(!h.config.join("new.toml").exists() && !h.config.join("old").exists());
    assert!(!h.state.join("new").exists());
    assert_eq!(std::fs::read_to_string(&h.key).unwrap(), SECRET);
    assert_eq!(
        std::fs::read_to_string(h.work.join("notes.txt")).unwrap(),
        "written\n"
    );
}

#[test]
fn a_working_directory_inside_a_read_only_path_is_read_only_too() {
    // The child entered its directory before the mounts; it must not keep a door to the
    // writable file system beneath them.
    let Some(h) = home() else { return };
    let (_, out) = run(&h.state, "echo x > inside; echo done", &vars(&h));
    assert!(out.contains("done"), "{out}");
    assert!(
        !h.state.join("inside").exists(),
        "wrote beneath the mount: {out}"
    );
}

#[test]
fn a_burst_of_confined_programs_from_many_threads_all_hold() {
    let Some(h) = home() else { return };
    let work = h.work.clone();
    let handles: Vec<_> = (0..16)
        .map(|_| {
            let work = work.clone();
            let key = h.key.clone();
            std::thread::spawn(move || {
                (0..8)
                    .map(|_| run(&work, r#"cat "$KEY"; echo done"#, &[("KEY", key.as_path())]).1)
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for handle in handles {
        for out in handle.join().expect("thread") {
            assert!(out.contains("done"), "{out}");
            assert!(
                !out.contains(SECRET),
                "a confined program read the key: {out}"
            );
        }
    }
}

#[test]
fn a_covered_path_cannot_be_moved_aside_with_a_directory_above_it() {
    // Moving `~/.config` away would leave the read-only configuration under the old name and
    // let a writable one take its place for the next run.
    let Some(h) = home() else { return };
    let (_, out) = run(
        &h.work,
        r#"mv "$CONFIG" "$ROOT/config.old"; mv "$STATE" "$ROOT/state.old";
           mv "$ROOT" "$ROOT.moved"; mkdir -p "$CONFIG" && echo evil > "$CONFIG/policy.cedar";
           echo done"#,
        &vars(&h),
    );
    assert!(out.contains("done"), "{out}");
    assert!(out.contains("busy"), "the moves are refused as busy: {out}");
    assert!(h.root.exists() && !h.root.join("config.old").exists());
    assert_eq!(
        std::fs::read_to_string(h.config.join("policy.cedar")).unwrap(),
        "permit(principal, action, resource);"
    );
    assert!(h.state.join("audit.key").exists());
}

#[test]
fn a_directory_between_two_read_only_paths_stays_read_only() {
    // The directories above a read-only file are pinned with writable mounts; one inside a
    // read-only directory must not be, or it would be a writable hole in it.
    let Some(h) = home() else { return };
    let nested = h.config.join("hooks");
    std::fs::create_dir(&nested).unwrap();
    std::fs::write(nested.join("check.sh"), "exit 0").unwrap();
    codemode_childenv::confine_children([], [nested.join("check.sh")]).unwrap();
    let (_, out) = run(
        &h.work,
        r#"touch "$CONFIG/hooks/new"; mv "$CONFIG/hooks/check.sh" "$CONFIG/hooks/x"; echo done"#,
        &vars(&h),
    );
    assert!(out.contains("done"), "{out}");
    assert!(
        !nested.join("new").exists(),
        "wrote inside the read-only directory: {out}"
    );
    assert!(nested.join("check.sh").exists());
}

#[test]
fn a_symlink_on_the_way_to_a_covered_path_cannot_be_repointed() {
    // `~/.config -> dotfiles/config`, and `dotfiles` a link too: repointing either would let a
    // command choose the configuration (or the key) codemode reads in its next run.
    let Some(h) = home() else { return };
    let user = h.root.join("user");
    let real = h.root.join("elsewhere/config");
    std::fs::create_dir_all(real.join("codemode")).unwrap();
    std::fs::write(real.join("codemode/settings.json"), "{}").unwrap();
    std::fs::create_dir_all(&user).unwrap();
    std::os::unix::fs::symlink("../elsewhere", user.join("dotfiles")).unwrap();
    std::os::unix::fs::symlink("dotfiles/config", user.join(".config")).unwrap();
    let named = user.join(".config/codemode");
    codemode_childenv::confine_children([], [named.clone()]).unwrap();
    let evil = h.root.join("evil");
    std::fs::create_dir_all(evil.join("config/codemode")).unwrap();
    std::fs::write(evil.join("config/codemode/settings.json"), "evil").unwrap();
    let (_, out) = run(
        &h.work,
        r#"cd "$USERDIR";
           ln -sfn "$EVIL/config" .config; rm -f .config; mv .config .config.old;
           ln -sfn "$EVIL" dotfiles; rm -f dotfiles; mv dotfiles dotfiles.old;
           mv "$USERDIR" "$USERDIR.moved";
           echo evil > .config/codemode/settings.json;
           touch .config/new-file; echo done"#,
        &[("USERDIR", user.as_path()), ("EVIL", evil.as_path())],
    );
    assert!(out.contains("done"), "{out}");
    assert!(out.contains("busy"), "the links are busy: {out}");
    assert_eq!(
        std::fs::read_link(user.join(".config")).ok(),
        Some(PathBuf::from("dotfiles/config")),
        "{out}"
    );
    assert_eq!(
        std::fs::read_link(user.join("dotfiles")).ok(),
        Some(PathBuf::from("../elsewhere")),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(named.join("settings.json")).unwrap(),
        "{}"
    );
    // The directory holding the links stays usable: only the links are kept.
    let (_, out) = run(
        &h.work,
        r#"cd "$USERDIR" && echo mine > notes && ln -s notes notes.link && rm notes.link && cat notes"#,
        &[("USERDIR", user.as_path())],
    );
    assert!(out.contains("mine"), "{out}");
}

/// A service of the user's on an abstract socket (a D-Bus session bus at `unix:abstract=`, an
/// X server's `@/tmp/.X11-unix/X0`) has no file to hide, and one that runs commands would run
/// them outside. Where the kernel scopes abstract sockets (Landlock ABI 6, Linux 6.12), a
/// confined program cannot connect to one made outside its domain; its own still work.
#[test]
fn a_service_on_an_abstract_socket_outside_cannot_be_reached() {
    use std::io::Write;
    use std::os::linux::net::SocketAddrExt;
    let Some(h) = home() else { return };
    let name = format!("codemode-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut conn = conn;
            let _ = conn.write_all(b"the service answered\n");
        }
    });
    let connect = |cmd: &mut Command| {
        cmd.arg("-MIO::Socket::UNIX")
            .arg("-e")
            .arg(r#"my $s = IO::Socket::UNIX->new(Peer => "\0$ARGV[0]", Type => SOCK_STREAM) or die "refused: $!\n"; print scalar <$s>;"#)
            .arg(&name);
    };
    // Unconfined, the service answers: the test reaches it.
    let mut plain = Command::new("perl");
    connect(&mut plain);
    let out = plain.output().expect("perl runs");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "the service answered\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut confined = Command::new("perl");
    connect(&mut confined);
    confined.current_dir(&h.work);
    codemode_childenv::confine(&mut confined).expect("confine");
    let out = confined.output().expect("perl runs confined");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !codemode_childenv::scopes_abstract_sockets() {
        eprintln!("SKIPPED: this kernel does not scope abstract sockets (Landlock ABI 6): {said}");
        return;
    }
    assert!(!said.contains("answered"), "{said}");
    assert!(said.contains("refused"), "{said}");
    // Its own abstract sockets still work: a program and its children talk as before.
    let (code, text) = run(
        &h.work,
        r#"perl -MIO::Socket::UNIX -e '
            my $l = IO::Socket::UNIX->new(Local => "\0cm-own-$$", Type => SOCK_STREAM, Listen => 1) or die "listen: $!\n";
            if (fork() == 0) { my $c = IO::Socket::UNIX->new(Peer => "\0cm-own-" . getppid(), Type => SOCK_STREAM) or die "child: $!\n"; print $c "hello\n"; exit 0 }
            my $a = $l->accept; print scalar <$a>; wait;'"#,
        &[],
    );
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(text, "hello\n");
}
