//! `models.json`: providers and models scripts may use, merged from your file and a project's.
//!
//! Keys and headers come only from your file: a project file that names them is ignored there,
//! trusted or not, because they would let a cloned repository send your credentials wherever it
//! likes.

mod parse;

use std::fmt;
use std::path::Path;

use serde_json::Value;

pub use parse::{API_OPENAI_COMPATIBLE, INPUT_KINDS, MODEL_TYPES};

use crate::narrow::Narrowing;
use crate::{ConfigError, Problem};
use parse::{RawFile, RawModel, RawPrice};

/// Where a provider's API key comes from. The key itself is never in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySpec {
    /// The provider needs no key (a local llama.cpp or Ollama server).
    None,
    /// The value of this environment variable.
    Env(String),
    /// The trimmed standard output of this shell command, run in the directory given (that of
    /// the models.json that names it; `None`: the process's own), never in a project.
    Command(String, Option<std::path::PathBuf>),
}

/// A provider and how to reach it. Never shown to scripts.
#[derive(Clone, PartialEq)]
pub struct ProviderConfig {
    pub name: String,
    pub base_url: String,
    pub key: KeySpec,
    pub headers: Vec<(String, String)>,
}

/// Names the headers but never prints their values.
impl fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("name", &self.name)
            .field("base_url", &self.base_url)
            .field("key", &self.key)
            .field(
                "headers",
                &self.headers.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
}

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

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub provider: String,
    pub id: String,
    pub name: String,
    /// `classifier`, `image` or `chat`.
    pub model_type: String,
    /// Input kinds: `text`, `image`.
    pub input: Vec<String>,
    pub price: Price,
}

/// The merged catalog configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelsConfig {
    pub providers: Vec<ProviderConfig>,
    pub models: Vec<ModelConfig>,
}

impl ModelsConfig {
    /// Loads your file and then the project's on top of it; `None` when neither exists.
    ///
    /// The project file may only remove models and providers or narrow a model's input kinds
    /// unless `project_trusted`; a trusted project may also add models and providers and change
    /// URLs. What a project file tried and was not allowed to do comes back as warnings.
    pub fn load(
        user_file: Option<&Path>,
        project_file: Option<&Path>,
        project_trusted: bool,
    ) -> Result<(Option<ModelsConfig>, Vec<String>), ConfigError> {
        let user = user_file.map(read).transpose()?.flatten();
        let project = project_file.map(read).transpose()?.flatten();
        if user.is_none() && project.is_none() {
            return Ok((None, Vec::new()));
        }
        // Models are offered to scripts (and turn code mode on) only where you set them up: an
        // untrusted project's file may narrow your catalog, not make one.
        if let (None, Some((_, file))) = (&user, &project)
            && !project_trusted
        {
            return Ok((
                None,
                vec![format!(
                    "{file}: ignored: an untrusted project's models.json can only narrow yours, and you have none; `codemode trust` the project to use it"
                )],
            ));
        }
        let mut config = ModelsConfig::default();
        let mut warnings = Vec::new();
        if let Some((raw, file)) = user {
            config.add_user(raw, &file)?;
        }
        if let Some((raw, file)) = project {
            let mut n = Narrowing::new(file.clone(), project_trusted);
            config.merge_project(raw, &file, &mut n, &mut warnings)?;
            warnings.extend(n.into_warnings());
        }
        Ok((Some(config), warnings))
    }

    /// One document with your authority (for embedding code and tests).
    pub fn from_json(value: &Value, label: &str) -> Result<ModelsConfig, ConfigError> {
        let mut config = ModelsConfig::default();
        config.add_user(parse::parse_file(value, label)?, label)?;
        Ok(config)
    }

    fn provider(&self, name: &str) -> Option<&ProviderConfig> {
        self.providers.iter().find(|p| p.name == name)
    }

