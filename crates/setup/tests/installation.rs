//! An installation from real configuration files, with real MCP servers from the testbed.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use codemode_config::ConfigPaths;
use codemode_gate::{CallRequest, Stage};
use codemode_mcp::ServerState;
use codemode_setup::Installation;
use codemode_spec::{Exposure, Provenance};
use serde_json::{Value, json};

const TESTBED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testbed/node_modules");
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../mcp/tests/fixtures/misbehaving-server.cjs"
);

struct Dirs {
    _tmp: tempfile::TempDir,
    paths: ConfigPaths,
    project: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let paths = ConfigPaths::new(tmp.path().join("config"), tmp.path().join("state"));
    let project = tmp.path().join("project");
    std::fs::create_dir_all(&paths.config_dir).unwrap();
    std::fs::create_dir_all(project.join(".codemode")).unwrap();
    std::fs::write(project.join("notes.txt"), "hello").unwrap();
    Dirs {
        paths,
        project,
        _tmp: tmp,
    }
}

impl Dirs {
    fn user(&self, file: &str, v: Value) -> &Self {
        std::fs::write(self.paths.config_dir.join(file), v.to_string()).unwrap();
        self
    }
    fn project(&self, file: &str, text: &str) -> &Self {
        std::fs::write(self.project.join(".codemode").join(file), text).unwrap();
        self
    }
    fn builder(&self) -> codemode_setup::InstallationBuilder {
        Installation::builder(&self.project).config_paths(self.paths.clone())
    }
}

/// An installation with the fixture server `bad` in its churning mode, its tool `disabled`
/// turned off in the user's settings, and the server ready. Keep the directories alive.
async fn churn_server_without(disabled: &str) -> (Dirs, Installation) {
    let d = dirs();
    d.user(
        "mcp.json",
        json!({"mcpServers": {"bad": {"command": "node", "args": [FIXTURE, TESTBED, "churn"]}}}),
    );
    d.user(
        "settings.json",
        json!({"tools": {disabled: {"disabled": true}}}),
    );
    let inst = d.builder().build().await.unwrap();
    inst.servers_ready().await.unwrap();
    (d, inst)
}

/// Calls `tool` (which changes the server's tool list) and waits until the change is announced.
async fn call_and_see_tools_change(
    gate: &codemode_gate::Gate,
    changed: &mut tokio::sync::watch::Receiver<u64>,
    tool: &str,
) {
    gate.call(script_call(tool, json!({}))).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), changed.changed())
        .await
        .expect("the change is announced")
        .unwrap();
}

fn script_call(name: &str, args: Value) -> CallRequest {
    let mut p = Provenance::model("c1", "s1");
    p.origin = codemode_spec::Origin::Script;
    p.depth = 1;
    p.script_id = Some("script-1".into());
    CallRequest::new(name, args, p)
}

