//! Resolve: exposures, active state, modes, unknown and hidden names.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use codemode_gate::{Registry, RegistryError, Stage};
use codemode_spec::{CodemodeMode, Exposure};
use common::*;
use serde_json::json;

fn registry_with(tools: Vec<TestTool>) -> Registry {
    let reg = Registry::new();
    for t in tools {
        reg.register(Arc::new(t)).unwrap();
    }
    reg
}

#[test]
fn listings_follow_exposure_active_state_and_mode() {
    let reg = registry_with(vec![
        TestTool::new("codemode", object_schema()).exposure(Exposure::Direct),
        TestTool::new("bash", object_schema()).exposure(Exposure::Direct),
        TestTool::new("read", object_schema()).exposure(Exposure::Direct),
        TestTool::new("mcp__gh__search", object_schema()),
        TestTool::new("mcp__gh__rare", object_schema()).exposure(Exposure::Deferred),
        TestTool::new("secret", object_schema()).exposure(Exposure::Hidden),
    ]);
    reg.set_active("read", false).unwrap();
    let names = |v: Vec<codemode_spec::ToolSpec>| v.into_iter().map(|s| s.name).collect::<Vec<_>>();
    // A script cannot start another script: `codemode` is never script-callable.
    assert_eq!(
        names(reg.script_callable()),
        ["bash", "mcp__gh__rare", "mcp__gh__search"]
    );
    assert_eq!(
        names(reg.model_declared(CodemodeMode::On)),
        ["bash", "codemode"]
    );
    assert_eq!(names(reg.model_declared(CodemodeMode::Only)), ["codemode"]);
    assert_eq!(reg.specs().len(), 6);
    assert!(matches!(
        reg.set_active("mcp__gh__search", true),
        Err(RegistryError::NotDirect { .. })
    ));
    reg.set_exposure("mcp__gh__rare", Exposure::Hidden).unwrap();
    assert_eq!(
        reg.specs()
            .iter()
            .find(|s| s.name == "mcp__gh__rare")
            .unwrap()
            .exposure,
        Exposure::Hidden
    );
}

#[test]
fn duplicate_names_and_identifier_collisions_are_refused() {
    let reg = registry_with(vec![TestTool::new("my-tool", object_schema())]);
    assert_eq!(
        reg.register(Arc::new(TestTool::new("my-tool", object_schema()))),
        Err(RegistryError::Duplicate("my-tool".into()))
    );
    let err = reg
        .register(Arc::new(TestTool::new("my_tool", object_schema())))
        .unwrap_err();
    assert!(err.to_string().contains("tools.my_tool"), "{err}");
    // A hidden tool is callable by nobody, so it cannot collide; making it visible would.
    reg.register(Arc::new(
        TestTool::new("my_tool", object_schema()).exposure(Exposure::Hidden),
    ))
    .unwrap();
    assert!(matches!(
        reg.set_exposure("my_tool", Exposure::Codemode),
        Err(RegistryError::IdentifierCollision { .. })
    ));
}

