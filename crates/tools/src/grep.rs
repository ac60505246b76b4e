//! `grep`: lines matching a regular expression, across a tree.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use codemode_spec::{PreparedCall, Tool, ToolError, ToolOutput, ToolSpec, prepared};
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::sinks::Lossy;
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder};
use rustix::fs::FileType;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::args::parse;
use crate::fs::{Ignores, Leaf, Resolved, open_file_beneath, walk};
use crate::glob::PathGlob;
use crate::paths::path_facts;
use crate::support::{
    Behaviour, Context, StopFlag, make_spec, preview, run_blocking, structured_output,
};

const DEFAULT_LIMIT: usize = 200;
/// Characters of a matching line shown before it is cut.
const MAX_LINE_CHARS: usize = 500;
/// Longest pattern accepted.
const MAX_PATTERN_BYTES: usize = 64 * 1024;
/// Most memory the compiled pattern, and separately its lazy DFA, may use.
const MAX_REGEX_BYTES: usize = 32 * 1024 * 1024;
/// Longest line held while searching; longer lines end the search of that file.
const MAX_LINE_BUFFER_BYTES: usize = 16 * 1024 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrepArgs {
    pattern: String,
    path: Option<String>,
    glob: Option<String>,
    #[serde(default)]
    ignore_case: bool,
    limit: Option<usize>,
}

pub(crate) struct GrepTool {
    ctx: Arc<Context>,
    spec: ToolSpec,
}

impl GrepTool {
    pub fn new(ctx: Arc<Context>) -> Self {
        let spec = make_spec(
            &ctx,
            "grep",
            "Search file contents",
            &format!(
                "Search file contents with a regular expression (Rust regex syntax, like ripgrep). Matching lines come sorted by path and line number; none is an empty list. Searches a file or a whole directory, skipping what .gitignore excludes, the .git directory and binary files. `glob` limits the files searched (`*.rs`, or `src/**/*.ts` relative to the searched directory). At most `limit` matching lines (default {DEFAULT_LIMIT}); `truncated` says there were more."
            ),
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "minLength": 1, "description": "Regular expression to search for."},
                    "path": {"type": "string", "minLength": 1, "description": "File or directory to search (default: the working directory)."},
                    "glob": {"type": "string", "minLength": 1, "description": "Only search files matching this glob."},
                    "ignore_case": {"type": "boolean", "description": "Match case-insensitively (default false)."},
                    "limit": {"type": "integer", "minimum": 1, "description": format!("Most matching lines to return (default {DEFAULT_LIMIT}).")}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
            Some(json!({
                "type": "object",
                "properties": {
                    "matches": {"type": "array", "items": {
                        "type": "object",
                        "properties": {
                            "path": {"type": "string", "description": "Relative to the working directory when inside it, else absolute."},
                            "line": {"type": "integer", "minimum": 1, "description": "1-based line number."},
                            "text": {"type": "string", "description": "The matching line without its line break."}
                        },
                        "required": ["path", "line", "text"],
                        "additionalProperties": false
                    }},
                    "truncated": {"type": "boolean", "description": "More lines matched than are listed (limit or output cap)."}
                },
                "required": ["matches", "truncated"],
                "additionalProperties": false
            })),
            Behaviour::ReadOnly,
        );
        GrepTool { ctx, spec }
    }
}

impl Tool for GrepTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let args: GrepArgs = parse("grep", args)?;
        let matcher = compile(&args.pattern, args.ignore_case)?;
        let glob = args.glob.as_deref().map(PathGlob::new).transpose()?;
        let root = self.ctx.resolve_root(args.path.as_deref())?;
        let facts = path_facts(&root.path)?;
        let limit = args.limit.unwrap_or(DEFAULT_LIMIT).max(1);
        let ctx = self.ctx.clone();
        Ok(prepared(facts, move |run| {
            Box::pin(run_blocking(run.cancel, move |stop| {
                let search = Search {
                    ctx: &ctx,
                    root: &root,
                    matcher: &matcher,
                    glob: glob.as_ref(),
                    limit,
                };
                search.run(&args.pattern, &stop)
            }))
        }))
    }
}

/// Compiles the pattern within bounds: a pattern's size, and the memory its compiled program
/// and lazy DFA may take, are capped, so one call cannot take the host's memory.
fn compile(pattern: &str, ignore_case: bool) -> Result<RegexMatcher, ToolError> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(ToolError::invalid(format!(
            "the pattern is {} bytes long, more than the {MAX_PATTERN_BYTES} grep takes; search for a shorter pattern (or several, one call each)",
            pattern.len()
        )));
    }
    RegexMatcherBuilder::new()
        .case_insensitive(ignore_case)
        .size_limit(MAX_REGEX_BYTES)
        .dfa_size_limit(MAX_REGEX_BYTES)
        .build(pattern)
        .map_err(|e| {
            ToolError::invalid(format!(
                "invalid regular expression `{}`: {}; escape special characters such as ( [ . * with a backslash to match them literally",
                preview(pattern, 200),
                preview(&e.to_string(), 500)
            ))
        })
}

