//! Scripts attacking the record: calls left running when a script returns, and a symlink
//! flipping under calls the policy judged to stay inside the workspace.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use codemode_gate::{AuditLog, Gate, PolicySet, Registry};
use codemode_runtime::{Codemode, ScriptRequest};
use codemode_tools::{ToolsConfig, builtin_tools};
use common::test_key;
use serde_json::Value;

struct Installation {
    codemode: Codemode,
    audit: std::path::PathBuf,
    root: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn install(policy: &str) -> Installation {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap().join("ws");
    std::fs::create_dir_all(&root).unwrap();
    let registry = Registry::new();
    for tool in builtin_tools(&ToolsConfig::new(&root)) {
        registry.register(tool).unwrap();
    }
    let audit = dir.path().join("audit.jsonl");
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("test.cedar", policy).unwrap())
        .audit(AuditLog::open_with_key(&audit, test_key()).unwrap())
        .workspace(&root)
        .build()
        .unwrap();
    Installation {
        codemode: Codemode::builder().gate(gate).build().unwrap(),
        audit,
        root,
        _dir: dir,
    }
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_unawaited_writes_each_leave_exactly_one_truthful_line() {
    let inst = install("permit (principal, action, resource);");
    let run = inst
        .codemode
        .run_script(ScriptRequest::new(
            "for (let i = 0; i < 200; i++) tools.write({ path: `out/f${i}.txt`, content: 'x' }); return 1",
            "s",
        ))
        .await;
    assert!(!run.is_error, "{}", run.text);
    let written = std::fs::read_dir(inst.root.join("out"))
        .map(|d| d.count())
        .unwrap_or(0);
    let log = lines(&inst.audit);
    let writes: Vec<&Value> = log.iter().filter(|l| l["tool"] == "write").collect();
    let ids: std::collections::HashSet<&str> = writes
        .iter()
        .map(|l| l["provenance"]["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(writes.len(), 200, "every call has a line");
    assert_eq!(ids.len(), 200, "and only one");
    let applied = writes.iter().filter(|l| l["effect"] == "applied").count();
    assert_eq!(
        applied, written,
        "lines saying a file was written = files written"
    );
    for l in &writes {
        assert!(
            l["effect"] == "applied" || l["effect"] == "none",
            "a write's effect is known: {l}"
        );
    }
    codemode_gate::verify(&inst.audit, Some(&test_key())).unwrap();
    // A burst of cancelled calls on two threads: the journal chain stays whole, every write
    // that ran was journalled first, and every journal line has its outcome line.
    let unfinished = codemode_gate::unfinished_calls(&inst.audit, Some(&test_key())).unwrap();
    assert!(unfinished.is_empty(), "{unfinished:?}");
    let journalled = writes
        .iter()
        .filter(|l| l["journal_id"].is_string())
        .count();
    assert!(
        journalled >= applied,
        "{journalled} journalled, {applied} applied"
    );
    eprintln!("{written} of 200 writes ran before the script ended");
}

const WORKSPACE_ONLY: &str = r#"@id("all") permit (principal, action, resource);
@id("workspace-only") forbid (principal, action == Action::"tool_call", resource)
  when { context.path != "" && !context.in_workspace };
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipping_symlink_never_leads_a_judged_call_outside_and_the_log_names_what_was_touched() {
    let inst = install(WORKSPACE_ONLY);
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().canonicalize().unwrap().join("secret.txt");
    std::fs::write(&secret, "SECRET\n").unwrap();
    let inner = inst.root.join("inside.txt");
    std::fs::write(&inner, "INSIDE\n").unwrap();
    let link = inst.root.join("link");
    std::os::unix::fs::symlink(&inner, &link).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (stop, link, targets) = (stop.clone(), link.clone(), [inner.clone(), secret.clone()]);
        std::thread::spawn(move || {
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let tmp = link.with_extension("tmp");
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(&targets[i % 2], &tmp).unwrap();
                std::fs::rename(&tmp, &link).unwrap();
                i += 1;
            }
            i
        })
    };
    let script = r#"
        const out = [];
        for (let i = 0; i < 250; i++) {
          try { out.push((await tools.read({ path: "link" })).text); } catch (e) { out.push("refused"); }
          try { await tools.write({ path: "link", content: `w${i}` }); } catch (e) {}
        }
        return out.join("|");
    "#;
    let mut reads = String::new();
    for _ in 0..4 {
        let run = inst
            .codemode
            .run_script(ScriptRequest::new(script, "s"))
            .await;
        assert!(!run.is_error, "{}", run.text);
        reads.push_str(run.result.unwrap().value.unwrap().as_str().unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    let flips = flipper.join().unwrap();
    assert!(flips > 100, "the attacker barely ran");
    assert!(!reads.contains("SECRET"), "a read escaped the workspace");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "SECRET\n");
    let inside = inner.to_str().unwrap();
    let mut ran = 0;
    for l in lines(&inst.audit) {
        if l["tool"] == "codemode" || l["status"] != "ok" {
            continue;
        }
        ran += 1;
        // What ran was judged on the inside file, and the line says so.
        assert_eq!(l["paths"], serde_json::json!([inside]), "{l}");
    }
    assert!(ran > 100, "too few calls ran: {ran}");
}

#[tokio::test]
async fn a_script_cannot_write_the_gates_configuration_even_when_permitted() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap().join("ws");
    std::fs::create_dir_all(root.join(".codemode")).unwrap();
    std::fs::write(root.join(".codemode/settings.json"), "{}").unwrap();
    std::os::unix::fs::symlink(
        root.join(".codemode/settings.json"),
        root.join("innocent.json"),
    )
    .unwrap();
    let registry = Registry::new();
    for tool in builtin_tools(&ToolsConfig::new(&root)) {
        registry.register(tool).unwrap();
    }
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("all.cedar", "permit (principal, action, resource);").unwrap())
        .workspace(&root)
        .protect(codemode_gate::ProtectedPath::new(
            root.join(".codemode"),
            "the project's codemode configuration",
        ))
        .build()
        .unwrap();
    let codemode = Codemode::builder().gate(gate).build().unwrap();
    let script = r#"
        const out = [];
        for (const call of [
          () => tools.write({ path: ".codemode/settings.json", content: "{\"hooks\":{}}" }),
          () => tools.write({ path: "innocent.json", content: "{\"hooks\":{}}" }),
          () => tools.edit({ path: ".codemode/settings.json", old_string: "{}", new_string: "{\"x\":1}" }),
          () => tools.write({ path: ".codemode/new-policy.cedar", content: "permit(principal, action, resource);" }),
        ]) {
          try { await call(); out.push("written"); } catch (e) { out.push(e.stage); }
        }
        out.push((await tools.read({ path: ".codemode/settings.json" })).text);
        return out;
    "#;
    let run = codemode.run_script(ScriptRequest::new(script, "s")).await;
    assert!(!run.is_error, "{}", run.text);
    let value = run.result.unwrap().value.unwrap();
    assert_eq!(
        value,
        serde_json::json!(["protected", "protected", "protected", "protected", "{}"])
    );
    assert_eq!(
        std::fs::read_to_string(root.join(".codemode/settings.json")).unwrap(),
        "{}"
    );
    assert!(!root.join(".codemode/new-policy.cedar").exists());
}

