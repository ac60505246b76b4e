//! Counting JSON values on the text, before anything is decoded.
//!
//! A limit on bytes does not bound what decoding costs: `[0,0,0,…]` is two bytes a value in
//! text and tens of bytes each once decoded. Whoever takes JSON from an untrusted side checks
//! this count first.

/// How many values `json` holds (every value but the first follows a `,` or opens an array or
/// object), stopping once past `limit`. Meant for text that is JSON or will be refused as not
/// JSON; on other text the count means nothing.
pub fn count_json_values(json: &[u8], limit: usize) -> usize {
    let (mut count, mut in_string, mut escaped) = (1usize, false, false);
    for &b in json {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b',' | b'[' | b'{' => {
                count += 1;
                if count > limit {
                    return count;
                }
            }
            _ => {}
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::count_json_values;

    #[test]
    fn values_are_counted_outside_strings_only() {
        assert_eq!(count_json_values(b"1", 10), 1);
        assert_eq!(count_json_values(b"[0,0,0]", 10), 4);
        assert_eq!(count_json_values(br#"{"a":[1,2],"b":"x,[{"}"#, 10), 5);
        assert_eq!(count_json_values(br#""a\",b""#, 10), 1);
        assert_eq!(count_json_values(b"[0,0,0,0,0,0]", 3), 4);
    }
}
