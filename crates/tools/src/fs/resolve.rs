//! Resolving a path argument once, keeping what was opened on the way.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};

use codemode_spec::ToolError;
use rustix::fs::{CWD, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::{FileId, changed, errno_error, file_type, replaced, still_at};

/// Most symlinks followed while resolving one path, as Linux's own limit; more means a loop.
const MAX_SYMLINK_HOPS: u32 = 40;

/// A directory on the resolved path, held open (`O_PATH`).
#[derive(Debug)]
pub(crate) struct HeldDir {
    pub path: PathBuf,
    pub fd: OwnedFd,
}

/// What the resolved path names, beneath the deepest directory held.
#[derive(Debug)]
pub(crate) enum Leaf {
    /// The path is that directory itself.
    Dir,
    /// An existing entry that is not a directory (a file, a FIFO, a device, a socket).
    Entry {
        name: OsString,
        /// Held (`O_PATH`) so the file's inode number cannot be reused while the call waits.
        fd: OwnedFd,
        kind: FileType,
        mode: u32,
    },
    /// Nothing exists there yet: these names are missing beneath the directory (a file that
    /// `write` will create, with the directories it will create first).
    Missing(Vec<OsString>),
}

/// A path resolved once, with every symlink followed by us (never by the kernel), and the
/// handles opened on the way. The policy judges [`Resolved::path`]; the tools then work on the
/// handles, so a symlink swapped in afterwards cannot send them elsewhere.
#[derive(Debug)]
pub(crate) struct Resolved {
    /// Absolute, `..` applied, every symlink resolved.
    pub path: PathBuf,
    /// The deepest existing directory on the path (the parent of an existing entry, or the path
    /// itself when it is a directory).
    pub dir: HeldDir,
    pub leaf: Leaf,
}

enum Step {
    Root,
    Parent,
    Name(OsString),
}

fn steps(path: &Path) -> impl Iterator<Item = Step> + '_ {
    path.components().filter_map(|c| match c {
        Component::RootDir => Some(Step::Root),
        Component::ParentDir => Some(Step::Parent),
        Component::Normal(n) => Some(Step::Name(n.to_os_string())),
        Component::CurDir | Component::Prefix(_) => None,
    })
}

fn open_root() -> Result<HeldDir, ToolError> {
    let fd = rustix::fs::openat(
        CWD,
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| errno_error("open", Path::new("/"), e))?;
    Ok(HeldDir {
        path: PathBuf::from("/"),
        fd,
    })
}

/// Resolves `path` (absolute, or relative to `base`, which must be absolute) component by
/// component. `..` applies to the already-resolved prefix, as the kernel applies it, so
/// `link/..` means the parent of the link's target. For a path that does not exist yet, the
/// deepest existing directory is held and the missing names are kept: that is where a write
/// would land. Dangling symlinks resolve too, to where writing through them would create a file.
pub(crate) fn resolve(base: &Path, path: &Path) -> Result<Resolved, ToolError> {
    let mut pending: VecDeque<Step> = VecDeque::new();
    if !path.is_absolute() {
        pending.extend(steps(base));
    }
    pending.extend(steps(path));
    let mut dirs: Vec<HeldDir> = vec![open_root()?];
    let mut missing: Vec<OsString> = Vec::new();
    let mut entry: Option<Leaf> = None;
    let mut hops = 0u32;
    while let Some(step) = pending.pop_front() {
        if let Some(Leaf::Entry { name, .. }) = &entry {
            let at = dirs.last().map(|d| d.path.join(name)).unwrap_or_default();
            return Err(ToolError::failed(format!(
                "{} is not a directory, so nothing can be beneath it; check the path",
                at.display()
            ))
            .with_effect(codemode_spec::Effect::None));
        }
        match step {
            Step::Root => {
                dirs.truncate(1);
                missing.clear();
            }
            Step::Parent => {
                if missing.pop().is_none() && dirs.len() > 1 {
                    dirs.pop();
                }
            }
            Step::Name(name) => {
                if !missing.is_empty() {
                    missing.push(name);
                    continue;
                }
                let Some(top) = dirs.last() else {
                    return Err(ToolError::failed("path resolution lost its root"));
                };
                let at = top.path.join(&name);
                let fd = match rustix::fs::openat(
                    &top.fd,
                    name.as_os_str(),
                    OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(fd) => fd,
                    Err(Errno::NOENT) => {
                        missing.push(name);
                        continue;
                    }
                    Err(e) => return Err(errno_error("open", &at, e)),
                };
                let st = rustix::fs::fstat(&fd).map_err(|e| errno_error("inspect", &at, e))?;
                match file_type(&st) {
                    FileType::Symlink => {
                        hops += 1;
                        if hops > MAX_SYMLINK_HOPS {
                            return Err(ToolError::invalid(format!(
                                "too many symlinks while resolving {} (more than {MAX_SYMLINK_HOPS}); there is probably a symlink loop",
                                at.display()
                            )));
                        }
                        let target = rustix::fs::readlinkat(&fd, "", Vec::new()).map_err(|e| {
                            ToolError::failed(format!(
                                "cannot read the symlink {}: {}",
                                at.display(),
                                std::io::Error::from(e)
                            ))
                        })?;
                        let target = PathBuf::from(OsString::from_vec(target.into_bytes()));
                        for step in steps(&target).collect::<Vec<_>>().into_iter().rev() {
                            pending.push_front(step);
                        }
                    }
                    FileType::Directory => dirs.push(HeldDir { path: at, fd }),
                    kind => {
                        entry = Some(Leaf::Entry {
                            name,
                            fd,
                            kind,
                            mode: st.st_mode & 0o7777,
                        })
                    }
                }
            }
        }
    }
    let dir = dirs
        .pop()
        .ok_or_else(|| ToolError::failed("path resolution lost its root"))?;
    let (path, leaf) = match entry {
        Some(Leaf::Entry {
            name,
            fd,
            kind,
            mode,
        }) => (
            dir.path.join(&name),
            Leaf::Entry {
                name,
                fd,
                kind,
                mode,
            },
        ),
        _ if missing.is_empty() => (dir.path.clone(), Leaf::Dir),
        _ => {
            let mut p = dir.path.clone();
            p.extend(&missing);
            (p, Leaf::Missing(missing))
        }
    };
    Ok(Resolved { path, dir, leaf })
}

