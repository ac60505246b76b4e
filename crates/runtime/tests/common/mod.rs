//! A whole installation for tests: a gate with a recording hook, test tools, and the models API
//! pointed at the loopback test provider.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use codemode_gate::{
    AuditKey, AuditLog, Budgets, Gate, Hook, HookDecision, HookEvent, PolicySet, Registry,
};
use codemode_models::testing::TestProvider;
use codemode_models::{Catalog, ModelsHttpConfig};
use codemode_runtime::Codemode;
use codemode_spec::{
    BoxFuture, CallFacts, CallKind, CodemodeMode, Exposure, PreparedCall, Tool, ToolError,
    ToolOutput, ToolSpec, prepared,
};
use futures::FutureExt;
use serde_json::{Value, json};

/// The key every test log is written with.
pub fn test_key() -> AuditKey {
    AuditKey::from_bytes([42; 32])
}

pub const PERMIT_ALL: &str = "@id(\"everything\")\npermit (principal, action, resource);\n";

/// A tool that resolves to its arguments.
pub struct Echo(pub ToolSpec);

impl Echo {
    pub fn tool(name: &str, kind: CallKind, exposure: Exposure) -> Arc<dyn Tool> {
        let mut spec = ToolSpec::new(name, format!("Echo tool {name}"), json!({"type": "object"}));
        spec.kind = kind;
        spec.exposure = exposure;
        Arc::new(Echo(spec))
    }
}

impl Tool for Echo {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        Ok(prepared(CallFacts::default(), move |_| {
            async move { Ok(ToolOutput::value(args)) }.boxed()
        }))
    }
}

/// Records every call the gate shows hooks, and can deny calls by name.
#[derive(Default)]
pub struct Recorder {
    pub seen: Mutex<Vec<HookEvent>>,
    pub deny: Mutex<Vec<String>>,
}

impl Recorder {
    pub fn names(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|e| e.tool_name.clone())
            .collect()
    }
}

impl Hook for Recorder {
    fn before<'a>(&'a self, ev: &'a HookEvent) -> BoxFuture<'a, HookDecision> {
        self.seen.lock().unwrap().push(ev.clone());
        let denied = self.deny.lock().unwrap().contains(&ev.tool_name);
        async move {
            if denied {
                HookDecision::Deny(format!("the test hook denies {}", ev.tool_name))
            } else {
                HookDecision::Allow
            }
        }
        .boxed()
    }
}

pub fn catalog_json(base_url: &str) -> Value {
    json!({
        "providers": { "p": { "api": "openai-compatible", "baseUrl": base_url, "apiKeyEnv": "CARGO_PKG_NAME" } },
        "models": [
            { "provider": "p", "id": "judge", "type": "classifier", "input": ["text"], "price": { "input": 1.0, "output": 4.0 } },
            { "provider": "p", "id": "painter", "type": "image", "price": { "image": 0.04 } }
        ]
    })
}

pub struct World {
    pub codemode: Codemode,
    pub recorder: Arc<Recorder>,
    pub provider: TestProvider,
    pub audit: tempfile::TempPath,
}

pub struct Options {
    pub policy: String,
    pub budgets: Budgets,
    pub mode: CodemodeMode,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            policy: PERMIT_ALL.into(),
            budgets: Budgets::default(),
            mode: CodemodeMode::On,
        }
    }
}

pub async fn world(opts: Options) -> World {
    let provider = TestProvider::start().await.unwrap();
    let registry = Registry::new();
    registry
        .register(Echo::tool("echo", CallKind::Tool, Exposure::Codemode))
        .unwrap();
    registry
        .register(Echo::tool("my-tool", CallKind::Tool, Exposure::Codemode))
        .unwrap();
    registry
        .register(Echo::tool("lookup", CallKind::Tool, Exposure::Deferred))
        .unwrap();
    registry
        .register(Echo::tool("shell", CallKind::Tool, Exposure::Direct))
        .unwrap();
    registry
        .register(Echo::tool("secret", CallKind::Tool, Exposure::Hidden))
        .unwrap();
    registry
        .register(Echo::tool("notify", CallKind::Global, Exposure::Codemode))
        .unwrap();
    let recorder = Arc::new(Recorder::default());
    let audit = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("test.cedar", &opts.policy).unwrap())
        .hook(recorder.clone())
        .budgets(opts.budgets)
        .mode(opts.mode)
        .audit(AuditLog::open_with_key(&audit, test_key()).unwrap())
        .build()
        .unwrap();
    let catalog = Catalog::from_json(&catalog_json(&provider.base_url())).unwrap();
    let codemode = Codemode::builder()
        .gate(gate)
        .models(Arc::new(catalog), ModelsHttpConfig::default())
        .build()
        .unwrap();
    World {
        codemode,
        recorder,
        provider,
        audit,
    }
}

pub fn audit_lines(world: &World) -> Vec<Value> {
    std::fs::read_to_string(&world.audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub const CLASSIFY_CONTEXT: &str = r#"{ state: { review: "great" }, questions: { mood: { type: "choice", instructions: "Mood?", criteria: { happy: "likes it", sad: "does not" } } } }"#;

/// Runs only once the test adds a permit to `release`; says it started through `started`.
pub struct Slow {
    pub spec: ToolSpec,
    pub started: Arc<tokio::sync::Semaphore>,
    pub release: Arc<tokio::sync::Semaphore>,
}

impl Tool for Slow {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    fn prepare(&self, _args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let (started, release) = (self.started.clone(), self.release.clone());
        Ok(prepared(CallFacts::default(), move |_| {
            async move {
                started.add_permits(1);
                let _ = release.acquire().await.map(|p| p.forget());
                Ok(ToolOutput::value(json!({})))
            }
            .boxed()
        }))
    }
}

/// A SQLite state store in `dir`.
pub async fn sqlite_store(dir: &std::path::Path) -> Arc<dyn codemode_state::StateStore> {
    codemode_state::open(
        &format!("sqlite://{}", dir.join("state.db").display()),
        Default::default(),
    )
    .await
    .unwrap()
}

/// Approves a paused call from the command line, as a person would while no process holds its
/// cell.
pub async fn approve_in_store(store: &dyn codemode_state::StateStore, approval_id: &str) {
    codemode_runtime::cells::answer_approval(
        store,
        &AuditLog::disabled(),
        approval_id,
        codemode_state::Decision::Approve,
        "alice",
        "cli",
        None,
    )
    .await
    .unwrap();
}

/// The cell's last report, once it ended (waiting up to 100 times 2 s).
pub async fn ended_cell(
    codemode: &Codemode,
    session: &str,
    cell: &str,
) -> codemode_runtime::CellReport {
    for _ in 0..100 {
        let wait = codemode_runtime::WaitOptions {
            timeout: Some(std::time::Duration::from_secs(2)),
            terminate: false,
        };
        let report = codemode.wait_cell(session, cell, wait).await.unwrap();
        if report.status.is_terminal() {
            return report;
        }
    }
    panic!("cell {cell} did not end");
}
