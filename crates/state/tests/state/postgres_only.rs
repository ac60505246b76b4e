//! What only PostgreSQL has: replicas starting at once, a server that is unreachable or
//! read-only, connections cut under the store, and notifications across replicas.

use std::sync::Arc;
use std::time::Duration;

use codemode_state::{
    Amounts, Answer, Clock, Decision, Durability, LedgerKey, Limits, NewApproval, PostgresOptions,
    PostgresStore, ReserveOutcome, ReserveRequest, StateError, StateStore, Topic,
};
use futures::future::join_all;
use serde_json::json;

use crate::harness::{fresh_schema, postgres_url, test_postgres_options};
use crate::suite::{assert_chain, line_maker};

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
    assert_eq!(
        versions,
        [1, 2, 3, 4, 5],
        "each migration applied exactly once"
    );

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
            paths: Vec::new(),
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
    a.open_session("s", None).await.unwrap();
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
        match a.touch_session("s").await {
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

/// A database that version 1 made (before the round-trip-saving functions) is upgraded in place
/// by the next replica that opens it, and works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_database_upgrades_in_place() {
    let Some(url) = postgres_url() else { return };
    let schema = fresh_schema();
    let a = open(&url, &schema).await.unwrap();
    a.append_audit("main", line_maker("before".into()))
        .await
        .unwrap();
    drop(a);
    // Back to version 1: its functions only, and its version row only.
    admin(&url)
        .await
        .batch_execute(&format!(
            "SET search_path = {schema};
             DROP FUNCTION codemode_append_audit(text, bigint, text, text[], text[], bigint[]);
             DROP FUNCTION codemode_reserve(text, text[], bigint[], bigint[], bigint, bigint, boolean);
             DROP FUNCTION codemode_finish_hold(text, text[], bigint[], bigint, bigint, boolean);
             DROP FUNCTION codemode_lease_take(text, text[], bigint[], bigint[], bigint, text[], text[], bigint[], bigint[], bigint, bigint, bigint, text, bigint);
             DROP FUNCTION codemode_lease_sync(text, text[], text[], bigint[], bigint[], bigint, bigint);
             DROP FUNCTION codemode_fold_lease(text, text, text, bigint[], bigint[], bigint);
             DROP TABLE budget_leases;
             DROP INDEX sessions_ended;
             ALTER TABLE sessions DROP COLUMN ended_at_ms;
             ALTER TABLE approvals DROP COLUMN paths;
             DELETE FROM codemode_schema_versions WHERE version > 1;"
        ))
        .await
        .unwrap();
    let b = open(&url, &schema).await.unwrap();
    let rows = admin(&url)
        .await
        .query(
            &format!("SELECT version FROM {schema}.codemode_schema_versions ORDER BY version"),
            &[],
        )
        .await
        .unwrap();
    let versions: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(versions, [1, 2, 3, 4, 5]);
    let ReserveOutcome::Granted(r) = b.reserve(one_call("s", 5)).await.unwrap() else {
        panic!("refused")
    };
    b.settle(&r, calls(1)).await.unwrap();
    b.append_audit("main", line_maker("after".into()))
        .await
        .unwrap();
    let lines = b.read_audit("main", 0, 100).await.unwrap();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1].prev.as_deref(), Some(lines[0].hash.as_str()));
}

fn calls(n: u64) -> Amounts {
    Amounts {
        calls: n,
        ..Amounts::default()
    }
}

fn one_call(session: &str, limit: u64) -> ReserveRequest {
    ReserveRequest {
        ledgers: vec![(
            LedgerKey::session(session),
            Limits {
                calls: Some(limit),
                ..Limits::default()
            },
        )],
        amounts: calls(1),
        hold_for: Duration::from_secs(600),
    }
}

