//! The file-system view codemode hands to the programs it starts: the host's, with its secret
//! files hidden and its configuration read-only.
//!
//! The gate refuses any tool call that names the audit key or a configuration file, but a
//! program the policy lets run (`bash`, a hook, a stdio MCP server) opens files itself. It runs
//! as the same user as codemode, so without more it could read the key (and then forge the
//! audit log) or rewrite a policy file. Each such program therefore starts in a user and mount
//! namespace of its own (Linux), prepared between `fork` and `exec`:
//!
//! - every path [`confine_children`] was told to keep read-only is bound onto itself read-only,
//!   with every mount beneath it (the configuration directories, the policy files, the state
//!   directory, the audit log);
//! - every directory above those is bound onto itself, still writable, so that it is a mount
//!   point, which cannot be renamed: `mv ~/.config ~/.old` would otherwise move the read-only
//!   configuration aside and leave a writable one in its place;
//! - every hidden file is covered by `/dev/null` on a `nodev` mount, so opening it fails with
//!   "Permission denied" (a hidden directory by an empty read-only `tmpfs`);
//! - `/proc/<pid>/root` of a process outside (codemode itself, the user's shell) would show the
//!   host's file system, key included; the kernel refuses it to a process in a child user
//!   namespace, and where Landlock is available the program also joins a domain of its own,
//!   which restricts nothing it opens but keeps it out of processes outside the domain;
//! - `CAP_SYS_ADMIN` leaves the bounding set, so a program running as root inside cannot
//!   unmount what covers the key. A namespace it makes itself copies the mounts locked.
//!
//! Inside, the program's user is mapped to itself alone: files of other users show as
//! `nobody`, and set-user-id programs such as `sudo` cannot raise privileges. For a process
//! running as root this is a barrier against scripts, not a container: root can still read raw
//! disks. Run codemode as an ordinary user where that matters.
//!
//! Whether the kernel allows this is probed once, by [`confine_children`]. Where it does not
//! (unprivileged user namespaces switched off, an old kernel, another operating system) the
//! programs start unconfined and the probe's answer says why, for a startup warning. Where the
//! probe succeeded, a later failure to confine a program refuses to start it.
//!
//! The sets are process-wide and only grow, like the environment's.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Why programs cannot be confined on this system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfinementUnavailable(pub String);

impl std::fmt::Display for ConfinementUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Default)]
struct Plan {
    read_only: BTreeSet<PathBuf>,
    hidden: BTreeSet<PathBuf>,
    /// Symlinks met on the way to those paths, each named through its resolved directory.
    links: BTreeSet<PathBuf>,
}

static PLAN: Mutex<Plan> = Mutex::new(Plan {
    read_only: BTreeSet::new(),
    hidden: BTreeSet::new(),
    links: BTreeSet::new(),
});

/// The probe's answer, once asked: whether programs can be confined here.
static PROBED: OnceLock<Result<(), ConfinementUnavailable>> = OnceLock::new();

fn plan() -> std::sync::MutexGuard<'static, Plan> {
    PLAN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Hides `hidden` from every program codemode starts from now on and makes `read_only`
/// unwritable for them. Paths are resolved now (symlinks followed); a path that does not exist
/// is left out, since there is nothing to cover yet. Every symlink on the way is kept as it is
/// too: repointed, it would choose what codemode reads there in its next run.
///
/// Returns why confinement is unavailable on this system, if it is (asked once per process):
/// programs then start unconfined, and the caller should say so.
pub fn confine_children<H, R>(hidden: H, read_only: R) -> Result<(), ConfinementUnavailable>
where
    H: IntoIterator<Item = PathBuf>,
    R: IntoIterator<Item = PathBuf>,
{
    {
        let mut plan = plan();
        let hidden: Vec<PathBuf> = hidden.into_iter().collect();
        let read_only: Vec<PathBuf> = read_only.into_iter().collect();
        let links: Vec<PathBuf> = hidden
            .iter()
            .chain(&read_only)
            .flat_map(|p| links_on_the_way(p))
            .collect();
        plan.links.extend(links);
        plan.hidden
            .extend(hidden.iter().filter_map(|p| p.canonicalize().ok()));
        plan.read_only
            .extend(read_only.iter().filter_map(|p| p.canonicalize().ok()));
    }
    PROBED.get_or_init(imp::probe).clone()
}

