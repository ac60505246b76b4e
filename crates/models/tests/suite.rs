//! Every integration test of this crate in one binary: one link instead of one per file,
//! which keeps the build's disk use and link time down. A file that needs a process of its
//! own (a global allocator, its own `main`, its own memory figures) stays a separate target.

#[macro_use]
mod common;
mod catalog;
mod classify;
mod concurrency;
mod fail_closed;
mod failures;
mod gated;
mod images;
mod redirects;