/// Appends race from three stores at once, one of which always takes the head's lock (the
/// path a replica that keeps losing the optimistic race falls back to), with closures that
/// refuse mixed in, and stores taking turns on a head the other just moved: one chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimistic_and_locked_appends_race_into_one_chain() {
    let Some(url) = postgres_url() else { return };
    let schema = fresh_schema();
    let a = Arc::new(open(&url, &schema).await.unwrap());
    let b = Arc::new(open(&url, &schema).await.unwrap());
    let locked_options = PostgresOptions {
        audit_optimistic_tries: 0,
        ..test_postgres_options(&schema)
    };
    let c = Arc::new(
        PostgresStore::open(&url, locked_options, Clock::system())
            .await
            .unwrap(),
    );
    // Taking turns: each store's idea of the head is stale every time.
    for i in 0..6 {
        let s = [&a, &b, &c][i % 3];
        s.append_audit("turns", line_maker(format!("turn {i}")))
            .await
            .unwrap();
    }
    assert_chain(&a.read_audit("turns", 0, 100).await.unwrap(), 6);

    let stores = [a.clone(), b.clone(), c.clone()];
    let tasks: Vec<_> = (0..600)
        .map(|i| {
            let s = stores[i % 3].clone();
            tokio::spawn(async move {
                if i % 10 == 7 {
                    let e = s
                        .append_audit("race", Box::new(|_| Err("no key".into())))
                        .await
                        .unwrap_err();
                    assert!(matches!(e, StateError::AuditLine { .. }), "{e:?}");
                    None
                } else {
                    Some(
                        s.append_audit("race", line_maker(format!("line {i}")))
                            .await
                            .unwrap(),
                    )
                }
            })
        })
        .collect();
    let written: Vec<_> = join_all(tasks)
        .await
        .into_iter()
        .filter_map(|r| r.unwrap())
        .collect();
    assert_eq!(written.len(), 540);
    let lines = b.read_audit("race", 0, 10_000).await.unwrap();
    assert_chain(&lines, 540);
    // What each append returned is what was stored at that position.
    for r in &written {
        assert_eq!(&lines[(r.seq - 1) as usize], r);
    }
    let head = c.audit_head("race").await.unwrap();
    assert_eq!(head.seq, 540);
}

/// A caller that stops waiting right after handing over its line does not lose it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_whose_caller_stopped_waiting_is_still_written() {
    let Some(url) = postgres_url() else { return };
    let schema = fresh_schema();
    let a = open(&url, &schema).await.unwrap();
    // Polled once, then dropped. On a loaded machine the writer (another task) may already have
    // finished the round trip by then; either way the line must be stored, once.
    let _ = tokio::time::timeout(
        Duration::ZERO,
        a.append_audit("main", line_maker("dropped".into())),
    )
    .await;
    a.append_audit("main", line_maker("next".into()))
        .await
        .unwrap();
    let lines = a.read_audit("main", 0, 100).await.unwrap();
    let texts: Vec<&str> = lines.iter().map(|l| l.line.as_str()).collect();
    assert_eq!(texts, ["dropped", "next"]);
    assert_chain(&lines, 2);
}

