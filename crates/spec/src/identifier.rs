//! Tool names as JavaScript identifiers.

/// Maps a raw tool name to the identifier a script writes after `tools.`.
///
/// Every code point that cannot stand at its position in a JavaScript identifier becomes `_`
/// (`my-tool` → `my_tool`, `1abc` → `_abc`, `a.b` → `a_b`); the empty name becomes `_`.
/// Only ASCII letters, digits, `_` and `$` are kept, so the result is safe in any JavaScript engine.
pub fn to_identifier(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for (i, ch) in name.chars().enumerate() {
        let ok =
            ch.is_ascii_alphabetic() || ch == '_' || ch == '$' || (i > 0 && ch.is_ascii_digit());
        out.push(if ok { ch } else { '_' });
    }
    if out.is_empty() {
        out.push('_');
    }
    out
}

/// True when `name` is already an ASCII JavaScript identifier (the fixed point of [`to_identifier`]).
pub fn is_identifier(name: &str) -> bool {
    !name.is_empty() && to_identifier(name) == name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_invalid_characters_per_position() {
        assert_eq!(to_identifier("my-tool"), "my_tool");
        assert_eq!(to_identifier("1abc"), "_abc");
        assert_eq!(to_identifier("a.b"), "a_b");
        assert_eq!(to_identifier("ä"), "_");
        assert_eq!(to_identifier(""), "_");
        assert_eq!(to_identifier("$ok_1"), "$ok_1");
        assert!(is_identifier("read"));
        assert!(!is_identifier("read file"));
    }
}
