//! Every limit key takes effect through a real `codemode run`, and no source raises a limit it
//! may not: an untrusted project, the command line or the script's `// @options:` line.

use serde_json::{Value, json};

use crate::common;

struct Dirs {
    config: tempfile::TempDir,
    state: tempfile::TempDir,
    project: tempfile::TempDir,
}

/// A user configuration (`None`: no settings file) and an untrusted project with `project` as
/// its `.codemode/settings.json`.
fn dirs(user: Option<Value>, project: Option<Value>) -> Dirs {
    let d = Dirs {
        config: tempfile::tempdir().unwrap(),
        state: tempfile::tempdir().unwrap(),
        project: tempfile::tempdir().unwrap(),
    };
    if let Some(u) = user {
        std::fs::write(d.config.path().join("settings.json"), u.to_string()).unwrap();
    }
    if let Some(p) = project {
        std::fs::create_dir_all(d.project.path().join(".codemode")).unwrap();
        std::fs::write(
            d.project.path().join(".codemode/settings.json"),
            p.to_string(),
        )
        .unwrap();
    }
    std::fs::write(d.project.path().join("a.txt"), "a").unwrap();
    d
}

/// Runs `script` with `--json`; returns the exit code, the structured result and stderr.
fn run(d: &Dirs, script: &str, extra: &[&str]) -> (Option<i32>, Value, String) {
    let mut cmd = common::codemode();
    cmd.args(["run", "--json", "--config-dir"])
        .arg(d.config.path())
        .arg("--state-dir")
        .arg(d.state.path())
        .arg("--workdir")
        .arg(d.project.path())
        .args(extra)
        .arg("-");
    common::json_outcome(common::pipe(cmd, Some(script)))
}

fn error_of(v: &Value) -> String {
    v["error"].to_string()
}

fn project_limit(key: &str, value: u64) -> Option<Value> {
    Some(json!({ "limits": { key: value } }))
}

const ALLOCATE_64_MIB: &str = "const a = []; for (let i = 0; i < 8; i++) a.push(new Uint8Array(8 * 1024 * 1024)); return a.length";

#[test]
fn heap_bytes_from_a_project_lowers_the_heap() {
    let (code, v, stderr) = run(&dirs(None, None), ALLOCATE_64_MIB, &[]);
    assert_eq!((code, &v["value"]), (Some(0), &json!(8)), "{v} {stderr}");
    let d = dirs(None, project_limit("heap_bytes", 32 * 1024 * 1024));
    let (code, v, _) = run(&d, ALLOCATE_64_MIB, &[]);
    assert_eq!(code, Some(1), "{v}");
    assert!(error_of(&v).contains("out of memory"), "{v}");
}

#[test]
fn stack_bytes_from_a_project_lowers_the_stack() {
    let script = "function f(n) { return n === 0 ? 0 : 1 + f(n - 1) } return f(1000)";
    let (code, v, stderr) = run(&dirs(None, None), script, &[]);
    assert_eq!((code, &v["value"]), (Some(0), &json!(1000)), "{v} {stderr}");
    let (code, v, _) = run(
        &dirs(None, project_limit("stack_bytes", 64 * 1024)),
        script,
        &[],
    );
    assert_eq!(code, Some(1), "{v}");
    assert!(
        error_of(&v).contains("RangeError") || error_of(&v).contains("stack"),
        "{v}"
    );
}

#[test]
fn timeout_ms_from_a_project_stops_the_script() {
    let (code, v, _) = run(
        &dirs(None, project_limit("timeout_ms", 300)),
        "while (true) {}",
        &[],
    );
    assert_eq!(code, Some(1), "{v}");
    assert!(error_of(&v).contains("timed out after 300 ms"), "{v}");
}

#[test]
fn cpu_ms_from_a_project_stops_the_script() {
    let (code, v, _) = run(
        &dirs(None, project_limit("cpu_ms", 300)),
        "while (true) {}",
        &[],
    );
    assert_eq!(code, Some(1), "{v}");
    assert!(error_of(&v).contains("CPU budget of 300 ms"), "{v}");
}

#[test]
fn max_output_tokens_from_a_project_cuts_the_text() {
    let plain = |d: &Dirs| plain_text(d, "text('word '.repeat(5000)); return 1");
    let full = plain(&dirs(None, None));
    let cut = plain(&dirs(None, project_limit("max_output_tokens", 100)));
    assert!(full.len() > 20_000, "{}", full.len());
    assert!(
        cut.len() < 2_000,
        "cut to about 100 tokens: {} bytes",
        cut.len()
    );
    // The script's options line may lower the budget, never raise it.
    let asks_more =
        "// @options: {\"max_output_tokens\": 99999999}\ntext('word '.repeat(5000)); return 1";
    let cut = plain_text(
        &dirs(None, project_limit("max_output_tokens", 100)),
        asks_more,
    );
    assert!(
        cut.len() < 2_000,
        "the options line raised the budget: {} bytes",
        cut.len()
    );
}

/// What `codemode run` prints for the model (not `--json`).
fn plain_text(d: &Dirs, script: &str) -> String {
    {
        let mut cmd = common::codemode();
        cmd.args(["run", "--config-dir"])
            .arg(d.config.path())
            .arg("--state-dir")
            .arg(d.state.path())
            .arg("--workdir")
            .arg(d.project.path())
            .arg("-");
        String::from_utf8_lossy(&common::pipe(cmd, Some(script)).stdout).into_owned()
    }
}

