//! Checks a script's model argument and context before anything is sent, so a mistake costs no
//! money and the message can show the shape that was expected.

use codemode_spec::ToolError;
use serde_json::{Map, Value};

use crate::catalog::{Catalog, Model};
use crate::describe::describe;
use crate::mime::image_mime;

/// Most labels a choice question may have: each gets one letter A-Z.
pub(crate) const MAX_CHOICE_LABELS: usize = 26;
/// Most levels a score question may have: each gets one digit 0-9.
pub(crate) const MAX_SCORE_LEVELS: usize = 10;
/// Most questions in one classify call, which is answered by one request.
pub(crate) const MAX_QUESTIONS: usize = 50;

const CLASSIFY_SHAPE: &str = "{ state: { ... }, images?: [{ type: \"image\", data: <base64>, mimeType }], questions: { <id>: { type: \"choice\", instructions, criteria: { <label>: <meaning>, ... } } | { type: \"score\", instructions, criteria: [<lowest level>, ..., <highest level>] } | { type: \"bool\", instructions, criteria: { true: <meaning>, false: <meaning> } } } }";
const IMAGES_SHAPE: &str = "{ input: [{ type: \"text\", text: <prompt> }, ...optional { type: \"image\", data: <base64>, mimeType } references] }";

/// Which model operation is being checked; it decides the wording and the model type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    Classify,
    GenerateImages,
}

impl Operation {
    pub(crate) fn tool_name(self) -> &'static str {
        match self {
            Operation::Classify => "models.classify",
            Operation::GenerateImages => "models.generateImages",
        }
    }
    pub(crate) fn model_type(self) -> &'static str {
        match self {
            Operation::Classify => "classifier",
            Operation::GenerateImages => "image",
        }
    }
    fn article(self) -> &'static str {
        match self {
            Operation::Classify => "a classifier",
            Operation::GenerateImages => "an image",
        }
    }
    fn list_hint(self) -> String {
        format!(
            "See which {} models you can use with models.getAvailableOfType(\"{}\").",
            self.model_type(),
            self.model_type()
        )
    }
}

/// An image block from a script, with its type judged from its bytes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Image {
    pub data: String,
    pub mime_type: &'static str,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum QuestionKind {
    /// Labels with their meanings, in the script's order.
    Choice(Vec<(String, String)>),
    /// Level descriptions, lowest first.
    Score(Vec<String>),
    Bool {
        yes: String,
        no: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Question {
    pub id: String,
    pub instructions: String,
    pub kind: QuestionKind,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClassifyInput {
    pub state: Value,
    pub images: Vec<Image>,
    pub questions: Vec<Question>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ImagesInput {
    pub prompt: String,
    pub references: Vec<Image>,
}

/// Resolves the model argument by provider and id alone; every other field the script put on
/// it (baseUrl, headers, apiKey) is ignored, so a script cannot redirect credentials.
pub(crate) fn resolve_model<'a>(
    catalog: &'a Catalog,
    op: Operation,
    arg: &Value,
) -> Result<&'a Model, ToolError> {
    let name = op.tool_name();
    if !catalog.is_enabled() {
        return Err(ToolError::invalid(format!(
            "{name}() is unavailable: models are turned off in the settings."
        )));
    }
    let ids = arg.as_object().and_then(|o| {
        Some((
            o.get("provider")?.as_str()?.to_string(),
            o.get("id")?.as_str()?.to_string(),
        ))
    });
    let Some((provider, id)) = ids else {
        let hint = if arg.is_null() {
            " models.getModelOfType() gives undefined for an unknown provider or id."
        } else {
            ""
        };
        return Err(ToolError::invalid(format!(
            "{name}() needs {} model as its first argument (an entry with string provider and id), but got {}.{hint} {}",
            op.article(),
            describe(arg),
            op.list_hint()
        )));
    };
    match catalog.model(&provider, &id) {
        Some(model) if model.model_type == op.model_type() => Ok(model),
        Some(model) => Err(ToolError::invalid(format!(
            "\"{provider}/{id}\" is {} model, so {name}() cannot use it; it needs {} model. {}",
            if model.model_type == "image" {
                "an image"
            } else if model.model_type == "chat" {
                "a chat"
            } else {
                "a classifier"
            },
            op.article(),
            op.list_hint()
        ))),
        None => Err(ToolError::invalid(format!(
            "there is no {} model \"{provider}/{id}\" in the catalog. {}",
            op.model_type(),
            op.list_hint()
        ))),
    }
}

fn context_error(op: Operation, problem: String) -> ToolError {
    let shape = match op {
        Operation::Classify => CLASSIFY_SHAPE,
        Operation::GenerateImages => IMAGES_SHAPE,
    };
    ToolError::invalid(format!(
        "{}() {problem}. Expected context: {shape}",
        op.tool_name()
    ))
}

/// Checks a classify context and the model's support for images.
pub(crate) fn classify_input(model: &Model, context: &Value) -> Result<ClassifyInput, ToolError> {
    let op = Operation::Classify;
    let err = |problem: String| context_error(op, problem);
    let ctx = context.as_object().ok_or_else(|| {
        err(format!(
            "needs a context object as its second argument, but got {}",
            describe(context)
        ))
    })?;
    let state = ctx.get("state").unwrap_or(&Value::Null);
    if !state.is_object() {
        return Err(err(format!(
            "needs context.state to be an object, but got {}",
            describe(state)
        )));
    }
    let images = match ctx.get("images") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => images_of(v, "context.images", &err)?,
    };
    if !images.is_empty() && !model.accepts_images() {
        return Err(err(format!(
            "was given images, but the classifier \"{}\" accepts only text; leave out context.images or pick a classifier whose input includes \"image\"",
            model.full_id()
        )));
    }
    let questions_value = ctx.get("questions").unwrap_or(&Value::Null);
    let questions = questions_value
        .as_object()
        .filter(|q| !q.is_empty())
        .ok_or_else(|| {
            err(format!(
                "needs context.questions to map question ids to questions (at least one), but got {}",
                describe(questions_value)
            ))
        })?;
    if questions.len() > MAX_QUESTIONS {
        return Err(err(format!(
            "was given {} questions; one call answers at most {MAX_QUESTIONS}, so split them over several calls",
            questions.len()
        )));
    }
    let mut parsed = Vec::new();
    for (id, q) in questions {
        parsed.push(question_of(id, q, &err)?);
    }
    Ok(ClassifyInput {
        state: state.clone(),
        images,
        questions: parsed,
    })
}

