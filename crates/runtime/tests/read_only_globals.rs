//! The read-only globals (`runtime::READ_ONLY_GLOBALS`) are answered on the host without the
//! gate, so what a script passes them must not make the host work or allocate without bound.

use crate::common;

use codemode_runtime::ScriptRequest;
use common::*;

#[tokio::test]
async fn a_huge_search_query_is_refused_with_the_limit() {
    let world = world(Options::default()).await;
    // 6 MB of U+FDFA is 108 million characters once normalized: the host allocated about
    // 600 MB to split it into words.
    let run = world
        .codemode
        .run_script(ScriptRequest::new(
            r#"const query = "\uFDFA".repeat(2000000);
               return await searchTools(query).then(hits => "answered: " + hits.length, e => e.name + ": " + e.message);"#,
            "s1",
        ))
        .await;
    assert!(!run.is_error, "{}", run.text);
    let answer = run.result.unwrap().value.unwrap();
    let answer = answer.as_str().unwrap();
    assert!(
        answer.starts_with("TypeError: searchTools()") && answer.contains("at most"),
        "the script is told the query's limit: {answer}"
    );
    // A query within the limit is still answered.
    let run = world
        .codemode
        .run_script(ScriptRequest::new(
            r#"return (await searchTools("echo ".repeat(1000))).map(h => h.name);"#,
            "s1",
        ))
        .await;
    assert!(!run.is_error, "{}", run.text);
    assert!(run.text.contains("echo"), "{}", run.text);
}

/// Red team: `describeTool` and `describeNamespace` repeated an unknown name twice in their
/// error. A 60-million-character name made the host hold 582 MB and the worker die building
/// the exception. The error quotes the start of the name and says how long it was.
#[tokio::test]
async fn an_unknown_huge_name_is_not_repeated_in_the_error() {
    let world = world(Options::default()).await;
    let run = world
        .codemode
        .run_script(ScriptRequest::new(
            r#"const name = "x".repeat(10000000);
               const tool = await describeTool(name).then(() => "found", e => e.message);
               const ns = await describeNamespace(name).then(() => "found", e => e.message);
               return [tool, ns];"#,
            "s1",
        ))
        .await;
    assert!(!run.is_error, "{}", run.text);
    let answers = run.result.unwrap().value.unwrap();
    for answer in answers.as_array().unwrap() {
        let answer = answer.as_str().unwrap();
        assert!(
            answer.len() < 1_000 && answer.contains("(10000000 characters)"),
            "{} characters: {}",
            answer.len(),
            &answer[..answer.len().min(300)]
        );
    }
}

/// Each answer is quick now, but a script may ask again and again: what the host spends
/// answering is bounded by the script's CPU budget, as the time its JavaScript runs is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_answers_are_charged_to_the_scripts_cpu_budget() {
    use codemode_gate::Registry;
    use codemode_spec::{CallKind, Exposure};

    let registry = Registry::new();
    for i in 0..3_000 {
        registry
            .register(Echo::tool(
                &format!("mcp__area{}__create_record_number_{i}", i % 40),
                CallKind::Tool,
                Exposure::Deferred,
            ))
            .unwrap();
    }
    let (codemode, _audit) = codemode_over(registry, 1_000, 30_000);
    // Every unknown name is compared with all 3,000 tools' names for the closest.
    let run = codemode
        .run_script(ScriptRequest::new(
            r#"let last = "";
               for (let i = 0; i < 2000; i++) {
                 last = await describeTool("create_recrd_numbr_" + i).then(() => "found", e => e.message);
                 if (last.includes("CPU budget")) break;
               }
               return last;"#,
            "s1",
        ))
        .await;
    assert!(!run.is_error, "{}", run.text);
    let last = run.result.unwrap().value.unwrap();
    let last = last.as_str().unwrap();
    assert!(
        last.contains("CPU budget of 1000 ms"),
        "the script is told its helpers used up its CPU budget: {last}"
    );
}

/// Red team: a server lists 3,000 tools with long descriptions. The first discovery call of a
/// script builds the search index over all of them, seconds of host CPU in a debug build; that
/// building was not charged, so every script got it free and could then search on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn building_the_search_index_is_charged_to_the_scripts_cpu_budget() {
    use codemode_gate::Registry;
    use codemode_spec::{CallKind, Exposure, ToolSpec};

    let registry = Registry::new();
    let words: String = (0..200).map(|w| format!("word{w} ")).collect();
    for i in 0..3_000 {
        let name = format!("mcp__area{}__create_record_number_{i}", i % 40);
        let mut spec = ToolSpec::new(
            &name,
            format!("{words}{i}"),
            serde_json::json!({"type": "object"}),
        );
        spec.kind = CallKind::Tool;
        spec.exposure = Exposure::Deferred;
        registry.register(std::sync::Arc::new(Echo(spec))).unwrap();
    }
    // What building costs here, measured apart: the script's budget is a third of it.
    let specs = registry.specs();
    let build = std::time::Instant::now();
    drop(codemode_declarations::ToolIndex::new(&specs, &[]));
    let build = build.elapsed();
    let budget_ms = u64::try_from(build.as_millis() / 3).unwrap().max(1);
    let (codemode, _audit) = codemode_over(registry, budget_ms, 60_000);
    // The prelude declares no deferred tool, so setting up stays within the budget.
    let run = codemode
        .run_script(ScriptRequest::new(
            r#"await searchTools("record");
               return await searchTools("area7").then(h => "answered " + h.length, e => e.message);"#,
            "s1",
        ))
        .await;
    assert!(!run.is_error, "{}", run.text);
    let answer = run.result.unwrap().value.unwrap();
    let answer = answer.as_str().unwrap().to_string();
    assert!(
        answer.contains(&format!("CPU budget of {budget_ms} ms")),
        "building the index ({build:?}) was not charged to a budget of {budget_ms} ms: {answer}"
    );
}

/// A codemode over `registry` whose scripts may use `cpu_ms` of CPU; keep the audit path alive.
fn codemode_over(
    registry: codemode_gate::Registry,
    cpu_ms: u64,
    timeout_ms: u64,
) -> (codemode_runtime::Codemode, tempfile::TempPath) {
    use codemode_gate::{AuditLog, Gate, PolicySet};
    let audit = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("test.cedar", PERMIT_ALL).unwrap())
        .audit(AuditLog::open_with_key(&audit, test_key()).unwrap())
        .build()
        .unwrap();
    let mut sandbox = codemode_sandbox::SandboxConfig::default();
    sandbox.defaults.cpu_ms = cpu_ms;
    sandbox.defaults.timeout_ms = timeout_ms;
    let codemode = codemode_runtime::Codemode::builder()
        .gate(gate)
        .sandbox_config(sandbox)
        .build()
        .unwrap();
    (codemode, audit)
}