/// Whether confined programs are kept from abstract sockets made outside their confinement
/// (Landlock ABI 6, Linux 6.12 or later). Without it, a service of the user's on one (a D-Bus
/// session bus at `unix:abstract=`) is within their reach.
pub fn scopes_abstract_sockets() -> bool {
    is_confining() && imp::scopes_abstract_sockets()
}

/// A sentence to add to the error of a program that did not start while confinement is on:
/// entering it may be what failed, and the user can turn it off.
pub fn start_failure_hint() -> &'static str {
    match is_confining() {
        true => {
            " (it starts confined in a user and mount namespace of its own; if that is what failed, `\"environment\": {\"confine\": false}` in your settings starts it unconfined)"
        }
        false => "",
    }
}

/// What confinement leaves open on this system although it works, for a startup warning:
/// without Landlock (Linux before 5.13, or not among the kernel's security modules) a confined
/// program may still trace your other processes (`gdb -p`, `/proc/<pid>/mem`) where Yama allows
/// it, and have one of them run a command outside. `None` when there is no such gap, or nothing
/// is confined.
pub fn confinement_gap() -> Option<String> {
    gap_message(is_confining(), imp::has_landlock())
}

fn gap_message(confining: bool, landlock: bool) -> Option<String> {
    (confining && !landlock).then(|| {
        "the kernel has no Landlock (Linux 5.13 or later, with `landlock` among its security \
         modules), so the programs codemode starts, though confined, can trace your other \
         processes where /proc/sys/kernel/yama/ptrace_scope is 0 and have them run commands \
         outside the confinement; set ptrace_scope to 1 or more, or do not let scripts run `bash`"
            .to_string()
    })
}

/// Whether a program started now would be confined: something is to be hidden or kept
/// read-only, and the probe said the system allows it.
pub fn is_confining() -> bool {
    let plan = plan();
    let wanted = !plan.hidden.is_empty() || !plan.read_only.is_empty();
    wanted && matches!(PROBED.get(), Some(Ok(())))
}

/// Prepares `command` to start confined (see the module docs); nothing when nothing is to be
/// hidden or kept, or when the probe found confinement unavailable.
pub fn confine(command: &mut std::process::Command) -> std::io::Result<()> {
    if !is_confining() {
        return Ok(());
    }
    let (hidden, read_only, links) = {
        let plan = plan();
        (
            plan.hidden.iter().cloned().collect::<Vec<_>>(),
            plan.read_only.iter().cloned().collect::<Vec<_>>(),
            plan.links.iter().cloned().collect::<Vec<_>>(),
        )
    };
    imp::confine(command, &hidden, &read_only, &links)
}

/// The symlinks resolving `path` passes through, each named through its resolved directory
/// (so `~/.config` for `~/.config/codemode` when `~/.config` is a link, and the links inside
/// its target's path too). Stops where the path stops existing.
pub(crate) fn links_on_the_way(path: &std::path::Path) -> Vec<PathBuf> {
    use std::path::Component;
    // The kernel's own limit on links followed in one lookup.
    const MAX_LINKS: usize = 40;
    let start = match path.is_absolute() {
        true => PathBuf::from("/"),
        false => match std::env::current_dir().and_then(|d| d.canonicalize()) {
            Ok(dir) => dir,
            Err(_) => return Vec::new(),
        },
    };
    let mut current = start;
    // Components still to walk, the next one last.
    let mut pending: Vec<std::ffi::OsString> = Vec::new();
    let push = |pending: &mut Vec<std::ffi::OsString>, p: &std::path::Path| {
        for c in p.components().rev() {
            match c {
                Component::Normal(name) => pending.push(name.to_os_string()),
                Component::ParentDir => pending.push("..".into()),
                Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            }
        }
    };
    push(&mut pending, path);
    let mut links = Vec::new();
    while let Some(name) = pending.pop() {
        if name == ".." {
            current.pop();
            continue;
        }
        let next = current.join(&name);
        let Ok(meta) = std::fs::symlink_metadata(&next) else {
            break;
        };
        if !meta.file_type().is_symlink() {
            current = next;
            continue;
        }
        if links.len() == MAX_LINKS {
            break;
        }
        let Ok(target) = std::fs::read_link(&next) else {
            break;
        };
        links.push(next);
        if target.is_absolute() {
            current = PathBuf::from("/");
        }
        push(&mut pending, &target);
    }
    links
}

