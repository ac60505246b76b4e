//! Which of a call's costly context fields the policies read.
//!
//! `context.args` (a Cedar record with a set per array argument) and `context.args_json` (the
//! arguments as one string) cost memory by the size of the arguments: a call with a million
//! strings in an argument cost 230 MiB of Cedar values, each time it was decided. Most policy
//! sets (the default one among them) read neither, and a field no policy reads cannot change a
//! decision, so it is built only when some policy reads it.
//!
//! The reads are found in each policy's parsed form, not its text: `context["\u{61}rgs"]` reads
//! `args` although the word is not written. A policy that uses `context` other than by one
//! attribute (`context == {…}`, say) is taken to read everything.

use serde_json::Value;

/// The costly context fields some policy reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ContextReads {
    pub args: bool,
    pub args_json: bool,
}

impl ContextReads {
    const ALL: ContextReads = ContextReads {
        args: true,
        args_json: true,
    };

    /// Adds what `policy` reads. A policy whose parsed form cannot be read reads everything.
    pub(crate) fn add(&mut self, policy: &cedar_policy::Policy) {
        match policy.to_json() {
            Ok(est) => self.walk(&est),
            Err(_) => *self = Self::ALL,
        }
    }

    fn attr(&mut self, name: Option<&str>) {
        match name {
            Some("args") => self.args = true,
            Some("args_json") => self.args_json = true,
            Some(_) => {}
            None => *self = Self::ALL,
        }
    }

    fn walk(&mut self, v: &Value) {
        match v {
            Value::Object(map) => {
                if map.get("Var").and_then(Value::as_str) == Some("context") {
                    // `context` as a whole value.
                    *self = Self::ALL;
                    return;
                }
                for (op, body) in map {
                    let on_context =
                        body.pointer("/left/Var").and_then(Value::as_str) == Some("context");
                    if (op == "." || op == "has") && on_context {
                        self.attr(body.get("attr").and_then(Value::as_str));
                    } else {
                        self.walk(body);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|i| self.walk(i)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(text: &str) -> ContextReads {
        let set: cedar_policy::PolicySet = text.parse().unwrap();
        let mut reads = ContextReads::default();
        for p in set.policies() {
            reads.add(p);
        }
        reads
    }

    const NEITHER: ContextReads = ContextReads {
        args: false,
        args_json: false,
    };
    const ARGS: ContextReads = ContextReads {
        args: true,
        args_json: false,
    };

    #[test]
    fn the_default_policies_read_neither() {
        assert_eq!(reads(super::super::DEFAULT_POLICIES), NEITHER);
        assert_eq!(
            reads(
                r#"permit(principal, action, resource) when { context.path like "/w/*" && context has origin };"#
            ),
            NEITHER
        );
    }

    #[test]
    fn every_spelling_of_an_args_read_is_found() {
        for text in [
            r#"forbid(principal, action, resource) when { context.args.command like "*rm*" };"#,
            r#"forbid(principal, action, resource) when { context has args };"#,
            r#"forbid(principal, action, resource) when { context has "args" };"#,
            r#"forbid(principal, action, resource) when { context["args"].x == 1 };"#,
            r#"forbid(principal, action, resource) when { context["\u{61}rgs"] has x };"#,
            r#"forbid(principal, action, resource) unless { context . args has x || context.path == "" };"#,
        ] {
            assert_eq!(reads(text), ARGS, "{text}");
        }
        assert_eq!(
            reads(
                r#"forbid(principal, action, resource) when { context.args_json like "*secret*" };"#
            ),
            ContextReads {
                args: false,
                args_json: true
            }
        );
    }

    #[test]
    fn context_as_a_whole_reads_everything() {
        for text in [
            r#"forbid(principal, action, resource) when { context == {path: ""} };"#,
            r#"forbid(principal, action, resource) when { [context].contains(context) };"#,
            r#"forbid(principal, action, resource) when { {c: context}.c.path == "" };"#,
        ] {
            assert_eq!(reads(text), ContextReads::ALL, "{text}");
        }
    }
}
