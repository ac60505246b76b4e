//! Paths the gate keeps for itself: its configuration, the audit log and its key.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use codemode_spec::{CallFacts, ToolSpec};

use crate::error::{GateError, Stage};

/// A path (a file, or a directory and everything beneath it) that no tool call may change,
/// whatever the policy permits: the project's `.codemode/`, the user's configuration directory,
/// the audit log and its key. Checked on a call's resolved paths before the policy is asked.
///
/// Calls of tools that declare themselves read-only may still read it. A tool that reports no
/// paths (an MCP tool, `bash`'s command line) cannot be checked here; see the README for what
/// that leaves open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtectedPath {
    path: PathBuf,
    /// As given, before symlinks were followed.
    named: PathBuf,
    why: String,
    /// Not even read-only tools may read it.
    secret: bool,
}

impl ProtectedPath {
    /// `path` is resolved as the file tools resolve theirs (symlinks followed, a dangling one
    /// to where a write through it lands), so it compares with the resolved paths they report.
    pub fn new(path: impl AsRef<Path>, why: impl Into<String>) -> Self {
        ProtectedPath {
            path: resolved(path.as_ref()),
            named: path.as_ref().to_path_buf(),
            why: why.into(),
            secret: false,
        }
    }

    /// A path no tool call may read either (the audit key: its holder could forge the log).
    /// Only a call naming the path itself, or a path beneath it, is refused here; a tool that
    /// searches a directory holding it must skip it itself (the built-in tools do, see
    /// `codemode_tools::ToolsConfig::secret_files`).
    pub fn secret(path: impl AsRef<Path>, why: impl Into<String>) -> Self {
        ProtectedPath {
            secret: true,
            ..ProtectedPath::new(path, why)
        }
    }

    pub fn is_secret(&self) -> bool {
        self.secret
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path as it was given, symlinks and all. Whoever keeps the path from programs that
    /// run outside the gate must keep the links on the way too: a program that repointed one
    /// would choose what the next run reads there.
    pub fn named(&self) -> &Path {
        &self.named
    }

    /// Whether `path` is this one or beneath it, its names compared as a case-insensitive file
    /// system compares them (`folded_name`): there `.CODEMODE/settings.json` is the project's
    /// settings file. Elsewhere this keeps a few more names than it must, never fewer.
    fn covers(&self, path: &str) -> bool {
        let mut given = Path::new(path).components();
        self.path.components().all(|mine| {
            given.next().is_some_and(|theirs| {
                folded_name(mine.as_os_str()) == folded_name(theirs.as_os_str())
            })
        })
    }
}

/// A path component as the case-insensitive file systems codemode may work on see it: Unicode
/// case folded (upper then lower case, so `ſ` is `s` and the Kelvin sign `k`), without the
/// code points such file systems ignore in names (`ignorable`),
/// the canonical singletons that stand for ASCII (U+037E is `;`, U+1FEF a backtick), and
/// trailing dots and spaces, which Windows drops. A name that is not UTF-8 is compared as is.
fn folded_name(name: &std::ffi::OsStr) -> std::borrow::Cow<'_, std::ffi::OsStr> {
    let Some(text) = name.to_str() else {
        return std::borrow::Cow::Borrowed(name);
    };
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let ignored = ignorable(c);
        if ignored {
            continue;
        }
        let c = match c {
            '\u{37e}' => ';',
            '\u{1fef}' => '`',
            other => other,
        };
        out.extend(c.to_uppercase().flat_map(char::to_lowercase));
    }
    let kept = out.trim_end_matches(['.', ' ']).len();
    if kept > 0 {
        out.truncate(kept);
    }
    std::borrow::Cow::Owned(out.into())
}

/// Code points some case-insensitive file systems leave out of names: HFS+ drops joiners,
/// direction marks and the byte order mark, and Linux casefolding directories (ext4, f2fs) on
/// kernels before late 2024 drop every default-ignorable code point (soft hyphen, zero-width
/// space, variation selectors, …). There `.code\u{ad}mode` is `.codemode`.
fn ignorable(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{34f}'
            | '\u{61c}'
            | '\u{115f}'..='\u{1160}'
            | '\u{17b4}'..='\u{17b5}'
            | '\u{180b}'..='\u{180f}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff0}'..='\u{fff8}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e0fff}'
    )
}

/// Most symlinks followed while resolving one path, as Linux's own limit; more means a loop.
const MAX_SYMLINK_HOPS: u32 = 40;

/// One step of a path still to resolve.
enum Step {
    Root,
    Parent,
    Name(OsString),
}

