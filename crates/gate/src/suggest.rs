//! "Did you mean" for unknown tool names.
//!
//! The caller chooses the unknown name (a script's `tools.x`, an MCP client's `tools/call`) and
//! may ask again and again, while a server may register thousands of tools: the work of one
//! answer is bounded, whatever the two sides hold. Names are first ranked by a cheap lower bound
//! of their edit distance (letter counts, O(length)); only the most promising get a banded edit
//! distance, and those comparisons stop at [`MAX_CELLS`].

/// Longest name "did you mean" looks at. Registered names are far shorter.
const MAX_WANTED_BYTES: usize = 256;

/// Edit-distance cells (one character pair each) one answer may compute: about 2,000 names of 64
/// characters compared within their band, a few milliseconds. Past it the remaining names are
/// judged by the cheap checks alone (same identifier, one inside the other).
const MAX_CELLS: usize = 1 << 20;

/// Up to three names close to `wanted`, closest first: same identifier ignoring case and `-`/`_`,
/// a shared prefix or substring, or a small edit distance. None for a name longer than
/// [`MAX_WANTED_BYTES`].
pub(crate) fn close_names(wanted: &str, candidates: &[&str]) -> Vec<String> {
    close_names_counted(wanted, candidates).0
}

/// [`close_names`] and the edit-distance cells it computed.
fn close_names_counted(wanted: &str, candidates: &[&str]) -> (Vec<String>, usize) {
    if wanted.len() > MAX_WANTED_BYTES {
        return (Vec::new(), 0);
    }
    let w: Vec<char> = normalize(wanted).chars().collect();
    let w_letters = Letters::of(&w);
    let w_text: String = w.iter().collect();
    let mut scored: Vec<(usize, &str)> = Vec::new();
    // (lower bound, limit, candidate, its normalized chars) for the names worth a distance.
    let mut to_measure: Vec<(usize, usize, &str, Vec<char>)> = Vec::new();
    for c in candidates {
        let n: Vec<char> = normalize(c).chars().collect();
        let n_text: String = n.iter().collect();
        if !w.is_empty() && (n_text.contains(&w_text) || w_text.contains(&n_text)) {
            scored.push((usize::from(n != w), c));
            continue;
        }
        let limit = (w.len().max(n.len()) / 3).max(2);
        let bound = w_letters.distance_at_least(&Letters::of(&n));
        if bound <= limit {
            to_measure.push((bound, limit, c, n));
        }
    }
    // The likeliest first, so that the cap leaves out the least promising.
    to_measure.sort_by(|a, b| (a.0, a.2).cmp(&(b.0, b.2)));
    let mut cells = 0;
    // The three smallest distances so far, ascending.
    let mut best: Vec<usize> = scored.iter().map(|(d, _)| *d).collect();
    best.sort_unstable();
    best.truncate(3);
    for (bound, limit, c, n) in to_measure {
        if cells >= MAX_CELLS {
            break;
        }
        // Only names at least as close as the third closest so far can still be shown.
        let limit = best.get(2).map_or(limit, |third| limit.min(*third));
        if bound > limit {
            continue;
        }
        let (d, spent) = banded_distance(&w, &n, limit);
        cells += spent;
        if let Some(d) = d {
            scored.push((d, c));
            let at = best.partition_point(|b| *b <= d);
            best.insert(at, d);
            best.truncate(3);
        }
    }
    scored.sort();
    let names = scored
        .into_iter()
        .take(3)
        .map(|(_, c)| c.to_string())
        .collect();
    (names, cells)
}

fn normalize(s: &str) -> String {
    s.to_ascii_lowercase().replace(['-', '.', ' '], "_")
}

/// How often each character occurs: the edit distance between two names is at least the larger
/// of the characters one has more of and the other has more of.
struct Letters {
    ascii: [u32; 128],
    other: Vec<char>,
}

impl Letters {
    fn of(chars: &[char]) -> Letters {
        let mut ascii = [0u32; 128];
        let mut other = Vec::new();
        for &c in chars {
            match usize::try_from(u32::from(c)) {
                Ok(i) if i < 128 => ascii[i] += 1,
                _ => other.push(c),
            }
        }
        other.sort_unstable();
        Letters { ascii, other }
    }

    fn distance_at_least(&self, other: &Letters) -> usize {
        let (mut more, mut fewer) = (0usize, 0usize);
        for (a, b) in self.ascii.iter().zip(other.ascii.iter()) {
            if a > b {
                more += (a - b) as usize;
            } else {
                fewer += (b - a) as usize;
            }
        }
        // Characters outside ASCII: count those not matched in the other (both lists sorted).
        let (mut i, mut j) = (0, 0);
        let (a, b) = (&self.other, &other.other);
        while i < a.len() && j < b.len() {
            match a[i].cmp(&b[j]) {
                std::cmp::Ordering::Equal => (i, j) = (i + 1, j + 1),
                std::cmp::Ordering::Less => (more, i) = (more + 1, i + 1),
                std::cmp::Ordering::Greater => (fewer, j) = (fewer + 1, j + 1),
            }
        }
        more += a.len() - i;
        fewer += b.len() - j;
        more.max(fewer)
    }
}

