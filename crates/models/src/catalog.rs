//! The catalog: which providers and models scripts may use. `codemode-config` reads and merges
//! the models.json files; the catalog is built from its result.

use codemode_config::models::{API_OPENAI_COMPATIBLE, KeySpec, MODEL_TYPES, ModelsConfig};
use codemode_spec::ModelFacts;
use serde_json::{Value, json};

use crate::ModelsError;
use crate::credentials::KeySource;

pub use codemode_config::models::Price;

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
            ..ModelFacts::default()
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
    /// The catalog of a merged configuration. Keys are read when a call needs them, not here.
    pub fn new(config: &ModelsConfig) -> Catalog {
        Catalog {
            providers: config
                .providers
                .iter()
                .map(|p| Provider {
                    name: p.name.clone(),
                    base_url: p.base_url.clone(),
                    key: match &p.key {
                        KeySpec::None => KeySource::None,
                        KeySpec::Env(var) => KeySource::Env(var.clone()),
                        KeySpec::Command(cmd, dir) => KeySource::command(cmd.clone(), dir.clone()),
                    },
                    headers: p.headers.clone(),
                })
                .collect(),
            models: config
                .models
                .iter()
                .map(|m| Model {
                    provider: m.provider.clone(),
                    id: m.id.clone(),
                    name: m.name.clone(),
                    model_type: m.model_type.clone(),
                    input: m.input.clone(),
                    price: m.price,
                })
                .collect(),
            enabled: true,
        }
    }

    /// A catalog from one document with the user's authority (for embedding code and tests).
    pub fn from_json(value: &Value) -> Result<Catalog, ModelsError> {
        let config = ModelsConfig::from_json(value, "(inline models JSON)")?;
        Ok(Catalog::new(&config))
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
}

fn check_type(ty: &str) -> Result<(), ModelsError> {
    if MODEL_TYPES.contains(&ty) {
        Ok(())
    } else {
        Err(ModelsError::UnknownType(format!("{ty:?}")))
    }
}
