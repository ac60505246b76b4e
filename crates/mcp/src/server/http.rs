//! Serving the codemode MCP server over streamable HTTP, hardened as the MCP transport
//! specification asks: `Origin` checked against DNS rebinding, malformed JSON answered with a
//! JSON-RPC parse error, unknown sessions answered with 404, a bearer token compared in constant
//! time, and sessions that end give their memory back.
//!
//! Beside `/mcp` it serves `/healthz` (the process is up), `/readyz` (the state store answers
//! and the audit log has not failed; upstream servers are connected or being retried) and, with metrics on, `/metrics`
//! (Prometheus text, behind the bearer token like `/mcp`). With several tokens (one per
//! person), the token's name is the session's principal, for per-principal and per-team
//! budgets; a session stays with the principal that began it, on every replica.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use codemode_gate::Principal;
use codemode_runtime::Codemode;
use codemode_state::StateError;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::ServeOptions;
use super::approval::ElicitationApprover;
use super::handler::{CodemodeHandler, OnEnd};
use super::sessions::{Full, Owner, Sessions, Store};
use crate::McpError;

/// The largest request body accepted (rmcp's own limit).
const MAX_BODY: usize = 4 * 1024 * 1024;

/// Most JSON values one request body may hold: the transport decodes a body more than once,
/// each value tens of bytes in memory, so bytes alone do not bound what a request costs.
const MAX_BODY_VALUES: usize = 1 << 16;

/// The largest `initialize` accepted. Its parameters (client name, capabilities) are kept for
/// the session's whole life, so a client must not make each of its sessions hold megabytes;
/// real clients send a few kilobytes.
const MAX_INITIALIZE_BODY: usize = 64 * 1024;

/// Prometheus text for `/metrics`, made on each scrape.
pub type MetricsText = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// A bearer token that names who presents it.
#[derive(Debug, Clone)]
pub struct TokenPrincipal {
    pub principal: Principal,
    /// SHA-256 of the token (the token itself is not kept).
    pub token_sha256: [u8; 32],
}

/// How `codemode serve --listen` behaves.
#[derive(Clone)]
pub struct HttpOptions {
    /// Every request must carry `Authorization: Bearer <token>` (this one, or one of
    /// `principals`); required off loopback.
    pub bearer_token: Option<String>,
    /// Named tokens: the name becomes the session's principal.
    pub principals: Vec<TokenPrincipal>,
    /// Serve `/metrics` from this.
    pub metrics: Option<MetricsText>,
    /// Browser origins allowed besides loopback ones (`https://app.example.com`,
    /// `http://localhost:*`). A request without `Origin` (not from a browser) is not checked.
    pub allowed_origins: Vec<String>,
    /// A session unused for this long is forgotten with its `store()` values; before that, a
    /// client that comes back with its session id continues where it left off.
    pub session_idle_timeout: Duration,
    /// At most this many sessions are kept; a new one ends the longest-idle one.
    pub max_sessions: usize,
    /// Connections one peer address may hold open at once; 0 for no limit (behind a proxy,
    /// every connection comes from the proxy's address).
    pub max_connections_per_peer: usize,
}

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOptions")
            .field("bearer_token", &self.bearer_token.as_ref().map(|_| "***"))
            .field("principals", &self.principals.len())
            .field("metrics", &self.metrics.is_some())
            .field("allowed_origins", &self.allowed_origins)
            .field("session_idle_timeout", &self.session_idle_timeout)
            .field("max_sessions", &self.max_sessions)
            .field("max_connections_per_peer", &self.max_connections_per_peer)
            .finish()
    }
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            bearer_token: None,
            principals: Vec::new(),
            metrics: None,
            allowed_origins: Vec::new(),
            session_idle_timeout: Duration::from_secs(24 * 3600),
            max_sessions: 1000,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
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
    sessions: Arc<Sessions>,
}

