//! Globs as `find` and `grep` take them.

use std::path::Path;

use codemode_spec::ToolError;
use globset::{GlobBuilder, GlobMatcher};

/// Longest glob accepted: globs are compiled to regular expressions in memory.
const MAX_GLOB_BYTES: usize = 4096;

/// A glob as `find` and `grep` take it. A pattern without `/` matches a file's name anywhere in
/// the tree (`*.rs`); a pattern with `/` matches the path relative to the searched root
/// (`src/**/*.rs`), and then `*` does not cross directories.
pub(crate) struct PathGlob {
    matcher: GlobMatcher,
    whole_path: bool,
}

impl PathGlob {
    pub fn new(pattern: &str) -> Result<Self, ToolError> {
        if pattern.len() > MAX_GLOB_BYTES {
            return Err(ToolError::invalid(format!(
                "the glob is {} bytes long, more than the {MAX_GLOB_BYTES} a glob may have; use a shorter pattern",
                pattern.len()
            )));
        }
        let whole_path = pattern.contains('/');
        let pattern = pattern.strip_prefix("./").unwrap_or(pattern);
        let glob = GlobBuilder::new(pattern)
            .literal_separator(whole_path)
            .backslash_escape(true)
            .build()
            .map_err(|e| {
                ToolError::invalid(format!(
                    "invalid glob `{}`: {e}; use *, ?, ** and [..] (e.g. `*.rs` or `src/**/*.ts`)",
                    crate::support::preview(pattern, 200)
                ))
            })?;
        Ok(PathGlob {
            matcher: glob.compile_matcher(),
            whole_path,
        })
    }

    /// Whether the entry at `rel` (relative to the searched root) matches.
    pub fn matches(&self, rel: &Path) -> bool {
        if self.whole_path {
            self.matcher.is_match(rel)
        } else {
            rel.file_name()
                .is_some_and(|name| self.matcher.is_match(Path::new(name)))
        }
    }
}
