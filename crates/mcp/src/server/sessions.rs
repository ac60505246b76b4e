//! The HTTP sessions' table: which session ids are alive, when each was last used, and the
//! `initialize` parameters that let a session come back on a new connection.
//!
//! A session has two lives. Its *connection* (rmcp's session worker: tasks, channels, the
//! handler) is closed after `worker_idle` without a request, which returns its memory. The
//! *session* itself (its id, the client's `initialize` parameters and its `store()` values) is
//! kept for `idle_timeout` after its last request: a request with its id in that time brings
//! the connection back transparently (rmcp's session store), with the same store. After that,
//! or after a `DELETE`, the id is unknown (HTTP 404, the client starts a new session).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use codemode_runtime::Codemode;
use codemode_state::{StateError, StateStore, StoreChange};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{
    SessionId, SessionManager, SessionState, SessionStore, SessionStoreError,
};

pub(crate) struct Sessions {
    table: Mutex<HashMap<String, Record>>,
    /// Room made but not yet filled or freed; locked only after `table`, never before.
    reserved: Mutex<Reserved>,
    codemode: Codemode,
    manager: Arc<LocalSessionManager>,
    idle_timeout: Duration,
    worker_idle: Duration,
    max: usize,
    /// Replicas share sessions through this store: a session begun on one replica is known to
    /// every other (its `initialize` parameters are kept there).
    shared: Option<Arc<dyn StateStore>>,
    /// Sessions ended by any path (`DELETE`, eviction, expiry) since the sweeper last gave
    /// memory back.
    ended: std::sync::atomic::AtomicUsize,
}

/// What `make_room` promised and has not settled, so that requests racing it count it: without
/// this, fifty `initialize`s at once all saw the same table, and one token went far past its
/// share and the table past its maximum.
#[derive(Default)]
struct Reserved {
    /// Sessions being begun (room made for them, not yet claimed), by who asked.
    opening: HashMap<Owner, usize>,
    /// Sessions being ended to make room: counted as gone, never chosen twice.
    evicting: HashSet<String>,
}

/// Room made for one new session of `owner`; given back when dropped, once the session was
/// claimed (it is then in the table under its owner) or was not made.
pub(crate) struct Opening {
    sessions: Arc<Sessions>,
    owner: Owner,
}

impl Drop for Opening {
    fn drop(&mut self) {
        let mut reserved = self.sessions.reserved();
        if let Some(n) = reserved.opening.get_mut(&self.owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                reserved.opening.remove(&self.owner);
            }
        }
    }
}

/// A session being ended to make room; no longer so once dropped.
struct Evicting {
    sessions: Arc<Sessions>,
    id: String,
}

impl Drop for Evicting {
    fn drop(&mut self) {
        self.sessions.reserved().evicting.remove(&self.id);
    }
}

/// How long a replica trusts its own table that a session it serves was not ended on another
/// replica before it asks the shared store again: a session ended anywhere is refused
/// everywhere within this, at one read per session and interval.
const ENDED_ELSEWHERE_RECHECK: Duration = Duration::from_secs(1);

/// The pseudo-session under which a session's `initialize` parameters are kept in the shared
/// store, apart from the session's own `store()` values (which scripts read).
fn shared_key(id: &str) -> String {
    format!("mcp-initialize:{id}")
}

struct Record {
    init: Option<SessionState>,
    last_active: Instant,
    /// Requests being answered now (a script may run longer than any idle limit).
    in_flight: usize,
    /// Who began it; `None` until the request that began it is answered, or for a session
    /// begun on another replica until its owner is read from the shared store.
    owner: Option<Owner>,
    /// When this replica last told the shared store the session is in use.
    shared_touch: Option<Instant>,
    /// When this replica last found the session's row in the shared store.
    shared_checked: Option<Instant>,
    /// Turns to hand a request to the transport, which decodes it: a session's requests take
    /// turns past [`DECODING_PER_SESSION`] at once, so one client cannot make the process
    /// decode hundreds of bodies together.
    decoding: Arc<tokio::sync::Semaphore>,
}

/// Requests of one session the transport decodes at once.
pub(crate) const DECODING_PER_SESSION: usize = 8;