/// A script is journalled before it starts, like a call: once the log was emptied behind the
/// gate, the next script does not start at all (its first call would have written a file).
#[tokio::test]
async fn a_script_does_not_start_onto_an_audit_log_emptied_behind_the_gate() {
    let inst = install("permit (principal, action, resource);");
    let first = inst
        .codemode
        .run_script(ScriptRequest::new("return 1", "s"))
        .await;
    assert!(!first.is_error, "{}", first.text);
    let journal = codemode_gate::started_path(&inst.audit);
    let started = std::fs::read_to_string(&journal).unwrap();
    assert!(
        started.contains("\"tool\":\"codemode\"") && started.contains("return 1"),
        "the script's start and first lines are journalled: {started}"
    );

    std::fs::write(&inst.audit, "").unwrap();
    std::fs::write(codemode_gate::head_path(&inst.audit), "").unwrap();
    let second = inst
        .codemode
        .run_script(ScriptRequest::new(
            "await tools.write({path: 'x.txt', content: 'x'}); return 2",
            "s",
        ))
        .await;
    assert!(second.is_error, "{}", second.text);
    assert!(second.text.contains("was not run"), "{}", second.text);
    assert!(
        !inst.root.join("x.txt").exists(),
        "the script never started"
    );
}

/// The journal and its head are the gate's, like the log: no tool that reports its paths may
/// write them (a script that could empty the journal could hide what a killed call did).
#[tokio::test]
async fn the_audit_journal_and_its_head_are_protected_like_the_log() {
    let inst = install("permit (principal, action, resource);");
    let journal = codemode_gate::started_path(&inst.audit);
    let journal_head = codemode_gate::head_path(&journal);
    let script = format!(
        r#"const out = [];
        for (const path of [{journal:?}, {journal_head:?}, {log:?}]) {{
          try {{ await tools.write({{ path, content: "" }}); out.push("written"); }}
          catch (e) {{ out.push(e.stage); }}
        }}
        return out;"#,
        journal = journal.display().to_string(),
        journal_head = journal_head.display().to_string(),
        log = inst.audit.display().to_string(),
    );
    let run = inst
        .codemode
        .run_script(ScriptRequest::new(script, "s"))
        .await;
    assert!(!run.is_error, "{}", run.text);
    assert_eq!(
        run.result.unwrap().value.unwrap(),
        serde_json::json!(["protected", "protected", "protected"])
    );
    assert!(
        std::fs::read_to_string(&journal)
            .unwrap()
            .contains("\"tool\":\"codemode\""),
        "the journal is untouched"
    );
}

