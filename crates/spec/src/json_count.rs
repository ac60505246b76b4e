//! Counting JSON: values on the text, before anything is decoded, and the text a decoded value
//! makes, without writing it.
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

/// The length of `value`'s compact JSON text, counted without writing it out: a size for a
/// result held in memory, where writing a copy to measure it would double what is held.
pub fn json_text_len(value: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

#[cfg(test)]
mod tests {
    use super::{count_json_values, json_text_len};

    #[test]
    fn text_length_is_what_writing_it_gives() {
        for v in [
            serde_json::json!(null),
            serde_json::json!({"a": [1, "x\u{1}\"y", {"b": 2.5}], "é": true}),
            serde_json::json!("\u{2028}".repeat(100)),
        ] {
            assert_eq!(json_text_len(&v), v.to_string().len(), "{v}");
        }
    }

    #[test]
    fn values_are_counted_outside_strings_only() {
        assert_eq!(count_json_values(b"1", 10), 1);
        assert_eq!(count_json_values(b"[0,0,0]", 10), 4);
        assert_eq!(count_json_values(br#"{"a":[1,2],"b":"x,[{"}"#, 10), 5);
        assert_eq!(count_json_values(br#""a\",b""#, 10), 1);
        assert_eq!(count_json_values(b"[0,0,0,0,0,0]", 3), 4);
    }
}
