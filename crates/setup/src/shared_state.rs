//! The gate's part of the shared state (issue 16): budgets per session, principal and team in
//! the state store, the audit log as a stream in it, and what telemetry asks of the gate.
//! Kept to this one function so the rest of the set-up does not need to know.

use std::sync::Arc;

use codemode_config::settings::Settings;
use codemode_gate::{AuditKey, AuditLog, CallObserver, GateBuilder, Principal};
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
        .map_err(SetupError::State)
}

/// Points the gate at the store: budgets always (when any budget needs it), the audit log when
/// `state.audit_stream` names a stream. Returns the audit log of that stream, if it went there.
pub(crate) fn wire(
    mut gate: GateBuilder,
    store: Option<&Arc<dyn StateStore>>,
    settings: &Settings,
    key_path: &std::path::Path,
    extras: GateExtras,
    warnings: &mut Vec<String>,
) -> Result<(GateBuilder, Option<AuditLog>), SetupError> {
    gate = gate
        .principal(extras.principal)
        .trace_arguments(settings.telemetry.include_arguments == Some(true));
    if let Some(observer) = extras.observer {
        gate = gate.observer(observer);
    }
    let daily = convert::daily_budgets(&settings.budgets);
    let store = match store {
        Some(store) => store.clone(),
        None => {
            if settings.audit_stream.is_some() {
                warnings.push(
                    "state.audit_stream needs `state.url`; the audit log stays where audit.path says"
                        .into(),
                );
            }
            if daily == codemode_gate::DailyBudgets::default() {
                return Ok((gate, None));
            }
            // Budgets per principal and team still hold without a shared store: in this
            // process's memory, so each process has its own (say so, never skip them).
            warnings.push("budgets.principal and budgets.team are kept in this process only: with several processes, give them one `state.url` (or --state) to share".into());
            let memory: Arc<dyn StateStore> = Arc::new(codemode_state::MemoryStore::new(
                codemode_state::Clock::system(),
            ));
            return Ok((gate.shared_budgets(memory, daily), None));
        }
    };
    let store = &store;
    gate = gate.shared_budgets(store.clone(), daily);
    let Some(stream) = &settings.audit_stream else {
        return Ok((gate, None));
    };
    let audit_error = |e: codemode_gate::AuditError| SetupError::Audit {
        path: key_path.to_path_buf(),
        message: e.to_string(),
    };
    let key = AuditKey::load_or_create(key_path).map_err(audit_error)?;
    let log = AuditLog::stream(store.clone(), stream.clone(), key).map_err(audit_error)?;
    // The key path is protected as a secret by the caller, log or not.
    gate = gate.audit(log.clone());
    Ok((gate, Some(log)))
}
