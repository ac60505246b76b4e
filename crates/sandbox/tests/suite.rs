//! Every integration test of this crate in one binary: one link instead of one per file,
//! which keeps the build's disk use and link time down. A file that needs a process of its
//! own (a global allocator, its own `main`, its own memory figures) stays a separate target.

#[macro_use]
mod common;
mod api;
mod base64;
mod basics;
mod determinism;
mod environment;
mod errors;
mod held_answers;
mod hostile;
mod isolation;
mod limits;
mod model_text;
mod pool_growth;
mod queue_wait;
mod results;
mod reuse;
mod source;
mod text_of;
