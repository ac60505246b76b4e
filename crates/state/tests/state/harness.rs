//! Two store instances on one shared state, for each backend: two handles of one store in
//! memory, two connections (own threads) on one SQLite file, two pools on one PostgreSQL
//! schema. Both share a manual clock, so tests move time without sleeping.

use std::any::Any;
use std::io::Write;
use std::sync::{Arc, Once};
use std::time::Duration;

use codemode_state::{
    Clock, ManualClock, MemoryStore, PostgresOptions, PostgresStore, SqliteOptions, SqliteStore,
    StateStore,
};

pub const PG_URL_VAR: &str = "CODEMODE_TEST_POSTGRES_URL";
pub const START_MS: i64 = 1_800_000_000_000;

pub struct Env {
    pub name: &'static str,
    pub a: Arc<dyn StateStore>,
    pub b: Arc<dyn StateStore>,
    pub clock: ManualClock,
    _keep: Box<dyn Any + Send>,
}

/// The PostgreSQL URL, or `None` after saying once, on the real stderr (not captured by the
/// test harness), why PostgreSQL tests are skipped.
pub fn postgres_url() -> Option<String> {
    static SAY: Once = Once::new();
    match std::env::var(PG_URL_VAR) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            SAY.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: PostgreSQL state tests, because {PG_URL_VAR} is not set; run them with `scripts/with-postgres cargo test -p codemode-state`"
                );
            });
            None
        }
    }
}

/// Waits until the server has been up for more than the window in which a missing budget hold
/// counts as lost in a restart (`codemode_finish_hold`: server start less than the hold's age
/// plus 1 s ago). Inside it, settling twice charges again instead of failing, as it should
/// after a real restart, so tests that settle twice would pass or fail by when they ran.
pub async fn wait_past_restart_window(url: &str) {
    static PAST: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if PAST.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the test PostgreSQL server");
    let driver = tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT extract(epoch FROM now() - pg_postmaster_start_time())::float8",
            &[],
        )
        .await
        .expect("read the server's start time");
    let up: f64 = row.get(0);
    let window = 1.5;
    if up < window {
        tokio::time::sleep(Duration::from_secs_f64(window - up)).await;
    }
    driver.abort();
    PAST.store(true, std::sync::atomic::Ordering::Relaxed);
}

pub fn test_sqlite_options() -> SqliteOptions {
    SqliteOptions {
        busy_timeout: Duration::from_secs(60),
        poll_interval: Duration::from_millis(50),
        ..SqliteOptions::default()
    }
}

/// Options for a store in a fresh schema of its own (tests run in parallel).
pub fn test_postgres_options(schema: &str) -> PostgresOptions {
    PostgresOptions {
        pool_size: 8,
        schema: Some(schema.to_string()),
        poll_interval: Duration::from_secs(60),
        ..PostgresOptions::default()
    }
}

pub fn fresh_schema() -> String {
    format!(
        "cm_test_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..16]
    )
}

impl Env {
    pub async fn memory() -> Option<Env> {
        let (clock, handle) = Clock::manual(START_MS);
        let store: Arc<dyn StateStore> = Arc::new(MemoryStore::new(clock));
        Some(Env {
            name: "memory",
            a: store.clone(),
            b: store,
            clock: handle,
            _keep: Box::new(()),
        })
    }

    pub async fn sqlite() -> Option<Env> {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("state.db");
        let (clock, handle) = Clock::manual(START_MS);
        let a = SqliteStore::open(&path, test_sqlite_options(), clock.clone())
            .await
            .expect("open sqlite a");
        let b = SqliteStore::open(&path, test_sqlite_options(), clock)
            .await
            .expect("open sqlite b");
        Some(Env {
            name: "sqlite",
            a: Arc::new(a),
            b: Arc::new(b),
            clock: handle,
            _keep: Box::new(dir),
        })
    }

    pub async fn postgres() -> Option<Env> {
        let url = postgres_url()?;
        wait_past_restart_window(&url).await;
        let schema = fresh_schema();
        let (clock, handle) = Clock::manual(START_MS);
        let a = PostgresStore::open(&url, test_postgres_options(&schema), clock.clone())
            .await
            .expect("open postgres a");
        let b = PostgresStore::open(&url, test_postgres_options(&schema), clock)
            .await
            .expect("open postgres b");
        Some(Env {
            name: "postgres",
            a: Arc::new(a),
            b: Arc::new(b),
            clock: handle,
            _keep: Box::new(()),
        })
    }
}
