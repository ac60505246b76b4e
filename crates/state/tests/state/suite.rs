//! The behaviour every backend must have, run against memory, SQLite and PostgreSQL alike.
//! `env.a` and `env.b` are two instances on one state (two replicas, for SQLite and
//! PostgreSQL); the adversarial tests fire at both at once.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use codemode_state::{
    Amounts, Answer, ApprovalQuery, ApprovalState, AuditLine, CellStatus, CellUpdate, Counter,
    Decision, LedgerKey, Limits, NewApproval, NewCell, ReplayEntry, ReserveOutcome, ReserveRequest,
    StateError, StateStore, StoreChange, Topic, call_hash, call_hash_with_paths, utc_day,
};
use futures::future::join_all;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::harness::Env;

const MINUTE: Duration = Duration::from_secs(60);

fn new_cell(id: &str, session: &str, owner: &str) -> NewCell {
    NewCell {
        id: id.into(),
        session_id: session.into(),
        source: "return 1".into(),
        source_hash: "h1".into(),
        options: json!({"yield_after_ms": 1000, "b": 1, "a": 2}),
        owner: owner.into(),
        lease: Duration::from_secs(30),
        max_live_per_session: None,
    }
}

fn new_approval(session: &str, cell: Option<&str>) -> NewApproval {
    NewApproval {
        cell_id: cell.map(str::to_string),
        session_id: session.into(),
        tool: "bash".into(),
        arguments: json!({"command": "rm -rf build", "cwd": "/p"}),
        provenance: json!({"session_id": session, "script_id": cell, "depth": 1}),
        paths: Vec::new(),
        policy_ids: vec!["ask-bash".into()],
        reason: "bash needs approval".into(),
        expires_in: MINUTE,
    }
}

fn answer(decision: Decision, by: &str, hash: &str) -> Answer {
    Answer {
        decision,
        by: by.into(),
        channel: "cli".into(),
        call_hash: hash.into(),
    }
}

fn calls(n: u64) -> Amounts {
    Amounts {
        calls: n,
        ..Amounts::default()
    }
}

fn max_calls(n: u64) -> Limits {
    Limits {
        calls: Some(n),
        ..Limits::default()
    }
}

fn reserve_req(ledgers: Vec<(LedgerKey, Limits)>) -> ReserveRequest {
    ReserveRequest {
        ledgers,
        amounts: calls(1),
        hold_for: MINUTE,
    }
}

pub fn line_maker(text: String) -> codemode_state::AuditLineFn {
    Box::new(move |head| {
        let prev = head.hash.clone().unwrap_or_else(|| "0".repeat(64));
        let hash = hex::encode(Sha256::digest(format!("{prev}\n{text}").as_bytes()));
        Ok(AuditLine {
            line: text.clone(),
            hash,
        })
    })
}

// --- sessions -----------------------------------------------------------------------------

pub async fn sessions_and_store(env: Env) {
    let s = env.a.open_session("s1", Some("alice")).await.unwrap();
    assert_eq!(s.principal.as_deref(), Some("alice"));
    env.clock.advance(Duration::from_secs(5));
    // Seen again on the other replica, by a caller claiming another principal: the first
    // principal stays, so the caller can notice the mismatch.
    let s2 = env.b.open_session("s1", Some("mallory")).await.unwrap();
    assert_eq!(s2.principal.as_deref(), Some("alice"));
    assert_eq!(s2.created_at_ms, s.created_at_ms);
    assert_eq!(s2.last_seen_ms, s.last_seen_ms + 5_000);

    let changes = vec![
        StoreChange::Set {
            key: "a".into(),
            value: json!({"z": 1, "y": [1, 2]}),
        },
        StoreChange::Set {
            key: "b".into(),
            value: json!("x"),
        },
        StoreChange::Delete { key: "b".into() },
        StoreChange::Set {
            key: "ünï".into(),
            value: json!("nul \u{0} inside a string is fine"),
        },
    ];
    env.a.apply_store("s1", &changes).await.unwrap();
    // Written on one replica, read on the other, keys' order inside values kept.
    let store = env.b.load_store("s1").await.unwrap();
    assert_eq!(store.len(), 2, "{store:?}");
    assert_eq!(
        serde_json::to_string(&store["a"]).unwrap(),
        r#"{"z":1,"y":[1,2]}"#
    );
    assert_eq!(store["ünï"], json!("nul \u{0} inside a string is fine"));
    assert!(env.b.load_store("other").await.unwrap().is_empty());

    // A batch with one bad key changes nothing.
    let bad = vec![
        StoreChange::Set {
            key: "c".into(),
            value: json!(1),
        },
        StoreChange::Set {
            key: "bad\0key".into(),
            value: json!(2),
        },
    ];
    let e = env.a.apply_store("s1", &bad).await.unwrap_err();
    assert!(
        matches!(
            e,
            StateError::Invalid {
                what: "store key",
                ..
            }
        ),
        "{e}"
    );
    assert!(!env.a.load_store("s1").await.unwrap().contains_key("c"));

    assert!(env.b.delete_session("s1").await.unwrap());
    assert!(env.a.get_session("s1").await.unwrap().is_none());
    assert!(env.a.load_store("s1").await.unwrap().is_empty());
    assert!(!env.a.delete_session("s1").await.unwrap());
}

