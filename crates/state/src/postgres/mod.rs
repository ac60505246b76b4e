//! The PostgreSQL backend: state shared by several `codemode serve` replicas.
//!
//! A pool of connections (`deadpool-postgres`) runs the operations; one more connection per
//! store `LISTEN`s for the changes other replicas announce with `pg_notify` inside their
//! transactions (delivered only if they commit), and reconnects by itself if it drops, while
//! watches fall back to polling. Migrations are embedded and applied at open under an advisory
//! lock, so replicas that start together apply each one once.
//!
//! Connections are plain TCP or a Unix socket: TLS (`sslmode=require`) is not supported yet.

mod audit_writer;
mod lease;
mod ops;
mod pipelined;

pub use lease::LeaseOptions;

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::Value;
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::approval::{Answer, ApprovalQuery, ApprovalRecord, NewApproval};
use crate::audit::{self, AuditHead, AuditLineFn, AuditRecord, Durability};
use crate::budget::{
    Amounts, LedgerKey, LedgerSnapshot, Reservation, ReserveOutcome, ReserveRequest, SettleOutcome,
};
use crate::cell::{CellRecord, CellUpdate, NewCell, ReplayEntry};
use crate::clock::Clock;
use crate::error::{Result, StateError};
use crate::schema;
use crate::session::{self, SessionRecord, StoreChange};
use crate::store::StateStore;
use crate::url::redact;
use crate::validate::check_id;
use crate::watch::{Notifier, Topic, Watch};
use ops::OpError;

/// How to connect to PostgreSQL.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// Connections in the pool (each replica has its own pool).
    pub pool_size: usize,
    /// Keep the tables in this schema (created if missing) instead of the search path's
    /// default; lower-case letters, digits and `_`. Lets several deployments share a database.
    pub schema: Option<String>,
    /// Used when the URL sets no `connect_timeout`.
    pub connect_timeout: Duration,
    /// How long an operation waits for a free pooled connection.
    pub wait_timeout: Duration,
    /// How often a [`Watch`] looks again even without a notification (a safety net for
    /// notifications lost while the listening connection reconnects).
    pub poll_interval: Duration,
    /// How many times a batch of audit lines is sent on the head this replica last saw before
    /// it takes the stream head's lock instead (0: always lock first, two round trips a batch).
    pub audit_optimistic_tries: usize,
    /// Budget leases ([`LeaseOptions`]): calls are charged against part of a ledger this
    /// store holds, without a statement each. `None`: every call is reserved and settled in
    /// the database.
    pub budget_leases: Option<LeaseOptions>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            pool_size: 16,
            schema: None,
            connect_timeout: Duration::from_secs(10),
            wait_timeout: Duration::from_secs(30),
            poll_interval: Duration::from_secs(2),
            audit_optimistic_tries: 3,
            budget_leases: Some(LeaseOptions::default()),
        }
    }
}

pub struct PostgresStore {
    pool: Pool,
    location: String,
    channel: String,
    clock: Clock,
    notifier: Notifier,
    listener: tokio::task::JoinHandle<()>,
    /// Ledger rows known to exist (they are never deleted), so charging skips creating them.
    known_ledgers: std::sync::Mutex<std::collections::HashSet<String>>,
    audit: std::sync::Arc<audit_writer::AuditWriter>,
    leases: Option<std::sync::Arc<lease::Leases>>,
    /// Reports spending and renews or returns leases in the background.
    tender: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.listener.abort();
        // Without `close`, leases still held expire and count as spent (fail closed).
        if let Some(t) = &self.tender {
            t.abort();
        }
    }
}

fn pg_error(location: &str, e: &tokio_postgres::Error) -> StateError {
    let location = location.to_string();
    if let Some(db) = e.as_db_error() {
        let detail = format!("{} ({})", db.message(), db.code().code());
        let code = db.code();
        return if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
            StateError::ReadOnly { location, detail }
        } else if *code == SqlState::DATA_CORRUPTED || *code == SqlState::INDEX_CORRUPTED {
            StateError::Corrupt { location, detail }
        } else if *code == SqlState::INVALID_PASSWORD
            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            || *code == SqlState::INVALID_CATALOG_NAME
            || *code == SqlState::INSUFFICIENT_PRIVILEGE
            || *code == SqlState::TOO_MANY_CONNECTIONS
            || *code == SqlState::ADMIN_SHUTDOWN
            || *code == SqlState::CANNOT_CONNECT_NOW
        {
            StateError::Unavailable { location, detail }
        } else {
            StateError::Backend { location, detail }
        };
    }
    let detail = match std::error::Error::source(e) {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
    };
    StateError::Unavailable { location, detail }
}

