//! The HTTP client under rmcp's streamable HTTP transport, with the stdio screen's bounds.
//!
//! rmcp's own client bounds a body or an event by bytes (16 MiB), then parses it whole. Parsing
//! costs memory by values, not bytes: 15 MiB of `[0,0,…]` is 7.5 million values, which took a
//! stdio answer past 1 GB before its screen. This client reads what a server answers itself: a
//! JSON body is bounded and screened ([`Scanner`]) before it is parsed, and an event stream is
//! read by [`screened_events`]. A response past a bound becomes a JSON-RPC error for the request
//! it answered, which says what was wrong; the session goes on.
//!
//! It does what rmcp's client does otherwise: the same headers, statuses and redirects (only
//! same-origin 307 and 308, which keep the method and body). It does not take part in OAuth:
//! codemode sends a server's configured headers and nothing else.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue, StatusCode};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, HttpStatusError, InsufficientScopeError, SseError, StreamableHttpClient,
    StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use sse_stream::Sse;

use super::screen::{Scanner, cut, refusal, rejected, unreadable};
use super::sse_events::screened_events;

const SESSION_ID: &str = "mcp-session-id";
const LAST_EVENT_ID: &str = "last-event-id";
const EVENT_STREAM: &str = "text/event-stream";
const JSON: &str = "application/json";
/// Redirects followed for one request, at most.
const MAX_REDIRECTS: usize = 10;
/// How much of a failed request's non-JSON body is kept, to say what went wrong.
const DIAGNOSTIC_BYTES: usize = 4096;
/// How long a failed request's body is waited for, to say what went wrong.
const ERROR_BODY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

type Error = StreamableHttpError<reqwest::Error>;

/// A reqwest client that screens what the server answers; see the module docs.
#[derive(Clone)]
pub(crate) struct ScreenedHttp {
    server: Arc<str>,
    client: reqwest::Client,
}

impl ScreenedHttp {
    pub(crate) fn new(server: Arc<str>) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            // A connection taken back from the pool after a body not read to its end stalls on
            // delayed ACKs (rmcp's client turns pooling off for the same reason).
            .pool_max_idle_per_host(0)
            .redirect(same_origin_redirects())
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        Ok(ScreenedHttp { server, client })
    }

    fn request(
        &self,
        builder: reqwest::RequestBuilder,
        session_id: Option<&str>,
        auth: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<reqwest::RequestBuilder, Error> {
        let mut builder = builder.header(http::header::ACCEPT, format!("{EVENT_STREAM}, {JSON}"));
        for (name, value) in custom_headers {
            if [http::header::ACCEPT.as_str(), SESSION_ID, LAST_EVENT_ID].contains(&name.as_str()) {
                return Err(StreamableHttpError::ReservedHeaderConflict(
                    name.to_string(),
                ));
            }
            builder = builder.header(name, value);
        }
        if let Some(auth) = auth {
            builder = builder.bearer_auth(auth);
        }
        if let Some(session_id) = session_id {
            builder = builder.header(SESSION_ID, session_id);
        }
        Ok(builder)
    }

    /// A successful JSON body, screened, then parsed once.
    async fn json_answer(
        &self,
        response: reqwest::Response,
        message: &ClientJsonRpcMessage,
        max: usize,
    ) -> Result<Option<ServerJsonRpcMessage>, Error> {
        let (body, scanned, oversized) = read_screened(response, max).await?;
        let request_id = request_id(message);
        if let Some(why) = refusal(&scanned, oversized, max) {
            return Ok(rejected(&self.server, request_id, &why));
        }
        match serde_json::from_slice::<ServerJsonRpcMessage>(&body) {
            // An error that names no request (a server that could not read this one) is this
            // request's answer: rmcp could match it to nothing, and the call would wait.
            Ok(ServerJsonRpcMessage::Error(error))
                if error.id.is_none() && request_id.is_some() =>
            {
                let why = format!(
                    "the server answered with an error that names no request: {}",
                    cut(&error.error.message)
                );
                Ok(rejected(&self.server, request_id, &why))
            }
            Ok(message) => Ok(Some(message)),
            Err(e) => Ok(rejected(&self.server, request_id, &unreadable(e))),
        }
    }

    /// A failed POST. A request is answered with an error that says what the server answered
    /// (its JSON-RPC error's message, when it sent one), so its call fails at once and says
    /// why; anything else fails the send, as rmcp's client does.
    async fn failed_post(
        &self,
        response: reqwest::Response,
        message: &ClientJsonRpcMessage,
        is_json: bool,
        max: usize,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let status = response.status();
        let status_error = status_error(&response);
        // The status is known: a body that is slow to come does not hold the call up long.
        let said = if is_json && status != StatusCode::TOO_MANY_REQUESTS {
            match tokio::time::timeout(ERROR_BODY_WAIT, read_screened(response, max)).await {
                Err(_) => body_late(),
                Ok(read) => {
                    let (body, scanned, oversized) = read?;
                    match refusal(&scanned, oversized, max) {
                        Some(why) => why,
                        None => match serde_json::from_slice::<ServerJsonRpcMessage>(&body) {
                            Ok(ServerJsonRpcMessage::Error(error)) => cut(&error.error.message),
                            _ => diagnostic(&body),
                        },
                    }
                }
            }
        } else if status_error.is_some() {
            String::new()
        } else {
            let prefix = read_prefix(response, DIAGNOSTIC_BYTES);
            match tokio::time::timeout(ERROR_BODY_WAIT, prefix).await {
                Ok(prefix) => diagnostic(&prefix),
                Err(_) => body_late(),
            }
        };
        let Some(id) = request_id(message) else {
            return Err(status_error.map(Error::from).unwrap_or_else(|| {
                Error::UnexpectedServerResponse(Cow::Owned(format!("HTTP {status}: {said}")))
            }));
        };
        let why = if said.is_empty() {
            format!("the server answered HTTP {status}")
        } else {
            format!("the server answered HTTP {status}: {said}")
        };
        match rejected(&self.server, Some(id), &why) {
            Some(answer) => Ok(StreamableHttpPostResponse::Json(answer, None)),
            None => Err(Error::UnexpectedServerResponse(Cow::Owned(why))),
        }
    }
}