#[tokio::test]
async fn an_untrusted_projects_permit_is_ignored_and_its_forbids_apply() {
    let d = dirs();
    d.project("settings.json", r#"{"policy": ["mine.cedar"]}"#).project(
        "mine.cedar",
        "@id(\"no-ls\") forbid(principal, action, resource == Tool::\"ls\");\n@id(\"everything\") permit(principal, action, resource);\n",
    );
    let inst = d.builder().build().await.expect("start-up goes on");
    let warnings = inst.warnings().join("\n");
    assert!(
        warnings.contains("mine.cedar: ignored `permit policy `everything` (line 2)`")
            && warnings.contains("codemode trust"),
        "the same warning as every other widening: {warnings}"
    );
    let err = inst
        .gate()
        .call(script_call("ls", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Policy);
    assert_eq!(err.policy_ids, ["no-ls"], "{}", err.message);
    // The built-in policy still decides the rest: read-only tools run, writes need a person.
    inst.gate()
        .call(script_call("read", json!({"path": "notes.txt"})))
        .await
        .unwrap();
    let err = inst
        .gate()
        .call(script_call(
            "write",
            json!({"path": "x.txt", "content": "x"}),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Approval, "{}", err.message);
    inst.shutdown().await;
}

#[tokio::test]
async fn build_returns_before_servers_connect_and_tool_changes_are_followed() {
    let d = dirs();
    d.user(
        "mcp.json",
        json!({"mcpServers": {
            "bad": {"command": "node",
                    // Expanded when the server starts: cargo sets CARGO_MANIFEST_DIR for tests.
                    "args": ["${env:CARGO_MANIFEST_DIR}/../mcp/tests/fixtures/misbehaving-server.cjs", TESTBED],
                    "toolExposure": {"hang": "hidden"}},
            "slow": {"command": "sleep", "args": ["30"], "connectTimeoutMs": 1500},
            "off": {"command": "/nonexistent/never-started", "disabled": true}
        }}),
    );
    d.user(
        "settings.json",
        json!({"tools": {"bash": {"disabled": true}}}),
    );
    let started = Instant::now();
    let inst = d.builder().build().await.unwrap();
    let built = started.elapsed();
    assert!(
        built < Duration::from_millis(1500),
        "the slow server is not waited for: {built:?}"
    );
    let changed = inst.tools_changed();
    assert_eq!(*changed.borrow(), 0);
    inst.servers_ready().await.unwrap();
    assert!(
        *inst.tools_changed().borrow() >= 1,
        "the arrival is announced"
    );

    let status = inst.mcp_status();
    let state = |n: &str| status.iter().find(|s| s.name == n).unwrap().state.clone();
    assert!(
        matches!(state("bad"), ServerState::Connected { .. }),
        "{status:?}"
    );
    assert!(matches!(state("off"), ServerState::Disabled), "{status:?}");
    let ServerState::Failed(why) = state("slow") else {
        panic!("{status:?}")
    };
    assert!(
        why.contains("connectTimeoutMs") && why.contains("mcp.json"),
        "{why}"
    );
    let warnings = inst.warnings().join("\n");
    assert!(
        warnings.contains("MCP server `slow` is not connected"),
        "{warnings}"
    );

    // Hidden tools are listed with the reason, MCP and built-in alike.
    let tools = inst.tools();
    let hidden = |name: &str| {
        tools
            .iter()
            .find(|t| t.spec.name == name)
            .unwrap_or_else(|| panic!("{name} is not listed"))
            .clone()
    };
    let hang = hidden("mcp__bad__hang");
    assert_eq!(hang.spec.exposure, Exposure::Hidden);
    assert!(
        hang.hidden_by
            .as_deref()
            .unwrap()
            .contains("MCP server \"bad\""),
        "{:?}",
        hang.hidden_by
    );
    let bash = hidden("bash");
    assert!(
        bash.hidden_by.as_deref().unwrap().contains("disabled in"),
        "{:?}",
        bash.hidden_by
    );
    let err = inst
        .gate()
        .call(script_call("mcp__bad__hang", json!({})))
        .await
        .unwrap_err();
    assert!(
        err.message.contains("hidden by configuration"),
        "{}",
        err.message
    );

    // A tool the server adds later is registered, and the change is announced.
    let mut changed = inst.tools_changed();
    changed.borrow_and_update();
    let gate = inst.gate().clone();
    let policy =
        codemode_gate::PolicySet::parse("all", "permit(principal, action, resource);").unwrap();
    gate.set_policy(policy).unwrap();
    call_and_see_tools_change(&gate, &mut changed, "mcp__bad__add_tool").await;
    assert!(
        inst.tools()
            .iter()
            .any(|t| t.spec.name == "mcp__bad__extra")
    );
    inst.shutdown().await;
}

#[tokio::test]
async fn the_env_default_reaches_the_server() {
    let d = dirs();
    d.user(
        "mcp.json",
        json!({"mcpServers": {"bad": {"command": "node", "args": [FIXTURE, TESTBED],
            "env": {"GREETING": "${CODEMODE_TEST_SURELY_UNSET_7Q3:-hello from the default}"}}}}),
    );
    let policy = d.paths.config_dir.join("all.cedar");
    std::fs::write(&policy, "permit(principal, action, resource);").unwrap();
    let inst = d
        .builder()
        .command_line(codemode_config::CommandLine {
            policy_files: vec![policy],
            ..Default::default()
        })
        .build()
        .await
        .unwrap();
    inst.servers_ready().await.unwrap();
    let out = inst
        .gate()
        .call(script_call("mcp__bad__env", json!({"name": "GREETING"})))
        .await
        .unwrap();
    assert!(
        out.value.to_string().contains("hello from the default"),
        "{}",
        out.value
    );
    inst.shutdown().await;
}

#[tokio::test]
async fn the_codemode_tool_is_offered_only_when_asked_for() {
    let d = dirs();
    d.user(
        "mcp.json",
        json!({"mcpServers": {"s": {"command": "/nonexistent/codemode-test"}}}),
    );
    let inst = d.builder().builtins(false).build().await.unwrap();
    assert!(!inst.codemode().offers_codemode_tool());
    assert!(
        inst.warnings()
            .iter()
            .any(|w| w.contains("autoEnableCodemode is false")),
        "{:?}",
        inst.warnings()
    );
    inst.shutdown().await;

    let inst = d.builder().build().await.unwrap();
    assert!(
        inst.codemode().offers_codemode_tool(),
        "the built-in tools ask for it"
    );
    inst.shutdown().await;

    d.user(
        "mcp.json",
        json!({"autoEnableCodemode": true, "mcpServers": {"s": {"command": "/nonexistent/codemode-test"}}}),
    );
    let inst = d.builder().builtins(false).build().await.unwrap();
    assert!(
        inst.codemode().offers_codemode_tool(),
        "the server switches it on"
    );
    inst.shutdown().await;

    d.project("mcp.json", r#"{"autoEnableCodemode": false}"#);
    let inst = d.builder().builtins(false).build().await.unwrap();
    assert!(
        !inst.codemode().offers_codemode_tool(),
        "a project may turn it off"
    );
    inst.shutdown().await;
}

#[tokio::test]
async fn a_policy_that_does_not_fit_stops_start_up() {
    let d = dirs();
    let bad = d.paths.config_dir.join("bad.cedar");
    std::fs::write(
        &bad,
        "permit(principal, action, resource) when { context.args.nope == 1 };",
    )
    .unwrap();
    d.user("settings.json", json!({"policy": ["bad.cedar"]}));
    let err = d.builder().build().await.err().expect("refused");
    assert!(err.to_string().contains("bad.cedar"), "{err}");

    // With MCP servers the decision waits for their tools, and nothing is permitted meanwhile.
    d.user(
        "mcp.json",
        json!({"mcpServers": {"s": {"command": "/nonexistent/codemode-test"}}}),
    );
    let inst = d.builder().build().await.unwrap();
    let err = inst
        .gate()
        .call(script_call("ls", json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Policy, "{}", err.message);
    assert!(inst.servers_ready().await.is_err());
    inst.shutdown().await;
}

#[tokio::test]
async fn an_embedders_tool_and_hook_join_the_gate() {
    struct Deny;
    impl codemode_gate::Hook for Deny {
        fn before<'a>(
            &'a self,
            ev: &'a codemode_gate::HookEvent,
        ) -> codemode_spec::BoxFuture<'a, codemode_gate::HookDecision> {
            let deny = ev.tool_name == "find";
            Box::pin(async move {
                if deny {
                    codemode_gate::HookDecision::Deny("no find here".into())
                } else {
                    codemode_gate::HookDecision::Allow
                }
            })
        }
    }
    let d = dirs();
    let inst = d.builder().hook(Arc::new(Deny)).build().await.unwrap();
    let err = inst
        .gate()
        .call(script_call("find", json!({"pattern": "*"})))
        .await
        .unwrap_err();
    assert!(err.message.contains("no find here"), "{}", err.message);
    inst.shutdown().await;
}

/// A server that changes its tools while scripts call them: a tool re-announced as destructive
/// is judged as destructive from then on, and a tool the settings disable is never callable,
/// not even in the moment a new version of it arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tools_a_server_changes_while_scripts_call_them_are_judged_by_what_they_are_now() {
    let (_d, inst) = churn_server_without("mcp__bad__secret").await;
    let gate = inst.gate().clone();

    // Under the default policy, read-only MCP tools run; others are refused.
    gate.call(script_call("mcp__bad__echo", json!({"text": "hi"})))
        .await
        .expect("a read-only tool runs");
    let mut changed = inst.tools_changed();
    changed.borrow_and_update();
    gate.call(script_call("mcp__bad__retag", json!({})))
        .await
        .unwrap();
    // Each call's record names the server it reached (read now: the loops below make more
    // calls in this script than its records keep).
    let records = gate.records_for_script("script-1");
    let retag = records
        .iter()
        .find(|r| r.tool == "mcp__bad__retag")
        .unwrap();
    assert_eq!(retag.namespace.as_deref(), Some("mcp__bad"));
    let line = serde_json::to_value(retag).unwrap();
    assert_eq!(line["namespace"], "mcp__bad");
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        match gate
            .call(script_call("mcp__bad__echo", json!({"text": "hi"})))
            .await
        {
            Err(e) => break e,
            Ok(_) => {
                assert!(Instant::now() < deadline, "echo is still judged read-only");
                let _ = tokio::time::timeout(Duration::from_millis(200), changed.changed()).await;
            }
        }
    };
    assert_eq!(refused.stage, Stage::Policy, "{}", refused.message);
    let echo = inst
        .tools()
        .into_iter()
        .find(|t| t.spec.name == "mcp__bad__echo")
        .unwrap();
    assert_eq!(echo.spec.annotations.destructive_hint, Some(true));

    // A disabled tool whose description changes fifty times while a script calls it in a loop.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hammer = |gate: codemode_gate::Gate, stop: Arc<std::sync::atomic::AtomicBool>| {
        tokio::spawn(async move {
            let (mut tries, mut ran) = (0u32, 0u32);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                tries += 1;
                if gate
                    .call(script_call("mcp__bad__secret", json!({})))
                    .await
                    .is_ok()
                {
                    ran += 1;
                }
                tokio::task::yield_now().await;
            }
            (tries, ran)
        })
    };
    let hammers: Vec<_> = (0..3).map(|_| hammer(gate.clone(), stop.clone())).collect();
    gate.call(script_call("mcp__bad__churn", json!({"times": 50})))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let description = |inst: &Installation| {
        inst.tools()
            .into_iter()
            .find(|t| t.spec.name == "mcp__bad__secret")
            .map(|t| (t.spec.description.clone(), t.spec.exposure))
    };
    while description(&inst).map(|(d, _)| d).as_deref() != Some("Version 50.") {
        assert!(Instant::now() < deadline, "{:?}", description(&inst));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (mut tries, mut ran) = (0, 0);
    for h in hammers {
        let (t, r) = h.await.unwrap();
        (tries, ran) = (tries + t, ran + r);
    }
    assert_eq!(ran, 0, "the disabled tool ran {ran} of {tries} times");
    assert!(tries > 50, "the loop ran while the tool changed: {tries}");
    assert_eq!(description(&inst).unwrap().1, Exposure::Hidden);
    inst.shutdown().await;
}

