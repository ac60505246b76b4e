//! The settings of work that outlives a turn: where durable state lives (`state`), what an
//! `ask` does when nobody can answer now (`approvals`), and long-running scripts (`cells`).

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use crate::narrow::Narrowing;

/// What an `ask` does when nobody can answer it now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WhenNobodyCanAnswer {
    /// The call is refused, naming the policy (the default).
    #[default]
    Deny,
    /// The call waits for an answer given later (`codemode approvals`, elicitation on
    /// reconnect, the library); its script's cell waits for approval.
    Pause,
}

/// The `approvals` object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_nobody_can_answer: Option<WhenNobodyCanAnswer>,
    /// How long a paused call waits before it counts as denied: `90s`, `30m`, `8h`, `2d`, or a
    /// number of seconds.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "duration_opt",
        serialize_with = "ser_duration_opt"
    )]
    pub expire_after: Option<Duration>,
}

/// The `cells` object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellSettings {
    /// Whether scripts become cells that may yield (default: on under `codemode serve`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// After this long a running script returns its output so far and keeps running; also the
    /// most a script's `yield_after_ms` option may ask for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yield_after_ms: Option<u64>,
    /// Live cells one session may have at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_session: Option<u32>,
    /// Cells one principal (token) may run at once in this process, over all its sessions:
    /// each holds a sandbox worker while it runs, paused for approval included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running_per_principal: Option<u32>,
}

/// The effective values, after the narrowing rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durable {
    /// Where state lives; by default an SQLite file in your state directory.
    pub state_url: String,
    pub when_nobody_can_answer: WhenNobodyCanAnswer,
    pub approval_expiry: Duration,
    /// `None`: the front end decides (`serve` turns cells on).
    pub cells_enabled: Option<bool>,
    pub yield_after_ms: u64,
    pub max_cells_per_session: u32,
    pub max_running_per_principal: u32,
}

impl Default for Durable {
    fn default() -> Self {
        Durable {
            state_url: "memory:".into(),
            when_nobody_can_answer: WhenNobodyCanAnswer::Deny,
            approval_expiry: DEFAULT_APPROVAL_EXPIRY,
            cells_enabled: None,
            yield_after_ms: DEFAULT_YIELD_AFTER_MS,
            max_cells_per_session: DEFAULT_MAX_CELLS_PER_SESSION,
            max_running_per_principal: DEFAULT_MAX_RUNNING_PER_PRINCIPAL,
        }
    }
}

/// Defaults: approvals expire after an hour, scripts yield after 10 s, 8 live cells a session.
pub const DEFAULT_APPROVAL_EXPIRY: Duration = Duration::from_secs(3600);
pub const DEFAULT_YIELD_AFTER_MS: u64 = 10_000;
pub const DEFAULT_MAX_CELLS_PER_SESSION: u32 = 8;
/// Half of the sandbox's 64 workers: one token leaves the other half to everyone else.
pub const DEFAULT_MAX_RUNNING_PER_PRINCIPAL: u32 = 32;