fn pool_error(location: &str, e: PoolError) -> StateError {
    match e {
        PoolError::Backend(e) => pg_error(location, &e),
        PoolError::Timeout(_) => StateError::Unavailable {
            location: location.to_string(),
            detail: "no pooled connection became free in time (the pool is too small for the load, or the server is slow)".into(),
        },
        other => StateError::Unavailable {
            location: location.to_string(),
            detail: other.to_string(),
        },
    }
}

fn check_schema(schema: &str) -> Result<()> {
    let ok = !schema.is_empty()
        && schema.len() <= 40
        && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(StateError::invalid(
            "PostgreSQL schema name",
            format!(
                "`{schema}` must be 1 to 40 lower-case letters, digits or `_`, not starting with a digit"
            ),
        ))
    }
}

/// Runs `$body` (an `ops` call on `$tx`) in a transaction and commits it; evaluates to
/// `Result<T, OpError>`.
macro_rules! try_in_tx {
    ($self:ident, $tx:ident => $body:expr) => {
        async {
            let mut client = $self
                .pool
                .get()
                .await
                .map_err(|e| OpError::State(pool_error(&$self.location, e)))?;
            let $tx = client.transaction().await?;
            let out = $body.await?;
            $tx.commit().await?;
            Ok::<_, OpError>(out)
        }
        .await
    };
}

/// [`try_in_tx`], with errors mapped and returned (`?`).
macro_rules! in_tx {
    ($self:ident, $tx:ident => $body:expr) => {
        try_in_tx!($self, $tx => $body).map_err(|e| $self.op_err(e))?
    };
}

/// A budget operation (`$body`, a `pipelined` call on the pooled `$client`) on `$keys`'
/// ledgers: their rows are created first if this store has not seen them, and once more if
/// one went missing since.
macro_rules! on_ledgers {
    ($self:ident, $keys:expr, $client:ident => $body:expr) => {{
        $self.ensure_ledgers($keys).await?;
        let $client = $self.client().await?;
        match $body.await {
            Err(OpError::MissingLedgers) => {
                $self.forget_ledgers();
                $self.ensure_ledgers($keys).await?;
                let $client = $self.client().await?;
                $body.await.map_err(|e| $self.op_err(e))?
            }
            other => other.map_err(|e| $self.op_err(e))?,
        }
    }};
}

/// Runs a read (`$body` on `$c`) on a pooled connection, outside any transaction.
macro_rules! read {
    ($self:ident, $c:ident => $body:expr) => {{
        let $c = $self.client().await?;
        $body.await.map_err(|e| $self.op_err(e))?
    }};
}