impl Record {
    fn new(init: Option<SessionState>) -> Self {
        Record {
            init,
            last_active: Instant::now(),
            in_flight: 0,
            owner: None,
            shared_touch: None,
            shared_checked: None,
            decoding: Arc::new(tokio::sync::Semaphore::new(DECODING_PER_SESSION)),
        }
    }
}

/// Who may use a session: the holder of the token that began it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Owner {
    /// No tokens are configured: whoever reaches the listener (loopback only).
    Anyone,
    /// The holder of `--token`, which names nobody.
    Unnamed,
    /// The holder of a named token.
    Named(String),
}

impl Owner {
    /// How the shared store records it: the principal's name, or nothing.
    pub(crate) fn stored(&self) -> Option<&str> {
        match self {
            Owner::Named(name) => Some(name),
            Owner::Anyone | Owner::Unnamed => None,
        }
    }
}

/// Why a new session was refused.
pub(crate) enum Full {
    /// Every session is answering a request.
    Busy,
    /// The one asking holds half of the table already.
    YourShare { held: usize, max: usize },
}

impl Sessions {
    pub(crate) fn new(
        codemode: Codemode,
        manager: Arc<LocalSessionManager>,
        idle_timeout: Duration,
        max: usize,
    ) -> Arc<Self> {
        Arc::new(Sessions {
            table: Mutex::new(HashMap::new()),
            reserved: Mutex::new(Reserved::default()),
            ended: std::sync::atomic::AtomicUsize::new(0),
            codemode,
            manager,
            idle_timeout,
            // Connections are freed well before the session is forgotten, so an idle client
            // costs a few hundred bytes, not a worker.
            worker_idle: (idle_timeout / 2).min(Duration::from_secs(30 * 60)),
            max,
            shared: None,
        })
    }

    /// Shares sessions with the other replicas through `store`.
    pub(crate) fn with_shared(
        mut self: Arc<Self>,
        store: Option<Arc<dyn StateStore>>,
    ) -> Arc<Self> {
        if let Some(this) = Arc::get_mut(&mut self) {
            this.shared = store;
        }
        self
    }

    /// Whether `id` is a live session here, or one another replica began (then it is taken
    /// into this replica's table, and rmcp replays its `initialize` from the store).
    pub(crate) async fn is_known_anywhere(&self, id: &str) -> bool {
        if self.is_known(id) {
            return true;
        }
        match self.load_shared(id).await {
            Some(init) => {
                let mut table = self.lock();
                if table.len() >= self.max && !table.contains_key(id) {
                    return false;
                }
                table
                    .entry(id.to_string())
                    .or_insert_with(|| Record::new(Some(init)));
                true
            }
            None => false,
        }
    }

    async fn load_shared(&self, id: &str) -> Option<SessionState> {
        let store = self.shared.as_ref()?;
        match store.load_store(&shared_key(id)).await {
            Ok(values) => values
                .get("initialize")
                .and_then(|v| serde_json::from_value(v.clone()).ok()),
            Err(e) => {
                tracing::warn!(session = %id, "reading a shared session failed: {e}");
                None
            }
        }
    }

    async fn save_shared(&self, id: &str, state: &SessionState) {
        let Some(store) = &self.shared else { return };
        let Ok(value) = serde_json::to_value(state) else {
            return;
        };
        let change = [StoreChange::Set {
            key: "initialize".into(),
            value,
        }];
        if let Err(e) = store.apply_store(&shared_key(id), &change).await {
            tracing::warn!(session = %id, "sharing a session with the other replicas failed: {e}");
        }
    }

    /// A client ended the session (`DELETE`): no replica continues it.
    pub(crate) async fn end_everywhere(&self, id: &str) {
        // First its cells, on every replica: none of their calls starts after the answer.
        if let Some(cells) = self.codemode.cells() {
            cells
                .end_session_everywhere(id, "its client ended it with HTTP DELETE")
                .await;
        }
        self.end(id).await;
        if let Some(store) = &self.shared
            && let Err(e) = store.delete_session(&shared_key(id)).await
        {
            tracing::warn!(session = %id, "ending a shared session failed: {e}");
        }
    }

