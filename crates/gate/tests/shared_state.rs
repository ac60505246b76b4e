//! Budgets and audit streams kept in a shared state store, as several `codemode serve`
//! replicas use them: each "replica" here is its own gate with its own store handle (its own
//! SQLite connection, its own PostgreSQL pool) on one database.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use codemode_gate::{
    AuditLog, BudgetLimits, Budgets, DailyBudgets, Gate, Principal, Registry, Stage, verify_stream,
};
use codemode_state::{
    Clock, LedgerKey, PostgresOptions, PostgresStore, SqliteOptions, SqliteStore, StateStore,
    utc_day,
};
use common::{TestTool, builder, object_schema, req, script, test_key};
use serde_json::json;

const PG_URL_VAR: &str = "CODEMODE_TEST_POSTGRES_URL";

/// Two handles on one database, and what keeps it alive.
struct Shared {
    name: &'static str,
    a: Arc<dyn StateStore>,
    b: Arc<dyn StateStore>,
    _dir: Option<tempfile::TempDir>,
    sqlite: Option<std::path::PathBuf>,
    pg: Option<(String, String)>,
}

async fn sqlite() -> Shared {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let opts = || SqliteOptions {
        busy_timeout: std::time::Duration::from_secs(60),
        ..SqliteOptions::default()
    };
    let a = SqliteStore::open(&path, opts(), Clock::system())
        .await
        .unwrap();
    let b = SqliteStore::open(&path, opts(), Clock::system())
        .await
        .unwrap();
    Shared {
        name: "sqlite",
        a: Arc::new(a),
        b: Arc::new(b),
        _dir: Some(dir),
        sqlite: Some(path),
        pg: None,
    }
}

/// Two pools on a fresh schema, or `None` (said once) without a PostgreSQL to test against.
async fn postgres() -> Option<Shared> {
    let Some(url) = std::env::var(PG_URL_VAR)
        .ok()
        .filter(|u| !u.trim().is_empty())
    else {
        static SAY: std::sync::Once = std::sync::Once::new();
        SAY.call_once(|| {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: the gate's PostgreSQL tests, because {PG_URL_VAR} is not set; run them with `scripts/with-postgres cargo test -p codemode-gate --test suite shared_state::`"
            );
        });
        return None;
    };
    let schema = format!(
        "cm_gate_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..16]
    );
    let opts = || PostgresOptions {
        pool_size: 8,
        schema: Some(schema.clone()),
        ..PostgresOptions::default()
    };
    let a = PostgresStore::open(&url, opts(), Clock::system())
        .await
        .unwrap();
    let b = PostgresStore::open(&url, opts(), Clock::system())
        .await
        .unwrap();
    Some(Shared {
        name: "postgres",
        a: Arc::new(a),
        b: Arc::new(b),
        _dir: None,
        sqlite: None,
        pg: Some((url, schema)),
    })
}

async fn backends() -> Vec<Shared> {
    let mut v = vec![sqlite().await];
    v.extend(postgres().await);
    v
}

fn limit_calls(n: u64) -> BudgetLimits {
    BudgetLimits {
        max_calls: Some(n),
        ..BudgetLimits::default()
    }
}

/// A replica: its own registry and tool (counting its own runs), on the shared store.
fn replica(
    store: &Arc<dyn StateStore>,
    daily: DailyBudgets,
    session: BudgetLimits,
    who: Option<Principal>,
) -> (Gate, TestTool) {
    let reg = Registry::new();
    let tool = TestTool::new("echo", object_schema());
    let runs = tool.runs.clone();
    reg.register(Arc::new(tool)).unwrap();
    let gate = builder(&reg)
        .budgets(Budgets {
            session,
            ..Budgets::default()
        })
        .shared_budgets(store.clone(), daily)
        .principal(who)
        .build()
        .unwrap();
    let mut probe = TestTool::new("echo", object_schema());
    probe.runs = runs;
    (gate, probe)
}

fn alice() -> Option<Principal> {
    Some(Principal {
        id: "alice".into(),
        team: Some("infra".into()),
    })
}

