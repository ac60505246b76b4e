//! The read-only globals (`runtime::READ_ONLY_GLOBALS`) are answered on the host without the
//! gate, so what a script passes them must not make the host work or allocate without bound.

mod common;

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
