//! Walking a directory tree beneath a held root: sorted, `.gitignore` respected, no symlink
//! followed, nothing opened outside the root.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use super::{file_type, name_bytes, open_beneath, open_no_symlinks};
use crate::support::StopFlag;

/// Largest ignore file read; bigger ones are skipped rather than held in memory.
const MAX_IGNORE_FILE_BYTES: u64 = 1024 * 1024;
/// Deepest directory visited below the root.
const MAX_DEPTH: usize = 256;

/// One entry met by [`walk`].
pub(crate) struct Entry<'a> {
    /// Path relative to the walked root.
    pub rel: &'a Path,
    /// The root's judged path joined with `rel`.
    pub path: &'a Path,
    pub kind: FileType,
}

/// The ignore rules in force above the walked root: the user's global excludes file and every
/// ancestor directory's `.gitignore` and `.ignore`.
pub(crate) struct Ignores {
    /// Innermost first; each directory's `.ignore` before its `.gitignore`.
    outer: Vec<Gitignore>,
}

impl Ignores {
    pub fn above(root: &Path) -> Self {
        let mut outer = Vec::new();
        let ancestors: Vec<&Path> = root.ancestors().skip(1).collect();
        for dir in ancestors {
            if let Ok(fd) = open_no_symlinks(dir) {
                outer.extend(rules_in(&fd, dir));
            }
        }
        let (global, _) = Gitignore::global();
        outer.push(global);
        Ignores { outer }
    }
}

/// Reads one small regular file in `dir`, without following a symlink.
fn read_small(dir: impl AsFd, name: &str) -> Option<String> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    if file_type(&st) != FileType::RegularFile || st.st_size as u64 > MAX_IGNORE_FILE_BYTES {
        return None;
    }
    let mut text = String::new();
    std::fs::File::from(fd)
        .take(MAX_IGNORE_FILE_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

fn rules(base: &Path, text: &str) -> Option<Gitignore> {
    let mut builder = GitignoreBuilder::new(base);
    for line in text.lines() {
        // A bad line is skipped, as git skips it.
        let _ = builder.add_line(None, line);
    }
    builder.build().ok().filter(|g| !g.is_empty())
}

/// The rules a directory holds: `.ignore`, then `.gitignore`, then `.git/info/exclude`.
fn rules_in(dir: &OwnedFd, path: &Path) -> Vec<Gitignore> {
    let mut out = Vec::new();
    for name in [".ignore", ".gitignore"] {
        if let Some(g) = read_small(dir, name).and_then(|t| rules(path, &t)) {
            out.push(g);
        }
    }
    let exclude = open_beneath(
        dir,
        Path::new(".git/info"),
        OFlags::PATH | OFlags::DIRECTORY,
    );
    if let Ok(info) = exclude
        && let Some(g) = read_small(&info, "exclude").and_then(|t| rules(path, &t))
    {
        out.push(g);
    }
    out
}

/// Most entries read from one directory; the rest of a bigger one is left out (sorted among
/// what was read), so one directory cannot take the host's memory.
pub(crate) const MAX_DIR_ENTRIES: usize = 1_000_000;

/// The names in an open directory, sorted by their bytes, without `.` and `..`; at most
/// [`MAX_DIR_ENTRIES`] of them.
pub(crate) fn read_entries(dir: &OwnedFd) -> std::io::Result<Vec<(OsString, FileType)>> {
    let mut out = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        if out.len() >= MAX_DIR_ENTRIES {
            break;
        }
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let name: OsString = <OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name).to_owned();
        let mut kind = entry.file_type();
        if kind == FileType::Unknown {
            kind = rustix::fs::statat(dir, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)
                .map(|st| file_type(&st))
                .unwrap_or(FileType::Unknown);
        }
        out.push((name, kind));
    }
    out.sort_by(|a, b| name_bytes(&a.0).cmp(name_bytes(&b.0)));
    Ok(out)
}

struct Walker<'a, F> {
    root: &'a OwnedFd,
    root_path: &'a Path,
    /// Rules of the directories being walked, outermost first.
    inner: Vec<Vec<Gitignore>>,
    outer: &'a Ignores,
    stop: &'a StopFlag,
    visit: F,
}

impl<F: FnMut(&Entry) -> bool> Walker<'_, F> {
    fn ignored(&self, path: &Path, is_dir: bool) -> bool {
        let sets = self
            .inner
            .iter()
            .rev()
            .flatten()
            .chain(self.outer.outer.iter());
        for g in sets {
            let m = g.matched(path, is_dir);
            if m.is_ignore() {
                return true;
            }
            if m.is_whitelist() {
                return false;
            }
        }
        false
    }

    /// Visits `dir`'s entries; false when the walk must stop.
    fn dir(&mut self, dir: &OwnedFd, rel: &Path, depth: usize) -> bool {
        let dir_path = self.root_path.join(rel);
        self.inner.push(rules_in(dir, &dir_path));
        let keep_going = self.entries(dir, rel, depth);
        self.inner.pop();
        keep_going
    }

    fn entries(&mut self, dir: &OwnedFd, rel: &Path, depth: usize) -> bool {
        // Unreadable directories are skipped; a search reports what it could read.
        let Ok(entries) = read_entries(dir) else {
            return true;
        };
        for (name, kind) in entries {
            if self.stop.is_set() {
                return false;
            }
            if name == OsStr::new(".git") {
                continue;
            }
            let child_rel = rel.join(&name);
            let child_path = self.root_path.join(&child_rel);
            let is_dir = kind == FileType::Directory;
            if self.ignored(&child_path, is_dir) {
                continue;
            }
            let entry = Entry {
                rel: &child_rel,
                path: &child_path,
                kind,
            };
            if !(self.visit)(&entry) {
                return false;
            }
            if is_dir && depth < MAX_DEPTH {
                // Opened from the root again, beneath it and without symlinks, so a directory
                // swapped for a symlink (or moved out) after it was listed leads nowhere.
                let Ok(child) =
                    open_beneath(self.root, &child_rel, OFlags::RDONLY | OFlags::DIRECTORY)
                else {
                    continue;
                };
                if !self.dir(&child, &child_rel, depth + 1) {
                    return false;
                }
            }
        }
        true
    }
}

/// Visits every entry beneath `root` (an open directory whose judged path is `root_path`) in
/// sorted order, parents before children, skipping what `.gitignore`, `.ignore` and git's
/// exclude files exclude, and the `.git` directory. Hidden files are included: dot-directories
/// such as `.github` matter in code. Symlinks are reported, never followed. `visit` returns
/// false to stop.
pub(crate) fn walk(
    root: &OwnedFd,
    root_path: &Path,
    ignores: &Ignores,
    stop: &StopFlag,
    visit: impl FnMut(&Entry) -> bool,
) {
    let mut walker = Walker {
        root,
        root_path,
        inner: Vec::new(),
        outer: ignores,
        stop,
        visit,
    };
    walker.dir(root, Path::new(""), 0);
}

/// Opens a regular file found by [`walk`] for reading, beneath the root and without symlinks.
pub(crate) fn open_file_beneath(root: &OwnedFd, rel: &Path) -> Option<std::fs::File> {
    let fd = open_beneath(
        root,
        rel,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
    )
    .ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    (file_type(&st) == FileType::RegularFile).then(|| std::fs::File::from(fd))
}