/// The store's own limits hold whoever writes: a value over the per-value limit is refused,
/// and scripts of one session writing at once from both replicas, each batch fitting on its
/// own, never leave the session over its total (what a worker that skipped the script API's
/// checks, or cells running side by side, would otherwise do).
pub async fn store_limits_hold_under_concurrent_writers(env: Env) {
    use codemode_state::{MAX_STORE_TOTAL_CHARS, MAX_STORE_VALUE_CHARS};
    let big = |n: usize| json!("ü".repeat(n));
    let over = vec![StoreChange::Set {
        key: "k".into(),
        value: big(MAX_STORE_VALUE_CHARS),
    }];
    let e = env.a.apply_store("s", &over).await.unwrap_err();
    assert!(e.to_string().contains("one value may be at most"), "{e}");
    assert!(env.a.load_store("s").await.unwrap().is_empty());

    // 16 writers, 8 per replica, each adding 3 values of 100,000 characters (300,000 per batch,
    // within the total on its own): at most three batches fit.
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = if i % 2 == 0 {
            env.a.clone()
        } else {
            env.b.clone()
        };
        tasks.push(tokio::spawn(async move {
            let batch: Vec<StoreChange> = (0..3)
                .map(|j| StoreChange::Set {
                    key: format!("w{i}-{j}"),
                    value: big(100_000),
                })
                .collect();
            store.apply_store("s", &batch).await
        }));
    }
    let mut kept = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => kept += 1,
            Err(e) => assert!(e.to_string().contains("the most is 1048576"), "{e}"),
        }
    }
    let store = env.b.load_store("s").await.unwrap();
    let total: usize = store
        .iter()
        .map(|(k, v)| k.chars().count() + serde_json::to_string(v).unwrap().chars().count())
        .sum();
    assert!(total <= MAX_STORE_TOTAL_CHARS, "{total} characters kept");
    assert_eq!(kept, 3, "{} of 16 batches kept", kept);
    assert_eq!(store.len(), 9, "a refused batch keeps none of its values");

    // Replacing and deleting still work at the limit.
    let key = store.keys().next().unwrap().clone();
    let shrink = vec![StoreChange::Set {
        key: key.clone(),
        value: json!("small"),
    }];
    env.a.apply_store("s", &shrink).await.unwrap();
    let del = vec![StoreChange::Delete { key }];
    env.b.apply_store("s", &del).await.unwrap();
}

// --- cells --------------------------------------------------------------------------------