impl HttpServer {
    /// Counts the sessions this replica holds (for the active-sessions gauge).
    pub fn session_counter(&self) -> impl Fn() -> usize + Send + Sync + 'static {
        let sessions = self.sessions.clone();
        move || sessions.len()
    }

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
    /// Digests of the accepted tokens, each with the principal it names (if any). Empty: no
    /// token is asked for.
    tokens: Arc<Vec<([u8; 32], Option<Principal>)>>,
    sessions: Arc<Sessions>,
    codemode: Codemode,
    hub: Option<Arc<crate::McpHub>>,
    metrics: Option<MetricsText>,
    /// Listening beyond loopback (then tokens guard it, and any Host name is fine).
    public: bool,
}

/// An allowed origin as rmcp matches it. An origin includes its port, and a browser leaves out
/// only the scheme's default one: `https://app.example.com` is `https://app.example.com:443`
/// (rmcp would match any port). `:*` (any port) and `null` are kept as they are.
fn exact_origin(raw: &str) -> Result<String, McpError> {
    let origin = raw.trim().trim_end_matches('/');
    if origin == "null" || origin.ends_with(":*") {
        return Ok(origin.to_string());
    }
    let bad = |why: &str| {
        McpError::Serve(format!(
            "--allow-origin {raw:?} {why}; write an origin such as https://app.example.com, \
             https://app.example.com:8443 or http://localhost:* (any port)"
        ))
    };
    let (scheme, authority) = origin
        .split_once("://")
        .ok_or_else(|| bad("is not an origin (scheme://host[:port])"))?;
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return Err(bad("is not an origin: it has no host, or more than one"));
    }
    let has_port = match authority.strip_prefix('[') {
        Some(v6) => v6
            .split_once(']')
            .is_some_and(|(_, rest)| rest.starts_with(':')),
        None => authority.contains(':'),
    };
    if has_port {
        return Ok(origin.to_string());
    }
    match scheme.to_ascii_lowercase().as_str() {
        "https" => Ok(format!("{origin}:443")),
        "http" => Ok(format!("{origin}:80")),
        _ => Err(bad("has no port and its scheme has no default one")),
    }
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
    let mut tokens: Vec<([u8; 32], Option<Principal>)> = http
        .principals
        .iter()
        .map(|p| (p.token_sha256, Some(p.principal.clone())))
        .collect();
    if let Some(t) = &token {
        tokens.push((Sha256::digest(t.as_bytes()).into(), None));
    }
    if addrs.is_empty() {
        return Err(McpError::Serve("no address to listen on".into()));
    }
    let public = addrs.iter().any(|a| !a.ip().is_loopback());
    if public && tokens.is_empty() {
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
    )
    .with_shared(codemode.gate().state_store().cloned());
    let allowed_origins = http
        .allowed_origins
        .iter()
        .map(|o| exact_origin(o))
        .collect::<Result<Vec<_>, _>>()?;
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(shutdown.child_token())
        .with_allowed_origins(
            LOOPBACK_ORIGINS
                .iter()
                .map(|s| s.to_string())
                .chain(allowed_origins),
        )
        .enforce_origin_validation();
    config.session_store = Some(Arc::new(Store(sessions.clone())));
    if public {
        // Host checks guard loopback servers against DNS rebinding; a public server is guarded
        // by its token instead, and may be reached under any name.
        config = config.disable_allowed_hosts();
    }
    let factory_opts = opts.clone();
    let guard_codemode = codemode.clone();
    let hub = opts.hub.clone();
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
        tokens: Arc::new(tokens.clone()),
        sessions: sessions.clone(),
        codemode: guard_codemode,
        hub,
        metrics: http.metrics.clone(),
        public,
    };
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .route("/healthz", axum::routing::get(healthz))
        .route("/readyz", axum::routing::get(readyz))
        .route("/metrics", axum::routing::get(metrics))
        .with_state(guard.clone())
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
        tasks.push(tokio::spawn(accept_loop(
            listener,
            router,
            stop,
            http.max_connections_per_peer,
            tokens.is_empty(),
        )));
        tracing::info!(%local, "codemode MCP server listening on http://{local}/mcp");
    }
    let janitor = tokio::spawn(sweep(sessions.clone()));
    Ok(HttpServer {
        sessions,
        local_addr: local_addrs[0],
        local_addrs,
        shutdown,
        tasks,
        janitor,
    })
}

