//! searchTools / describeTool / describeNamespace behaviour.

mod support;

use std::time::Instant;

use codemode_declarations::{LookupError, SearchError, SearchOptions, ToolIndex};
use codemode_spec::{Exposure, NamespaceSpec, ToolSpec};
use serde_json::json;

fn index() -> ToolIndex {
    let (mut tools, mut namespaces) = support::all_mcp();
    tools.extend(support::coding_tools());
    let (catalog, catalog_ns) = support::catalog(20);
    tools.extend(catalog);
    namespaces.extend(catalog_ns);
    let mut issues = ToolSpec::new(
        "mcp__dev_radius__search_issues",
        "Search issues in the tracker",
        json!({"type": "object", "properties": {"query": {"type": "string"}}}),
    );
    issues.namespace = Some("mcp__dev_radius".into());
    issues.exposure = Exposure::Deferred;
    tools.push(issues);
    namespaces.push(NamespaceSpec {
        name: "mcp__dev_radius".into(),
        description: Some("Issue tracker".into()),
        instructions: Some("Use search_issues first.".into()),
        unavailable: None,
    });
    let mut hidden = ToolSpec::new("secret_reader", "Reads secrets", json!({}));
    hidden.exposure = Exposure::Hidden;
    tools.push(hidden);
    ToolIndex::new(&tools, &namespaces)
}

fn names(index: &ToolIndex, query: &str, opts: &SearchOptions) -> Vec<String> {
    index
        .search(query, opts)
        .unwrap()
        .into_iter()
        .map(|h| h.name)
        .collect()
}

#[test]
fn exact_names_come_first() {
    let index = index();
    let opts = SearchOptions::default();
    assert_eq!(names(&index, "read", &opts)[0], "read");
    assert_eq!(names(&index, "grep", &opts)[0], "grep");
    assert_eq!(
        names(&index, "mcp__memory__read_graph", &opts)[0],
        "mcp__memory__read_graph"
    );
    // A local name (after the last `__`) is an exact match too.
    assert_eq!(
        names(&index, "read_graph", &opts)[0],
        "mcp__memory__read_graph"
    );
    assert_eq!(
        names(&index, "readGraph", &opts)[0],
        "mcp__memory__read_graph"
    );
}

#[test]
fn ranking_uses_names_descriptions_parameters_and_plurals() {
    let index = index();
    let opts = SearchOptions {
        limit: 3,
        namespace: None,
    };
    let hits = index.search("issue search", &opts).unwrap();
    assert_eq!(
        hits[0].name, "mcp__dev_radius__search_issues",
        "deferred tools are searchable"
    );
    assert!(
        hits[0]
            .description
            .starts_with("Search issues in the tracker\n\n```ts\n")
    );
    assert_eq!(hits[0].identifier, "mcp__dev_radius__search_issues");
    // Plural query, singular name; kebab-case query.
    assert_eq!(
        names(&index, "observations add", &opts)[0],
        "mcp__memory__add_observations"
    );
    assert_eq!(
        names(&index, "list-directories with sizes", &opts)[0],
        "mcp__filesystem__list_directory_with_sizes"
    );
    // A parameter name only.
    assert!(names(&index, "old_string", &opts).contains(&"edit".to_string()));
    // Case folding and camelCase in the query.
    assert_eq!(
        names(&index, "CreateEntities", &opts)[0],
        "mcp__memory__create_entities"
    );
    // Hidden tools are never found.
    assert!(
        names(
            &index,
            "secret reader",
            &SearchOptions {
                limit: 50,
                namespace: None
            }
        )
        .iter()
        .all(|n| n != "secret_reader")
    );
    assert!(index.describe_tool("secret_reader").is_err());
}

