use codemode_sandbox::*;

#[test]
fn options_line_is_parsed_and_line_numbers_kept() {
    let p =
        parse_source("// @options: {\"max_output_tokens\": 2000, \"timeout_ms\": 30000}\nreturn 1")
            .unwrap();
    assert_eq!(p.code, "\nreturn 1");
    assert_eq!(p.options.max_output_tokens, Some(2000));
    assert_eq!(p.options.timeout_ms, Some(30000));
    let p = parse_source("  // @options: {\"timeout_ms\": 5}\r\nreturn 1").unwrap();
    assert_eq!(p.code, "\nreturn 1");
    assert_eq!(p.options.timeout_ms, Some(5));
    let p = parse_source("return 2").unwrap();
    assert_eq!(p.code, "return 2");
    assert_eq!(p.options, ScriptOptions::default());
    assert_eq!(
        parse_source("// @options: {\"max_output_tokens\": 0}\nx")
            .unwrap()
            .options
            .max_output_tokens,
        Some(0)
    );
}

#[test]
fn bad_input_is_rejected_before_running() {
    let err = |s: &str| parse_source(s).unwrap_err().message;
    assert!(err("").contains("empty"));
    assert!(err("  \n ").contains("empty"));
    assert!(err("// @options: {\"yield\": 1}\ntext(1)").contains("the key `yield`"));
    assert!(err("x\n// @options: {}").contains("line 2"));
    assert!(err("x\n   // @options: {}").contains("line 2"));
    for bad in ["0", "2147483648", "1.5", "\"5\""] {
        assert!(
            err(&format!("// @options: {{\"timeout_ms\": {bad}}}\nx"))
                .contains("`timeout_ms` takes a whole number of milliseconds"),
            "{bad}"
        );
    }
    for bad in ["-1", "1.5"] {
        assert!(
            err(&format!("// @options: {{\"max_output_tokens\": {bad}}}\nx"))
                .contains("`max_output_tokens` takes a whole number")
        );
    }
    assert!(err("// @options: {}").contains("comes the script itself"));
    assert!(err("// @options: {\"timeout_ms\": 5}\n\n").contains("comes the script itself"));
    assert!(err("// @options: nope\nx").starts_with("The // @options: line is not valid JSON"));
    assert!(err("// @options: []\nx").starts_with("The // @options: line needs a JSON object"));
    assert!(err("// @options:\nx").starts_with("The // @options: line needs a JSON object"));
}

#[test]
fn options_lower_or_pick_within_the_maximum() {
    let defaults = Limits::default();
    let maximum = Limits {
        timeout_ms: 120_000,
        max_output_tokens: 20_000,
        ..Limits::default()
    };
    let o = ScriptOptions {
        timeout_ms: Some(500),
        max_output_tokens: Some(100),
    };
    let l = Limits::effective(&defaults, &maximum, &o);
    assert_eq!((l.timeout_ms, l.max_output_tokens), (500, 100));
    let o = ScriptOptions {
        timeout_ms: Some(10_000_000),
        max_output_tokens: Some(10_000_000),
    };
    let l = Limits::effective(&defaults, &maximum, &o);
    assert_eq!((l.timeout_ms, l.max_output_tokens), (120_000, 20_000));
}

#[test]
fn identifiers_follow_the_reference() {
    for (raw, id) in [
        ("mcp__docs__search", "mcp__docs__search"),
        ("my-tool", "my_tool"),
        ("1abc", "_abc"),
        ("", "_"),
        ("ä", "_"),
        ("a.b", "a_b"),
        ("$x", "$x"),
    ] {
        assert_eq!(to_identifier(raw), id);
    }
}
