//! Every integration test of this crate in one binary: one link instead of one per file,
//! which keeps the build's disk use and link time down. A file that needs a process of its
//! own (a global allocator, its own `main`, its own memory figures) stays a separate target.

#[macro_use]
mod common;
mod approval_text;
mod audit;
mod budgets_and_models;
mod hooks;
mod integrity;
mod journal;
mod model_rules;
mod policy;
mod refusal_wording;
mod resolve;
mod session_memory;
mod shared_state;
mod validate;