#[test]
fn max_output_bytes_from_a_project_limits_the_output() {
    let script = "text('x'.repeat(5000)); return 1";
    let (code, v, stderr) = run(&dirs(None, None), script, &[]);
    assert_eq!(code, Some(0), "{v} {stderr}");
    let (code, v, _) = run(
        &dirs(None, project_limit("max_output_bytes", 1000)),
        script,
        &[],
    );
    assert_eq!(code, Some(1), "{v}");
    assert!(error_of(&v).contains("exceeded the limit of 1000"), "{v}");
}

#[test]
fn max_calls_from_a_project_refuses_the_third_call() {
    let script = "const out = []; for (let i = 0; i < 3; i++) { try { await tools.ls({}); out.push('ok') } catch (e) { out.push(e.message) } } return out";
    let (code, v, stderr) = run(&dirs(None, project_limit("max_calls", 2)), script, &[]);
    assert_eq!(code, Some(0), "{v} {stderr}");
    assert_eq!(v["value"][1], "ok", "{v}");
    assert!(
        v["value"][2]
            .as_str()
            .unwrap()
            .contains("Call limit reached"),
        "{v}"
    );
}

#[test]
fn max_calls_in_flight_from_a_project_refuses_a_burst() {
    // Four at once against a limit of two: the first call of a job may be answered in place (it
    // has then finished, and is no longer running), so three could legitimately all run; of
    // four, one is refused either way.
    let script = "try { await Promise.all([1, 2, 3, 4].map(() => tools.ls({}))); return 'all ran' } catch (e) { return e.message }";
    let (_, v, stderr) = run(&dirs(None, None), script, &[]);
    assert_eq!(v["value"], "all ran", "{v} {stderr}");
    let (_, v, _) = run(
        &dirs(None, project_limit("max_calls_in_flight", 2)),
        script,
        &[],
    );
    assert!(
        v["value"]
            .as_str()
            .unwrap()
            .contains("Too many calls at once"),
        "{v}"
    );
}

#[test]
fn max_depth_from_a_project_refuses_script_calls() {
    let script = "try { await tools.ls({}); return 'ran' } catch (e) { return e.message }";
    let (_, v, stderr) = run(&dirs(None, project_limit("max_depth", 1)), script, &[]);
    assert_eq!(
        v["value"], "ran",
        "a script's calls have depth 1: {v} {stderr}"
    );
    let (_, v, _) = run(&dirs(None, project_limit("max_depth", 0)), script, &[]);
    assert!(
        v["value"].as_str().unwrap().contains("limits.max_depth"),
        "{v}"
    );
}

#[test]
fn an_untrusted_project_cannot_raise_any_limit_the_user_did_not_set() {
    // Every key above its built-in default (max_depth has none: the user sets one here).
    let raised = json!({ "limits": {
        "heap_bytes": 4_294_967_296u64, "stack_bytes": 67_108_864, "timeout_ms": 3_600_000,
        "cpu_ms": 3_600_000, "max_output_tokens": 1_000_000, "max_output_bytes": 1_073_741_824,
        "max_calls": 99_999_999, "max_calls_in_flight": 1_000_000, "max_depth": 50
    }});
    let d = dirs(Some(json!({ "limits": { "max_depth": 1 } })), Some(raised));
    let allocate_300_mib = "const a = []; for (let i = 0; i < 300; i++) a.push(new Uint8Array(1024 * 1024)); return a.length";
    let (code, v, stderr) = run(&d, allocate_300_mib, &[]);
    assert_eq!(code, Some(1), "the 256 MiB default still holds: {v}");
    assert!(error_of(&v).contains("out of memory"), "{v}");
    for key in [
        "heap_bytes",
        "stack_bytes",
        "timeout_ms",
        "cpu_ms",
        "max_output_tokens",
        "max_output_bytes",
        "max_calls",
        "max_calls_in_flight",
        "max_depth",
    ] {
        assert!(
            stderr.contains(&format!("ignored `limits.{key}`")),
            "no warning for {key}:\n{stderr}"
        );
    }
    // The run's limits are the built-in defaults, every one.
    let (_, v, _) = run(&d, "return 1", &[]);
    assert_eq!(
        v["limits"],
        json!({"heap_bytes": 268435456, "stack_bytes": 1048576, "timeout_ms": 60000,
               "cpu_ms": 60000, "max_output_chars": 16777216, "max_output_items": 100000,
               "max_calls": 100000, "max_calls_in_flight": 4096, "max_output_tokens": 10000}),
        "{v}"
    );
}

#[test]
fn command_line_limits_and_script_options_only_lower() {
    let d = dirs(None, None);
    // The script asks for an hour; the operator said one second.
    let script =
        "// @options: {\"timeout_ms\": 3600000, \"max_output_tokens\": 1000000}\nwhile (true) {}";
    let (code, v, _) = run(&d, script, &["--timeout-ms", "1000"]);
    assert_eq!(code, Some(1), "{v}");
    assert!(error_of(&v).contains("timed out after 1000 ms"), "{v}");
    // A flag above the built-in default is not taken, and says how to raise it.
    let (code, v, stderr) = run(&d, "return 1", &["--heap-mb", "4096"]);
    assert_eq!(code, Some(0), "{v}");
    assert!(
        stderr.contains("heap_bytes = 4294967296, above the limit of 268435456")
            && stderr.contains("`limits.heap_bytes`"),
        "{stderr}"
    );
}