#[test]
fn namespace_filter_and_limit() {
    let index = index();
    let opts = SearchOptions {
        limit: 5,
        namespace: Some("memory".into()),
    };
    let hits = names(&index, "delete", &opts);
    assert!(!hits.is_empty() && hits.len() <= 5);
    assert!(
        hits.iter().all(|n| n.starts_with("mcp__memory__")),
        "{hits:?}"
    );
    let opts = SearchOptions {
        limit: 2,
        namespace: Some("mcp__dev-radius".into()),
    };
    assert_eq!(
        names(&index, "search", &opts),
        vec!["mcp__dev_radius__search_issues"]
    );
    let opts = SearchOptions {
        limit: 8,
        namespace: Some("nope".into()),
    };
    assert!(names(&index, "search", &opts).is_empty());
}

#[test]
fn empty_and_huge_queries() {
    let index = index();
    assert_eq!(
        index.search("", &SearchOptions::default()),
        Err(SearchError::EmptyQuery)
    );
    assert_eq!(
        index.search(" \n\t", &SearchOptions::default()),
        Err(SearchError::EmptyQuery)
    );
    let zero = SearchOptions {
        limit: 0,
        namespace: None,
    };
    assert_eq!(index.search("read", &zero), Err(SearchError::InvalidLimit));
    assert!(SearchError::EmptyQuery.to_string().contains("searchTools("));
    // Only stop words: nothing to match, no error.
    assert!(
        index
            .search("the of and", &SearchOptions::default())
            .unwrap()
            .is_empty()
    );

    let words = [
        "file",
        "directory",
        "read",
        "entity",
        "billing",
        "zzz",
        "ticket",
        "create",
        "log",
        "🚀",
    ];
    let query: Vec<String> = (0..10_000)
        .map(|i| format!("{}{}", words[i % words.len()], i % 37))
        .collect();
    let query = query.join(" ");
    let start = Instant::now();
    let hits = index.search(&query, &SearchOptions::default()).unwrap();
    let took = start.elapsed();
    assert!(hits.len() <= 8);
    // Generous: the point is that it does not blow up (it takes a few ms).
    assert!(took.as_secs() < 5, "10,000-word query took {took:?}");
    let plain = "read file ".repeat(5_000);
    assert!(
        !index
            .search(&plain, &SearchOptions::default())
            .unwrap()
            .is_empty()
    );
}

#[test]
fn describe_tool_and_namespace() {
    let index = index();
    let sample = index.describe_tool("read").unwrap();
    assert!(sample.starts_with("Read a file."));
    assert!(sample.contains("declare const tools: {\nread(args: {"));
    // By identifier as well as raw name.
    let mut dashed = ToolSpec::new("lint-js", "Lint.", json!({"type": "object"}));
    dashed.exposure = Exposure::Codemode;
    let small = ToolIndex::new(&[dashed], &[]);
    assert!(small.describe_tool("lint_js").is_ok());
    assert!(small.describe_tool("lint-js").is_ok());
    assert!(small.describe_tool("nope").is_err());

    let ns = index.describe_namespace("dev_radius").unwrap();
    assert_eq!(
        ns,
        json!({"name": "mcp__dev_radius", "description": "Issue tracker", "instructions": "Use search_issues first.", "tools": ["mcp__dev_radius__search_issues"]})
    );
    assert_eq!(index.describe_namespace("mcp__dev-radius"), Ok(ns));
    assert!(index.describe_namespace("x").is_err());
    let memory = index.describe_namespace("mcp__memory").unwrap();
    assert_eq!(memory["tools"].as_array().unwrap().len(), 9);
}

#[test]
fn shared_identifiers_are_reported_not_shadowed() {
    let tools = vec![
        ToolSpec::new("my-tool", "Dashes", json!({"type": "object"})),
        ToolSpec::new("my.tool", "Dots", json!({"type": "object"})),
    ];
    let index = ToolIndex::new(&tools, &[]);
    assert_eq!(index.collisions().len(), 1);
    let both = index.describe_tool("my_tool").unwrap();
    assert!(
        both.contains("ambiguous") && both.contains("Dashes") && both.contains("Dots"),
        "{both}"
    );
    let one = index.describe_tool("my-tool").unwrap();
    assert!(
        one.starts_with("Dashes") && one.contains("\"my-tool\"(args: "),
        "{one}"
    );
    let hits = index.search("tool", &SearchOptions::default()).unwrap();
    assert_eq!(hits.len(), 2);
    let all = index.all_tools();
    assert_eq!(
        all.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(),
        vec!["my-tool", "my.tool"]
    );
}