/// 1,000 calls fired at once, half at each replica, against one principal's daily budget of 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shared_budget_of_ten_runs_exactly_ten_of_a_thousand_calls_on_two_replicas() {
    for env in backends().await {
        let daily = DailyBudgets {
            principal: limit_calls(10),
            ..DailyBudgets::default()
        };
        let (a, ran_a) = replica(&env.a, daily.clone(), BudgetLimits::default(), alice());
        let (b, ran_b) = replica(&env.b, daily, BudgetLimits::default(), alice());
        let mut tasks = Vec::new();
        for i in 0..1000 {
            let gate = if i % 2 == 0 { a.clone() } else { b.clone() };
            tasks.push(tokio::spawn(async move {
                // Each call in its own script, so only the shared ledger can stop them.
                gate.call(req("echo", json!({}), script(&format!("s{i}"))))
                    .await
            }));
        }
        let mut ok = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => ok += 1,
                Err(e) => {
                    assert_eq!(e.stage, Stage::Budget, "{}: {}", env.name, e.message);
                    assert!(
                        e.message
                            .contains("principal budget `max_calls` of `alice`"),
                        "{}: {}",
                        env.name,
                        e.message
                    );
                }
            }
        }
        let ran = ran_a.runs.load(Ordering::SeqCst) + ran_b.runs.load(Ordering::SeqCst);
        assert_eq!((ok, ran), (10, 10), "{}", env.name);
        let day = utc_day(Clock::system().now_ms());
        let ledger = env
            .a
            .get_ledger(&LedgerKey::principal_day("alice", day))
            .await
            .unwrap();
        assert_eq!(ledger.used.calls, 10, "{}", env.name);
        assert_eq!(ledger.reserved.calls, 0, "{}: a hold was left", env.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_budget_counts_every_member_and_a_session_budget_follows_the_session() {
    for env in backends().await {
        let daily = DailyBudgets {
            team: limit_calls(5),
            ..DailyBudgets::default()
        };
        let bob = Some(Principal {
            id: "bob".into(),
            team: Some("infra".into()),
        });
        let (a, _) = replica(&env.a, daily.clone(), BudgetLimits::default(), alice());
        let (b, _) = replica(&env.b, daily, BudgetLimits::default(), bob);
        let mut ok = 0;
        for i in 0..4 {
            for gate in [&a, &b] {
                if gate
                    .call(req("echo", json!({}), script(&format!("t{i}"))))
                    .await
                    .is_ok()
                {
                    ok += 1;
                }
            }
        }
        assert_eq!(
            ok, 5,
            "{}: the team's 5 calls are shared by alice and bob",
            env.name
        );

        // One session (`s1`, as `script()` names it) moving between replicas: 3 in total.
        let (a, _) = replica(&env.a, DailyBudgets::default(), limit_calls(3), None);
        let (b, _) = replica(&env.b, DailyBudgets::default(), limit_calls(3), None);
        let mut ok = 0;
        for i in 0..3 {
            for gate in [&a, &b] {
                match gate
                    .call(req("echo", json!({}), script(&format!("u{i}"))))
                    .await
                {
                    Ok(_) => ok += 1,
                    Err(e) => assert!(e.message.contains("session budget"), "{}", e.message),
                }
            }
        }
        assert_eq!(
            ok, 3,
            "{}: the session's budget holds across replicas",
            env.name
        );
    }
}

fn streaming(store: &Arc<dyn StateStore>, stream: &str) -> (Gate, TestTool) {
    let reg = Registry::new();
    let mut tool = TestTool::new("echo", object_schema());
    tool.delay_ms = 1;
    reg.register(Arc::new(tool)).unwrap();
    let gate = builder(&reg)
        .audit(AuditLog::stream(store.clone(), stream, test_key()).unwrap())
        .build()
        .unwrap();
    (gate, TestTool::new("unused", object_schema()))
}

/// Two replicas appending at once make one chain; then the chain is attacked in the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_append_one_audit_chain_that_detects_tampering() {
    for env in backends().await {
        let (a, _) = streaming(&env.a, "team");
        let (b, _) = streaming(&env.b, "team");
        let mut tasks = Vec::new();
        for i in 0..200 {
            let gate = if i % 2 == 0 { a.clone() } else { b.clone() };
            tasks.push(tokio::spawn(async move {
                gate.call(req(
                    "echo",
                    json!({"path": format!("{i}")}),
                    script("chain"),
                ))
                .await
            }));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let report = verify_stream(env.a.as_ref(), "team", Some(&test_key()))
            .await
            .unwrap();
        assert_eq!(report.lines, 200, "{}", env.name);
        let lines = env.b.read_audit("team", 0, 1000).await.unwrap();
        let ids: std::collections::HashSet<_> = lines
            .iter()
            .map(|r| {
                let v: serde_json::Value = serde_json::from_str(&r.line).unwrap();
                v["provenance"]["call_id"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(ids.len(), 200, "{}: every call has its own line", env.name);
        // Another key cannot vouch for the stream.
        let other = codemode_gate::AuditKey::from_bytes([1; 32]);
        assert!(
            verify_stream(env.a.as_ref(), "team", Some(&other))
                .await
                .is_err()
        );

        if let Some(path) = &env.sqlite {
            let db = rusqlite::Connection::open(path).unwrap();
            // A changed line fails its MAC.
            db.execute(
                "UPDATE audit_lines SET line = replace(line, '\"status\":\"ok\"', '\"status\":\"error\"') WHERE stream = 'team' AND seq = 17",
                [],
            )
            .unwrap();
            let e = verify_stream(env.a.as_ref(), "team", Some(&test_key()))
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains("line 17") && e.contains("MAC"), "{e}");
        }
        if let Some((url, schema)) = &env.pg {
            let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            // A removed line breaks the sequence.
            client
                .batch_execute(&format!(
                    "DELETE FROM {schema}.audit_lines WHERE stream = 'team' AND seq = 50"
                ))
                .await
                .unwrap();
            let e = verify_stream(env.a.as_ref(), "team", Some(&test_key()))
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains("line 50") && e.contains("removed"), "{e}");
        }
    }
}

/// A call dropped while it runs still gets its line in the stream (written in the background;
/// `flush` waits for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_call_still_leaves_its_line_in_the_stream() {
    for env in backends().await {
        let reg = Registry::new();
        let mut tool = TestTool::new("slow", object_schema());
        tool.delay_ms = 60_000;
        let runs = tool.runs.clone();
        reg.register(Arc::new(tool)).unwrap();
        let gate = builder(&reg)
            .audit(AuditLog::stream(env.a.clone(), "drops", test_key()).unwrap())
            .build()
            .unwrap();
        let g = gate.clone();
        let call = tokio::spawn(async move { g.call(req("slow", json!({}), script("d"))).await });
        while runs.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        call.abort();
        let _ = call.await;
        gate.flush().await;
        let lines = env.a.read_audit("drops", 0, 10).await.unwrap();
        assert_eq!(lines.len(), 1, "{}", env.name);
        assert!(
            lines[0].line.contains("\"status\":\"cancelled\""),
            "{}",
            lines[0].line
        );
        verify_stream(env.a.as_ref(), "drops", Some(&test_key()))
            .await
            .unwrap();
    }
}

/// The database goes away under a running gate: calls are refused, never run unbudgeted or
/// unrecorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_refused_when_the_shared_state_cannot_be_written() {
    let Some(env) = postgres().await else { return };
    let (gate, ran) = replica(
        &env.a,
        DailyBudgets {
            principal: limit_calls(100),
            ..DailyBudgets::default()
        },
        BudgetLimits::default(),
        alice(),
    );
    gate.call(req("echo", json!({}), script("x")))
        .await
        .unwrap();
    let (url, schema) = env.pg.clone().unwrap();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
    // The replica holds a budget lease (1/16 of the 100 calls, held for it in the database):
    // calls it covers may still run, budgeted, until the lease needs the database again.
    let lease = 100 / 16;
    let mut e = None;
    for _ in 0..=lease {
        if let Err(refused) = gate.call(req("echo", json!({}), script("x"))).await {
            e = Some(refused);
            break;
        }
    }
    let e = e.expect("calls beyond the lease were refused");
    assert_eq!(e.stage, Stage::Budget, "{}", e.message);
    assert!(e.message.contains("could not be charged"), "{}", e.message);
    assert!(ran.runs.load(Ordering::SeqCst) <= 1 + lease as usize);

    // An audit stream that cannot be written refuses every later call.
    let (gate, _) = streaming(&env.b, "gone");
    let _ = gate.call(req("echo", json!({}), script("y"))).await;
    let e = gate
        .call(req("echo", json!({}), script("y")))
        .await
        .unwrap_err();
    assert!(
        e.message.contains("audit log cannot be written"),
        "{}",
        e.message
    );
}

