//! `codemode serve`: codemode as an MCP server, meant to run all day.
//!
//! It answers its client at once and connects MCP servers in the background; on SIGTERM,
//! SIGINT or SIGHUP it stops accepting, aborts running scripts (their upstream calls are
//! cancelled and their audit lines written), closes the upstream sessions and stops their
//! process groups, then exits. A second signal skips the wait for scripts.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use codemode_mcp::{HttpOptions, ServeOptions};
use tokio_util::sync::CancellationToken;

use crate::SetupArgs;
use crate::setup::{self, LimitFlags};

/// How long a shutdown waits for running scripts to end after aborting them.
const DRAIN: Duration = Duration::from_secs(10);

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Serve streamable HTTP on this address instead of stdio: `127.0.0.1:8765`,
    /// `localhost:8765` or `[::1]:8765` (loopback unless --token is set).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// Bearer token every HTTP request must carry; required for a non-loopback address.
    #[arg(long, value_name = "TOKEN", env = "CODEMODE_SERVE_TOKEN")]
    pub token: Option<String>,
    /// A browser origin allowed to call the HTTP server besides loopback pages, such as
    /// `https://app.example.com` (repeatable). Requests from other origins get 403.
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub allow_origins: Vec<String>,
    /// How long an HTTP session may go unused before it is forgotten with its store() values,
    /// such as `30m`, `8h` or `2d`; until then a client that reconnects continues it.
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = codemode_config::durable::parse_duration)]
    pub session_idle_timeout: Duration,
    /// Most HTTP sessions kept at once; a new one ends the longest-idle one.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub max_sessions: usize,
    /// Most connections one client address may hold open at once (0: no limit). Behind a
    /// proxy every connection comes from the proxy's address: raise it, or set 0 and let the
    /// proxy limit each client.
    #[arg(long, value_name = "N", default_value_t = codemode_mcp::DEFAULT_MAX_CONNECTIONS_PER_PEER)]
    pub max_connections_per_peer: usize,
    /// Named bearer tokens, one per person: a JSON file
    /// `{"tokens": [{"name": "alice", "team": "infra", "token_sha256": "<hex>"}]}`. The name is
    /// the principal of the sessions begun with that token (for `budgets.principal` and
    /// `budgets.team`, and named in their audit lines), whatever --principal says; --principal
    /// then needs --token, whose sessions act for it. Needs --listen.
    #[arg(long, value_name = "FILE")]
    pub tokens_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub limits: LimitFlags,
    #[command(flatten)]
    pub setup: SetupArgs,
}

