//! `textOf(result)`: the text of an MCP result's text blocks, the line every MCP script writes.

mod common;
use common::*;
use serde_json::json;

#[tokio::test]
async fn joins_the_text_blocks_of_a_result_an_array_or_a_string() {
    let result = r#"{ content: [
        { type: "text", text: "one " },
        { type: "image", data: "AAAA", mimeType: "image/png" },
        { type: "resource_link", uri: "demo://x", name: "x" },
        { type: "resource", resource: { uri: "demo://y", text: "not a text block" } },
        { type: "text", text: "two" } ], isError: false }"#;
    assert_eq!(
        value(&format!("return textOf({result})")).await,
        json!("one two")
    );
    assert_eq!(
        value(&format!("return textOf(({result}).content)")).await,
        json!("one two")
    );
    assert_eq!(
        value("return textOf('already text')").await,
        json!("already text")
    );
    assert_eq!(value("return textOf({ content: [] })").await, json!(""));
    // A tool's result passes through unchanged.
    assert_eq!(
        value(
            r#"return textOf(await tools.echo({ content: [{ type: "text", text: "echoed" }] }))"#
        )
        .await,
        json!("echoed")
    );
}

#[tokio::test]
async fn odd_blocks_are_skipped_and_wrong_values_are_explained() {
    // Blocks that are not text blocks, or whose text is not a string, add nothing.
    assert_eq!(
        value(r#"return textOf({ content: [null, 7, "s", { type: "text" }, { type: "text", text: 5 }, { type: "TEXT", text: "no" }, { type: "text", text: "yes" }] })"#).await,
        json!("yes")
    );
    for bad in [
        "undefined",
        "null",
        "42",
        "{}",
        "{ content: 'x' }",
        "{ content: { length: 1, 0: { type: 'text', text: 'a' } } }",
    ] {
        let message = value(&format!("try {{ textOf({bad}); return 'no error' }} catch (e) {{ return e.name + ': ' + e.message }}")).await;
        let message = message.as_str().unwrap().to_string();
        assert!(
            message.starts_with("TypeError: textOf() takes a tool result with a `content` array"),
            "{bad}: {message}"
        );
    }
    // A getter that throws reaches the script as its own error, not a host failure.
    assert_eq!(
        value(r#"try { textOf({ get content() { throw new RangeError("mine") } }) } catch (e) { return e.message }"#).await,
        json!("mine")
    );
}

#[tokio::test]
async fn scripts_cannot_replace_it() {
    assert_eq!(
        value(r#"try { textOf = () => "fake" } catch (e) {} globalThis.textOf = () => "fake"; return textOf({ content: [{ type: "text", text: "real" }] })"#).await,
        json!("real")
    );
    let e = error(r#""use strict"; textOf = 1"#).await;
    assert_eq!(e.name.as_deref(), Some("TypeError"), "{e:?}");
    // Large results are fine.
    assert_eq!(
        value(r#"return textOf({ content: Array.from({ length: 100000 }, () => ({ type: "text", text: "x" })) }).length"#).await,
        json!(100000)
    );
}
