//! Serving the codemode MCP server over streamable HTTP, hardened as the MCP transport
//! specification asks: `Origin` checked against DNS rebinding, malformed JSON answered with a
//! JSON-RPC parse error, unknown sessions answered with 404, a bearer token compared in constant
//! time, and sessions that end give their memory back.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use codemode_runtime::Codemode;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::ServeOptions;
use super::approval::ElicitationApprover;
use super::handler::{CodemodeHandler, OnEnd};
use super::sessions::{Sessions, Store};
use crate::McpError;

/// The largest request body accepted (rmcp's own limit).
const MAX_BODY: usize = 4 * 1024 * 1024;

/// How `codemode serve --listen` behaves.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Every request must carry `Authorization: Bearer <token>`; required off loopback.
    pub bearer_token: Option<String>,
    /// Browser origins allowed besides loopback ones (`https://app.example.com`,
    /// `http://localhost:*`). A request without `Origin` (not from a browser) is not checked.
    pub allowed_origins: Vec<String>,
    /// A session unused for this long is forgotten with its `store()` values; before that, a
    /// client that comes back with its session id continues where it left off.
    pub session_idle_timeout: Duration,
    /// At most this many sessions are kept; a new one ends the longest-idle one.
    pub max_sessions: usize,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            bearer_token: None,
            allowed_origins: Vec::new(),
            session_idle_timeout: Duration::from_secs(24 * 3600),
            max_sessions: 1000,
        }
    }
}

/// Origins of pages served from this machine, allowed by default.
const LOOPBACK_ORIGINS: [&str; 6] = [
    "http://localhost:*",
    "http://127.0.0.1:*",
    "http://[::1]:*",
    "https://localhost:*",
    "https://127.0.0.1:*",
    "https://[::1]:*",
];

/// A running HTTP server; dropping it does not stop it, [`HttpServer::stop`] does.
pub struct HttpServer {
    /// Where it listens (useful after binding port 0); the first of `local_addrs`.
    pub local_addr: SocketAddr,
    pub local_addrs: Vec<SocketAddr>,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
    janitor: tokio::task::JoinHandle<()>,
}

impl HttpServer {
    /// Stops accepting, ends every session, and waits for the server to finish.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.wait().await;
    }

    /// Waits until the server stops (when the `shutdown` token of its options fires).
    pub async fn wait(self) -> Result<(), McpError> {
        let mut failure = None;
        for task in self.tasks {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failure = Some(format!("the HTTP server failed: {e}")),
                Err(e) => failure = Some(format!("the HTTP server task failed: {e}")),
            }
        }
        self.janitor.abort();
        match failure {
            Some(f) => Err(McpError::Serve(f)),
            None => Ok(()),
        }
    }
}

#[derive(Clone)]
struct Guard {
    token: Option<Arc<[u8]>>,
    sessions: Arc<Sessions>,
}

/// Serves MCP over streamable HTTP at `http://<addr>/mcp` on every address of `addrs`, each
/// client in its own session.
///
/// Binding a non-loopback address requires a bearer token, because whoever reaches the port can
/// run scripts with this installation's authority. The server stops when `opts.shutdown` fires.
pub async fn serve_http(
    codemode: Codemode,
    addrs: &[SocketAddr],
    http: HttpOptions,
    approvals: ElicitationApprover,
    opts: ServeOptions,
) -> Result<HttpServer, McpError> {
    let token = http.bearer_token.clone().filter(|t| !t.is_empty());
    if addrs.is_empty() {
        return Err(McpError::Serve("no address to listen on".into()));
    }
    let public = addrs.iter().any(|a| !a.ip().is_loopback());
    if public && token.is_none() {
        return Err(McpError::Serve(format!(
            "refusing to listen on {} without a bearer token: anyone who reaches it could run \
             scripts with your tools; pass a token, or listen on 127.0.0.1",
            addrs[0]
        )));
    }
    let shutdown = opts.shutdown.clone();
    let manager = Arc::new(LocalSessionManager::default());
    let sessions = Sessions::new(
        codemode.clone(),
        manager.clone(),
        http.session_idle_timeout,
        http.max_sessions.max(1),
    );
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(shutdown.child_token())
        .with_allowed_origins(
            LOOPBACK_ORIGINS
                .iter()
                .map(|s| s.to_string())
                .chain(http.allowed_origins.iter().cloned()),
        )
        .enforce_origin_validation();
    config.session_store = Some(Arc::new(Store(sessions.clone())));
    if public {
        // Host checks guard loopback servers against DNS rebinding; a public server is guarded
        // by its token instead, and may be reached under any name.
        config = config.disable_allowed_hosts();
    }
    let factory_opts = opts.clone();
    let service = StreamableHttpService::new(
        move || {
            Ok(CodemodeHandler::new(
                codemode.clone(),
                approvals.clone(),
                factory_opts.clone(),
                "http",
                OnEnd::Keep,
            ))
        },
        manager,
        config,
    );
    let guard = Guard {
        token: token.map(|t| Arc::from(Sha256::digest(t.as_bytes()).to_vec())),
        sessions: sessions.clone(),
    };
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(guard, guard_request));
    let mut tasks = Vec::new();
    let mut local_addrs = Vec::new();
    for addr in addrs {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| McpError::Serve(format!("cannot listen on {addr}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| McpError::Serve(format!("cannot read the bound address: {e}")))?;
        local_addrs.push(local);
        let stop = shutdown.clone();
        let router = router.clone();
        tasks.push(tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
        }));
        tracing::info!(%local, "codemode MCP server listening on http://{local}/mcp");
    }
    let janitor = tokio::spawn(sweep(sessions));
    Ok(HttpServer {
        local_addr: local_addrs[0],
        local_addrs,
        shutdown,
        tasks,
        janitor,
    })
}