/// Two scripts of one session, each within the store's limits on its own, run side by side:
/// each saw an empty store when it started, so the VM's checks pass both, and together they
/// would hold 1.4 million characters. The host keeps one script's writes and refuses the
/// other's whole, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_of_one_session_side_by_side_cannot_overfill_its_store() {
    let inst = install("permit (principal, action, resource);");
    let script = |tag: &str| {
        format!(
            "await tools.bash({{ command: 'sleep 1' }});
             for (let i = 0; i < 3; i++) store('{tag}' + i, 'x'.repeat(240000));
             return load('{tag}0').length"
        )
    };
    let (a, b) = tokio::join!(
        inst.codemode
            .run_script(ScriptRequest::new(script("a"), "s")),
        inst.codemode
            .run_script(ScriptRequest::new(script("b"), "s")),
    );
    let refused: Vec<&str> = [&a, &b]
        .iter()
        .filter(|r| r.is_error)
        .map(|r| r.text.as_str())
        .collect();
    assert_eq!(refused.len(), 1, "{}\n---\n{}", a.text, b.text);
    assert!(
        refused[0].contains("could not be saved") && refused[0].contains("the most is 1048576"),
        "{}",
        refused[0]
    );
    let kept = inst.codemode.session_store("s");
    assert_eq!(
        kept.len(),
        3,
        "one script's three values: {:?}",
        kept.keys()
    );
    let first = kept.keys().next().unwrap().chars().next().unwrap();
    assert!(
        kept.keys().all(|k| k.starts_with(first)),
        "{:?}",
        kept.keys()
    );
}