#[test]
fn order_is_exact_then_coverage_then_score() {
    let mk =
        |name: &str, description: &str| ToolSpec::new(name, description, json!({"type": "object"}));
    let tools = vec![
        mk("upload_report", "Send a report file to storage."),
        mk("report", "Build the weekly report."),
        mk(
            "weekly_digest",
            "A digest of the week's report and report summary report.",
        ),
        mk("storage_stats", "Storage usage numbers."),
    ];
    let index = ToolIndex::new(&tools, &[]);
    let opts = SearchOptions::default();
    // Exact name first even though other tools mention "report" more often.
    assert_eq!(names(&index, "report", &opts)[0], "report");
    // Two query words covered beats one word matched many times.
    let hits = names(&index, "upload storage", &opts);
    assert_eq!(hits[0], "upload_report");
    assert_eq!(hits[1], "storage_stats");
    // Same coverage: the name field outweighs the description.
    let hits = names(&index, "digest", &opts);
    assert_eq!(hits, vec!["weekly_digest"]);
    let hits = index.search("storage", &opts).unwrap();
    assert_eq!(hits[0].name, "storage_stats", "{hits:?}");
    assert!(hits[0].score > hits[1].score);
    // Registration order does not matter.
    let mut reversed = tools.clone();
    reversed.reverse();
    let again = ToolIndex::new(&reversed, &[]);
    assert_eq!(
        names(&again, "report storage", &opts),
        names(&index, "report storage", &opts)
    );
}

/// The first version ranked `echo` and `get_env` among the top ten for "resource": they matched
/// only through the server's instructions, which mention resources.
#[test]
fn a_namespace_text_alone_does_not_make_a_hit() {
    let (tools, mut namespaces) = support::all_mcp();
    for ns in &mut namespaces {
        if ns.name == "mcp__everything" {
            ns.instructions = Some(
                "Tools, resources, resource templates and prompts for testing; resource links and embedded resources.".into(),
            );
        }
    }
    let index = ToolIndex::new(&tools, &namespaces);
    let opts = SearchOptions {
        limit: 10,
        namespace: None,
    };
    let hits = names(&index, "resource", &opts);
    assert!(!hits.is_empty());
    for noise in [
        "mcp__everything__echo",
        "mcp__everything__get_env",
        "mcp__everything__get_sum",
    ] {
        assert!(!hits.contains(&noise.to_string()), "{noise} in {hits:?}");
    }
    for wanted in [
        "mcp__everything__get_resource_links",
        "mcp__everything__get_resource_reference",
        "mcp__everything__gzip_file_as_resource",
    ] {
        let at = hits.iter().position(|h| h == wanted);
        assert!(
            at.is_some_and(|i| i < 4),
            "{wanted} not near the top of {hits:?}"
        );
    }
    // When nothing matches by its own text, the namespace's text still finds its tools.
    let hits = names(&index, "prompts templates", &opts);
    assert!(
        !hits.is_empty() && hits.iter().all(|h| h.starts_with("mcp__everything__")),
        "{hits:?}"
    );
}

