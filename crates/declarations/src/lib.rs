//! What the model reads about tools.
//!
//! codemode declares one tool to the model (`codemode`) whose description teaches the script API
//! and lists the other tools as TypeScript declarations. This crate turns [`codemode_spec::ToolSpec`]s
//! into that text, as compactly as the model can still use it:
//!
//! - [`render_type`] / [`render_declaration`] / [`tool_sample`]: JSON Schema → TypeScript.
//! - [`codemode_description`]: the codemode tool's description, within a shared token budget.
//! - [`direct_tool_note`]: the line a directly declared tool gets about calling it from scripts.
//! - [`ToolIndex`]: BM25 search and lookups behind `searchTools`, `describeTool`, `describeNamespace`.
//! - [`count_tokens`] / [`direct_definitions_json`]: real token counts, for budgets and benchmarks.
//!
//! It depends only on the shared vocabulary; nothing here runs scripts or calls tools.

mod description;
mod identifiers;
mod intro;
mod mcp_result;
mod note;
mod render;
mod schema;
mod search;
mod shared;
mod tags;
mod text;
mod tokens;

pub use description::{
    DEFAULT_INLINE_BUDGET_TOKENS, DescriptionInput, Globals, LARGE_CATALOG_BUDGET_TOKENS,
    codemode_description, default_inline_budget,
};
pub use identifiers::{IdentifierCollision, identifier_collisions};
pub use mcp_result::mcp_result_schema;
pub use note::direct_tool_note;
pub use render::{
    DEFAULT_MAX_TYPE_CHARS, RenderOptions, all_tools_descriptions, render_declaration, render_type,
    tool_sample,
};
pub use search::{
    DEFAULT_SEARCH_LIMIT, LookupError, MAX_QUERY_BYTES, SearchError, SearchHit, SearchOptions,
    ToolIndex,
};
pub use tokens::{Encoding, count_tokens, direct_definitions_json};