    fn add_user(&mut self, raw: RawFile, file: &str) -> Result<(), Problem> {
        // A relative `./key.sh` is the user's, beside their models.json: run in the project,
        // it would be whatever program the project put there.
        for p in raw.providers {
            if p.enabled == Some(false) {
                continue;
            }
            let base_url = p.base_url.ok_or_else(|| {
                Problem::new(
                    file,
                    format!("providers.{}.baseUrl", p.name),
                    "missing; give the server's OpenAI-compatible base URL, such as \"http://127.0.0.1:8080/v1\"",
                )
            })?;
            let key = match (p.api_key_env, p.api_key_command) {
                (Some(var), _) => KeySpec::Env(var),
                (None, Some(cmd)) => KeySpec::Command(cmd, command_dir(file)),
                (None, None) => KeySpec::None,
            };
            self.providers.retain(|q| q.name != p.name);
            self.providers.push(ProviderConfig {
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
            self.check_provider(&m, file)?;
            let model = new_model(m, file)?;
            self.models
                .retain(|q| !(q.provider == model.provider && q.id == model.id));
            self.models.push(model);
        }
        Ok(())
    }

    fn check_provider(&self, m: &RawModel, file: &str) -> Result<(), Problem> {
        if self.provider(&m.provider).is_none() {
            return Err(Problem::new(
                file,
                format!("{}.provider", m.key),
                format!(
                    "no provider {:?} is defined; add it under \"providers\" or fix the name",
                    m.provider
                ),
            ));
        }
        Ok(())
    }

    fn merge_project(
        &mut self,
        raw: RawFile,
        file: &str,
        n: &mut Narrowing,
        warnings: &mut Vec<String>,
    ) -> Result<(), Problem> {
        let trusted = n.is_trusted();
        for p in raw.providers {
            let at = format!("providers.{}", p.name);
            if p.enabled == Some(false) {
                self.providers.retain(|q| q.name != p.name);
                self.models.retain(|m| m.provider != p.name);
                continue;
            }
            if p.api_key_env.is_some() || p.api_key_command.is_some() || p.headers.is_some() {
                warnings.push(format!(
                    "{file}: ignored `{at}` apiKeyEnv, apiKeyCommand and headers: credentials come only from the user's own models.json, never a project's"
                ));
            }
            match self.providers.iter_mut().find(|q| q.name == p.name) {
                Some(existing) => {
                    let holds_credentials =
                        existing.key != KeySpec::None || !existing.headers.is_empty();
                    if let Some(url) = &p.base_url
                        && *url != existing.base_url
                        && holds_credentials
                    {
                        // Trusted or not: your key goes only where your own file sends it.
                        warnings.push(format!(
                            "{file}: ignored `{at}.baseUrl`: the provider sends your key or headers, and only your own models.json says where; a project, trusted or not, may not send them to another server"
                        ));
                        continue;
                    }
                    if let Some(url) = p.base_url
                        && url != existing.base_url
                        && n.only_if_trusted(
                            &format!("{at}.baseUrl"),
                            "it would send your requests (and key) to another server",
                        )
                    {
                        existing.base_url = url;
                    }
                }
                None => {
                    if !n.only_if_trusted(&at, "it adds a provider") {
                        continue;
                    }
                    let base_url = p.base_url.ok_or_else(|| {
                        Problem::new(
                            file,
                            format!("{at}.baseUrl"),
                            "missing; a new provider needs its base URL",
                        )
                    })?;
                    self.providers.push(ProviderConfig {
                        name: p.name,
                        base_url,
                        key: KeySpec::None,
                        headers: Vec::new(),
                    });
                }
            }
        }
        for m in raw.models {
            let at = format!("{} ({}/{})", m.key, m.provider, m.id);
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
                Some(existing) if trusted => apply_override(existing, &m),
                Some(existing) => {
                    if let Some(input) = &m.input {
                        if input.iter().all(|k| existing.input.contains(k)) {
                            existing.input = input.clone();
                        } else {
                            n.ignore(
                                &format!("{at}.input"),
                                "it would widen the input kinds you allow",
                            );
                        }
                    }
                    let changes_more = m.name.as_ref().is_some_and(|x| *x != existing.name)
                        || m.model_type
                            .as_ref()
                            .is_some_and(|t| *t != existing.model_type)
                        || m.price.is_some();
                    if changes_more {
                        n.ignore(
                            &format!("{at}.name/type/price"),
                            "only enabled and a narrower input apply",
                        );
                    }
                }
                None => {
                    if !n.only_if_trusted(&at, "it adds a model") {
                        continue;
                    }
                    self.check_provider(&m, file)?;
                    let model = new_model(m, file)?;
                    self.models.push(model);
                }
            }
        }
        Ok(())
    }
}

fn new_model(m: RawModel, file: &str) -> Result<ModelConfig, Problem> {
    let model_type = m.model_type.ok_or_else(|| {
        Problem::new(
            file,
            format!("{}.type", m.key),
            "missing; use \"classifier\", \"image\" or \"chat\"",
        )
    })?;
    let price = m.price.unwrap_or_default();
    Ok(ModelConfig {
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

fn apply_override(existing: &mut ModelConfig, m: &RawModel) {
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

fn read(path: &Path) -> Result<Option<(RawFile, String)>, Problem> {
    let file = path.display().to_string();
    match crate::jsonc::read(path)? {
        Some(value) => Ok(Some((parse::parse_file(&value, &file)?, file))),
        None => Ok(None),
    }
}

/// The directory a key command runs in: that of the file naming it, when `file` is a path.
fn command_dir(file: &str) -> Option<std::path::PathBuf> {
    let path = std::path::Path::new(file);
    match path.parent() {
        Some(dir) if path.is_file() && !dir.as_os_str().is_empty() => dir.canonicalize().ok(),
        _ => None,
    }
}
