//! Which exposure each tool of a server gets, from `exposure` and `toolExposure`.

use codemode_spec::Exposure;
use globset::{Glob, GlobMatcher};

/// One `toolExposure` entry: a tool name or glob pattern and the exposure it selects.
#[derive(Debug, Clone)]
pub struct ExposureRule {
    pub pattern: String,
    pub exposure: Exposure,
    matcher: Option<GlobMatcher>,
}

impl ExposureRule {
    /// A rule; `pattern` is an exact name unless it contains glob characters.
    pub fn new(pattern: &str, exposure: Exposure) -> Result<Self, String> {
        let is_glob = pattern.contains(['*', '?', '[', '{']);
        let matcher = if is_glob {
            let glob = Glob::new(pattern).map_err(|e| {
                format!("toolExposure pattern `{pattern}` is not a valid glob: {e}")
            })?;
            Some(glob.compile_matcher())
        } else {
            None
        };
        Ok(ExposureRule {
            pattern: pattern.to_string(),
            exposure,
            matcher,
        })
    }

    fn matches_glob(&self, tool: &str) -> bool {
        self.matcher.as_ref().is_some_and(|m| m.is_match(tool))
    }
}

/// A server's exposure settings: an exact `toolExposure` key wins, then the first matching
/// pattern in file order, then the server's `exposure`.
#[derive(Debug, Clone, Default)]
pub struct ExposureRules {
    pub default: Exposure,
    pub rules: Vec<ExposureRule>,
}

impl ExposureRules {
    pub fn lookup(&self, tool: &str) -> Exposure {
        if let Some(rule) = self.rules.iter().find(|r| r.pattern == tool) {
            return rule.exposure;
        }
        self.rules
            .iter()
            .find(|r| r.matches_glob(tool))
            .map(|r| r.exposure)
            .unwrap_or(self.default)
    }

    /// Every exposure these rules can produce.
    pub fn possible(&self) -> impl Iterator<Item = Exposure> + '_ {
        std::iter::once(self.default).chain(self.rules.iter().map(|r| r.exposure))
    }
}

/// Parses an exposure value as config files write it (`codemode-deferred` is an old alias).
pub fn parse_exposure(s: &str) -> Result<Exposure, String> {
    if s == "codemode-deferred" {
        return Ok(Exposure::Codemode);
    }
    s.parse()
}

/// The less visible of two exposures.
pub fn narrower(a: Exposure, b: Exposure) -> Exposure {
    if a.visibility() <= b.visibility() {
        a
    } else {
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_then_first_pattern_then_default() {
        let rules = ExposureRules {
            default: Exposure::Deferred,
            rules: vec![
                ExposureRule::new("get_*", Exposure::Codemode).unwrap(),
                ExposureRule::new("search_code", Exposure::Direct).unwrap(),
                ExposureRule::new("delete_*", Exposure::Hidden).unwrap(),
                ExposureRule::new("get_secret*", Exposure::Hidden).unwrap(),
            ],
        };
        assert_eq!(rules.lookup("search_code"), Exposure::Direct);
        assert_eq!(rules.lookup("get_x"), Exposure::Codemode);
        assert_eq!(
            rules.lookup("get_secret_key"),
            Exposure::Codemode,
            "first pattern wins"
        );
        assert_eq!(rules.lookup("delete_x"), Exposure::Hidden);
        assert_eq!(rules.lookup("other"), Exposure::Deferred);
        assert_eq!(ExposureRules::default().lookup("x"), Exposure::Codemode);
        assert_eq!(parse_exposure("codemode-deferred"), Ok(Exposure::Codemode));
        assert!(parse_exposure("public").is_err());
    }
}
