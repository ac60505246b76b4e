//! Every integration test of this crate in one binary: one link instead of one per file,
//! which keeps the build's disk use and link time down. A file that needs a process of its
//! own (a global allocator, its own `main`, its own memory figures) stays a separate target.

#[macro_use]
mod common;
mod authority;
mod bridge_calls;
mod cell_principal;
mod cells;
mod cells_model_replay;
mod deadline_with_pending_question;
mod integrity;
mod no_bypass;
mod read_only_globals;
mod results_on_their_way;
mod script_principal_share;
mod session_end_store;