    /// Whether `id`, a session this replica serves, was ended on another one (a `DELETE` or its
    /// idle end there deleted its row in the shared store); then it is ended here too, its cells
    /// here stopped. Without this, a replica that had served the session went on answering it
    /// from its own table after the client ended it elsewhere.
    pub(crate) async fn ended_elsewhere(&self, id: &str) -> Result<bool, StateError> {
        let Some(store) = &self.shared else {
            return Ok(false);
        };
        {
            let mut table = self.lock();
            let Some(record) = table.get_mut(id) else {
                return Ok(false);
            };
            // Not claimed yet: its row is being made by the request that began it.
            if record.owner.is_none()
                || record
                    .shared_checked
                    .is_some_and(|t| t.elapsed() < ENDED_ELSEWHERE_RECHECK)
            {
                return Ok(false);
            }
            record.shared_checked = Some(Instant::now());
        }
        if store.get_session(id).await?.is_some() {
            return Ok(false);
        }
        tracing::info!(session = %id, "the MCP session was ended on another replica; ending it here");
        if let Some(cells) = self.codemode.cells() {
            cells.terminate_session(id);
        }
        self.end(id).await;
        Ok(true)
    }

    /// Notes that `id`'s row was just found in the shared store, so
    /// [`Sessions::ended_elsewhere`] need not read it again within its interval.
    pub(crate) fn found_in_store(&self, id: &str) {
        if let Some(record) = self.lock().get_mut(id) {
            record.shared_checked = Some(Instant::now());
        }
    }

    /// Tells the other replicas that `id` is in use (its row's `last_seen`), at most every
    /// quarter of the idle limit, so that none ends it as idle while it is used here. The touch
    /// never makes the row again: were it gone (the session ended on another replica, maybe
    /// at this very moment), the session is ended here too and `true` returned.
    pub(crate) async fn keep_alive_shared(&self, id: &str) -> bool {
        let Some(store) = &self.shared else {
            return false;
        };
        {
            let mut table = self.lock();
            let Some(record) = table.get_mut(id) else {
                return false;
            };
            if record
                .shared_touch
                .is_some_and(|t| t.elapsed() < self.idle_timeout / 4)
            {
                return false;
            }
            record.shared_touch = Some(Instant::now());
        }
        match store.touch_session(id).await {
            Ok(_) => false,
            Err(StateError::SessionEnded { .. }) => {
                tracing::info!(session = %id, "the MCP session was ended on another replica; ending it here");
                if let Some(cells) = self.codemode.cells() {
                    cells.terminate_session(id);
                }
                self.end(id).await;
                true
            }
            Err(e) => {
                tracing::warn!(session = %id, "telling the other replicas a session is in use failed: {e}");
                false
            }
        }
    }

    /// Whether another replica used `id` within the idle limit (the shared row says when);
    /// then its local entry counts as used then too.
    async fn used_elsewhere(&self, id: &str) -> bool {
        let Some(store) = &self.shared else {
            return false;
        };
        let last_seen = match store.get_session(id).await {
            Ok(Some(record)) => record.last_seen_ms,
            Ok(None) => return false,
            // Unknown: keep it for now rather than delete a session in use.
            Err(e) => {
                tracing::warn!(session = %id, "reading a shared session failed: {e}");
                return true;
            }
        };
        let now_ms = codemode_state::Clock::system().now_ms();
        let age = Duration::from_millis(now_ms.saturating_sub(last_seen).max(0) as u64);
        if age >= self.idle_timeout {
            return false;
        }
        if let Some(record) = self.lock().get_mut(id) {
            record.last_active = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        }
        true
    }

    /// Forgets a session found to have ended elsewhere (its row in the shared store is gone):
    /// the local entry `is_known_anywhere` made for it, and its `initialize` parameters, so
    /// its id stays unknown.
    pub(crate) async fn forget_ended(&self, id: &str) {
        {
            let mut table = self.lock();
            if table
                .get(id)
                .is_some_and(|r| r.owner.is_none() && r.in_flight == 0)
            {
                table.remove(id);
            }
        }
        if let Some(store) = &self.shared
            && let Err(e) = store.delete_session(&shared_key(id)).await
        {
            tracing::warn!(session = %id, "forgetting an ended shared session failed: {e}");
        }
    }

