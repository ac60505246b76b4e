//! Approvals asked of the person through their MCP client (elicitation).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use codemode_gate::{ApprovalAnswer, ApprovalRequest, Approver};
use codemode_spec::BoxFuture;
use rmcp::model::{
    ClientResult, ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction,
    ServerRequest,
};
use rmcp::service::{Peer, PeerRequestOptions, RoleServer};
use serde_json::{Value, json};

/// Routes the gate's approval questions to the MCP client of the session that made the call.
///
/// Build the gate with this approver (`Gate::builder().approver(Arc::new(router.clone()))`) and
/// hand the same router to [`crate::serve_stdio`] or [`crate::serve_http`]. A question goes to the
/// client as a form elicitation; a client that did not declare the elicitation capability, or a
/// session that is gone, gets *no* (failing closed), with the reason in the log. A question
/// the client leaves unanswered for [`ElicitationApprover::set_answer_within`] is withdrawn
/// (`notifications/cancelled`) and counts as unasked: a client that declares elicitation and
/// never answers would otherwise hold the call, its script and its sandbox worker for as long
/// as the session lives.
#[derive(Clone)]
pub struct ElicitationApprover {
    sessions: Arc<RwLock<HashMap<String, SessionPeer>>>,
    /// How long a question waits for the client's answer, in milliseconds (shared by clones).
    answer_within_ms: Arc<AtomicU64>,
}

impl Default for ElicitationApprover {
    fn default() -> Self {
        ElicitationApprover {
            sessions: Arc::default(),
            answer_within_ms: Arc::new(AtomicU64::new(DEFAULT_ANSWER_WITHIN.as_millis() as u64)),
        }
    }
}

/// The default of `approvals.expire_after`, which `codemode serve` sets instead.
const DEFAULT_ANSWER_WITHIN: Duration = Duration::from_secs(3600);

#[derive(Clone)]
struct SessionPeer {
    peer: Peer<RoleServer>,
    can_elicit: bool,
    /// Which connection registered it: a session restored on a new connection replaces the old
    /// one, and the old one's end must not remove the new one.
    owner: u64,
}

impl ElicitationApprover {
    pub fn new() -> Self {
        Self::default()
    }