/// Rules and policies written with an MCP tool's name as its server spells it (`delete-all`,
/// `drop.table`) used to match nothing, silently: the settings' rule now means the registered
/// tool (`mcp__bad__delete_all`), and a policy naming a tool that does not exist is warned about
/// with the name it probably meant.
#[tokio::test]
async fn rules_and_policies_written_with_a_servers_spelling_do_not_silently_match_nothing() {
    let d = dirs();
    d.user(
        "mcp.json",
        json!({"mcpServers": {"bad": {"command": "node", "args": [FIXTURE, TESTBED, "churn"]}}}),
    );
    std::fs::write(
        d.paths.config_dir.join("mine.cedar"),
        "@id(\"no-drop\") forbid (principal, action, resource == Tool::\"mcp__bad__drop.table\");\n",
    )
    .unwrap();
    d.user(
        "settings.json",
        json!({"tools": {"mcp__bad__delete-all": {"disabled": true}}, "policy": ["mine.cedar"]}),
    );
    let inst = d.builder().build().await.unwrap();
    inst.servers_ready().await.unwrap();
    let gate = inst.gate().clone();
    let err = gate
        .call(script_call("mcp__bad__delete_all", json!({})))
        .await
        .expect_err("the rule disables the tool");
    assert!(err.message.contains("hidden"), "{}", err.message);
    let warnings = inst.warnings().join("\n");
    assert!(
        warnings.contains(
            "(policy `no-drop`) names Tool::\"mcp__bad__drop.table\", which is no registered tool"
        ) && warnings.contains("did you mean Tool::\"mcp__bad__drop_table\""),
        "{warnings}"
    );
    // A name that exists draws no warning.
    assert!(!warnings.contains("Tool::\"mcp__bad__echo\""), "{warnings}");
    inst.shutdown().await;
}