pub async fn cells_are_fenced_by_lease(env: Env) {
    let c = env
        .a
        .create_cell(new_cell("c1", "s1", "replica-a"))
        .await
        .unwrap();
    assert_eq!(c.status, CellStatus::Running);
    assert_eq!(c.owner.as_deref(), Some("replica-a"));
    let dup = env
        .b
        .create_cell(new_cell("c1", "s1", "replica-b"))
        .await
        .unwrap_err();
    assert!(matches!(dup, StateError::Duplicate { .. }), "{dup}");

    // The other replica may not take a cell under a live lease, nor write to it.
    let held = env
        .b
        .claim_cell("c1", "replica-b", MINUTE)
        .await
        .unwrap_err();
    assert!(
        matches!(held, StateError::CellHeld { ref owner, .. } if owner == "replica-a"),
        "{held}"
    );
    let wait = CellUpdate {
        status: CellStatus::WaitingForApproval,
        approval_id: Some("ap1".into()),
        result: None,
    };
    let e = env
        .b
        .update_cell("c1", "replica-b", wait.clone())
        .await
        .unwrap_err();
    assert!(matches!(e, StateError::NotCellOwner { .. }), "{e}");
    assert!(env.a.claimable_cells().await.unwrap().is_empty());

    let waiting = env.a.update_cell("c1", "replica-a", wait).await.unwrap();
    assert_eq!(waiting.status, CellStatus::WaitingForApproval);
    assert_eq!(waiting.approval_id.as_deref(), Some("ap1"));
    let got = env.b.get_cell("c1").await.unwrap().unwrap();
    assert_eq!(got, waiting);
    assert_eq!(
        serde_json::to_string(&got.options).unwrap(),
        r#"{"yield_after_ms":1000,"b":1,"a":2}"#
    );

    // Replica a dies: once its lease runs out, b picks the cell up and a is fenced off.
    env.clock.advance(Duration::from_secs(31));
    let claimable = env.b.claimable_cells().await.unwrap();
    assert_eq!(
        claimable.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        ["c1"]
    );
    let taken = env.b.claim_cell("c1", "replica-b", MINUTE).await.unwrap();
    assert_eq!(taken.owner.as_deref(), Some("replica-b"));
    let running = CellUpdate {
        status: CellStatus::Running,
        approval_id: None,
        result: None,
    };
    let e = env
        .a
        .update_cell("c1", "replica-a", running.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(e, StateError::NotCellOwner { owner: Some(ref o), .. } if o == "replica-b"),
        "{e}"
    );
    let e = env
        .a
        .append_replay(
            "c1",
            "replica-a",
            &[ReplayEntry {
                step: 1,
                entry: json!(1),
            }],
        )
        .await
        .unwrap_err();
    assert!(matches!(e, StateError::NotCellOwner { .. }), "{e}");
    // Renewing one's own lease is fine.
    env.b.claim_cell("c1", "replica-b", MINUTE).await.unwrap();

    env.b
        .append_replay(
            "c1",
            "replica-b",
            &[ReplayEntry {
                step: 1,
                entry: json!({"call": "ls"}),
            }],
        )
        .await
        .unwrap();
    let done = CellUpdate {
        status: CellStatus::Finished,
        approval_id: None,
        result: Some(json!({"ok": true})),
    };
    let finished = env.b.update_cell("c1", "replica-b", done).await.unwrap();
    assert_eq!(finished.owner, None);
    assert_eq!(finished.result, Some(json!({"ok": true})));
    assert!(
        env.a.read_replay("c1").await.unwrap().is_empty(),
        "replay log dropped at the end"
    );

    for e in [
        env.b
            .update_cell("c1", "replica-b", running)
            .await
            .unwrap_err(),
        env.a
            .claim_cell("c1", "replica-a", MINUTE)
            .await
            .unwrap_err(),
    ] {
        assert!(matches!(e, StateError::CellFinished { .. }), "{e}");
        assert!(e.to_string().contains("finished"), "{e}");
    }
    let e = env
        .a
        .claim_cell("nope", "replica-a", MINUTE)
        .await
        .unwrap_err();
    assert!(matches!(e, StateError::UnknownCell { .. }), "{e}");
    assert!(env.a.get_cell("nope").await.unwrap().is_none());

    // Inconsistent updates are refused before anything is written.
    env.a
        .create_cell(new_cell("c2", "s1", "replica-a"))
        .await
        .unwrap();
    let e = env
        .a
        .update_cell(
            "c2",
            "replica-a",
            CellUpdate {
                status: CellStatus::WaitingForApproval,
                approval_id: None,
                result: None,
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(e, StateError::Invalid { .. }), "{e}");
    let listed = env.b.list_cells("s1").await.unwrap();
    assert_eq!(
        listed.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        ["c1", "c2"]
    );
    assert!(env.b.delete_cell("c2").await.unwrap());
    assert!(!env.b.delete_cell("c2").await.unwrap());
}

/// A session ended on replica a ends its cells held elsewhere (b's, and a dead holder's),
/// never a's own, another session's or a cell that already ended; b is fenced off from them
/// at once, and nobody takes them over.
pub async fn a_session_end_ends_its_cells_held_elsewhere(env: Env) {
    for (id, session, owner) in [
        ("mine", "s1", "replica-a"),
        ("theirs", "s1", "replica-b"),
        ("orphan", "s1", "replica-dead"),
        ("other", "s2", "replica-b"),
        ("over", "s1", "replica-b"),
    ] {
        env.a
            .create_cell(new_cell(id, session, owner))
            .await
            .unwrap();
    }
    let done = CellUpdate {
        status: CellStatus::Finished,
        approval_id: None,
        result: Some(json!("done")),
    };
    env.b.update_cell("over", "replica-b", done).await.unwrap();
    let step = |n: u64| ReplayEntry {
        step: n,
        entry: json!({"call": n}),
    };
    env.b
        .append_replay("theirs", "replica-b", &[step(1)])
        .await
        .unwrap();
    env.clock.advance(Duration::from_secs(10));
    let mut watch = env.b.watch(Topic::Cell("theirs".into()));

    let why = json!({"text": "its session ended", "isError": true});
    let ended = env
        .a
        .end_session_cells("s1", "replica-a", why.clone())
        .await
        .unwrap();
    // As they were before (oldest first, then by id): who held them.
    let seen: Vec<(&str, Option<&str>, CellStatus)> = ended
        .iter()
        .map(|c| (c.id.as_str(), c.owner.as_deref(), c.status))
        .collect();
    assert_eq!(
        seen,
        [
            ("orphan", Some("replica-dead"), CellStatus::Running),
            ("theirs", Some("replica-b"), CellStatus::Running),
        ],
        "{}",
        env.name
    );
    for id in ["theirs", "orphan"] {
        let c = env.b.get_cell(id).await.unwrap().unwrap();
        assert_eq!(c.status, CellStatus::Terminated, "{}: {c:?}", env.name);
        assert_eq!(c.owner, None);
        assert_eq!(c.result.as_ref(), Some(&why));
        assert!(env.b.read_replay(id).await.unwrap().is_empty());
    }
    for (id, status) in [
        ("mine", CellStatus::Running),
        ("other", CellStatus::Running),
        ("over", CellStatus::Finished),
    ] {
        let c = env.b.get_cell(id).await.unwrap().unwrap();
        assert_eq!(c.status, status, "{}: {c:?}", env.name);
    }
    tokio::time::timeout(Duration::from_secs(20), watch.changed())
        .await
        .unwrap_or_else(|_| panic!("{}: b's waiter never woke", env.name));

    // b's next log line and renewal are refused: none of its calls starts from now on.
    let e = env
        .b
        .append_replay("theirs", "replica-b", &[step(2)])
        .await
        .unwrap_err();
    assert!(matches!(e, StateError::CellFinished { .. }), "{e}");
    let e = env
        .b
        .claim_cell("theirs", "replica-b", MINUTE)
        .await
        .unwrap_err();
    assert!(matches!(e, StateError::CellFinished { .. }), "{e}");
    env.clock.advance(Duration::from_secs(60));
    let claimable: Vec<String> = env
        .b
        .claimable_cells()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(claimable, ["mine", "other"], "{}", env.name);

    // Ending it again ends nothing more.
    let again = env
        .b
        .end_session_cells("s1", "replica-b", why)
        .await
        .unwrap();
    assert_eq!(
        again.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        ["mine"],
        "{}",
        env.name
    );
}

pub async fn live_cells_per_session_are_bounded_under_races(env: Env) {
    let mut tasks = Vec::new();
    for i in 0..24 {
        let store = if i % 2 == 0 {
            env.a.clone()
        } else {
            env.b.clone()
        };
        tasks.push(tokio::spawn(async move {
            let mut cell = new_cell(&format!("race-{i}"), "s-bounded", "r");
            cell.max_live_per_session = Some(3);
            store.create_cell(cell).await
        }));
    }
    let results: Vec<_> = join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(
        ok, 3,
        "{} backend: exactly the limit of cells may be created",
        env.name
    );
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(matches!(r, StateError::CellLimit { limit: 3, .. }), "{r}");
    }
    // Ending one frees a place.
    let live = env.a.list_cells("s-bounded").await.unwrap();
    let first = &live[0];
    env.a
        .update_cell(
            &first.id,
            "r",
            CellUpdate {
                status: CellStatus::Terminated,
                approval_id: None,
                result: None,
            },
        )
        .await
        .unwrap();
    let mut again = new_cell("after", "s-bounded", "r");
    again.max_live_per_session = Some(3);
    env.b.create_cell(again).await.unwrap();
}