/// Budgets and the audit stream in one store: the settle commits without waiting for the disk
/// and the call's line flushes it. 400 calls at two replicas against a budget of 10 for the
/// day: exactly 10 run and are charged, nothing stays held, and every call has its line in one
/// chain that verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn budgets_and_audit_stream_in_one_store_stay_exact_and_chained() {
    for env in backends().await {
        let daily = DailyBudgets {
            principal: limit_calls(10),
            ..DailyBudgets::default()
        };
        let gate = |store: &Arc<dyn StateStore>| {
            let reg = Registry::new();
            let tool = TestTool::new("echo", object_schema());
            let runs = tool.runs.clone();
            reg.register(Arc::new(tool)).unwrap();
            let gate = builder(&reg)
                .shared_budgets(store.clone(), daily.clone())
                .audit(AuditLog::stream(store.clone(), "calls", test_key()).unwrap())
                .principal(alice())
                .build()
                .unwrap();
            (gate, runs)
        };
        let (a, ran_a) = gate(&env.a);
        let (b, ran_b) = gate(&env.b);
        let tasks: Vec<_> = (0..400)
            .map(|i| {
                let gate = if i % 2 == 0 { a.clone() } else { b.clone() };
                tokio::spawn(async move {
                    gate.call(req("echo", json!({}), script(&format!("s{i}"))))
                        .await
                })
            })
            .collect();
        let mut ok = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => ok += 1,
                Err(e) => assert_eq!(e.stage, Stage::Budget, "{}: {}", env.name, e.message),
            }
        }
        let ran = ran_a.load(Ordering::SeqCst) + ran_b.load(Ordering::SeqCst);
        assert_eq!((ok, ran), (10, 10), "{}", env.name);
        let day = utc_day(Clock::system().now_ms());
        let ledger = env
            .b
            .get_ledger(&LedgerKey::principal_day("alice", day))
            .await
            .unwrap();
        assert_eq!(
            (ledger.used.calls, ledger.reserved.calls),
            (10, 0),
            "{}",
            env.name
        );
        let report = verify_stream(env.a.as_ref(), "calls", Some(&test_key()))
            .await
            .unwrap();
        assert_eq!(report.lines, 400, "{}: every call has its line", env.name);
    }
}

