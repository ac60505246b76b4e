//! `grep`: lines matching a regular expression, across a tree.

use std::path::Path;
use std::sync::Arc;

use codemode_spec::{BoxFuture, CallFacts, Tool, ToolCall, ToolError, ToolOutput, ToolSpec};
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::sinks::Lossy;
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::args::parse;
use crate::paths::path_facts;
use crate::support::{Behaviour, Context, StopFlag, make_spec, run_blocking, text_output};
use crate::walk::{PathGlob, walk};

const DEFAULT_LIMIT: usize = 200;
/// Characters of a matching line shown before it is cut.
const MAX_LINE_CHARS: usize = 500;

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
                "Search file contents with a regular expression (Rust regex syntax, like ripgrep). Results are `path:line:text`, sorted by path and line. Searches a file or a whole directory, skipping what .gitignore excludes, the .git directory and binary files. `glob` limits the files searched (`*.rs`, or `src/**/*.ts` relative to the searched directory). At most `limit` matching lines (default {DEFAULT_LIMIT})."
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
            Some(json!({"type": "string"})),
            Behaviour::ReadOnly,
        );
        GrepTool { ctx, spec }
    }
}

impl Tool for GrepTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn facts(&self, args: &Value) -> Result<CallFacts, ToolError> {
        let args: GrepArgs = parse("grep", args)?;
        let root = self.ctx.resolve_root(args.path.as_deref())?;
        path_facts(&root)
    }

    fn call(&self, call: ToolCall) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            let args: GrepArgs = parse("grep", &call.args)?;
            let root = ctx.resolve_root(args.path.as_deref())?;
            let matcher = RegexMatcherBuilder::new()
                .case_insensitive(args.ignore_case)
                .build(&args.pattern)
                .map_err(|e| {
                    ToolError::invalid(format!(
                        "invalid regular expression `{}`: {e}; escape special characters such as ( [ . * with a backslash to match them literally",
                        args.pattern
                    ))
                })?;
            let glob = args.glob.as_deref().map(PathGlob::new).transpose()?;
            let limit = args.limit.unwrap_or(DEFAULT_LIMIT).max(1);
            let inner = ctx.clone();
            run_blocking(call.cancel, move |stop| {
                let search = Search {
                    ctx: &inner,
                    root: &root,
                    matcher: &matcher,
                    glob: glob.as_ref(),
                    limit,
                };
                search.run(&args.pattern, &stop)
            })
            .await
        })
    }
}

struct Search<'a> {
    ctx: &'a Context,
    root: &'a Path,
    matcher: &'a RegexMatcher,
    glob: Option<&'a PathGlob>,
    limit: usize,
}

/// Matching lines gathered so far, bounded by the line limit and the output byte cap.
struct Hits {
    out: String,
    count: usize,
    full: bool,
    byte_cap: bool,
}

impl Search<'_> {
    fn run(&self, pattern: &str, stop: &StopFlag) -> Result<ToolOutput, ToolError> {
        let meta = std::fs::metadata(self.root).map_err(|e| {
            ToolError::failed(format!(
                "cannot search {}: {e}; check the path",
                self.root.display()
            ))
        })?;
        let mut searcher = SearcherBuilder::new()
            .line_number(true)
            .binary_detection(BinaryDetection::quit(0))
            .build();
        let mut hits = Hits {
            out: String::new(),
            count: 0,
            full: false,
            byte_cap: false,
        };
        if meta.is_file() {
            self.search_file(&mut searcher, self.root, &mut hits);
        } else {
            walk(self.root, stop, |entry| {
                let is_file = entry.file_type().is_some_and(|t| t.is_file());
                if is_file && self.glob.is_none_or(|g| g.matches(self.root, entry.path())) {
                    self.search_file(&mut searcher, entry.path(), &mut hits);
                }
                !hits.full
            });
        }
        if hits.count == 0 {
            return Ok(text_output(format!(
                "No matches for `{pattern}` in {}.",
                self.ctx.display(self.root)
            )));
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
        Ok(text_output(hits.out))
    }

    fn search_file(&self, searcher: &mut Searcher, path: &Path, hits: &mut Hits) {
        let shown = self.ctx.display(path);
        let max_bytes = self.ctx.config.max_output_bytes;
        // Unreadable files are skipped, as ripgrep does; the rest of the search still counts.
        let _ = searcher.search_path(
            self.matcher,
            path,
            Lossy(|line_number, text| {
                if hits.count >= self.limit {
                    hits.full = true;
                    return Ok(false);
                }
                let text = text.trim_end_matches(['\n', '\r']);
                let line = format!("{shown}:{line_number}:{}\n", cut(text));
                if hits.out.len() + line.len() > max_bytes {
                    hits.full = true;
                    hits.byte_cap = true;
                    return Ok(false);
                }
                hits.out.push_str(&line);
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
