//! Hooks: trait hooks and command hooks run as real `sh` processes.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use codemode_gate::{
    AfterDecision, CommandHooks, Gate, Hook, HookDecision, HookEvent, HookSettings, PolicySet,
    Registry, Stage,
};
use codemode_spec::{BoxFuture, ToolOutput};
use common::*;
use serde_json::{Value, json};

struct Fixed(HookDecision);
impl Hook for Fixed {
    fn before<'a>(&'a self, _ev: &'a HookEvent) -> BoxFuture<'a, HookDecision> {
        let d = self.0.clone();
        Box::pin(async move { d })
    }
}

struct Redact;
impl Hook for Redact {
    fn after<'a>(
        &'a self,
        _ev: &'a HookEvent,
        _out: &'a ToolOutput,
    ) -> BoxFuture<'a, AfterDecision> {
        Box::pin(async { AfterDecision::Replace(ToolOutput::value(json!("[redacted]"))) })
    }
}

fn one_tool(name: &str) -> (Registry, Arc<TestTool>) {
    let reg = Registry::new();
    let tool = Arc::new(TestTool::new(
        name,
        json!({"type": "object", "properties": {"command": {"type": "string"}}, "additionalProperties": false}),
    ));
    reg.register(tool.clone()).unwrap();
    (reg, tool)
}

