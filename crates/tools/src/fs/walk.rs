//! Walking a directory tree beneath a held root: sorted, `.gitignore` respected, no symlink
//! followed, nothing opened outside the root.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use codemode_spec::{Effect, ToolError};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use super::{file_type, name_bytes, open_beneath, open_no_symlinks};
use crate::support::StopFlag;

/// Largest ignore file read; a bigger one fails the search, as rules past the budget do (it
/// could not hold fewer than the budget's bytes of rules in any useful shape).
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

/// Most ignore rules one call holds compiled at once: those of the folders above the searched
/// one plus those of the folders being walked. A walked folder's rules are given back when the
/// walk leaves it, so a tree of many small ignore files is fine. A compiled rule takes far more
/// memory than its line (measured with ignore 0.4: ~1 KB for a plain name, ~11 KB for one like
/// `ab*.c`, which is a regex of its own), so this keeps a call's rules within ~45 MB; real
/// projects hold hundreds of rules. Without a bound, a cloned repository's 1 MiB ignore files
/// took one read-only `find` to gigabytes.
const MAX_IGNORE_RULES: usize = 4_000;
/// Most bytes of rule lines held at once: a long glob takes up to ~500 times its length while it
/// compiles.
const MAX_IGNORE_RULE_BYTES: usize = 128 * 1024;
/// Most rules, and bytes of rule lines, compiled together: compiling checks for cancellation
/// between chunks, and a chunk compiles in well under a second.
const CHUNK_RULES: usize = 256;
const CHUNK_BYTES: usize = 8 * 1024;

/// The ignore rules in force above the walked root: the user's global excludes file and every
/// ancestor directory's `.gitignore` and `.ignore`.
pub(crate) struct Ignores {
    /// Innermost first; each directory's `.ignore` before its `.gitignore`.
    outer: Vec<Gitignore>,
    /// What `outer` counts against the call's budget (the global file aside).
    held: Held,
}

impl Ignores {
    /// Compiles the rules above `root`, within the call's budget; fails when they are too many,
    /// or when the call is cancelled meanwhile.
    pub fn above(root: &Path, stop: &StopFlag) -> Result<Self, ToolError> {
        let mut compiler = RuleCompiler {
            held: Held::default(),
            stop,
        };
        let mut outer = Vec::new();
        for dir in root.ancestors().skip(1) {
            if let Ok(fd) = open_no_symlinks(dir) {
                outer.extend(compiler.rules_in(&fd, dir, Place::Above)?);
            }
        }
        // The user's own file, not a repository's, so it is not counted.
        let (global, _) = Gitignore::global();
        outer.push(global);
        Ok(Ignores {
            outer,
            held: compiler.held,
        })
    }
}

/// Reads one small regular file in `dir`, without following a symlink.
/// An ignore file's text: `Ok(None)` when there is none to read (missing, not a regular file,
/// unreadable), `Err(size)` when it is bigger than [`MAX_IGNORE_FILE_BYTES`].
fn read_small(dir: impl AsFd, name: &str) -> Result<Option<String>, u64> {
    let Ok(fd) = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return Ok(None);
    };
    let Ok(st) = rustix::fs::fstat(&fd) else {
        return Ok(None);
    };
    if file_type(&st) != FileType::RegularFile {
        return Ok(None);
    }
    if st.st_size as u64 > MAX_IGNORE_FILE_BYTES {
        return Err(st.st_size as u64);
    }
    let mut text = String::new();
    let read = std::fs::File::from(fd)
        .take(MAX_IGNORE_FILE_BYTES)
        .read_to_string(&mut text);
    Ok(read.ok().map(|_| text))
}

/// Ignore rules one call holds compiled: how many, and the bytes of their lines.
#[derive(Clone, Copy, Default)]
struct Held {
    rules: usize,
    bytes: usize,
}

/// Where an ignore file lies, for the advice when it brings too many rules.
#[derive(Clone, Copy)]
enum Place {
    /// In a folder above the searched one.
    Above,
    /// In the searched folder or beneath it.
    Inside,
}

/// One ignore file: the folder whose rules it holds, its path, and where that folder lies.
struct IgnoreFile<'a> {
    dir: &'a Path,
    path: PathBuf,
    place: Place,
}

/// Compiles one call's ignore files: within [`MAX_IGNORE_RULES`] and [`MAX_IGNORE_RULE_BYTES`]
/// held at once, and stopping soon after the call is cancelled.
struct RuleCompiler<'a> {
    held: Held,
    stop: &'a StopFlag,
}