pub async fn run(args: ServeArgs) -> Result<ExitCode> {
    let addrs = match &args.listen {
        Some(listen) => Some(resolve(listen).await?),
        None => None,
    };
    if addrs.is_some() {
        raise_descriptor_limit();
    }
    let principals = match &args.tokens_file {
        Some(f) => read_tokens(f)?,
        None => Vec::new(),
    };
    check_principal_flags(&args)?;
    if let Some(addrs) = &addrs
        && addrs.iter().any(|a| !a.ip().is_loopback())
        && args.token.is_none()
        && principals.is_empty()
    {
        bail!(
            "{} is reachable from other machines: pass --token (or CODEMODE_SERVE_TOKEN) so that every request must carry it, or listen on 127.0.0.1",
            args.listen.as_deref().unwrap_or_default()
        );
    }
    let shutdown = CancellationToken::new();
    let hurry = CancellationToken::new();
    let signals = watch_signals(shutdown.clone(), hurry.clone())?;
    // Questions go to the person through their MCP client (elicitation), never to a terminal:
    // stdin and stdout carry the protocol.
    let approvals = codemode_mcp::ElicitationApprover::new();
    let slot = codemode_telemetry::MetricsSlot::default();
    let installation = setup::build_observed(
        &args.setup,
        &args.limits,
        Some(Arc::new(approvals.clone())),
        true,
        Some(Arc::new(slot.clone())),
    )
    .await?;
    for warning in installation.warnings() {
        // Warnings quote names and files others chose (an MCP server's, a project's): one log
        // line each, nothing a terminal would act on.
        tracing::warn!("{}", codemode_gate::shown_text(&warning));
    }
    // A question the client leaves unanswered expires like any other approval.
    approvals.set_answer_within(
        installation
            .configuration()
            .settings
            .durable
            .approval_expiry,
    );
    // Cells of this project whose process stopped (killed, crashed) are rebuilt here by
    // replaying their logs, once that process's lease lapsed: look now and then, in the
    // background so that clients are answered at once.
    let resumer = installation.codemode().cells().is_some().then(|| {
        let codemode = installation.codemode().clone();
        // A cell's script calls MCP tools by name: rebuilt before their servers connected, it
        // would fail on a name not known yet.
        let servers_ready = installation.when_servers_ready();
        tokio::spawn(async move {
            servers_ready.await;
            loop {
                match codemode.resume_cells().await {
                    Ok(ids) if !ids.is_empty() => {
                        tracing::info!(cells = ?ids, "took over cells left by a stopped codemode")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!("looking for cells to take over failed: {e}"),
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        })
    });
    crate::trim::spawn();
    let telemetry = start_telemetry(&installation, &slot)?;
    // MCP servers connect in the background: `initialize` is answered at once, and every
    // client hears when the servers' tools arrive or change (the registry already follows).
    let mut changes = installation.tools_changed();
    changes.borrow_and_update();
    let notifier = approvals.clone();
    let follower = tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            notifier.notify_tool_list_changed().await;
        }
    });
    let codemode = installation.codemode().clone();
    let opts = ServeOptions {
        hub: installation.hub(),
        shutdown: shutdown.clone(),
        activity: Default::default(),
    };
    let activity = opts.activity.clone();
    let served = match addrs {
        Some(addrs) => {
            let metrics: Option<codemode_mcp::MetricsText> =
                telemetry.serves_prometheus().then(|| {
                    let t = telemetry.clone();
                    Arc::new(move || t.prometheus_text()) as codemode_mcp::MetricsText
                });
            let http = HttpOptions {
                bearer_token: args.token.clone(),
                principals: principals.clone(),
                metrics,
                allowed_origins: args.allow_origins.clone(),
                session_idle_timeout: args.session_idle_timeout,
                max_sessions: args.max_sessions,
                max_connections_per_peer: args.max_connections_per_peer,
            };
            match codemode_mcp::serve_http(codemode.clone(), &addrs, http, approvals, opts).await {
                Ok(server) => {
                    let shown: Vec<String> = server
                        .local_addrs
                        .iter()
                        .map(|a| format!("http://{a}/mcp"))
                        .collect();
                    eprintln!("codemode: serving MCP at {}", shown.join(" and "));
                    if let Some(m) = telemetry.metrics() {
                        let count = server.session_counter();
                        m.gauges.sessions(move || count() as u64);
                    }
                    server.wait().await
                }
                Err(e) => Err(e),
            }
        }
        None => codemode_mcp::serve_stdio(codemode.clone(), approvals, opts).await,
    };
    // The client went away or a signal came: abort what still runs and wait for it, so the
    // calls it made are cancelled upstream and audited, then stop the servers.
    let signalled = shutdown.is_cancelled();
    shutdown.cancel();
    let drained = tokio::select! {
        idle = activity.wait_idle(DRAIN) => idle,
        _ = hurry.cancelled() => false,
    };
    if !drained {
        tracing::warn!(
            running = activity.running(),
            "scripts still running at shutdown; stopping anyway"
        );
    }
    // Cells that yielded run on after their request returned: stop them too (the next start
    // takes them over by replay), so that their calls in flight are cancelled and audited
    // before the process ends.
    if let Some(cells) = installation.codemode().cells() {
        let stopped = tokio::select! {
            stopped = cells.abandon_and_wait(DRAIN) => stopped,
            _ = hurry.cancelled() => false,
        };
        if !stopped {
            tracing::warn!("cells still running at shutdown; stopping anyway");
        }
    }
    follower.abort();
    if let Some(resumer) = resumer {
        resumer.abort();
    }
    installation.gate().flush().await;
    installation.shutdown().await;
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    signals.abort();
    if signalled {
        // A signal during the stdio handshake ends it as "cancelled": that is the stop asked
        // for, not a failure.
        if let Err(e) = &served {
            tracing::info!("stopped by a signal: {e}");
        }
        // Everything is stopped and written; do not wait for a read of stdin that will never end.
        codemode_childenv::stop_confined_survivors();
        std::process::exit(0);
    }
    served?;
    Ok(ExitCode::SUCCESS)
}

/// Starts what the `telemetry` settings ask for and connects the gate's metrics.
fn start_telemetry(
    installation: &codemode_setup::Installation,
    slot: &codemode_telemetry::MetricsSlot,
) -> Result<Arc<codemode_telemetry::Telemetry>> {
    let settings = &installation.configuration().settings.telemetry;
    let config = codemode_telemetry::TelemetryConfig {
        otlp_endpoint: settings.otlp_endpoint.clone(),
        metrics: settings.metrics == Some(true),
        ..Default::default()
    };
    let telemetry = codemode_telemetry::Telemetry::start(&config, crate::TRACES.get())?;
    if let Some(m) = telemetry.metrics() {
        slot.fill(m.clone());
        if let Some(hub) = installation.hub() {
            m.gauges.upstreams(move || {
                hub.status()
                    .into_iter()
                    .filter(|s| s.state != codemode_mcp::ServerState::Disabled)
                    .map(|s| codemode_telemetry::UpstreamState {
                        up: matches!(s.state, codemode_mcp::ServerState::Connected { .. }),
                        server: s.name,
                    })
                    .collect()
            });
        }
    }
    Ok(Arc::new(telemetry))
}