/// How long a client may take to send a request's headers, and then its body: a client that
/// sends them a byte at a time would otherwise hold its connection, and enough of them every
/// descriptor the process may open, before any token is checked.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections one peer address may hold open at once, unless set otherwise. An idle
/// connection is closed after the header timeout, but one that asks for `/healthz` (which needs
/// no token) every few seconds is never idle: without a cap, one peer could hold every
/// descriptor the process may open and lock out the clients with tokens. Above what one client
/// firing a thousand calls at two replicas opens.
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 1024;

/// Open connections by peer (see [`peer_key`]), and how many one may hold (0: no limit); and
/// how many all peers together may, below the descriptors the process may open.
#[derive(Clone)]
struct PeerConnections {
    open: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
    max: usize,
    max_total: usize,
}

/// Who counts as one peer: every loopback address is one (a local program can connect from any
/// of 127.0.0.0/8, and did, 20 addresses at a thousand connections each), an IPv4-mapped
/// address is its IPv4 one, and an IPv6 address is its /64, which one host is usually given
/// whole.
fn peer_key(ip: std::net::IpAddr) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let ip = super::peer_uid::plain_ip(ip);
    match ip {
        _ if ip.is_loopback() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(bits))
        }
        v4 => v4,
    }
}

/// Connections all peers together may hold: the descriptors this process may open, less room
/// for its own files, upstream servers and state store.
fn max_total_connections() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    let soft = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } {
        0 => usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX),
        _ => 1024,
    };
    soft.saturating_sub(soft / 4).max(64)
}

/// One open connection of a peer; given back when dropped.
struct PeerSlot {
    peers: PeerConnections,
    ip: std::net::IpAddr,
}

