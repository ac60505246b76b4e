//! searchTools / describeTool / describeNamespace behaviour.

mod support;

use std::time::Instant;

use codemode_declarations::{SearchError, SearchOptions, ToolIndex};
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
    assert_eq!(index.describe_tool("secret_reader"), None);
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
    assert!(small.describe_tool("lint_js").is_some());
    assert!(small.describe_tool("lint-js").is_some());
    assert_eq!(small.describe_tool("nope"), None);

    let ns = index.describe_namespace("dev_radius").unwrap();
    assert_eq!(
        ns,
        json!({"name": "mcp__dev_radius", "description": "Issue tracker", "instructions": "Use search_issues first.", "tools": ["mcp__dev_radius__search_issues"]})
    );
    assert_eq!(index.describe_namespace("mcp__dev-radius"), Some(ns));
    assert_eq!(index.describe_namespace("x"), None);
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
