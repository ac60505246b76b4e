//! A model call a cell made before its process stopped counts its tokens again when another
//! process rebuilds the cell from its replay log. Counting it only as a call would hand the
//! rebuilt script a fresh token budget: a script that spent its tokens, then waited for an
//! approval long enough for a takeover, could spend them all again.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use codemode_gate::{BudgetLimits, Budgets, Gate, PolicySet, Registry};
use codemode_models::testing::TestProvider;
use codemode_models::{Catalog, ModelsHttpConfig};
use codemode_runtime::{Cells, CellsConfig, Codemode, ScriptRequest};
use codemode_spec::{CallKind, Exposure};
use codemode_state::{CellStatus, StateStore};
use common::{CLASSIFY_CONTEXT, Echo, catalog_json};

const POLICY: &str = r#"
@id("models-run")
permit (principal, action == Action::"model_call", resource);
@id("danger-needs-a-person")
@ask("danger changes things")
permit (principal, action == Action::"tool_call", resource == Tool::"danger");
"#;

const LEASE: Duration = Duration::from_millis(600);

/// One codemode process on the shared store, with a script budget of `max_tokens`.
async fn process(
    store: Arc<dyn StateStore>,
    provider: &TestProvider,
    max_tokens: Option<u64>,
) -> Codemode {
    let registry = Registry::new();
    registry
        .register(Echo::tool("danger", CallKind::Tool, Exposure::Codemode))
        .unwrap();
    let mut config = CellsConfig::new(store);
    config.pause_approvals = true;
    config.lease = LEASE;
    let cells = Cells::new(config);
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("cells.cedar", POLICY).unwrap())
        .approver(cells.approver(None))
        .budgets(Budgets {
            script: BudgetLimits {
                max_tokens,
                ..BudgetLimits::default()
            },
            ..Budgets::default()
        })
        .build()
        .unwrap();
    let catalog = Catalog::from_json(&catalog_json(&provider.base_url())).unwrap();
    Codemode::builder()
        .gate(gate)
        .models(Arc::new(catalog), ModelsHttpConfig::default())
        .cells(cells)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_cell_counts_the_tokens_its_replayed_model_calls_spent() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::sqlite_store(dir.path()).await;
    let provider = TestProvider::start().await.unwrap();
    provider.configure(|k| k.usage = Some((1_000, 0)));

    // Two model calls (2,000 tokens), then a call that waits for a person, then a third model
    // call, which the budget of 2,000 tokens must refuse wherever the script runs.
    let code = format!(
        r#"const m = {{ provider: "p", id: "judge" }};
await models.classify(m, {CLASSIFY_CONTEXT});
await models.classify(m, {CLASSIFY_CONTEXT});
await tools.danger({{}});
try {{ await models.classify(m, {CLASSIFY_CONTEXT}); return "ran again"; }}
catch (e) {{ return "refused: " + e.message; }}"#
    );
    let first = process(store.clone(), &provider, None).await;
    let started = first
        .start_cell(ScriptRequest::new(code, "s"))
        .await
        .unwrap();
    assert_eq!(
        started.status,
        CellStatus::WaitingForApproval,
        "{}",
        started.text
    );
    assert_eq!(provider.requests().len(), 2);

    // The first process stops; the approval is answered; another process takes the cell over
    // with a script budget of exactly what the two replayed calls spent.
    first.cells().unwrap().abandon();
    common::approve_in_store(store.as_ref(), &started.pending[0].approval_id).await;
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    let second = process(store.clone(), &provider, Some(2_000)).await;
    assert_eq!(
        second.resume_cells().await.unwrap(),
        vec![started.cell.clone()]
    );
    let last = common::ended_cell(&second, "s", &started.cell).await;
    assert_eq!(last.status, CellStatus::Finished, "{}", last.text);
    let value = last.structured()["value"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        value.starts_with("refused:") && value.contains("max_tokens"),
        "the third model call must be refused by the token budget the replayed calls used up: {value}"
    );
    assert_eq!(
        provider.requests().len(),
        2,
        "no model request was made again"
    );
}