#[cfg(target_os = "linux")]
mod imp {
    use std::ffi::{CStr, CString};
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    use std::path::{Path, PathBuf};
    use std::sync::OnceLock;

    use super::ConfinementUnavailable;

    /// Everything the child needs, made before `fork`: between `fork` and `exec` only system
    /// calls may run (another thread may have held the allocator's lock at the fork).
    struct Prepared {
        pinned: Vec<CString>,
        links: Vec<CString>,
        uid_map: Vec<u8>,
        gid_map: Vec<u8>,
        read_only: Vec<CString>,
        hidden_files: Vec<CString>,
        hidden_dirs: Vec<CString>,
        cwd: Option<CString>,
        landlock: Option<RawFd>,
    }

    fn c_path(path: &Path) -> Option<CString> {
        CString::new(path.as_os_str().as_bytes()).ok()
    }

    pub(super) fn probe() -> Result<(), ConfinementUnavailable> {
        let mut command = std::process::Command::new("/bin/sh");
        command
            .args(["-c", ":"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // Only whether the kernel allows the namespaces: a path that cannot be covered later
        // refuses the start of that program rather than turning confinement off.
        confine(&mut command, &[], &[], &[])
            .and_then(|()| command.status())
            .map_err(|e| {
                ConfinementUnavailable(format!(
                    "the kernel refused a user and mount namespace ({e}); unprivileged user namespaces may be switched off (sysctl kernel.unprivileged_userns_clone or user.max_user_namespaces, or an AppArmor rule)"
                ))
            })
            .and_then(|status| match status.success() {
                true => Ok(()),
                false => Err(ConfinementUnavailable(format!(
                    "a confined test program did not run ({status})"
                ))),
            })
    }

    pub(super) fn confine(
        command: &mut std::process::Command,
        hidden: &[PathBuf],
        read_only: &[PathBuf],
        links: &[PathBuf],
    ) -> io::Result<()> {
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let mut read_only: Vec<&PathBuf> = read_only.iter().collect();
        // Outer directories first, so a file's own mount lands on its directory's.
        read_only.sort_by_key(|p| p.components().count());
        let mut hidden_files = Vec::new();
        let mut hidden_dirs = Vec::new();
        for path in hidden {
            match std::fs::metadata(path) {
                Ok(m) if m.is_dir() => hidden_dirs.extend(c_path(path)),
                Ok(_) => hidden_files.extend(c_path(path)),
                Err(_) => {}
            }
        }
        let cwd = match command.get_current_dir() {
            Some(dir) => Some(dir.to_path_buf()),
            None => std::env::current_dir().ok(),
        };
        // Every directory above a covered path becomes a mount point too (bound onto itself,
        // still writable): a mount point cannot be renamed, so `mv ~/.config ~/.old` cannot
        // move the read-only configuration aside and leave a writable one in its place.
        // A link inside a read-only path cannot be changed anyway.
        let links: Vec<&PathBuf> = links
            .iter()
            .filter(|l| !read_only.iter().any(|r| l.starts_with(r)))
            .collect();
        let mut pinned: Vec<&Path> = read_only
            .iter()
            .map(|p| p.as_path())
            .chain(hidden.iter().map(PathBuf::as_path))
            .chain(links.iter().map(|l| l.as_path()))
            .flat_map(|p| p.ancestors().skip(1))
            // Not "/", and nothing inside a read-only path: a writable mount there would stay
            // writable inside the read-only one.
            .filter(|a| a.parent().is_some() && !read_only.iter().any(|r| a.starts_with(r)))
            .collect();
        pinned.sort_by_key(|p| (p.components().count(), p.to_path_buf()));
        pinned.dedup();
        let prepared = Prepared {
            pinned: pinned.into_iter().filter_map(c_path).collect(),
            links: links.into_iter().filter_map(|l| c_path(l)).collect(),
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
            read_only: read_only.into_iter().filter_map(|p| c_path(p)).collect(),
            hidden_files,
            hidden_dirs,
            cwd: cwd.as_deref().and_then(c_path),
            landlock: landlock_ruleset().map(|(fd, _)| fd),
        };
        // SAFETY: the closure makes system calls only, on memory prepared above.
        unsafe {
            command.pre_exec(move || enter(&prepared));
        }
        Ok(())
    }

    fn last_error() -> io::Error {
        io::Error::last_os_error()
    }

    fn check(ret: libc::c_int) -> io::Result<()> {
        match ret {
            -1 => Err(last_error()),
            _ => Ok(()),
        }
    }

    /// Writes `data` to the `/proc/self` file `path` (a NUL-terminated literal).
    fn write_proc(path: &[u8], data: &[u8]) -> io::Result<()> {
        // SAFETY: `path` is NUL-terminated; the descriptor is closed on every path.
        unsafe {
            let fd = libc::open(path.as_ptr().cast(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(last_error());
            }
            let written = libc::write(fd, data.as_ptr().cast(), data.len());
            let result = match written {
                n if n == data.len() as isize => Ok(()),
                -1 => Err(last_error()),
                _ => Err(io::Error::from_raw_os_error(libc::EIO)),
            };
            libc::close(fd);
            result
        }
    }

    /// The flags a read-only remount must keep: a mount inherited from a more privileged
    /// namespace has them locked, and a remount that dropped one would be refused.
    fn kept_flags(path: &CString) -> io::Result<libc::c_ulong> {
        // SAFETY: statvfs writes into the zeroed struct only.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        check(unsafe { libc::statvfs(path.as_ptr(), &mut st) })?;
        let pairs = [
            (libc::ST_NOSUID, libc::MS_NOSUID),
            (libc::ST_NODEV, libc::MS_NODEV),
            (libc::ST_NOEXEC, libc::MS_NOEXEC),
            (libc::ST_NOATIME, libc::MS_NOATIME),
            (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
            (libc::ST_RELATIME, libc::MS_RELATIME),
        ];
        Ok(pairs
            .iter()
            .filter(|(st_flag, _)| st.f_flag & *st_flag != 0)
            .fold(0, |acc, (_, ms)| acc | ms))
    }

    fn remount_read_only(path: &CString, extra: libc::c_ulong) -> io::Result<()> {
        let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | extra | kept_flags(path)?;
        // SAFETY: NUL-terminated path; no data argument.
        check(unsafe {
            libc::mount(
                std::ptr::null(),
                path.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            )
        })
    }

    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }

    const MOUNT_ATTR_RDONLY: u64 = 0x1;

    /// Makes the mount at `path` read-only with every mount beneath it (a host's mount inside
    /// a configuration directory would otherwise stay writable). Kernels before 5.12 lack
    /// `mount_setattr`: there only the top mount is remounted.
    fn read_only_beneath(path: &CString) -> io::Result<()> {
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_RDONLY,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        // SAFETY: NUL-terminated path; the attribute struct outlives the call, its size passed.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                libc::AT_FDCWD,
                path.as_ptr(),
                libc::AT_RECURSIVE as libc::c_uint,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        if ret == 0 {
            return Ok(());
        }
        let e = last_error();
        match e.raw_os_error() {
            Some(libc::ENOSYS) => remount_read_only(path, 0),
            _ => Err(e),
        }
    }

    /// Binds `source` onto `target`; `Ok(false)` when the target has gone since it was listed.
    fn bind(source: &CStr, target: &CStr, recursive: bool) -> io::Result<bool> {
        let flags = libc::MS_BIND | if recursive { libc::MS_REC } else { 0 };
        // SAFETY: NUL-terminated paths; no data argument.
        let ret = unsafe {
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            )
        };
        match ret {
            0 => Ok(true),
            _ => gone_or(target, last_error()).map(|()| false),
        }
    }

    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

    /// Mounts the symlink `link` onto itself, so that it cannot be removed, replaced or renamed
    /// (a mount point is busy). Only the new mount API can: `mount(2)` follows the link. Fine
    /// when the link has gone since it was listed: then there is nothing to repoint.
    fn mount_on_link(link: &CStr) -> io::Result<()> {
        // SAFETY: NUL-terminated path; the returned descriptor is closed below.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                link.as_ptr(),
                OPEN_TREE_CLONE
                    | libc::O_CLOEXEC as libc::c_uint
                    | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint,
            )
        };
        if fd < 0 {
            return gone_or(link, last_error());
        }
        let fd = fd as libc::c_int;
        // Without MOVE_MOUNT_T_SYMLINKS the target's last component is not followed: the
        // mount lands on the link itself.
        // SAFETY: `fd` is the tree opened above; empty and NUL-terminated paths.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                fd,
                c"".as_ptr(),
                libc::AT_FDCWD,
                link.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            )
        };
        let result = match ret {
            0 => Ok(()),
            _ => gone_or(link, last_error()),
        };
        // SAFETY: `fd` is ours and closed once.
        unsafe { libc::close(fd) };
        result
    }

    /// Runs `cover` for `path` once more if it failed while `path` still exists. A path removed
    /// on the host while this program starts has what was just mounted on it detached, and the
    /// next step on it fails; once the path is gone there is nothing to cover.
    fn covered(path: &CStr, cover: impl Fn() -> io::Result<()>) -> io::Result<()> {
        cover()
            .or_else(|e| gone_or(path, e))
            .or_else(|_| cover().or_else(|e| gone_or(path, e)))
    }

    /// `Ok` when `path` no longer exists, so there is nothing to cover: it was removed since it
    /// was listed, which also detaches what was mounted on it or above it here. Else `error`.
    fn gone_or(path: &CStr, error: io::Error) -> io::Result<()> {
        // SAFETY: lstat writes into the zeroed struct only.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        match unsafe { libc::lstat(path.as_ptr(), &mut st) } {
            -1 if last_error().raw_os_error() == Some(libc::ENOENT) => Ok(()),
            _ => Err(error),
        }
    }

    /// Runs in the child between `fork` and `exec`.
    fn enter(p: &Prepared) -> io::Result<()> {
        // SAFETY: every call below is a system call on memory `p` owns.
        check(unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) })?;
        // codemode is not dumpable, which makes its `/proc/self` files root's: an ordinary user
        // could not write its maps. Dumpable only while it writes them (exec decides anew).
        check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) })?;
        let maps = write_proc(b"/proc/self/setgroups\0", b"deny")
            .and_then(|()| write_proc(b"/proc/self/uid_map\0", &p.uid_map))
            .and_then(|()| write_proc(b"/proc/self/gid_map\0", &p.gid_map));
        check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) })?;
        maps?;
        // Nothing mounted here may reach the host's namespace.
        check(unsafe {
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        })?;
        for path in &p.pinned {
            bind(path, path, true)?;
        }
        for link in &p.links {
            mount_on_link(link)?;
        }
        for path in &p.read_only {
            covered(path, || match bind(path, path, true)? {
                true => read_only_beneath(path),
                false => Ok(()),
            })?;
        }
        for path in &p.hidden_files {
            covered(path, || match bind(c"/dev/null", path, false)? {
                // `nodev`: opening the covered file fails instead of reading nothing.
                true => remount_read_only(path, libc::MS_NODEV | libc::MS_NOSUID | libc::MS_NOEXEC),
                false => Ok(()),
            })?;
        }
        for path in &p.hidden_dirs {
            check(unsafe {
                libc::mount(
                    c"tmpfs".as_ptr(),
                    path.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    c"size=4k,mode=000".as_ptr().cast(),
                )
            })
            .or_else(|e| gone_or(path, e))?;
        }
        if let Some(fd) = p.landlock {
            // Allowed without no_new_privs: the new user namespace gives CAP_SYS_ADMIN.
            let ret = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) };
            if ret != 0 {
                return Err(last_error());
            }
        }
        // Root inside keeps its capabilities across exec; without this one it cannot unmount.
        check(unsafe { libc::prctl(libc::PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) })?;
        if let Some(cwd) = &p.cwd {
            // The working directory was entered before the mounts; enter it again through them.
            check(unsafe { libc::chdir(cwd.as_ptr()) })?;
        }
        Ok(())
    }

    /// `struct landlock_ruleset_attr` up to `scoped` (ABI 6); older kernels take only the
    /// first field, so the ruleset is made with the whole struct first, then with its head.
    #[repr(C)]
    struct RulesetAttr {
        handled_access_fs: u64,
        handled_access_net: u64,
        scoped: u64,
    }

    /// `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`: no connecting to an abstract socket made outside
    /// the domain (a D-Bus session bus, an X server), which no file could hide.
    const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1;

    #[repr(C, packed)]
    struct PathBeneathAttr {
        allowed_access: u64,
        parent_fd: i32,
    }

    /// `linux/capability.h`; the libc crate does not carry capability numbers.
    const CAP_SYS_ADMIN: libc::c_ulong = 21;
    const ACCESS_FS_EXECUTE: u64 = 1;
    const RULE_PATH_BENEATH: libc::c_int = 1;

    pub(super) fn has_landlock() -> bool {
        landlock_ruleset().is_some()
    }

    pub(super) fn scopes_abstract_sockets() -> bool {
        landlock_ruleset().is_some_and(|(_, scoped)| scoped)
    }

    /// A Landlock ruleset that allows everything it handles (executing files) beneath `/`: it
    /// exists for the domain, whose ptrace scoping keeps the program out of other processes'
    /// `/proc` entries, and which, where the kernel can, keeps it from abstract sockets made
    /// outside (the bool). `None` where the kernel has no Landlock.
    fn landlock_ruleset() -> Option<(RawFd, bool)> {
        static RULESET: OnceLock<Option<(OwnedFd, bool)>> = OnceLock::new();
        RULESET
            .get_or_init(|| {
                let attr = RulesetAttr {
                    handled_access_fs: ACCESS_FS_EXECUTE,
                    handled_access_net: 0,
                    scoped: SCOPE_ABSTRACT_UNIX_SOCKET,
                };
                let create = |size: usize| {
                    // SAFETY: the attribute struct outlives the call, and `size` is at most
                    // its size.
                    unsafe {
                        libc::syscall(
                            libc::SYS_landlock_create_ruleset,
                            &attr as *const RulesetAttr,
                            size,
                            0u32,
                        )
                    }
                };
                let (fd, scoped) = match create(std::mem::size_of::<RulesetAttr>()) {
                    fd if fd >= 0 => (fd, true),
                    _ => (create(std::mem::size_of::<u64>()), false),
                };
                if fd < 0 {
                    return None;
                }
                // SAFETY: the kernel just returned this descriptor, owned by nobody else.
                let ruleset = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
                let root = std::fs::File::open("/").ok()?;
                let beneath = PathBeneathAttr {
                    allowed_access: ACCESS_FS_EXECUTE,
                    parent_fd: root.as_raw_fd(),
                };
                // SAFETY: both descriptors are open; the attribute outlives the call.
                let added = unsafe {
                    libc::syscall(
                        libc::SYS_landlock_add_rule,
                        ruleset.as_raw_fd(),
                        RULE_PATH_BENEATH,
                        &beneath as *const PathBeneathAttr,
                        0u32,
                    )
                };
                (added == 0).then_some((ruleset, scoped))
            })
            .as_ref()
            .map(|(fd, scoped)| (fd.as_raw_fd(), *scoped))
    }
}