pub async fn replay_log_continues_exactly(env: Env) {
    env.a.create_cell(new_cell("c", "s", "r")).await.unwrap();
    let steps = |from: u64, to: u64| -> Vec<ReplayEntry> {
        (from..=to)
            .map(|s| ReplayEntry {
                step: s,
                entry: json!({"step": s, "result": format!("r{s}")}),
            })
            .collect()
    };
    env.a.append_replay("c", "r", &steps(1, 3)).await.unwrap();
    env.b.append_replay("c", "r", &steps(4, 5)).await.unwrap();
    let log = env.b.read_replay("c").await.unwrap();
    assert_eq!(log, steps(1, 5));
    for bad in [
        steps(7, 7),
        steps(3, 3),
        vec![
            ReplayEntry {
                step: 6,
                entry: json!(1),
            },
            ReplayEntry {
                step: 8,
                entry: json!(1),
            },
        ],
    ] {
        let e = env.a.append_replay("c", "r", &bad).await.unwrap_err();
        assert!(
            matches!(
                e,
                StateError::ReplayOutOfOrder {
                    expected: 6 | 7,
                    ..
                }
            ),
            "{e}"
        );
    }
    assert_eq!(
        env.a.read_replay("c").await.unwrap().len(),
        5,
        "a refused batch writes nothing"
    );

    // Two writers racing for the same step (a split brain): exactly one lands.
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let store = if i % 2 == 0 {
                env.a.clone()
            } else {
                env.b.clone()
            };
            tokio::spawn(async move {
                store
                    .append_replay(
                        "c",
                        "r",
                        &[ReplayEntry {
                            step: 6,
                            entry: json!(i),
                        }],
                    )
                    .await
            })
        })
        .collect();
    let ok = join_all(tasks)
        .await
        .into_iter()
        .filter(|r| r.as_ref().unwrap().is_ok())
        .count();
    assert_eq!(ok, 1);
    assert_eq!(env.a.read_replay("c").await.unwrap().len(), 6);
    let e = env
        .a
        .append_replay("unknown", "r", &steps(1, 1))
        .await
        .unwrap_err();
    assert!(matches!(e, StateError::UnknownCell { .. }), "{e}");
}

// --- approvals ----------------------------------------------------------------------------

pub async fn approvals_are_exact_and_answered_once(env: Env) {
    let a = env
        .a
        .create_approval(new_approval("s1", Some("c1")))
        .await
        .unwrap();
    assert_eq!(a.state, ApprovalState::Pending);
    assert_eq!(a.call_hash, call_hash(&a.tool, &a.arguments, &a.provenance));
    assert_eq!(a.expires_at_ms, a.created_at_ms + 60_000);
    let shown = env.b.get_approval(&a.id).await.unwrap().unwrap();
    assert_eq!(shown, a);
    assert_eq!(
        env.b
            .list_approvals(ApprovalQuery::pending())
            .await
            .unwrap(),
        vec![a.clone()]
    );

    // An answer for a different call (other arguments) is refused.
    let other = call_hash(
        "bash",
        &json!({"command": "rm -rf /", "cwd": "/p"}),
        &a.provenance,
    );
    let e = env
        .b
        .answer_approval(&a.id, answer(Decision::Approve, "bob", &other))
        .await
        .unwrap_err();
    assert!(matches!(e, StateError::ApprovalMismatch { .. }), "{e}");

    let approved = env
        .b
        .answer_approval(&a.id, answer(Decision::Approve, "bob", &a.call_hash))
        .await
        .unwrap();
    assert_eq!(approved.state, ApprovalState::Approved);
    assert_eq!(approved.answered_by.as_deref(), Some("bob"));
    assert_eq!(approved.answered_channel.as_deref(), Some("cli"));
    assert_eq!(approved.answered_at_ms, Some(crate::harness::START_MS));

    let e = env
        .a
        .answer_approval(&a.id, answer(Decision::Deny, "carol", &a.call_hash))
        .await
        .unwrap_err();
    match &e {
        StateError::ApprovalAnswered {
            decision,
            by,
            channel,
            ..
        } => {
            assert_eq!(
                (decision.as_str(), by.as_str(), channel.as_str()),
                ("approved", "bob", "cli")
            );
        }
        other => panic!("expected ApprovalAnswered, got {other}"),
    }
    assert!(e.to_string().contains("already answered"), "{e}");
    let e = env
        .a
        .answer_approval("no-such-id", answer(Decision::Approve, "bob", "x"))
        .await
        .unwrap_err();
    assert!(matches!(e, StateError::UnknownApproval { .. }), "{e}");
    assert!(e.to_string().contains("approvals list"), "{e}");
    assert!(
        env.a
            .list_approvals(ApprovalQuery::pending())
            .await
            .unwrap()
            .is_empty()
    );
    let by_cell = ApprovalQuery {
        cell_id: Some("c1".into()),
        ..ApprovalQuery::default()
    };
    assert_eq!(env.a.list_approvals(by_cell).await.unwrap().len(), 1);
}

