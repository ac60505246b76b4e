//! What the host allocates to answer `searchTools` for a hostile query. A script's string lives in
//! its heap, within its limit; the host's copies of it must stay a small multiple of its size.
//! This binary counts every allocation, so it holds one test only.

mod support;

use codemode_declarations::{SearchOptions, ToolIndex};
use support::counting::{Counting, peak_during};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn a_huge_query_costs_the_host_little_memory() {
    let (mut tools, mut namespaces) = support::all_mcp();
    tools.extend(support::coding_tools());
    let (catalog, catalog_ns) = support::catalog(20);
    tools.extend(catalog);
    namespaces.extend(catalog_ns);
    let index = ToolIndex::new(&tools, &namespaces);
    // U+FDFA is 3 bytes of UTF-8 and 18 characters (four words) in NFKC: 3 MB of it made the
    // host allocate about 300 MB, so the largest string a script may pass, some 30 times more.
    let query = "\u{FDFA}".repeat(1_000_000);
    let (searched, peak) = peak_during(|| index.search(&query, &SearchOptions::default()));
    let message = searched.expect_err("a 3 MB query is refused").to_string();
    assert!(
        message.contains("searchTools()") && message.contains("at most"),
        "the refusal says what the limit is: {message}"
    );
    assert!(
        peak < 16 << 20,
        "the host allocated {} MB for a query of 3 MB",
        peak >> 20
    );
    // Names given to describeTool and describeNamespace are not expanded either.
    for (what, peak) in [
        (
            "describeTool",
            peak_during(|| index.describe_tool(&query).is_err()).1,
        ),
        (
            "describeTool schema",
            peak_during(|| index.input_schema(&query).is_err()).1,
        ),
        (
            "describeNamespace",
            peak_during(|| index.describe_namespace(&query).is_err()).1,
        ),
    ] {
        assert!(
            peak < 16 << 20,
            "{what}: the host allocated {} MB for a name of 3 MB",
            peak >> 20
        );
    }
}
