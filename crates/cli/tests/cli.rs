//! The command line as a user meets it: real processes, real files, no terminal attached.

use std::path::Path;
use std::process::{Output, Stdio};

use serde_json::Value;

use crate::common;

fn codemode(args: &[&str], config_dir: &Path, stdin: Option<&str>) -> Output {
    let mut cmd = common::codemode();
    cmd.args(args).arg("--config-dir").arg(config_dir);
    common::pipe(cmd, stdin)
}

fn plain(args: &[&str]) -> Output {
    common::codemode()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn project() -> (tempfile::TempDir, tempfile::TempDir) {
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("notes.txt"), "alpha\nbeta\n").unwrap();
    let config = tempfile::tempdir().unwrap();
    (work, config)
}

#[test]
fn the_demo_runs_and_the_gate_refuses_the_write_without_a_person() {
    let out = plain(&["demo"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("Script completed"), "{stdout}");
    assert!(
        stdout.contains("write (stage approval): `write` was not run"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ask-writes"),
        "the denial names the policy: {stdout}"
    );
    assert!(stdout.contains("src/main.rs"), "{stdout}");
    // The script used the tools' structured results, not their text.
    assert!(stdout.contains("2 TODO lines"), "{stdout}");
    assert!(stdout.contains("Cargo.toml has 4 lines"), "{stdout}");
}

#[test]
fn refused_input_exits_non_zero_with_the_reason_on_stderr() {
    let (work, config) = project();
    let w = work.path().to_str().unwrap();
    for bad in [
        "",
        "   \n",
        "// @options: {\"colour\": 1}\nreturn 1",
        "return 1\n// @options: {}",
    ] {
        let out = codemode(&["run", "--workdir", w, "-"], config.path(), Some(bad));
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out.stdout));
        assert!(
            text(&out.stderr).contains("refused"),
            "{bad:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn json_output_uses_the_reference_field_names() {
    let (work, config) = project();
    let w = work.path().to_str().unwrap();
    let script = "const t = await tools.read({ path: \"notes.txt\" }); text(t); console.log(\"hi\"); return 7";
    let out = codemode(
        &["run", "--json", "--workdir", w, "-"],
        config.path(),
        Some(script),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["value"], 7);
    assert_eq!(v["output"][0]["type"], "text");
    assert!(v["output"][0]["text"].as_str().unwrap().contains("alpha"));
    assert_eq!(v["output"][1]["console"], true);
    assert_eq!(v["calls"][0]["name"], "read");
    assert_eq!(v["calls"][0]["status"], "ok");
    assert!(v.get("storeWrites").is_some());
}

#[test]
fn a_failed_script_exits_one_and_names_its_calls() {
    let (work, config) = project();
    let w = work.path().to_str().unwrap();
    let out = codemode(
        &["run", "--workdir", w, "-"],
        config.path(),
        Some("await tools.ls({});\nthrow new Error(\"boom\")"),
    );
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("boom") && stdout.contains("codemode.js:2"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ls"),
        "the calls already made are listed: {stdout}"
    );
}

/// A call the script did not await may still run to its end: the run's record must say what
/// happened, as the audit log does, or a model told "cancelled" retries a write that was made.
#[test]
fn calls_not_awaited_are_reported_as_they_ended_not_as_cancelled() {
    let (work, config) = project();
    let w = work.path().to_str().unwrap();
    let allow = config.path().join("all.cedar");
    std::fs::write(&allow, "permit(principal, action, resource);").unwrap();
    let state = tempfile::tempdir().unwrap();
    let script = "for (let i = 0; i < 20; i++) tools.write({path: 'ff' + i + '.txt', content: 'x'});\nthrow new Error('bail')";
    let run = |json: bool, script: &str| {
        let mut args = vec!["run", "--workdir", w, "--policy", allow.to_str().unwrap()];
        args.extend(["--state-dir", state.path().to_str().unwrap(), "-"]);
        if json {
            args.insert(1, "--json");
        }
        codemode(&args, config.path(), Some(script))
    };
    let out = run(true, script);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let calls = v["calls"].as_array().cloned().unwrap_or_default();
    assert_eq!(calls.len(), 20, "{v}");
    let mut ran = 0;
    for call in &calls {
        let path = serde_json::from_str::<Value>(call["args"].as_str().unwrap_or("{}"))
            .ok()
            .and_then(|a| a["path"].as_str().map(str::to_string))
            .unwrap_or_default();
        let written = work.path().join(&path).exists();
        // A call that finished before the script ended is reported as any call is; one still
        // out then is marked, with what the gate saw of it.
        if call["awaited"] == Value::Bool(false) {
            assert!(call["error"].is_string(), "{call}");
        }
        if written {
            ran += 1;
            assert_eq!(call["status"], "ok", "{path} was written: {call}");
        } else {
            assert_ne!(call["status"], "ok", "{path} was not written: {call}");
        }
    }
    assert!(ran > 0, "some calls ran in their first poll: {v}");
    // What the model reads says so too.
    let out = run(
        false,
        "tools.write({path: 'one.txt', content: 'x'}); throw new Error('bail')",
    );
    let model_text = text(&out.stdout);
    // Written: "ok", and "it ran to its end" when it was still out at the end.
    if work.path().join("one.txt").exists() {
        assert!(
            model_text.contains("write (ok)")
                || model_text
                    .contains("write (ok, still running when the script ended: it ran to its end)"),
            "{model_text}"
        );
    } else {
        assert!(
            model_text.contains("write (cancelled, still running when the script ended"),
            "{model_text}"
        );
    }
}

#[test]
fn record_then_replay_gives_the_same_run_without_calling_tools() {
    let (work, config) = project();
    let w = work.path().to_str().unwrap();
    let log = work.path().join("run.jsonl");
    let log_s = log.to_str().unwrap();
    let script = "const a = await tools.read({ path: \"notes.txt\" }); return { a, r: Math.random(), t: Date.now() }";
    let first = codemode(
        &["run", "--json", "--record", log_s, "--workdir", w, "-"],
        config.path(),
        Some(script),
    );
    assert!(first.status.success(), "{}", text(&first.stderr));
    std::fs::remove_file(work.path().join("notes.txt")).unwrap();
    let again = codemode(
        &["run", "--json", "--replay", log_s, "--workdir", w, "-"],
        config.path(),
        Some(script),
    );
    assert!(again.status.success(), "{}", text(&again.stdout));
    let a: Value = serde_json::from_str(&text(&first.stdout)).unwrap();
    let b: Value = serde_json::from_str(&text(&again.stdout)).unwrap();
    assert_eq!(
        a["value"], b["value"],
        "replay gives the same value with the file gone"
    );
    let other = "await tools.ls({}); return 1";
    let diverged = codemode(
        &["run", "--replay", log_s, "--workdir", w, "-"],
        config.path(),
        Some(other),
    );
    assert_eq!(diverged.status.code(), Some(1));
    let msg = text(&diverged.stdout);
    assert!(msg.to_lowercase().contains("diverge"), "{msg}");
}

#[test]
fn policy_check_reports_syntax_errors_and_accepts_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.cedar");
    std::fs::write(
        &bad,
        "permit (principal, action, resource)\nwhen { resource.nme == }",
    )
    .unwrap();
    let out = plain(&["policy", "check", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("bad.cedar"),
        "{}",
        text(&out.stderr)
    );
    let good = dir.path().join("default.cedar");
    std::fs::write(&good, text(&plain(&["policy", "default"]).stdout)).unwrap();
    let out = plain(&["policy", "check", good.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("warning"),
        "{}",
        text(&out.stderr)
    );
    // Valid Cedar that names a tool nobody has: it would never apply, and says so.
    let typo = dir.path().join("typo.cedar");
    std::fs::write(
        &typo,
        "@id(\"no-bash\") forbid (principal, action, resource == Tool::\"Bash\");\n",
    )
    .unwrap();
    let out = plain(&["policy", "check", typo.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let warning = text(&out.stderr);
    assert!(
        warning.contains("(policy `no-bash`) names Tool::\"Bash\"")
            && warning.contains("did you mean Tool::\"bash\"?"),
        "{warning}"
    );
    // The same mistake written as a comparison of the tool's name, in any of its forms.
    let typo = dir.path().join("typo-name.cedar");
    std::fs::write(
        &typo,
        concat!(
            "@id(\"eq\") forbid (principal, action, resource is Tool) when { resource.name == \"Write\" };\n",
            "@id(\"eq-left\") forbid (principal, action, resource is Tool) when { resource.read_only && \"Edit\" == resource.name };\n",
            "@id(\"set\") forbid (principal, action, resource is Tool) unless { ![\"ls\", \"Bash\"].contains(resource.name) };\n",
        ),
    )
    .unwrap();
    let out = plain(&["policy", "check", typo.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let warning = text(&out.stderr);
    for (id, name, close) in [
        ("eq", "Write", "write"),
        ("eq-left", "Edit", "edit"),
        ("set", "Bash", "bash"),
    ] {
        assert!(
            warning.contains(&format!("(policy `{id}`) names resource.name \"{name}\""))
                && warning.contains(&format!("did you mean \"{close}\"?")),
            "{id}: {warning}"
        );
    }
    assert!(
        !warning.contains("\"ls\""),
        "a name that exists is not warned about: {warning}"
    );
}

#[test]
fn policy_explain_names_the_deciding_policy() {
    let dir = tempfile::tempdir().unwrap();
    let call = dir.path().join("call.json");
    std::fs::write(&call, r#"{"tool": "bash", "args": {"command": "ls"}}"#).unwrap();
    let out = plain(&["policy", "explain", call.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(v["decision"], "ask");
    assert!(v.to_string().contains("ask-writes"), "{v}");
}

/// `codemode run x.js | head`: a reader that stops early is not an error, and nothing panics.
#[test]
fn run_exits_quietly_when_its_reader_stops_early() {
    let (work, config) = project();
    let script = work.path().join("x.js");
    std::fs::write(&script, "return 'line\\n'.repeat(100000)").unwrap();
    let mut cmd = common::codemode();
    cmd.args(["run", "--workdir"])
        .arg(work.path())
        .arg("--config-dir")
        .arg(config.path())
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    // The reader is gone before anything is written.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

/// The head file beside an audit log.
fn codemode_gate_head(log: &std::path::Path) -> std::path::PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".head");
    std::path::PathBuf::from(name)
}

#[test]
fn the_audit_log_verifies_and_detects_tampering() {
    let (work, config) = project();
    let w = work.path().to_str().unwrap();
    let log = work.path().join("audit.jsonl");
    let script = "await tools.ls({}); await tools.read({ path: \"notes.txt\" }); try { await tools.write({ path: \"x\", content: \"y\" }) } catch {} return 1";
    let out = codemode(
        &["run", "--audit", log.to_str().unwrap(), "--workdir", w, "-"],
        config.path(),
        Some(script),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ok = plain(&["audit", "verify", log.to_str().unwrap()]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    let body = std::fs::read_to_string(&log).unwrap();
    assert!(body.lines().count() >= 3);
    assert!(
        body.contains("ask-writes"),
        "the denial and its policy are audited"
    );
    // A deleted head: the lines verify, but a cut end cannot be ruled out, so verify fails and
    // claims nothing of the head.
    let head = codemode_gate_head(&log);
    let saved = std::fs::read(&head).unwrap();
    std::fs::remove_file(&head).unwrap();
    let headless = plain(&["audit", "verify", log.to_str().unwrap()]);
    let said = text(&headless.stdout);
    assert_eq!(headless.status.code(), Some(1), "{said}");
    assert!(
        said.contains("NOT VERIFIED") && said.contains("head file"),
        "{said}"
    );
    assert!(!said.contains("and the head were written"), "{said}");
    std::fs::write(&head, saved).unwrap();
    let tampered = body.replacen("notes.txt", "other.txt", 1);
    std::fs::write(&log, tampered).unwrap();
    let bad = plain(&["audit", "verify", log.to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad.stdout));
}

#[test]
fn an_untrusted_project_cannot_widen_but_a_trusted_one_can() {
    let (work, config) = project();
    let w = work.path().to_str().unwrap();
    std::fs::write(
        config.path().join("settings.json"),
        r#"{"tools": {"bash": {"disabled": true}}, "limits": {"timeout_ms": 5000}}"#,
    )
    .unwrap();
    std::fs::create_dir_all(work.path().join(".codemode")).unwrap();
    std::fs::write(
        work.path().join(".codemode/settings.json"),
        r#"{"tools": {"bash": {"disabled": false}, "ls": {"disabled": true}}, "limits": {"timeout_ms": 60000}}"#,
    )
    .unwrap();
    let script = "return { names: ALL_TOOLS.map(t => t.name) }";
    let out = codemode(
        &["run", "--json", "--workdir", w, "-"],
        config.path(),
        Some(script),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let warnings = text(&out.stderr);
    assert!(
        warnings.contains("timeout_ms"),
        "the ignored widening is named: {warnings}"
    );
    let v: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    let names = v["value"]["names"].to_string();
    assert!(
        !names.contains("\"bash\""),
        "the project may not re-enable bash: {names}"
    );
    assert!(
        !names.contains("\"ls\""),
        "the project may hide ls: {names}"
    );
    assert!(names.contains("\"read\""));
    assert!(
        v["limits"]["timeout_ms"] == 5000,
        "the project may not raise a limit: {}",
        v["limits"]
    );
    let trust = plain(&["trust", w, "--config-dir", config.path().to_str().unwrap()]);
    assert!(trust.status.success(), "{}", text(&trust.stderr));
    let out = codemode(
        &["run", "--json", "--workdir", w, "-"],
        config.path(),
        Some(script),
    );
    let v: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert!(
        v["value"]["names"].to_string().contains("\"bash\""),
        "trusted: {}",
        v["value"]
    );
}

#[test]
fn tools_lists_exposure_and_token_counts() {
    let (work, config) = project();
    let w = work.path().to_str().unwrap();
    let out = codemode(&["tools", "--workdir", w], config.path(), None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing = text(&out.stdout);
    for name in ["read", "write", "edit", "ls", "find", "grep", "bash"] {
        assert!(listing.contains(name), "{listing}");
    }
    let out = codemode(
        &["tools", "--tokens", "--mode", "only", "--workdir", w],
        config.path(),
        None,
    );
    let tokens = text(&out.stdout);
    assert!(
        tokens.contains("o200k_base") && tokens.contains("cl100k_base"),
        "{tokens}"
    );
    let described = codemode(
        &["tools", "--describe", "--mode", "only", "--workdir", w],
        config.path(),
        None,
    );
    assert!(
        text(&described.stdout).contains("bash"),
        "{}",
        text(&described.stdout)
    );
}

#[test]
fn tools_output_into_a_closed_pipe_ends_quietly() {
    // `codemode tools --describe | head -1`: the reader is gone before the output is written.
    let (work, config) = project();
    let w = work.path().to_str().unwrap();
    for flag in ["--describe", "--tokens", "--mode"] {
        let mut cmd = common::codemode();
        cmd.args(["tools", flag]);
        if flag == "--mode" {
            cmd.arg("only");
        }
        cmd.args(["--workdir", w, "--config-dir"])
            .arg(config.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{flag}: {stderr}");
        assert!(!stderr.contains("panicked"), "{flag}: {stderr}");
    }
}

/// Started in the home directory (a terminal's default) or in `/` (where some MCP clients start
/// servers), the workspace would hold `~/.ssh`, and the default policy would let scripts read
/// keys without asking. Such a workspace holds nothing for the policies, with a warning.
#[test]
fn a_workspace_that_holds_the_home_directory_puts_no_path_inside_it() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::create_dir_all(home.join("project")).unwrap();
    std::fs::write(home.join(".ssh/id_rsa"), "PRIVATE KEY").unwrap();
    std::fs::write(home.join("project/notes.txt"), "notes").unwrap();
    let config = tempfile::tempdir().unwrap();
    let run = |workdir: &std::path::Path, script: &str| {
        let mut cmd = common::codemode();
        cmd.env("HOME", &home)
            .args(["run", "--json", "--workdir"])
            .arg(workdir)
            .arg("--config-dir")
            .arg(config.path())
            .arg("-");
        common::json_outcome(common::pipe(cmd, Some(script)))
    };
    let key = home.join(".ssh/id_rsa").display().to_string();
    let read_key = format!("return (await tools.read({{path: {key:?}}})).content");
    for (workdir, why) in [
        (home.clone(), "holds your home directory"),
        (tmp.path().to_path_buf(), "holds your home directory"),
        (std::path::PathBuf::from("/"), "is the file system's root"),
    ] {
        let (_, v, stderr) = run(&workdir, &read_key);
        assert!(
            stderr.contains(why) && stderr.contains("--workdir"),
            "{workdir:?}: {stderr}"
        );
        assert_eq!(v["ok"], false, "{workdir:?}: the key was read: {v}");
        assert!(!v.to_string().contains("PRIVATE KEY"), "{v}");
    }
    // A project inside the home directory is a workspace as usual.
    let (_, v, stderr) = run(
        &home.join("project"),
        "return (await tools.read({path: 'notes.txt'})).content",
    );
    assert_eq!(v["ok"], true, "{v} {stderr}");
    assert!(!stderr.contains("no path counts as inside it"), "{stderr}");
    let (_, v, _) = run(&home.join("project"), &read_key);
    assert_eq!(v["ok"], false, "outside the project it still asks: {v}");
}

/// A cloned project's policy file of deeply nested or long-chained expressions used to
/// overflow Cedar's stack and abort every `codemode` started in that directory. It is now an
/// error naming the file and place, and nothing runs.
#[test]
fn a_project_policy_that_nests_without_end_is_an_error_not_a_crash() {
    let (work, config) = project();
    let dot = work.path().join(".codemode");
    std::fs::create_dir_all(&dot).unwrap();
    std::fs::write(dot.join("settings.json"), r#"{"policy": ["deep.cedar"]}"#).unwrap();
    let w = work.path().to_str().unwrap();
    let chain = vec!["true"; 5000].join(" && ");
    for condition in [
        format!("{}true{}", "(".repeat(5000), ")".repeat(5000)),
        chain,
    ] {
        let deep = format!("forbid (principal, action, resource) when {{ {condition} }};\n");
        std::fs::write(dot.join("deep.cedar"), &deep).unwrap();
        let out = codemode(
            &["run", "--workdir", w, "-"],
            config.path(),
            Some("return 1"),
        );
        let stderr = text(&out.stderr);
        assert!(
            out.status.code().is_some_and(|c| c != 0),
            "ended by a signal or ran: {:?} {stderr}",
            out.status
        );
        assert!(
            stderr.contains("deep.cedar:1:") && !stderr.contains("overflow"),
            "{stderr}"
        );
        let policy = dot.join("deep.cedar");
        let out = plain(&["policy", "check", policy.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    }
}
