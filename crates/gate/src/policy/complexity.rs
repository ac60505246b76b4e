//! A bound on how deep a policy's expressions can nest, checked on the text before Cedar reads
//! it. Cedar builds, converts and frees expressions recursively, without a depth limit: a
//! project's policy file of a few hundred nested parentheses, or a few thousand chained `+`,
//! `&&` or `.a`, overflows the stack and aborts the process on every start in that directory.
//! Real policies nest a few levels and chain a few dozen operators.

use super::PolicyError;

/// Most brackets (`(`, `[`, `{`) open at once within one policy.
pub(super) const MAX_NESTING: usize = 16;

/// Most operators, member accesses and `if`s in one policy: each can add a level to the tree
/// Cedar builds.
pub(super) const MAX_OPERATORS: usize = 256;

/// Refuses `text` when one of its policies nests deeper or chains more than the bounds allow,
/// naming the line and column where it went past.
pub(super) fn check(file: &str, text: &str) -> Result<(), PolicyError> {
    let refuse = |line: usize, column: usize, message: String| PolicyError::Syntax {
        file: file.to_string(),
        line,
        column,
        message,
    };
    let (mut depth, mut operators) = (0usize, 0usize);
    let (mut line, mut column) = (1usize, 0usize);
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    let mut word = String::new();
    while let Some(c) = chars.next() {
        if c == '\n' {
            line += 1;
            column = 0;
        } else {
            column += 1;
        }
        if in_string {
            match c {
                '\\' => {
                    chars.next();
                    column += 1;
                }
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        if matches!(word.as_str(), "if" | "in" | "has" | "like" | "is") {
            operators += 1;
        }
        word.clear();
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        line += 1;
                        column = 0;
                        break;
                    }
                }
            }
            '"' => in_string = true,
            ';' if depth == 0 => operators = 0,
            '(' | '[' | '{' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(refuse(
                        line,
                        column,
                        format!(
                            "brackets nest more than {MAX_NESTING} deep here; write the condition flatter, or split it into several policies"
                        ),
                    ));
                }
            }
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            // `&&`, `==` and the like count once.
            '.' | '!' | '+' | '-' | '*' | '<' | '>' | '=' | '&' | '|'
                if !matches!(chars.peek(), Some('&' | '|' | '=')) =>
            {
                operators += 1;
            }
            _ => {}
        }
        if operators > MAX_OPERATORS {
            return Err(refuse(
                line,
                column,
                format!(
                    "this policy chains more than {MAX_OPERATORS} operators; split it into several policies"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(condition: &str) -> String {
        format!("forbid (principal, action, resource) when {{ {condition} }};\n")
    }

    #[test]
    fn ordinary_policies_pass() {
        let text = [
            policy(r#"resource.name like "*delete*" && !(context.args.path like "/tmp/*")"#),
            policy(r#"["a", "b", "c"].contains(resource.name) || principal == Session::"s""#),
            "// a comment with ((((((((((((((((((( and ++++\n".to_string(),
            policy(r#""a string with (((((((((((((((((((((( inside" == "x""#),
        ]
        .concat()
        .repeat(50);
        check("p.cedar", &text).unwrap();
    }

    #[test]
    fn deep_nesting_and_long_chains_are_refused_where_they_go_past() {
        let deep = policy(&format!("{}true{}", "(".repeat(17), ")".repeat(17)));
        let err = check("p.cedar", &deep).unwrap_err().to_string();
        assert!(err.starts_with("p.cedar:1:"), "{err}");
        assert!(err.contains("nest more than 16"), "{err}");
        for chain in [
            vec!["1"; 300].join(" + "),
            vec!["true"; 300].join(" && "),
            format!("context{}", ".a".repeat(300)),
        ] {
            let err = check("p.cedar", &policy(&chain)).unwrap_err().to_string();
            assert!(err.contains("more than 256 operators"), "{err}");
        }
    }

    #[test]
    fn the_operator_count_is_per_policy() {
        let one = policy(&vec!["1"; 100].join(" + "));
        check("p.cedar", &one.repeat(20)).unwrap();
    }
}