    /// How long a question waits for the client's answer before it is withdrawn and counts as
    /// unasked (`approvals.expire_after`). Applies to every clone, questions asked later.
    pub fn set_answer_within(&self, limit: Duration) {
        let ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX).max(1);
        self.answer_within_ms.store(ms, Ordering::Relaxed);
    }

    fn answer_within(&self) -> Duration {
        Duration::from_millis(self.answer_within_ms.load(Ordering::Relaxed))
    }

    pub(crate) fn register(
        &self,
        session_id: &str,
        peer: Peer<RoleServer>,
        can_elicit: bool,
        owner: u64,
    ) {
        let mut sessions = self.sessions.write().unwrap_or_else(|e| e.into_inner());
        sessions.insert(
            session_id.to_string(),
            SessionPeer {
                peer,
                can_elicit,
                owner,
            },
        );
    }

    pub(crate) fn forget(&self, session_id: &str, owner: u64) {
        let mut sessions = self.sessions.write().unwrap_or_else(|e| e.into_inner());
        if sessions.get(session_id).is_some_and(|s| s.owner == owner) {
            sessions.remove(session_id);
        }
    }

    /// How many clients are registered (for tests of what ended sessions leave behind).
    pub fn len(&self) -> usize {
        self.sessions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tells every connected client that the tool list changed (the `codemode` description
    /// follows the registry), so it lists the tools again. The router knows every session's
    /// client, which is why this lives here.
    pub async fn notify_tool_list_changed(&self) {
        let peers: Vec<Peer<RoleServer>> = {
            let sessions = self.sessions.read().unwrap_or_else(|e| e.into_inner());
            sessions.values().map(|s| s.peer.clone()).collect()
        };
        // All at once, each with a time limit: a client that stopped reading its stream would
        // otherwise hold up every client after it.
        let sends = peers.into_iter().map(|peer| async move {
            match tokio::time::timeout(NOTIFY_WAIT, peer.notify_tool_list_changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "a client did not take the tool-list notification")
                }
                Err(_) => {
                    tracing::debug!("a client did not take the tool-list notification in time")
                }
            }
        });
        futures::future::join_all(sends).await;
    }

    fn session(&self, session_id: &str) -> Option<SessionPeer> {
        let sessions = self.sessions.read().unwrap_or_else(|e| e.into_inner());
        sessions.get(session_id).cloned()
    }

    async fn ask(&self, req: &ApprovalRequest) -> ApprovalAnswer {
        let session = &req.provenance.session_id;
        let Some(target) = self.session(session) else {
            tracing::warn!(%session, tool = %req.tool_name, "approval denied: no MCP client for this session");
            return ApprovalAnswer::Unasked("the client's session has ended");
        };
        if !target.can_elicit {
            tracing::warn!(
                %session,
                tool = %req.tool_name,
                "approval denied: the MCP client does not support elicitation, so nobody can be asked"
            );
            return ApprovalAnswer::Unasked("this client cannot show approval requests");
        }
        self.elicit(&target, req).await
    }

    async fn elicit(&self, target: &SessionPeer, req: &ApprovalRequest) -> ApprovalAnswer {
        let session = &req.provenance.session_id;
        let params: ElicitRequestParams = match serde_json::from_value(question(req)) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "approval denied: could not build the elicitation");
                return ApprovalAnswer::Unasked("the approval request could not be built");
            }
        };
        // rmcp withdraws the question (notifications/cancelled) when the limit passes.
        let limit = self.answer_within();
        let sent = target
            .peer
            .send_request_with_option(
                ServerRequest::ElicitRequest(ElicitRequest::new(params)),
                PeerRequestOptions::with_timeout(limit),
            )
            .await;
        let asked = match sent {
            Ok(handle) => handle.await_response().await,
            Err(e) => Err(e),
        };
        if let Err(rmcp::ServiceError::Timeout { .. }) = &asked {
            tracing::warn!(%session, tool = %req.tool_name, ?limit, "approval not given: the client did not answer in time");
            return ApprovalAnswer::Unasked(
                "the client did not answer the approval request before it expired (approvals.expire_after)",
            );
        }
        let asked = asked.and_then(|r| match r {
            ClientResult::ElicitResult(answer) => Ok(answer),
            _ => Err(rmcp::ServiceError::UnexpectedResponse),
        });
        let asked: Result<ElicitResult, _> = asked;
        match asked {
            Ok(answer) if answer.action == ElicitationAction::Accept => {
                match answer
                    .content
                    .as_ref()
                    .and_then(|c| c.get("decision"))
                    .and_then(Value::as_str)
                {
                    Some("yes") => ApprovalAnswer::Yes,
                    Some("always") => ApprovalAnswer::Always,
                    _ => ApprovalAnswer::No,
                }
            }
            Ok(_) => ApprovalAnswer::No,
            Err(e) => {
                tracing::warn!(%session, error = %e, "approval denied: the elicitation failed");
                ApprovalAnswer::Unasked("the client did not answer the approval request")
            }
        }
    }
}

impl ElicitationApprover {
    /// Asks the client of `session_id`, one at a time, about the calls of its cells that paused
    /// for approval (nobody could be asked then), and answers each through the state store
    /// (channel `elicitation`; the answerer is the session's principal, or the client's name
    /// where no token names one). The cell then goes on, in whichever process holds it. An
    /// approval answered meanwhile elsewhere is skipped.
    pub(crate) async fn ask_pending(
        &self,
        codemode: &codemode_runtime::Codemode,
        session_id: &str,
        client: Option<String>,
    ) {
        use codemode_runtime::codemode_state::{ApprovalQuery, ApprovalState, Decision};
        let Some(cells) = codemode.cells() else {
            return;
        };
        let query = ApprovalQuery {
            state: Some(ApprovalState::Pending),
            session_id: Some(session_id.to_string()),
            cell_id: None,
        };
        let pending = match cells.store().list_approvals(query).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(session = %session_id, "could not list pending approvals: {e}");
                return;
            }
        };
        let Some(target) = self.session(session_id).filter(|t| t.can_elicit) else {
            return;
        };
        for approval in pending {
            let req = ApprovalRequest {
                tool_name: approval.tool.clone(),
                kind: codemode_spec::CallKind::Tool,
                args: approval.arguments.clone(),
                // Where the call really lands (links followed), as the live question shows it.
                paths: approval.paths.clone(),
                provenance: serde_json::from_value(approval.provenance.clone())
                    .unwrap_or_else(|_| codemode_spec::Provenance::model("", session_id)),
                reason: format!("{} (asked earlier, while you were away)", approval.reason),
                policy_ids: approval.policy_ids.clone(),
            };
            let decision = match self.elicit(&target, &req).await {
                ApprovalAnswer::Yes | ApprovalAnswer::Always => Decision::Approve,
                ApprovalAnswer::No => Decision::Deny,
                // The client did not answer: the approval stays pending for another channel.
                ApprovalAnswer::Unasked(_) => continue,
            };
            // Who answered: the session's principal (its token) where there is one; a client
            // names itself, so its name is only the answerer where no token says more.
            let by = codemode
                .gate()
                .principal_of(session_id)
                .map(|p| p.id)
                .or_else(|| client.clone())
                .unwrap_or_else(|| "mcp-client".into());
            let answered = codemode_runtime::cells::answer_approval(
                cells.store().as_ref(),
                &cells.config().audit,
                &approval.id,
                decision,
                &by,
                "elicitation",
                Some(&approval.call_hash),
            )
            .await;
            if let Err(e) = answered {
                tracing::info!(approval = %approval.id, "the client's answer was not taken: {e}");
            }
        }
    }
}

