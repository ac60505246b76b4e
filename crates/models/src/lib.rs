//! Models from scripts: the catalog of providers and models, credentials, and the
//! OpenAI-compatible providers behind `models.classify` and `models.generateImages`.
//!
//! In the reference these calls bypass every hook and policy. Here they are ordinary
//! [`codemode_spec::Tool`]s of kind [`codemode_spec::CallKind::Model`]: [`model_tools`] builds
//! them, their `facts()` validate the call and name the model (provider, id, type, prices) so
//! the gate can apply policy, hooks, approval, budgets and audit. This crate never decides
//! policy itself.
//!
//! A provider failure (timeout, HTTP error, malformed or oversized answer) is a result with
//! `stopReason: "error"` and an `errorMessage`, so the script's promise resolves; a mistake in
//! the script's arguments is refused before any request with a message showing the expected
//! shape.

mod catalog;
mod classify;
mod credentials;
mod describe;
mod error;
mod http;
mod images;
mod limiter;
mod mime;
mod tokens;
mod tools;
mod validate;

#[cfg(feature = "test-provider")]
pub mod testing;

pub use catalog::{Catalog, Model, Price};
pub use error::ModelsError;
pub use http::ModelsHttpConfig;
pub use images::image_count;
pub use limiter::MODEL_CALLS_PER_SCRIPT;
pub use tools::model_tools;
