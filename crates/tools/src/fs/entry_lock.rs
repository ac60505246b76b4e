//! One change at a time per directory entry, within this process.
//!
//! `edit` reads a file and renames its new content over it; a second edit (or write) of the
//! same file between that read and that rename would be thrown away by it while both report
//! success. Changes of one entry (a directory, by identity, and a name in it) therefore wait
//! for each other; the one that comes second then finds the file replaced and says so.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::{Condvar, Mutex, MutexGuard};

use codemode_spec::ToolError;

use super::{FileId, errno_error};

type Key = (FileId, OsString);

/// Entries being changed now, and the signal that one was released.
static CHANGING: Mutex<Option<HashSet<Key>>> = Mutex::new(None);
static RELEASED: Condvar = Condvar::new();

fn changing() -> MutexGuard<'static, Option<HashSet<Key>>> {
    // A panic while the set was held leaves it consistent (inserts and removes are single
    // steps), so a poisoned lock is still usable.
    CHANGING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Held while one entry is changed; released when dropped.
pub(crate) struct EntryLock {
    key: Key,
}

impl EntryLock {
    /// Waits until no other change of `name` in `dir` is under way, then holds it.
    pub fn take(dir: impl AsFd, name: &OsStr, path: &Path) -> Result<Self, ToolError> {
        let dir_id = FileId::of_fd(dir).map_err(|e| errno_error("inspect", path, e))?;
        let key = (dir_id, name.to_os_string());
        let mut set = changing();
        while set.as_ref().is_some_and(|s| s.contains(&key)) {
            set = RELEASED.wait(set).unwrap_or_else(|e| e.into_inner());
        }
        set.get_or_insert_with(HashSet::new).insert(key.clone());
        Ok(EntryLock { key })
    }
}

impl Drop for EntryLock {
    fn drop(&mut self) {
        if let Some(set) = changing().as_mut() {
            set.remove(&self.key);
        }
        RELEASED.notify_all();
    }
}