/// A tool the server lists later beside one of the same registered name (`delete.all` beside
/// `delete-all`) does not rename the first: a settings rule disabling `mcp__bad__delete_all`
/// would then match nothing and the tool would be callable under its new name. Both are left
/// out instead, and nothing of either is callable.
#[tokio::test]
async fn a_look_alike_listed_later_leaves_a_disabled_tool_unreachable() {
    let (_d, inst) = churn_server_without("mcp__bad__delete_all").await;
    let gate = inst.gate().clone();
    gate.set_policy(
        codemode_gate::PolicySet::parse("all", "permit(principal, action, resource);").unwrap(),
    )
    .unwrap();
    let err = gate
        .call(script_call("mcp__bad__delete_all", json!({})))
        .await
        .expect_err("the rule disables the tool");
    assert!(err.message.contains("hidden"), "{}", err.message);

    let mut changed = inst.tools_changed();
    changed.borrow_and_update();
    call_and_see_tools_change(&gate, &mut changed, "mcp__bad__add_lookalike").await;
    let reachable: Vec<String> = inst
        .tools()
        .iter()
        .map(|t| t.spec.name.clone())
        .filter(|n| n.starts_with("mcp__bad__delete"))
        .collect();
    for name in reachable
        .iter()
        .chain(["mcp__bad__delete_all".to_string()].iter())
    {
        let refused = gate.call(script_call(name, json!({}))).await;
        assert!(
            refused.is_err(),
            "`{name}` runs the disabled tool or its look-alike: {refused:?}"
        );
    }
    assert!(
        !inst
            .tools()
            .iter()
            .any(|t| t.spec.name.starts_with("mcp__bad__delete_all_")),
        "no renamed twin is registered"
    );
    inst.shutdown().await;
}
