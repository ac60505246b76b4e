//! The vocabulary that every codemode crate shares.
//!
//! Data flows one way through codemode: model → sandbox → host bridge → gate → tool → gate → script.
//! This crate holds only the words those stages use to talk to each other: what a tool is
//! ([`ToolSpec`], [`Exposure`], [`Annotations`]), where a call came from ([`Provenance`]), what a tool
//! returns ([`ToolOutput`], [`Usage`]) and the one trait every executor implements ([`Tool`]).
//! It has no behaviour of its own, so that the sandbox, the gate and the tool crates can build in
//! parallel without depending on each other.

mod call;
mod clock;
mod identifier;
mod json_count;
mod schema;
pub mod skeleton;
mod tool;

pub use call::{CallKind, Origin, Provenance, Usage};
pub use clock::{ActiveCall, DeadlineClock, Meter, MeterGuard, PauseGuard};
pub use identifier::{is_identifier, to_identifier};
pub use json_count::{count_json_values, json_text_len};
pub use schema::Schema;
pub use tool::{
    Annotations, BoxFuture, CallFacts, CodemodeMode, ContentBlock, Effect, Exposure, HeldMemory,
    ModelFacts, NamespaceSpec, PathUse, PreparedCall, RunContext, ScriptFacts, Tool, ToolCall,
    ToolError, ToolErrorKind, ToolOutput, ToolSpec, prepared,
};