impl PeerConnections {
    fn admit(&self, ip: std::net::IpAddr) -> Option<PeerSlot> {
        let ip = peer_key(ip);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.values().sum::<usize>() >= self.max_total {
            return None;
        }
        let n = open.entry(ip).or_insert(0);
        if self.max > 0 && *n >= self.max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: self.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Serves `router` on `listener` until `stop`, then lets each connection finish what it is
/// answering. `axum::serve` would do the same without a timeout on reading headers.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    stop: CancellationToken,
    max_per_peer: usize,
    own_user_only: bool,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use tower::ServiceExt as _;
    let connections = tokio_util::task::TaskTracker::new();
    let peers = PeerConnections {
        open: Arc::default(),
        max: max_per_peer,
        max_total: max_total_connections(),
    };
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, slot) = match accepted {
            Ok((stream, peer)) => match peers.admit(peer.ip()) {
                Some(slot) => (stream, slot),
                None => {
                    // Closed at once; logged at debug only, as a flood would flood the log too.
                    tracing::debug!(%peer, "a peer at its connection limit opened another");
                    continue;
                }
            },
            Err(e) => {
                // Out of descriptors, most often: wait for some to close rather than spin.
                tracing::warn!("accepting an HTTP connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let requests = Requests::default();
        let counted = requests.clone();
        let router = router.clone();
        let service = hyper_util::service::TowerToHyperService::new(tower::service_fn(
            move |req: axum::http::Request<hyper::body::Incoming>| {
                // Counted from the moment the request arrives until its response is sent or
                // dropped, so a long SSE answer is never taken for an idle connection.
                let busy = counted.enter();
                let router = router.clone();
                async move {
                    let response = router.oneshot(req.map(Body::new)).await?;
                    let (parts, body) = response.into_parts();
                    Ok::<_, std::convert::Infallible>(Response::from_parts(
                        parts,
                        Body::new(Held { body, _busy: busy }),
                    ))
                }
            },
        ));
        let stop = stop.clone();
        connections.spawn(async move {
            let _slot = slot;
            let mut stream = stream;
            if own_user_only && !from_own_user(&stream).await {
                refuse_other_user(&mut stream).await;
                return;
            }
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            // HTTP/2 (h2c) has no header timeout: a connection without a request for as long
            // as HTTP/1.1 may take over its headers is closed, whichever protocol it speaks.
            let idle = loop {
                tokio::select! {
                    _ = conn.as_mut() => return,
                    _ = stop.cancelled() => break false,
                    _ = tokio::time::sleep(IDLE_CHECK) => {
                        if requests.idle_for() >= HEADER_READ_TIMEOUT {
                            break true;
                        }
                    }
                }
            };
            conn.as_mut().graceful_shutdown();
            match idle {
                // Nothing is being answered: a peer that does not close is not waited for.
                true => {
                    let _ = tokio::time::timeout(IDLE_CHECK, conn).await;
                }
                false => {
                    let _ = conn.await;
                }
            }
        });
    }
    connections.close();
    connections.wait().await;
    Ok(())
}

/// Whether the client at the other end of a loopback connection runs as this process's user.
/// Unknown counts as no: a client that closed at once loses nothing.
async fn from_own_user(stream: &tokio::net::TcpStream) -> bool {
    let (Ok(local), Ok(peer)) = (stream.local_addr(), stream.peer_addr()) else {
        return false;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let owner =
        tokio::task::spawn_blocking(move || super::peer_uid::loopback_peer_uid(local, peer))
            .await
            .ok()
            .flatten();
    if owner != Some(me) {
        tracing::warn!(%peer, ?owner, "refused a connection from another user: this server has no token, so it serves only its own user's programs");
    }
    owner == Some(me)
}

/// Says why, then closes: another user's program reached a server that has no token.
async fn refuse_other_user(stream: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let body = "this codemode server has no token, so it serves only programs of the user it runs as; to let others in, start it with --token (or --tokens-file) and give them the token\n";
    let response = format!(
        "HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(
        Duration::from_secs(2),
        stream.write_all(response.as_bytes()),
    )
    .await;
    let _ = stream.shutdown().await;
}

/// How often a connection checks whether it has been idle too long.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// The requests of one connection being answered, and when the last one ended.
#[derive(Clone)]
struct Requests(Arc<std::sync::Mutex<(usize, std::time::Instant)>>);

impl Default for Requests {
    fn default() -> Self {
        Requests(Arc::new(std::sync::Mutex::new((
            0,
            std::time::Instant::now(),
        ))))
    }
}

impl Requests {
    fn enter(&self) -> Busy {
        self.lock().0 += 1;
        Busy(self.clone())
    }

    /// Zero while a request is being answered.
    fn idle_for(&self) -> Duration {
        let state = self.lock();
        match state.0 {
            0 => state.1.elapsed(),
            _ => Duration::ZERO,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (usize, std::time::Instant)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One request being answered; dropping it (response sent, or abandoned) ends it.
struct Busy(Requests);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.0 = state.0.saturating_sub(1);
        state.1 = std::time::Instant::now();
    }
}

/// A response body that keeps its request counted until it is sent or dropped.
struct Held {
    body: Body,
    _busy: Busy,
}

impl hyper::body::Body for Held {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        hyper::body::Body::poll_frame(std::pin::Pin::new(&mut self.body), cx)
    }

    fn is_end_stream(&self) -> bool {
        hyper::body::Body::is_end_stream(&self.body)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::Body::size_hint(&self.body)
    }
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
    // On loopback, pages that tell something (upstream names, tool names, counts) answer only
    // requests addressed to loopback: a web page whose name an attacker points at 127.0.0.1
    // (DNS rebinding) sends its own name. rmcp checks `/mcp` itself.
    if !guard.public
        && matches!(req.uri().path(), "/readyz" | "/metrics")
        && !addressed_to_loopback(&req)
    {
        return (
            StatusCode::FORBIDDEN,
            "this server listens on loopback and answers only requests addressed to localhost, 127.0.0.1 or [::1]",
        )
            .into_response();
    }
    // Load balancers probe health without a token; these say nothing about the sessions.
    if matches!(req.uri().path(), "/healthz" | "/readyz") {
        return next.run(req).await;
    }
    let principal = if guard.tokens.is_empty() {
        None
    } else {
        match presented_token(&req, &guard.tokens) {
            Some(p) => Some(p),
            None => {
                return (
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, "Bearer")],
                    "missing or wrong bearer token",
                )
                    .into_response();
            }
        }
    };
    if req.uri().path() == "/metrics" {
        return next.run(req).await;
    }
    // `None`: no tokens; `Some(None)`: the unnamed `--token`; `Some(Some(p))`: a named one.
    let caller = match &principal {
        None => Owner::Anyone,
        Some(None) => Owner::Unnamed,
        Some(Some(p)) => Owner::Named(p.id.clone()),
    };
    let principal = principal.flatten();
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    // A session id the server does not know is refused before anything is kept for it.
    if let Some(id) = &session {
        if !guard.sessions.is_known_anywhere(id).await {
            let message = match req.method() == Method::DELETE {
                true => "Not Found: no such session",
                false => "Not Found: Session not found",
            };
            return (StatusCode::NOT_FOUND, message).into_response();
        }
        if let Err(refused) = check_owner(&guard, id, &caller, principal.as_ref()).await {
            return refused;
        }
        match guard.sessions.ended_elsewhere(id).await {
            Ok(false) => {}
            Ok(true) => {
                return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
            }
            Err(e) => return store_unreachable(e),
        }
        if guard.sessions.keep_alive_shared(id).await {
            guard.codemode.gate().forget_session(id);
            return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
        }
    }
    match (req.method().clone(), session) {
        (Method::DELETE, Some(id)) => {
            guard.sessions.end_everywhere(&id).await;
            return StatusCode::NO_CONTENT.into_response();
        }
        (Method::POST, Some(id)) => {
            let busy = guard.sessions.begin(&id);
            let (req, body) = match checked_json(req).await {
                Ok(checked) => checked,
                Err(response) => return response,
            };
            // After the body arrived, so a client slow to send it holds no turn.
            let turn = match &busy {
                Some(b) => b.decoding_turn().await,
                None => None,
            };
            let response = next.run(req).await;
            drop(turn);
            return finish(not_a_message(response, body.json), busy);
        }
        (Method::POST, None) => {
            let (req, body) = match checked_json(req).await {
                Ok(checked) => checked,
                Err(response) => return response,
            };
            if let Some(refused) = not_a_session_start(&body) {
                return refused;
            }
            let json = body.json;
            let opening = match guard.sessions.make_room(&caller).await {
                Ok(opening) => opening,
                Err(Full::Busy) => {
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "too many MCP sessions are busy; try again later",
                    )
                        .into_response();
                }
                Err(Full::YourShare { held, max }) => {
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "your token holds {held} of the {max} MCP sessions this server keeps, half of them; end one you no longer use (HTTP DELETE with its Mcp-Session-Id) before starting another"
                        ),
                    )
                        .into_response();
                }
            };
            let response = next.run(req).await;
            // A new session: it is the token holder's from now on, on every replica.
            if let Some(id) = response
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
                && let Err(refused) =
                    claim(&guard, &id, &caller, principal.as_ref(), Sight::First).await
            {
                return refused;
            }
            // Claimed (counted under its owner now) or not made: the room goes back.
            drop(opening);
            return not_a_message(response, json);
        }
        _ => {}
    }
    next.run(req).await
}