#[test]
fn titles_allowed_values_and_result_fields_are_searched() {
    let mut tool = ToolSpec::new(
        "wx",
        "Current conditions.",
        json!({"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}}),
    );
    tool.annotations.title = Some("Weather station".into());
    tool.output_schema = Some(codemode_spec::Schema::from(
        codemode_declarations::mcp_result_schema(
            json!({"type": "object", "properties": {"humidity": {"type": "number"}}}).as_object(),
        ),
    ));
    let other = ToolSpec::new("echo", "Echo text back.", json!({"type": "object"}));
    let index = ToolIndex::new(&[tool, other], &[]);
    let opts = SearchOptions::default();
    assert_eq!(names(&index, "weather", &opts), vec!["wx"]);
    assert_eq!(names(&index, "fahrenheit", &opts), vec!["wx"]);
    assert_eq!(names(&index, "humidity", &opts), vec!["wx"]);
    // The MCP result's own fields (content, text, …) are not words of every MCP tool.
    assert!(names(&index, "content", &opts).is_empty());
}

#[test]
fn unknown_names_throw_with_the_closest() {
    let index = index();
    let err = index.describe_tool("mcp__memory__read_grap").unwrap_err();
    let LookupError::UnknownTool { closest, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(closest[0], "mcp__memory__read_graph");
    let message = err.to_string();
    assert!(
        message.contains("Closest: tools.mcp__memory__read_graph"),
        "{message}"
    );
    assert!(message.contains("searchTools("), "{message}");
    // The part after the namespace is enough.
    let err = index.describe_tool("open_node").unwrap_err().to_string();
    assert!(err.contains("tools.mcp__memory__open_nodes"), "{err}");
    // Nothing close: no guesses, a pointer to search instead.
    let err = index.describe_tool("qqqqqqqq").unwrap_err().to_string();
    assert!(
        err.contains("None is close") && err.contains("searchTools("),
        "{err}"
    );
    // Hidden tools are not suggested.
    let err = index.describe_tool("secret_readr").unwrap_err().to_string();
    assert!(!err.contains("secret_reader"), "{err}");

    let err = index.describe_namespace("mcp__memroy").unwrap_err();
    let LookupError::UnknownNamespace { known, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(
        known[0], "mcp__memory",
        "the closest namespace first: {known:?}"
    );
    assert!(known.len() <= 20);
    let empty = ToolIndex::new(&[], &[]);
    assert!(
        empty
            .describe_namespace("x")
            .unwrap_err()
            .to_string()
            .contains("no namespaces")
    );
}

#[test]
fn describe_tool_can_return_the_input_schema() {
    let index = index();
    let schema = index.input_schema("mcp__memory__create_entities").unwrap();
    assert_eq!(schema["required"], json!(["entities"]));
    assert_eq!(
        index.input_schema("read").unwrap(),
        support::coding_tools()
            .into_iter()
            .find(|t| t.name == "read")
            .unwrap()
            .input_schema
            .value()
    );
    assert!(matches!(
        index.input_schema("nope_nope"),
        Err(LookupError::UnknownTool { .. })
    ));
    let tools = vec![
        ToolSpec::new("my-tool", "Dashes", json!({"type": "object"})),
        ToolSpec::new("my.tool", "Dots", json!({"type": "object"})),
    ];
    let shared = ToolIndex::new(&tools, &[]);
    let err = shared.input_schema("my_tool").unwrap_err().to_string();
    assert!(
        err.contains("my-tool, my.tool") && err.contains("raw name"),
        "{err}"
    );
    assert_eq!(
        shared.input_schema("my.tool").unwrap(),
        json!({"type": "object"})
    );
}

/// An unknown name of a megabyte is answered (as unknown) at once: the host does not compare it
/// letter by letter with every tool's names, which took minutes and stopped for no deadline.
#[test]
fn a_huge_unknown_name_is_answered_at_once() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let index = index();
        let words: String = (0..1 << 17).map(|i| format!("w{i} ")).collect();
        for name in ["a".repeat(1 << 20), "\u{e9}".repeat(1 << 19), words] {
            let described = index.describe_tool(&name);
            let schema = index.input_schema(&name);
            let namespace = index.describe_namespace(&name);
            if tx.send((described, schema, namespace)).is_err() {
                return;
            }
        }
    });
    for _ in 0..3 {
        let (described, schema, namespace) = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("each huge name is answered within 30 s");
        assert!(
            matches!(described, Err(LookupError::UnknownTool { .. })),
            "{described:?}"
        );
        assert!(
            matches!(schema, Err(LookupError::UnknownTool { .. })),
            "{schema:?}"
        );
        assert!(
            matches!(namespace, Err(LookupError::UnknownNamespace { .. })),
            "{namespace:?}"
        );
    }
}

/// `ALL_TOOLS` goes into every script whole: past its byte bound it keeps each tool's
/// description alone, cut to an equal share, and never passes the bound; `describeTool` still
/// has the whole sample. A catalog of ordinary size keeps every sample.
#[test]
fn all_tools_descriptions_stay_within_their_bound() {
    const BOUND: usize = 2 * 1024 * 1024;
    let (mut tools, _) = support::all_mcp();
    tools.extend(support::coding_tools());
    let (catalog, _) = support::catalog(20);
    tools.extend(catalog);
    let ordinary = codemode_declarations::all_tools_descriptions(&tools, BOUND);
    for (tool, description) in tools.iter().zip(&ordinary) {
        assert_eq!(description, &codemode_declarations::tool_sample(tool));
    }
    let ordinary_bytes: usize = ordinary.iter().map(String::len).sum();
    assert!(
        ordinary_bytes * 4 < BOUND,
        "{} tools' samples take {ordinary_bytes} bytes",
        tools.len()
    );

    // Past the bound (a smaller one here, for a test's time): 500 tools with large schemas and
    // long descriptions in two scripts.
    const SMALL_BOUND: usize = 256 * 1024;
    let big: Vec<ToolSpec> = (0..500)
        .map(|i| {
            let properties: serde_json::Map<String, serde_json::Value> = (0..40)
                .map(|p| {
                    (
                        format!("field_{p}"),
                        json!({"type": "string", "description": format!("Field {p} of tool {i}, as the service names it.")}),
                    )
                })
                .collect();
            let mut spec = ToolSpec::new(
                format!("mcp__big__tool_{i}"),
                format!("Éditer le registre {i} — {}", "données ".repeat(100)),
                json!({"type": "object", "properties": properties}),
            );
            spec.namespace = Some("mcp__big".into());
            spec
        })
        .collect();
    let whole: usize = big
        .iter()
        .map(|t| codemode_declarations::tool_sample(t).len())
        .sum();
    assert!(whole > 4 * SMALL_BOUND, "the fixture is too small: {whole}");
    let short = codemode_declarations::all_tools_descriptions(&big, SMALL_BOUND);
    assert_eq!(short.len(), big.len());
    let total: usize = short.iter().map(String::len).sum();
    assert!(total <= SMALL_BOUND, "{total}");
    let share = SMALL_BOUND / big.len();
    for (tool, description) in big.iter().zip(&short) {
        assert!(description.len() <= share, "{}", description.len());
        assert!(description.starts_with(&format!("Éditer le registre {}", &tool.name[15..])));
        assert!(description.ends_with('…'), "{description}");
    }
    let index = ToolIndex::new(&big, &[]);
    let sample = index.describe_tool("mcp__big__tool_7").unwrap();
    assert!(sample.contains("field_39"), "{sample}");

    // Beside that server, the built-ins and a small server keep their whole samples: each
    // namespace has its share, so one server's size does not cut the others' text.
    let coding = support::coding_tools();
    let (memory, _) = support::mcp_server("server-memory");
    let mut mixed = big.clone();
    mixed.extend(coding.iter().cloned());
    mixed.extend(memory.iter().cloned());
    let descriptions = codemode_declarations::all_tools_descriptions(&mixed, SMALL_BOUND);
    let total: usize = descriptions.iter().map(String::len).sum();
    assert!(total <= SMALL_BOUND, "{total}");
    for (tool, description) in mixed.iter().zip(&descriptions).skip(big.len()) {
        assert_eq!(description, &codemode_declarations::tool_sample(tool));
    }
    for description in &descriptions[..big.len()] {
        assert!(description.ends_with('…'), "{description}");
    }
}
