//! What the gate keeps per session (its principal, "always" answers, counters) is dropped when
//! the session ends, so a client that opens and abandons sessions in bursts does not grow the
//! host's memory without bound; but a call still running when its session ended keeps acting
//! for the session's principal until it ends, never for the process's default one.

use crate::common;
use common::*;

use std::sync::Arc;
use std::time::Duration;

use codemode_gate::{ApprovalAnswer, Gate, PolicySet, Principal, Registry};
use codemode_spec::{
    CallFacts, Exposure, PreparedCall, Provenance, Tool, ToolError, ToolOutput, ToolSpec, prepared,
};
use futures::FutureExt;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

const POLICY: &str = r#"
@id("ask-writes")
@ask("writes change things")
permit (principal, action == Action::"tool_call", resource == Tool::"write");
permit (principal, action == Action::"tool_call", resource == Tool::"slow");
"#;

fn alice() -> Principal {
    Principal {
        id: "alice".into(),
        team: Some("infra".into()),
    }
}

fn shared_default() -> Principal {
    Principal {
        id: "shared-default".into(),
        team: None,
    }
}

/// Runs only once the test adds a permit to `release`; says it started through `started`.
struct Slow {
    spec: ToolSpec,
    started: Arc<Semaphore>,
    release: Arc<Semaphore>,
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

#[tokio::test]
async fn ended_sessions_leave_no_principal_always_answer_or_counter_behind() {
    let reg = Registry::new();
    reg.register(Arc::new(
        TestTool::new("write", object_schema()).exposure(Exposure::Direct),
    ))
    .unwrap();
    let always = FixedApprover::new(ApprovalAnswer::Always);
    let gate = Gate::builder()
        .registry(reg)
        .policy(PolicySet::parse("p.cedar", POLICY).unwrap())
        .approver(always.clone())
        .principal(Some(shared_default()))
        .build()
        .unwrap();
    let sessions: Vec<String> = (0..50).map(|i| format!("burst-{i}")).collect();
    for (i, s) in sessions.iter().enumerate() {
        gate.set_principal(s, alice());
        for n in 0..2 {
            let p = Provenance::model(format!("m-{i}-{n}"), s.as_str());
            gate.call(req("write", json!({}), p)).await.unwrap();
        }
    }
    // A direct call's "always" approves that call alone: every call is asked.
    assert_eq!(always.asked.lock().unwrap().len(), 2 * sessions.len());
    assert_eq!(gate.remembered_sessions(), sessions.len());

    for s in &sessions {
        gate.forget_session(s);
    }
    assert_eq!(
        gate.remembered_sessions(),
        0,
        "ended sessions must leave nothing behind"
    );
}

#[tokio::test]
async fn a_call_running_when_its_session_ended_acts_for_its_principal_to_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let (audit, path) = audit_in(dir.path());
    let started = Arc::new(Semaphore::new(0));
    let release = Arc::new(Semaphore::new(0));
    let reg = Registry::new();
    let mut spec = ToolSpec::new("slow", "waits", json!({"type": "object"}));
    spec.exposure = Exposure::Direct;
    reg.register(Arc::new(Slow {
        spec,
        started: started.clone(),
        release: release.clone(),
    }))
    .unwrap();
    let gate = Gate::builder()
        .registry(reg)
        .policy(PolicySet::parse("p.cedar", POLICY).unwrap())
        .principal(Some(shared_default()))
        .audit(audit)
        .build()
        .unwrap();
    gate.set_principal("s", alice());
    let running = {
        let gate = gate.clone();
        tokio::spawn(async move {
            let p = Provenance::model("m-1", "s");
            gate.call(req("slow", json!({}), p)).await
        })
    };
    tokio::time::timeout(Duration::from_secs(10), started.acquire())
        .await
        .expect("the call starts within 10 s")
        .unwrap()
        .forget();

    // The session ends (its client's DELETE, its idle expiry, eviction) while the call runs.
    gate.forget_session("s");
    assert_eq!(
        gate.principal_of("s").map(|p| p.id).as_deref(),
        Some("alice"),
        "a call still running keeps the session's principal"
    );
    release.add_permits(1);
    running.await.unwrap().unwrap();

    let lines = audit_lines(&path);
    let line = lines.iter().find(|l| l["tool"] == "slow").unwrap();
    assert_eq!(line["principal"], "alice", "{line}");
    // The call ended: nothing of the session is left.
    assert_eq!(gate.remembered_sessions(), 0);
    assert_eq!(
        gate.principal_of("s").map(|p| p.id).as_deref(),
        Some("shared-default")
    );
}

/// A principal lent for what runs of a session (a cell taken over) goes with the last hold,
/// unless a client began the session here meanwhile; lending never replaces a principal the
/// session already has here.
#[test]
fn a_lent_principal_lasts_as_long_as_what_runs_unless_a_client_begins_the_session() {
    let gate = Gate::builder()
        .registry(Registry::new())
        .policy(PolicySet::parse("p.cedar", "").unwrap())
        .build()
        .unwrap();
    let bob = Principal {
        id: "bob".into(),
        team: None,
    };

    gate.lend_principal("taken-over", alice());
    let hold = gate.hold_session("taken-over");
    assert_eq!(gate.principal_of("taken-over"), Some(alice()));
    drop(hold);
    assert_eq!(
        gate.principal_of("taken-over"),
        None,
        "forgotten with the hold"
    );
    assert_eq!(gate.remembered_sessions(), 0);

    gate.lend_principal("moved", alice());
    let hold = gate.hold_session("moved");
    gate.set_principal("moved", alice());
    drop(hold);
    assert_eq!(
        gate.principal_of("moved"),
        Some(alice()),
        "its client reached this process: the session is served here now"
    );

    gate.set_principal("served", alice());
    gate.lend_principal("served", bob);
    let hold = gate.hold_session("served");
    drop(hold);
    assert_eq!(gate.principal_of("served"), Some(alice()));
}