/// Finding and stopping what confined programs left running (Linux `/proc` and nsfs; elsewhere
/// nothing is found).
mod survivors {
    use std::collections::BTreeSet;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;

    /// `NS_GET_PARENT` from `linux/nsfs.h`: `_IO(0xb7, 0x2)`.
    const NS_GET_PARENT: libc::c_ulong = 0xb702;

    /// The user namespace at `path`, opened, with its `(device, inode)`. Holding the descriptor
    /// keeps the namespace, and so its inode number, from being reused by another.
    pub(crate) fn open_user_namespace(path: &str) -> Option<((u64, u64), std::fs::File)> {
        let file = std::fs::File::open(path).ok()?;
        let meta = file.metadata().ok()?;
        Some(((meta.dev(), meta.ino()), file))
    }

    /// The first of `started` that the namespace at `path` is, or is nested in.
    fn started_above(path: &str, started: &BTreeSet<(u64, u64)>) -> Option<(u64, u64)> {
        let mut file = std::fs::File::open(path).ok()?;
        // Namespaces nest at most 32 deep.
        for _ in 0..33 {
            let meta = file.metadata().ok()?;
            let id = (meta.dev(), meta.ino());
            if started.contains(&id) {
                return Some(id);
            }
            // SAFETY: an ioctl on a descriptor we own; it returns a new descriptor or -1.
            let parent = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_PARENT) };
            if parent < 0 {
                return None;
            }
            // SAFETY: the kernel just returned this descriptor, owned by nobody else.
            file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(parent) };
        }
        None
    }

    /// Each running process (not this one) with the one of `started` it runs under.
    fn processes_under(started: &BTreeSet<(u64, u64)>) -> Vec<(u32, (u64, u64))> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let own = std::process::id();
        entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| *pid != own)
            .filter_map(|pid| {
                started_above(&format!("/proc/{pid}/ns/user"), started).map(|id| (pid, id))
            })
            .collect()
    }

    /// Which of `started` still have a process running under them.
    pub(crate) fn in_use(started: &BTreeSet<(u64, u64)>) -> BTreeSet<(u64, u64)> {
        processes_under(started)
            .into_iter()
            .map(|(_, id)| id)
            .collect()
    }

    /// Sends SIGKILL to every process under `started` not in `killed` yet, and adds it there.
    pub(crate) fn kill_in_namespaces(
        started: &BTreeSet<(u64, u64)>,
        killed: &mut BTreeSet<u32>,
    ) -> usize {
        let mut now = 0;
        for (pid, _) in processes_under(started) {
            // SAFETY: kill only sends a signal.
            if !killed.contains(&pid)
                && unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) } == 0
            {
                killed.insert(pid);
                now += 1;
            }
        }
        now
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::path::PathBuf;

    use super::ConfinementUnavailable;

    pub(super) fn probe() -> Result<(), ConfinementUnavailable> {
        Err(ConfinementUnavailable(
            "confinement needs Linux user and mount namespaces".into(),
        ))
    }

    pub(super) fn has_landlock() -> bool {
        false
    }

    pub(super) fn scopes_abstract_sockets() -> bool {
        false
    }

    pub(super) fn confine(
        _command: &mut std::process::Command,
        _hidden: &[PathBuf],
        _read_only: &[PathBuf],
        _links: &[PathBuf],
    ) -> std::io::Result<()> {
        Ok(())
    }
}