/// Whether a session is claimed as it begins here, or as it continues here after it began
/// on another replica.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sight {
    First,
    Again,
}

/// Makes the new session `caller`'s, on every replica: a token must not borrow someone else's
/// session, its `store()` values, cells and budget. With a shared store the first owner is
/// recorded there. A session that continues here is only touched, never made again: its row
/// gone (ended on another replica since it was read) answers 404.
async fn claim(
    guard: &Guard,
    id: &str,
    caller: &Owner,
    principal: Option<&Principal>,
    sight: Sight,
) -> Result<(), Response> {
    if let Some(store) = guard.codemode.gate().state_store() {
        let seen = match sight {
            Sight::First => store.open_session(id, caller.stored()).await,
            Sight::Again => store.touch_session(id).await,
        };
        match seen {
            Ok(record) if record.principal.as_deref() != caller.stored() => {
                return Err(wrong_principal());
            }
            Ok(_) => {}
            Err(StateError::SessionEnded { .. }) => {
                guard.sessions.forget_ended(id).await;
                return Err((StatusCode::NOT_FOUND, "Not Found: Session not found").into_response());
            }
            Err(e) => return Err(store_unreachable(e)),
        }
    }
    guard.sessions.set_owner(id, caller.clone());
    if let Some(p) = principal {
        guard.codemode.gate().set_principal(id, p.clone());
    }
    Ok(())
}

