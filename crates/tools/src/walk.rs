//! Walking a directory tree the way a developer expects: sorted, `.gitignore` respected.

use std::path::Path;

use codemode_spec::ToolError;
use globset::{GlobBuilder, GlobMatcher};
use ignore::{DirEntry, WalkBuilder};

use crate::support::StopFlag;

/// A glob as `find` and `grep` take it. A pattern without `/` matches a file's name anywhere in
/// the tree (`*.rs`); a pattern with `/` matches the path relative to the searched root
/// (`src/**/*.rs`), and then `*` does not cross directories.
pub(crate) struct PathGlob {
    matcher: GlobMatcher,
    whole_path: bool,
}

impl PathGlob {
    pub fn new(pattern: &str) -> Result<Self, ToolError> {
        let whole_path = pattern.contains('/');
        let pattern = pattern.strip_prefix("./").unwrap_or(pattern);
        let glob = GlobBuilder::new(pattern)
            .literal_separator(whole_path)
            .backslash_escape(true)
            .build()
            .map_err(|e| {
                ToolError::invalid(format!(
                    "invalid glob `{pattern}`: {e}; use *, ?, ** and [..] (e.g. `*.rs` or `src/**/*.ts`)"
                ))
            })?;
        Ok(PathGlob {
            matcher: glob.compile_matcher(),
            whole_path,
        })
    }

    pub fn matches(&self, root: &Path, path: &Path) -> bool {
        if self.whole_path {
            let rel = path.strip_prefix(root).unwrap_or(path);
            self.matcher.is_match(rel)
        } else {
            path.file_name()
                .is_some_and(|name| self.matcher.is_match(Path::new(name)))
        }
    }
}

/// Visits every entry under `root` (the root itself excluded) in sorted order, skipping what
/// `.gitignore`, `.ignore` and git's exclude files exclude, and the `.git` directory. Hidden files
/// are included: dot-directories such as `.github` matter in code. `visit` returns false to stop.
pub(crate) fn walk(root: &Path, stop: &StopFlag, mut visit: impl FnMut(&DirEntry) -> bool) {
    let walker = WalkBuilder::new(root)
        .hidden(false)
        .git_ignore(true)
        .git_exclude(true)
        .ignore(true)
        // Respect .gitignore also outside a git checkout, as a person reading it would.
        .require_git(false)
        .sort_by_file_name(|a, b| a.cmp(b))
        .filter_entry(|e| e.file_name() != ".git")
        .build();
    for entry in walker {
        if stop.is_set() {
            return;
        }
        // Unreadable entries are skipped; a search reports what it could read.
        let Ok(entry) = entry else { continue };
        if entry.depth() == 0 {
            continue;
        }
        if !visit(&entry) {
            return;
        }
    }
}
