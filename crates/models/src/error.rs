//! Errors of the catalog: every one names where the bad input came from and how to fix it.

use std::path::PathBuf;

/// A catalog that could not be loaded or a question it cannot answer.
#[derive(Debug, thiserror::Error)]
pub enum ModelsError {
    /// A models.json file exists but could not be read.
    #[error("cannot read the models file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A models.json file is not JSON.
    #[error("the models file {file} is not valid JSON: {message}")]
    Syntax { file: String, message: String },
    /// A value in a models file has the wrong shape.
    #[error("the models file {file} has a bad value at `{key}`: {message}")]
    Invalid {
        file: String,
        key: String,
        message: String,
    },
    /// A script asked for a model type that does not exist.
    #[error("unknown model type {0}; the types are \"chat\", \"image\" and \"classifier\"")]
    UnknownType(String),
}
