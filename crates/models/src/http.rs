//! One JSON POST to a provider, bounded in time and size. Every failure is a message for the
//! script's result (`stopReason: "error"`), never a panic or an unbounded read.

use std::time::Duration;

use serde_json::Value;

/// Limits of the HTTP exchanges with providers.
#[derive(Debug, Clone)]
pub struct ModelsHttpConfig {
    /// How long to wait for a TCP (and TLS) connection.
    pub connect_timeout: Duration,
    /// How long one whole exchange may take, from sending to the last byte of the answer.
    pub request_timeout: Duration,
    /// Largest answer body read; a larger one is refused without reading the rest, so a
    /// misbehaving provider cannot exhaust memory.
    pub max_response_bytes: usize,
}

impl Default for ModelsHttpConfig {
    /// 10 s to connect, 120 s per call (image models are slow), 16 MiB per answer (a few
    /// base64 images of a few megabytes each).
    fn default() -> Self {
        ModelsHttpConfig {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(120),
            max_response_bytes: 16 * 1024 * 1024,
        }
    }
}

/// What to send: the URL, the credential and the catalog's extra headers.
pub(crate) struct Outgoing<'a> {
    pub provider: &'a str,
    pub url: String,
    pub api_key: Option<String>,
    pub headers: &'a [(String, String)],
    pub body: Value,
}

#[derive(Clone)]
pub(crate) struct HttpClient {
    client: reqwest::Client,
    config: ModelsHttpConfig,
}

impl HttpClient {
    pub(crate) fn new(config: ModelsHttpConfig) -> Self {
        // Building a client fails only when TLS or the resolver cannot start; the default
        // client is the best fallback then, and its own errors surface per request.
        // No redirects: following one would send the catalog's headers (which may hold a key;
        // reqwest drops only `Authorization` across hosts) and the script's data to a URL the
        // user never configured.
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_else(|_| unfollowing_client());
        HttpClient { client, config }
    }

    /// Posts `out.body` and returns the JSON answer, or a message saying what went wrong.
    /// A message never holds a configured credential: providers echo keys in error bodies.
    pub(crate) async fn post_json(&self, out: Outgoing<'_>) -> Result<Value, String> {
        let provider = out.provider.to_string();
        let mut secrets: Vec<String> = out.api_key.iter().cloned().collect();
        secrets.extend(out.headers.iter().map(|(_, v)| v.clone()));
        let limit = self.config.request_timeout;
        let result = match tokio::time::timeout(limit, self.exchange(out)).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "the provider \"{provider}\" did not answer within {} s",
                limit.as_secs_f64()
            )),
        };
        // Redacted whole, then cut: a key cut in half would pass as no key.
        result.map_err(|message| cut(&redact(&message, &secrets), MAX_MESSAGE_CHARS))
    }

    async fn exchange(&self, out: Outgoing<'_>) -> Result<Value, String> {
        let provider = out.provider;
        let mut request = self.client.post(&out.url).json(&out.body);
        for (name, value) in out.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        if let Some(key) = &out.api_key {
            request = request.bearer_auth(key);
        }
        let mut response = request.send().await.map_err(|e| {
            format!(
                "the provider \"{provider}\" could not be reached: {}",
                chain(e)
            )
        })?;
        let status = response.status();
        let max = self.config.max_response_bytes;
        if let Some(len) = response.content_length()
            && len > max as u64
        {
            return Err(format!(
                "the provider \"{provider}\" sent an answer of {len} bytes, more than the limit of {max} bytes"
            ));
        }
        let mut body: Vec<u8> = Vec::new();
        loop {
            let chunk = response.chunk().await.map_err(|e| {
                format!(
                    "the provider \"{provider}\" broke off its answer: {}",
                    chain(e)
                )
            })?;
            let Some(chunk) = chunk else { break };
            if body.len() + chunk.len() > max {
                return Err(format!(
                    "the provider \"{provider}\" sent an answer larger than the limit of {max} bytes; it was not read further"
                ));
            }
            body.extend_from_slice(&chunk);
        }
        if status.is_redirection() {
            // The target is not shown: scripts never see provider URLs.
            return Err(format!(
                "the provider \"{provider}\" answered HTTP {} (a redirect); codemode does not follow redirects from providers, so the request was not sent on. Set the provider's baseUrl in models.json to the address it redirects to",
                status.as_u16()
            ));
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            // Whole here: `post_json` cuts the message once it is redacted.
            return Err(format!(
                "the provider \"{provider}\" answered HTTP {}: {}",
                status.as_u16(),
                text.trim()
            ));
        }
        serde_json::from_slice(&body)
            .map_err(|e| format!("the provider \"{provider}\" answered with malformed JSON ({e})"))
    }
}

/// A client with only the settings that keep data where it was sent, for when the configured
/// one cannot be built; its own errors surface per request.
fn unfollowing_client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default()
}

/// The error and its causes in one line, without the URL (scripts never see provider URLs).
fn chain(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Longest error message about a provider's answer that a script is shown.
const MAX_MESSAGE_CHARS: usize = 400;

fn cut(message: &str, max_chars: usize) -> String {
    match message.char_indices().nth(max_chars) {
        Some((at, _)) => format!("{}…", &message[..at]),
        None => message.to_string(),
    }
}

/// Shortest configured value treated as a secret; shorter header values (`1`, `json`) would
/// only garble the message.
const MIN_SECRET_LEN: usize = 6;

/// Removes every configured credential, and whatever follows `Bearer ` (a key the provider
/// echoes that codemode did not send, or one it transformed), from a message.
pub(crate) fn redact(message: &str, secrets: &[String]) -> String {
    let mut text = message.to_string();
    for secret in secrets {
        let secret = secret.trim();
        let secret = secret.strip_prefix("Bearer ").unwrap_or(secret).trim();
        if secret.len() >= MIN_SECRET_LEN {
            text = text.replace(secret, "[redacted]");
        }
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = find_bearer(rest) {
        let after = at + "bearer ".len();
        out.push_str(&rest[..after]);
        let tail = &rest[after..];
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ';' | '}'))
            .unwrap_or(tail.len());
        if end > 0 {
            out.push_str("[redacted]");
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Byte offset of the next `bearer ` in any case.
fn find_bearer(text: &str) -> Option<usize> {
    text.to_ascii_lowercase().find("bearer ")
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn keys_and_bearer_tokens_are_removed() {
        let secrets = vec!["sk-test-123456".to_string(), "x".to_string()];
        let m = redact(
            "Invalid API key provided: Bearer sk-test-123456 for url /v1; also BEARER sk-other, and sk-test-123456x",
            &secrets,
        );
        assert!(!m.contains("sk-test-123456"), "{m}");
        assert!(!m.contains("sk-other"), "{m}");
        assert!(m.contains("Invalid API key provided"), "{m}");
        assert!(m.contains("for url /v1"), "{m}");
    }
}