/// A person who answers when the test says so.
struct Person {
    asked: tokio::sync::Notify,
    answer: tokio::sync::Notify,
}

impl codemode_gate::Approver for Person {
    fn approve<'a>(
        &'a self,
        _req: &'a codemode_gate::ApprovalRequest,
    ) -> codemode_spec::BoxFuture<'a, codemode_gate::ApprovalAnswer> {
        Box::pin(async move {
            self.asked.notify_one();
            self.answer.notified().await;
            codemode_gate::ApprovalAnswer::Yes
        })
    }
}

/// A shared hold expires (15 minutes) so that a dead replica's budget comes back; a person may
/// take longer than that to answer. A red team paused a call on replica A for approval, let the
/// hold run out, spent the budget on replica B, then approved: both calls ran against
/// `max_calls: 1`. The approved call must be counted again before it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_approved_after_its_budget_hold_ran_out_cannot_overspend() {
    let (clock, hand) = Clock::manual(1_800_000_000_000);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let sqlite = || async {
        let s = SqliteStore::open(&path, SqliteOptions::default(), clock.clone())
            .await
            .unwrap();
        Arc::new(s) as Arc<dyn StateStore>
    };
    let memory: Arc<dyn StateStore> = Arc::new(codemode_state::MemoryStore::new(clock.clone()));
    let pairs = [
        ("memory", memory.clone(), memory),
        ("sqlite", sqlite().await, sqlite().await),
    ];
    let policy = codemode_gate::PolicySet::parse(
        "p.cedar",
        r#"@id("free") permit(principal, action, resource == Tool::"echo");
           @id("ask-write") @ask("a person decides") permit(principal, action, resource == Tool::"write");"#,
    )
    .unwrap();
    for (name, a, b) in pairs {
        let person = Arc::new(Person {
            asked: tokio::sync::Notify::new(),
            answer: tokio::sync::Notify::new(),
        });
        let reg_a = Registry::new();
        let write = TestTool::new("write", object_schema());
        let writes = write.runs.clone();
        reg_a.register(Arc::new(write)).unwrap();
        reg_a
            .register(Arc::new(TestTool::new("echo", object_schema())))
            .unwrap();
        let budgets = Budgets {
            session: limit_calls(1),
            ..Budgets::default()
        };
        let gate_a = Gate::builder()
            .registry(reg_a)
            .policy(policy.clone())
            .budgets(budgets.clone())
            .shared_budgets(a.clone(), DailyBudgets::default())
            .approver(person.clone())
            .build()
            .unwrap();
        let (gate_b, echoes) = replica(&b, DailyBudgets::default(), limit_calls(1), None);

        let paused = {
            let gate_a = gate_a.clone();
            tokio::spawn(async move {
                gate_a
                    .call(req("write", json!({"path": "x"}), script("s-a")))
                    .await
            })
        };
        person.asked.notified().await;
        // While the hold lives, the other replica is refused.
        let err = gate_b
            .call(req("echo", json!({}), script("s-b")))
            .await
            .unwrap_err();
        assert_eq!(err.stage, Stage::Budget, "{name}: {}", err.message);

        hand.advance(std::time::Duration::from_secs(16 * 60));
        let spent_elsewhere = gate_b.call(req("echo", json!({}), script("s-b"))).await;
        person.answer.notify_one();
        let approved = paused.await.unwrap();

        let ran = writes.load(Ordering::SeqCst) + echoes.runs.load(Ordering::SeqCst);
        assert_eq!(
            ran,
            1,
            "{name}: {ran} calls ran against max_calls 1 (echo: {:?}, approved write: {:?})",
            spent_elsewhere.as_ref().map(|_| ()).map_err(|e| &e.message),
            approved.as_ref().map(|_| ()).map_err(|e| &e.message),
        );
        let ledger = a.get_ledger(&LedgerKey::session("s1")).await.unwrap();
        assert_eq!(ledger.used.calls, 1, "{name}: {ledger:?}");
        if let Err(e) = approved {
            assert_eq!(e.stage, Stage::Budget, "{name}: {}", e.message);
            assert!(e.message.contains("approved"), "{name}: {}", e.message);
        }
    }
}