/// The default state URL: `state.db` in your state directory.
pub fn default_state_url(state_dir: &Path) -> String {
    format!("sqlite://{}", state_dir.join("state.db").display())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn merge(
    n: &mut Narrowing,
    state_dir: &Path,
    state_url: Option<&str>,
    u_approvals: &ApprovalSettings,
    p_approvals: &ApprovalSettings,
    u_cells: &CellSettings,
    p_cells: &CellSettings,
) -> Durable {
    let state_url = state_url
        .map(str::to_string)
        .unwrap_or_else(|| default_state_url(state_dir));
    // Denying is narrower than pausing: a project may turn pausing off, not on.
    let when = n
        .narrow(
            "approvals.when_nobody_can_answer",
            u_approvals.when_nobody_can_answer,
            p_approvals.when_nobody_can_answer,
            |p, _| *p == WhenNobodyCanAnswer::Deny,
        )
        .unwrap_or_default();
    let expiry = n
        .limit(
            "approvals.expire_after",
            Some(u_approvals.expire_after.unwrap_or(DEFAULT_APPROVAL_EXPIRY)),
            p_approvals.expire_after,
        )
        .unwrap_or(DEFAULT_APPROVAL_EXPIRY);
    let cells_enabled = match (u_cells.enabled, p_cells.enabled) {
        (u, None) => u,
        (u, p) => n.switch_off("cells.enabled", u, p, true),
    };
    let yield_after_ms = n
        .limit(
            "cells.yield_after_ms",
            Some(u_cells.yield_after_ms.unwrap_or(DEFAULT_YIELD_AFTER_MS)),
            p_cells.yield_after_ms,
        )
        .unwrap_or(DEFAULT_YIELD_AFTER_MS);
    let max_cells_per_session = n
        .limit(
            "cells.max_per_session",
            Some(
                u_cells
                    .max_per_session
                    .unwrap_or(DEFAULT_MAX_CELLS_PER_SESSION),
            ),
            p_cells.max_per_session,
        )
        .unwrap_or(DEFAULT_MAX_CELLS_PER_SESSION);
    let max_running_per_principal = n
        .limit(
            "cells.max_running_per_principal",
            Some(
                u_cells
                    .max_running_per_principal
                    .unwrap_or(DEFAULT_MAX_RUNNING_PER_PRINCIPAL),
            ),
            p_cells.max_running_per_principal,
        )
        .unwrap_or(DEFAULT_MAX_RUNNING_PER_PRINCIPAL);
    Durable {
        state_url,
        when_nobody_can_answer: when,
        approval_expiry: expiry,
        cells_enabled,
        yield_after_ms,
        max_cells_per_session,
        max_running_per_principal,
    }
}

/// `90s`, `30m`, `8h`, `2d`, `500ms`, or a number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map(|i| s.split_at(i))
        .unwrap_or((s, "s"));
    let n: f64 = number.parse().map_err(|_| {
        format!("`{s}` is not a duration; use a number with ms, s, m, h or d, such as 30m")
    })?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "s" | "" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{s}`; use ms, s, m, h or d"
            ));
        }
    };
    if !(secs > 0.0 && secs.is_finite() && secs < 1e10) {
        return Err(format!(
            "`{s}` must be more than zero and less than 300 years"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn duration_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Seconds(u64),
        Text(String),
    }
    match Option::<Raw>::deserialize(d)? {
        None => Ok(None),
        Some(Raw::Seconds(0)) => Err(serde::de::Error::custom(
            "0 seconds would expire every approval at once; give a positive duration such as \"30m\"",
        )),
        Some(Raw::Seconds(s)) => Ok(Some(Duration::from_secs(s))),
        Some(Raw::Text(t)) => parse_duration(&t)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

fn ser_duration_opt<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&format!("{}ms", d.as_millis())),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5 weeks").is_err());
    }

    #[test]
    fn an_untrusted_project_may_not_turn_pausing_on() {
        let mut n = Narrowing::new(".codemode/settings.json", false);
        let d = merge(
            &mut n,
            Path::new("/state"),
            None,
            &ApprovalSettings::default(),
            &ApprovalSettings {
                when_nobody_can_answer: Some(WhenNobodyCanAnswer::Pause),
                expire_after: Some(Duration::from_secs(7 * 86400)),
            },
            &CellSettings::default(),
            &CellSettings {
                enabled: Some(true),
                yield_after_ms: Some(1_000),
                max_per_session: Some(100),
                max_running_per_principal: Some(64),
            },
        );
        assert_eq!(d.state_url, "sqlite:///state/state.db");
        assert_eq!(d.when_nobody_can_answer, WhenNobodyCanAnswer::Deny);
        assert_eq!(d.approval_expiry, DEFAULT_APPROVAL_EXPIRY);
        assert_eq!(d.yield_after_ms, 1_000, "lowering is allowed");
        assert_eq!(d.max_cells_per_session, DEFAULT_MAX_CELLS_PER_SESSION);
        let warned = n.warnings().join("\n");
        for key in [
            "approvals.when_nobody_can_answer",
            "approvals.expire_after",
            "cells.max_per_session",
            "cells.max_running_per_principal",
        ] {
            assert!(warned.contains(key), "{key} in {warned}");
        }
    }

    #[test]
    fn a_trusted_project_may_and_an_explicit_url_is_used() {
        let mut n = Narrowing::new("p", true);
        let d = merge(
            &mut n,
            Path::new("/state"),
            Some("memory:"),
            &ApprovalSettings::default(),
            &ApprovalSettings {
                when_nobody_can_answer: Some(WhenNobodyCanAnswer::Pause),
                expire_after: None,
            },
            &CellSettings::default(),
            &CellSettings::default(),
        );
        assert_eq!(d.state_url, "memory:");
        assert_eq!(d.when_nobody_can_answer, WhenNobodyCanAnswer::Pause);
    }
}
