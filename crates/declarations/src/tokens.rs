//! Real token counts (tiktoken), for the inline budget and the benchmark.

use codemode_spec::ToolSpec;
use serde_json::{Value, json};

/// A tokenizer. Counts differ between model families, so the benchmark reports both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// GPT-4o, GPT-4.1, GPT-5 and the o-series.
    O200kBase,
    /// GPT-4 and GPT-3.5.
    Cl100kBase,
}

/// The number of tokens `text` takes in `encoding`.
///
/// The tokenizer tables are loaded once per process (about 0.2 s for o200k) and shared; only
/// encodings that are used are linked into the binary.
pub fn count_tokens(text: &str, encoding: Encoding) -> usize {
    let bpe = match encoding {
        Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
        Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
    };
    bpe.encode_ordinary(text).len()
}

/// The same tools declared directly to the model, as the JSON tool definitions an API request
/// carries (`name`, `description`, `input_schema`), compact. This is what codemode replaces, and
/// what the benchmark compares against.
pub fn direct_definitions_json(tools: &[ToolSpec]) -> String {
    let definitions: Vec<Value> = tools
        .iter()
        .map(|tool| {
            json!({
                "name": tool.name,
                "description": tool.description,
                "input_schema": tool.input_schema,
            })
        })
        .collect();
    Value::Array(definitions).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_real_tokens() {
        assert_eq!(count_tokens("", Encoding::O200kBase), 0);
        assert_eq!(count_tokens("hello world", Encoding::O200kBase), 2);
        assert_eq!(count_tokens("hello world", Encoding::Cl100kBase), 2);
    }
}
