//! Pending approvals: a call that a policy asked a person about, waiting for an answer that may
//! come from another process or replica.
//!
//! An approval is bound to one exact call by [`call_hash_with_paths`]: answering it names the
//! hash of the call the person was shown, and the gate must check the hash again before it runs
//! the call, so an approval can never be spent on a different call. Answering is a
//! compare-and-set on a pending, unexpired row: of two approvers at once exactly one wins, the
//! other gets [`crate::StateError::ApprovalAnswered`].

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{Result, StateError};
use crate::validate::{check_id, check_text, json_text};

/// The SHA-256 (hex) of a call's tool, arguments and provenance, as compact JSON in that order.
/// Key order counts, so hash the arguments exactly as the call carries them.
pub fn call_hash(tool: &str, arguments: &Value, provenance: &Value) -> String {
    let text = format!(
        "[{},{},{}]",
        json_text(&Value::String(tool.to_string())),
        json_text(arguments),
        json_text(provenance)
    );
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// [`call_hash`], also over the resolved paths the call reaches (links followed), in order.
/// A call whose `docs/x.txt` lands somewhere else once a link is changed is then a different
/// call, and an approval given for the old place does not carry over. Equals [`call_hash`] when
/// there are no paths, so approvals stored before paths were recorded keep their hash.
pub fn call_hash_with_paths(
    tool: &str,
    arguments: &Value,
    provenance: &Value,
    paths: &[String],
) -> String {
    if paths.is_empty() {
        return call_hash(tool, arguments, provenance);
    }
    let text = format!(
        "[{},{},{},{}]",
        json_text(&Value::String(tool.to_string())),
        json_text(arguments),
        json_text(provenance),
        json_text(&Value::from(paths.to_vec()))
    );
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// A call waiting for a person. The store makes the id and the call hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewApproval {
    pub cell_id: Option<String>,
    pub session_id: String,
    pub tool: String,
    pub arguments: Value,
    pub provenance: Value,
    /// The paths the call reaches, resolved (links followed), as the gate judged them: what the
    /// person must see, since `docs/x.txt` in the arguments may land outside the project.
    #[serde(default)]
    pub paths: Vec<String>,
    /// The policies whose `@ask` asked.
    pub policy_ids: Vec<String>,
    /// Why approval is needed, in words for the person.
    pub reason: String,
    /// After this the approval expires and counts as a denial.
    pub expires_in: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    Pending,
    Approved,
    Denied,
    Expired,
}

impl ApprovalState {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Approved => "approved",
            ApprovalState::Denied => "denied",
            ApprovalState::Expired => "expired",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => ApprovalState::Pending,
            "approved" => ApprovalState::Approved,
            "denied" => ApprovalState::Denied,
            "expired" => ApprovalState::Expired,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Approve,
    Deny,
}

/// A person's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub decision: Decision,
    /// Who answered (a user name, a client id).
    pub by: String,
    /// Through what: `cli`, `elicitation`, `library`, ...
    pub channel: String,
    /// The hash of the call the person was shown; it must equal the approval's.
    pub call_hash: String,
}

/// The channel and answerer recorded on approvals that expired.
pub const EXPIRY_CHANNEL: &str = "expiry";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    pub id: String,
    pub cell_id: Option<String>,
    pub session_id: String,
    pub tool: String,
    pub arguments: Value,
    pub provenance: Value,
    /// The resolved paths the call reaches (see [`NewApproval::paths`]); empty for approvals
    /// stored before paths were recorded.
    #[serde(default)]
    pub paths: Vec<String>,
    pub policy_ids: Vec<String>,
    pub reason: String,
    pub call_hash: String,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    pub state: ApprovalState,
    pub answered_by: Option<String>,
    pub answered_channel: Option<String>,
    pub answered_at_ms: Option<i64>,
}

/// Which approvals to list; every filter set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalQuery {
    pub state: Option<ApprovalState>,
    pub session_id: Option<String>,
    pub cell_id: Option<String>,
}

impl ApprovalQuery {
    pub fn pending() -> Self {
        ApprovalQuery {
            state: Some(ApprovalState::Pending),
            ..Self::default()
        }
    }

    pub(crate) fn matches(&self, a: &ApprovalRecord) -> bool {
        self.state.is_none_or(|s| s == a.state)
            && self.session_id.as_ref().is_none_or(|s| *s == a.session_id)
            && self
                .cell_id
                .as_ref()
                .is_none_or(|c| a.cell_id.as_ref() == Some(c))
    }
}

impl NewApproval {
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(c) = &self.cell_id {
            check_id("cell id", c)?;
        }
        check_id("session id", &self.session_id)?;
        check_id("tool name", &self.tool)?;
        check_text("approval reason", &self.reason)?;
        for p in &self.policy_ids {
            check_text("policy id", p)?;
        }
        for p in &self.paths {
            check_text("path", p)?;
        }
        Ok(())
    }

    /// The record as first stored.
    pub(crate) fn into_record(self, id: String, now_ms: i64) -> ApprovalRecord {
        let call_hash =
            call_hash_with_paths(&self.tool, &self.arguments, &self.provenance, &self.paths);
        let expires_at_ms = now_ms.saturating_add(crate::budget::hold_ms(self.expires_in));
        ApprovalRecord {
            id,
            cell_id: self.cell_id,
            session_id: self.session_id,
            tool: self.tool,
            arguments: self.arguments,
            provenance: self.provenance,
            paths: self.paths,
            policy_ids: self.policy_ids,
            reason: self.reason,
            call_hash,
            created_at_ms: now_ms,
            expires_at_ms,
            state: ApprovalState::Pending,
            answered_by: None,
            answered_channel: None,
            answered_at_ms: None,
        }
    }
}

impl Answer {
    pub(crate) fn validate(&self) -> Result<()> {
        check_id("answerer", &self.by)?;
        check_id("answer channel", &self.channel)?;
        check_text("call hash", &self.call_hash)
    }
}

/// The compare-and-set rule: an answer applies only to a pending, unexpired approval of the
/// same call. On success returns the answered record.
pub(crate) fn apply_answer(
    mut a: ApprovalRecord,
    answer: &Answer,
    now_ms: i64,
) -> Result<ApprovalRecord> {
    if a.state != ApprovalState::Pending {
        return Err(StateError::ApprovalAnswered {
            id: a.id,
            decision: a.state.as_str().to_string(),
            by: a.answered_by.unwrap_or_else(|| "unknown".into()),
            channel: a.answered_channel.unwrap_or_else(|| "unknown".into()),
        });
    }
    if a.expires_at_ms <= now_ms {
        return Err(StateError::ApprovalExpired {
            id: a.id,
            expired_at_ms: a.expires_at_ms,
        });
    }
    if a.call_hash != answer.call_hash {
        return Err(StateError::ApprovalMismatch { id: a.id });
    }
    a.state = match answer.decision {
        Decision::Approve => ApprovalState::Approved,
        Decision::Deny => ApprovalState::Denied,
    };
    a.answered_by = Some(answer.by.clone());
    a.answered_channel = Some(answer.channel.clone());
    a.answered_at_ms = Some(now_ms);
    Ok(a)
}

/// A pending approval past its time, marked expired.
pub(crate) fn expire(mut a: ApprovalRecord, now_ms: i64) -> ApprovalRecord {
    a.state = ApprovalState::Expired;
    a.answered_by = Some(EXPIRY_CHANNEL.to_string());
    a.answered_channel = Some(EXPIRY_CHANNEL.to_string());
    a.answered_at_ms = Some(now_ms);
    a
}