/// A hold expires so that a replica that died mid-call gives its budget back; a call that is
/// merely slow must not. A red team started a call that ran past its hold on replica A, then
/// spent the same budget on replica B while it still ran: two calls against `max_calls: 1`.
/// The running call renews its hold, so B is refused for as long as A's call runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_runs_past_its_hold_keeps_its_budget_from_other_replicas() {
    let hold_for = std::time::Duration::from_millis(800);
    let mut envs = backends().await;
    let memory: Arc<dyn StateStore> = Arc::new(codemode_state::MemoryStore::new(Clock::system()));
    envs.insert(
        0,
        Shared {
            name: "memory",
            a: memory.clone(),
            b: memory,
            _dir: None,
            sqlite: None,
            pg: None,
        },
    );
    for env in envs {
        let name = env.name;
        let reg = Registry::new();
        let mut slow = TestTool::new("slow", object_schema());
        slow.delay_ms = 3_000;
        let slow_runs = slow.runs.clone();
        reg.register(Arc::new(slow)).unwrap();
        let gate_a = builder(&reg)
            .budgets(Budgets {
                session: limit_calls(1),
                ..Budgets::default()
            })
            .shared_budgets(env.a.clone(), DailyBudgets::default())
            .shared_hold_for(hold_for)
            .build()
            .unwrap();
        let (gate_b, echoes) = replica(&env.b, DailyBudgets::default(), limit_calls(1), None);

        let running = {
            let gate_a = gate_a.clone();
            tokio::spawn(async move { gate_a.call(req("slow", json!({}), script("s-a"))).await })
        };
        // Well past the hold's own lifetime, while the call still runs: B tries again and again.
        tokio::time::sleep(hold_for * 2).await;
        let mut granted = Vec::new();
        while !running.is_finished() {
            if let Ok(out) = gate_b.call(req("echo", json!({}), script("s-b"))).await {
                granted.push(out);
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let ran_a = running.await.unwrap();
        assert!(
            ran_a.is_ok(),
            "{name}: {:?}",
            ran_a.err().map(|e| e.message)
        );
        assert_eq!(slow_runs.load(Ordering::SeqCst), 1, "{name}");
        assert_eq!(
            echoes.runs.load(Ordering::SeqCst),
            0,
            "{name}: replica B ran a call against max_calls 1 while A's call still ran"
        );
        assert!(granted.is_empty(), "{name}");
        let ledger = env.a.get_ledger(&LedgerKey::session("s1")).await.unwrap();
        assert_eq!(ledger.used.calls, 1, "{name}: {ledger:?}");
        assert_eq!(ledger.reserved.calls, 0, "{name}: {ledger:?}");
    }
}

/// A gate on `store` with `echo` (journalled: not read-only) and a `codemode` tool standing for
/// the runtime's script call, whose nested calls the test makes itself.
fn scripting(store: &Arc<dyn StateStore>, stream: &str) -> Gate {
    let reg = Registry::new();
    let mut echo = TestTool::new("echo", object_schema());
    echo.delay_ms = 1;
    reg.register(Arc::new(echo)).unwrap();
    reg.register(Arc::new(TestTool::new("codemode", object_schema())))
        .unwrap();
    builder(&reg)
        .audit(AuditLog::stream(store.clone(), stream, test_key()).unwrap())
        .build()
        .unwrap()
}

/// Admits and begins the `codemode` call `call_id` of session "s1", as the runtime does before
/// it runs a script.
async fn begin_script(gate: &Gate, call_id: &str) -> codemode_gate::Admission {
    let mut outer = gate
        .admit(req(
            "codemode",
            json!({}),
            codemode_spec::Provenance::model(call_id, "s1"),
        ))
        .await
        .unwrap();
    outer.begin().await.unwrap();
    outer
}

/// A script's call (session "s1") made by the script the `codemode` call `parent` runs.
fn called_by(parent: &str, script_id: &str) -> codemode_spec::Provenance {
    let mut p = script(script_id);
    p.parent_call_id = Some(parent.to_string());
    p
}

/// Runs a "script": admits and begins a `codemode` call, makes `n` nested `echo` calls at once,
/// then finishes the `codemode` call. Every nested call must succeed.
async fn run_script(gate: &Gate, n: usize) -> Result<(), codemode_gate::GateError> {
    let outer = begin_script(gate, &format!("cm-{}", uuid::Uuid::new_v4().simple())).await;
    let parent = outer.call_id().to_string();
    let calls = (0..n).map(|i| {
        gate.call(req(
            "echo",
            json!({"path": format!("{i}")}),
            called_by(&parent, "lines"),
        ))
    });
    for r in futures::future::join_all(calls).await {
        r.expect("the nested call ran and its result came back");
    }
    outer
        .finish(Ok(codemode_spec::ToolOutput::value(json!("done"))))
        .await
        .map(|_| ())
}

/// Nested calls get their results before their outcome lines are stored; the script's own line
/// still comes after every one of them, so each call of each script is in the stream before
/// the line that hands the script's result on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scripts_line_follows_every_line_of_its_calls() {
    for env in backends().await {
        let a = scripting(&env.a, "scripts");
        let b = scripting(&env.b, "scripts");
        let runs = (0..6).map(|i| {
            let gate = if i % 2 == 0 { a.clone() } else { b.clone() };
            async move { run_script(&gate, 40).await }
        });
        for r in futures::future::join_all(runs).await {
            r.unwrap();
        }
        let lines = env.a.read_audit("scripts", 0, 1000).await.unwrap();
        assert_eq!(lines.len(), 6 * 41, "{}", env.name);
        let mut open: std::collections::HashMap<String, usize> = Default::default();
        for r in &lines {
            let v: serde_json::Value = serde_json::from_str(&r.line).unwrap();
            if v["tool"] == "codemode" {
                let id = v["provenance"]["call_id"].as_str().unwrap();
                assert_eq!(
                    open.remove(id),
                    Some(40),
                    "{}: the script's line came after all 40 of its calls' lines",
                    env.name
                );
            } else {
                let parent = v["provenance"]["parent_call_id"].as_str().unwrap();
                *open.entry(parent.to_string()).or_default() += 1;
            }
        }
        assert!(open.is_empty(), "{}: {open:?}", env.name);
        verify_stream(env.a.as_ref(), "scripts", Some(&test_key()))
            .await
            .unwrap();
    }
}