/// The edit distance of `a` and `b` if it is at most `limit` (else `None`), computed only within
/// `limit` of the diagonal, and the cells computed.
fn banded_distance(a: &[char], b: &[char], limit: usize) -> (Option<usize>, usize) {
    if a.len().abs_diff(b.len()) > limit {
        return (None, 0);
    }
    let far = limit + 1;
    let mut prev: Vec<usize> = (0..=b.len()).map(|j| j.min(far)).collect();
    let mut cur = vec![far; b.len() + 1];
    let mut cells = 0;
    for (i, ca) in a.iter().enumerate() {
        let row = i + 1;
        let from = row.saturating_sub(limit).max(1);
        let to = (row + limit).min(b.len());
        cur.fill(far);
        cur[0] = row.min(far);
        let mut best = cur[0];
        for j in from..=to {
            let cost = usize::from(*ca != b[j - 1]);
            let d = (prev[j - 1] + cost).min(prev[j] + 1).min(cur[j - 1] + 1);
            cur[j] = d.min(far);
            best = best.min(cur[j]);
        }
        cells += (to + 1).saturating_sub(from);
        if best > limit {
            return (None, cells);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    let d = prev[b.len()];
    ((d <= limit).then_some(d), cells)
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

    /// The banded distance agrees with the full one wherever the full one is within the limit.
    #[test]
    fn banded_distance_matches_the_full_distance() {
        let words = [
            "",
            "a",
            "ab",
            "ba",
            "read",
            "raed",
            "write",
            "wirte",
            "kitten",
            "sitting",
            "mcp__a__b",
            "mcp_a_b",
            "ünïcödé",
            "unicode",
            "aaaaaaaa",
            "aaaabaaa",
        ];
        for x in words {
            for y in words {
                let (a, b): (Vec<char>, Vec<char>) = (x.chars().collect(), y.chars().collect());
                let full = strsim_like(&a, &b);
                for limit in 0..10 {
                    let (banded, _) = banded_distance(&a, &b, limit);
                    assert_eq!(
                        banded,
                        (full <= limit).then_some(full),
                        "{x:?} {y:?} limit {limit}"
                    );
                    let bound = Letters::of(&a).distance_at_least(&Letters::of(&b));
                    assert!(bound <= full, "{x:?} {y:?}: bound {bound} > {full}");
                }
            }
        }
    }

    fn strsim_like(a: &[char], b: &[char]) -> usize {
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.iter().enumerate() {
            let mut cur = vec![i + 1; b.len() + 1];
            for (j, cb) in b.iter().enumerate() {
                cur[j + 1] = (prev[j] + usize::from(ca != cb))
                    .min(prev[j + 1] + 1)
                    .min(cur[j] + 1);
            }
            prev = cur;
        }
        prev[b.len()]
    }

    /// Red team: a server registers 10,000 tools of the longest name (64 characters) made of the
    /// letters of the name a script keeps asking for, so no cheap check rules one out. One answer
    /// compared every pair of characters: 40 million per unknown name, seconds of host CPU
    /// a script could ask for a thousand times.
    #[test]
    fn ten_thousand_look_alike_names_cost_one_bounded_answer() {
        let wanted: String = "abcdefgh".repeat(8);
        let names: Vec<String> = (0..10_000)
            .map(|i| {
                // A rotation of `wanted` with a few letters swapped: same letters, far apart.
                let mut v: Vec<char> = wanted.chars().collect();
                v.rotate_left(1 + i % 63);
                let (x, y) = (i % 64, (i / 64) % 64);
                v.swap(x, y);
                v.into_iter().collect()
            })
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let (_, cells) = close_names_counted(&format!("{wanted}x"), &refs);
        assert!(cells <= MAX_CELLS + 64 * 64, "{cells} cells");

        // Among 10,000 ordinary names a typo still finds its tool, wherever it is in the list.
        let names: Vec<String> = (0..10_000)
            .map(|i| format!("mcp__area{}__create_record_number_{i}", i % 40))
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let (found, cells) = close_names_counted("mcp__area17__create_recrd_number_7777", &refs);
        assert_eq!(
            found.first().map(String::as_str),
            Some("mcp__area17__create_record_number_7777"),
            "{found:?}"
        );
        assert!(cells <= MAX_CELLS + 64 * 64, "{cells} cells");
    }
}