/// `install` swaps a tool in one step, with the exposure given: calls racing the swap find the
/// old version or the new one, never no tool, and never the new one with the exposure it declared
/// when it was installed hidden.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tool_swapped_in_place_is_never_missing_or_briefly_visible() {
    let reg = registry_with(vec![
        TestTool::new("mcp__s__kept", object_schema()),
        TestTool::new("mcp__s__off", object_schema()).exposure(Exposure::Hidden),
    ]);
    assert!(matches!(
        reg.register(Arc::new(TestTool::new("mcp__s__kept", object_schema()))),
        Err(RegistryError::Duplicate(_))
    ));
    let gate = builder(&reg).build().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let callers: Vec<_> = (0..3)
        .map(|_| {
            let (gate, stop) = (gate.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut kept_failed, mut off_ran, mut tries) = (0, 0, 0);
                while !stop.load(Ordering::SeqCst) {
                    tries += 1;
                    if gate
                        .call(req("mcp__s__kept", json!({}), script("k")))
                        .await
                        .is_err()
                    {
                        kept_failed += 1;
                    }
                    if gate
                        .call(req("mcp__s__off", json!({}), script("o")))
                        .await
                        .is_ok()
                    {
                        off_ran += 1;
                    }
                    tokio::task::yield_now().await;
                }
                (kept_failed, off_ran, tries)
            })
        })
        .collect();
    for i in 0..2000 {
        let kept = TestTool::new("mcp__s__kept", object_schema()).description(&format!("v{i}"));
        reg.install(Arc::new(kept), Exposure::Codemode).unwrap();
        // Declares itself callable; the settings keep it hidden.
        let off = TestTool::new("mcp__s__off", object_schema()).description(&format!("v{i}"));
        reg.install(Arc::new(off), Exposure::Hidden).unwrap();
        if i % 50 == 0 {
            tokio::task::yield_now().await;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let mut tries = 0;
    for c in callers {
        let (kept_failed, off_ran, n) = c.await.unwrap();
        assert_eq!((kept_failed, off_ran), (0, 0));
        tries += n;
    }
    assert!(tries > 0);
    let spec = reg
        .specs()
        .into_iter()
        .find(|s| s.name == "mcp__s__off")
        .unwrap();
    assert_eq!(spec.exposure, Exposure::Hidden);
    assert_eq!(spec.description, "v1999");
}

/// A hostile server listing 20 000 tools: registering each used to compare identifiers with every
/// tool before it (quadratic, over a minute). The index keeps collisions, removal and hiding right.
#[test]
fn twenty_thousand_tools_register_and_keep_identifier_rules() {
    let reg = Registry::new();
    for i in 0..20_000 {
        reg.register(Arc::new(TestTool::new(
            &format!("mcp__m__tool-{i}"),
            object_schema(),
        )))
        .unwrap();
    }
    assert_eq!(reg.specs().len(), 20_000);
    assert!(matches!(
        reg.register(Arc::new(TestTool::new(
            "mcp__m__tool_19999",
            object_schema()
        ))),
        Err(RegistryError::IdentifierCollision { .. })
    ));
    // Removing a tool frees its identifier; hiding one frees it too, showing it again takes it back.
    reg.remove("mcp__m__tool-19999");
    reg.register(Arc::new(TestTool::new(
        "mcp__m__tool_19999",
        object_schema(),
    )))
    .unwrap();
    reg.set_exposure("mcp__m__tool-5", Exposure::Hidden)
        .unwrap();
    reg.register(Arc::new(TestTool::new("mcp__m__tool_5", object_schema())))
        .unwrap();
    assert!(matches!(
        reg.set_exposure("mcp__m__tool-5", Exposure::Codemode),
        Err(RegistryError::IdentifierCollision { .. })
    ));
    // Exposure changes of a tool to itself are not collisions.
    reg.set_exposure("mcp__m__tool-7", Exposure::Deferred)
        .unwrap();
}

#[tokio::test]
async fn only_mode_refuses_direct_model_calls_and_audits_them_but_scripts_may_call() {
    let dir = tempfile::tempdir().unwrap();
    let bash = TestTool::new("bash", object_schema()).exposure(Exposure::Direct);
    let runs = bash.runs.clone();
    let reg = registry_with(vec![bash]);
    let (audit, path) = audit_in(dir.path());
    let gate = builder(&reg)
        .mode(CodemodeMode::Only)
        .audit(audit)
        .build()
        .unwrap();

    let err = gate
        .call(req("bash", json!({}), model_origin()))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Resolve);
    assert!(err.message.contains("tools.bash(...)"), "{}", err.message);
    assert!(err.message.contains("only"), "{}", err.message);
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    gate.call(req("bash", json!({}), script("sc1")))
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let lines = audit_lines(&path);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["status"], "denied");
    assert_eq!(lines[0]["stage"], "resolve");
    assert_eq!(lines[0]["provenance"]["origin"], "model");
    assert_eq!(lines[1]["status"], "ok");
    assert_eq!(lines[1]["provenance"]["origin"], "script");
    codemode_gate::verify(&path, Some(&common::test_key())).unwrap();
}

