//! Writing a file so that readers see either the old content or the new, never half of it, and
//! only where the call was judged to write.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use codemode_spec::{Effect, ToolError};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use super::entry_lock::{EntryLock, FileLock};
use super::{FileId, Leaf, Resolved, changed, errno_error, file_type, replaced};

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Replaces (or creates) the resolved file with `bytes`: a temporary file in the held directory,
/// flushed, then renamed over the name, all relative to the directory descriptor held since the
/// call was judged. Missing parent directories are created beneath it without following
/// symlinks. An existing file keeps its permissions. A file that is no longer the one judged,
/// or a directory on the way that was swapped for a symlink, refuses the write.
pub(crate) fn write_atomic(target: &Resolved, bytes: &[u8]) -> Result<(), ToolError> {
    let path = &target.path;
    let (names, judged): (&[OsString], Option<(FileId, u32)>) = match &target.leaf {
        Leaf::Dir => {
            return Err(ToolError::invalid(format!(
                "{} is a directory; give the path of a file inside it",
                path.display()
            )));
        }
        Leaf::Entry { kind, .. } if *kind != FileType::RegularFile => {
            return Err(ToolError::invalid(format!(
                "{} is not a regular file (a device, FIFO or socket); only regular files can be written",
                path.display()
            )));
        }
        Leaf::Entry { name, fd, mode, .. } => {
            let id = FileId::of_fd(fd).map_err(|e| errno_error("inspect", path, e))?;
            (std::slice::from_ref(name), Some((id, *mode)))
        }
        Leaf::Missing(names) => (names.as_slice(), None),
    };
    let Some((name, parents)) = names.split_last() else {
        return Err(ToolError::invalid(format!(
            "{} has no file name; give a file path",
            path.display()
        )));
    };
    target.verify()?;
    let mut dir: Option<OwnedFd> = None;
    let mut dir_path = target.dir.path.clone();
    for component in parents {
        dir_path.push(component);
        let parent = dir.as_ref().unwrap_or(&target.dir.fd);
        match rustix::fs::mkdirat(parent, component.as_os_str(), Mode::from_raw_mode(0o777)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(errno_error("create the directory", &dir_path, e)),
        }
        let next = rustix::fs::openat(
            parent,
            component.as_os_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR | Errno::NOENT => changed(path),
            e => errno_error("open the directory", &dir_path, e),
        })?;
        dir = Some(next);
    }
    let dir = dir.as_ref().unwrap_or(&target.dir.fd);
    let lock = EntryLock::take(dir, name, path)?;
    // An existing file: another process's change of it ends first. One that cannot be opened
    // for reading is replaced without that lock (the checks below still hold).
    let _file_lock = match judged {
        Some(_) => match target.open_file() {
            Ok(file) => Some(FileLock::take(&file, path, &lock)?),
            Err(_) => None,
        },
        None => None,
    };
    replace_in(dir.as_fd(), name, judged, bytes, path)
}

/// Reads the resolved file and replaces it with what `change` makes of it, with no other
/// change of that file by this process in between: two edits of one file made together (a
/// script's `Promise.all`) each see the other's result, or are refused, and neither is lost.
/// `change` returns the new content and what to report; an error from it changes nothing.
pub(crate) fn rewrite<T>(
    target: &Resolved,
    change: impl FnOnce(File) -> Result<(Vec<u8>, T), ToolError>,
) -> Result<T, ToolError> {
    let path = &target.path;
    let Leaf::Entry { name, fd, mode, .. } = &target.leaf else {
        // open_file says what is wrong with a directory or a missing file.
        return Err(target
            .open_file()
            .err()
            .unwrap_or_else(|| changed(path))
            .with_effect(Effect::None));
    };
    let judged = FileId::of_fd(fd).map_err(|e| errno_error("inspect", path, e))?;
    let lock = EntryLock::take(&target.dir.fd, name, path)?;
    let file = target
        .open_file()
        .map_err(|e| e.with_effect(Effect::None))?;
    // Held from the read to the rename, across processes.
    let _file_lock = FileLock::take(&file, path, &lock)?;
    let (bytes, report) = change(file)?;
    replace_in(
        target.dir.fd.as_fd(),
        name,
        Some((judged, *mode)),
        &bytes,
        path,
    )?;
    Ok(report)
}

