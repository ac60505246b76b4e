//! Per-operation latency of the state store on each backend, in one run:
//! a gated call's budget round trip (reserve on three ledgers, then settle) and an audit
//! append, 1,000 sequentially and 1,000 at once.
//!
//! ```sh
//! scripts/with-postgres cargo run --release -p codemode-state --example state_latency
//! ```
//! Without CODEMODE_TEST_POSTGRES_URL the PostgreSQL rows are left out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use codemode_state::{
    Amounts, AuditLine, Clock, LedgerKey, Limits, MemoryStore, PostgresOptions, PostgresStore,
    ReserveOutcome, ReserveRequest, SqliteOptions, SqliteStore, StateStore, utc_day,
};
use sha2::{Digest, Sha256};

const N: usize = 1000;

/// A gated call's ledgers: its script's, its session's and its principal's of the day. With
/// `spread`, call `i` belongs to one of 100 sessions and 100 principals (no shared rows to
/// queue on); without, every call shares one session and one principal.
fn request(i: usize, spread: bool) -> ReserveRequest {
    let day = utc_day(Clock::system().now_ms());
    let who = if spread { i % 100 } else { 0 };
    let unlimited = Limits {
        calls: Some(1 << 40),
        cost_micro_usd: Some(1 << 50),
        ..Limits::default()
    };
    ReserveRequest {
        ledgers: vec![
            (LedgerKey::script(format!("script-{}", i % 10)), unlimited),
            (
                LedgerKey::session(format!("bench-session-{who}")),
                unlimited,
            ),
            (
                LedgerKey::principal_day(format!("user-{who}"), day),
                unlimited,
            ),
        ],
        amounts: Amounts {
            calls: 1,
            ..Amounts::default()
        },
        hold_for: Duration::from_secs(120),
    }
}

async fn reserve_settle(store: &dyn StateStore, i: usize, spread: bool) {
    let ReserveOutcome::Granted(r) = store.reserve(request(i, spread)).await.expect("reserve")
    else {
        panic!("refused");
    };
    let spent = Amounts {
        calls: 1,
        tokens: 120,
        cost_micro_usd: 40,
        bytes: 512,
        ..Amounts::default()
    };
    store.settle(&r, spent).await.expect("settle");
}

async fn append(store: &dyn StateStore, i: usize) {
    let line = format!(
        r#"{{"ts":"2026-12-03T10:00:00Z","session":"bench-session","tool":"read","decision":"allow","policy_ids":["read-only"],"status":"ok","duration_ms":3,"n":{i}}}"#
    );
    store
        .append_audit(
            "bench",
            Box::new(move |head| {
                let prev = head.hash.clone().unwrap_or_else(|| "0".repeat(64));
                let hash = hex::encode(Sha256::digest(format!("{prev}{line}").as_bytes()));
                Ok(AuditLine {
                    line: line.clone(),
                    hash,
                })
            }),
        )
        .await
        .expect("append");
}

struct Stats {
    median_us: f64,
    p99_us: f64,
    wall_ms: f64,
}

fn stats(mut lat: Vec<Duration>, wall: Duration) -> Stats {
    lat.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    Stats {
        median_us: us(lat[lat.len() / 2]),
        p99_us: us(lat[lat.len() * 99 / 100]),
        wall_ms: wall.as_secs_f64() * 1e3,
    }
}

#[derive(Clone, Copy)]
enum Op {
    /// One round trip to the database (`ping`), for scale.
    Ping,
    Budget,
    /// Budget calls of 100 different sessions and principals.
    BudgetSpread,
    Audit,
}

async fn run_op(store: &dyn StateStore, op: Op, i: usize) {
    match op {
        Op::Ping => store.ping().await.expect("ping"),
        Op::Budget => reserve_settle(store, i, false).await,
        Op::BudgetSpread => reserve_settle(store, i, true).await,
        Op::Audit => append(store, i).await,
    }
}

async fn sequential(store: Arc<dyn StateStore>, op: Op) -> Stats {
    for i in 0..50 {
        run_op(store.as_ref(), op, i).await; // warm up
    }
    let start = Instant::now();
    let mut lat = Vec::with_capacity(N);
    for i in 0..N {
        let t = Instant::now();
        run_op(store.as_ref(), op, i).await;
        lat.push(t.elapsed());
    }
    stats(lat, start.elapsed())
}

/// All N at once, spread over the given instances (two replicas for the `x2` rows).
async fn concurrent(stores: &[Arc<dyn StateStore>], op: Op) -> Stats {
    let start = Instant::now();
    let tasks: Vec<_> = (0..N)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            tokio::spawn(async move {
                let t = Instant::now();
                run_op(store.as_ref(), op, i).await;
                t.elapsed()
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(N);
    for t in tasks {
        lat.push(t.await.expect("task"));
    }
    stats(lat, start.elapsed())
}

fn row(backend: &str, what: &str, s: &Stats) {
    println!(
        "| {backend} | {what} | {:.1} | {:.1} | {:.0} | {:.0} |",
        s.median_us,
        s.p99_us,
        s.wall_ms,
        N as f64 / (s.wall_ms / 1e3)
    );
}

async fn bench(backend: &str, stores: Vec<Arc<dyn StateStore>>) {
    if stores.len() == 1 {
        row(
            backend,
            "ping (one round trip), 1,000 sequential",
            &sequential(stores[0].clone(), Op::Ping).await,
        );
    }
    for (op, name) in [(Op::Budget, "reserve+settle"), (Op::Audit, "audit append")] {
        if stores.len() == 1 {
            row(
                backend,
                &format!("{name}, 1,000 sequential"),
                &sequential(stores[0].clone(), op).await,
            );
        }
        row(
            backend,
            &format!("{name}, 1,000 concurrent"),
            &concurrent(&stores, op).await,
        );
    }
    row(
        backend,
        "reserve+settle, 1,000 concurrent over 100 sessions",
        &concurrent(&stores, Op::BudgetSpread).await,
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    println!("| backend | operation | median µs | p99 µs | wall ms | ops/s |");
    println!("|---|---|---|---|---|---|");
    bench("memory", vec![Arc::new(MemoryStore::default())]).await;

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.db");
    let sqlite = || async {
        Arc::new(
            SqliteStore::open(&path, SqliteOptions::default(), Clock::system())
                .await
                .expect("sqlite"),
        ) as Arc<dyn StateStore>
    };
    bench("sqlite", vec![sqlite().await]).await;
    bench("sqlite x2", vec![sqlite().await, sqlite().await]).await;

    match std::env::var("CODEMODE_TEST_POSTGRES_URL") {
        Ok(url) => {
            let schema = format!("bench_{}", std::process::id());
            let pg = || async {
                let options = PostgresOptions {
                    schema: Some(schema.clone()),
                    ..PostgresOptions::default()
                };
                Arc::new(
                    PostgresStore::open(&url, options, Clock::system())
                        .await
                        .expect("postgres"),
                ) as Arc<dyn StateStore>
            };
            bench("postgres", vec![pg().await]).await;
            bench("postgres x2", vec![pg().await, pg().await]).await;
        }
        Err(_) => eprintln!(
            "postgres: skipped, CODEMODE_TEST_POSTGRES_URL is not set (use scripts/with-postgres)"
        ),
    }
}