/// A script's calls are committed to the audit stream before their results reach the script,
/// but their flush to disk may wait: the script's own `codemode` line comes after every one of
/// them and is written durably, so nothing the script did reaches the model before all of it is
/// on disk. Journal starts may wait for the outcome lines that follow them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripts_lines_are_made_durable_by_its_own_line_which_comes_last() {
    use codemode_state::{Durability, MemoryStore, StateStore};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::write(root.join("in.txt"), "hello").unwrap();
    let registry = Registry::new();
    for tool in builtin_tools(&ToolsConfig::new(&root)) {
        registry.register(tool).unwrap();
    }
    let store = Arc::new(MemoryStore::default());
    let shared: Arc<dyn StateStore> = store.clone();
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("test.cedar", "permit (principal, action, resource);").unwrap())
        .audit(AuditLog::stream(shared, "calls", test_key()).unwrap())
        .workspace(&root)
        .build()
        .unwrap();
    let codemode = Codemode::builder().gate(gate).build().unwrap();
    let run = codemode
        .run_script(ScriptRequest::new(
            "const t = await tools.read({path: 'in.txt'}); await tools.write({path: 'out.txt', content: 'x'}); return 1",
            "s",
        ))
        .await;
    assert!(!run.is_error, "{}", run.text);

    let lines = store.read_audit("calls", 0, 100).await.unwrap();
    let tools: Vec<String> = lines
        .iter()
        .map(|r| {
            let v: Value = serde_json::from_str(&r.line).unwrap();
            v["tool"].as_str().unwrap_or("").to_string()
        })
        .collect();
    assert_eq!(tools, ["read", "write", "codemode"]);
    assert_eq!(
        store.durability_of("calls"),
        [Durability::Deferred, Durability::Deferred, Durability::Now],
        "the script's calls may wait for the disk; the script's own line, last, may not"
    );
    let journal = store.durability_of("calls.started");
    assert_eq!(journal.len(), 2, "the script and its write were journalled");
    assert!(journal.iter().all(|d| *d == Durability::Deferred));
}

/// A call whose arguments are past what the host reads (too many values, too deep) is refused
/// in the sandbox, unread. It had no audit line; now each has one, saying why, with the
/// arguments as `null`, and the script still gets the sandbox's own error. Nothing ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_refused_unread_in_the_sandbox_are_on_record() {
    let inst = install("permit (principal, action, resource);");
    let run = inst
        .codemode
        .run_script(ScriptRequest::new(
            "const out = [];
             const wide = new Array((1 << 20) + 10).fill(0);
             try { await tools.write({ path: 'wide.txt', content: 'x', wide }); } catch (e) { out.push(e.name + ': ' + e.message); }
             let deep = []; for (let i = 0; i < 200; i++) deep = [deep];
             try { await tools.write({ path: 'deep.txt', content: 'x', deep }); } catch (e) { out.push(e.name + ': ' + e.message); }
             tools.write({ path: 'unawaited.txt', content: 'x', wide });
             return out;",
            "s",
        ))
        .await;
    assert!(!run.is_error, "{}", run.text);
    let out = run.result.unwrap().value.unwrap();
    let out: Vec<&str> = out
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        out[0].starts_with("RangeError") && out[0].contains("JSON values"),
        "{out:?}"
    );
    assert!(
        out[1].starts_with("TypeError") && out[1].contains("127 levels"),
        "{out:?}"
    );
    let log = lines(&inst.audit);
    let writes: Vec<&Value> = log.iter().filter(|l| l["tool"] == "write").collect();
    assert_eq!(writes.len(), 3, "{writes:#?}");
    for line in &writes {
        assert_eq!(line["status"], "denied", "{line}");
        assert_eq!(line["stage"], "validate", "{line}");
        assert_eq!(line["args_preview"], "null", "{line}");
        assert!(
            line["message"].as_str().is_some_and(
                |m| m.starts_with("its arguments were not read: The arguments of write")
            ),
            "{line}"
        );
        assert_eq!(line["provenance"]["origin"], "script", "{line}");
        assert!(line["provenance"]["parent_call_id"].is_string(), "{line}");
    }
    assert!(!inst.root.join("wide.txt").exists() && !inst.root.join("deep.txt").exists());
    codemode_gate::verify(&inst.audit, Some(&test_key())).unwrap();
}
