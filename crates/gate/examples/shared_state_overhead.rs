//! What shared state costs per gated call, in one run: no store (budgets in the process, no
//! audit), then the in-memory store, SQLite and PostgreSQL each charging a principal's daily
//! budget and appending the keyed audit line to a stream; 1,000 sequential and 1,000 parallel
//! calls; and the calls per second of two "replicas" (two gates, two pools) against one, in
//! one process. For PostgreSQL, also with replicas as separate processes: this example runs
//! itself again as one, then two, replica processes (each its own gate, pool and runtime),
//! each making 10 rounds of 1,000 parallel calls over 100 principals once all are ready, and
//! reports the calls per second, and the CPU time the replicas and the PostgreSQL server used
//! (per 1,000 calls). PostgreSQL runs twice, interleaved: without budget leases (`pg
//! per-call`: a reserve and a settle statement per call, as before schema 3) and with them
//! (`pg leases`, the default: no budget statement per call; what is left per call is its audit
//! lines). Calls are a script's calls (depth 1), whose lines wait for the disk only at the
//! script's own line. The sequential rows run inside a `codemode` call, as the runtime does: a
//! read-only tool (`echo_ro`) waits for its one line; a tool that can change something
//! (`echo`) waits for its journal line and hands its outcome line to the script. `echo`
//! called by the model itself (depth 0, "top-level") waits for both, the second durable. The
//! parallel and replica rows call `echo` outside any open script, so each call waits for both
//! of its lines (neither waits for the disk).
//!
//! ```sh
//! WITH_POSTGRES_OPTS= scripts/with-postgres cargo run --release -p codemode-gate --example shared_state_overhead
//! ```
//! Without CODEMODE_TEST_POSTGRES_URL the PostgreSQL rows are left out.
//!
//! With `CODEMODE_BENCH_REPLICA_CPU=0.4` (a fraction of one core), the replica processes run
//! once more, each in a cgroup of its own capped at that share (needs a writable cgroup `cpu`
//! controller, such as root in a container): on a machine with few cores this measures how
//! replicas scale when each has CPU of its own, as on separate machines, rather than how two
//! processes share two cores with the server.

#[path = "support/cpu_cap.rs"]
mod cpu_cap;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use codemode_gate::{
    AuditKey, AuditLog, BudgetLimits, CallRequest, DailyBudgets, Gate, PolicySet, Principal,
    Registry,
};
use codemode_spec::{
    CallFacts, Exposure, Origin, PreparedCall, Provenance, Tool, ToolError, ToolOutput, ToolSpec,
    prepared,
};
use codemode_state::{
    Clock, LeaseOptions, MemoryStore, PostgresOptions, PostgresStore, SqliteOptions, SqliteStore,
    StateStore,
};
use serde_json::{Value, json};

struct Echo(ToolSpec);

impl Tool for Echo {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        Ok(prepared(CallFacts::default(), move |_| {
            Box::pin(async move { Ok(ToolOutput::value(args)) })
        }))
    }
}

const N: usize = 1000;
/// Rounds of N parallel calls each replica process makes (long enough to average out the
/// scheduler of a shared machine).
const ROUNDS: usize = 10;

/// A gate on `store` (or none); each of `principals` people has a daily budget; its audit goes
/// to `stream` in the store.
fn gate(store: Option<Arc<dyn StateStore>>, stream: &str) -> Gate {
    let registry = Registry::new();
    let _ = registry.register(Arc::new(Echo(ToolSpec::new("echo", "", json!({})))));
    // The same tool marked read-only: not journalled before it runs (one audit line, not two).
    let mut read_only = ToolSpec::new("echo_ro", "", json!({}));
    read_only.annotations.read_only_hint = Some(true);
    let _ = registry.register(Arc::new(Echo(read_only)));
    // Stands for the runtime's script call.
    let _ = registry.register(Arc::new(Echo(ToolSpec::new("codemode", "", json!({})))));
    // The same tool for the model to call itself.
    let mut direct = ToolSpec::new("echo_direct", "", json!({}));
    direct.exposure = Exposure::Direct;
    let _ = registry.register(Arc::new(Echo(direct)));
    let mut b = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("p", "permit(principal, action, resource);").expect("valid"));
    if let Some(store) = store {
        b = b
            .shared_budgets(
                store.clone(),
                DailyBudgets {
                    principal: BudgetLimits {
                        max_calls: Some(1 << 40),
                        ..BudgetLimits::default()
                    },
                    ..DailyBudgets::default()
                },
            )
            .audit(AuditLog::stream(store, stream, AuditKey::from_bytes([1; 32])).expect("stream"));
    }
    let gate = b.build().expect("the gate builds");
    // Session k acts for user k: with 100 people, calls touch 100 different ledger rows.
    for k in 0..100 {
        gate.set_principal(
            &format!("session-{k}"),
            Principal {
                id: format!("user-{k}"),
                team: None,
            },
        );
    }
    gate
}