pub async fn two_approvers_at_once_one_wins(env: Env) {
    for round in 0..5 {
        let a = env
            .a
            .create_approval(new_approval("s", None))
            .await
            .unwrap();
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let store = if i % 2 == 0 {
                    env.a.clone()
                } else {
                    env.b.clone()
                };
                let (id, hash) = (a.id.clone(), a.call_hash.clone());
                let decision = if i % 3 == 0 {
                    Decision::Deny
                } else {
                    Decision::Approve
                };
                tokio::spawn(async move {
                    store
                        .answer_approval(&id, answer(decision, &format!("person-{i}"), &hash))
                        .await
                })
            })
            .collect();
        let results: Vec<_> = join_all(tasks)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        let winners: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(
            winners.len(),
            1,
            "{} round {round}: exactly one answer wins",
            env.name
        );
        for r in results.iter().filter_map(|r| r.as_ref().err()) {
            assert!(matches!(r, StateError::ApprovalAnswered { .. }), "{r}");
        }
        let stored = env.a.get_approval(&a.id).await.unwrap().unwrap();
        assert_eq!(
            &stored, winners[0],
            "what is stored is what the winner was told"
        );
    }
}

/// Red team: a paused `write {path: "notes/x.txt"}` was approved from `approvals show`, which
/// printed only the arguments, and wrote to /outside/x.txt through a link. The resolved paths
/// are stored with the approval, read back on every replica, and bound into its hash, so an
/// answer for the call reaching other places does not apply.
pub async fn approvals_keep_their_resolved_paths_and_are_bound_to_them(env: Env) {
    let outside = vec!["/outside/x.txt".to_string(), "/p/notes".to_string()];
    let a = env
        .a
        .create_approval(NewApproval {
            paths: outside.clone(),
            ..new_approval("s1", Some("c1"))
        })
        .await
        .unwrap();
    assert_eq!(a.paths, outside);
    let shown = env.b.get_approval(&a.id).await.unwrap().unwrap();
    assert_eq!(
        shown.paths, outside,
        "the other replica reads the paths back"
    );
    assert_eq!(shown, a);
    let listed = env
        .b
        .list_approvals(ApprovalQuery::pending())
        .await
        .unwrap();
    assert_eq!(listed, vec![a.clone()]);

    // The hash covers the paths; without paths it is the old hash, so older rows still match.
    let with = call_hash_with_paths(&a.tool, &a.arguments, &a.provenance, &outside);
    let without = call_hash(&a.tool, &a.arguments, &a.provenance);
    assert_eq!(a.call_hash, with);
    assert_ne!(with, without);
    assert_eq!(
        call_hash_with_paths(&a.tool, &a.arguments, &a.provenance, &[]),
        without
    );
    // The same arguments reaching somewhere else (the link retargeted) is another call.
    let elsewhere = call_hash_with_paths(
        &a.tool,
        &a.arguments,
        &a.provenance,
        &["/elsewhere/x.txt".to_string(), "/p/notes".to_string()],
    );
    assert_ne!(elsewhere, with);
    let reordered = call_hash_with_paths(
        &a.tool,
        &a.arguments,
        &a.provenance,
        &["/p/notes".to_string(), "/outside/x.txt".to_string()],
    );
    assert_ne!(reordered, with);
    for wrong in [&elsewhere, &without] {
        let e = env
            .b
            .answer_approval(&a.id, answer(Decision::Approve, "bob", wrong))
            .await
            .unwrap_err();
        assert!(matches!(e, StateError::ApprovalMismatch { .. }), "{e}");
    }
    let approved = env
        .a
        .answer_approval(&a.id, answer(Decision::Approve, "bob", &with))
        .await
        .unwrap();
    assert_eq!(approved.paths, outside, "answering keeps the paths");

    // A record written before paths were kept (no `paths` key) reads as having none.
    let mut old = serde_json::to_value(&a).unwrap();
    old.as_object_mut().unwrap().remove("paths");
    let old: codemode_state::ApprovalRecord = serde_json::from_value(old).unwrap();
    assert!(old.paths.is_empty());
}

pub async fn approvals_expire_once_into_denials(env: Env) {
    let a = env
        .a
        .create_approval(new_approval("s", None))
        .await
        .unwrap();
    let later = env
        .a
        .create_approval(NewApproval {
            expires_in: MINUTE * 10,
            ..new_approval("s", None)
        })
        .await
        .unwrap();
    env.clock.advance(MINUTE);
    let e = env
        .b
        .answer_approval(&a.id, answer(Decision::Approve, "bob", &a.call_hash))
        .await
        .unwrap_err();
    assert!(matches!(e, StateError::ApprovalExpired { .. }), "{e}");
    assert!(e.to_string().contains("counts as a denial"), "{e}");

    let expired = env.b.expire_approvals().await.unwrap();
    assert_eq!(
        expired.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(),
        [a.id.as_str()]
    );
    assert_eq!(expired[0].state, ApprovalState::Expired);
    assert_eq!(expired[0].answered_channel.as_deref(), Some("expiry"));
    assert!(
        env.a.expire_approvals().await.unwrap().is_empty(),
        "each expiry is reported once"
    );
    let e = env
        .a
        .answer_approval(&a.id, answer(Decision::Approve, "bob", &a.call_hash))
        .await
        .unwrap_err();
    assert!(
        matches!(e, StateError::ApprovalAnswered { ref decision, .. } if decision == "expired"),
        "{e}"
    );
    // The other one is still pending and answerable.
    env.a
        .answer_approval(&later.id, answer(Decision::Deny, "bob", &later.call_hash))
        .await
        .unwrap();
}

pub async fn an_answer_on_one_replica_wakes_the_other(env: Env) {
    let a = env
        .a
        .create_approval(new_approval("s", Some("c")))
        .await
        .unwrap();
    // Subscribe before reading, then wait on replica a while replica b answers.
    let mut watch = env.a.watch(Topic::Approval(a.id.clone()));
    let answerer = {
        let b = env.b.clone();
        let (id, hash) = (a.id.clone(), a.call_hash.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            b.answer_approval(&id, answer(Decision::Approve, "bob", &hash))
                .await
        })
    };
    let waited = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let now = env.a.get_approval(&a.id).await.unwrap().unwrap();
            if now.state != ApprovalState::Pending {
                return now;
            }
            watch.changed().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{}: the waiter on replica a never saw the answer", env.name));
    assert_eq!(waited.state, ApprovalState::Approved);
    answerer.await.unwrap().unwrap();
}

