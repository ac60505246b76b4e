//! The catalog: which providers and models scripts may use, merged from the user's and the
//! project's models.json under the narrowing rule.

use std::path::Path;

use codemode_spec::ModelFacts;
use serde_json::{Value, json};

use crate::ModelsError;
use crate::credentials::KeySource;
use crate::raw::{self, API_OPENAI_COMPATIBLE, MODEL_TYPES, RawFile, RawModel, RawPrice};

/// USD prices of one model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Price {
    /// Per million input tokens.
    pub input: f64,
    /// Per million output tokens.
    pub output: f64,
    /// Per generated image.
    pub image: f64,
}

/// One model as the catalog holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub provider: String,
    pub id: String,
    pub name: String,
    /// `classifier`, `image` or `chat`.
    pub model_type: String,
    /// Input kinds: `text`, `image`.
    pub input: Vec<String>,
    pub price: Price,
}

impl Model {
    /// `provider/id`, the name the settings allow-list and messages use.
    pub fn full_id(&self) -> String {
        format!("{}/{}", self.provider, self.id)
    }

    pub fn accepts_images(&self) -> bool {
        self.input.iter().any(|k| k == "image")
    }

    /// What the policy and budgets see about a call on this model.
    pub fn facts(&self) -> ModelFacts {
        ModelFacts {
            provider: self.provider.clone(),
            id: self.id.clone(),
            model_type: self.model_type.clone(),
            input_price: self.price.input,
            output_price: self.price.output,
            image_price: self.price.image,
        }
    }

    /// The entry a script sees: no URL, key or headers, which may carry credentials.
    fn script_entry(&self) -> Value {
        json!({
            "type": self.model_type,
            "provider": self.provider,
            "id": self.id,
            "name": self.name,
            "api": API_OPENAI_COMPATIBLE,
            "input": self.input,
            "price": { "input": self.price.input, "output": self.price.output, "image": self.price.image },
        })
    }
}

/// A provider with its endpoint and credential source. Never shown to scripts.
#[derive(Debug)]
pub(crate) struct Provider {
    pub name: String,
    pub base_url: String,
    pub key: KeySource,
    pub headers: Vec<(String, String)>,
}

/// Providers and models loaded from models.json files.
///
/// Scripts reach models only through this catalog, by provider and id, so the URL, key and
/// headers always come from the user's files and never from the script.
#[derive(Debug, Default)]
pub struct Catalog {
    providers: Vec<Provider>,
    models: Vec<Model>,
    enabled: bool,
}

impl Catalog {
    /// Loads the user's file and then the project's on top of it.
    ///
    /// A missing file is no error (there is simply nothing in it). The project file may only
    /// remove models and providers or narrow a model's input kinds unless `project_trusted`;
    /// a trusted project may also add models and providers and change URLs. No project file
    /// ever supplies a key or headers: those would let a cloned repository send the user's
    /// credentials wherever it likes. What a project file tried and was not allowed to do comes
    /// back as warnings.
    pub fn load(
        user_file: Option<&Path>,
        project_file: Option<&Path>,
        project_trusted: bool,
    ) -> Result<(Catalog, Vec<String>), ModelsError> {
        let mut catalog = Catalog {
            enabled: true,
            ..Default::default()
        };
        let mut warnings = Vec::new();
        if let Some(path) = user_file
            && let Some(raw) = read_file(path)?
        {
            catalog.add_user(raw, &path.display().to_string())?;
        }
        if let Some(path) = project_file
            && let Some(raw) = read_file(path)?
        {
            catalog.merge_project(
                raw,
                &path.display().to_string(),
                project_trusted,
                &mut warnings,
            )?;
        }
        Ok((catalog, warnings))
    }

    /// A catalog from one document with the user's authority (for embedding code and tests).
    pub fn from_json(value: &Value) -> Result<Catalog, ModelsError> {
        let mut catalog = Catalog {
            enabled: true,
            ..Default::default()
        };
        catalog.add_user(
            raw::parse_file(value, "(inline models JSON)")?,
            "(inline models JSON)",
        )?;
        Ok(catalog)
    }

    /// Applies the settings switch: `enabled = false` removes every model; `allow` keeps only
    /// the listed `provider/id` names.
    pub fn restrict(&mut self, enabled: bool, allow: Option<&[String]>) {
        if !enabled {
            self.enabled = false;
            self.models.clear();
            return;
        }
        if let Some(allow) = allow {
            self.models
                .retain(|m| allow.iter().any(|a| *a == m.full_id()));
        }
    }