/// Refuses a request in a session `caller` did not begin. A session begun on another replica
/// is the first owner's that the shared store recorded.
async fn check_owner(
    guard: &Guard,
    id: &str,
    caller: &Owner,
    principal: Option<&Principal>,
) -> Result<(), Response> {
    match guard.sessions.owner_of(id) {
        Some(owner) if owner == *caller => return Ok(()),
        Some(_) => return Err(wrong_principal()),
        None => {}
    }
    let Some(store) = guard.codemode.gate().state_store() else {
        // Known here but not yet claimed: its first request is still being answered.
        return match caller {
            Owner::Anyone => Ok(()),
            _ => Err(wrong_principal()),
        };
    };
    // Begun elsewhere: continued only while its row lives. Ending a session (expiry, eviction,
    // DELETE) deletes the row and with it the principal it was fixed to; claiming it anew would
    // hand the session, and its cells, to whichever token presented the id next.
    match store.get_session(id).await {
        Ok(Some(_)) => guard.sessions.found_in_store(id),
        Ok(None) => {
            guard.sessions.forget_ended(id).await;
            return Err((StatusCode::NOT_FOUND, "Not Found: Session not found").into_response());
        }
        Err(e) => return Err(store_unreachable(e)),
    }
    claim(guard, id, caller, principal, Sight::Again).await
}

fn store_unreachable(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the state store cannot be reached: {e}"),
    )
        .into_response()
}

/// Whether the request names a loopback host, and comes from a loopback origin if from a page.
fn addressed_to_loopback(req: &Request) -> bool {
    let header_host = |name| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let host_ok = header_host(header::HOST)
        .or_else(|| req.uri().host())
        .map(without_port)
        .is_some_and(is_loopback_name);
    let origin_ok = match header_host(header::ORIGIN) {
        None => true,
        Some(origin) => origin
            .split_once("://")
            .map(|(_, rest)| without_port(rest))
            .is_some_and(is_loopback_name),
    };
    host_ok && origin_ok
}

fn without_port(host: &str) -> &str {
    match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    }
}

fn is_loopback_name(host: &str) -> bool {
    matches!(
        host.to_ascii_lowercase().as_str(),
        "localhost" | "127.0.0.1" | "::1"
    )
}

fn wrong_principal() -> Response {
    (
        StatusCode::FORBIDDEN,
        "this session belongs to another token's holder; start a session of your own",
    )
        .into_response()
}

/// `/healthz`: the process answers.
async fn healthz() -> Response {
    (StatusCode::OK, "ok\n").into_response()
}