/// Who a session acts for: a named token's session is that token's name and team (the token
/// says who the person is, so one flag must not merge everyone's budgets into one); `--principal`
/// is for the sessions of stdio and of the unnamed `--token`. A flag that would apply to no
/// session, or a file no HTTP server reads, is an error rather than silently ignored.
fn check_principal_flags(args: &ServeArgs) -> Result<()> {
    let Some(file) = &args.tokens_file else {
        return Ok(());
    };
    if args.listen.is_none() {
        bail!(
            "--tokens-file {} names bearer tokens for the HTTP server, and there is none: add --listen 127.0.0.1:8765 (or another address), or leave out --tokens-file for stdio",
            file.display()
        );
    }
    // The HTTP server ignores an empty --token, so it counts as none here too.
    if let Some(principal) = &args.setup.principal
        && args.token.as_deref().is_none_or(str::is_empty)
    {
        bail!(
            "--principal {principal} would apply to no session: with --tokens-file and no --token, every session is begun with a named token and acts for that token's name and team. Leave out --principal (and --team), or add --token for the sessions that act for {principal}"
        );
    }
    Ok(())
}

/// The `--tokens-file`: names, teams and SHA-256 digests of bearer tokens.
fn read_tokens(path: &std::path::Path) -> Result<Vec<codemode_mcp::TokenPrincipal>> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        tokens: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Entry {
        name: String,
        #[serde(default)]
        team: Option<String>,
        token_sha256: String,
    }
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--tokens-file {shown} cannot be read"))?;
    let file: File = serde_json::from_str(&text).with_context(|| {
        format!("--tokens-file {shown}: expected {{\"tokens\": [{{\"name\": \"alice\", \"team\": \"infra\", \"token_sha256\": \"<64 hex digits>\"}}]}}")
    })?;
    let mut out = Vec::new();
    for (i, e) in file.tokens.into_iter().enumerate() {
        let digest: [u8; 32] = hex::decode(e.token_sha256.trim())
            .ok()
            .and_then(|d| d.try_into().ok())
            .with_context(|| {
                format!("--tokens-file {shown}: tokens[{i}].token_sha256 is not 64 hex digits; make it with `printf %s \"$TOKEN\" | sha256sum`")
            })?;
        if e.name.trim().is_empty() {
            bail!("--tokens-file {shown}: tokens[{i}].name is empty");
        }
        out.push(codemode_mcp::TokenPrincipal {
            principal: codemode_gate::Principal {
                id: e.name,
                team: e.team,
            },
            token_sha256: digest,
        });
    }
    if out.is_empty() {
        bail!("--tokens-file {shown} lists no token");
    }
    Ok(out)
}

/// `localhost:8765`, `127.0.0.1:8765`, `[::1]:8765`: every address the name has.
async fn resolve(listen: &str) -> Result<Vec<SocketAddr>> {
    if let Ok(addr) = listen.parse::<SocketAddr>() {
        return Ok(vec![addr]);
    }
    let mut addrs: Vec<SocketAddr> = tokio::net::lookup_host(listen)
        .await
        .with_context(|| {
            format!("--listen {listen}: not an address; use HOST:PORT, such as 127.0.0.1:8765")
        })?
        .collect();
    addrs.sort();
    addrs.dedup();
    if addrs.is_empty() {
        bail!("--listen {listen}: the name has no address");
    }
    Ok(addrs)
}

/// SIGTERM, SIGINT, SIGHUP (and the other signals whose default action would end the process
/// with calls unaudited) cancel `shutdown`; a second one cancels `hurry`, which skips the wait
/// for running scripts (the upstream servers are still stopped).
fn watch_signals(
    shutdown: CancellationToken,
    hurry: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>> {
    let mut signals = crate::stop::ending_signals()?;
    Ok(tokio::spawn(async move {
        let mut seen = 0;
        while let Some((name, _)) = signals.recv().await {
            seen += 1;
            if seen == 1 {
                tracing::info!("{name}: shutting down");
                shutdown.cancel();
            } else {
                tracing::warn!("{name} again: not waiting for running scripts");
                hurry.cancel();
            }
        }
    }))
}

/// Raises the soft limit on open descriptors to the hard one (at most 65,536): a server holds
/// one per connection, and the common soft limit of 1,024 is what one client's connections may
/// already take (`--max-connections-per-peer`).
fn raise_descriptor_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct they are given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return;
        }
        let wanted = limit.rlim_max.min(65_536);
        if limit.rlim_cur < wanted {
            limit.rlim_cur = wanted;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use codemode_config::durable::parse_duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_secs(172800));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5 weeks").is_err());
    }
}