/// `wait` on a cell held elsewhere: the replica holding it finishes it; the waiter sees it.
pub async fn a_cell_finished_on_one_replica_wakes_a_waiter_on_the_other(env: Env) {
    env.a
        .create_cell(new_cell("c", "s", "holder"))
        .await
        .unwrap();
    let mut watch = env.b.watch(Topic::Cell("c".into()));
    let finisher = {
        let a = env.a.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let done = CellUpdate {
                status: CellStatus::Finished,
                approval_id: None,
                result: Some(json!(42)),
            };
            a.update_cell("c", "holder", done).await
        })
    };
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let c = env.b.get_cell("c").await.unwrap().unwrap();
            if c.status.is_terminal() {
                return c;
            }
            watch.changed().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{}: the waiter never saw the cell finish", env.name));
    assert_eq!(seen.result, Some(json!(42)));
    finisher.await.unwrap().unwrap();
}

// --- budgets ------------------------------------------------------------------------------

pub async fn budgets_reserve_settle_release(env: Env) {
    let session = LedgerKey::session("s");
    let script = LedgerKey::script("run-1");
    let day = LedgerKey::principal_day("alice", utc_day(crate::harness::START_MS));
    let limits = Limits {
        calls: Some(3),
        cost_micro_usd: Some(1_000),
        ..Limits::default()
    };
    let req = |amounts| ReserveRequest {
        ledgers: vec![
            (session.clone(), limits),
            (script.clone(), Limits::default()),
            (day.clone(), Limits::default()),
        ],
        amounts,
        hold_for: MINUTE,
    };
    let ReserveOutcome::Granted(r1) = env.a.reserve(req(calls(1))).await.unwrap() else {
        panic!("refused")
    };
    let held = env.b.get_ledger(&session).await.unwrap();
    assert_eq!((held.used.calls, held.reserved.calls), (0, 1));

    let spent = Amounts {
        calls: 1,
        model_calls: 1,
        tokens: 500,
        cost_micro_usd: 1_200,
        bytes: 42,
    };
    let settled = env.b.settle(&r1, spent).await.unwrap();
    assert_eq!(settled.ledgers.len(), 3);
    for l in &settled.ledgers {
        assert_eq!(
            (l.used, l.reserved),
            (spent, Amounts::default()),
            "{}",
            l.key
        );
    }
    // The cost is known only now: it passed the session's ceiling.
    assert_eq!(settled.overruns.len(), 1);
    assert_eq!(
        (settled.overruns[0].counter, settled.overruns[0].used),
        (Counter::CostMicroUsd, 1_200)
    );
    let e = env.a.settle(&r1, spent).await.unwrap_err();
    assert!(
        matches!(e, StateError::UnknownReservation { .. }),
        "settling twice: {e}"
    );

    // Spent budget refuses the next call, naming the ledger and counter, and holds nothing.
    let ReserveOutcome::Refused(refusal) = env.a.reserve(req(calls(1))).await.unwrap() else {
        panic!("granted over budget")
    };
    assert_eq!(
        (
            refusal.ledger.clone(),
            refusal.counter,
            refusal.used,
            refusal.limit
        ),
        (session.clone(), Counter::CostMicroUsd, 1_200, 1_000)
    );
    assert!(refusal.to_string().contains("cost_micro_usd"), "{refusal}");
    for k in [&session, &script, &day] {
        assert_eq!(
            env.a.get_ledger(k).await.unwrap().reserved,
            Amounts::default(),
            "{k}"
        );
    }

    // All or nothing: the script ledger has no room, so the session's is not held either.
    let tight = ReserveRequest {
        ledgers: vec![
            (LedgerKey::session("s2"), max_calls(5)),
            (LedgerKey::script("run-2"), max_calls(0)),
        ],
        amounts: calls(1),
        hold_for: MINUTE,
    };
    assert!(matches!(
        env.a.reserve(tight).await.unwrap(),
        ReserveOutcome::Refused(_)
    ));
    assert_eq!(
        env.a
            .get_ledger(&LedgerKey::session("s2"))
            .await
            .unwrap()
            .reserved,
        Amounts::default()
    );

    // Release gives the hold back without charging.
    let ReserveOutcome::Granted(r2) = env
        .a
        .reserve(reserve_req(vec![(LedgerKey::session("s3"), max_calls(1))]))
        .await
        .unwrap()
    else {
        panic!()
    };
    assert!(matches!(
        env.b
            .reserve(reserve_req(vec![(LedgerKey::session("s3"), max_calls(1))]))
            .await
            .unwrap(),
        ReserveOutcome::Refused(_)
    ));
    env.b.release(&r2).await.unwrap();
    let s3 = env.a.get_ledger(&LedgerKey::session("s3")).await.unwrap();
    assert_eq!(
        (s3.used, s3.reserved),
        (Amounts::default(), Amounts::default())
    );
    assert!(matches!(
        env.b.release(&r2).await.unwrap_err(),
        StateError::UnknownReservation { .. }
    ));
    assert!(matches!(
        env.b
            .reserve(reserve_req(vec![(LedgerKey::session("s3"), max_calls(1))]))
            .await
            .unwrap(),
        ReserveOutcome::Granted(_)
    ));
}