fn question_of(
    id: &str,
    q: &Value,
    err: &dyn Fn(String) -> ToolError,
) -> Result<Question, ToolError> {
    let at = format!("context.questions.{id}");
    let obj = q.as_object().ok_or_else(|| {
        err(format!(
            "needs {at} to be a question object with type, instructions and criteria, but got {}",
            describe(q)
        ))
    })?;
    let instructions = match obj.get("instructions") {
        Some(Value::String(s)) => s.clone(),
        other => {
            return Err(err(format!(
                "needs {at}.instructions to be a string, but got {}",
                describe(other.unwrap_or(&Value::Null))
            )));
        }
    };
    let criteria = obj.get("criteria").unwrap_or(&Value::Null);
    let kind = match obj.get("type").and_then(Value::as_str) {
        Some("choice") => {
            let labels = string_map(criteria).filter(|l| !l.is_empty()).ok_or_else(|| {
                err(format!(
                    "has {at} as a \"choice\" question, so {at}.criteria must map each label to what it means (string values), but got {}",
                    describe(criteria)
                ))
            })?;
            if labels.len() > MAX_CHOICE_LABELS {
                return Err(err(format!(
                    "has {at} with {} labels; a choice question takes at most {MAX_CHOICE_LABELS}",
                    labels.len()
                )));
            }
            QuestionKind::Choice(labels)
        }
        Some("score") => {
            let levels = criteria
                .as_array()
                .filter(|a| a.len() >= 2)
                .and_then(|a| {
                    a.iter()
                        .map(|l| l.as_str().map(str::to_string))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| {
                    err(format!(
                        "has {at} as a \"score\" question, so {at}.criteria must list at least two levels as strings, lowest first, but got {}",
                        describe(criteria)
                    ))
                })?;
            if levels.len() > MAX_SCORE_LEVELS {
                return Err(err(format!(
                    "has {at} with {} levels; a score question takes at most {MAX_SCORE_LEVELS}",
                    levels.len()
                )));
            }
            QuestionKind::Score(levels)
        }
        Some("bool") => {
            let map = string_map(criteria);
            let pair = map.as_ref().and_then(|m| {
                let get = |k: &str| m.iter().find(|(l, _)| l == k).map(|(_, v)| v.clone());
                Some((get("true")?, get("false")?))
            });
            match pair {
                Some((yes, no)) if map.as_ref().is_some_and(|m| m.len() == 2) => {
                    QuestionKind::Bool { yes, no }
                }
                _ => {
                    return Err(err(format!(
                        "has {at} as a \"bool\" question, so {at}.criteria must be {{ true: <meaning>, false: <meaning> }}, but got {}",
                        describe(criteria)
                    )));
                }
            }
        }
        _ => {
            return Err(err(format!(
                "needs {at}.type to be \"choice\", \"score\" or \"bool\", but got {}",
                obj.get("type")
                    .map_or("nothing".to_string(), Value::to_string)
            )));
        }
    };
    Ok(Question {
        id: id.to_string(),
        instructions,
        kind,
    })
}

fn string_map(v: &Value) -> Option<Vec<(String, String)>> {
    v.as_object()?
        .iter()
        .map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect()
}

fn images_of(
    v: &Value,
    at: &str,
    err: &dyn Fn(String) -> ToolError,
) -> Result<Vec<Image>, ToolError> {
    let items = v.as_array().ok_or_else(|| {
        err(format!(
            "needs {at} to be an array of image blocks, but got {}",
            describe(v)
        ))
    })?;
    items
        .iter()
        .enumerate()
        .map(|(i, item)| image_of(item, &format!("{at}[{i}]"), err))
        .collect()
}

fn image_of(item: &Value, at: &str, err: &dyn Fn(String) -> ToolError) -> Result<Image, ToolError> {
    let obj: Option<&Map<String, Value>> = item
        .as_object()
        .filter(|o| o.get("type").and_then(Value::as_str) == Some("image"));
    let data = obj
        .and_then(|o| o.get("data"))
        .and_then(Value::as_str)
        .filter(|d| !d.is_empty())
        .ok_or_else(|| {
            err(format!(
                "needs {at} to be an image block {{ type: \"image\", data: <base64>, mimeType }}, but got {}",
                describe(item)
            ))
        })?;
    let mime_type = image_mime(data).ok_or_else(|| {
        err(format!(
            "got {at} whose data is not a base64 PNG, JPEG, GIF or WebP image"
        ))
    })?;
    Ok(Image {
        data: data.to_string(),
        mime_type,
    })
}

/// Checks a generateImages context: a prompt from the text blocks, plus optional references.
pub(crate) fn images_input(model: &Model, context: &Value) -> Result<ImagesInput, ToolError> {
    let op = Operation::GenerateImages;
    let err = |problem: String| context_error(op, problem);
    let input = context.as_object().and_then(|c| c.get("input"));
    let blocks = input
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| {
            let got = if context.is_object() {
                describe(input.unwrap_or(&Value::Null))
            } else {
                format!("a context of {}", describe(context))
            };
            err(format!(
                "needs context.input to be a non-empty array of blocks, but got {got}"
            ))
        })?;
    let mut texts = Vec::new();
    let mut references = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let at = format!("context.input[{i}]");
        match block.get("type").and_then(Value::as_str) {
            Some("text") => match block.get("text").and_then(Value::as_str) {
                Some(text) => texts.push(text.to_string()),
                None => {
                    return Err(err(format!(
                        "needs {at} to be a text block {{ type: \"text\", text: <string> }}, but got {}",
                        describe(block)
                    )));
                }
            },
            Some("image") => references.push(image_of(block, &at, &err)?),
            _ => {
                return Err(err(format!(
                    "needs {at} to be a text or image block, but got {}",
                    describe(block)
                )));
            }
        }
    }
    let prompt = texts.join("\n\n");
    if prompt.trim().is_empty() {
        return Err(err(
            "needs at least one text block with the prompt in context.input".into(),
        ));
    }
    if !references.is_empty() {
        // The OpenAI-compatible generations endpoint takes a prompt only; sending reference
        // images would need the multipart edits endpoint, which this crate does not speak yet.
        return Err(err(format!(
            "was given reference images, but the image model \"{}\" is reached through the OpenAI-compatible generations endpoint, which takes a text prompt only; leave out the image blocks",
            model.full_id()
        )));
    }
    Ok(ImagesInput { prompt, references })
}