impl StreamableHttpClient for ScreenedHttp {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let limits = StreamableHttpResponseLimits::default();
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let had_session = session_id.is_some();
        let request = self.request(
            self.client.post(uri.as_ref()),
            session_id.as_deref(),
            auth,
            custom_headers,
        )?;
        let response = request.json(&message).send().await?;
        let status = response.status();
        if let Some(error) = auth_error(&response)? {
            return Err(error);
        }
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == StatusCode::NOT_FOUND && had_session {
            return Err(Error::SessionExpired);
        }
        let content_type = content_type(&response);
        let is = |expected: &str| content_type.as_deref().is_some_and(|ct| ct == expected);
        if !status.is_success() {
            return self
                .failed_post(response, &message, is(JSON), limits.max_json_response_size)
                .await;
        }
        let new_session = response
            .headers()
            .get(SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let awaits_nothing = !matches!(message, ClientJsonRpcMessage::Request(_));
        if awaits_nothing && response.content_length() == Some(0) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if is(EVENT_STREAM) {
            let events = screened_events(
                self.server.clone(),
                response.bytes_stream(),
                limits.max_sse_event_size,
                request_id(&message),
            );
            return Ok(StreamableHttpPostResponse::Sse(events, new_session));
        }
        if is(JSON) {
            return match self
                .json_answer(response, &message, limits.max_json_response_size)
                .await?
            {
                Some(answer) => Ok(StreamableHttpPostResponse::Json(answer, new_session)),
                None => Ok(StreamableHttpPostResponse::Accepted),
            };
        }
        if awaits_nothing {
            // Some servers answer a notification with 200 and no content type.
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        Err(Error::UnexpectedContentType(content_type))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Error> {
        let request = self.request(
            self.client.delete(uri.as_ref()),
            Some(&session_id),
            auth,
            custom_headers,
        )?;
        let response = request.send().await?;
        if response.status() == StatusCode::METHOD_NOT_ALLOWED {
            return Ok(());
        }
        response.error_for_status()?;
        Ok(())
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Error> {
        let max = StreamableHttpResponseLimits::default().max_sse_event_size;
        self.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth,
            custom_headers,
            max,
        )
        .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Error> {
        let mut request = self.request(
            self.client.get(uri.as_ref()),
            session_id.as_deref(),
            auth,
            custom_headers,
        )?;
        if let Some(last_event_id) = last_event_id {
            request = request.header(LAST_EVENT_ID, last_event_id);
        }
        let response = request.send().await?;
        if response.status() == StatusCode::METHOD_NOT_ALLOWED {
            return Err(Error::ServerDoesNotSupportSse);
        }
        if let Some(error) = auth_error(&response)? {
            return Err(error);
        }
        if let Some(error) = status_error(&response) {
            return Err(error.into());
        }
        let response = response.error_for_status()?;
        match content_type(&response) {
            Some(ct) if ct == EVENT_STREAM || ct == JSON => {}
            other => return Err(Error::UnexpectedContentType(other)),
        }
        Ok(screened_events(
            self.server.clone(),
            response.bytes_stream(),
            max_sse_event_size,
            None,
        ))
    }
}

/// A 401 or 403 with a challenge, as rmcp reports it.
fn auth_error(response: &reqwest::Response) -> Result<Option<Error>, Error> {
    let status = response.status();
    if !matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
        return Ok(None);
    }
    let Some(header) = response.headers().get(http::header::WWW_AUTHENTICATE) else {
        return Ok(None);
    };
    let header = header.to_str().map_err(|_| {
        Error::UnexpectedServerResponse(Cow::Borrowed("invalid www-authenticate header value"))
    })?;
    Ok(Some(if status == StatusCode::UNAUTHORIZED {
        Error::AuthRequired(AuthRequiredError::new(header.to_owned()))
    } else {
        Error::InsufficientScope(InsufficientScopeError::new(header.to_owned(), None))
    }))
}

/// A 429 or 5xx, with its `Retry-After`, as rmcp reports it.
fn status_error(response: &reqwest::Response) -> Option<HttpStatusError> {
    let status = response.status();
    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Some(HttpStatusError::new(status.as_u16(), retry_after))
}

/// The media type, without parameters, in lower case.
fn content_type(response: &reqwest::Response) -> Option<String> {
    let value = response.headers().get(http::header::CONTENT_TYPE)?;
    let value = String::from_utf8_lossy(value.as_bytes());
    let essence = value.split(';').next().unwrap_or_default();
    Some(essence.trim_matches([' ', '\t']).to_ascii_lowercase())
}

/// The body, at most `max` bytes, screened as it arrives. A body past `max` (declared or sent)
/// is not kept: only its screen is returned, `oversized`.
async fn read_screened(
    response: reqwest::Response,
    max: usize,
) -> Result<(Vec<u8>, Scanner, bool), Error> {
    let mut scanner = Scanner::default();
    if response.content_length().is_some_and(|n| n > max as u64) {
        return Ok((Vec::new(), scanner, true));
    }
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        let oversized = chunk.len() > max - body.len();
        scanner.feed(&chunk);
        // Past a bound, the rest is not read: it may be slow to come, or never end.
        if oversized || refusal(&scanner, false, max).is_some() {
            return Ok((Vec::new(), scanner, oversized));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, scanner, false))
}

/// The id of `message`, if it is a request.
fn request_id(message: &ClientJsonRpcMessage) -> Option<serde_json::Value> {
    match message {
        ClientJsonRpcMessage::Request(request) => serde_json::to_value(&request.id).ok(),
        _ => None,
    }
}

/// The first `max` bytes of the body, for a diagnostic; a body that fails to read gives none.
async fn read_prefix(response: reqwest::Response, max: usize) -> Vec<u8> {
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while body.len() < max {
        match chunks.next().await {
            Some(Ok(chunk)) => {
                let take = chunk.len().min(max - body.len());
                body.extend_from_slice(&chunk[..take]);
            }
            _ => break,
        }
    }
    body
}

fn body_late() -> String {
    format!(
        "(its body did not arrive within {} s)",
        ERROR_BODY_WAIT.as_secs()
    )
}

fn diagnostic(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(DIAGNOSTIC_BYTES)]);
    if text.trim().is_empty() {
        "<empty>".to_owned()
    } else {
        text.into_owned()
    }
}

/// Only same-origin 307 and 308: they keep the method and body. A 301, 302 or 303 would turn
/// the POST into a GET without its message, and another origin would receive the session id
/// and the configured headers.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT
        );
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if !keeps_body || !same_origin {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    })
}
