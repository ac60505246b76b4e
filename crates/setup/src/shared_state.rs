//! The gate's part of the shared state (issue 16): budgets per session, principal and team in
//! the state store, the audit log as a stream in it, and what telemetry asks of the gate.
//! Kept to this one function so the rest of the set-up does not need to know.

use std::sync::Arc;

use codemode_config::settings::Settings;
use codemode_gate::{AuditKey, AuditLog, CallObserver, GateBuilder, Principal, ProtectedPath};
use codemode_state::StateStore;

use crate::SetupError;
use crate::convert;

/// What the embedder or the command line chose for the gate besides the settings.
#[derive(Default, Clone)]
pub(crate) struct GateExtras {
    pub principal: Option<Principal>,
    pub observer: Option<Arc<dyn CallObserver>>,
}

/// Opens `state.url` (or `--state`), when set.
pub(crate) async fn open_store(
    settings: &Settings,
) -> Result<Option<Arc<dyn StateStore>>, SetupError> {
    let Some(url) = &settings.state_url else {
        return Ok(None);
    };
    codemode_state::open(url, codemode_state::OpenOptions::default())
        .await
        .map(Some)
        .map_err(|e| SetupError::State(e.to_string()))
}

/// Points the gate at the store: budgets always (when any budget needs it), the audit log when
/// `state.audit_stream` names a stream. Returns whether the audit log went to the stream.
pub(crate) fn wire(
    mut gate: GateBuilder,
    store: Option<&Arc<dyn StateStore>>,
    settings: &Settings,
    key_path: &std::path::Path,
    extras: GateExtras,
    warnings: &mut Vec<String>,
) -> Result<(GateBuilder, bool), SetupError> {
    gate = gate
        .principal(extras.principal)
        .trace_arguments(settings.telemetry.include_arguments == Some(true));
    if let Some(observer) = extras.observer {
        gate = gate.observer(observer);
    }
    let daily = convert::daily_budgets(&settings.budgets);
    let Some(store) = store else {
        if daily != codemode_gate::DailyBudgets::default() {
            warnings.push("budgets.principal and budgets.team need a shared state store (`state.url` in your settings, or --state); without one they are not enforced".into());
        }
        if settings.audit_stream.is_some() {
            warnings.push(
                "state.audit_stream needs `state.url`; the audit log stays where audit.path says"
                    .into(),
            );
        }
        return Ok((gate, false));
    };
    gate = gate.shared_budgets(store.clone(), daily);
    let Some(stream) = &settings.audit_stream else {
        return Ok((gate, false));
    };
    let audit_error = |e: codemode_gate::AuditError| SetupError::Audit {
        path: key_path.to_path_buf(),
        message: e.to_string(),
    };
    let key = AuditKey::load_or_create(key_path).map_err(audit_error)?;
    gate = gate
        .protect(ProtectedPath::new(key_path, "the audit log's key"))
        .audit(AuditLog::stream(store.clone(), stream.clone(), key).map_err(audit_error)?);
    Ok((gate, true))
}