struct Search<'a> {
    ctx: &'a Context,
    root: &'a Resolved,
    matcher: &'a RegexMatcher,
    glob: Option<&'a PathGlob>,
    limit: usize,
}

/// Matching lines gathered so far, bounded by the line limit and the output byte cap: for the
/// script as `{path, line, text}` objects, for a direct call as `path:line:text` lines.
struct Hits {
    matches: Vec<Value>,
    out: String,
    count: usize,
    full: bool,
    byte_cap: bool,
}

impl Search<'_> {
    fn run(&self, pattern: &str, stop: &StopFlag) -> Result<ToolOutput, ToolError> {
        let root_path = &self.root.path;
        let secrets = self.ctx.secrets();
        let mut searcher = SearcherBuilder::new()
            .line_number(true)
            .binary_detection(BinaryDetection::quit(0))
            // A line longer than this is not searched, rather than read whole into memory.
            .heap_limit(Some(MAX_LINE_BUFFER_BYTES))
            .build();
        let mut hits = Hits {
            matches: Vec::new(),
            out: String::new(),
            count: 0,
            full: false,
            byte_cap: false,
        };
        match self.root.leaf {
            Leaf::Entry { .. } => {
                let file = self.root.open_file()?;
                secrets.refuse(&file, root_path)?;
                self.search_file(&mut searcher, file, root_path, &mut hits);
            }
            Leaf::Dir => {
                let fd = self.root.open_dir()?;
                let ignores = Ignores::above(root_path, stop)?;
                walk(&fd, root_path, &ignores, stop, |entry| {
                    let wanted = entry.kind == FileType::RegularFile
                        && self.glob.is_none_or(|g| g.matches(entry.rel));
                    // Opened beneath the root, without symlinks: a file swapped for a link to
                    // somewhere else after it was listed is not read.
                    // A secret file met on the way is skipped as if it were not there.
                    if wanted
                        && let Some(file) = open_file_beneath(&fd, entry.rel)
                        && !secrets.holds(&file)
                    {
                        self.search_file(&mut searcher, file, entry.path, &mut hits);
                    }
                    !hits.full
                })?;
                if stop.is_set() {
                    return Err(ToolError::cancelled());
                }
            }
            Leaf::Missing(_) => {
                return Err(ToolError::failed(format!(
                    "cannot search {}: it does not exist; check the path",
                    root_path.display()
                ))
                .with_effect(codemode_spec::Effect::None));
            }
        }
        if hits.count == 0 {
            return Ok(structured_output(
                json!({"matches": [], "truncated": false}),
                format!(
                    "No matches for `{}` in {}.",
                    preview(pattern, 200),
                    self.ctx.display(root_path)
                ),
            ));
        }
        if hits.full {
            let why = if hits.byte_cap {
                format!(
                    "the output cap of {} bytes was reached",
                    self.ctx.config.max_output_bytes
                )
            } else {
                format!("the limit of {} lines was reached", self.limit)
            };
            hits.out.push_str(&format!(
                "\n[Stopped after {} matching lines because {why}; there are more. Narrow the pattern, path or glob, or raise limit.]\n",
                hits.count
            ));
        }
        Ok(structured_output(
            json!({"matches": hits.matches, "truncated": hits.full}),
            hits.out,
        ))
    }

    fn search_file(&self, searcher: &mut Searcher, file: File, path: &Path, hits: &mut Hits) {
        let shown = self.ctx.display(path);
        let max_bytes = self.ctx.config.max_output_bytes;
        // Unreadable files are skipped, as ripgrep does; the rest of the search still counts.
        let _ = searcher.search_file(
            self.matcher,
            &file,
            Lossy(|line_number, text| {
                if hits.count >= self.limit {
                    hits.full = true;
                    return Ok(false);
                }
                let text = cut(text.trim_end_matches(['\n', '\r']));
                let line = format!("{shown}:{line_number}:{text}\n");
                if hits.out.len() + line.len() > max_bytes {
                    hits.full = true;
                    hits.byte_cap = true;
                    return Ok(false);
                }
                hits.out.push_str(&line);
                hits.matches
                    .push(json!({"path": shown, "line": line_number, "text": text}));
                hits.count += 1;
                Ok(true)
            }),
        );
    }
}

fn cut(text: &str) -> String {
    match text.char_indices().nth(MAX_LINE_CHARS) {
        None => text.to_owned(),
        Some((at, _)) => format!("{}… [line cut]", &text[..at]),
    }
}