impl PostgresStore {
    /// Connects, applies missing migrations and starts listening for other replicas' changes.
    pub async fn open(url: &str, options: PostgresOptions, clock: Clock) -> Result<Self> {
        let mut location = redact(url);
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| StateError::Invalid {
            what: "PostgreSQL URL",
            problem: format!("{e} in `{location}`"),
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.connect_timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("codemode");
        }
        let schema = match &options.schema {
            Some(s) => {
                check_schema(s)?;
                let given = config.get_options().unwrap_or("").to_string();
                config.options(format!("{given} -c search_path={s}").trim());
                location = format!("{location} (schema {s})");
                s.clone()
            }
            None => "public".to_string(),
        };
        // The statements and the budget functions' statements all find rows by key. With
        // `auto`, PostgreSQL planned them anew on every call (their array parameters make the
        // generic plan look costlier than it is): about 0.3 ms per function call, measured.
        let given = config.get_options().unwrap_or("").to_string();
        if !given.contains("plan_cache_mode") {
            config.options(format!("{given} -c plan_cache_mode=force_generic_plan").trim());
        }
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.wait_timeout))
            .create_timeout(Some(options.connect_timeout))
            .build()
            .map_err(|e| StateError::Backend {
                location: location.clone(),
                detail: format!("cannot build the connection pool: {e}"),
            })?;
        let channel = format!("codemode_state_{schema}");
        let notifier = Notifier::new(Some(options.poll_interval));
        let audit = std::sync::Arc::new(audit_writer::AuditWriter::new(
            pool.clone(),
            location.clone(),
            options.audit_optimistic_tries,
        ));
        let leases = options
            .budget_leases
            .clone()
            .map(|o| std::sync::Arc::new(lease::Leases::new(o)));
        let tender = leases.as_ref().map(|l| {
            let (l, pool, clock) = (l.clone(), pool.clone(), clock.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(l.tick()).await;
                    if let Err(e) = l
                        .report(&pool, lease::Due::Timer, None, clock.now_ms())
                        .await
                    {
                        tracing::warn!("reporting budget leases failed (they will expire and count as spent): {e}");
                    }
                }
            })
        });
        let mut store = PostgresStore {
            pool,
            audit,
            leases,
            tender,
            location,
            channel,
            clock,
            notifier,
            listener: tokio::spawn(async {}),
            known_ledgers: Default::default(),
        };
        store.migrate(options.schema.as_deref()).await?;
        store.listener = store.listen(config, options.connect_timeout).await?;
        Ok(store)
    }

    async fn client(&self) -> Result<deadpool_postgres::Client> {
        self.pool
            .get()
            .await
            .map_err(|e| pool_error(&self.location, e))
    }

    fn pg_err(&self, e: &tokio_postgres::Error) -> StateError {
        pg_error(&self.location, e)
    }

    fn op_err(&self, e: OpError) -> StateError {
        match e {
            OpError::Pg(e) => self.pg_err(&e),
            OpError::MissingLedgers => StateError::Backend {
                location: self.location.clone(),
                detail: "a budget ledger's row disappeared while it was being charged".into(),
            },
            OpError::State(StateError::Corrupt { location, detail }) if location.is_empty() => {
                StateError::Corrupt {
                    location: self.location.clone(),
                    detail,
                }
            }
            OpError::State(e) => e,
        }
    }

    async fn migrate(&self, schema: Option<&str>) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.pg_err(&e))?;
        let lock_name = format!("codemode state migrations {}", schema.unwrap_or(""));
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            &[&lock_name],
        )
        .await
        .map_err(|e| self.pg_err(&e))?;
        if let Some(s) = schema {
            tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {s}"))
                .await
                .map_err(|e| self.pg_err(&e))?;
        }
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS codemode_schema_versions (
                 version       BIGINT PRIMARY KEY,
                 applied_at_ms BIGINT NOT NULL
             )",
        )
        .await
        .map_err(|e| self.pg_err(&e))?;
        let row = tx
            .query_one(
                "SELECT coalesce(max(version), 0) FROM codemode_schema_versions",
                &[],
            )
            .await
            .map_err(|e| self.pg_err(&e))?;
        let current: i64 = row.try_get(0).map_err(|e| self.pg_err(&e))?;
        if current > schema::latest() {
            return Err(StateError::TooNew {
                location: self.location.clone(),
                found: current,
                known: schema::latest(),
            });
        }
        for (v, sql) in schema::postgres() {
            if v > current {
                tx.batch_execute(&sql).await.map_err(|e| self.pg_err(&e))?;
                tx.execute(
                    "INSERT INTO codemode_schema_versions (version, applied_at_ms) VALUES ($1, $2)",
                    &[&v, &self.clock.now_ms()],
                )
                .await
                .map_err(|e| self.pg_err(&e))?;
            }
        }
        tx.commit().await.map_err(|e| self.pg_err(&e))
    }

    /// Starts the task that `LISTEN`s on a connection of its own and turns other replicas'
    /// notifications into local wakes. Returns once the first `LISTEN` is in place.
    async fn listen(
        &self,
        config: tokio_postgres::Config,
        timeout: Duration,
    ) -> Result<tokio::task::JoinHandle<()>> {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<Result<(), String>>();
        let notifier = self.notifier.clone();
        let channel = self.channel.clone();
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            loop {
                let outcome = listen_once(&config, &channel, &notifier, &mut ready).await;
                if let Some(r) = ready.take() {
                    let _ = r.send(outcome.map_err(|e| e.to_string()));
                    // open() failed; nobody will use this store.
                    return;
                }
                if let Err(e) = outcome {
                    tracing::warn!("state listener: {e}; reconnecting in 1 s");
                }
                // Changes missed while disconnected are caught by the watches' polling.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let location = self.location.clone();
        match tokio::time::timeout(timeout, ready_rx).await {
            Ok(Ok(Ok(()))) => Ok(task),
            Ok(Ok(Err(detail))) => {
                task.abort();
                Err(StateError::Unavailable {
                    location,
                    detail: format!("cannot listen for changes: {detail}"),
                })
            }
            Ok(Err(_)) | Err(_) => {
                task.abort();
                Err(StateError::Unavailable {
                    location,
                    detail: "the connection that listens for changes did not come up in time"
                        .into(),
                })
            }
        }
    }

    async fn ensure_ledgers(&self, keys: &[String]) -> Result<()> {
        let missing: Vec<String> = {
            let known = self.known_ledgers.lock().unwrap_or_else(|e| e.into_inner());
            keys.iter()
                .filter(|k| !known.contains(*k))
                .cloned()
                .collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        let c = self.client().await?;
        ops::create_ledgers(&c, &missing)
            .await
            .map_err(|e| self.op_err(e))?;
        let mut known = self.known_ledgers.lock().unwrap_or_else(|e| e.into_inner());
        if known.len() > 100_000 {
            known.clear();
        }
        known.extend(missing);
        Ok(())
    }

    fn forget_ledgers(&self) {
        self.known_ledgers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    fn own_leases(&self, ticket: &crate::budget::LeaseTicket) -> Option<&lease::Leases> {
        self.leases.as_deref().filter(|l| l.owner == ticket.owner)
    }

    /// Grants `request` from this store's leases, taking new ones when they have no room.
    /// `None`: leases could not serve it; reserve it on its own.
    async fn reserve_leased(
        &self,
        leases: &lease::Leases,
        request: &ReserveRequest,
        now: i64,
    ) -> Result<Option<ReserveOutcome>> {
        let keys: Vec<String> = request.sorted().into_iter().map(|(k, _, _)| k).collect();
        for _ in 0..3 {
            if let Some(r) = leases.try_grant(request, now) {
                return Ok(Some(ReserveOutcome::Granted(r)));
            }
            let one = leases.claim(&keys).await;
            let now = self.clock.now_ms();
            if let Some(r) = leases.try_grant(request, now) {
                return Ok(Some(ReserveOutcome::Granted(r)));
            }
            let snap = leases.snapshot(&keys);
            let hold_id = uuid::Uuid::new_v4().simple().to_string();
            let taken = async {
                Ok::<_, StateError>(
                    on_ledgers!(self, &keys, c => leases.take(c, request, &snap, &hold_id, now)),
                )
            }
            .await;
            drop(one);
            match taken {
                Err(e) => {
                    leases.abandon(&keys);
                    return Err(e);
                }
                Ok((lease::Taken::Leased, _)) => continue,
                Ok((lease::Taken::Held, Some(r))) => {
                    return Ok(Some(ReserveOutcome::Granted(r)));
                }
                Ok((lease::Taken::Held, None)) => return Ok(None),
                Ok((lease::Taken::Refused(r), _)) => return Ok(Some(ReserveOutcome::Refused(r))),
            }
        }
        Ok(None)
    }

    /// Settles a call granted from a lease: in memory when this store holds the lease.
    async fn settle_leased(
        &self,
        reservation: &Reservation,
        ticket: &crate::budget::LeaseTicket,
        actual: Amounts,
    ) -> Result<SettleOutcome> {
        actual.validate("settled amounts")?;
        let now = self.clock.now_ms();
        let unavailable = |e: String| StateError::Unavailable {
            location: self.location.clone(),
            detail: format!("cannot charge a call granted from a budget lease: {e}"),
        };
        let used = match self.own_leases(ticket) {
            Some(leases) => {
                let beyond = leases.finish_local(reservation, ticket, Some(&actual), now)?;
                if beyond.is_empty() {
                    return Ok(SettleOutcome {
                        ledgers: Vec::new(),
                        overruns: Vec::new(),
                    });
                }
                leases
                    .report(&self.pool, lease::Due::Timer, Some(&beyond), now)
                    .await
                    .map_err(unavailable)?
            }
            None => {
                // Another store's lease: charge what was spent here; the count stays held in
                // that lease until it is returned (stricter, never looser).
                let leases = match &self.leases {
                    Some(l) => l.clone(),
                    None => std::sync::Arc::new(lease::Leases::new(LeaseOptions::default())),
                };
                leases
                    .charge_directly(&self.pool, reservation, &actual, now)
                    .await
                    .map_err(unavailable)?
            }
        };
        Ok(SettleOutcome {
            ledgers: Vec::new(),
            overruns: lease::overruns_of(reservation, &used),
        })
    }

    async fn finish_hold(
        &self,
        reservation: &Reservation,
        actual: Amounts,
        durable: bool,
    ) -> Result<SettleOutcome> {
        if let Some(ticket) = &reservation.lease {
            return self.settle_leased(reservation, ticket, actual).await;
        }
        actual.validate("settled amounts")?;
        let now = self.clock.now_ms();
        let settled = on_ledgers!(self, &reservation.sorted_keys(), c => pipelined::finish_hold(c, reservation, Some(&actual), now, durable));
        settled.ok_or_else(|| StateError::Backend {
            location: self.location.clone(),
            detail: "settling returned no outcome".into(),
        })
    }

    fn notify_local(&self, topic: Topic) {
        self.notifier.notify(topic);
    }
}

/// One listening connection, until it drops. Reports readiness once `LISTEN` succeeded.
async fn listen_once(
    config: &tokio_postgres::Config,
    channel: &str,
    notifier: &Notifier,
    ready: &mut Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
) -> std::result::Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(NoTls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(m) = messages.next().await {
            match m {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send(n.payload().to_string()).is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("state listener connection: {e}");
                    break;
                }
            }
        }
    });
    let listening = client.batch_execute(&format!("LISTEN \"{channel}\"")).await;
    if let Err(e) = listening {
        driver.abort();
        return Err(e);
    }
    if let Some(r) = ready.take() {
        let _ = r.send(Ok(()));
    }
    while let Some(payload) = rx.recv().await {
        if let Some(topic) = Topic::decode(&payload) {
            notifier.notify(topic);
        }
    }
    driver.abort();
    drop(client);
    Ok(())
}