/// The user namespaces of the programs started confined, by `(device, inode)`, each held open:
/// a namespace's inode number is reused once it is gone, and a stale number could name an
/// unrelated program's namespace. Namespaces nothing runs under any more are let go once the
/// list doubles.
struct Started {
    held: std::collections::BTreeMap<(u64, u64), std::fs::File>,
    prune_at: usize,
}

static STARTED: Mutex<Started> = Mutex::new(Started {
    held: std::collections::BTreeMap::new(),
    prune_at: 64,
});

fn started() -> std::sync::MutexGuard<'static, Started> {
    STARTED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Notes that the program with process id `pid` was started confined, so that
/// [`stop_confined_survivors`] can find what it leaves behind. Call it right after the start,
/// before the program is waited for.
pub fn started_confined(pid: u32) {
    if !is_confining() {
        return;
    }
    let Some((id, file)) = survivors::open_user_namespace(&format!("/proc/{pid}/ns/user")) else {
        return;
    };
    let mut started = started();
    started.held.insert(id, file);
    if started.held.len() >= started.prune_at {
        let ids: BTreeSet<_> = started.held.keys().copied().collect();
        let live = survivors::in_use(&ids);
        started.held.retain(|id, _| live.contains(id));
        started.prune_at = (2 * started.held.len()).max(64);
    }
}

