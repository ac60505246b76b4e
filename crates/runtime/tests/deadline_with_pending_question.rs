//! A script's deadline stands still while it waits for a person, but only then. A script that
//! starts a call needing approval, never awaits it, and goes on calling other tools is not
//! waiting for anyone: its time counts. Otherwise one unanswered question (an hour, for a
//! paused approval) would lift `timeout_ms` from everything else the script does.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use codemode_gate::{ApprovalAnswer, ApprovalRequest, Approver, Gate, PolicySet, Registry};
use codemode_runtime::{Codemode, ScriptRequest};
use codemode_spec::{
    BoxFuture, CallFacts, CallKind, Exposure, PreparedCall, Tool, ToolError, ToolOutput, ToolSpec,
    prepared,
};
use common::Echo;
use futures::FutureExt;
use serde_json::{Value, json};

const POLICY: &str = r#"
@id("ticks-run")
permit (principal, action == Action::"tool_call", resource == Tool::"tick");
@id("ask-needs-a-person")
@ask("it changes things")
permit (principal, action == Action::"tool_call", resource == Tool::"ask");
"#;

/// Answers "no" after `after`, as a person slow to read the question.
struct SlowNo {
    after: Duration,
}

impl Approver for SlowNo {
    fn approve<'a>(&'a self, _req: &'a ApprovalRequest) -> BoxFuture<'a, ApprovalAnswer> {
        async move {
            tokio::time::sleep(self.after).await;
            ApprovalAnswer::No
        }
        .boxed()
    }
}

/// Takes 50 ms.
struct Tick(ToolSpec);

impl Tool for Tick {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn prepare(&self, _args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        Ok(prepared(CallFacts::default(), |_| {
            async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(ToolOutput::value(json!(1)))
            }
            .boxed()
        }))
    }
}

fn codemode() -> Codemode {
    codemode_in(codemode_sandbox::Isolation::Process)
}

fn codemode_in(isolation: codemode_sandbox::Isolation) -> Codemode {
    let registry = Registry::new();
    let mut tick = ToolSpec::new("tick", "Takes 50 ms", json!({"type": "object"}));
    tick.exposure = Exposure::Codemode;
    registry.register(Arc::new(Tick(tick))).unwrap();
    registry
        .register(Echo::tool("ask", CallKind::Tool, Exposure::Codemode))
        .unwrap();
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("p.cedar", POLICY).unwrap())
        .approver(Arc::new(SlowNo {
            after: Duration::from_secs(4),
        }))
        .build()
        .unwrap();
    let sandbox = codemode_sandbox::SandboxConfig {
        isolation,
        ..Default::default()
    };
    Codemode::builder()
        .gate(gate)
        .sandbox_config(sandbox)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_left_pending_does_not_lift_the_deadline_from_other_calls() {
    let codemode = codemode();
    // 40 ticks take 2 s, four times the deadline, all while the question is pending.
    let code = r#"// @options: {"timeout_ms": 500}
tools.ask({}).catch(() => {});
let n = 0;
for (let i = 0; i < 40; i++) n += await tools.tick({});
return n;"#;
    let run = codemode.run_script(ScriptRequest::new(code, "s")).await;
    assert!(
        run.is_error && run.text.contains("timed out"),
        "the ticks ran past the deadline while a question was pending: {}",
        run.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_waiting_only_for_a_person_keeps_its_deadline() {
    waiting_only_for_a_person(codemode()).await;
}

/// The VM's thread waits idle while the person reads: its CPU clock does not move, so the
/// deadline stands still in thread isolation too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_on_a_thread_waiting_only_for_a_person_keeps_its_deadline() {
    waiting_only_for_a_person(codemode_in(codemode_sandbox::Isolation::Thread)).await;
}

async fn waiting_only_for_a_person(codemode: Codemode) {
    // The person takes 4 s against a 1 s deadline: that wait does not count.
    let code = r#"// @options: {"timeout_ms": 1000}
const said = await tools.ask({}).then(() => "yes", (e) => e.stage);
return said + " " + (await tools.tick({}));"#;
    let run = codemode.run_script(ScriptRequest::new(code, "s")).await;
    assert!(!run.is_error, "{}", run.text);
    assert!(run.text.contains("approval 1"), "{}", run.text);
}

/// Red team: the clock stood still while the one call in flight waited for a person, whatever
/// the script did meanwhile. A script that leaves a question pending and computes in
/// JavaScript makes no call, so nothing told the clock it was running: it ran on past its
/// deadline for as long as the person took (an hour for a paused approval), bounded only by
/// the CPU budget. The VM's CPU time now counts while the clock stands still.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_computing_while_a_question_is_pending_keeps_its_deadline() {
    computing_while_a_question_is_pending(codemode()).await;
}

/// The same in thread isolation, where the VM's thread, not a worker process, computes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_computing_on_a_thread_while_a_question_is_pending_keeps_its_deadline() {
    computing_while_a_question_is_pending(codemode_in(codemode_sandbox::Isolation::Thread)).await;
}

/// Computing in bursts between short awaits, with the question pending throughout, is time
/// counted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn computing_in_bursts_while_a_question_is_pending_keeps_the_deadline() {
    let codemode = codemode();
    let code = r#"// @options: {"timeout_ms": 500}
tools.ask({}).catch(() => {});
for (;;) {
  let n = 0;
  for (let i = 0; i < 100000; i++) n += i;
  await Promise.resolve(n);
}"#;
    let started = std::time::Instant::now();
    let run = codemode.run_script(ScriptRequest::new(code, "s")).await;
    assert!(
        run.is_error && run.text.contains("timed out"),
        "{}",
        run.text
    );
    assert!(
        started.elapsed() < Duration::from_millis(2_500),
        "{:?}",
        started.elapsed()
    );
}

async fn computing_while_a_question_is_pending(codemode: Codemode) {
    let code = r#"// @options: {"timeout_ms": 500}
tools.ask({}).catch(() => {});
let n = 0;
for (;;) n++;"#;
    let started = std::time::Instant::now();
    let run = codemode.run_script(ScriptRequest::new(code, "s")).await;
    let took = started.elapsed();
    assert!(
        run.is_error && run.text.contains("timed out"),
        "{}",
        run.text
    );
    // The person answers after 4 s; the script may not compute for all of it.
    assert!(
        took < Duration::from_millis(2_500),
        "a 500 ms script computed for {took:?} while a question was pending"
    );
}