    pub(crate) fn is_known(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// A request for `id` begins; the returned guard ends it.
    pub(crate) fn begin(self: &Arc<Self>, id: &str) -> Option<InFlight> {
        let mut table = self.lock();
        let record = table.get_mut(id)?;
        record.last_active = Instant::now();
        record.in_flight += 1;
        Some(InFlight {
            sessions: self.clone(),
            id: id.to_string(),
            decoding: record.decoding.clone(),
        })
    }

    /// Who began the session, once known here.
    pub(crate) fn owner_of(&self, id: &str) -> Option<Owner> {
        self.lock().get(id).and_then(|r| r.owner.clone())
    }

    /// Records who began the session (nothing when it has ended meanwhile).
    pub(crate) fn set_owner(&self, id: &str, owner: Owner) {
        if let Some(r) = self.lock().get_mut(id) {
            r.owner = Some(owner);
        }
    }

    /// Room for one more session, for `asking` (whoever asks for it). When the table is full,
    /// ends the longest-idle session of whoever holds the most, so that one person opening
    /// many sessions ends their own, never another's; when all of theirs are busy (answering a
    /// request, or running a cell here), nobody's is ended and the new session is refused. An
    /// ended session's cells on other replicas are ended with it. Where tokens tell people apart, one holding
    /// half of the table already ends one of their own idle sessions for a new one, or is
    /// refused: sessions held busy (a long `wait`) cannot lock others out.
    pub(crate) async fn make_room(self: &Arc<Self>, asking: &Owner) -> Result<Opening, Full> {
        // A session with a cell running here is in use: its client may come back to `wait`.
        let with_cells = self
            .codemode
            .cells()
            .map(|c| c.sessions_with_live_cells())
            .unwrap_or_default();
        let opening = Opening {
            sessions: self.clone(),
            owner: asking.clone(),
        };
        let victim = {
            let table = self.lock();
            let mut reserved = self.reserved();
            let mut held: HashMap<Option<Owner>, usize> = HashMap::new();
            for (id, r) in table.iter() {
                if !reserved.evicting.contains(id) {
                    *held.entry(r.owner.clone()).or_default() += 1;
                }
            }
            for (owner, n) in &reserved.opening {
                *held.entry(Some(owner.clone())).or_default() += n;
            }
            let leaving = reserved
                .evicting
                .iter()
                .filter(|id| table.contains_key(*id))
                .count();
            let live = table.len() - leaving + reserved.opening.values().sum::<usize>();
            let mine = held.get(&Some(asking.clone())).copied().unwrap_or(0);
            let at_share = *asking != Owner::Anyone && self.max >= 2 && mine >= self.max / 2;
            // Counted from here on, by every request that races this one.
            *reserved.opening.entry(asking.clone()).or_default() += 1;
            if !at_share && live < self.max {
                return Ok(opening);
            }
            *held.entry(Some(asking.clone())).or_default() += 1;
            let most = held.values().copied().max().unwrap_or(0);
            let candidates = table.iter().filter(|(id, r)| {
                r.in_flight == 0 && !with_cells.contains(*id) && !reserved.evicting.contains(*id)
            });
            let victim = match at_share {
                true => candidates
                    .filter(|(_, r)| r.owner.as_ref() == Some(asking))
                    .max_by_key(|(_, r)| std::cmp::Reverse(r.last_active)),
                false => candidates
                    .filter(|(_, r)| held.get(&r.owner).copied() == Some(most))
                    .max_by_key(|(_, r)| std::cmp::Reverse(r.last_active)),
            };
            let victim = victim.map(|(id, _)| id.clone());
            if let Some(id) = &victim {
                reserved.evicting.insert(id.clone());
            }
            match (victim, at_share) {
                (Some(id), _) => Some(id),
                (None, true) => {
                    return Err(Full::YourShare {
                        held: mine,
                        max: self.max,
                    });
                }
                (None, false) => None,
            }
        };
        // Counted as gone until it is, even if this request is dropped meanwhile.
        let _evicting = victim.as_ref().map(|id| Evicting {
            sessions: self.clone(),
            id: id.clone(),
        });
        match victim {
            Some(id) => {
                tracing::info!(session = %id, "too many MCP sessions: ending the longest idle one");
                // Its cells on other replicas would run on, unreachable.
                if let Some(cells) = self.codemode.cells() {
                    cells
                        .end_session_everywhere(
                            &id,
                            "the server's session table was full and it was the longest idle",
                        )
                        .await;
                }
                self.end(&id).await;
                Ok(opening)
            }
            None => Err(Full::Busy),
        }
    }

    fn reserved(&self) -> std::sync::MutexGuard<'_, Reserved> {
        self.reserved.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends a session for good: its connection, its store, its approvals and what the gate
    /// keeps for it (its principal and counters, kept until a call or cell of it still running
    /// here ends).
    pub(crate) async fn end(&self, id: &str) {
        if self.lock().remove(id).is_some() {
            self.ended
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.codemode.end_session(id);
        self.close_connection(&SessionId::from(id.to_string()))
            .await;
    }

    /// Closes a session's connection to rmcp's worker, waiting a bounded time: a worker stuck
    /// sending to a client that stopped reading its stream never takes the close, and waiting
    /// for it froze every later sweep, so no session expired for anyone.
    async fn close_connection(&self, id: &SessionId) {
        let closing = self.manager.close_session(id);
        if tokio::time::timeout(CLOSE_WAIT, closing).await.is_err() {
            tracing::warn!(session = %id, "an MCP session's worker did not take its close in time (its client stopped reading); it was dropped");
        }
    }

    /// Closes idle connections and forgets sessions idle past the timeout. Returns how many
    /// connections or sessions it ended.
    pub(crate) async fn sweep(&self) -> usize {
        let now = Instant::now();
        let (expired, idle): (Vec<String>, Vec<String>) = {
            let table = self.lock();
            let expired = table
                .iter()
                .filter(|(_, r)| r.in_flight == 0 && now - r.last_active >= self.idle_timeout)
                .map(|(id, _)| id.clone())
                .collect();
            let idle = table
                .iter()
                .filter(|(_, r)| r.in_flight == 0 && now - r.last_active >= self.worker_idle)
                .map(|(id, _)| id.clone())
                .collect();
            (expired, idle)
        };
        for id in &expired {
            // Idle here is not idle everywhere: a replica its client moved to keeps it alive.
            if self.used_elsewhere(id).await {
                continue;
            }
            tracing::debug!(session = %id, "MCP session expired");
            // Nobody can reach its cells any more, here or on another replica.
            if let Some(cells) = self.codemode.cells() {
                cells
                    .end_session_everywhere(
                        id,
                        "no request came for longer than the session idle limit",
                    )
                    .await;
            }
            self.end(id).await;
        }
        // Every session ended since the last sweep counts, whoever ended it.
        let mut ended = self.ended.swap(0, std::sync::atomic::Ordering::Relaxed);
        let live = self.manager.sessions.read().await;
        let to_close: Vec<SessionId> = idle
            .iter()
            .filter(|id| !expired.contains(id))
            .map(|id| SessionId::from(id.clone()))
            .filter(|id| live.contains_key(id))
            .collect();
        drop(live);
        for id in to_close {
            tracing::debug!(session = %id, "closing an idle MCP connection; the session stays");
            self.close_connection(&id).await;
            ended += 1;
        }
        ended
    }

    /// How often [`Sessions::sweep`] should run.
    pub(crate) fn sweep_every(&self) -> Duration {
        (self.worker_idle / 4).clamp(Duration::from_millis(200), Duration::from_secs(30))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Record>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One request being answered; dropping it marks the session used now.
pub(crate) struct InFlight {
    sessions: Arc<Sessions>,
    id: String,
    decoding: Arc<tokio::sync::Semaphore>,
}

impl InFlight {
    /// Waits for the session's turn to hand a request to the transport.
    pub(crate) async fn decoding_turn(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.decoding.clone().acquire_owned().await.ok()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(r) = self.sessions.lock().get_mut(&self.id) {
            r.in_flight = r.in_flight.saturating_sub(1);
            r.last_active = Instant::now();
        }
    }
}

/// rmcp's hook for sessions that come back: the table is the store.
pub(crate) struct Store(pub(crate) Arc<Sessions>);

#[async_trait::async_trait]
impl SessionStore for Store {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let local = self.0.lock().get(session_id).and_then(|r| r.init.clone());
        match local {
            Some(init) => Ok(Some(init)),
            None => Ok(self.0.load_shared(session_id).await),
        }
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        {
            let mut table = self.0.lock();
            let record = table
                .entry(session_id.to_string())
                .or_insert_with(|| Record::new(None));
            record.init = Some(state.clone());
        }
        self.0.save_shared(session_id, state).await;
        Ok(())
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        self.0.lock().remove(session_id);
        self.0.codemode.end_session(session_id);
        Ok(())
    }
}

/// How long closing one session's connection may take before the sweep goes on without it.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