fn request(i: usize, people: usize) -> CallRequest {
    request_to("echo", i, people)
}

/// A script's call (depth 1): its audit line is committed before it returns, and flushed to
/// disk by the script's own line, which follows it.
fn request_to(tool: &str, i: usize, people: usize) -> CallRequest {
    let mut p = Provenance::model(format!("c{i}"), format!("session-{}", i % people));
    p.origin = Origin::Script;
    p.depth = 1;
    p.parent_call_id = Some(format!("script-call-{}", i % people));
    p.script_id = Some(format!("script-{}", i % people));
    CallRequest::new(tool, json!({"i": i}), p)
}

/// A call the model makes itself (depth 0): its line is durable before the call returns.
fn top_level(tool: &str, i: usize) -> CallRequest {
    let p = Provenance::model(format!("t{i}"), "session-0");
    CallRequest::new(tool, json!({"i": i}), p)
}

/// Median and total of N sequential calls of `echo` (journalled before it runs), in µs and ms.
async fn sequential(gate: &Gate) -> (f64, f64) {
    sequential_of(gate, "echo").await
}

/// The same for `tool`.
/// Inside one script, as the runtime runs them: a `codemode` call begins, the calls run, and
/// the `codemode` call's line (waiting for its calls' lines) ends it; the total includes that.
async fn sequential_of(gate: &Gate, tool: &str) -> (f64, f64) {
    static RUN: AtomicUsize = AtomicUsize::new(0);
    let id = format!("script-run-{}", RUN.fetch_add(1, Ordering::Relaxed));
    let started = Instant::now();
    let mut script = gate
        .admit(CallRequest::new(
            "codemode",
            json!({}),
            Provenance::model(id.clone(), "session-0"),
        ))
        .await
        .expect("the script is permitted");
    script.begin().await.expect("the script starts");
    let (median, _) = sequential_with(gate, |i| {
        let mut req = request_to(tool, i, 1);
        req.provenance.parent_call_id = Some(id.clone());
        req
    })
    .await;
    script
        .finish(Ok(ToolOutput::value(json!("done"))))
        .await
        .expect("the script's line is written");
    (median, started.elapsed().as_secs_f64() * 1e3)
}

/// The same for the requests `make` builds.
async fn sequential_with(gate: &Gate, make: impl Fn(usize) -> CallRequest) -> (f64, f64) {
    let mut each = Vec::with_capacity(N);
    let started = Instant::now();
    for i in 0..N {
        let t = Instant::now();
        gate.call(make(i)).await.expect("permitted");
        each.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let total = started.elapsed().as_secs_f64() * 1e3;
    each.sort_by(f64::total_cmp);
    (each[N / 2], total)
}

/// Wall time of N calls at once spread over `gates`, each call for one of `people`.
async fn parallel(gates: &[Gate], people: usize) -> f64 {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..N {
        let gate = gates[i % gates.len()].clone();
        tasks.push(tokio::spawn(async move {
            gate.call(request(i, people)).await.expect("permitted")
        }));
    }
    for t in tasks {
        t.await.expect("joined");
    }
    started.elapsed().as_secs_f64() * 1e3
}

async fn row(
    name: &str,
    a: Option<Arc<dyn StateStore>>,
    b: Option<Arc<dyn StateStore>>,
    base: f64,
) {
    let one = gate(a.clone(), "bench");
    sequential(&one).await; // warm up: rows, pools, caches
    let (median, total) = sequential(&one).await;
    let (read_only, _) = sequential_of(&one, "echo_ro").await;
    let (direct, _) = sequential_with(&one, |i| top_level("echo_direct", i)).await;
    let par = parallel(std::slice::from_ref(&one), 1).await;
    let spread_one = parallel(std::slice::from_ref(&one), 100).await;
    let two = [one.clone(), gate(b.or(a), "bench")];
    let spread_two = parallel(&two, 100).await;
    println!(
        "{name:<10} seq median {median:>7.1} µs (+{:>6.1} µs; read-only +{:>6.1} µs; top-level +{:>6.1} µs)  seq 1000 {total:>7.1} ms  par 1000 (1 person) {par:>7.1} ms  par 1000 (100 people): 1 replica {spread_one:>7.1} ms ({:>6.0}/s), 2 replicas {spread_two:>7.1} ms ({:>6.0}/s, {:.2}x)",
        median - base,
        read_only - base,
        direct - base,
        N as f64 / spread_one * 1e3,
        N as f64 / spread_two * 1e3,
        spread_one / spread_two
    );
}

/// Set in a replica process: the schema to use.
const REPLICA_SCHEMA: &str = "CODEMODE_BENCH_REPLICA_SCHEMA";

/// CPU time (user + system) of a process so far, in ms; `pid` may be `self`.
fn cpu_ms(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command's closing parenthesis start at field 3 (state).
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i).and_then(|x| x.parse::<u64>().ok()))
        .sum();
    ticks as f64 * 10.0 // USER_HZ is 100 on Linux
}

