//! `${VAR}` references in MCP server settings, in the spellings other clients use:
//! `${VAR}` and `${VAR:-default}` (Claude Code, shells) and `${env:VAR}` (VS Code, Cursor).

/// One piece of a value: literal text or a variable reference.
enum Piece<'a> {
    Text(&'a str),
    Var {
        name: &'a str,
        default: Option<&'a str>,
    },
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn pieces(value: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        if start > 0 {
            out.push(Piece::Text(&rest[..start]));
        }
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or_else(|| {
            format!("\"${{\" is not closed in {value:?}; write ${{VAR}}, ${{VAR:-default}} or ${{env:VAR}}")
        })?;
        let inner = &after[..end];
        let (reference, default) = match inner.split_once(":-") {
            Some((r, d)) => (r, Some(d)),
            None => (inner, None),
        };
        let name = match reference.split_once(':') {
            None => reference,
            Some(("env", name)) => name,
            Some(("input", _)) => {
                return Err(format!(
                    "${{{inner}}} asks VS Code to prompt for a value, which codemode cannot do; put the value in an environment variable and write ${{env:NAME}}"
                ));
            }
            Some(_) => {
                return Err(format!(
                    "${{{inner}}} is not supported; only environment variables are: ${{VAR}}, ${{VAR:-default}} or ${{env:VAR}}"
                ));
            }
        };
        if !is_name(name) {
            return Err(format!(
                "${{{inner}}} is not supported; only environment variables are: ${{VAR}}, ${{VAR:-default}} or ${{env:VAR}}, where VAR is letters, digits and _"
            ));
        }
        out.push(Piece::Var { name, default });
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        out.push(Piece::Text(rest));
    }
    Ok(out)
}

/// The names of the variables `value` refers to (none when it does not parse).
pub fn var_names(value: &str) -> Vec<String> {
    pieces(value)
        .map(|ps| {
            ps.into_iter()
                .filter_map(|p| match p {
                    Piece::Var { name, .. } => Some(name.to_string()),
                    Piece::Text(_) => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Checks the references in `value` without expanding them.
pub fn check_vars(value: &str) -> Result<(), String> {
    pieces(value).map(|_| ())
}

/// Expands the references in `value` with `lookup`. A variable that is unset (or empty) takes
/// its default; one without a default is an error naming it, so a missing secret is never sent
/// as an empty string.
pub fn expand_vars(value: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    for piece in pieces(value)? {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Var { name, default } => match (lookup(name).filter(|v| !v.is_empty()), default)
            {
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => {
                    return Err(format!(
                        "environment variable {name} is not set; set it, or give a default with ${{{name}:-value}}"
                    ));
                }
            },
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(v: &str) -> Option<String> {
        match v {
            "TOKEN" => Some("s3cret".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn every_spelling_expands() {
        assert_eq!(
            expand_vars("Bearer ${TOKEN}", &env).unwrap(),
            "Bearer s3cret"
        );
        assert_eq!(expand_vars("${env:TOKEN}!", &env).unwrap(), "s3cret!");
        assert_eq!(expand_vars("${NOPE:-fallback}", &env).unwrap(), "fallback");
        assert_eq!(expand_vars("${EMPTY:-fallback}", &env).unwrap(), "fallback");
        assert_eq!(expand_vars("${TOKEN:-unused}", &env).unwrap(), "s3cret");
        assert_eq!(expand_vars("${env:NOPE:-x}", &env).unwrap(), "x");
        assert_eq!(expand_vars("${NOPE:-}", &env).unwrap(), "");
        assert_eq!(expand_vars("a$b {c}", &env).unwrap(), "a$b {c}");
    }

    #[test]
    fn mistakes_are_named() {
        let e = expand_vars("${MISSING}", &env).unwrap_err();
        assert!(
            e.contains("MISSING") && e.contains("${MISSING:-value}"),
            "{e}"
        );
        let e = check_vars("x ${TOKEN").unwrap_err();
        assert!(e.contains("not closed"), "{e}");
        let e = check_vars("${input:api-key}").unwrap_err();
        assert!(e.contains("${env:NAME}"), "{e}");
        let e = check_vars("${workspaceFolder:x}").unwrap_err();
        assert!(e.contains("not supported"), "{e}");
        assert!(check_vars("${1X}").is_err());
        assert!(check_vars("${A_1} ${env:B}").is_ok());
    }
}