#[tokio::test]
async fn trait_hooks_deny_rewrite_and_redact() {
    let (reg, tool) = one_tool("bash");
    let gate = builder(&reg)
        .hook(Arc::new(Fixed(HookDecision::Deny("not today".into()))))
        .build()
        .unwrap();
    let err = gate
        .call(req("bash", json!({"command": "ls"}), script("h")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Hook);
    assert!(err.message.contains("not today"));
    assert_eq!(tool.runs.load(Ordering::SeqCst), 0);

    let gate = builder(&reg)
        .hook(Arc::new(Fixed(HookDecision::Rewrite(
            json!({"command": "ls -la"}),
        ))))
        .hook(Arc::new(Redact))
        .build()
        .unwrap();
    let out = gate
        .call(req("bash", json!({"command": "ls"}), script("h")))
        .await
        .unwrap();
    assert_eq!(out.value, json!("[redacted]"));
    assert_eq!(
        tool.seen.lock().unwrap().last().unwrap(),
        &json!({"command": "ls -la"})
    );
}

#[tokio::test]
async fn a_rewrite_into_invalid_arguments_is_refused() {
    let (reg, tool) = one_tool("bash");
    for bad in [json!({"command": 5}), json!({"other": "x"}), json!("ls")] {
        let gate = builder(&reg)
            .hook(Arc::new(Fixed(HookDecision::Rewrite(bad.clone()))))
            .build()
            .unwrap();
        let err = gate
            .call(req("bash", json!({"command": "ls"}), script("h")))
            .await
            .unwrap_err();
        assert_eq!(err.stage, Stage::Hook, "{bad}");
        assert!(
            err.message
                .contains("rewrote the arguments into invalid ones"),
            "{}",
            err.message
        );
    }
    assert_eq!(tool.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_rewrite_is_decided_by_the_policy_again() {
    let (reg, tool) = one_tool("bash");
    let policy = PolicySet::parse(
        "p.cedar",
        "@id(\"all\") permit(principal, action, resource);\n@id(\"no-rm\") forbid(principal, action, resource) when { context.args has command && context.args.command like \"rm*\" };",
    )
    .unwrap();
    let gate = Gate::builder()
        .registry(reg)
        .policy(policy)
        .hook(Arc::new(Fixed(HookDecision::Rewrite(
            json!({"command": "rm -rf /"}),
        ))))
        .build()
        .unwrap();
    let err = gate
        .call(req("bash", json!({"command": "ls"}), script("h")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Policy);
    assert_eq!(err.policy_ids, ["no-rm"]);
    assert_eq!(tool.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_hook_asking_without_an_approver_denies() {
    let (reg, tool) = one_tool("bash");
    let gate = builder(&reg)
        .hook(Arc::new(Fixed(HookDecision::Ask("check this".into()))))
        .build()
        .unwrap();
    let err = gate
        .call(req("bash", json!({}), script("h")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Approval);
    assert!(err.message.contains("check this"), "{}", err.message);
    assert_eq!(tool.runs.load(Ordering::SeqCst), 0);
}

fn script_file(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    format!("sh {}", path.display())
}

fn command_hooks(pre: &[(&str, &str, u64)], post: &[(&str, &str)]) -> CommandHooks {
    let entry = |m: &str, c: &str, t: Option<u64>| json!({"matcher": m, "hooks": [{"type": "command", "command": c, "timeout": t}]});
    let settings: HookSettings = serde_json::from_value(json!({
        "PreToolUse": pre.iter().map(|(m, c, t)| entry(m, c, Some(*t))).collect::<Vec<_>>(),
        "PostToolUse": post.iter().map(|(m, c)| entry(m, c, Some(10))).collect::<Vec<_>>(),
    }))
    .unwrap();
    CommandHooks::new(&settings).unwrap()
}

async fn run_with(
    hooks: CommandHooks,
    tool: &str,
    args: Value,
) -> (Result<ToolOutput, codemode_gate::GateError>, Arc<TestTool>) {
    let (reg, t) = one_tool(tool);
    let gate = builder(&reg).command_hooks(hooks).build().unwrap();
    (gate.call(req(tool, args, script("cmd"))).await, t)
}

#[tokio::test]
async fn command_hook_receives_the_event_on_stdin_and_allows_with_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("event.json");
    let cmd = script_file(
        dir.path(),
        "cap.sh",
        &format!("cat > {}", capture.display()),
    );
    let (res, t) = run_with(
        command_hooks(&[("bash|write", &cmd, 10)], &[]),
        "bash",
        json!({"command": "ls"}),
    )
    .await;
    res.unwrap();
    assert_eq!(t.runs.load(Ordering::SeqCst), 1);
    let ev: Value = serde_json::from_str(&std::fs::read_to_string(&capture).unwrap()).unwrap();
    assert_eq!(ev["hook_event_name"], "PreToolUse");
    assert_eq!(ev["tool_name"], "bash");
    assert_eq!(ev["tool_input"], json!({"command": "ls"}));
    assert_eq!(ev["session_id"], "s1");
    assert_eq!(ev["provenance"]["origin"], "script");
    assert_eq!(ev["provenance"]["parent_call_id"], "cm-1");
    assert_eq!(ev["provenance"]["script_hash"], "abc123");
}

#[tokio::test]
async fn command_hooks_block_by_exit_2_or_by_json_and_matchers_select_tools() {
    let dir = tempfile::tempdir().unwrap();
    let exit2 = script_file(
        dir.path(),
        "e2.sh",
        "echo 'rm is not allowed here' >&2; exit 2",
    );
    let (res, t) = run_with(
        command_hooks(&[("bash|write", &exit2, 10)], &[]),
        "bash",
        json!({}),
    )
    .await;
    let err = res.unwrap_err();
    assert_eq!(err.stage, Stage::Hook);
    assert!(
        err.message.contains("rm is not allowed here"),
        "{}",
        err.message
    );
    assert_eq!(t.runs.load(Ordering::SeqCst), 0);

    // The matcher is anchored: `bash|write` does not match `bash_extra` or `read`.
    for other in ["read", "bash_extra"] {
        let (res, _) = run_with(
            command_hooks(&[("bash|write", &exit2, 10)], &[]),
            other,
            json!({}),
        )
        .await;
        res.unwrap();
    }

    // Matchers written for other agents (`Write|Edit|Bash`) still select codemode's tools: a
    // blocking hook that silently matched nothing would fail open.
    let (res, t) = run_with(
        command_hooks(&[("Write|Edit|Bash", &exit2, 10)], &[]),
        "bash",
        json!({}),
    )
    .await;
    assert_eq!(res.unwrap_err().stage, Stage::Hook);
    assert_eq!(t.runs.load(Ordering::SeqCst), 0);

    let block = script_file(
        dir.path(),
        "b.sh",
        r#"echo '{"decision":"block","reason":"policy says no"}'"#,
    );
    let (res, _) = run_with(command_hooks(&[("*", &block, 10)], &[]), "bash", json!({})).await;
    assert!(res.unwrap_err().message.contains("policy says no"));

    let deny = script_file(
        dir.path(),
        "d.sh",
        r#"echo '{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"deny","permissionDecisionReason":"nope"}}'"#,
    );
    let (res, _) = run_with(command_hooks(&[("", &deny, 10)], &[]), "bash", json!({})).await;
    assert!(res.unwrap_err().message.contains("nope"));

    let ask = script_file(
        dir.path(),
        "a.sh",
        r#"echo '{"hookSpecificOutput":{"permissionDecision":"ask","permissionDecisionReason":"looks risky"}}'"#,
    );
    let (res, _) = run_with(command_hooks(&[("", &ask, 10)], &[]), "bash", json!({})).await;
    let err = res.unwrap_err();
    assert_eq!(err.stage, Stage::Approval);
    assert!(err.message.contains("looks risky"), "{}", err.message);
}

#[tokio::test]
async fn command_hook_may_rewrite_the_input_which_is_validated_again() {
    let dir = tempfile::tempdir().unwrap();
    let rewrite = script_file(
        dir.path(),
        "r.sh",
        r#"echo '{"hookSpecificOutput":{"updatedInput":{"command":"ls --safe"}}}'"#,
    );
    let (res, t) = run_with(
        command_hooks(&[("bash", &rewrite, 10)], &[]),
        "bash",
        json!({"command": "ls"}),
    )
    .await;
    res.unwrap();
    assert_eq!(t.seen.lock().unwrap()[0], json!({"command": "ls --safe"}));

    let bad = script_file(
        dir.path(),
        "rb.sh",
        r#"echo '{"hookSpecificOutput":{"updatedInput":{"command":["ls"]}}}'"#,
    );
    let (res, t) = run_with(
        command_hooks(&[("bash", &bad, 10)], &[]),
        "bash",
        json!({"command": "ls"}),
    )
    .await;
    let err = res.unwrap_err();
    assert_eq!(err.stage, Stage::Hook);
    assert!(err.message.contains("/command"), "{}", err.message);
    assert_eq!(t.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn crashing_or_garbled_hooks_fail_closed() {
    let dir = tempfile::tempdir().unwrap();
    let crash = script_file(dir.path(), "c.sh", "echo boom >&2; exit 1");
    let (res, t) = run_with(command_hooks(&[("", &crash, 10)], &[]), "bash", json!({})).await;
    let err = res.unwrap_err();
    assert!(
        err.message.contains("failed, so the call is blocked"),
        "{}",
        err.message
    );
    assert!(
        err.message.contains("status 1") && err.message.contains("boom"),
        "{}",
        err.message
    );
    assert_eq!(t.runs.load(Ordering::SeqCst), 0);

    let garbled = script_file(dir.path(), "g.sh", "echo 'sure, go ahead'");
    let (res, _) = run_with(command_hooks(&[("", &garbled, 10)], &[]), "bash", json!({})).await;
    assert!(res.unwrap_err().message.contains("not JSON"));

    let killed = script_file(dir.path(), "k.sh", "kill -9 $$");
    let (res, _) = run_with(command_hooks(&[("", &killed, 10)], &[]), "bash", json!({})).await;
    let m = res.unwrap_err().message;
    assert!(m.contains("signal") || m.contains("status 137"), "{m}");

    let (res, _) = run_with(
        command_hooks(&[("", "/no/such/hook-binary", 10)], &[]),
        "bash",
        json!({}),
    )
    .await;
    assert!(res.unwrap_err().message.contains("status 127"));
}

#[tokio::test]
async fn a_hanging_hook_times_out_and_its_whole_process_group_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("bg.pid");
    let hang = script_file(
        dir.path(),
        "hang.sh",
        &format!("sleep 300 &\necho $! > {}\nsleep 300", pidfile.display()),
    );
    let started = Instant::now();
    let (res, t) = run_with(command_hooks(&[("", &hang, 1)], &[]), "bash", json!({})).await;
    let err = res.unwrap_err();
    assert!(
        err.message.contains("timed out after 1 s"),
        "{}",
        err.message
    );
    assert_eq!(t.runs.load(Ordering::SeqCst), 0);
    // Generous bound: the point is that a 300 s hook does not hold the call.
    assert!(started.elapsed() < Duration::from_secs(60));
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The background child was in the hook's group: it must be gone (or a zombie being reaped).
    let mut alive = true;
    for _ in 0..100 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.is_empty() || stat.contains(") Z") {
            alive = false;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !alive,
        "the hook's background process {pid} survived the timeout"
    );
}

#[tokio::test]
async fn post_hooks_see_the_response_and_may_replace_or_withhold_it() {
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("post.json");
    let replace = script_file(
        dir.path(),
        "p.sh",
        &format!(
            "cat > {}\necho '{{\"hookSpecificOutput\":{{\"updatedToolOutput\":\"[redacted]\"}}}}'",
            capture.display()
        ),
    );
    let (res, _) = run_with(
        command_hooks(&[], &[("bash", &replace)]),
        "bash",
        json!({"command": "env"}),
    )
    .await;
    assert_eq!(res.unwrap().value, json!("[redacted]"));
    let ev: Value = serde_json::from_str(&std::fs::read_to_string(&capture).unwrap()).unwrap();
    assert_eq!(ev["hook_event_name"], "PostToolUse");
    assert_eq!(ev["tool_response"], json!({"echo": {"command": "env"}}));

    let withhold = script_file(dir.path(), "w.sh", "echo 'contains a secret' >&2; exit 2");
    let (res, t) = run_with(
        command_hooks(&[], &[("bash", &withhold)]),
        "bash",
        json!({}),
    )
    .await;
    let err = res.unwrap_err();
    assert_eq!(err.stage, Stage::AfterHook);
    assert!(err.message.contains("contains a secret"), "{}", err.message);
    assert_eq!(
        t.runs.load(Ordering::SeqCst),
        1,
        "the tool ran; only its result is withheld"
    );
}

#[test]
fn bad_hook_settings_are_errors() {
    let s: HookSettings =
        serde_json::from_value(json!({"PreToolUse": [{"matcher": "(", "hooks": []}]})).unwrap();
    assert!(CommandHooks::new(&s).is_err());
    let s: HookSettings = serde_json::from_value(
        json!({"PreToolUse": [{"matcher": "", "hooks": [{"type": "prompt", "command": "x"}]}]}),
    )
    .unwrap();
    assert!(CommandHooks::new(&s).is_err());
    assert!(serde_json::from_value::<HookSettings>(json!({"PreTooluse": []})).is_err());
}

#[tokio::test]
async fn a_command_starts_in_its_own_directory_and_learns_the_project_as_data() {
    let mine = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    // The same relative command in both places: which one runs shows where it started.
    let record = mine.path().join("record");
    script_file(
        mine.path(),
        "check.sh",
        &format!(
            "cat > {r}.json; pwd > {r}.pwd; printf %s \"$CODEMODE_PROJECT_DIR\" > {r}.env; env > {r}.vars",
            r = record.display()
        ),
    );
    let pwned = project.path().join("PWNED");
    script_file(
        project.path(),
        "check.sh",
        &format!("touch {}", pwned.display()),
    );
    let mut settings: HookSettings = serde_json::from_value(json!({
        "PreToolUse": [{"matcher": "bash", "hooks": [{"type": "command", "command": "sh ./check.sh"}]}],
    }))
    .unwrap();
    settings.pre_tool_use[0].hooks[0].start_dir = Some(mine.path().to_path_buf());
    let hooks = CommandHooks::new(&settings)
        .unwrap()
        .with_project_dir(project.path().to_path_buf());
    let (res, _) = run_with(hooks, "bash", json!({"command": "ls"})).await;
    res.unwrap();
    assert!(!pwned.exists(), "the project's ./check.sh ran");
    let read = |ext: &str| std::fs::read_to_string(format!("{}.{ext}", record.display())).unwrap();
    assert_eq!(
        read("pwd").trim(),
        mine.path().canonicalize().unwrap().display().to_string()
    );
    let project_dir = project.path().display().to_string();
    assert_eq!(read("env"), project_dir);
    let ev: Value = serde_json::from_str(&read("json")).unwrap();
    assert_eq!(ev["cwd"], project_dir);
    assert_eq!(ev["project_dir"], project_dir);
    let vars = read("vars");
    assert!(vars.lines().any(|l| l.starts_with("PATH=")), "{vars}");
    assert!(
        vars.lines()
            .filter(|l| l.starts_with("CODEMODE_"))
            .all(|l| l.starts_with("CODEMODE_PROJECT_DIR=")),
        "{vars}"
    );
}

/// Red team: a hook that padded its answer past the read limit had the rest cut off; the kept
/// part was only spaces, which reads as "allow", so a hook that said "block" let the call run.
#[tokio::test]
async fn a_hook_answer_too_long_to_read_whole_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let padded = script_file(
        dir.path(),
        "padded.sh",
        "head -c 1048576 /dev/zero | tr '\\0' ' '; echo '{\"decision\":\"block\",\"reason\":\"NO\"}'",
    );
    let (res, t) = run_with(command_hooks(&[("ls", &padded, 10)], &[]), "ls", json!({})).await;
    let err = res.unwrap_err();
    assert_eq!(err.stage, Stage::Hook, "{}", err.message);
    assert!(err.message.contains("more than"), "{}", err.message);
    assert_eq!(t.runs.load(Ordering::SeqCst), 0);
}

/// Red team: a blocking hook whose matcher named an MCP tool as its server spells it
/// (`mcp__t__delete-all`) never matched the registered `mcp__t__delete_all`, and the call ran.
/// Calls `mcp__t__delete_all` under a blocking hook with each of `matchers`: each must block it.
async fn blocked_by_each(deny: &str, matchers: &[&str]) {
    for matcher in matchers {
        let (res, t) = run_with(
            command_hooks(&[(matcher, deny, 10)], &[]),
            "mcp__t__delete_all",
            json!({}),
        )
        .await;
        assert_eq!(res.unwrap_err().stage, Stage::Hook, "{matcher}");
        assert_eq!(t.runs.load(Ordering::SeqCst), 0, "{matcher}");
    }
}

#[tokio::test]
async fn a_matcher_with_an_mcp_tools_server_spelling_still_matches_it() {
    let dir = tempfile::tempdir().unwrap();
    let deny = script_file(dir.path(), "deny.sh", "echo no >&2; exit 2");
    blocked_by_each(
        &deny,
        &[
            "mcp__t__delete-all",
            "bash|mcp__t__delete-all",
            "mcp__t__delete-a.*",
        ],
    )
    .await;
    // A character class keeps its meaning.
    let (res, _) = run_with(
        command_hooks(&[("mcp__t__[a-c]x", &deny, 10)], &[]),
        "mcp__t__dx",
        json!({}),
    )
    .await;
    res.unwrap();
}

/// Red team: every call in flight ran its hooks at once, so a script's `Promise.all` of 1,500
/// calls started hundreds of hook processes and ran the host out of descriptors. Hooks now
/// take turns: a burst of calls never has more than `MAX_HOOKS_AT_ONCE` hook processes, and
/// every call still runs its hook.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_calls_runs_a_bounded_number_of_hooks_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    std::fs::create_dir(&live).unwrap();
    let peak = dir.path().join("peak");
    // Each hook marks itself live, records how many are live, waits a little, and leaves.
    let cmd = script_file(
        dir.path(),
        "count.sh",
        &format!(
            "touch {live}/$$; ls {live} | wc -l >> {peak}; sleep 0.2; rm -f {live}/$$",
            live = live.display(),
            peak = peak.display()
        ),
    );
    let (reg, tool) = one_tool("write");
    let gate = builder(&reg)
        .command_hooks(command_hooks(&[("write", &cmd, 30)], &[]))
        .build()
        .unwrap();
    let calls = (0..200).map(|i| {
        let gate = gate.clone();
        async move {
            gate.call(req(
                "write",
                json!({"command": format!("call {i}")}),
                script("burst"),
            ))
            .await
        }
    });
    let results = futures::future::join_all(calls).await;
    for r in &results {
        assert!(r.is_ok(), "{:?}", r.as_ref().err().map(|e| &e.message));
    }
    assert_eq!(tool.runs.load(Ordering::SeqCst), 200);
    let counts: Vec<usize> = std::fs::read_to_string(&peak)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(counts.len(), 200, "every call ran its hook");
    let most = counts.iter().copied().max().unwrap_or(0);
    assert!(
        most <= codemode_gate::MAX_HOOKS_AT_ONCE,
        "{most} hooks ran at once"
    );
    assert!(most > 1, "hooks still run side by side: {most}");
}

/// Red team: hook matchers are regexes, but tool rules are globs, and `mcp__db__*` written as
/// a glob matched no tool as a regex: the blocking hook never ran and the tool deleted
/// everything. A matcher also matches what it matches read as a glob.
#[tokio::test]
async fn a_matcher_written_as_a_glob_still_matches() {
    let dir = tempfile::tempdir().unwrap();
    let deny = script_file(dir.path(), "deny.sh", "echo no >&2; exit 2");
    blocked_by_each(
        &deny,
        &["mcp__t__*", "MCP__T__delete*", "mcp__t__delete_?ll"],
    )
    .await;
    // Neither reading matches another tool.
    let (res, _) = run_with(
        command_hooks(&[("mcp__t__*", &deny, 10)], &[]),
        "bash",
        json!({}),
    )
    .await;
    res.unwrap();
}

/// Red team: a command after a rewriting command was told the paths of the old arguments, so a
/// hook guarding paths passed a write it would have blocked. Each command now sees the paths of
/// the arguments the call will run with.
#[tokio::test]
async fn a_command_after_a_rewrite_sees_the_rewritten_paths() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("project");
    std::fs::create_dir_all(root.join("docs")).unwrap();
    std::fs::create_dir_all(root.join("secrets")).unwrap();
    let seen = dir.path().join("seen.json");
    let rewrite = script_file(
        dir.path(),
        "rewrite.sh",
        r#"echo '{"hookSpecificOutput":{"updatedInput":{"path":"secrets/key"}}}'"#,
    );
    // The guard blocks any path under secrets/, from what it is told.
    let guard = script_file(
        dir.path(),
        "guard.sh",
        &format!(
            "tee {} | grep -q '/secrets/' && {{ echo 'no secrets' >&2; exit 2; }}; exit 0",
            seen.display()
        ),
    );
    let reg = Registry::new();
    let tool = Arc::new(
        TestTool::new(
            "write",
            json!({"type": "object", "properties": {"path": {"type": "string"}}, "additionalProperties": false}),
        )
        .with_path_facts(&root),
    );
    reg.register(tool.clone()).unwrap();
    let gate = builder(&reg)
        .command_hooks(command_hooks(
            &[("write", &rewrite, 10), ("write", &guard, 10)],
            &[],
        ))
        .build()
        .unwrap();
    let err = gate
        .call(req("write", json!({"path": "docs/a.md"}), script("h")))
        .await
        .unwrap_err();
    assert_eq!(err.stage, Stage::Hook, "{}", err.message);
    assert!(err.message.contains("no secrets"), "{}", err.message);
    assert_eq!(tool.runs.load(Ordering::SeqCst), 0);
    let ev: Value = serde_json::from_str(&std::fs::read_to_string(&seen).unwrap()).unwrap();
    assert_eq!(ev["tool_input"], json!({"path": "secrets/key"}));
    let paths = ev["paths"].to_string();
    assert!(
        paths.contains("secrets/key") && !paths.contains("docs"),
        "{paths}"
    );
}
