//! Errors of the catalog: every one names where the bad input came from and how to fix it.

/// A catalog that could not be loaded or a question it cannot answer.
#[derive(Debug, thiserror::Error)]
pub enum ModelsError {
    /// The models configuration is not valid (each problem names its file and key).
    #[error(transparent)]
    Config(#[from] codemode_config::ConfigError),
    /// A script asked for a model type that does not exist.
    #[error("unknown model type {0}; the types are \"chat\", \"image\" and \"classifier\"")]
    UnknownType(String),
}