fn steps(path: &Path) -> impl DoubleEndedIterator<Item = Step> + '_ {
    path.components().filter_map(|c| match c {
        Component::RootDir => Some(Step::Root),
        Component::ParentDir => Some(Step::Parent),
        Component::Normal(name) => Some(Step::Name(name.to_os_string())),
        Component::CurDir | Component::Prefix(_) => None,
    })
}

/// `path` as the file tools resolve the paths they report: absolute, `..` applied to what is
/// resolved before it, every symlink followed, dangling ones too (a write through one lands at
/// its target), and the names that do not exist yet appended as they are.
pub(crate) fn resolved(path: &Path) -> PathBuf {
    let mut out = if path.is_absolute() {
        PathBuf::from("/")
    } else {
        match std::env::current_dir().and_then(std::fs::canonicalize) {
            Ok(dir) => dir,
            Err(_) => return path.to_path_buf(),
        }
    };
    let mut pending: VecDeque<Step> = steps(path).collect();
    // Names appended past the deepest existing directory: nothing beneath them is looked up.
    let mut missing = 0usize;
    let mut hops = 0u32;
    while let Some(step) = pending.pop_front() {
        match step {
            Step::Root => {
                out = PathBuf::from("/");
                missing = 0;
            }
            Step::Parent => {
                out.pop();
                missing = missing.saturating_sub(1);
            }
            Step::Name(name) => {
                out.push(name);
                if missing > 0 {
                    missing += 1;
                    continue;
                }
                let Ok(meta) = std::fs::symlink_metadata(&out) else {
                    missing = 1;
                    continue;
                };
                if !meta.file_type().is_symlink() || hops == MAX_SYMLINK_HOPS {
                    // A loop keeps the link's own name: nothing can be written through it.
                    continue;
                }
                let Ok(target) = std::fs::read_link(&out) else {
                    continue;
                };
                hops += 1;
                out.pop();
                for step in steps(&target).rev() {
                    pending.push_front(step);
                }
            }
        }
    }
    out
}

/// Refuses a call that may change a protected path, or that names a secret one. Read-only tools
/// may read the others.
pub(crate) fn check(
    protected: &[ProtectedPath],
    spec: &ToolSpec,
    facts: &CallFacts,
) -> Result<(), GateError> {
    if facts.path_use == codemode_spec::PathUse::WorkingDirectory {
        return Ok(());
    }
    for path in &facts.paths {
        if let Some(p) = protected.iter().find(|p| p.secret && p.covers(path)) {
            return Err(GateError::new(
                Stage::Protected,
                format!(
                    "`{}` was refused: {path} is {}, which no tool may read or change whatever the policy permits. No person was asked. Do not retry it",
                    spec.name, p.why
                ),
            ));
        }
    }
    if spec.annotations.read_only_hint == Some(true) {
        return Ok(());
    }
    for path in &facts.paths {
        if let Some(p) = protected.iter().find(|p| p.covers(path)) {
            return Err(GateError::new(
                Stage::Protected,
                format!(
                    "`{}` was refused: it may not change {path}, which is {} and protected whatever the policy permits. No person was asked. Do not retry it; the user can change it by hand outside codemode",
                    spec.name, p.why
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ProtectedPath;

    #[test]
    fn another_spelling_of_a_protected_name_is_covered() {
        let p = ProtectedPath::new("/work/proj/.codemode", "the project's configuration");
        for path in [
            "/work/proj/.codemode",
            "/work/proj/.CODEMODE/settings.json",
            "/work/proj/.Codemode/hooks/x.sh",
            "/WORK/Proj/.codemode/settings.json",
            "/work/proj/.code\u{200d}mode/settings.json",
            "/work/proj/.codemode. /settings.json",
            "/work/proj/.codemode\u{feff}/settings.json",
            "/work/proj/.code\u{ad}mode/settings.json",
            "/work/proj/.code\u{200b}mode/settings.json",
            "/work/proj/.codemode\u{fe0f}/settings.json",
            "/work/proj/.code\u{2064}mode/settings.json",
        ] {
            assert!(p.covers(path), "{path}");
        }
        for path in [
            "/work/proj/.codemodes/x",
            "/work/proj/codemode/x",
            "/work/proj",
        ] {
            assert!(!p.covers(path), "{path}");
        }
        let s = ProtectedPath::new("/home/kate/state", "state");
        assert!(s.covers("/home/\u{212a}ate/\u{17f}tate/audit.key"));
    }
}
