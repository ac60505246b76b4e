//! "Did you mean" for unknown tool names.

/// Longest name "did you mean" looks at. Registered names are far shorter; the caller chooses
/// `wanted` (an MCP client's `tools/call`), and the edit distance grows with its length times
/// each candidate's.
const MAX_WANTED_BYTES: usize = 256;

/// Up to three names close to `wanted`, closest first: same identifier ignoring case and `-`/`_`,
/// a shared prefix or substring, or a small edit distance. None for a name longer than
/// [`MAX_WANTED_BYTES`].
pub(crate) fn close_names(wanted: &str, candidates: &[&str]) -> Vec<String> {
    if wanted.len() > MAX_WANTED_BYTES {
        return Vec::new();
    }
    let norm = |s: &str| s.to_ascii_lowercase().replace(['-', '.', ' '], "_");
    let w = norm(wanted);
    let mut scored: Vec<(usize, &str)> = candidates
        .iter()
        .filter_map(|c| {
            let n = norm(c);
            let d = distance(&w, &n);
            let limit = (w.len().max(n.len()) / 3).max(2);
            let related = !w.is_empty() && (n.contains(&w) || w.contains(&n));
            (d <= limit || related).then_some((if related { d.min(1) } else { d }, *c))
        })
        .collect();
    scored.sort();
    scored
        .into_iter()
        .take(3)
        .map(|(_, c)| c.to_string())
        .collect()
}

/// Levenshtein distance over chars.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_typos_and_separators() {
        let names = ["read", "write", "mcp__github__search_code", "bash"];
        assert_eq!(close_names("raed", &names), vec!["read"]);
        assert_eq!(
            close_names("search_code", &names),
            vec!["mcp__github__search_code"]
        );
        assert!(close_names("zzzzzzzz", &names).is_empty());
    }
}