#[tokio::test]
async fn on_mode_lets_the_model_call_active_direct_tools_only() {
    let reg = registry_with(vec![
        TestTool::new("bash", object_schema()).exposure(Exposure::Direct),
        TestTool::new("search", object_schema()),
    ]);
    let gate = builder(&reg).build().unwrap();
    gate.call(req("bash", json!({}), model_origin()))
        .await
        .unwrap();
    let err = gate
        .call(req("search", json!({}), model_origin()))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Resolve);
    assert!(err.message.contains("tools.search(...)"), "{}", err.message);
    reg.set_active("bash", false).unwrap();
    assert!(
        gate.call(req("bash", json!({}), model_origin()))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn unknown_tools_get_close_names_and_hidden_tools_are_callable_by_nobody() {
    let reg = registry_with(vec![
        TestTool::new("read_file", object_schema()),
        TestTool::new("secret", object_schema()).exposure(Exposure::Hidden),
    ]);
    let gate = builder(&reg).build().unwrap();
    let err = gate
        .call(req("read_fiel", json!({}), script("s")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Resolve);
    assert!(
        err.message.contains("did you mean `read_file`"),
        "{}",
        err.message
    );

    let err = gate
        .call(req("nothing_like_it", json!({}), script("s")))
        .await
        .unwrap_err();
    assert!(err.message.contains("searchTools"), "{}", err.message);

    for p in [script("s"), model_origin()] {
        let err = gate.call(req("secret", json!({}), p)).await.unwrap_err();
        assert_eq!(err.stage, Stage::Resolve);
        assert!(err.message.contains("hidden"), "{}", err.message);
    }
    // A hidden tool is never suggested.
    let err = gate
        .call(req("secre", json!({}), script("s")))
        .await
        .unwrap_err();
    assert!(!err.message.contains("`secret`"), "{}", err.message);
}

#[tokio::test]
async fn identifiers_resolve_to_their_tool() {
    let reg = registry_with(vec![TestTool::new("my-tool", object_schema())]);
    let gate = builder(&reg).build().unwrap();
    let out = gate
        .call(req("my_tool", json!({"path": "x"}), script("s")))
        .await
        .unwrap();
    assert_eq!(out.value, json!({"echo": {"path": "x"}}));
}

#[tokio::test]
async fn tools_hidden_deactivated_or_removed_mid_script_are_refused_at_their_next_call() {
    let reg = registry_with(vec![
        TestTool::new("bash", object_schema()).exposure(Exposure::Direct),
        TestTool::new("search", object_schema()),
        TestTool::new("gone", object_schema()),
    ]);
    let gate = builder(&reg).build().unwrap();
    for name in ["bash", "search", "gone"] {
        gate.call(req(name, json!({}), script("run")))
            .await
            .unwrap();
    }
    reg.set_active("bash", false).unwrap();
    reg.set_exposure("search", Exposure::Hidden).unwrap();
    reg.remove("gone");
    let err = gate
        .call(req("bash", json!({}), script("run")))
        .await
        .unwrap_err();
    assert!(err.message.contains("not active"), "{}", err.message);
    let err = gate
        .call(req("search", json!({}), script("run")))
        .await
        .unwrap_err();
    assert!(err.message.contains("hidden"), "{}", err.message);
    let err = gate
        .call(req("gone", json!({}), script("run")))
        .await
        .unwrap_err();
    assert!(
        err.message.contains("no tool named `gone`"),
        "{}",
        err.message
    );
    let records = gate.records_for_script("run");
    assert_eq!(records.len(), 6);
    assert_eq!(
        records
            .iter()
            .filter(|r| r.status == codemode_gate::Status::Denied)
            .count(),
        3
    );
}

#[tokio::test]
async fn a_cancelled_call_does_not_run() {
    let tool = TestTool::new("t", object_schema());
    let runs = tool.runs.clone();
    let reg = registry_with(vec![tool]);
    let gate = builder(&reg).build().unwrap();
    let r = req("t", json!({}), script("s"));
    r.cancel.cancel();
    assert!(gate.call(r).await.is_err());
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A client's own request (a resource the person reads) skips exposure, but not the rest: it
/// cannot start a script, cannot reach a hidden tool, and is judged by policy and audited under
/// its own origin.
#[tokio::test]
async fn client_requests_cannot_start_scripts_reach_hidden_tools_or_escape_policy() {
    let dir = tempfile::tempdir().unwrap();
    let read = TestTool::new("mcp__docs__read_resource", object_schema());
    let runs = read.runs.clone();
    let reg = registry_with(vec![
        TestTool::new("codemode", object_schema()).exposure(Exposure::Direct),
        read,
        TestTool::new("mcp__docs__private", object_schema()),
        TestTool::new("secret", object_schema()).exposure(Exposure::Hidden),
    ]);
    let policy = codemode_gate::PolicySet::parse(
        "p.cedar",
        "@id(\"all\") permit(principal, action, resource);\n@id(\"no-private\") forbid(principal, action, resource == Tool::\"mcp__docs__private\") when { context.origin == \"client\" };",
    )
    .unwrap();
    let (audit, path) = audit_in(dir.path());
    let gate = builder(&reg)
        .policy(policy)
        .mode(CodemodeMode::Only)
        .audit(audit)
        .build()
        .unwrap();
    let client = || codemode_spec::Provenance::client("c-1", "s1");

    let err = gate
        .call(req("codemode", json!({"code": "return 1"}), client()))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Resolve);
    assert!(gate.call(req("secret", json!({}), client())).await.is_err());
    let err = gate
        .call(req("mcp__docs__private", json!({"path": "keys"}), client()))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Policy);
    assert!(err.message.contains("no-private"), "{}", err.message);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // In mode `only`, where the model may call nothing directly, the client's own read runs.
    gate.call(req(
        "mcp__docs__read_resource",
        json!({"path": "readme"}),
        client(),
    ))
    .await
    .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let lines = audit_lines(&path);
    assert_eq!(lines.len(), 4, "every client request has a line");
    assert!(lines.iter().all(|l| l["provenance"]["origin"] == "client"));
}

/// Red team: a name the caller chooses (an MCP client's `tools/call`, a model's direct call)
/// reached "did you mean" whole: an edit distance against every registered name, quadratic in
/// its length. A megabyte of name must be answered at once, not after minutes.
#[test]
fn a_huge_unknown_name_is_refused_at_once() {
    let reg = registry_with(
        (0..500)
            .map(|i| TestTool::new(&format!("mcp__server__tool_number_{i}"), object_schema()))
            .collect(),
    );
    let gate = builder(&reg).build().unwrap();
    let name = "mcp__server__tool_number_".repeat(40_000);
    // On a thread of its own, so a test that fails does not wait for the work to end.
    let (done, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let _ = done.send(rt.block_on(gate.call(req(&name, json!({}), model_origin()))));
    });
    let err = answer
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("answered within 30 s")
        .unwrap_err();
    assert_eq!(err.stage, Stage::Resolve);
    assert!(err.message.len() < 4096, "{} bytes", err.message.len());
}