/// `/readyz`: the state store answers (within 3 s) and the audit log has not failed (a gate
/// whose audit line could not be written refuses every call until a restart). Upstream servers
/// that failed are retried in the background, so they do not make the replica unready; their
/// states are listed.
async fn readyz(State(guard): State<Guard>) -> Response {
    let state = match guard.codemode.gate().state_store() {
        None => json!({"ok": true, "backend": "none (this process only)"}),
        Some(store) => {
            let ping = tokio::time::timeout(Duration::from_secs(3), store.ping()).await;
            match ping {
                Ok(Ok(())) => json!({"ok": true, "backend": store.describe()}),
                Ok(Err(e)) => {
                    json!({"ok": false, "backend": store.describe(), "error": e.to_string()})
                }
                Err(_) => {
                    json!({"ok": false, "backend": store.describe(), "error": "no answer within 3 s"})
                }
            }
        }
    };
    let upstreams: Vec<_> = guard
        .hub
        .as_ref()
        .map(|h| h.status())
        .unwrap_or_default()
        .into_iter()
        .map(|s| {
            let state = match s.state {
                crate::ServerState::Connecting => "connecting".to_string(),
                crate::ServerState::Connected { .. } => "connected".to_string(),
                crate::ServerState::Failed(_) => "retrying".to_string(),
                crate::ServerState::Disabled => "disabled".to_string(),
            };
            json!({"server": s.name, "state": state})
        })
        .collect();
    // A gate whose audit log failed refuses every call until this process restarts.
    let audit = match guard.codemode.gate().audit_failure() {
        None => json!({"ok": true}),
        Some(e) => json!({
            "ok": false,
            "error": format!("the audit log cannot be written ({e}); every call is refused until this replica is restarted"),
        }),
    };
    let ready = state["ok"] == json!(true) && audit["ok"] == json!(true);
    let body = json!({"ready": ready, "state": state, "audit": audit, "upstreams": upstreams});
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut response = (code, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `/metrics`: Prometheus text, when metrics are on (`telemetry.metrics`).
async fn metrics(State(guard): State<Guard>) -> Response {
    match guard.metrics.as_ref().and_then(|m| m()) {
        Some(text) => {
            let mut response = (StatusCode::OK, text).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            response
        }
        None => (
            StatusCode::NOT_FOUND,
            "metrics are off; turn them on with `telemetry.metrics: true` in your settings",
        )
            .into_response(),
    }
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

/// `Authorization: Bearer <token>`, the scheme in any case (RFC 7235): `Some(principal)` when
/// it is one of `tokens`. Comparing digests keeps the comparison's timing independent of how
/// much of a token matched.
fn presented_token(
    req: &Request,
    tokens: &[([u8; 32], Option<Principal>)],
) -> Option<Option<Principal>> {
    let value = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())?;
    let (scheme, token) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let digest: [u8; 32] = Sha256::digest(token.trim().as_bytes()).into();
    tokens
        .iter()
        .find(|(d, _)| *d == digest)
        .map(|(_, p)| p.clone())
}

/// What the guard knows of a request's body.
struct BodyFacts {
    /// Declared JSON (and then parsed).
    json: bool,
    /// The JSON-RPC method, for a request or notification.
    method: Option<String>,
    len: usize,
}

/// A request without a session may only begin one. rmcp also serves the sessionless protocol
/// revision (2026-07-28) to requests that carry its `_meta` keys; such a request would run a
/// script for a made-up session that no token owns, escaping the principal's budgets, cap and
/// audit name, and leaving that session's memory behind. Bodies not declared JSON are left to
/// rmcp, which refuses them.
fn not_a_session_start(body: &BodyFacts) -> Option<Response> {
    if !body.json {
        return None;
    }
    if body.method.as_deref() != Some("initialize") {
        return Some(
            (
                StatusCode::BAD_REQUEST,
                "Bad Request: no Mcp-Session-Id. This server keeps a session per client (its store() values, cells, approvals and budgets): begin with `initialize`, then send the Mcp-Session-Id header it answers with on every request. Requests without a session (the 2026-07-28 revision's stateless requests) are not served",
            )
                .into_response(),
        );
    }
    if body.len > MAX_INITIALIZE_BODY {
        return Some(
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the `initialize` request is {} bytes; at most {MAX_INITIALIZE_BODY} are accepted, because its parameters are kept for the session's life. Send a shorter client description and capabilities",
                    body.len
                ),
            )
                .into_response(),
        );
    }
    None
}

