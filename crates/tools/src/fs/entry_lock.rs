//! One change at a time per file.
//!
//! `edit` reads a file and renames its new content over it; a second edit (or write) of the
//! same file between that read and that rename would be thrown away by it while both report
//! success. Changes of one entry (a directory, by identity, and a name in it) therefore wait
//! for each other within the process, and changes of an existing file wait across processes
//! too, on an exclusive `flock` of the file itself; the one that comes second then finds the
//! file replaced and says so.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use codemode_spec::{Effect, ToolError};
use rustix::fs::FlockOperation;
use rustix::io::Errno;

use super::{FileId, errno_error};

type Key = (FileId, OsString);

/// Entries being changed now, and when a change of one last gave up on another process's lock.
#[derive(Default)]
struct Changing {
    held: HashSet<Key>,
    /// A change that waited behind one that then gave up would only wait the same bound again
    /// for the same lock, one after another; it gives up with it instead.
    gave_up: HashMap<Key, Instant>,
}

static CHANGING: Mutex<Option<Changing>> = Mutex::new(None);
static RELEASED: Condvar = Condvar::new();

fn changing() -> MutexGuard<'static, Option<Changing>> {
    // A panic while the set was held leaves it consistent (inserts and removes are single
    // steps), so a poisoned lock is still usable.
    CHANGING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Held while one entry is changed; released when dropped.
pub(crate) struct EntryLock {
    key: Key,
}

impl EntryLock {
    /// Waits until no other change of `name` in `dir` is under way, then holds it. Fails when
    /// one it waited for gave up on another process's lock of the file meanwhile.
    pub fn take(dir: impl AsFd, name: &OsStr, path: &Path) -> Result<Self, ToolError> {
        let dir_id = FileId::of_fd(dir).map_err(|e| errno_error("inspect", path, e))?;
        let key = (dir_id, name.to_os_string());
        let since = Instant::now();
        let mut guard = changing();
        loop {
            let state = guard.get_or_insert_with(Changing::default);
            if state.gave_up.get(&key).is_some_and(|at| *at >= since) {
                return Err(locked_elsewhere(path));
            }
            if !state.held.contains(&key) {
                state.held.insert(key.clone());
                return Ok(EntryLock { key });
            }
            guard = RELEASED.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Records whether this change got another process's lock of the file, for the changes
    /// waiting behind it.
    fn note_file_lock(&self, taken: bool) {
        let mut guard = changing();
        let state = guard.get_or_insert_with(Changing::default);
        if taken {
            state.gave_up.remove(&self.key);
        } else {
            state.gave_up.insert(self.key.clone(), Instant::now());
        }
    }
}

impl Drop for EntryLock {
    fn drop(&mut self) {
        if let Some(state) = changing().as_mut() {
            state.held.remove(&self.key);
        }
        RELEASED.notify_all();
    }
}

/// How long a change waits for another process's change of the same file. Changes hold the
/// lock for one read and one write; longer means a program holds it on purpose.
const FILE_LOCK_WAIT: Duration = Duration::from_secs(10);

/// An exclusive `flock` on an existing file, held until dropped: another codemode process
/// changing the same file waits for this change to end (and then finds the file replaced).
pub(crate) struct FileLock {
    /// Closing it releases the lock.
    _held: File,
}

impl FileLock {
    /// Locks `file` (through a descriptor of its own, so the lock outlives `file`), waiting at
    /// most [`FILE_LOCK_WAIT`]; `entry` is this change's lock in the process.
    pub fn take(file: &File, path: &Path, entry: &EntryLock) -> Result<Self, ToolError> {
        let held = file
            .try_clone()
            .map_err(|e| crate::support::io_error("lock", path, &e).with_effect(Effect::None))?;
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            match rustix::fs::flock(&held, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {
                    entry.note_file_lock(true);
                    return Ok(FileLock { _held: held });
                }
                Err(Errno::WOULDBLOCK) if started.elapsed() < FILE_LOCK_WAIT => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Err(Errno::WOULDBLOCK) => {
                    entry.note_file_lock(false);
                    return Err(locked_elsewhere(path));
                }
                // A file system without flock: the process-wide lock still holds.
                Err(Errno::NOLCK | Errno::NOSYS | Errno::OPNOTSUPP) => {
                    return Ok(FileLock { _held: held });
                }
                Err(e) => return Err(super::errno_error("lock", path, e).with_effect(Effect::None)),
            }
        }
    }
}

/// The error for a file another process kept locked past [`FILE_LOCK_WAIT`].
fn locked_elsewhere(path: &Path) -> ToolError {
    ToolError::failed(format!(
        "{} is locked (flock) by another process for more than {} s, so nothing was changed; call it again once that process is done with it",
        path.display(),
        FILE_LOCK_WAIT.as_secs()
    ))
    .with_effect(Effect::None)
}
