//! Problems in configuration files: each names the file, the key and what to do.

use std::fmt;

/// One thing wrong in one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file (or label, for configuration handed over in memory).
    pub file: String,
    /// Where in the file, as a dotted path (`limits.heap_bytes`, `mcpServers.github.url`);
    /// empty for the whole file.
    pub key: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl Problem {
    pub fn new(
        file: impl Into<String>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Problem {
            file: file.into(),
            key: key.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}: `{}`: {}", self.file, self.key, self.message)
        }
    }
}

/// Why the configuration could not be loaded: every problem found, one per line, so a person
/// fixes them all in one pass instead of one per start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub problems: Vec<Problem>,
}

impl ConfigError {
    pub fn one(problem: Problem) -> Self {
        ConfigError {
            problems: vec![problem],
        }
    }
}

impl From<Problem> for ConfigError {
    fn from(p: Problem) -> Self {
        ConfigError::one(p)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.problems.as_slice() {
            [] => write!(f, "the configuration could not be loaded"),
            [one] => write!(f, "{one}"),
            many => {
                write!(f, "the configuration has {} problems:", many.len())?;
                for p in many {
                    write!(f, "\n  {p}")?;
                }
                Ok(())
            }
        }
    }
}

/// Collects problems while a file is read, so that one bad value does not hide the next.
#[derive(Debug, Default)]
pub(crate) struct Problems(pub Vec<Problem>);

impl Problems {
    pub fn push(&mut self, p: Problem) {
        self.0.push(p);
    }

    pub fn into_result<T>(self, value: T) -> Result<T, ConfigError> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(ConfigError { problems: self.0 })
        }
    }
}

impl std::error::Error for Problem {}
