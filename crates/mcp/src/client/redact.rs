//! Keeping a server's secrets out of what the model reads.
//!
//! Messages about a server (why it is down, a call's failure) reach the codemode description and
//! scripts. They may quote what the configuration gave the server: a token in its URL
//! (`https://user:token@host/mcp?key=…`), a header value an HTTP error body echoes back, an
//! environment value a failing stdio server printed on stderr. Each such value is replaced by
//! `[redacted]` before a message leaves the client.

use crate::config::ServerTransport;

/// Values shorter than this are not treated as secrets (`1`, `true`, `dev` would garble text).
const MIN_SECRET: usize = 6;

/// The values of `transport` that may be secret, longest first.
pub(crate) fn secrets_of(transport: &ServerTransport) -> Vec<String> {
    let lookup = |name: &str| std::env::var(name).ok();
    let mut out: Vec<String> = Vec::new();
    for t in [Some(transport.clone()), transport.expanded(&lookup).ok()]
        .into_iter()
        .flatten()
    {
        match t {
            ServerTransport::Stdio { env, .. } => out.extend(env.into_values()),
            ServerTransport::Http { url, headers } => {
                for value in headers.into_values() {
                    if let Some((_, token)) = value.split_once(' ') {
                        out.push(token.trim().to_string());
                    }
                    out.push(value);
                }
                out.extend(url_secrets(&url));
            }
        }
    }
    out.retain(|s| s.chars().count() >= MIN_SECRET);
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out.dedup();
    out
}

/// The user name, password and query values of a URL.
fn url_secrets(url: &str) -> Vec<String> {
    let mut out = Vec::new();
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = after_scheme
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default();
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        match userinfo.split_once(':') {
            Some((user, password)) => out.extend([user.to_string(), password.to_string()]),
            None => out.push(userinfo.to_string()),
        }
    }
    if let Some((_, query)) = url.split_once('?') {
        let query = query.split('#').next().unwrap_or_default();
        for pair in query.split('&') {
            if let Some((_, value)) = pair.split_once('=') {
                out.push(value.to_string());
            }
        }
    }
    out
}

/// `text` with every secret replaced, and its control characters made visible.
pub(crate) fn redact(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    for secret in secrets {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), "[redacted]");
        }
    }
    visible_controls(&out)
}

/// Every control character but line feed and tab written as `\u{1b}`. A server's words (an
/// error message, its stderr) reach a person's terminal in warnings and the log, where an escape
/// sequence could retitle the window, write the clipboard or clear the screen.
fn visible_controls(text: &str) -> String {
    if !text.chars().any(is_hidden_control) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_hidden_control(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

fn is_hidden_control(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn control_characters_are_shown_not_sent() {
        assert_eq!(
            redact("a\u{1b}]0;t\u{7}b\r\u{9b}\n\tc", &[]),
            "a\\u{1b}]0;t\\u{7}b\\u{d}\\u{9b}\n\tc"
        );
        assert_eq!(redact("plain\nlines", &[]), "plain\nlines");
    }

    #[test]
    fn url_credentials_query_values_and_header_values_are_redacted() {
        let http = ServerTransport::Http {
            url: "http://user1:MCPSECRET@127.0.0.1:18099/mcp?key=QSECRET&x=1".into(),
            headers: BTreeMap::from([("Authorization".into(), "Bearer ghp_HDRSECRET".into())]),
        };
        let secrets = secrets_of(&http);
        let text = "cannot connect to http://user1:MCPSECRET@127.0.0.1:18099/mcp?key=QSECRET&x=1: \
                    401 {\"auth\": \"Bearer ghp_HDRSECRET\", \"token\": \"ghp_HDRSECRET\"}";
        let shown = redact(text, &secrets);
        for secret in ["MCPSECRET", "QSECRET", "ghp_HDRSECRET"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("127.0.0.1:18099/mcp"), "{shown}");
        assert!(shown.contains("x=1"), "short values stay: {shown}");
    }

    #[test]
    fn a_stdio_servers_environment_values_are_redacted() {
        let stdio = ServerTransport::Stdio {
            command: "sh".into(),
            args: vec![],
            env: BTreeMap::from([
                ("T".into(), "tok_ARGSECRET".into()),
                ("D".into(), "1".into()),
            ]),
            cwd: None,
        };
        let shown = redact(
            "stderr: token is tok_ARGSECRET, debug 1",
            &secrets_of(&stdio),
        );
        assert_eq!(shown, "stderr: token is [redacted], debug 1");
    }
}
