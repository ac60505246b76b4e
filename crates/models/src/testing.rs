//! A small OpenAI-compatible provider on loopback, for tests of this crate and of the crates
//! that use it (feature `test-provider`).
//!
//! It answers `POST /v1/chat/completions` like a constrained decoder: for every property of the
//! request's JSON schema it picks an `enum` value from configured probabilities and reports
//! them as `top_logprobs`, with the code token merged with its opening quote as real BPE
//! tokenizers do. `POST /v1/images/generations` returns base64 images. Knobs make it slow,
//! failing (any status), malformed or huge; every request is recorded so tests can assert the
//! URL, the Authorization header and the body the provider saw.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

/// A 1×1 PNG (70 bytes), the default generated image.
pub const TINY_PNG_BASE64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";

/// How the provider answers. Change with [`TestProvider::configure`].
#[derive(Debug, Clone)]
pub struct Knobs {
    /// For the i-th schema property (answered question), the probabilities of its enum values
    /// in order. Missing entries answer the first value with probability 1.
    pub label_probs: Vec<Vec<f64>>,
    /// `(prompt_tokens, completion_tokens)` reported in `usage`; `None` omits `usage`.
    pub usage: Option<(u64, u64)>,
    /// Wait this long before answering.
    pub delay: Duration,
    /// Answer with this HTTP status and a JSON error body instead.
    pub status: Option<u16>,
    /// Answer 200 with a truncated JSON body.
    pub malformed_json: bool,
    /// Leave `logprobs` out of chat answers, as servers without log-probabilities do.
    pub omit_logprobs: bool,
    /// Generated images are PNG-headed data of this many bytes (default: [`TINY_PNG_BASE64`]).
    pub image_bytes: Option<usize>,
    /// Answer chat requests with this message content (and no log-probabilities) instead.
    pub content: Option<String>,
    /// Send answers in 64 KiB chunks without a Content-Length, so only reading can find the size.
    pub chunked: bool,
    /// Report this `usage` object as it is (negative or odd numbers), instead of `usage`.
    pub raw_usage: Option<Value>,
    /// With `status`, echo the request's Authorization header in the error body, as some
    /// providers do.
    pub echo_authorization: bool,
    /// With `status`, echo the bare key (no `Bearer `) after this many padding characters.
    pub echo_key_after: Option<usize>,
    /// Answer with this redirect status and `Location` instead.
    pub redirect: Option<(u16, String)>,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            label_probs: Vec::new(),
            usage: Some((100, 10)),
            delay: Duration::ZERO,
            status: None,
            malformed_json: false,
            omit_logprobs: false,
            image_bytes: None,
            chunked: false,
            content: None,
            raw_usage: None,
            echo_authorization: false,
            echo_key_after: None,
            redirect: None,
        }
    }
}

/// One request as the provider saw it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    /// Path and query, such as `/v1/chat/completions`.
    pub path: String,
    pub authorization: Option<String>,
    /// Every header, names lower-case.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`Value::Null` when it was not JSON).
    pub body: Value,
}

struct Shared {
    knobs: Mutex<Knobs>,
    requests: Mutex<Vec<RecordedRequest>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

/// The running provider; stops when dropped.
pub struct TestProvider {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl TestProvider {
    /// Starts on an ephemeral loopback port. Needs a tokio runtime.
    pub async fn start() -> std::io::Result<TestProvider> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            knobs: Mutex::new(Knobs::default()),
            requests: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(TestProvider {
            addr,
            shared,
            server,
        })
    }

    /// `http://127.0.0.1:<port>/v1`, the value for a provider's `baseUrl`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn configure(&self, change: impl FnOnce(&mut Knobs)) {
        change(&mut lock(&self.shared.knobs));
    }

    /// Every request so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.requests).clone()
    }

    /// The most requests that were being answered at the same moment.
    pub fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight.load(Ordering::SeqCst)
    }
}

