//! Which `PATH` directories the programs codemode starts cannot change.
//!
//! codemode itself runs one kind of program unconfined and with the user's secrets at hand: a
//! models catalog's `apiKeyCommand`. Confinement keeps only codemode's own files read-only, so
//! a confined `bash` can still write `~/.local/bin`. A program of the key command's name left
//! there, ahead of the real one on `PATH`, would be run with the user's full authority and
//! could read the audit key or print any key it likes. So such a command looks programs up
//! only where none of the user's programs can put one.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// `path`'s absolute entries that this user cannot change, in their order: each directory,
/// every directory above it and every link on the way to it belongs to someone else, and the
/// directory itself is not writable to this user (a sticky directory above, such as `/tmp`, is
/// fine: nobody else may rename what is in it). A directory that does not exist yet is left
/// out, since anyone allowed to make it could. Also returns the entries left out, for an error
/// message. Root owns and writes every directory, so for root nothing would remain: root gets
/// every absolute entry, as confinement is no barrier against root anyway.
pub fn path_children_cannot_change(path: &OsStr) -> (OsString, Vec<PathBuf>) {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let mut kept = Vec::new();
    let mut left_out = Vec::new();
    for dir in std::env::split_paths(path).filter(|p| p.is_absolute()) {
        match uid == 0 || unchangeable(&dir, uid) {
            true => kept.push(dir),
            false => left_out.push(dir),
        }
    }
    let joined = std::env::join_paths(kept).unwrap_or_default();
    (joined, left_out)
}

fn unchangeable(dir: &Path, uid: u32) -> bool {
    let Ok(resolved) = dir.canonicalize() else {
        return false;
    };
    if writable(&resolved) {
        return false;
    }
    // Each name on both ways to the directory, the path as written (its links) and the
    // resolved one: none may be the user's, and no directory holding one may be writable to
    // the user unless sticky (then only the owner of a name may rename it).
    dir.ancestors().chain(resolved.ancestors()).all(|entry| {
        match std::fs::symlink_metadata(entry) {
            Ok(meta) => {
                let sticky_or_unwritable =
                    meta.is_symlink() || meta.mode() & libc::S_ISVTX != 0 || !writable(entry);
                meta.uid() != uid && sticky_or_unwritable
            }
            Err(_) => false,
        }
    })
}

fn writable(dir: &Path) -> bool {
    let Ok(c_dir) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return true;
    };
    // SAFETY: `c_dir` is NUL-terminated and lives across the call.
    unsafe { libc::access(c_dir.as_ptr(), libc::W_OK) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_and_missing_entries_are_left_out() {
        let missing = "/surely/not/here/7q3";
        let (kept, left_out) = path_children_cannot_change(OsStr::new(&format!(".:bin:{missing}")));
        // Root keeps every absolute entry; anyone else loses the missing one.
        // SAFETY: geteuid cannot fail.
        match unsafe { libc::geteuid() } {
            0 => assert_eq!((kept.as_os_str(), left_out.len()), (OsStr::new(missing), 0)),
            _ => assert_eq!((kept.len(), left_out), (0, vec![PathBuf::from(missing)])),
        }
    }
}
