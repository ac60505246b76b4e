//! The audit log as a stream in a shared state store: the same keyed lines as the file, one
//! hash chain per stream, appended by any number of replicas.
//!
//! The store serializes appends (it runs our closure on the stream's head and stores the line
//! only while that is still the head), so two replicas never chain onto the same line. Each line also carries its
//! stream name and its position (`seq`) under the MAC, so a line moved to another stream or
//! another place does not verify.

use std::sync::Arc;

use codemode_state::{AuditHead, AuditLine, Durability, StateStore};
use futures::future::BoxFuture;
use serde_json::{Map, Value};

use super::verify::split_line;
use super::{AuditError, AuditKey, GENESIS};

pub(crate) struct StreamLog {
    pub store: Arc<dyn StateStore>,
    pub stream: String,
    pub key: AuditKey,
}

impl StreamLog {
    pub(crate) fn describe(&self) -> String {
        format!(
            "audit stream `{}` in {}",
            self.stream,
            self.store.describe()
        )
    }

    /// Appends one record; the returned future completes when the line is committed (and, if
    /// `durability` says so, on the store's disk).
    pub(crate) fn append(
        self: &Arc<Self>,
        mut record: Map<String, Value>,
        durability: Durability,
    ) -> BoxFuture<'static, Result<(), AuditError>> {
        let this = self.clone();
        Box::pin(async move {
            let key = this.key.clone();
            let stream = this.stream.clone();
            for field in ["stream", "seq", "prev", "hash"] {
                record.remove(field);
            }
            // May run more than once: the store makes the line again if another replica moved
            // the head it was made on.
            let make = Box::new(move |head: &AuditHead| keyed_line(&key, &stream, head, &record));
            this.store
                .append_audit_with(&this.stream, make, durability)
                .await
                .map(|_| ())
                .map_err(|e| AuditError::Write {
                    path: this.describe(),
                    message: e.to_string(),
                })
        })
    }
}

/// The line chained onto `head`: the record, its stream and position, `prev`, then the MAC.
fn keyed_line(
    key: &AuditKey,
    stream: &str,
    head: &AuditHead,
    record: &Map<String, Value>,
) -> Result<AuditLine, String> {
    let mut record = record.clone();
    let prev = head.hash.clone().unwrap_or_else(|| GENESIS.to_string());
    record.insert("stream".into(), Value::String(stream.to_string()));
    record.insert("seq".into(), Value::from(head.seq + 1));
    record.insert("prev".into(), Value::String(prev));
    let body = serde_json::to_string(&Value::Object(record))
        .map_err(|e| format!("the record is not JSON: {e}"))?;
    let covered = &body[..body.len().saturating_sub(1)];
    let hash = key.mac(covered.as_bytes());
    Ok(AuditLine {
        line: format!("{covered},\"hash\":\"{hash}\"}}"),
        hash,
    })
}

/// What verifying a stream found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamReport {
    pub stream: String,
    pub lines: u64,
    pub last_hash: String,
    pub authenticated: bool,
}

impl StreamReport {
    pub fn proves(&self) -> Vec<String> {
        let mut out = vec![
            "no line was removed, changed or reordered between the first line and the last, and the stream's head in the database names the last line".to_string(),
        ];
        if self.authenticated {
            out.push("every line was written by a holder of the key, for this stream and at this position: a forged, copied or rechained line would not verify".into());
        }
        out
    }

    pub fn cannot_prove(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.authenticated {
            out.push("without the key, authenticity is unproven: whoever can write the database could rewrite the whole stream".into());
        }
        out.push("the head is a database row, not keyed: someone who can write the database can cut lines from the end and move the head back with them (from its journal of started calls too, hiding a call whose process was killed); keep the last hash elsewhere (or ship lines to another system) to notice that".into());
        out
    }
}

/// Reads the whole stream from the store and checks its chain (and, with the key, every MAC).
pub async fn verify_stream(
    store: &dyn StateStore,
    stream: &str,
    key: Option<&AuditKey>,
) -> Result<StreamReport, AuditError> {
    let place = format!("audit stream `{stream}` in {}", store.describe());
    let read_err = |e: codemode_state::StateError| AuditError::Open {
        path: place.clone(),
        message: e.to_string(),
    };
    let broken = |line: usize, problem: String| AuditError::Broken {
        path: place.clone(),
        line,
        problem,
    };
    let head = store.audit_head(stream).await.map_err(read_err)?;
    let mut prev = GENESIS.to_string();
    let mut seq = 0u64;
    loop {
        let page = store
            .read_audit(stream, seq, 1000)
            .await
            .map_err(read_err)?;
        if page.is_empty() {
            break;
        }
        for record in page {
            let n = (seq + 1) as usize;
            if record.seq != seq + 1 {
                return Err(broken(
                    n,
                    format!(
                        "the stream jumps from line {seq} to line {}: lines were removed",
                        record.seq
                    ),
                ));
            }
            let line = &record.line;
            let value: Value = serde_json::from_str(line)
                .map_err(|e| broken(n, format!("not a JSON record ({e}); the line was changed")))?;
            let Some((covered, hash)) = split_line(line) else {
                return Err(broken(
                    n,
                    "the hash is missing or not at the end of the line; the line was changed"
                        .into(),
                ));
            };
            if let Some(key) = key
                && !key.verify(covered.as_bytes(), hash)
            {
                return Err(broken(
                    n,
                    "the line's MAC does not verify with the key: it was changed or forged, or written with another key".into(),
                ));
            }
            if value.get("stream").and_then(Value::as_str) != Some(stream)
                || value.get("seq").and_then(Value::as_u64) != Some(record.seq)
            {
                return Err(broken(
                    n,
                    "the line names another stream or position: it was copied or moved here".into(),
                ));
            }
            let stated_prev = value.get("prev").and_then(Value::as_str).unwrap_or("");
            if stated_prev != prev || record.hash != hash {
                return Err(broken(
                    n,
                    format!(
                        "it does not follow line {seq}: a line was removed, replaced or reordered"
                    ),
                ));
            }
            prev = hash.to_string();
            seq = record.seq;
        }
    }
    let head_hash = head.hash.clone().unwrap_or_else(|| GENESIS.to_string());
    if head.seq != seq || head_hash != prev {
        return Err(AuditError::Head {
            path: place,
            problem: format!(
                "the stream has {seq} lines but its head records {}: lines were cut from the end or the head was changed",
                head.seq
            ),
        });
    }
    Ok(StreamReport {
        stream: stream.to_string(),
        lines: seq,
        last_hash: prev,
        authenticated: key.is_some(),
    })
}
