//! The narrowing rule: an untrusted project may only make things stricter than the user allows.
//!
//! One rule for `settings.json`, `mcp.json` and `models.json`: every merge of a project's value
//! over the user's goes through a [`Narrowing`], which takes the project's value when it narrows
//! (or the project is trusted) and otherwise keeps the user's and records a warning naming the
//! file and the key.

use codemode_spec::Exposure;

/// Merges one project file over the user's values, collecting a warning for each attempt to
/// widen that was ignored.
#[derive(Debug, Clone)]
pub struct Narrowing {
    /// The project file, named in warnings.
    source: String,
    /// A trusted project's values simply override the user's.
    trusted: bool,
    warnings: Vec<String>,
}

impl Narrowing {
    pub fn new(source: impl Into<String>, trusted: bool) -> Self {
        Narrowing {
            source: source.into(),
            trusted,
            warnings: Vec::new(),
        }
    }

    pub fn is_trusted(&self) -> bool {
        self.trusted
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Records that the project's `key` was ignored, and why.
    pub fn ignore(&mut self, key: &str, why: &str) {
        self.warnings.push(format!(
            "{}: ignored `{key}`: {why} (an untrusted project may only narrow what your own configuration allows; run `codemode trust` in the project to allow it)",
            self.source
        ));
    }

    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    pub fn into_warnings(self) -> Vec<String> {
        self.warnings
    }

    /// The general rule: the project's value is taken when the project is trusted or when
    /// `narrower(project, user)` holds; otherwise the user's value stays and `key` is warned about.
    pub fn narrow<T: PartialEq>(
        &mut self,
        key: &str,
        user: Option<T>,
        project: Option<T>,
        narrower: impl Fn(&T, Option<&T>) -> bool,
    ) -> Option<T> {
        match project {
            None => user,
            Some(p) if self.trusted || narrower(&p, user.as_ref()) => Some(p),
            Some(p) if Some(&p) == user.as_ref() => Some(p),
            Some(_) => {
                self.ignore(key, "it would widen what you allow");
                user
            }
        }
    }

    /// A numeric limit: the project may lower it. `user` must already hold the built-in default
    /// when the user set none, so that "unset" never reads as "unlimited"; `None` here means the
    /// limit really is unlimited, and then any value narrows.
    pub fn limit<T: PartialOrd + Copy>(
        &mut self,
        key: &str,
        user: Option<T>,
        project: Option<T>,
    ) -> Option<T> {
        self.narrow(key, user, project, |p, u| u.is_none_or(|u| p <= u))
    }

    /// An on/off switch whose `true` grants something: the project may only turn it off.
    /// `default` is the value when the user did not set it.
    pub fn switch_off(
        &mut self,
        key: &str,
        user: Option<bool>,
        project: Option<bool>,
        default: bool,
    ) -> Option<bool> {
        self.narrow(key, user, project, |p, u| {
            !*p || u.copied().unwrap_or(default)
        })
    }

    /// An exposure: the project may only lower visibility below `current`.
    pub fn visibility(
        &mut self,
        key: &str,
        current: Exposure,
        project: Option<Exposure>,
    ) -> Exposure {
        self.narrow(key, Some(current), project, |p, u| {
            u.is_none_or(|u| p.visibility() <= u.visibility())
        })
        .unwrap_or(current)
    }

    /// An allow-list where `None` means "everything": the project may only remove entries.
    /// Entries the user does not allow are dropped with a warning.
    pub fn allowlist(
        &mut self,
        key: &str,
        user: Option<Vec<String>>,
        project: Option<Vec<String>>,
    ) -> Option<Vec<String>> {
        match (user, project) {
            (u, None) => u,
            (_, Some(p)) if self.trusted => Some(p),
            (None, Some(p)) => Some(p),
            (Some(u), Some(p)) => {
                let (kept, dropped): (Vec<String>, Vec<String>) =
                    p.into_iter().partition(|x| u.contains(x));
                if !dropped.is_empty() {
                    self.ignore(
                        key,
                        &format!("entries you do not allow: {}", dropped.join(", ")),
                    );
                }
                Some(kept)
            }
        }
    }

    /// A value only the user (or a trusted project) may set, such as where the audit log goes.
    pub fn user_only<T: PartialEq>(
        &mut self,
        key: &str,
        user: Option<T>,
        project: Option<T>,
    ) -> Option<T> {
        self.narrow(key, user, project, |_, _| false)
    }

    /// Something an untrusted project may not do at all (add a server, add hooks): `Ok` when the
    /// project is trusted, else a warning for `key`.
    pub fn only_if_trusted(&mut self, key: &str, why: &str) -> bool {
        if !self.trusted {
            self.ignore(key, why);
        }
        self.trusted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untrusted_may_lower_but_not_raise() {
        let mut n = Narrowing::new("p.json", false);
        assert_eq!(n.limit("limits.timeout_ms", Some(100), Some(50)), Some(50));
        assert_eq!(
            n.limit("limits.timeout_ms", Some(100), Some(500)),
            Some(100)
        );
        assert_eq!(n.limit("budgets.script.max_calls", None, Some(5)), Some(5));
        assert_eq!(
            n.switch_off("models.enabled", Some(false), Some(true), true),
            Some(false)
        );
        assert_eq!(
            n.switch_off("autoEnableCodemode", None, Some(true), false),
            None
        );
        assert_eq!(
            n.visibility(
                "tools.x.exposure",
                Exposure::Deferred,
                Some(Exposure::Direct)
            ),
            Exposure::Deferred
        );
        assert_eq!(
            n.visibility("tools.x.exposure", Exposure::Direct, Some(Exposure::Hidden)),
            Exposure::Hidden
        );
        assert_eq!(
            n.allowlist(
                "models.allow",
                Some(vec!["a".into()]),
                Some(vec!["a".into(), "b".into()])
            ),
            Some(vec!["a".to_string()])
        );
        assert_eq!(n.user_only("audit.path", Some(1), Some(2)), Some(1));
        assert!(!n.only_if_trusted("hooks", "hooks run commands"));
        let w = n.warnings().join("\n");
        for key in [
            "limits.timeout_ms",
            "models.enabled",
            "autoEnableCodemode",
            "tools.x.exposure",
            "models.allow",
            "audit.path",
            "hooks",
        ] {
            assert!(w.contains(&format!("`{key}`")), "{key} missing in {w}");
        }
        assert!(!w.contains("budgets.script.max_calls"), "{w}");
        assert!(w.lines().all(|l| l.starts_with("p.json: ")), "{w}");
    }

    #[test]
    fn trusted_overrides() {
        let mut n = Narrowing::new("p.json", true);
        assert_eq!(
            n.limit("limits.timeout_ms", Some(100), Some(500)),
            Some(500)
        );
        assert_eq!(
            n.visibility("tools.x.exposure", Exposure::Hidden, Some(Exposure::Direct)),
            Exposure::Direct
        );
        assert!(n.only_if_trusted("hooks", ""));
        assert!(n.warnings().is_empty());
    }
}