/// CPU time of every `postgres` process so far, in ms.
fn server_cpu_ms() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|pid| pid.chars().all(|c| c.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .map(|pid| cpu_ms(&pid))
        .sum()
}

/// A PostgreSQL store in `schema`, with budget leases or without.
async fn open_postgres(url: &str, schema: &str, leases: bool) -> PostgresStore {
    let options = PostgresOptions {
        schema: Some(schema.to_string()),
        budget_leases: leases.then(LeaseOptions::default),
        ..PostgresOptions::default()
    };
    PostgresStore::open(url, options, Clock::system())
        .await
        .expect("postgres")
}

/// Set in a replica process without budget leases.
const REPLICA_PER_CALL: &str = "CODEMODE_BENCH_REPLICA_PER_CALL";

/// The body of a replica process: ready (warmed up), then rounds of 1,000 parallel calls on
/// "go".
async fn replica(url: &str, schema: &str) {
    let leases = std::env::var(REPLICA_PER_CALL).is_err();
    let store: Arc<dyn StateStore> = Arc::new(open_postgres(url, schema, leases).await);
    let gate = gate(Some(store), "bench");
    parallel(std::slice::from_ref(&gate), 100).await; // warm up
    println!("READY");
    std::io::stdout().flush().expect("stdout");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("stdin");
    let cpu = cpu_ms("self");
    let mut ms = 0.0;
    for _ in 0..ROUNDS {
        ms += parallel(std::slice::from_ref(&gate), 100).await;
    }
    println!("DONE {ms} {}", (cpu_ms("self") - cpu) / ROUNDS as f64);
    std::io::stdout().flush().expect("stdout");
    // Stay (and keep the connections) until the parent read the server's CPU time.
    let _ = std::io::stdin().read_line(&mut go);
    gate.flush().await; // gives the budget leases back
}

/// Set in the parent: the share of a core each replica process may use.
const REPLICA_CPU: &str = "CODEMODE_BENCH_REPLICA_CPU";

/// Runs `n` replica processes at once: calls per second of all together, each replica's CPU
/// ms, and the server's CPU ms, over the measured calls. With `cap`, each replica runs in a
/// cgroup of its own limited to that share of a core.
fn replicas(
    url: &str,
    schema: &str,
    leases: bool,
    n: usize,
    cap: Option<f64>,
) -> (f64, Vec<f64>, f64) {
    let exe = std::env::current_exe().expect("this example's path");
    let mut caps = Vec::new();
    let mut kids: Vec<_> = (0..n)
        .map(|i| {
            let mut c = Command::new(&exe);
            if !leases {
                c.env(REPLICA_PER_CALL, "1");
            }
            let child = c
                .env("CODEMODE_TEST_POSTGRES_URL", url)
                .env(REPLICA_SCHEMA, schema)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("a replica process");
            if let Some(cores) = cap {
                let name = format!("codemode-bench-{}-{i}", std::process::id());
                let cg = cpu_cap::CpuCap::new(&name, cores).expect("a CPU cgroup");
                cg.add(child.id()).expect("the replica in its cgroup");
                caps.push(cg);
            }
            child
        })
        .collect();
    let mut outs: Vec<_> = kids
        .iter_mut()
        .map(|k| BufReader::new(k.stdout.take().expect("stdout")).lines())
        .collect();
    for out in &mut outs {
        let line = out.next().expect("a replica line").expect("read");
        assert_eq!(line, "READY", "the replica did not start");
    }
    let server = server_cpu_ms();
    for k in &mut kids {
        writeln!(k.stdin.as_mut().expect("stdin"), "go").expect("go");
    }
    let mut wall: f64 = 0.0;
    let mut cpu = Vec::new();
    for out in &mut outs {
        let line = out.next().expect("a replica line").expect("read");
        let mut f = line
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse::<f64>().expect("number"));
        wall = wall.max(f.next().expect("wall"));
        cpu.push(f.next().expect("cpu"));
    }
    let server = (server_cpu_ms() - server) / (ROUNDS * n) as f64;
    for mut k in kids {
        drop(k.stdin.take());
        k.wait().expect("the replica exits");
    }
    drop(caps);
    ((N * ROUNDS * n) as f64 / wall * 1e3, cpu, server)
}