    /// False when the settings turned models off.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Every model of type `ty`, as scripts see them (`models.getModelsOfType`).
    pub fn models_of_type(&self, ty: &str) -> Result<Vec<Value>, ModelsError> {
        check_type(ty)?;
        Ok(self
            .models
            .iter()
            .filter(|m| m.model_type == ty)
            .map(Model::script_entry)
            .collect())
    }

    /// Models of type `ty` whose provider has a credential now (`models.getAvailableOfType`).
    /// May run an `apiKeyCommand`, so it can block briefly.
    pub fn available_of_type(&self, ty: &str) -> Result<Vec<Value>, ModelsError> {
        check_type(ty)?;
        Ok(self
            .models
            .iter()
            .filter(|m| m.model_type == ty)
            .filter(|m| {
                self.provider(&m.provider)
                    .is_some_and(|p| p.key.is_available())
            })
            .map(Model::script_entry)
            .collect())
    }

    /// One model by type, provider and id (`models.getModelOfType`).
    pub fn model_of_type(
        &self,
        ty: &str,
        provider: &str,
        id: &str,
    ) -> Result<Option<Value>, ModelsError> {
        check_type(ty)?;
        Ok(self
            .model(provider, id)
            .filter(|m| m.model_type == ty)
            .map(Model::script_entry))
    }

    /// A model by provider and id, of any type.
    pub fn model(&self, provider: &str, id: &str) -> Option<&Model> {
        self.models
            .iter()
            .find(|m| m.provider == provider && m.id == id)
    }

    pub(crate) fn provider(&self, name: &str) -> Option<&Provider> {
        self.providers.iter().find(|p| p.name == name)
    }

    fn add_user(&mut self, raw: RawFile, file: &str) -> Result<(), ModelsError> {
        let bad = |key: String, message: String| ModelsError::Invalid {
            file: file.to_string(),
            key,
            message,
        };
        for p in raw.providers {
            if p.enabled == Some(false) {
                continue;
            }
            let base_url = p.base_url.ok_or_else(|| {
                bad(
                    format!("providers.{}.baseUrl", p.name),
                    "missing; give the server's OpenAI-compatible base URL, such as \"http://127.0.0.1:8080/v1\"".into(),
                )
            })?;
            let key = match (p.api_key_env, p.api_key_command) {
                (Some(var), _) => KeySource::Env(var),
                (None, Some(cmd)) => KeySource::command(cmd),
                (None, None) => KeySource::None,
            };
            self.providers.retain(|q| q.name != p.name);
            self.providers.push(Provider {
                name: p.name,
                base_url,
                key,
                headers: p.headers.unwrap_or_default(),
            });
        }
        for m in raw.models {
            if m.enabled == Some(false) {
                continue;
            }
            if self.provider(&m.provider).is_none() {
                return Err(bad(
                    format!("{}.provider", m.key),
                    format!(
                        "no provider {:?} is defined; add it under \"providers\" or fix the name",
                        m.provider
                    ),
                ));
            }
            let model = new_model(m, file)?;
            self.models
                .retain(|q| !(q.provider == model.provider && q.id == model.id));
            self.models.push(model);
        }
        Ok(())
    }

