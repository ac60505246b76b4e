//! Loading everything at once: both settings files, both MCP files, both model catalogs, the
//! trust list and the policy files they list, joined by the narrowing rule.

use std::path::PathBuf;

use crate::error::Problems;
use crate::mcp::McpConfig;
use crate::models::ModelsConfig;
use crate::settings::{CommandLine, Limits, Settings, SettingsFile, SettingsInputs};
use crate::{ConfigError, ConfigPaths, Problem, ProjectPaths, trust};

/// Which files to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sources {
    pub paths: ConfigPaths,
    /// The project whose `.codemode/` files apply, if any.
    pub project: Option<ProjectPaths>,
    /// Read instead of your `mcp.json` (`--mcp-config`); it must exist.
    pub mcp_file: Option<PathBuf>,
    /// Read instead of your `models.json` (`--models-config`); it must exist.
    pub models_file: Option<PathBuf>,
}

impl Sources {
    pub fn new(paths: ConfigPaths) -> Self {
        Sources {
            paths,
            project: None,
            mcp_file: None,
            models_file: None,
        }
    }

    pub fn project(mut self, dir: impl Into<PathBuf>) -> Self {
        self.project = Some(ProjectPaths::new(dir));
        self
    }
}

/// The effective configuration: what every file says after the narrowing rule, plus the warnings
/// for what was ignored.
#[derive(Debug, Clone)]
pub struct Configuration {
    pub settings: Settings,
    pub mcp: McpConfig,
    /// `None` when no models file exists.
    pub models: Option<ModelsConfig>,
    /// Whether you trusted the project (`codemode trust`).
    pub trusted: bool,
    pub project: Option<ProjectPaths>,
    pub paths: ConfigPaths,
    /// One line per ignored setting or skipped server, naming the file and the key.
    pub warnings: Vec<String>,
}

/// Whether the `codemode` tool is offered to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activation {
    pub codemode: bool,
    /// Set when some MCP tools can only be called from scripts but codemode is off.
    pub warning: Option<String>,
}

impl Configuration {
    /// Reads every file of `sources`. `builtin_limits` are the limits that apply where you set
    /// none (the sandbox's defaults): a project may only go below them.
    pub fn load(
        sources: &Sources,
        cli: &CommandLine,
        builtin_limits: &Limits,
    ) -> Result<Configuration, ConfigError> {
        let mut problems = Problems::default();
        let mut warnings = Vec::new();
        let paths = &sources.paths;
        let trusted = sources
            .project
            .as_ref()
            .is_some_and(|p| trust::is_trusted(paths, &p.dir));

        let user_file = paths.settings_file();
        let user = read_settings(&user_file, &mut problems);
        let project = sources.project.as_ref().and_then(|p| {
            let file = p.settings_file();
            read_settings(&file, &mut problems).map(|s| (s, file))
        });
        let settings = Settings::merge(
            SettingsInputs {
                user_file,
                user,
                project,
                trusted,
                state_dir: &paths.state_dir,
                builtin_limits,
            },
            cli,
            &mut warnings,
            &mut problems,
        );

        let mcp_user = required(&sources.mcp_file, "--mcp-config", &mut problems)
            .unwrap_or_else(|| paths.mcp_file());
        let mcp_project = sources.project.as_ref().map(ProjectPaths::mcp_file);
        let mcp = match McpConfig::load(Some(&mcp_user), mcp_project.as_deref(), trusted) {
            Ok((mcp, w)) => {
                warnings.extend(w);
                mcp
            }
            Err(e) => {
                problems.0.extend(e.problems);
                McpConfig::default()
            }
        };

        let models_user = required(&sources.models_file, "--models-config", &mut problems)
            .unwrap_or_else(|| paths.models_file());
        let models_project = sources.project.as_ref().map(ProjectPaths::models_file);
        let models =
            match ModelsConfig::load(Some(&models_user), models_project.as_deref(), trusted) {
                Ok((models, w)) => {
                    warnings.extend(w);
                    models
                }
                Err(e) => {
                    problems.0.extend(e.problems);
                    None
                }
            };

        // The programs codemode starts get its environment without these (see codemode_childenv).
        if let Some(models) = &models {
            codemode_childenv::add_secret_names(models.providers.iter().filter_map(
                |p| match &p.key {
                    crate::models::KeySpec::Env(var) => Some(var.clone()),
                    _ => None,
                },
            ));
        }
        // So do the variables that credentials are written with: a provider's or an HTTP MCP
        // server's headers and URL (`"Authorization": "Bearer ${GH_PAT}"`), a stdio server's env.
        if let Some(models) = &models {
            codemode_childenv::add_secret_names(
                models
                    .providers
                    .iter()
                    .flat_map(|p| p.headers.iter())
                    .flat_map(|(_, value)| crate::mcp::var_names(value)),
            );
        }
        codemode_childenv::add_secret_names(mcp.servers().iter().flat_map(|s| {
            match &s.transport {
                crate::mcp::ServerTransport::Http { url, headers } => headers
                    .values()
                    .chain(std::iter::once(url))
                    .flat_map(|v| crate::mcp::var_names(v))
                    .collect::<Vec<_>>(),
                // A stdio server gets these through its own `env`; other children need not.
                crate::mcp::ServerTransport::Stdio { env, .. } => env
                    .values()
                    .flat_map(|v| crate::mcp::var_names(v))
                    .collect(),
            }
        }));
        codemode_childenv::add_passed_names(settings.pass_env.iter().cloned());

        problems.into_result(Configuration {
            settings,
            mcp,
            models,
            trusted,
            project: sources.project.clone(),
            paths: paths.clone(),
            warnings,
        })
    }

    /// Whether the `codemode` tool is offered. It is when something asks for it — `explicit`
    /// (the caller registered tools of its own for scripts: the built-in tools, a model catalog,
    /// or an embedder's), or a mode chosen in settings or on the command line — or when
    /// `autoEnableCodemode` is true and some MCP server has tools only scripts can reach.
    pub fn activation(&self, explicit: bool) -> Activation {
        let codemode = explicit || self.settings.mode.is_some() || self.mcp.auto_enable_codemode();
        Activation {
            codemode,
            warning: self.mcp.reachability_warning(codemode),
        }
    }
}

fn read_settings(path: &std::path::Path, problems: &mut Problems) -> Option<SettingsFile> {
    match SettingsFile::read(path) {
        Ok(s) => s,
        Err(e) => {
            problems.0.extend(e.problems);
            None
        }
    }
}

/// A file named on the command line must exist: a typo there must not quietly mean "none".
fn required(file: &Option<PathBuf>, flag: &str, problems: &mut Problems) -> Option<PathBuf> {
    let file = file.as_ref()?;
    if !file.exists() {
        problems.push(Problem::new(
            flag,
            "",
            format!("{} does not exist", file.display()),
        ));
    }
    Some(file.clone())
}
