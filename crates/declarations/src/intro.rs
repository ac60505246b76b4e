//! The script API part of the description: fixed sentences, each present only when it applies
//! (no tool, no word about calls; no MCP tool, no `McpResult`; everything listed, no discovery).
//!
//! The wording of refusals here matches the messages the gate writes: every refusal throws, its
//! `stage` says which step refused, and its message says whether a person was asked.

use crate::description::Globals;

const HEAD: &str = "Write the body of an async JavaScript function (plain source, no code fence) for QuickJS: no Node, files, network or timers; top-level `await` and `return` work.";

const CALLS: &str = "
- `await tools.<name>(args)` gives the result type declared below. Use `Promise.all` for parallel calls; await every call: one not awaited may still run.
- Refusals and failures throw an Error with a `stage`: `validate` (args must match the type; nothing is converted), `policy`, `hook`, `approval`, `budget` or `execute` (the tool failed); its message says whether a person was asked and what to do next.";

const APPROVAL_PLAIN: &str =
    " Writes, `bash` and tools not marked read-only may need a person's approval.";

const APPROVAL_MCP: &str = " Writes, `bash` and MCP tools not marked read-only may need a person's approval.
- MCP tools resolve to an `McpResult`, with `isError: true` if the tool failed; `textOf(result)` joins its text.";

const OUTPUT: &str = "
- Output: `text(v)`, `image(dataUrlOrImageBlock)`, `console.log(...)`, `return v`; `exit()` ends early. `store(key, value)`/`load(key)` keep JSON across runs.";

const OPTIONS: &str = "\n- Optional first line: `// @options: {\"max_output_tokens\": 10000, \"timeout_ms\": 60000}`.";

const CELLS: &str = "
- A run still going at its yield time (`\"yield_after_ms\"` in the options lowers it) returns its output so far with `{cell, status: \"running\"}` and goes on: the `wait` tool with `{cell}` gives more output and the result, `{cell, terminate: true}` stops it. `waiting_for_approval`: a person must answer first.";

const DISCOVERY: &str = " Every tool is callable as `tools.<name>(args)`, listed or not. Finders (async; an unknown name throws, naming the closest):
  `searchTools(query, {limit = 8, namespace?})` → `{name, description}[]` best first, `description` being the tool's text and declaration; `describeTool(name)` → the same text, or with `{schema: true}` its input JSON Schema; `describeNamespace(name)` → `{name, description?, instructions?, unavailable?, tools: string[]}`. `ALL_TOOLS`: `{name, description}[]`.";

const EXAMPLE_PLAIN: &str = "

Example:
```js
const texts = await Promise.all(paths.map(path => tools.<name>({ path })));
text(texts.filter(t => t.includes(\"TODO\")).length);
```";

const EXAMPLE_MCP: &str = "

Example:
```js
const rs = await Promise.all(queries.map(query => tools.<name>({ query })));
text(rs.filter(r => !r.isError).map(textOf).join(\"\\n\"));
```";

/// What the listing leaves out, so the model knows when to search.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Omitted {
    /// Namespaces shown only by heading, over the listing's budget.
    pub namespaces: bool,
    /// Tools kept out of the listing by configuration (`deferred`).
    pub deferred: bool,
    /// Descriptions or comments cut short, ending in `…`.
    pub shortened: bool,
    /// Parameter comments left out.
    pub parameter_docs: bool,
}

impl Omitted {
    fn any(&self) -> bool {
        self.namespaces || self.deferred || self.shortened || self.parameter_docs
    }
}

pub(crate) struct Intro<'a> {
    /// Some tool is callable from scripts.
    pub tools: bool,
    /// Some callable tool resolves to an `McpResult`.
    pub mcp: bool,
    /// Some tool is listed in the declarations below.
    pub listed: bool,
    pub omitted: Omitted,
    pub globals: &'a Globals,
    /// Direct tools (mode `on`) as `tools.x`, callable here with the same arguments.
    pub direct: &'a [String],
    /// A listed tool whose namespace is printed as `Ns<prefix, …>`, named in full as an example.
    pub prefixed: Option<&'a str>,
}

impl Intro<'_> {
    pub(crate) fn render(&self) -> String {
        let mut out = String::from(HEAD);
        if self.tools {
            out.push_str(CALLS);
            out.push_str(if self.mcp {
                APPROVAL_MCP
            } else {
                APPROVAL_PLAIN
            });
            if let Some(example) = self.prefixed {
                out.push_str(&format!(
                    "\n- `Ns<P, {{…}}>` declares tools named with the prefix `P`: `tools.{example}(args)`."
                ));
            }
        }
        out.push_str(OUTPUT);
        if self.globals.models {
            out.push('\n');
            match &self.globals.models_doc {
                Some(doc) => out.push_str(&format!(
                    "- `models`: classifiers and image generation; read {doc} first."
                )),
                None => out.push_str(
                    "- `models`: classifiers and image generation: `models.getAvailableOfType(type)`, `models.classify(model, context)`, `models.generateImages(model, context)`.",
                ),
            }
        }
        out.push_str(OPTIONS);
        if self.globals.cells {
            out.push_str(CELLS);
        }
        if self.omitted.any() {
            out.push_str(&self.left_out());
            out.push_str(DISCOVERY);
        }
        if !self.direct.is_empty() {
            out.push_str(&format!(
                "\n\nYour declared tools are callable here too, with the same arguments: {}.",
                self.direct.join(", ")
            ));
        }
        if self.listed {
            out.push_str(if self.mcp { EXAMPLE_MCP } else { EXAMPLE_PLAIN });
        }
        out
    }

    /// One line saying what the listing leaves out, and the rule that decided it.
    fn left_out(&self) -> String {
        let mut parts: Vec<&str> = Vec::new();
        if self.omitted.namespaces {
            parts.push(
                "namespaces marked `not listed` (the budget takes whole namespaces, smallest first)",
            );
        }
        if self.omitted.deferred {
            parts.push("search-only tools");
        }
        if self.omitted.shortened {
            parts.push("text after `…`");
        }
        if self.omitted.parameter_docs {
            parts.push("parameter comments");
        }
        format!("\n- Not listed below: {}.", parts.join(", "))
    }
}