/// Kills every process still running in a namespace of a program codemode started confined,
/// or in one made inside it, and returns how many it signalled. Call it when codemode stops: a background
/// process a command left running (`setsid cmd &`) keeps its view of the file system, and
/// once codemode is gone a file replaced by rename (an edited policy) or deleted (SQLite's
/// `-wal`) is no longer covered there.
pub fn stop_confined_survivors() -> usize {
    // The lock is held throughout, so every namespace named stays held open.
    let guard = started();
    let started: BTreeSet<_> = guard.held.keys().copied().collect();
    if started.is_empty() {
        return 0;
    }
    let mut killed = BTreeSet::new();
    // A process may fork while the list is read: read it again until nothing new is found.
    for _ in 0..5 {
        if survivors::kill_in_namespaces(&started, &mut killed) == 0 {
            break;
        }
    }
    killed.len()
}

#[cfg(test)]
mod tests {
    use super::gap_message;

    #[test]
    fn only_confinement_without_landlock_has_a_gap() {
        let gap = gap_message(true, false).expect("a gap without Landlock");
        assert!(gap.contains("ptrace_scope"), "{gap}");
        assert_eq!(gap_message(true, true), None);
        // Unconfined, another warning says more.
        assert_eq!(gap_message(false, false), None);
    }
}
