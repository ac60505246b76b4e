//! Choosing a backend by URL: `memory:`, `sqlite:///path/state.db`, `postgres://…`.

use std::path::PathBuf;

use crate::error::{Result, StateError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateUrl {
    Memory,
    Sqlite(PathBuf),
    /// The URL as given (tokio-postgres parses it).
    Postgres(String),
}

impl StateUrl {
    pub fn parse(url: &str) -> Result<Self> {
        let bad = || StateError::BadUrl { url: redact(url) };
        let url = url.trim();
        if url == "memory:" || url == "memory://" {
            return Ok(StateUrl::Memory);
        }
        if let Some(rest) = url.strip_prefix("sqlite:") {
            // sqlite:///abs, sqlite:/abs, sqlite:rel and sqlite://rel all name a file path.
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(bad());
            }
            return Ok(StateUrl::Sqlite(PathBuf::from(path)));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(StateUrl::Postgres(url.to_string()));
        }
        Err(bad())
    }
}

/// The URL without its password, for messages and logs (and `/readyz`, which answers without
/// a token): in the user part, or as a query parameter (`?password=…`, which libpq and
/// tokio-postgres take too).
pub fn redact(url: &str) -> String {
    match url.split_once('?') {
        Some((base, query)) => format!("{}?{}", redact_userinfo(base), redact_query(query)),
        None => redact_userinfo(url),
    }
}

/// Each parameter whose name (percent-decoded, any case) mentions a password gets `***`.
fn redact_query(query: &str) -> String {
    query
        .split('&')
        .map(|pair| {
            let (key, _) = pair.split_once('=').unwrap_or((pair, ""));
            if percent_encoding::percent_decode_str(key)
                .decode_utf8_lossy()
                .to_ascii_lowercase()
                .contains("password")
            {
                format!("{key}=***")
            } else {
                pair.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("&")
}

fn redact_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            let user = userinfo.split(':').next().unwrap_or("");
            let hidden = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                user.to_string()
            };
            format!("{}://{hidden}{}", &url[..scheme_end], &rest[at..])
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_choose_backends() {
        assert_eq!(StateUrl::parse("memory:").unwrap(), StateUrl::Memory);
        assert_eq!(
            StateUrl::parse("sqlite:///var/lib/cm/state.db").unwrap(),
            StateUrl::Sqlite("/var/lib/cm/state.db".into())
        );
        assert_eq!(
            StateUrl::parse("sqlite:state.db").unwrap(),
            StateUrl::Sqlite("state.db".into())
        );
        assert!(matches!(
            StateUrl::parse("postgresql://u@h/db").unwrap(),
            StateUrl::Postgres(_)
        ));
        for bad in ["", "sqlite:", "sqlite://", "mysql://x", "/tmp/state.db"] {
            assert!(StateUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("postgres://me:s3cret@db:5432/cm?sslmode=disable"),
            "postgres://me:***@db:5432/cm?sslmode=disable"
        );
        assert_eq!(redact("postgres://db/cm"), "postgres://db/cm");
        assert_eq!(
            redact("postgres://me@db/cm?sslmode=disable&password=s3cret"),
            "postgres://me@db/cm?sslmode=disable&password=***"
        );
        assert_eq!(
            redact("postgres://me:a@db/cm?PassWord=s3cret&pass%77ord=s3cret"),
            "postgres://me:***@db/cm?PassWord=***&pass%77ord=***"
        );
        let e = StateUrl::parse("mysql://me:s3cret@db/x")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("s3cret"), "{e}");
    }
}