pub async fn budget_holds_of_a_dead_replica_expire(env: Env) {
    let k = LedgerKey::session("s");
    let req = || ReserveRequest {
        ledgers: vec![(k.clone(), max_calls(1))],
        amounts: calls(1),
        hold_for: Duration::from_secs(5),
    };
    let ReserveOutcome::Granted(r) = env.a.reserve(req()).await.unwrap() else {
        panic!()
    };
    assert!(matches!(
        env.b.reserve(req()).await.unwrap(),
        ReserveOutcome::Refused(_)
    ));
    env.clock.advance(Duration::from_secs(6));
    // The hold ran out: the budget is free again...
    let ReserveOutcome::Granted(r2) = env.b.reserve(req()).await.unwrap() else {
        panic!("expired hold still counted")
    };
    // ...and a late settle of the expired hold still charges what was spent, without
    // releasing the newer hold.
    let out = env.a.settle(&r, calls(1)).await.unwrap();
    assert_eq!(
        (out.ledgers[0].used.calls, out.ledgers[0].reserved.calls),
        (1, 1)
    );
    env.b.settle(&r2, calls(1)).await.unwrap();
    let l = env.a.get_ledger(&k).await.unwrap();
    assert_eq!((l.used.calls, l.reserved.calls), (2, 0));
}

/// The headline race: 1,000 reservations fired at two replicas at once against a shared
/// budget of 10 calls (plus each caller's own script ledger and a per-day team ledger).
pub async fn thousand_reservations_two_replicas_budget_of_ten(env: Env) {
    let session = LedgerKey::session("shared");
    let team = LedgerKey::team_day("team-x", utc_day(crate::harness::START_MS));
    let tasks: Vec<_> = (0..1000)
        .map(|i| {
            let store: Arc<dyn StateStore> = if i % 2 == 0 {
                env.a.clone()
            } else {
                env.b.clone()
            };
            let ledgers = vec![
                (
                    LedgerKey::script(format!("script-{}", i % 7)),
                    Limits::default(),
                ),
                (session.clone(), max_calls(10)),
                (team.clone(), max_calls(1_000)),
            ];
            tokio::spawn(async move { store.reserve(reserve_req(ledgers)).await })
        })
        .collect();
    let mut granted = Vec::new();
    let mut refused = 0;
    for r in join_all(tasks).await {
        match r.unwrap() {
            Ok(ReserveOutcome::Granted(g)) => granted.push(g),
            Ok(ReserveOutcome::Refused(f)) => {
                assert_eq!(
                    (f.ledger.clone(), f.counter),
                    (session.clone(), Counter::Calls)
                );
                refused += 1;
            }
            Err(e) => panic!(
                "{}: a reservation failed instead of being decided: {e}",
                env.name
            ),
        }
    }
    assert_eq!(
        granted.len(),
        10,
        "{}: exactly 10 of 1,000 may run",
        env.name
    );
    assert_eq!(refused, 990);
    let l = env.b.get_ledger(&session).await.unwrap();
    assert_eq!((l.used.calls, l.reserved.calls), (0, 10));
    assert_eq!(env.b.get_ledger(&team).await.unwrap().reserved.calls, 10);
    let settles: Vec<_> = granted
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let store = if i % 2 == 0 {
                env.a.clone()
            } else {
                env.b.clone()
            };
            let g = g.clone();
            tokio::spawn(async move { store.settle(&g, calls(1)).await })
        })
        .collect();
    for s in join_all(settles).await {
        s.unwrap().unwrap();
    }
    for k in [&session, &team] {
        let l = env.a.get_ledger(k).await.unwrap();
        assert_eq!((l.used.calls, l.reserved.calls), (10, 0), "{k}");
    }
}

pub async fn bad_budget_requests_are_refused_clearly(env: Env) {
    let cases: Vec<(ReserveRequest, &str)> = vec![
        (reserve_req(vec![]), "names no ledger"),
        (
            reserve_req(vec![
                (LedgerKey::session("s"), Limits::default()),
                (LedgerKey::session("s"), Limits::default()),
            ]),
            "named twice",
        ),
        (
            reserve_req(vec![(
                LedgerKey::principal_day("p", "Dec 2"),
                Limits::default(),
            )]),
            "not a UTC day",
        ),
        (
            reserve_req(vec![(LedgerKey::session(""), Limits::default())]),
            "empty",
        ),
        (
            ReserveRequest {
                ledgers: vec![(LedgerKey::session("s"), Limits::default())],
                amounts: Amounts {
                    tokens: u64::MAX,
                    ..Amounts::default()
                },
                hold_for: MINUTE,
            },
            "largest storable",
        ),
    ];
    for (req, words) in cases {
        let e = env.a.reserve(req).await.unwrap_err();
        assert!(
            matches!(e, StateError::Invalid { .. }) && e.to_string().contains(words),
            "{e}"
        );
    }
}

// --- audit --------------------------------------------------------------------------------

