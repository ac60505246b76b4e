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
fn options_only_lower_the_operators_limits() {
    // The operator chose 3 s and 100 tokens (built in, settings or command line: all of them
    // arrive as the defaults); the maximum is far above.
    let defaults = Limits {
        timeout_ms: 3_000,
        max_output_tokens: 100,
        ..Limits::default()
    };
    let maximum = SandboxConfig::default().maximum;
    let lower = ScriptOptions {
        timeout_ms: Some(500),
        max_output_tokens: Some(10),
        ..ScriptOptions::default()
    };
    let l = Limits::effective(&defaults, &maximum, &lower);
    assert_eq!((l.timeout_ms, l.max_output_tokens), (500, 10));
    for raise in [
        ScriptOptions {
            timeout_ms: Some(3_600_000),
            max_output_tokens: Some(1_000_000),
            ..ScriptOptions::default()
        },
        ScriptOptions {
            timeout_ms: Some(3_001),
            max_output_tokens: Some(101),
            ..ScriptOptions::default()
        },
        ScriptOptions {
            timeout_ms: Some(2_147_483_647),
            max_output_tokens: Some((1 << 53) - 1),
            ..ScriptOptions::default()
        },
    ] {
        let l = Limits::effective(&defaults, &maximum, &raise);
        assert_eq!(l, defaults, "{raise:?} raised a limit");
    }
    // A default above the maximum is still cut to the maximum.
    let huge = Limits {
        timeout_ms: u64::MAX,
        ..Limits::default()
    };
    let l = Limits::effective(&huge, &maximum, &ScriptOptions::default());
    assert_eq!(l.timeout_ms, maximum.timeout_ms);
}

#[test]
fn a_byte_order_mark_does_not_hide_the_options_line() {
    for src in [
        "\u{feff}// @options: {\"timeout_ms\": 5}\nreturn 1",
        "\u{feff}  // @options: {\"timeout_ms\": 5}\r\nreturn 1",
        " \u{feff}// @options: {\"timeout_ms\": 5}\nreturn 1",
    ] {
        let p = parse_source(src).unwrap();
        assert_eq!(p.options.timeout_ms, Some(5), "{src:?}");
        assert!(!p.code.contains("@options"), "{src:?}");
    }
    // Hidden behind a BOM on a later line, it is still refused as misplaced.
    let e = parse_source("x\n\u{feff}// @options: {}").unwrap_err();
    assert!(e.message.contains("line 2"), "{}", e.message);
    // Bad options behind a BOM are reported, not ignored.
    let e = parse_source("\u{feff}// @options: {\"timeout_ms\": \"long\"}\nx").unwrap_err();
    assert!(e.message.contains("timeout_ms"), "{}", e.message);
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

#[test]
fn yield_after_ms_is_an_option_in_range() {
    let p = parse_source("// @options: {\"yield_after_ms\": 250}\nreturn 1").unwrap();
    assert_eq!(p.options.yield_after_ms, Some(250));
    for bad in ["0", "-1", "\"soon\"", "2147483648"] {
        let e = parse_source(&format!(
            "// @options: {{\"yield_after_ms\": {bad}}}\nreturn 1"
        ))
        .unwrap_err();
        assert!(e.message.contains("yield_after_ms"), "{bad}: {e}");
    }
}