/// A reservation commits without waiting for the disk, so a server crash may lose it; the
/// settle then finds no hold. That is accepted only when the server started after the
/// reservation was made: otherwise a missing hold was settled or released already, and a
/// second settle must not charge twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_hold_is_charged_only_after_a_server_restart() {
    let Some(url) = postgres_url() else { return };
    let schema = fresh_schema();
    let a = open(&url, &schema).await.unwrap();
    let admin = admin(&url).await;
    // A server started less than a second before a reservation counts as restarted since.
    let up_ms: f64 = admin
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp() - pg_postmaster_start_time()) * 1000)::float8",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    if up_ms < 2000.0 {
        tokio::time::sleep(Duration::from_millis((2000.0 - up_ms) as u64)).await;
    }
    let ReserveOutcome::Granted(r) = a.reserve(one_call("lost", 5)).await.unwrap() else {
        panic!("refused")
    };
    // As if lost: the hold and what it reserved are gone, the server did not restart.
    admin
        .batch_execute(&format!(
            "DELETE FROM {schema}.budget_holds WHERE id = '{}';
             UPDATE {schema}.budget_ledgers SET reserved_calls = 0;",
            r.id
        ))
        .await
        .unwrap();
    let e = a.settle(&r, calls(1)).await.unwrap_err();
    assert!(matches!(e, StateError::UnknownReservation { .. }), "{e:?}");
    assert!(a.release(&r).await.is_err());
    let ledger = a.get_ledger(&LedgerKey::session("lost")).await.unwrap();
    assert_eq!((ledger.used.calls, ledger.reserved.calls), (0, 0));

    // A reservation older than the server's start: lost in the restart, so charged anyway.
    let age_ms: i64 = admin
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp() - pg_postmaster_start_time()) * 1000)::bigint + 60000",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // The functions call each other by name, so they run in the schema's search path.
    admin
        .batch_execute(&format!("SET search_path = {schema}"))
        .await
        .unwrap();
    let key: String = admin
        .query_one(&format!("SELECT key FROM {schema}.budget_ledgers"), &[])
        .await
        .unwrap()
        .get(0);
    admin
        .execute(
            &format!(
                "SELECT * FROM {schema}.codemode_finish_hold($1, ARRAY[$2], ARRAY[1,0,0,0,0]::bigint[], 0, $3, true)"
            ),
            &[&r.id, &key, &age_ms],
        )
        .await
        .expect("a hold lost in a restart settles");
    let ledger = a.get_ledger(&LedgerKey::session("lost")).await.unwrap();
    assert_eq!((ledger.used.calls, ledger.reserved.calls), (1, 0));
    // Releasing such a hold gives nothing back and does not fail.
    admin
        .execute(
            &format!(
                "SELECT * FROM {schema}.codemode_finish_hold($1, ARRAY[$2], NULL, 0, $3, false)"
            ),
            &[&r.id, &key, &age_ms],
        )
        .await
        .expect("a hold lost in a restart releases");
    let ledger = a.get_ledger(&LedgerKey::session("lost")).await.unwrap();
    assert_eq!((ledger.used.calls, ledger.reserved.calls), (1, 0));
}

const CHILD_SCHEMA: &str = "CODEMODE_STATE_PG_CHILD_SCHEMA";

/// Not a test on its own: a replica process for the test below. It opens the schema, says
/// `ready`, waits for a line on stdin, appends 200 lines at once and says `done`.
#[test]
#[ignore = "run by the other tests as a separate process"]
fn pg_child_process() {
    let (Some(url), Ok(schema)) = (postgres_url(), std::env::var(CHILD_SCHEMA)) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let store = Arc::new(open(&url, &schema).await.unwrap());
        println!("CHILD: ready");
        let mut go = String::new();
        std::io::stdin().read_line(&mut go).unwrap();
        let pid = std::process::id();
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let s = store.clone();
                tokio::spawn(async move {
                    s.append_audit("procs", line_maker(format!("{pid}-{i}")))
                        .await
                })
            })
            .collect();
        for t in join_all(tasks).await {
            t.unwrap().unwrap();
        }
        println!("CHILD: done");
    });
}

/// Three replica processes (each its own pool, writer and idea of the head) append at once
/// to one stream: one chain, every line once, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_appending_at_once_make_one_chain() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    let Some(url) = postgres_url() else { return };
    let schema = fresh_schema();
    let store = open(&url, &schema).await.unwrap();
    store
        .append_audit("procs", line_maker("first".into()))
        .await
        .unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut kids: Vec<_> = (0..3)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "postgres_only::pg_child_process",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_SCHEMA, &schema)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut outs: Vec<_> = kids
        .iter_mut()
        .map(|k| BufReader::new(k.stdout.take().unwrap()).lines())
        .collect();
    let said = |out: &mut std::io::Lines<BufReader<std::process::ChildStdout>>, what: &str| {
        let found = out.any(|l| l.unwrap().contains(&format!("CHILD: {what}")));
        assert!(found, "a child did not say {what}");
    };
    for out in &mut outs {
        said(out, "ready");
    }
    for k in &mut kids {
        writeln!(k.stdin.as_mut().unwrap(), "go").unwrap();
    }
    for out in &mut outs {
        said(out, "done");
    }
    for mut k in kids {
        assert!(k.wait().unwrap().success());
    }
    let lines = store.read_audit("procs", 0, 10_000).await.unwrap();
    assert_chain(&lines, 601);
}

