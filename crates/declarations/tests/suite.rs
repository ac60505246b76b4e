//! Every integration test of this crate in one binary: one link instead of one per file,
//! which keeps the build's disk use and link time down. A file that needs a process of its
//! own (a global allocator, its own `main`, its own memory figures) stays a separate target.

#[macro_use]
mod support;
mod bad_input;
mod description;
mod fuzz_schemas;
mod golden;
mod hostile_text;
mod search;
mod typescript;