pub async fn audit_streams_chain_and_read_back(env: Env) {
    assert_eq!(env.a.audit_head("main").await.unwrap().seq, 0);
    let r1 = env
        .a
        .append_audit("main", line_maker("one".into()))
        .await
        .unwrap();
    let r2 = env
        .b
        .append_audit("main", line_maker("two".into()))
        .await
        .unwrap();
    env.a
        .append_audit("other", line_maker("x".into()))
        .await
        .unwrap();
    assert_eq!((r1.seq, r1.prev.as_deref()), (1, None));
    assert_eq!((r2.seq, r2.prev.as_deref()), (2, Some(r1.hash.as_str())));
    let lines = env.b.read_audit("main", 0, 100).await.unwrap();
    assert_eq!(lines, vec![r1.clone(), r2.clone()]);
    assert_eq!(
        env.a.read_audit("main", 1, 100).await.unwrap(),
        vec![r2.clone()]
    );
    assert_eq!(env.a.read_audit("main", 0, 1).await.unwrap(), vec![r1]);
    let head = env.b.audit_head("main").await.unwrap();
    assert_eq!(
        (head.seq, head.hash.as_deref()),
        (2, Some(r2.hash.as_str()))
    );
    assert_eq!(env.a.audit_streams().await.unwrap(), ["main", "other"]);

    // A closure that fails, or makes a line that would not chain, writes nothing.
    let e = env
        .a
        .append_audit("main", Box::new(|_| Err("the HMAC key is missing".into())))
        .await
        .unwrap_err();
    assert!(
        matches!(e, StateError::AuditLine { .. }) && e.to_string().contains("HMAC key"),
        "{e}"
    );
    let same = r2.hash.clone();
    let e = env
        .a
        .append_audit(
            "main",
            Box::new(move |_| {
                Ok(AuditLine {
                    line: "dup".into(),
                    hash: same.clone(),
                })
            }),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, StateError::AuditLine { .. }), "{e}");
    let e = env
        .a
        .append_audit(
            "main",
            Box::new(|_| {
                Ok(AuditLine {
                    line: "nul\0".into(),
                    hash: "h".into(),
                })
            }),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, StateError::Invalid { .. }), "{e}");
    assert_eq!(env.a.audit_head("main").await.unwrap().seq, 2);
}

/// Two replicas appending at once make one chain: every line's prev is the line before's
/// hash, and no two lines share a prev.
pub async fn concurrent_audit_appends_make_one_chain(env: Env) {
    let n = 300;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = if i % 2 == 0 {
                env.a.clone()
            } else {
                env.b.clone()
            };
            tokio::spawn(async move {
                store
                    .append_audit("s", line_maker(format!("line {i}")))
                    .await
            })
        })
        .collect();
    for r in join_all(tasks).await {
        r.unwrap().unwrap();
    }
    let lines = env.a.read_audit("s", 0, 10_000).await.unwrap();
    assert_chain(&lines, n);
}

pub fn assert_chain(lines: &[codemode_state::AuditRecord], n: usize) {
    assert_eq!(lines.len(), n);
    let mut prevs = HashSet::new();
    let mut texts = HashSet::new();
    let mut prev: Option<String> = None;
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l.seq, i as u64 + 1);
        assert_eq!(
            l.prev, prev,
            "line {} does not chain onto line {}",
            l.seq, i
        );
        let p = l.prev.clone().unwrap_or_else(|| "0".repeat(64));
        assert_eq!(
            l.hash,
            hex::encode(Sha256::digest(format!("{p}\n{}", l.line).as_bytes()))
        );
        assert!(prevs.insert(p), "fork at line {}", l.seq);
        assert!(texts.insert(l.line.clone()), "line appended twice");
        prev = Some(l.hash.clone());
    }
}

pub async fn ids_are_checked(env: Env) {
    let long = "x".repeat(codemode_state::MAX_ID_BYTES + 1);
    for id in ["", "nul\0", long.as_str()] {
        let e = env.a.open_session(id, None).await.unwrap_err();
        assert!(
            matches!(
                e,
                StateError::Invalid {
                    what: "session id",
                    ..
                }
            ),
            "{e}"
        );
        let e = env.a.create_cell(new_cell(id, "s", "r")).await.unwrap_err();
        assert!(
            matches!(
                e,
                StateError::Invalid {
                    what: "cell id",
                    ..
                }
            ),
            "{e}"
        );
        let e = env
            .a
            .append_audit(id, line_maker("l".into()))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                StateError::Invalid {
                    what: "audit stream",
                    ..
                }
            ),
            "{e}"
        );
    }
    let e = env
        .a
        .answer_approval(
            "x",
            Answer {
                by: String::new(),
                ..answer(Decision::Approve, "b", "h")
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            StateError::Invalid {
                what: "answerer",
                ..
            }
        ),
        "{e}"
    );
    env.a.ping().await.unwrap();
    assert!(!env.a.describe().is_empty());
}

/// Red team: ended cells (each with its script, up to 4 MiB) and answered approvals (each with
/// a call's whole arguments) were never deleted, so the state database only grew. Pruning takes
/// what ended before a time, and leaves what is live or waiting.
pub async fn ended_cells_and_answered_approvals_are_pruned(env: Env) {
    env.a
        .create_cell(new_cell("c-done", "s1", "replica-a"))
        .await
        .unwrap();
    env.a
        .update_cell(
            "c-done",
            "replica-a",
            CellUpdate {
                status: CellStatus::Finished,
                approval_id: None,
                result: Some(json!({"text": "ok", "isError": false})),
            },
        )
        .await
        .unwrap();
    env.a
        .create_cell(new_cell("c-live", "s1", "replica-a"))
        .await
        .unwrap();
    let answered = env
        .a
        .create_approval(new_approval("s1", Some("c-live")))
        .await
        .unwrap();
    env.b
        .answer_approval(
            &answered.id,
            answer(Decision::Deny, "bob", &answered.call_hash),
        )
        .await
        .unwrap();
    let waiting = env
        .a
        .create_approval(new_approval("s1", Some("c-live")))
        .await
        .unwrap();
    // Nothing ended before the start.
    assert_eq!(
        env.b.prune_ended(crate::harness::START_MS).await.unwrap(),
        0,
        "{}",
        env.name
    );
    let gone = env
        .b
        .prune_ended(crate::harness::START_MS + 1)
        .await
        .unwrap();
    assert_eq!(gone, 2, "{}", env.name);
    assert!(env.a.get_cell("c-done").await.unwrap().is_none());
    assert!(env.a.get_cell("c-live").await.unwrap().is_some());
    assert!(env.a.get_approval(&answered.id).await.unwrap().is_none());
    assert!(env.a.get_approval(&waiting.id).await.unwrap().is_some());
}
