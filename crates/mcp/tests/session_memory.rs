//! What `serve --listen` keeps for an HTTP session after it ended: a client that opens
//! sessions in bursts and abandons them must not grow the host's memory without bound. Sessions
//! ended by `--max-sessions` (eviction) and by the idle limit leave nothing in the gate (the
//! session's principal, its counters).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use codemode_gate::{Gate, PolicySet, Principal, Registry};
use codemode_mcp::{ElicitationApprover, HttpOptions, ServeOptions, TokenPrincipal, serve_http};
use codemode_runtime::Codemode;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::json;
use sha2::{Digest, Sha256};

const TOKEN: &str = "alices-token";

type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

/// A session of `url` that ran one script, as alice.
async fn open(url: &str) -> Client {
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_string()).auth_header(TOKEN);
    let client = ().serve(StreamableHttpClientTransport::from_config(config)).await.unwrap();
    let mut params = CallToolRequestParams::new("codemode");
    params.arguments = json!({ "code": "return 1" }).as_object().cloned();
    let result = client.peer().call_tool(params).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{:?}", result.content);
    client
}

/// `serve --listen` on loopback with alice's token, keeping at most `max_sessions` sessions
/// and forgetting one unused for `idle`: the server, its gate and its URL.
async fn serve_for_alice(
    max_sessions: usize,
    idle: Duration,
) -> (codemode_mcp::HttpServer, Gate, String) {
    let gate = Gate::builder()
        .registry(Registry::new())
        .policy(PolicySet::parse("p.cedar", "permit(principal, action, resource);").unwrap())
        .build()
        .unwrap();
    let codemode = Codemode::builder().gate(gate.clone()).build().unwrap();
    let http = HttpOptions {
        principals: vec![TokenPrincipal {
            principal: Principal {
                id: "alice".into(),
                team: None,
            },
            token_sha256: Sha256::digest(TOKEN.as_bytes()).into(),
        }],
        session_idle_timeout: idle,
        max_sessions,
        ..HttpOptions::default()
    };
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = serve_http(
        codemode,
        &[addr],
        http,
        ElicitationApprover::new(),
        ServeOptions::default(),
    )
    .await
    .unwrap();
    let url = format!("http://{}/mcp", server.local_addr);
    (server, gate, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_and_expired_sessions_leave_nothing_in_the_gate() {
    let max_sessions = 4;
    let (server, gate, url) = serve_for_alice(max_sessions, Duration::from_secs(2)).await;
    let live = server.session_counter();

    // A burst: each new session past the limit ends (evicts) an older one of alice's.
    let mut clients = Vec::new();
    for _ in 0..12 {
        clients.push(open(&url).await);
    }
    assert!(live() <= max_sessions, "{} sessions live", live());
    assert!(
        gate.remembered_sessions() <= max_sessions,
        "the gate still keeps {} sessions after all but {max_sessions} were evicted",
        gate.remembered_sessions()
    );

    // Abandoned: the rest end at the idle limit.
    let deadline = Instant::now() + Duration::from_secs(20);
    while live() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(live(), 0, "the idle sessions expire within 20 s");
    assert_eq!(
        gate.remembered_sessions(),
        0,
        "expired sessions leave nothing in the gate"
    );
    drop(clients);
    server.stop().await;
}

/// Fifty sessions begun at once by one token: each request that makes room counts the others
/// still being begun, so the token never holds more than its half of `--max-sessions`, however
/// the requests interleave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_new_sessions_stays_within_the_tokens_share() {
    let max_sessions = 4;
    let (server, _gate, url) = serve_for_alice(max_sessions, Duration::from_secs(24 * 3600)).await;
    let live = std::sync::Arc::new(server.session_counter());
    let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watcher = {
        let (live, most) = (live.clone(), most.clone());
        tokio::spawn(async move {
            loop {
                most.fetch_max(live(), std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let burst: Vec<_> = (0..50)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let config = StreamableHttpClientTransportConfig::with_uri(url).auth_header(TOKEN);
                ().serve(StreamableHttpClientTransport::from_config(config))
                    .await
                    .ok()
            })
        })
        .collect();
    let mut clients = Vec::new();
    for task in burst {
        clients.extend(task.await.unwrap());
    }
    watcher.abort();
    assert!(!clients.is_empty(), "some sessions began");
    let most = most.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        live() <= max_sessions / 2 && most <= max_sessions / 2,
        "alice holds {} sessions (at most {most} at once) of {max_sessions}, more than her half",
        live()
    );
    drop(clients);
    server.stop().await;
}