/// A JSON body that does not parse gets HTTP 400 with a JSON-RPC parse error (-32700). Says
/// whether the body was declared JSON, its method and its length.
async fn checked_json(req: Request) -> Result<(Request, BodyFacts), Response> {
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
        let facts = BodyFacts {
            json: false,
            method: None,
            len: 0,
        };
        return Ok((req, facts));
    }
    let (parts, body) = req.into_parts();
    let read = tokio::time::timeout(BODY_READ_TIMEOUT, axum::body::to_bytes(body, MAX_BODY));
    let bytes = match read.await {
        Ok(Ok(b)) => b,
        Err(_) => {
            return Err((
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            )
                .into_response());
        }
        Ok(Err(_)) => {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is over {MAX_BODY} bytes"),
            )
                .into_response());
        }
    };
    // Counted before anything decodes it: 4 MiB of `[0,0,…]` took the process from 57 to
    // 527 MB on its way through the transport (a red team's measure). The method is read
    // first, skipping every value it holds without keeping one.
    let values = codemode_spec::count_json_values(&bytes, MAX_BODY_VALUES);
    let method = match serde_json::from_slice::<Envelope>(&bytes) {
        Ok(Envelope::Message { method }) => method,
        Ok(Envelope::Other(_)) => None,
        Err(e) => return Err(jsonrpc_error(-32700, &format!("Parse error: {e}"))),
    };
    // An `initialize` has a tighter bound of its own, in bytes, which says more.
    if values > MAX_BODY_VALUES && method.as_deref() != Some("initialize") {
        return Err(jsonrpc_error(
            -32600,
            &format!(
                "Invalid Request: the body holds more than {MAX_BODY_VALUES} JSON values; pass large data as text (one string is one value), or in several calls"
            ),
        ));
    }
    let facts = BodyFacts {
        json: true,
        method,
        len: bytes.len(),
    };
    Ok((Request::from_parts(parts, Body::from(bytes)), facts))
}

/// Enough of a JSON body to tell its method; any other JSON (a batch, a number) parses as
/// `Other`, for rmcp to refuse.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Envelope {
    Message {
        #[serde(default)]
        method: Option<String>,
    },
    Other(serde::de::IgnoredAny),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allowed_origin_without_a_port_means_the_default_port() {
        let ok = |o: &str| exact_origin(o).unwrap();
        assert_eq!(ok("https://app.example.com"), "https://app.example.com:443");
        assert_eq!(
            ok("https://app.example.com/"),
            "https://app.example.com:443"
        );
        assert_eq!(ok("http://app.example.com"), "http://app.example.com:80");
        assert_eq!(
            ok("https://app.example.com:8443"),
            "https://app.example.com:8443"
        );
        assert_eq!(ok("http://[::1]"), "http://[::1]:80");
        assert_eq!(ok("http://[::1]:3000"), "http://[::1]:3000");
        assert_eq!(ok("http://localhost:*"), "http://localhost:*");
        assert_eq!(ok("null"), "null");
        for bad in [
            "app.example.com",
            "https://",
            "https://a/b",
            "ftp://x",
            "https://u@x",
        ] {
            assert!(exact_origin(bad).is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod peer_tests {
    use super::*;

    /// Red team: the per-peer cap counted exact addresses, so one local program connecting
    /// from 127.0.0.2, 127.0.0.3, … held a thousand connections on each.
    #[test]
    fn every_loopback_address_is_one_peer_and_all_share_a_total() {
        let peers = PeerConnections {
            open: Arc::default(),
            max: 3,
            max_total: 5,
        };
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let mut held = Vec::new();
        for a in ["127.0.0.1", "127.0.0.2", "::1"] {
            held.push(peers.admit(ip(a)).expect("within the peer's share"));
        }
        for a in ["127.9.9.9", "::ffff:127.0.0.1", "127.0.0.1"] {
            assert!(
                peers.admit(ip(a)).is_none(),
                "{a} is the same loopback peer"
            );
        }
        // Two addresses of one /64: one peer, with room for both.
        held.push(peers.admit(ip("2001:db8::1")).unwrap());
        held.push(peers.admit(ip("2001:db8::2:3")).unwrap());
        // The total (5) is reached: nobody else gets in, whoever they are.
        assert!(peers.admit(ip("2001:db8:1::1")).is_none());
        assert!(peers.admit(ip("192.0.2.7")).is_none());
        held.clear();
        assert!(peers.admit(ip("192.0.2.7")).is_some());
    }
}
