//! What only PostgreSQL has: replicas starting at once, a server that is unreachable or
//! read-only, connections cut under the store, and notifications across replicas.

use std::time::Duration;

use codemode_state::{
    Answer, Clock, Decision, NewApproval, PostgresOptions, PostgresStore, StateError, StateStore,
    Topic,
};
use futures::future::join_all;
use serde_json::json;

use crate::harness::{fresh_schema, postgres_url, test_postgres_options};

async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("admin connection");
    tokio::spawn(conn);
    client
}

async fn open(url: &str, schema: &str) -> Result<PostgresStore, StateError> {
    PostgresStore::open(url, test_postgres_options(schema), Clock::system()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_migrate_once() {
    let Some(url) = postgres_url() else { return };
    let schema = fresh_schema();
    let opens = (0..6).map(|_| open(&url, &schema));
    let stores: Vec<_> = join_all(opens).await;
    for s in &stores {
        assert!(
            s.is_ok(),
            "a replica failed to start: {:?}",
            s.as_ref().err()
        );
    }
    let rows = admin(&url)
        .await
        .query(
            &format!("SELECT version FROM {schema}.codemode_schema_versions ORDER BY version"),
            &[],
        )
        .await
        .unwrap();
    let versions: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(versions, [1], "each migration applied exactly once");

    // A database a newer codemode migrated is refused, not misread.
    admin(&url)
        .await
        .execute(
            &format!("INSERT INTO {schema}.codemode_schema_versions VALUES (99, 0)"),
            &[],
        )
        .await
        .unwrap();
    let e = open(&url, &schema)
        .await
        .err()
        .expect("newer schema must not open");
    assert!(matches!(e, StateError::TooNew { found: 99, .. }), "{e:?}");
}

#[tokio::test]
async fn an_unreachable_server_is_a_clear_error_without_the_password() {
    // Needs no server: nothing listens on port 1.
    let url = "postgres://me:s3cret@127.0.0.1:1/codemode";
    let options = PostgresOptions {
        connect_timeout: Duration::from_secs(5),
        ..PostgresOptions::default()
    };
    let e = PostgresStore::open(url, options, Clock::system())
        .await
        .err()
        .expect("no server there");
    assert!(matches!(e, StateError::Unavailable { .. }), "{e:?}");
    let text = e.to_string();
    assert!(!text.contains("s3cret"), "{text}");
    assert!(text.contains("me:***@127.0.0.1:1"), "{text}");
    assert!(text.contains("check that"), "{text}");

    let bad_schema = PostgresOptions {
        schema: Some("Robert'); DROP TABLE x;--".into()),
        ..PostgresOptions::default()
    };
    let e = PostgresStore::open(url, bad_schema, Clock::system())
        .await
        .err()
        .expect("bad schema");
    assert!(matches!(e, StateError::Invalid { .. }), "{e:?}");
}

#[tokio::test]
async fn a_read_only_server_is_refused_at_start() {
    let Some(url) = postgres_url() else { return };
    let sep = if url.contains('?') { '&' } else { '?' };
    let read_only = format!("{url}{sep}options=-c%20default_transaction_read_only%3Don");
    let e = open(&read_only, &fresh_schema())
        .await
        .err()
        .expect("read-only must not open");
    assert!(matches!(e, StateError::ReadOnly { .. }), "{e:?}");
}

async fn backends(url: &str, query_like: &str) -> Vec<i32> {
    admin(url)
        .await
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'codemode' AND query LIKE $1",
            &[&query_like],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The listening connection is cut (a failover, an idle timeout): the store reconnects by
/// itself and the next answer on another replica still wakes the waiter, with polling off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_survive_a_cut_listener() {
    let Some(url) = postgres_url() else { return };
    let schema = fresh_schema();
    let no_polling = PostgresOptions {
        poll_interval: Duration::from_secs(3600),
        ..test_postgres_options(&schema)
    };
    let a = PostgresStore::open(&url, no_polling, Clock::system())
        .await
        .unwrap();
    let b = open(&url, &schema).await.unwrap();
    let listen = format!("LISTEN \"codemode_state_{schema}\"");
    let before = backends(&url, &listen).await;
    assert_eq!(before.len(), 2, "one listener per store");
    let admin = admin(&url).await;
    for pid in &before {
        admin
            .execute("SELECT pg_terminate_backend($1)", &[pid])
            .await
            .unwrap();
    }
    // Both listeners come back on new connections.
    let mut back = Vec::new();
    for _ in 0..200 {
        back = backends(&url, &listen).await;
        if back.len() == 2 && back.iter().all(|p| !before.contains(p)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        back.len() == 2 && back.iter().all(|p| !before.contains(p)),
        "listeners did not reconnect: {before:?} -> {back:?}"
    );

    let approval = a
        .create_approval(NewApproval {
            cell_id: None,
            session_id: "s".into(),
            tool: "write".into(),
            arguments: json!({"path": "/p/x"}),
            provenance: json!({}),
            policy_ids: vec![],
            reason: "r".into(),
            expires_in: Duration::from_secs(60),
        })
        .await
        .unwrap();
    let mut watch = a.watch(Topic::Approval(approval.id.clone()));
    b.answer_approval(
        &approval.id,
        Answer {
            decision: Decision::Approve,
            by: "bob".into(),
            channel: "cli".into(),
            call_hash: approval.call_hash.clone(),
        },
    )
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(20), watch.changed())
        .await
        .expect("the other replica's answer was not heard after the listener reconnected");
}

/// Every pooled connection is cut under the store: at most the operation that meets a dead
/// connection fails (as Unavailable, never as a wrong answer); the store then goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_recovers_from_cut_connections() {
    let Some(url) = postgres_url() else { return };
    let schema = fresh_schema();
    // Named apart, so that only this store's connections are cut (tests run in parallel).
    let sep = if url.contains('?') { '&' } else { '?' };
    let named = format!("{url}{sep}application_name={schema}");
    let a = open(&named, &schema).await.unwrap();
    a.touch_session("s", None).await.unwrap();
    let admin = admin(&url).await;
    let cut = admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE application_name = $1 AND query NOT LIKE 'LISTEN%'",
            &[&schema],
        )
        .await
        .unwrap();
    assert!(cut >= 1, "no pooled connection was found to cut");
    let mut failures = 0;
    let mut ok = false;
    for _ in 0..5 {
        match a.touch_session("s", None).await {
            Ok(s) => {
                assert_eq!(s.id, "s");
                ok = true;
                break;
            }
            Err(e) => {
                assert!(matches!(e, StateError::Unavailable { .. }), "{e:?}");
                failures += 1;
            }
        }
    }
    assert!(ok, "the store never recovered ({failures} failures)");
}
