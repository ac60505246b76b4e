//! The state store's tests. `suite` holds the behaviour every backend must have and runs once
//! per backend below; `sqlite_files` and `postgres_only` attack what only one backend has.
//! PostgreSQL tests need CODEMODE_TEST_POSTGRES_URL (`scripts/with-postgres` sets it) and say
//! so on stderr when it is missing.

mod harness;
mod postgres_leases;
mod postgres_only;
mod session_races;
mod sqlite_files;
mod suite;

/// One `#[tokio::test]` per suite function, for one backend.
macro_rules! suite_for {
    ($backend:ident: $($test:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let Some(env) = crate::harness::Env::$backend().await else { return };
                    crate::suite::$test(env).await;
                }
            )*
        }
    };
}

macro_rules! race_for {
    ($backend:ident: $($test:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let Some(env) = crate::harness::Env::$backend().await else { return };
                    crate::session_races::$test(env).await;
                }
            )*
        }
    };
}

macro_rules! every_backend {
    ($($test:ident),* $(,)?) => {
        suite_for!(memory: $($test),*);
        suite_for!(sqlite: $($test),*);
        suite_for!(postgres: $($test),*);
    };
}

every_backend!(
    ended_cells_and_answered_approvals_are_pruned,
    sessions_and_store,
    store_limits_hold_under_concurrent_writers,
    cells_are_fenced_by_lease,
    a_session_end_ends_its_cells_held_elsewhere,
    live_cells_per_session_are_bounded_under_races,
    replay_log_continues_exactly,
    approvals_are_exact_and_answered_once,
    approvals_keep_their_resolved_paths_and_are_bound_to_them,
    two_approvers_at_once_one_wins,
    approvals_expire_once_into_denials,
    an_answer_on_one_replica_wakes_the_other,
    a_cell_finished_on_one_replica_wakes_a_waiter_on_the_other,
    budgets_reserve_settle_release,
    budget_holds_of_a_dead_replica_expire,
    thousand_reservations_two_replicas_budget_of_ten,
    bad_budget_requests_are_refused_clearly,
    audit_streams_chain_and_read_back,
    concurrent_audit_appends_make_one_chain,
    ids_are_checked,
);

/// Session-end races between replicas, for each backend.
mod session_end_races {
    race_for!(memory: a_cell_started_as_its_session_ends_never_outlives_it, touching_a_session_as_it_is_deleted_never_revives_it, an_ended_session_refuses_to_come_back);
    race_for!(sqlite: a_cell_started_as_its_session_ends_never_outlives_it, touching_a_session_as_it_is_deleted_never_revives_it, an_ended_session_refuses_to_come_back);
    race_for!(postgres: a_cell_started_as_its_session_ends_never_outlives_it, touching_a_session_as_it_is_deleted_never_revives_it, an_ended_session_refuses_to_come_back);
}