    fn merge_project(
        &mut self,
        raw: RawFile,
        file: &str,
        trusted: bool,
        warnings: &mut Vec<String>,
    ) -> Result<(), ModelsError> {
        let untrusted_note = "the project is not trusted, so its models file may only remove or restrict models and providers";
        for p in raw.providers {
            let at = format!("{file}: providers.{}", p.name);
            if p.enabled == Some(false) {
                self.providers.retain(|q| q.name != p.name);
                self.models.retain(|m| m.provider != p.name);
                continue;
            }
            if p.api_key_env.is_some() || p.api_key_command.is_some() || p.headers.is_some() {
                warnings.push(format!(
                    "{at}: apiKeyEnv, apiKeyCommand and headers are ignored in a project's models file; credentials come only from the user's models file"
                ));
            }
            match self.providers.iter_mut().find(|q| q.name == p.name) {
                Some(existing) => {
                    if let Some(url) = p.base_url
                        && url != existing.base_url
                    {
                        if trusted {
                            existing.base_url = url;
                        } else {
                            warnings.push(format!("{at}.baseUrl ignored: {untrusted_note}"));
                        }
                    }
                }
                None if trusted => match p.base_url {
                    Some(base_url) => self.providers.push(Provider {
                        name: p.name,
                        base_url,
                        key: KeySource::None,
                        headers: Vec::new(),
                    }),
                    None => {
                        return Err(ModelsError::Invalid {
                            file: file.to_string(),
                            key: format!("providers.{}.baseUrl", p.name),
                            message: "missing; a new provider needs its base URL".into(),
                        });
                    }
                },
                None => warnings.push(format!("{at} not added: {untrusted_note}")),
            }
        }
        for m in raw.models {
            let at = format!("{file}: {} ({}/{})", m.key, m.provider, m.id);
            if m.enabled == Some(false) {
                self.models
                    .retain(|q| !(q.provider == m.provider && q.id == m.id));
                continue;
            }
            let existing = self
                .models
                .iter_mut()
                .find(|q| q.provider == m.provider && q.id == m.id);
            match existing {
                Some(existing) => {
                    if trusted {
                        apply_override(existing, &m);
                        continue;
                    }
                    if let Some(input) = &m.input {
                        if input.iter().all(|k| existing.input.contains(k)) {
                            existing.input = input.clone();
                        } else {
                            warnings.push(format!("{at}: input not widened: {untrusted_note}"));
                        }
                    }
                    let changes_more = m.name.as_ref().is_some_and(|n| *n != existing.name)
                        || m.model_type
                            .as_ref()
                            .is_some_and(|t| *t != existing.model_type)
                        || m.price.is_some();
                    if changes_more {
                        warnings.push(format!(
                            "{at}: only enabled and a narrower input are applied: {untrusted_note}"
                        ));
                    }
                }
                None if trusted => {
                    if self.provider(&m.provider).is_none() {
                        return Err(ModelsError::Invalid {
                            file: file.to_string(),
                            key: format!("{}.provider", m.key),
                            message: format!(
                                "no provider {:?} is defined; add it under \"providers\" or fix the name",
                                m.provider
                            ),
                        });
                    }
                    let model = new_model(m, file)?;
                    self.models.push(model);
                }
                None => warnings.push(format!("{at} not added: {untrusted_note}")),
            }
        }
        Ok(())
    }
}

fn new_model(m: RawModel, file: &str) -> Result<Model, ModelsError> {
    let model_type = m.model_type.ok_or_else(|| ModelsError::Invalid {
        file: file.to_string(),
        key: format!("{}.type", m.key),
        message: "missing; use \"classifier\", \"image\" or \"chat\"".into(),
    })?;
    let price = m.price.unwrap_or_default();
    Ok(Model {
        name: m.name.unwrap_or_else(|| m.id.clone()),
        provider: m.provider,
        id: m.id,
        model_type,
        input: m.input.unwrap_or_else(|| vec!["text".to_string()]),
        price: Price {
            input: price.input.unwrap_or(0.0),
            output: price.output.unwrap_or(0.0),
            image: price.image.unwrap_or(0.0),
        },
    })
}

fn apply_override(existing: &mut Model, m: &RawModel) {
    if let Some(name) = &m.name {
        existing.name = name.clone();
    }
    if let Some(t) = &m.model_type {
        existing.model_type = t.clone();
    }
    if let Some(input) = &m.input {
        existing.input = input.clone();
    }
    if let Some(RawPrice {
        input,
        output,
        image,
    }) = m.price
    {
        existing.price.input = input.unwrap_or(existing.price.input);
        existing.price.output = output.unwrap_or(existing.price.output);
        existing.price.image = image.unwrap_or(existing.price.image);
    }
}

fn read_file(path: &Path) -> Result<Option<RawFile>, ModelsError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ModelsError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let file = path.display().to_string();
    let value: Value = serde_json::from_str(&text).map_err(|e| ModelsError::Syntax {
        file: file.clone(),
        message: e.to_string(),
    })?;
    raw::parse_file(&value, &file).map(Some)
}

fn check_type(ty: &str) -> Result<(), ModelsError> {
    if MODEL_TYPES.contains(&ty) {
        Ok(())
    } else {
        Err(ModelsError::UnknownType(format!("{ty:?}")))
    }
}