impl RuleCompiler<'_> {
    /// The rules a directory holds: `.ignore`, then `.gitignore`, then `.git/info/exclude`.
    fn rules_in(
        &mut self,
        dir: &OwnedFd,
        path: &Path,
        place: Place,
    ) -> Result<Vec<Gitignore>, ToolError> {
        let mut out = Vec::new();
        let source = |name: &str| IgnoreFile {
            dir: path,
            path: path.join(name),
            place,
        };
        let too_big = |file: &IgnoreFile, size: u64| {
            too_many_rules(
                file,
                &format!("{MAX_IGNORE_FILE_BYTES} bytes for one ignore file (it has {size})"),
            )
        };
        for name in [".ignore", ".gitignore"] {
            match read_small(dir, name) {
                Ok(Some(text)) => self.compile(&source(name), &text, &mut out)?,
                Ok(None) => {}
                Err(size) => return Err(too_big(&source(name), size)),
            }
        }
        let exclude = open_beneath(
            dir,
            Path::new(".git/info"),
            OFlags::PATH | OFlags::DIRECTORY,
        );
        if let Ok(info) = exclude {
            let file = source(".git/info/exclude");
            match read_small(&info, "exclude") {
                Ok(Some(text)) => self.compile(&file, &text, &mut out)?,
                Ok(None) => {}
                Err(size) => return Err(too_big(&file, size)),
            }
        }
        Ok(out)
    }

    /// Compiles the rules of `file` (read as `text`) onto `out`, in chunks. The chunks go last
    /// first: the walk takes the first set that matches a path, and so gets the file's last
    /// matching rule, the one git obeys.
    fn compile(
        &mut self,
        file: &IgnoreFile,
        text: &str,
        out: &mut Vec<Gitignore>,
    ) -> Result<(), ToolError> {
        let mut chunks = Vec::new();
        let mut builder = GitignoreBuilder::new(file.dir);
        let mut chunk = Held::default();
        for line in text.lines() {
            if self.stop.is_set() {
                return Err(ToolError::cancelled());
            }
            if let Some(bytes) = rule_bytes(line) {
                self.charge(bytes, file)?;
                chunk.rules += 1;
                chunk.bytes += bytes;
            }
            // A bad line is skipped, as git skips it.
            let _ = builder.add_line(None, line);
            if chunk.rules >= CHUNK_RULES || chunk.bytes >= CHUNK_BYTES {
                let full = std::mem::replace(&mut builder, GitignoreBuilder::new(file.dir));
                chunks.extend(built(&full));
                chunk = Held::default();
            }
        }
        chunks.extend(built(&builder));
        out.extend(chunks.into_iter().rev());
        Ok(())
    }

    /// Counts one more rule of `bytes` bytes against the call's budget.
    fn charge(&mut self, bytes: usize, file: &IgnoreFile) -> Result<(), ToolError> {
        self.held.rules += 1;
        self.held.bytes += bytes;
        // Failing is better than searching without the rules: the result would silently
        // include what they exclude (build output, vendored trees, files kept out of git).
        if self.held.rules > MAX_IGNORE_RULES {
            return Err(too_many_rules(file, &format!("{MAX_IGNORE_RULES} rules")));
        }
        if self.held.bytes > MAX_IGNORE_RULE_BYTES {
            return Err(too_many_rules(
                file,
                &format!("{MAX_IGNORE_RULE_BYTES} bytes of rules"),
            ));
        }
        Ok(())
    }
}

/// The bytes a line counts against the budget: none for blank lines and comments, which compile
/// to nothing.
fn rule_bytes(line: &str) -> Option<usize> {
    let rule = line.trim();
    (!rule.is_empty() && !rule.starts_with('#')).then_some(line.len())
}

fn built(builder: &GitignoreBuilder) -> Option<Gitignore> {
    builder.build().ok().filter(|g| !g.is_empty())
}

fn too_many_rules(file: &IgnoreFile, limit: &str) -> ToolError {
    let dir = file.dir.display();
    let advice = match file.place {
        Place::Above => {
            format!(
                "its rules apply to everything under {dir}, so search a folder outside that one"
            )
        }
        Place::Inside => format!("search a narrower path that leaves out {dir}"),
    };
    ToolError::failed(format!(
        "{} takes the ignore rules in force past {limit}, more than one search compiles (every .gitignore, .ignore and .git/info/exclude above the searched folder and in the folders being searched counts). Searching without them would return files they exclude, so the search stopped with no result; {advice}, or ask the user to shorten that file",
        file.path.display()
    ))
    .with_effect(Effect::None)
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
    /// Compiles the walked directories' rules, counting them with those above.
    compiler: RuleCompiler<'a>,
    /// Why the walk stopped, when it failed.
    failure: Option<ToolError>,
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
        let held_before = self.compiler.held;
        match self.compiler.rules_in(dir, &dir_path, Place::Inside) {
            Ok(rules) => self.inner.push(rules),
            Err(e) => {
                self.failure = Some(e);
                return false;
            }
        }
        let keep_going = self.entries(dir, rel, depth);
        self.inner.pop();
        // Its rules are dropped, so they no longer count against the call's budget.
        self.compiler.held = held_before;
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
/// false to stop. Fails when the ignore rules in force are too many to compile, or when the call
/// is cancelled while they compile.
pub(crate) fn walk(
    root: &OwnedFd,
    root_path: &Path,
    ignores: &Ignores,
    stop: &StopFlag,
    visit: impl FnMut(&Entry) -> bool,
) -> Result<(), ToolError> {
    let mut walker = Walker {
        root,
        root_path,
        inner: Vec::new(),
        outer: ignores,
        compiler: RuleCompiler {
            held: ignores.held,
            stop,
        },
        failure: None,
        stop,
        visit,
    };
    walker.dir(root, Path::new(""), 0);
    walker.failure.map_or(Ok(()), Err)
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
