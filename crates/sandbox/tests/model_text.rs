mod common;
use codemode_sandbox::*;
use common::*;

fn body(t: &ModelText) -> &str {
    let mut it = t.text.splitn(4, '\n');
    let (a, b, c) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    assert!(a == "Script completed" || a == "Script failed", "{a}");
    assert!(
        b.starts_with("Wall time ") && b.ends_with(" seconds"),
        "{b}"
    );
    assert_eq!(c, "Output:");
    it.next().unwrap_or("")
}

async fn render(src: &str) -> ModelText {
    let r = run(src).await;
    render_model_text(&r, r.limits.max_output_tokens)
}

async fn layout_follows_the_reference() {
    let t = render("text('only')").await;
    assert!(t.text.starts_with("Script completed\nWall time "));
    assert_eq!(body(&t), "only");
    let t = render("text('a'); text({b:1}); console.log('x', 1, NaN); return 42").await;
    assert_eq!(
        body(&t),
        "==> text 1/3 <==\na\n==> text 2/3 <==\n{\"b\":1}\n==> text 3/3 <==\n42\n<console_output>\nx 1 NaN\n</console_output>"
    );
    let t = render("console.log('c1'); text('t1'); console.log('c2')").await;
    assert_eq!(body(&t), "t1\n<console_output>\nc1\nc2\n</console_output>");
    let t = render("console.log(); console.log(''); text('x')").await;
    assert_eq!(body(&t), "x\n<console_output>\n\n\n</console_output>");
    assert_eq!(body(&render("return 'plain string'").await), "plain string");
    assert_eq!(
        body(&render("text('xxx'); exit(); text('never')").await),
        "xxx"
    );
    let t = render(
        "text(\"partial\");\nawait tools.echo({ text: \"x\" });\nthrow new Error(\"boom\");",
    )
    .await;
    assert!(t.text.starts_with("Script failed\n"));
    let b = body(&t);
    assert!(
        b.starts_with("partial\nScript error:\nError: boom\n    at "),
        "{b}"
    );
    assert!(b.contains("codemode.js:3:"));
    assert!(
        b.ends_with("\n\nTool calls made before the failure (they are not undone): echo (ok)"),
        "{b}"
    );
    assert_eq!(
        body(&render("throw { code: 7 }").await),
        "Script error:\nError: {\"code\":7}\n\nNo tool calls were made."
    );
    assert_eq!(
        body(&render("// @options: {\"timeout_ms\": 200}\nwhile (true) {}").await),
        "Script error:\nScript timed out: Execution timed out after 200 ms\n\nNo tool calls were made."
    );
    let t = render(&format!(
        "text('before'); image('data:image/png;base64,{PNG}'); text('after')"
    ))
    .await;
    assert_eq!(
        body(&t),
        "==> text 1/2 <==\nbefore\n[Image (image/png, 70B)]\n==> text 2/2 <==\nafter"
    );
}

async fn long_output_is_truncated_and_saved_privately() {
    let r = run("// @options: {\"max_output_tokens\": 10}\nfor (let i = 0; i < 100; i++) text(\"row \" + i);").await;
    assert_eq!(r.limits.max_output_tokens, 10);
    let t = render_model_text(&r, r.limits.max_output_tokens);
    let b = body(&t);
    assert!(b.starts_with("Warning: output truncated (about 671 tokens in all)\nTotal output lines: 200\n\n==> text 1/100 <==\nr…661 tokens truncated…t 100/100 <==\nrow 99\n\n[Full output: "), "{b}");
    let path = t.full_output_path.clone().unwrap();
    assert!(b.ends_with(&format!("{} (read with offset/limit)]", path.display())));
    let saved = std::fs::read_to_string(&path).unwrap();
    assert!(saved.starts_with("==> text 1/100 <==\nrow 0\n") && saved.ends_with("row 99"));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    std::fs::remove_file(&path).unwrap();
    let r = run("// @options: {\"max_output_tokens\": 0}\ntext(\"hello\")").await;
    let t = render_model_text(&r, 0);
    assert!(body(&t).starts_with("Warning: output truncated (about 2 tokens in all)\nTotal output lines: 1\n\n…2 tokens truncated…\n\n[Full output: "));
    std::fs::remove_file(t.full_output_path.unwrap()).unwrap();
    // Serialized results use the reference's field names.
    let r = run("text('a'); console.log('b'); store('k', 1); await tools.echo(1); return 1").await;
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["output"][1]["console"], true);
    assert_eq!(v["storeWrites"][0]["key"], "k");
    assert_eq!(v["calls"][0]["status"], "ok");
    assert!(v["calls"][0]["durationMs"].is_number());
    let e = serde_json::to_value(run("throw new Error('x')").await).unwrap();
    assert_eq!(e["error"]["kind"], "script");
}

both_modes!(
    layout_follows_the_reference,
    long_output_is_truncated_and_saved_privately
);
