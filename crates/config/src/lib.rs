//! Where codemode's configuration lives and what it says.
//!
//! One crate reads every configuration file — your `settings.json`, `mcp.json` and
//! `models.json` in [`ConfigPaths::config_dir`], a project's in `<project>/.codemode/`, and the
//! list of projects you trust — and joins yours with a project's by one rule, [`Narrowing`]: an
//! untrusted project may only make things stricter, and every attempt to widen is ignored with a
//! warning naming the file and the key. Problems are errors that name the file, the key and what
//! to do, all of them at once.
//!
//! This crate only reads and decides; it builds nothing. `codemode-setup` turns a
//! [`Configuration`] into a running gate, runtime and MCP hub.
//!
//! ```no_run
//! use codemode_config::{CommandLine, ConfigPaths, Configuration, Limits, Sources};
//!
//! # fn demo() -> Result<(), codemode_config::ConfigError> {
//! let paths = ConfigPaths::from_env().expect("a home directory");
//! let sources = Sources::new(paths).project("/home/me/project");
//! let builtin = Limits { timeout_ms: Some(60_000), ..Limits::default() };
//! let config = Configuration::load(&sources, &CommandLine::default(), &builtin)?;
//! for warning in &config.warnings {
//!     eprintln!("warning: {warning}");
//! }
//! # Ok(())
//! # }
//! ```

pub mod durable;
mod error;
pub mod jsonc;
mod load;
pub mod mcp;
pub mod models;
mod narrow;
mod paths;
pub mod settings;
pub mod trust;

pub use durable::{Durable, WhenNobodyCanAnswer};
pub use error::{ConfigError, Problem};
pub use load::{Activation, Configuration, Sources};
pub use narrow::Narrowing;
pub use paths::{ConfigPaths, ProjectPaths, relative_to_file};
pub use settings::{CommandLine, Limits, PolicySource, Settings};