impl StateStore for PostgresStore {
    fn describe(&self) -> String {
        self.location.clone()
    }

    fn close(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let Some(leases) = &self.leases else {
                return Ok(());
            };
            leases
                .report(&self.pool, lease::Due::ReturnAll, None, self.clock.now_ms())
                .await
                .map(|_| ())
                .map_err(|e| StateError::Unavailable {
                    location: self.location.clone(),
                    detail: format!(
                        "cannot return budget leases (they will expire and count as spent): {e}"
                    ),
                })
        })
    }

    fn ping(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let c = self.client().await?;
            c.batch_execute("SELECT 1")
                .await
                .map_err(|e| self.pg_err(&e))
        })
    }

    fn watch(&self, topic: Topic) -> Watch {
        self.notifier.watch(topic)
    }

    fn open_session<'a>(
        &'a self,
        id: &'a str,
        principal: Option<&'a str>,
    ) -> BoxFuture<'a, Result<SessionRecord>> {
        Box::pin(async move {
            check_id("session id", id)?;
            let now = self.clock.now_ms();
            Ok(in_tx!(self, tx => ops::open_session(&tx, id, principal, now)))
        })
    }

    fn touch_session<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<SessionRecord>> {
        Box::pin(async move {
            check_id("session id", id)?;
            let now = self.clock.now_ms();
            Ok(in_tx!(self, tx => ops::touch_session(&tx, id, now)))
        })
    }

    fn get_session<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<SessionRecord>>> {
        Box::pin(async move { Ok(read!(self, c => ops::get_session(&c, id))) })
    }

    fn delete_session<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move { Ok(in_tx!(self, tx => ops::delete_session(&tx, id))) })
    }

    fn load_store<'a>(
        &'a self,
        session: &'a str,
    ) -> BoxFuture<'a, Result<std::collections::BTreeMap<String, Value>>> {
        Box::pin(async move { Ok(read!(self, c => ops::load_store(&c, session))) })
    }

    fn apply_store<'a>(
        &'a self,
        session: &'a str,
        changes: &'a [StoreChange],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            session::validate_changes(session, changes)?;
            Ok(in_tx!(self, tx => ops::apply_store(&tx, session, changes)))
        })
    }

    fn create_cell(&self, cell: NewCell) -> BoxFuture<'_, Result<CellRecord>> {
        Box::pin(async move {
            cell.validate()?;
            let now = self.clock.now_ms();
            let topic = Topic::Cell(cell.id.clone());
            let channel = &self.channel;
            let c = in_tx!(self, tx => async {
                let c = ops::create_cell(&tx, cell, now).await?;
                ops::notify(&tx, channel, &topic).await?;
                Ok::<_, OpError>(c)
            });
            self.notify_local(topic);
            Ok(c)
        })
    }

    fn get_cell<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<CellRecord>>> {
        Box::pin(async move { Ok(read!(self, c => ops::get_cell(&c, id))) })
    }

    fn list_cells<'a>(&'a self, session: &'a str) -> BoxFuture<'a, Result<Vec<CellRecord>>> {
        Box::pin(async move { Ok(read!(self, c => ops::list_cells(&c, session))) })
    }

    fn claim_cell<'a>(
        &'a self,
        id: &'a str,
        replica: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<CellRecord>> {
        Box::pin(async move {
            check_id("replica id", replica)?;
            let now = self.clock.now_ms();
            let lease_ms = crate::budget::hold_ms(lease);
            let topic = Topic::Cell(id.to_string());
            let channel = &self.channel;
            let c = in_tx!(self, tx => async {
                let c = ops::claim_cell(&tx, id, replica, lease_ms, now).await?;
                ops::notify(&tx, channel, &topic).await?;
                Ok::<_, OpError>(c)
            });
            self.notify_local(topic);
            Ok(c)
        })
    }

    fn update_cell<'a>(
        &'a self,
        id: &'a str,
        replica: &'a str,
        update: CellUpdate,
    ) -> BoxFuture<'a, Result<CellRecord>> {
        Box::pin(async move {
            update.validate()?;
            let now = self.clock.now_ms();
            let topic = Topic::Cell(id.to_string());
            let channel = &self.channel;
            let c = in_tx!(self, tx => async {
                let c = ops::update_cell(&tx, id, replica, &update, now).await?;
                ops::notify(&tx, channel, &topic).await?;
                Ok::<_, OpError>(c)
            });
            self.notify_local(topic);
            Ok(c)
        })
    }

    fn claimable_cells(&self) -> BoxFuture<'_, Result<Vec<CellRecord>>> {
        Box::pin(async move {
            let now = self.clock.now_ms();
            Ok(read!(self, c => ops::claimable_cells(&c, now)))
        })
    }

    fn end_session_cells<'a>(
        &'a self,
        session: &'a str,
        except: &'a str,
        result: Value,
    ) -> BoxFuture<'a, Result<Vec<CellRecord>>> {
        Box::pin(async move {
            check_id("session id", session)?;
            let now = self.clock.now_ms();
            let channel = &self.channel;
            let ended = in_tx!(self, tx => async {
                let ended = ops::end_session_cells(&tx, session, except, &result, now).await?;
                for c in &ended {
                    ops::notify(&tx, channel, &Topic::Cell(c.id.clone())).await?;
                }
                Ok::<_, OpError>(ended)
            });
            for c in &ended {
                self.notify_local(Topic::Cell(c.id.clone()));
            }
            Ok(ended)
        })
    }

    fn prune_ended(&self, before_ms: i64) -> BoxFuture<'_, Result<u64>> {
        Box::pin(async move {
            let gone = read!(self, c => async {
                let cells = c
                    .execute(
                        "DELETE FROM cells WHERE status IN ('finished', 'failed', 'terminated') AND updated_at_ms < $1",
                        &[&before_ms],
                    )
                    .await
                    .map_err(OpError::Pg)?;
                let approvals = c
                    .execute(
                        "DELETE FROM approvals WHERE state <> 'pending' AND COALESCE(answered_at_ms, created_at_ms) < $1",
                        &[&before_ms],
                    )
                    .await
                    .map_err(OpError::Pg)?;
                Ok::<_, OpError>(cells + approvals)
            });
            Ok(gone)
        })
    }

    fn delete_cell<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let topic = Topic::Cell(id.to_string());
            let channel = &self.channel;
            let existed = in_tx!(self, tx => async {
                let existed = ops::delete_cell(&tx, id).await?;
                ops::notify(&tx, channel, &topic).await?;
                Ok::<_, OpError>(existed)
            });
            self.notify_local(topic);
            Ok(existed)
        })
    }

    fn append_replay<'a>(
        &'a self,
        cell: &'a str,
        replica: &'a str,
        entries: &'a [ReplayEntry],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(
            async move { Ok(in_tx!(self, tx => ops::append_replay(&tx, cell, replica, entries))) },
        )
    }

    fn read_replay<'a>(&'a self, cell: &'a str) -> BoxFuture<'a, Result<Vec<ReplayEntry>>> {
        Box::pin(async move { Ok(read!(self, c => ops::read_replay(&c, cell))) })
    }

    fn create_approval(&self, approval: NewApproval) -> BoxFuture<'_, Result<ApprovalRecord>> {
        Box::pin(async move {
            approval.validate()?;
            let id = uuid::Uuid::new_v4().simple().to_string();
            let now = self.clock.now_ms();
            let topic = Topic::Approval(id.clone());
            let channel = &self.channel;
            let a = in_tx!(self, tx => async {
                let a = ops::create_approval(&tx, approval, id, now).await?;
                ops::notify(&tx, channel, &topic).await?;
                Ok::<_, OpError>(a)
            });
            self.notify_local(topic);
            Ok(a)
        })
    }

    fn get_approval<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<ApprovalRecord>>> {
        Box::pin(async move { Ok(read!(self, c => ops::get_approval(&c, id))) })
    }

    fn list_approvals(&self, query: ApprovalQuery) -> BoxFuture<'_, Result<Vec<ApprovalRecord>>> {
        Box::pin(async move { Ok(read!(self, c => ops::list_approvals(&c, &query))) })
    }

    fn answer_approval<'a>(
        &'a self,
        id: &'a str,
        answer: Answer,
    ) -> BoxFuture<'a, Result<ApprovalRecord>> {
        Box::pin(async move {
            answer.validate()?;
            let now = self.clock.now_ms();
            let topic = Topic::Approval(id.to_string());
            let channel = &self.channel;
            let a = in_tx!(self, tx => async {
                let a = ops::answer_approval(&tx, id, &answer, now).await?;
                ops::notify(&tx, channel, &topic).await?;
                Ok::<_, OpError>(a)
            });
            self.notify_local(topic);
            Ok(a)
        })
    }

    fn expire_approvals(&self) -> BoxFuture<'_, Result<Vec<ApprovalRecord>>> {
        Box::pin(async move {
            let now = self.clock.now_ms();
            let channel = &self.channel;
            let expired = in_tx!(self, tx => async {
                let expired = ops::expire_approvals(&tx, now).await?;
                for a in &expired {
                    ops::notify(&tx, channel, &Topic::Approval(a.id.clone())).await?;
                }
                Ok::<_, OpError>(expired)
            });
            for a in &expired {
                self.notify_local(Topic::Approval(a.id.clone()));
            }
            Ok(expired)
        })
    }

    fn reserve(&self, request: ReserveRequest) -> BoxFuture<'_, Result<ReserveOutcome>> {
        Box::pin(async move {
            request.validate()?;
            let now = self.clock.now_ms();
            if let Some(leases) = &self.leases
                && leases.eligible(&request, now)
                && let Some(out) = self.reserve_leased(leases, &request, now).await?
            {
                return Ok(out);
            }
            let id = uuid::Uuid::new_v4().simple().to_string();
            let keys: Vec<String> = request.sorted().into_iter().map(|(k, _, _)| k).collect();
            Ok(on_ledgers!(self, &keys, c => pipelined::reserve(c, &request, id.clone(), now)))
        })
    }

    fn settle<'a>(
        &'a self,
        reservation: &'a Reservation,
        actual: Amounts,
    ) -> BoxFuture<'a, Result<SettleOutcome>> {
        Box::pin(self.finish_hold(reservation, actual, true))
    }

    fn settle_before_audit<'a>(
        &'a self,
        reservation: &'a Reservation,
        actual: Amounts,
    ) -> BoxFuture<'a, Result<SettleOutcome>> {
        Box::pin(self.finish_hold(reservation, actual, false))
    }

    fn release<'a>(&'a self, reservation: &'a Reservation) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let now = self.clock.now_ms();
            if let Some(ticket) = &reservation.lease {
                return match self.own_leases(ticket) {
                    Some(leases) => leases
                        .finish_local(reservation, ticket, None, now)
                        .map(|_| ()),
                    // Another store's lease holds it until that store returns the lease or it
                    // expires (and counts as spent): stricter, never looser.
                    None => Ok(()),
                };
            }
            // Without waiting for the disk: a release lost in a crash leaves the hold, which
            // only makes the budget stricter until it expires.
            on_ledgers!(self, &reservation.sorted_keys(), c => pipelined::finish_hold(c, reservation, None, now, false));
            Ok(())
        })
    }

    fn extend_hold<'a>(
        &'a self,
        reservation: &'a Reservation,
        hold_for: std::time::Duration,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let unknown = || StateError::UnknownReservation {
                id: reservation.id.clone(),
            };
            if let Some(ticket) = &reservation.lease {
                // A lease is renewed while calls granted from it are in flight.
                return match self.own_leases(ticket) {
                    Some(leases) if !leases.holds(&reservation.id) => Err(unknown()),
                    _ => Ok(()),
                };
            }
            let now = self.clock.now_ms();
            let until = now.saturating_add(crate::budget::hold_ms(hold_for));
            let changed = read!(self, c => async {
                c.execute(
                    "UPDATE budget_holds SET expires_at_ms = $2
                      WHERE id = $1 AND expired = 0 AND expires_at_ms > $3",
                    &[&reservation.id, &until, &now],
                )
                .await
                .map_err(OpError::Pg)
            });
            if changed == 0 {
                return Err(unknown());
            }
            Ok(())
        })
    }

    fn get_ledger<'a>(&'a self, key: &'a LedgerKey) -> BoxFuture<'a, Result<LedgerSnapshot>> {
        Box::pin(async move {
            key.validate()?;
            let now = self.clock.now_ms();
            // What this store's calls spent on it is reported first.
            if let Some(leases) = &self.leases {
                let k = [key.encode()];
                if let Err(e) = leases
                    .report(&self.pool, lease::Due::Timer, Some(&k), now)
                    .await
                {
                    return Err(StateError::Unavailable {
                        location: self.location.clone(),
                        detail: format!("cannot report budget leases: {e}"),
                    });
                }
            }
            Ok(on_ledgers!(self, &[key.encode()], c => pipelined::get_ledger(c, key, now)))
        })
    }

    fn append_audit<'a>(
        &'a self,
        stream: &'a str,
        make: AuditLineFn,
    ) -> BoxFuture<'a, Result<AuditRecord>> {
        self.append_audit_with(stream, make, Durability::Now)
    }

    fn append_audit_with<'a>(
        &'a self,
        stream: &'a str,
        make: AuditLineFn,
        durability: Durability,
    ) -> BoxFuture<'a, Result<AuditRecord>> {
        Box::pin(async move {
            audit::validate_stream(stream)?;
            let now = self.clock.now_ms();
            self.audit.append(stream, make, now, durability).await
        })
    }

    fn read_audit<'a>(
        &'a self,
        stream: &'a str,
        after_seq: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<AuditRecord>>> {
        Box::pin(async move { Ok(read!(self, c => ops::read_audit(&c, stream, after_seq, limit))) })
    }

    fn audit_head<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<AuditHead>> {
        Box::pin(async move { Ok(read!(self, c => ops::audit_head(&c, stream))) })
    }

    fn audit_streams(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(async move { Ok(read!(self, c => ops::audit_streams(&c))) })
    }
}