impl Drop for TestProvider {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Counts a request as in flight until dropped, also when the client goes away mid-answer.
struct InFlight(Arc<Shared>);

impl InFlight {
    fn enter(shared: &Arc<Shared>) -> Self {
        let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(shared.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let _in_flight = InFlight::enter(&shared);
    let (parts, body) = request.into_parts();
    let bytes = to_bytes(body, 64 * 1024 * 1024).await.unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string());
    lock(&shared.requests).push(RecordedRequest {
        method: parts.method.to_string(),
        path: path.clone(),
        authorization: parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        headers,
        body: body.clone(),
    });
    let knobs = lock(&shared.knobs).clone();
    if !knobs.delay.is_zero() {
        tokio::time::sleep(knobs.delay).await;
    }
    if let Some((status, location)) = &knobs.redirect {
        return Response::builder()
            .status(StatusCode::from_u16(*status).unwrap_or(StatusCode::TEMPORARY_REDIRECT))
            .header(header::LOCATION, location.as_str())
            .body(Body::empty())
            .unwrap_or_default();
    }
    if let Some(status) = knobs.status {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let message = if let Some(padding) = knobs.echo_key_after {
            let auth = parts
                .headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let key = auth.strip_prefix("Bearer ").unwrap_or(auth);
            format!("{} key was {key}", "x".repeat(padding))
        } else if knobs.echo_authorization {
            let auth = parts
                .headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            format!("Invalid API key provided: {auth} for url {path}")
        } else {
            "the test provider was told to fail".to_string()
        };
        return json_response(
            status,
            json!({ "error": { "message": message } }).to_string(),
        );
    }
    if knobs.malformed_json {
        return json_response(StatusCode::OK, "{\"choices\": [{\"message\": ".into());
    }
    let answer = match (parts.method.as_str(), parts.uri.path()) {
        ("POST", "/v1/chat/completions") => chat_answer(&body, &knobs),
        ("POST", "/v1/images/generations") => image_answer(&body, &knobs),
        _ => {
            return json_response(
                StatusCode::NOT_FOUND,
                json!({ "error": { "message": format!("no route {path}") } }).to_string(),
            );
        }
    };
    if knobs.chunked {
        let bytes = answer.to_string().into_bytes();
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
            bytes.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
        return Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from_stream(futures::stream::iter(chunks)))
            .unwrap_or_default();
    }
    json_response(StatusCode::OK, answer.to_string())
}

fn json_response(status: StatusCode, body: String) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .unwrap_or_default()
}

fn usage_json(knobs: &Knobs) -> Option<Value> {
    if let Some(raw) = &knobs.raw_usage {
        return Some(raw.clone());
    }
    knobs.usage.map(|(p, c)| {
        json!({ "prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                "input_tokens": p, "output_tokens": c })
    })
}

fn token(text: &str, logprob: f64, top: Vec<Value>) -> Value {
    json!({ "token": text, "logprob": logprob, "bytes": text.as_bytes(), "top_logprobs": top })
}

fn chat_answer(body: &Value, knobs: &Knobs) -> Value {
    let empty = Map::new();
    let properties = body
        .pointer("/response_format/json_schema/schema/properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut tokens = vec![token("{", 0.0, vec![])];
    for (i, (key, prop)) in properties.iter().enumerate() {
        let options: Vec<&str> = prop
            .get("enum")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let probs: Vec<f64> = match knobs.label_probs.get(i) {
            Some(p) => options
                .iter()
                .enumerate()
                .map(|(j, _)| p.get(j).copied().unwrap_or(0.0))
                .collect(),
            None => options
                .iter()
                .enumerate()
                .map(|(j, _)| if j == 0 { 1.0 } else { 0.0 })
                .collect(),
        };
        let chosen = probs
            .iter()
            .enumerate()
            .fold(
                (0, f64::MIN),
                |best, (j, p)| if *p > best.1 { (j, *p) } else { best },
            )
            .0;
        let sep = if i == 0 { "" } else { "," };
        tokens.push(token(&format!("{sep}\"{key}\":"), 0.0, vec![]));
        let mut top: Vec<Value> = options
            .iter()
            .zip(&probs)
            .filter(|(_, p)| **p > 0.0)
            .map(|(o, p)| json!({ "token": format!("\"{o}"), "logprob": p.ln() }))
            .collect();
        // A token that is no code, which the reader must leave out of the distribution.
        top.push(json!({ "token": "\" ", "logprob": (0.001f64).ln() }));
        let chosen_text = format!("\"{}", options.get(chosen).copied().unwrap_or(""));
        let chosen_lp = probs.get(chosen).copied().unwrap_or(1.0).max(1e-12).ln();
        tokens.push(token(&chosen_text, chosen_lp, top));
        tokens.push(token("\"", 0.0, vec![]));
    }
    tokens.push(token("}", 0.0, vec![]));
    let content: String = if properties.is_empty() {
        "ok".into()
    } else {
        tokens.iter().filter_map(|t| t["token"].as_str()).collect()
    };
    let replaced = knobs.content.is_some();
    let content = knobs.content.clone().unwrap_or(content);
    let mut choice = json!({
        "index": 0,
        "message": { "role": "assistant", "content": content },
        "finish_reason": "stop",
    });
    if !knobs.omit_logprobs && !replaced && !properties.is_empty() {
        choice["logprobs"] = json!({ "content": tokens });
    }
    let mut answer = json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model").cloned().unwrap_or(Value::Null),
        "choices": [choice],
    });
    if let Some(usage) = usage_json(knobs) {
        answer["usage"] = usage;
    }
    answer
}

fn image_answer(body: &Value, knobs: &Knobs) -> Value {
    let n = body
        .get("n")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .clamp(1, 4);
    let image = match knobs.image_bytes {
        Some(size) => {
            let mut bytes = vec![0u8; size.max(8)];
            bytes[..8].copy_from_slice(&[0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a]);
            STANDARD.encode(bytes)
        }
        None => TINY_PNG_BASE64.to_string(),
    };
    let data: Vec<Value> = (0..n).map(|_| json!({ "b64_json": image })).collect();
    let mut answer = json!({ "created": 0, "data": data });
    if let Some(usage) = usage_json(knobs) {
        answer["usage"] = usage;
    }
    answer
}