/// The rename itself, once the directory is known and the name locked: refuses when the name
/// no longer holds the judged file (or, for a new file, holds something else than a file).
fn replace_in(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    judged: Option<(FileId, u32)>,
    bytes: &[u8],
    path: &Path,
) -> Result<(), ToolError> {
    let mode = match (
        rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW),
        judged,
    ) {
        (Ok(now), Some((id, mode))) if FileId::of(&now) == id => mode,
        // Judged as a new file, or as another file: a file that took the name since (another
        // call's, a program's) is not this call's to replace.
        (Ok(now), judged) if file_type(&now) == FileType::RegularFile => {
            return Err(match judged {
                Some(_) => replaced(path),
                None => appeared(path),
            });
        }
        (Ok(_), _) => return Err(changed(path)),
        (Err(Errno::NOENT), None) => 0o666,
        (Err(Errno::NOENT), Some(_)) => return Err(changed(path)),
        (Err(e), _) => return Err(errno_error("inspect", path, e)),
    };
    let temp_name = temp_name(name);
    let temp = rustix::fs::openat(
        dir,
        temp_name.as_os_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        // A new file gets the usual permissions (0666 less the umask); an old one keeps its own.
        Mode::from_raw_mode(if judged.is_some() { 0o600 } else { mode }),
    )
    .map_err(|e| errno_error("create a temporary file beside", path, e))?;
    let keep_mode = judged.map(|(_, mode)| mode);
    let written = fill(temp, bytes, keep_mode)
        .map_err(|e| crate::support::io_error("write", path, &e).with_effect(Effect::None));
    let renamed = written.and_then(|()| match judged {
        Some(_) => rustix::fs::renameat(dir, temp_name.as_os_str(), dir, name)
            .map_err(|e| errno_error("write", path, e).with_effect(Effect::None)),
        None => rename_new(dir, &temp_name, name, path),
    });
    if renamed.is_err() {
        let _ = rustix::fs::unlinkat(dir, temp_name.as_os_str(), AtFlags::empty());
    }
    renamed
}

/// Renames the temporary file to a name judged free, only if it still is: another process may
/// have created it since the check above (the in-process lock does not reach it).
fn rename_new(
    dir: BorrowedFd<'_>,
    temp_name: &OsStr,
    name: &OsStr,
    path: &Path,
) -> Result<(), ToolError> {
    match rustix::fs::renameat_with(dir, temp_name, dir, name, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        Err(Errno::EXIST) => Err(appeared(path)),
        // A file system (or kernel) without RENAME_NOREPLACE: the check above stands alone.
        Err(Errno::INVAL | Errno::NOSYS) => rustix::fs::renameat(dir, temp_name, dir, name)
            .map_err(|e| errno_error("write", path, e).with_effect(Effect::None)),
        Err(e) => Err(errno_error("write", path, e).with_effect(Effect::None)),
    }
}

/// The error for a file that did not exist when the call was checked and does now.
fn appeared(path: &Path) -> ToolError {
    ToolError::failed(format!(
        "{} did not exist when the call was checked and was created meanwhile (by another call or a program), so nothing was written; read it first if its content matters, then call it again to replace it",
        path.display()
    ))
    .with_effect(Effect::None)
}

fn fill(fd: OwnedFd, bytes: &[u8], keep_mode: Option<u32>) -> std::io::Result<()> {
    let mut file = File::from(fd);
    file.write_all(bytes)?;
    if let Some(mode) = keep_mode {
        rustix::fs::fchmod(&file, Mode::from_raw_mode(mode))?;
    }
    // Flush before the rename so a crash cannot leave the new name on empty content.
    file.sync_all()
}

/// Bytes of the file's name a temporary name keeps: with its dot, process id and counter it
/// stays within the 255 bytes a name may have, however long the file's own name is.
const TEMP_NAME_KEEPS: usize = 200;

fn temp_name(name: &OsStr) -> OsString {
    use std::os::unix::ffi::OsStrExt;
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut out = OsString::from(".");
    let bytes = name.as_bytes();
    out.push(OsStr::from_bytes(
        &bytes[..bytes.len().min(TEMP_NAME_KEEPS)],
    ));
    out.push(format!(".{}.{n}.tmp", std::process::id()));
    out
}