fn process_rows(url: &str, schema: &str, leases: bool, cap: Option<f64>) {
    let (one, cpu1, server1) = replicas(url, schema, leases, 1, cap);
    let (two, cpu2, server2) = replicas(url, schema, leases, 2, cap);
    let capped = cap.map_or(String::new(), |c| format!(" capped at {c} core each"));
    println!(
        "pg {}, replicas as processes{capped}, 10 x 1,000 parallel calls each over 100 people (CPU ms per 1,000 calls): 1 replica {one:>6.0}/s (CPU ms: replica {:.0}, server {server1:.0}), 2 replicas {two:>6.0}/s (CPU ms: replicas {:.0} + {:.0}, server {server2:.0}), {:.2}x",
        if leases { "leases" } else { "per-call" },
        cpu1[0],
        cpu2[0],
        cpu2.get(1).copied().unwrap_or(0.0),
        two / one
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if let (Ok(url), Ok(schema)) = (
        std::env::var("CODEMODE_TEST_POSTGRES_URL"),
        std::env::var(REPLICA_SCHEMA),
    ) {
        replica(&url, &schema).await;
        return;
    }
    let none = gate(None, "bench");
    sequential(&none).await;
    let (base, total) = sequential(&none).await;
    let par = parallel(std::slice::from_ref(&none), 1).await;
    println!(
        "{:<10} seq median {base:>7.1} µs              seq 1000 {total:>7.1} ms  par 1000 (1 person) {par:>7.1} ms",
        "no store"
    );

    let memory: Arc<dyn StateStore> = Arc::new(MemoryStore::new(Clock::system()));
    row("memory", Some(memory), None, base).await;

    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("state.db");
    let open_sqlite = || SqliteStore::open(&path, SqliteOptions::default(), Clock::system());
    let a: Arc<dyn StateStore> = Arc::new(open_sqlite().await.expect("sqlite"));
    let b: Arc<dyn StateStore> = Arc::new(open_sqlite().await.expect("sqlite"));
    row("sqlite", Some(a), Some(b), base).await;

    match std::env::var("CODEMODE_TEST_POSTGRES_URL") {
        Ok(url) if !url.trim().is_empty() => {
            // Without leases first (every call reserves and settles in the database, as
            // before schema 3), then with them (the default), each in a schema of its own.
            for leases in [false, true] {
                let tag = if leases { "leases" } else { "per-call" };
                let schema = format!("cm_bench_{}_{}", std::process::id(), u8::from(leases));
                let a = Arc::new(open_postgres(&url, &schema, leases).await) as Arc<dyn StateStore>;
                let b = Arc::new(open_postgres(&url, &schema, leases).await) as Arc<dyn StateStore>;
                row(&format!("pg {tag}"), Some(a), Some(b), base).await;
            }
            let cap = match std::env::var(REPLICA_CPU) {
                Ok(v) => Some(
                    v.parse::<f64>()
                        .expect("CODEMODE_BENCH_REPLICA_CPU: a number"),
                ),
                Err(_) => None,
            };
            for leases in [false, true] {
                let schema = format!("cm_bench_{}_{}", std::process::id(), u8::from(leases));
                process_rows(&url, &schema, leases, None);
                if cap.is_some() {
                    process_rows(&url, &schema, leases, cap);
                }
            }
        }
        _ => println!("postgres   (left out: CODEMODE_TEST_POSTGRES_URL is not set)"),
    }
}
