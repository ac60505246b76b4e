//! Races at a session's end between two replicas, fired many times with real concurrency:
//! replica a ends the session (its cells, then its row, as `serve` does) while replica b
//! starts a cell in it or marks it in use. Whatever the interleaving, the end must hold: no
//! cell of the session runs on after it, and the session does not come back.

use std::sync::Arc;
use std::time::Duration;

use codemode_state::{CellRecord, NewCell, StateError, StateStore};
use serde_json::json;

use crate::harness::Env;

const ROUNDS: usize = 150;

fn cell_of(id: &str, session: &str) -> NewCell {
    NewCell {
        id: id.into(),
        session_id: session.into(),
        source: "await sleep(1e9)".into(),
        source_hash: "h".into(),
        options: json!({}),
        owner: "replica-b".into(),
        lease: Duration::from_secs(30),
        max_live_per_session: Some(8),
    }
}

/// What replica a does when a session ends for good: its cells everywhere, then its row.
async fn end_session(store: Arc<dyn StateStore>, session: String) {
    let why = json!({"text": "its session ended", "isError": true, "reason": "session_ended"});
    store
        .end_session_cells(&session, "replica-a", why)
        .await
        .expect("ending the session's cells");
    store
        .delete_session(&session)
        .await
        .expect("deleting the session");
}

/// Replica b starts a cell in the session, as `start_cell` does: opens the session (first
/// sight, or marks it in use), then creates the cell. `None` when the store refused either.
async fn start_cell(
    store: Arc<dyn StateStore>,
    session: String,
    cell: String,
) -> Option<CellRecord> {
    store.open_session(&session, Some("alice")).await.ok()?;
    store.create_cell(cell_of(&cell, &session)).await.ok()
}

/// A cell b starts while a ends its session is either ended with it or refused: none is left
/// running, and the session stays ended.
pub async fn a_cell_started_as_its_session_ends_never_outlives_it(env: Env) {
    let mut escaped = Vec::new();
    for round in 0..ROUNDS {
        let session = format!("race1-{round}");
        let cell = format!("race1-cell-{round}");
        env.a.open_session(&session, Some("alice")).await.unwrap();
        let ending = tokio::spawn(end_session(env.a.clone(), session.clone()));
        let starting = tokio::spawn(start_cell(env.b.clone(), session.clone(), cell.clone()));
        ending.await.unwrap();
        let started = starting.await.unwrap();
        if started.is_some() {
            let stored = env.a.get_cell(&cell).await.unwrap().unwrap();
            if !stored.status.is_terminal() {
                escaped.push(format!("{cell} is {}", stored.status.as_str()));
            }
        }
        if env.b.get_session(&session).await.unwrap().is_some() {
            escaped.push(format!("session {session} came back"));
        }
    }
    assert!(
        escaped.is_empty(),
        "{} backend: in {ROUNDS} session ends raced by a cell start on the other replica, the end was escaped {} times: {escaped:?}",
        env.name,
        escaped.len()
    );
}

/// b marking the session in use while a deletes it never brings the session back.
pub async fn touching_a_session_as_it_is_deleted_never_revives_it(env: Env) {
    let mut revived = Vec::new();
    for round in 0..ROUNDS {
        let session = format!("race2-{round}");
        env.a.open_session(&session, Some("alice")).await.unwrap();
        let (a, b) = (env.a.clone(), env.b.clone());
        let id = session.clone();
        let deleting = tokio::spawn(async move { a.delete_session(&id).await });
        let id = session.clone();
        let touching = tokio::spawn(async move {
            let _ = b.touch_session(&id).await;
        });
        assert!(deleting.await.unwrap().unwrap(), "the session existed");
        touching.await.unwrap();
        if env.a.get_session(&session).await.unwrap().is_some() {
            revived.push(session);
        }
    }
    assert!(
        revived.is_empty(),
        "{} backend: {} of {ROUNDS} deleted sessions were brought back by a touch on the other replica: {revived:?}",
        env.name,
        revived.len()
    );
}

/// What the race tests rely on, one step at a time: an ended session refuses, with
/// `SessionEnded`, to be begun again, touched or given a cell, on either replica, even after
/// its row was deleted; a touch never makes a session; the mark is pruned in time.
pub async fn an_ended_session_refuses_to_come_back(env: Env) {
    env.a.open_session("s", Some("alice")).await.unwrap();
    env.b.touch_session("s").await.unwrap();
    let why = json!({"text": "ended", "isError": true});
    env.a
        .end_session_cells("s", "replica-a", why.clone())
        .await
        .unwrap();
    env.a.delete_session("s").await.unwrap();
    assert!(
        env.b.get_session("s").await.unwrap().is_none(),
        "{}",
        env.name
    );
    assert!(
        ended(env.b.open_session("s", Some("alice")).await),
        "{}",
        env.name
    );
    assert!(ended(env.b.touch_session("s").await), "{}", env.name);
    assert!(
        ended(env.b.create_cell(cell_of("late", "s")).await),
        "{}",
        env.name
    );
    assert!(env.a.get_cell("late").await.unwrap().is_none());

    // Never begun: a touch does not make it; a cell of it may be created (a session begun
    // without a row, as an embedder's), and it may be begun.
    assert!(ended(env.b.touch_session("fresh").await), "{}", env.name);
    assert!(env.a.get_session("fresh").await.unwrap().is_none());
    env.b.create_cell(cell_of("first", "fresh")).await.unwrap();
    env.b.open_session("fresh", None).await.unwrap();

    // Once older than it is kept, the mark goes with the next session's end.
    env.clock
        .advance(codemode_state::ENDED_SESSION_KEPT + Duration::from_secs(1));
    env.a
        .end_session_cells("other", "replica-a", why)
        .await
        .unwrap();
    env.b.open_session("s", None).await.unwrap();
}

fn ended<T>(r: Result<T, StateError>) -> bool {
    matches!(r, Err(StateError::SessionEnded { .. }))
}