/// A closure that panics fails its own append (and only it) with an error instead of hanging
/// it, and the stream goes on: an append right behind it, or batched with it, is written.
/// Repeated, because the append right behind once raced the writer's hand-over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_line_maker_fails_its_append_and_the_stream_goes_on() {
    let Some(url) = postgres_url() else { return };
    let schema = fresh_schema();
    let a = std::sync::Arc::new(open(&url, &schema).await.unwrap());
    a.append_audit("main", line_maker("one".into()))
        .await
        .unwrap();
    let rounds = 30;
    for i in 0..rounds {
        let beside = {
            let a = a.clone();
            tokio::spawn(async move {
                a.append_audit("main", line_maker(format!("beside {i}")))
                    .await
            })
        };
        let e = a
            .append_audit("main", Box::new(|_| panic!("a line maker that panics")))
            .await
            .unwrap_err();
        assert!(matches!(e, StateError::AuditLine { .. }), "{e:?}");
        a.append_audit("main", line_maker(format!("behind {i}")))
            .await
            .unwrap();
        beside.await.unwrap().unwrap();
    }
    let lines = a.read_audit("main", 0, 1000).await.unwrap();
    assert_chain(&lines, 1 + 2 * rounds);
}

/// Lines appended `Deferred` chain and read back like durable ones, in one batch with them too.
/// If committed lines vanish behind a writer's back (a crashed server loses commits not yet on
/// its disk; here they are deleted, with the head moved back, as such a crash leaves them), the
/// writer finds the head behind its own last line and fails instead of chaining on as if the
/// log were whole. Another replica, which wrote none of them, cannot tell and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_lines_chain_and_lost_lines_stop_their_writer() {
    let Some(url) = postgres_url() else { return };
    let schema = fresh_schema();
    let a = open(&url, &schema).await.unwrap();
    let b = open(&url, &schema).await.unwrap();
    let appends = ["one", "two", "three", "four"].map(|text| {
        let durability = if text == "four" {
            Durability::Now
        } else {
            Durability::Deferred
        };
        a.append_audit_with("main", line_maker(text.into()), durability)
    });
    for r in join_all(appends).await {
        r.unwrap();
    }
    let lines = a.read_audit("main", 0, 100).await.unwrap();
    assert_chain(&lines, 4);

    let db = admin(&url).await;
    db.batch_execute(&format!(
        "DELETE FROM {schema}.audit_lines WHERE stream = 'main' AND seq > 2;
         UPDATE {schema}.audit_heads SET seq = 2, hash = (SELECT hash FROM {schema}.audit_lines WHERE stream = 'main' AND seq = 2) WHERE stream = 'main';"
    ))
    .await
    .unwrap();

    let e = a
        .append_audit_with("main", line_maker("five".into()), Durability::Deferred)
        .await
        .expect_err("the writer must notice that its lines are gone");
    let message = e.to_string();
    assert!(
        message.contains("ends at line 2") && message.contains("wrote line 4"),
        "{message}"
    );
    let lines = a.read_audit("main", 0, 100).await.unwrap();
    assert_eq!(
        lines.len(),
        2,
        "nothing was chained onto the shortened stream"
    );

    b.append_audit("main", line_maker("from b".into()))
        .await
        .unwrap();
    assert_chain(&b.read_audit("main", 0, 100).await.unwrap(), 3);
}
