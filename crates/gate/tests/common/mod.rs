//! Test tools and helpers shared by the gate's integration tests.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use codemode_gate::{
    ApprovalAnswer, ApprovalRequest, Approver, AuditKey, AuditLog, CallRequest, Gate, GateBuilder,
    PolicySet, Registry,
};
use codemode_spec::{
    Annotations, BoxFuture, CallFacts, CallKind, Exposure, ModelFacts, Origin, PreparedCall,
    Provenance, Tool, ToolError, ToolOutput, ToolSpec, Usage, prepared,
};
use serde_json::{Value, json};

type Facts = dyn Fn(&Value) -> Result<CallFacts, ToolError> + Send + Sync;

/// A tool that echoes its arguments, counts its executions and may report usage.
pub struct TestTool {
    pub spec: ToolSpec,
    pub runs: Arc<AtomicUsize>,
    pub usage: Option<Usage>,
    pub facts: Option<Box<Facts>>,
    pub delay_ms: u64,
    pub seen: Arc<Mutex<Vec<Value>>>,
}

impl TestTool {
    pub fn new(name: &str, schema: Value) -> Self {
        TestTool {
            spec: ToolSpec::new(name, format!("test tool {name}"), schema),
            runs: Arc::new(AtomicUsize::new(0)),
            usage: None,
            facts: None,
            delay_ms: 0,
            seen: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub fn description(mut self, d: &str) -> Self {
        self.spec.description = d.to_string();
        self
    }

    pub fn exposure(mut self, e: Exposure) -> Self {
        self.spec.exposure = e;
        self
    }

    pub fn read_only(mut self) -> Self {
        self.spec.annotations = Annotations {
            read_only_hint: Some(true),
            ..Default::default()
        };
        self
    }

    /// A model operation spending on `provider/id`, reporting `usage` per call.
    pub fn model(name: &str, provider: &str, id: &str, usage: Usage) -> Self {
        let mut t = TestTool::new(
            name,
            json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
        );
        t.spec.kind = CallKind::Model;
        t.usage = Some(usage);
        let facts = ModelFacts {
            provider: provider.into(),
            id: id.into(),
            model_type: "classifier".into(),
            input_price: 0.15,
            output_price: 0.6,
            image_price: 0.0,
            ..Default::default()
        };
        t.facts = Some(Box::new(move |_| {
            Ok(CallFacts {
                model: Some(facts.clone()),
                ..Default::default()
            })
        }));
        t
    }

    /// Facts that canonicalize `args.path` against `root`, as real file tools do.
    pub fn with_path_facts(mut self, root: &Path) -> Self {
        let root = root.to_path_buf();
        self.facts = Some(Box::new(move |args| {
            let raw = args.get("path").and_then(Value::as_str).unwrap_or("");
            let joined = root.join(raw);
            // Resolve the deepest existing ancestor, then append the rest.
            let mut existing = joined.clone();
            let mut rest = Vec::new();
            while !existing.exists() {
                match (existing.file_name(), existing.parent()) {
                    (Some(n), Some(p)) => {
                        rest.push(n.to_os_string());
                        existing = p.to_path_buf();
                    }
                    _ => break,
                }
            }
            let mut resolved = std::fs::canonicalize(&existing)
                .map_err(|e| ToolError::invalid(format!("cannot resolve {raw}: {e}")))?;
            for part in rest.iter().rev() {
                if part == ".." {
                    resolved.pop();
                } else {
                    resolved.push(part);
                }
            }
            Ok(CallFacts {
                paths: vec![resolved.display().to_string()],
                ..Default::default()
            })
        }));
        self
    }
}

impl Tool for TestTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let facts = match &self.facts {
            Some(f) => f(&args)?,
            None => CallFacts::default(),
        };
        let runs = self.runs.clone();
        let usage = self.usage.clone();
        let delay = self.delay_ms;
        let seen = self.seen.clone();
        Ok(prepared(facts, move |_| {
            Box::pin(async move {
                runs.fetch_add(1, Ordering::SeqCst);
                seen.lock().unwrap().push(args.clone());
                if delay > 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                }
                Ok(ToolOutput {
                    value: json!({"echo": args}),
                    content: None,
                    is_error: false,
                    usage,
                    held: Default::default(),
                })
            })
        }))
    }
}

pub fn object_schema() -> Value {
    json!({"type": "object", "properties": {"path": {"type": "string"}}, "additionalProperties": false})
}

static NEXT: AtomicUsize = AtomicUsize::new(1);

/// Provenance of a script call.
pub fn script(script_id: &str) -> Provenance {
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    Provenance {
        call_id: format!("cm-1/{n}"),
        parent_call_id: Some("cm-1".into()),
        depth: 1,
        origin: Origin::Script,
        script_id: Some(script_id.into()),
        script_hash: Some("abc123".into()),
        session_id: "s1".into(),
        seq: Some(n as u64),
        client: Some("test".into()),
    }
}

pub fn model_origin() -> Provenance {
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    Provenance::model(format!("m-{n}"), "s1")
}

pub fn req(name: &str, args: Value, p: Provenance) -> CallRequest {
    CallRequest::new(name, args, p)
}

/// Policies that permit every call, for tests about other stages.
pub fn permit_all() -> PolicySet {
    PolicySet::parse(
        "all.cedar",
        "@id(\"all\") permit(principal, action, resource);",
    )
    .unwrap()
}

pub fn builder(reg: &Registry) -> GateBuilder {
    Gate::builder().registry(reg.clone()).policy(permit_all())
}

/// The key every test log is written with.
pub fn test_key() -> AuditKey {
    AuditKey::from_bytes([42; 32])
}

pub fn audit_in(dir: &Path) -> (AuditLog, std::path::PathBuf) {
    let path = dir.join("audit.jsonl");
    (AuditLog::open_with_key(&path, test_key()).unwrap(), path)
}

pub fn audit_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Answers every question with a fixed answer and remembers the questions.
pub struct FixedApprover {
    pub answer: ApprovalAnswer,
    pub asked: Mutex<Vec<ApprovalRequest>>,
    pub delay_ms: u64,
}

impl FixedApprover {
    pub fn new(answer: ApprovalAnswer) -> Arc<Self> {
        Arc::new(FixedApprover {
            answer,
            asked: Mutex::new(Vec::new()),
            delay_ms: 0,
        })
    }
}

impl Approver for FixedApprover {
    fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, ApprovalAnswer> {
        Box::pin(async move {
            self.asked.lock().unwrap().push(req.clone());
            if self.delay_ms > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(self.delay_ms)).await;
            }
            self.answer
        })
    }
}