/// Ends idle connections and expired sessions, and gives freed memory back to the system.
async fn sweep(sessions: Arc<Sessions>) {
    let mut tick = tokio::time::interval(sessions.sweep_every());
    let mut freed = 0usize;
    loop {
        tick.tick().await;
        freed += sessions.sweep().await;
        if freed > 0 && sessions.len() < 16 || freed >= 64 {
            release_free_memory();
            freed = 0;
        }
    }
}

/// glibc keeps freed heap pages for reuse; after many sessions ended, hand them back.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns unused pages of the allocator's own heaps.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Everything checked before rmcp sees a request: the token, unknown sessions on `DELETE`,
/// the session table, and JSON that does not parse.
async fn guard_request(State(guard): State<Guard>, req: Request, next: Next) -> Response {
    if let Some(expected) = &guard.token
        && !token_matches(&req, expected)
    {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "missing or wrong bearer token",
        )
            .into_response();
    }
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match (req.method().clone(), session) {
        (Method::DELETE, Some(id)) => {
            if !guard.sessions.is_known(&id) {
                return (StatusCode::NOT_FOUND, "Not Found: no such session").into_response();
            }
            guard.sessions.end(&id).await;
            return StatusCode::NO_CONTENT.into_response();
        }
        (Method::POST, Some(id)) => {
            if !guard.sessions.is_known(&id) {
                return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
            }
            let busy = guard.sessions.begin(&id);
            let (req, json) = match checked_json(req).await {
                Ok(checked) => checked,
                Err(response) => return response,
            };
            let response = next.run(req).await;
            return finish(not_a_message(response, json), busy);
        }
        (Method::POST, None) => {
            let (req, json) = match checked_json(req).await {
                Ok(checked) => checked,
                Err(response) => return response,
            };
            if guard.sessions.make_room().await.is_err() {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "too many MCP sessions are busy; try again later",
                )
                    .into_response();
            }
            let response = next.run(req).await;
            return not_a_message(response, json);
        }
        (Method::GET, Some(id)) if !guard.sessions.is_known(&id) => {
            return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
        }
        _ => {}
    }
    next.run(req).await
}

/// Keeps the session marked busy until the response (an SSE stream) is finished.
fn finish(response: Response, busy: Option<super::sessions::InFlight>) -> Response {
    let Some(busy) = busy else { return response };
    let (parts, body) = response.into_parts();
    let stream = futures::StreamExt::map(body.into_data_stream(), move |chunk| {
        let _keep = &busy;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

/// `Authorization: Bearer <token>`, the scheme in any case (RFC 7235). Comparing digests keeps
/// the comparison's timing independent of how much of the token matched.
fn token_matches(req: &Request, expected: &[u8]) -> bool {
    let Some(value) = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some((scheme, token)) = value.trim().split_once(' ') else {
        return false;
    };
    scheme.eq_ignore_ascii_case("bearer")
        && Sha256::digest(token.trim().as_bytes()).as_slice() == expected
}

/// A JSON body that does not parse gets HTTP 400 with a JSON-RPC parse error (-32700). Says
/// whether the body was declared JSON.
async fn checked_json(req: Request) -> Result<(Request, bool), Response> {
    let is_json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    if !is_json {
        return Ok((req, false));
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is over {MAX_BODY} bytes"),
            )
                .into_response());
        }
    };
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&bytes) {
        return Err(jsonrpc_error(-32700, &format!("Parse error: {e}")));
    }
    Ok((Request::from_parts(parts, Body::from(bytes)), true))
}

/// rmcp answers JSON that is not a JSON-RPC message with 415 and plain text; the transport
/// specification asks for 400 with a JSON-RPC error.
fn not_a_message(response: Response, json: bool) -> Response {
    if !json || response.status() != StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return response;
    }
    jsonrpc_error(
        -32600,
        "Invalid Request: the body is JSON but not a JSON-RPC request, notification or response",
    )
}

fn jsonrpc_error(code: i64, message: &str) -> Response {
    let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}});
    let mut response = (StatusCode::BAD_REQUEST, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