/// Runs `body` (PL/pgSQL) before every line of an `echo` call is stored in `stream`.
async fn on_echo_lines(env: &Shared, stream: &str, body: &str) {
    let (url, schema) = env.pg.clone().unwrap();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(&format!(
            "CREATE FUNCTION {schema}.on_{stream}() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN {body} END $$;
             CREATE TRIGGER on_{stream} BEFORE INSERT ON {schema}.audit_lines FOR EACH ROW
               WHEN (NEW.stream = '{stream}' AND NEW.line LIKE '%\"tool\":\"echo\"%')
               EXECUTE FUNCTION {schema}.on_{stream}();"
        ))
        .await
        .unwrap();
}

/// Makes the database refuse every line of `echo` calls in `stream`.
async fn refuse_echo_lines(env: &Shared, stream: &str) {
    on_echo_lines(env, stream, "RAISE EXCEPTION 'refused by the test';").await;
}

/// A call of another session that names a running script's call id as its parent is not
/// that script's call: it waits for its own line (here refused), and fails with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_of_another_session_does_not_join_a_running_script() {
    let Some(env) = postgres().await else { return };
    refuse_echo_lines(&env, "sessions").await;
    let gate = scripting(&env.a, "sessions");
    let outer = begin_script(&gate, "cm-shared-id").await;
    let mut p = called_by("cm-shared-id", "intruder");
    p.session_id = "s2".into();
    let e = gate
        .call(req("echo", json!({}), p))
        .await
        .expect_err("its line was refused, and it waited for it");
    assert!(
        e.message.contains("audit line could not be written"),
        "{}",
        e.message
    );
    drop(outer);
}