impl Resolved {
    /// Refuses when the deepest held directory is no longer what its path leads to without
    /// symlinks (a component was swapped for a symlink, or the directory was moved).
    pub fn verify(&self) -> Result<(), ToolError> {
        if still_at(&self.dir.path, &self.dir.fd) {
            Ok(())
        } else {
            Err(changed(&self.path))
        }
    }

    /// Opens the held regular file for reading, after checking that the path still leads to it.
    pub fn open_file(&self) -> Result<File, ToolError> {
        let Leaf::Entry {
            name,
            fd: held,
            kind,
            ..
        } = &self.leaf
        else {
            return Err(match self.leaf {
                Leaf::Dir => ToolError::invalid(format!(
                    "{} is a directory, not a file; use ls to list it",
                    self.path.display()
                )),
                _ => ToolError::failed(format!(
                    "file not found: {} (check the path; ls or find show what exists)",
                    self.path.display()
                ))
                .with_effect(codemode_spec::Effect::None),
            });
        };
        // Devices and FIFOs may never end (/dev/zero) or block forever; only regular files.
        if *kind != FileType::RegularFile {
            return Err(ToolError::invalid(format!(
                "{} is not a regular file (a device, FIFO or socket); only regular files can be read",
                self.path.display()
            )));
        }
        self.verify()?;
        let fd = rustix::fs::openat(
            &self.dir.fd,
            name.as_os_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::NOENT | Errno::LOOP => changed(&self.path),
            e => errno_error("read", &self.path, e),
        })?;
        match (FileId::of_fd(&fd), FileId::of_fd(held)) {
            (Ok(a), Ok(b)) if a == b => {}
            (Ok(_), Ok(_)) => return Err(replaced(&self.path)),
            _ => return Err(changed(&self.path)),
        }
        Ok(File::from(fd))
    }

    /// Opens the held directory for listing, after checking that the path still leads to it.
    pub fn open_dir(&self) -> Result<OwnedFd, ToolError> {
        match &self.leaf {
            Leaf::Dir => {}
            Leaf::Entry { .. } => {
                return Err(ToolError::invalid(format!(
                    "{} is a file, not a directory; use read to see its content",
                    self.path.display()
                )));
            }
            Leaf::Missing(_) => {
                return Err(ToolError::failed(format!(
                    "cannot list {}: it does not exist; check the path (ls or find can show what exists)",
                    self.path.display()
                ))
                .with_effect(codemode_spec::Effect::None));
            }
        }
        self.verify()?;
        rustix::fs::openat(
            &self.dir.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| errno_error("list", &self.path, e))
    }

    pub fn exists(&self) -> bool {
        !matches!(self.leaf, Leaf::Missing(_))
    }
}
