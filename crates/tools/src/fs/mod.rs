//! Opening files the way the policy judged them.
//!
//! A path is resolved once, in `prepare`, by walking it component by component with
//! `O_PATH | O_NOFOLLOW` and resolving symlinks ourselves ([`Resolved`]). The walk keeps the
//! file descriptors it opened, and the tool's `run` works on those descriptors only: it opens,
//! creates and renames relative to the held directory, never by path. Before it does, it checks
//! that the judged path still leads to the held directory without any symlink; a path that was
//! swapped after it was judged is refused rather than followed.
//!
//! Directory tools open everything beneath their held root with [`open_beneath`], which never
//! follows a symlink and never leaves the root (`openat2` with `RESOLVE_BENEATH` and
//! `RESOLVE_NO_SYMLINKS` where the kernel has it, a component-wise `O_NOFOLLOW` walk where not).

mod entry_lock;
mod resolve;
mod walk;
mod write;

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};
use std::sync::atomic::{AtomicBool, Ordering};

use codemode_spec::ToolError;
use rustix::fs::{CWD, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

pub(crate) use resolve::{Leaf, Resolved, resolve};
pub(crate) use walk::{Ignores, MAX_DIR_ENTRIES, open_file_beneath, read_entries, walk};
pub(crate) use write::{rewrite, write_atomic};

/// Which file an open descriptor is: two descriptors with the same id name the same file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    pub fn of(st: &Stat) -> Self {
        FileId {
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }

    pub fn of_fd(fd: impl AsFd) -> rustix::io::Result<Self> {
        rustix::fs::fstat(fd).map(|st| Self::of(&st))
    }
}

/// The identities of files no tool may read (see `ToolsConfig::secret_files`), as they are now.
#[derive(Debug, Default)]
pub(crate) struct SecretFiles {
    ids: Vec<FileId>,
}

impl SecretFiles {
    /// Takes the identity of each path that exists now (symlinks followed: the file they name
    /// is the secret).
    pub fn now(paths: &[std::path::PathBuf]) -> Self {
        let ids = paths
            .iter()
            .filter_map(|p| rustix::fs::stat(p).ok())
            .map(|st| FileId::of(&st))
            .collect();
        SecretFiles { ids }
    }

    /// Whether `file` is one of them, whatever path opened it.
    pub fn holds(&self, file: impl AsFd) -> bool {
        if self.ids.is_empty() {
            return false;
        }
        // A file that cannot be inspected is treated as secret: refusing is the safe side.
        FileId::of_fd(file).map_or(true, |id| self.ids.contains(&id))
    }

    /// Refuses `file` (opened from `path`) when it is a secret.
    pub fn refuse(&self, file: impl AsFd, path: &Path) -> Result<(), ToolError> {
        if self.holds(file) {
            return Err(ToolError::failed(format!(
                "{} is codemode's audit key (or a link to it), which no tool may read whatever the policy permits; nothing was read. Do not retry it",
                path.display()
            ))
            .with_effect(codemode_spec::Effect::None));
        }
        Ok(())
    }
}

pub(crate) fn file_type(st: &Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

/// The error for a path that no longer leads where it led when the call was judged.
pub(crate) fn changed(path: &Path) -> ToolError {
    ToolError::failed(format!(
        "{} changed after the call was checked (a symlink or directory was swapped while the call waited), so nothing was done; call it again",
        path.display()
    ))
    .with_effect(codemode_spec::Effect::None)
}

/// The error for a file that another file took the place of after the call was checked (another
/// call, or a program, wrote it meanwhile).
pub(crate) fn replaced(path: &Path) -> ToolError {
    ToolError::failed(format!(
        "{} was replaced after the call was checked (another call or a program wrote it meanwhile), so nothing was done; read it again if the change depends on its content, and call it again",
        path.display()
    ))
    .with_effect(codemode_spec::Effect::None)
}

pub(crate) fn errno_error(action: &str, path: &Path, e: Errno) -> ToolError {
    crate::support::io_error(action, path, &std::io::Error::from(e))
}

const NO_SYMLINKS: ResolveFlags = ResolveFlags::NO_SYMLINKS.union(ResolveFlags::NO_MAGICLINKS);

/// False once `openat2` answered `ENOSYS` (a kernel before 5.6): the component walk is used.
static OPENAT2: AtomicBool = AtomicBool::new(true);

/// Opens `rel` (a relative path of plain names) beneath `root`, following no symlink and never
/// leaving `root`, whatever happens to the tree meanwhile.
pub(crate) fn open_beneath(
    root: impl AsFd,
    rel: &Path,
    flags: OFlags,
) -> rustix::io::Result<OwnedFd> {
    let flags = flags | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    if OPENAT2.load(Ordering::Relaxed) {
        let rel_arg: &OsStr = if rel.as_os_str().is_empty() {
            OsStr::new(".")
        } else {
            rel.as_os_str()
        };
        match rustix::fs::openat2(
            root.as_fd(),
            rel_arg,
            flags,
            Mode::empty(),
            ResolveFlags::BENEATH | NO_SYMLINKS,
        ) {
            Err(Errno::NOSYS) => OPENAT2.store(false, Ordering::Relaxed),
            // EAGAIN: a concurrent rename somewhere on the system; the walk below is exact.
            Err(Errno::AGAIN) => {}
            other => return other,
        }
    }
    let names: Vec<&OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(Ok(n)),
            Component::CurDir => None,
            _ => Some(Err(Errno::XDEV)),
        })
        .collect::<Result<_, _>>()?;
    let Some((last, dirs)) = names.split_last() else {
        return rustix::fs::openat(root, ".", flags, Mode::empty());
    };
    let mut current: Option<OwnedFd> = None;
    for name in dirs {
        let next = match &current {
            Some(fd) => rustix::fs::openat(
                fd,
                *name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?,
            None => rustix::fs::openat(
                root.as_fd(),
                *name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?,
        };
        current = Some(next);
    }
    match &current {
        Some(fd) => rustix::fs::openat(fd, *last, flags, Mode::empty()),
        None => rustix::fs::openat(root.as_fd(), *last, flags, Mode::empty()),
    }
}

/// Opens an absolute path without following any symlink on the way (`O_PATH`): what a judged
/// path, which has every symlink resolved already, must still lead to.
pub(crate) fn open_no_symlinks(path: &Path) -> rustix::io::Result<OwnedFd> {
    let flags = OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    if OPENAT2.load(Ordering::Relaxed) {
        match rustix::fs::openat2(CWD, path, flags, Mode::empty(), NO_SYMLINKS) {
            Err(Errno::NOSYS) => OPENAT2.store(false, Ordering::Relaxed),
            Err(Errno::AGAIN) => {}
            other => return other,
        }
    }
    let root = rustix::fs::openat(CWD, "/", flags | OFlags::DIRECTORY, Mode::empty())?;
    let rel = path.strip_prefix("/").map_err(|_| Errno::INVAL)?;
    if rel.as_os_str().is_empty() {
        return Ok(root);
    }
    open_beneath(&root, rel, OFlags::PATH)
}

/// True when `path` still leads, without symlinks, to the file `held` names.
pub(crate) fn still_at(path: &Path, held: impl AsFd) -> bool {
    let Ok(fresh) = open_no_symlinks(path) else {
        return false;
    };
    match (FileId::of_fd(&fresh), FileId::of_fd(held)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// A name as bytes, for messages and sorting.
pub(crate) fn name_bytes(name: &OsStr) -> &[u8] {
    name.as_bytes()
}