/// The database refuses the outcome lines of the script's calls (a trigger): the calls ran and
/// their results went back to the script, but the script's result is withheld, every later
/// call is refused, and the journal names the calls as unfinished.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_script_whose_calls_lines_were_refused_has_its_result_withheld() {
    let Some(env) = postgres().await else { return };
    refuse_echo_lines(&env, "refusing").await;
    let gate = scripting(&env.a, "refusing");
    let e = run_script(&gate, 5)
        .await
        .expect_err("the script's result must be withheld");
    assert!(
        e.message.contains("a line of a call the script made") && e.message.contains("withheld"),
        "{}",
        e.message
    );
    let later = gate
        .call(req("echo", json!({}), script("later")))
        .await
        .unwrap_err();
    assert!(
        later.message.contains("audit log cannot be written"),
        "{}",
        later.message
    );
    let unfinished = codemode_gate::unfinished_stream_calls(env.a.as_ref(), "refusing", None)
        .await
        .unwrap();
    let echoes = unfinished
        .iter()
        .filter(|c| c.record["tool"] == "echo")
        .count();
    assert_eq!(echoes, 5, "each call that ran is on record as started");
}

/// A script's `codemode` call dropped while its calls' lines are still being written (the
/// client went away): its `cancelled` line still comes after every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_scripts_line_still_follows_its_calls_lines() {
    for env in backends().await {
        let gate = scripting(&env.a, "dropped");
        let outer = begin_script(&gate, "cm-dropped").await;
        let calls = (0..60).map(|i| {
            gate.call(req(
                "echo",
                json!({"path": format!("{i}")}),
                called_by("cm-dropped", "dropped"),
            ))
        });
        for r in futures::future::join_all(calls).await {
            r.unwrap();
        }
        drop(outer);
        gate.flush().await;
        let lines = env.a.read_audit("dropped", 0, 100).await.unwrap();
        assert_eq!(lines.len(), 61, "{}", env.name);
        let last: serde_json::Value = serde_json::from_str(&lines[60].line).unwrap();
        assert_eq!(last["tool"], "codemode", "{}", env.name);
        assert_eq!(last["status"], "cancelled", "{}", env.name);
    }
}