impl Approver for ElicitationApprover {
    fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, ApprovalAnswer> {
        Box::pin(self.ask(req))
    }
}

fn question(req: &ApprovalRequest) -> Value {
    // Whole, as the terminal shows them: a person cannot approve what was cut from sight.
    let args = req.shown_arguments();
    // The reason is a hook's words, which may quote the call: escaped as the terminal prompt
    // escapes it, so it can neither reorder the question nor add a line that reads as its own.
    let mut message = format!(
        "codemode wants to call `{}`.\n\nWhy approval is needed: {}\n\nArguments ({} characters): {args}",
        codemode_gate::shown_text(&req.tool_name),
        codemode_gate::shown_text(&req.reason),
        args.chars().count()
    );
    if !req.paths.is_empty() {
        message.push_str(&format!(
            "\nPaths it reaches (resolved, links followed):\n{}",
            req.shown_paths()
        ));
    }
    // "Always" lasts for one script; a direct call or the client's own has none to last for.
    let (choices, description) = match req.provenance.script_id {
        Some(_) => (
            json!(["yes", "always", "no"]),
            "yes: this call; always: this tool for the rest of the script; no: refuse",
        ),
        None => (json!(["yes", "no"]), "yes: this call; no: refuse"),
    };
    json!({
        "mode": "form",
        "message": message,
        "requestedSchema": {
            "type": "object",
            "properties": {
                "decision": {
                    "type": "string",
                    "title": "Allow this call?",
                    "enum": choices,
                    "description": description
                }
            },
            "required": ["decision"]
        }
    })
}

/// How long a client gets to take a notification.
const NOTIFY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;
    use codemode_spec::{CallKind, Provenance};

    /// A red team padded a command with 20,000 spaces: the prompt cut it at 2,000 characters,
    /// so the person approved `; touch PWNED` without seeing it.
    #[test]
    fn the_question_shows_a_padded_command_to_its_end_with_reordering_marks_escaped() {
        let command = format!(
            "echo hi{}; touch PWNED\u{202e}\u{2066} x",
            " ".repeat(20_000)
        );
        let req = ApprovalRequest {
            tool_name: "bash".into(),
            kind: CallKind::Tool,
            args: json!({ "command": command }),
            paths: Vec::new(),
            provenance: Provenance::model("c1", "s"),
            reason: "bash may change anything".into(),
            policy_ids: Vec::new(),
        };
        let message = question(&req)["message"].as_str().unwrap().to_string();
        assert!(
            message.contains("echo hi⟨20000 spaces⟩; touch PWNED\\u202e\\u2066 x"),
            "{message}"
        );
        assert!(!message.contains('\u{202e}') && !message.contains('\u{2066}'));
    }

    /// Red team: the terminal prompt, `approvals list` and `show` escape the reason (a hook's
    /// words, which may quote the call) and the tool name; the question put to the client
    /// showed them raw, so a right-to-left override in a hook's reason reordered it there.
    #[test]
    fn the_question_shows_the_reason_and_tool_name_escaped() {
        let req = ApprovalRequest {
            tool_name: "bash".into(),
            kind: CallKind::Tool,
            args: json!({ "command": "ls" }),
            paths: Vec::new(),
            provenance: Provenance::model("c1", "s"),
            reason: "the hook says: \u{202e}txt.exe\u{9b}2K\nArguments: {}\u{2066} (hook)".into(),
            policy_ids: Vec::new(),
        };
        let message = question(&req)["message"].as_str().unwrap().to_string();
        for raw in ['\u{202e}', '\u{9b}', '\u{2066}'] {
            assert!(!message.contains(raw), "{raw:?} in {message:?}");
        }
        assert!(
            message.contains(
                "the hook says: \\u202etxt.exe\\u009b2K\\u000aArguments: {}\\u2066 (hook)"
            ),
            "{message}"
        );
    }
}
