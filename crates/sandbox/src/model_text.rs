//! The text the model reads after a script: a header, the output, the error and the calls made.

use std::path::PathBuf;

use crate::result::{CallStatus, ErrorKind, OutputItem, ScriptResult};

/// What goes back to the model. `full_output_path` names the private file holding the whole
/// text when it had to be shortened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelText {
    pub text: String,
    pub full_output_path: Option<PathBuf>,
}

pub fn render_model_text(result: &ScriptResult, max_output_tokens: u64) -> ModelText {
    todo_render(result, max_output_tokens)
}

fn todo_render(result: &ScriptResult, _max: u64) -> ModelText {
    let _ = (CallStatus::Ok, ErrorKind::Script, &result.output.first().map(|o| matches!(o, OutputItem::Image { .. })));
    ModelText { text: String::new(), full_output_path: None }
}