/// The caller of a script's `codemode` call stops waiting while the script's line waits for
/// its calls' lines (slowed here by a trigger): the script's line is written all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scripts_line_is_written_when_its_caller_stops_waiting_for_it() {
    let Some(env) = postgres().await else { return };
    on_echo_lines(&env, "slow", "PERFORM pg_sleep(0.3); RETURN NEW;").await;
    let gate = scripting(&env.a, "slow");
    let outer = begin_script(&gate, "cm-slow").await;
    gate.call(req("echo", json!({}), called_by("cm-slow", "slow")))
        .await
        .unwrap();
    let finish = outer.finish(Ok(codemode_spec::ToolOutput::value(json!("done"))));
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(50), finish)
            .await
            .is_err(),
        "the script's line was still waiting for its call's line"
    );
    gate.flush().await;
    let lines = env.a.read_audit("slow", 0, 10).await.unwrap();
    let tools: Vec<String> = lines
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_str(&r.line).unwrap();
            format!(
                "{} {}",
                v["tool"].as_str().unwrap(),
                v["status"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(tools, ["echo ok", "codemode ok"]);
}

/// Red team: a provider reporting more tokens than a database counter holds (`u64::MAX`, above
/// `i64::MAX`) made the shared settle fail ("settled amounts … above the largest storable"), so
/// the call's spending was never charged and its hold ran out 15 minutes later: the principal's
/// daily budget came back whole. An absurd count must use the budget up instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absurd_token_count_uses_up_the_shared_budget_instead_of_being_dropped() {
    for env in backends().await {
        let lying = codemode_spec::Usage {
            input_tokens: u64::MAX,
            output_tokens: 50,
            cost_usd: 1e30,
            ..Default::default()
        };
        let reg = Registry::new();
        let tool = TestTool::model("models.classify", "acme", "small", lying);
        let runs = tool.runs.clone();
        reg.register(Arc::new(tool)).unwrap();
        let limits = BudgetLimits {
            max_tokens: Some(1_000_000),
            max_cost_usd: Some(10.0),
            ..BudgetLimits::default()
        };
        let gate = builder(&reg)
            .shared_budgets(
                env.a.clone(),
                DailyBudgets {
                    principal: limits,
                    ..DailyBudgets::default()
                },
            )
            .principal(alice())
            .build()
            .unwrap();
        let call = || gate.call(req("models.classify", json!({"text": "x"}), script("a")));
        let first = call().await;
        assert!(
            first.is_ok(),
            "{}: the call ran and was charged: {:?}",
            env.name,
            first.err().map(|e| e.message)
        );
        let day = utc_day(Clock::system().now_ms());
        let ledger = env
            .a
            .get_ledger(&LedgerKey::principal_day("alice", day))
            .await
            .unwrap();
        assert!(
            ledger.used.tokens >= 1_000_000,
            "{}: the spending was not charged: {ledger:?}",
            env.name
        );
        assert!(
            ledger.used.cost_micro_usd >= 10_000_000,
            "{}: the cost was not charged: {ledger:?}",
            env.name
        );
        assert_eq!(ledger.reserved.tokens, 0, "{}: a hold was left", env.name);
        let e = call().await.unwrap_err();
        assert_eq!(e.stage, Stage::Budget, "{}: {}", env.name, e.message);
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{}", env.name);
    }
}

/// Red team: when the store could not take a call's settle (SQLite busy past its timeout, a
/// PostgreSQL hiccup), the result was withheld but what the call spent was never charged: its
/// hold stayed until it ran out 15 minutes later, and then the principal's budget came back
/// whole, though the model call ran and was billed. The spending must reach the ledger once
/// the store answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_the_store_refused_is_charged_once_it_answers_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (clock, manual) = Clock::manual(Clock::system().now_ms());
    let store: Arc<dyn StateStore> = Arc::new(
        SqliteStore::open(
            &path,
            SqliteOptions {
                busy_timeout: std::time::Duration::from_millis(300),
                ..SqliteOptions::default()
            },
            clock,
        )
        .await
        .unwrap(),
    );
    let spent = codemode_spec::Usage {
        input_tokens: 600,
        output_tokens: 400,
        ..Default::default()
    };
    let reg = Registry::new();
    let mut tool = TestTool::model("models.classify", "acme", "small", spent);
    tool.delay_ms = 1000;
    let runs = tool.runs.clone();
    reg.register(Arc::new(tool)).unwrap();
    let gate = builder(&reg)
        .shared_budgets(
            store.clone(),
            DailyBudgets {
                principal: BudgetLimits {
                    max_tokens: Some(1_000_000),
                    ..BudgetLimits::default()
                },
                ..DailyBudgets::default()
            },
        )
        .principal(alice())
        .build()
        .unwrap();
    let call = {
        let gate = gate.clone();
        tokio::spawn(async move {
            gate.call(req("models.classify", json!({"text": "x"}), script("a")))
                .await
        })
    };
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // Another process holds the database's write lock while the call ends.
    let locker = rusqlite::Connection::open(&path).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let e = call.await.unwrap().unwrap_err();
    assert!(e.message.contains("could not be charged"), "{}", e.message);
    locker.execute_batch("ROLLBACK").unwrap();
    drop(locker);

    // The hold runs out; what the call spent must be on the ledger all the same.
    manual.advance(std::time::Duration::from_secs(16 * 60));
    let key = LedgerKey::principal_day("alice", utc_day(Clock::system().now_ms()));
    let started = std::time::Instant::now();
    let ledger = loop {
        let ledger = store.get_ledger(&key).await.unwrap();
        if ledger.used.tokens >= 1000 || started.elapsed() > std::time::Duration::from_secs(20) {
            break ledger;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(
        ledger.used.tokens, 1000,
        "the call ran and spent 1,000 tokens: {ledger:?}"
    );
    assert_eq!(ledger.reserved.tokens, 0, "{ledger:?}");
}
