//! Audit appends on PostgreSQL: one statement per batch, one commit for every line waiting.
//!
//! Each stream has a queue. The first append to find no writer at work spawns one; it takes
//! every line waiting, chains them onto the head this process last wrote (its guess), and
//! sends them in one call of `codemode_append_audit` (`schema/postgres_v2.sql`), which writes
//! them only if the head is still that one. So a line costs one round trip and shares its
//! disk flush with the lines queued behind the one before, instead of holding the head's lock
//! across two round trips and a flush of its own. When another replica moved the head, the
//! function returns the head it found; the writer makes the lines again on it and retries.
//! After a few lost races it takes the head's lock first (two round trips, but sure to win),
//! so a replica that keeps losing to another one still gets its lines in.
//!
//! The writer runs as a task of its own: a caller that stops waiting does not stop its line,
//! nor the lines of the others in its batch.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use deadpool_postgres::Pool;
use tokio::sync::oneshot;
use tokio_postgres::types::ToSql;

use super::ops::{OpError, OpResult};
use super::pipelined::TxConn;
use super::{pg_error, pool_error};
use crate::audit::{self, AuditHead, AuditLineFn, AuditRecord, Durability};
use crate::error::{Result, StateError};

const APPEND: &str =
    "SELECT written, head_seq, head_hash FROM codemode_append_audit($1, $2, $3, $4, $5, $6)";
/// The same for a batch whose lines may reach the disk later ([`Durability::Deferred`]; every
/// line of a journal stream, a name ending in `.started`: the gate's record that a call is
/// about to run). Its commit does not wait for the disk flush: the server has the lines once
/// the statement returns, and the next durable commit, of any stream, flushes them too.
const APPEND_DEFERRED: &str = "SELECT written, head_seq, head_hash, set_config('synchronous_commit', 'off', true) FROM codemode_append_audit($1, $2, $3, $4, $5, $6)";

/// The statement for a batch: durable if any of its lines must be.
fn append_statement(stream: &str, batch: &[Waiting]) -> &'static str {
    let durable = !stream.ends_with(".started") && batch.iter().any(|w| w.durable);
    if durable { APPEND } else { APPEND_DEFERRED }
}
const HEAD_ROW: &str = "INSERT INTO audit_heads (stream, seq, hash) VALUES ($1, 0, '') ON CONFLICT (stream) DO NOTHING";
const LOCK_HEAD: &str = "SELECT seq, hash FROM audit_heads WHERE stream = $1 FOR UPDATE";

/// Lines in one statement at most.
const MAX_BATCH: usize = 256;

struct Waiting {
    make: AuditLineFn,
    now: i64,
    durable: bool,
    done: oneshot::Sender<Result<AuditRecord>>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    /// A writer task is draining this queue.
    writing: bool,
    /// The head after this process's last write (None: unknown, guess an empty stream).
    head: Option<AuditHead>,
}

pub(crate) struct AuditWriter {
    pool: Pool,
    location: String,
    /// Optimistic attempts before a batch takes the head's lock.
    optimistic_tries: usize,
    queues: Mutex<HashMap<String, Arc<Mutex<Queue>>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// If the writer ends by a panic (a caller's closure), fails the lines waiting and lets the
/// next append start a writer. A writer that ends normally clears the flag itself, under the
/// lock, when it finds the queue empty (and from then on another writer may run: this must not
/// clear its flag).
struct Draining {
    queue: Arc<Mutex<Queue>>,
    finished: bool,
}

impl Drop for Draining {
    fn drop(&mut self) {
        if !self.finished {
            // The lines waiting fail rather than wait for an append that may never come.
            let mut q = lock(&self.queue);
            q.waiting.clear();
            q.writing = false;
        }
    }
}

/// One batch's lines as made (an `Err` where the caller's closure refused), and the head after
/// the last one.
struct Made {
    records: Vec<Result<AuditRecord>>,
    head: AuditHead,
}

impl AuditWriter {
    pub(crate) fn new(pool: Pool, location: String, optimistic_tries: usize) -> Self {
        AuditWriter {
            pool,
            location,
            optimistic_tries,
            queues: Mutex::new(HashMap::new()),
        }
    }

    /// Queues the line and waits until it is committed (or failed).
    pub(crate) async fn append(
        self: &Arc<Self>,
        stream: &str,
        make: AuditLineFn,
        now: i64,
        durability: Durability,
    ) -> Result<AuditRecord> {
        let queue = lock(&self.queues)
            .entry(stream.to_string())
            .or_default()
            .clone();
        let (done, result) = oneshot::channel();
        let start = {
            let mut q = lock(&queue);
            q.waiting.push_back(Waiting {
                make,
                now,
                durable: durability == Durability::Now,
                done,
            });
            !std::mem::replace(&mut q.writing, true)
        };
        if start {
            let this = self.clone();
            let stream = stream.to_string();
            tokio::spawn(async move { this.drain(stream, queue).await });
        }
        result.await.map_err(|_| StateError::Backend {
            location: self.location.clone(),
            detail: "the audit writer stopped before the line was written".into(),
        })?
    }

    async fn drain(&self, stream: String, queue: Arc<Mutex<Queue>>) {
        let mut draining = Draining {
            queue: queue.clone(),
            finished: false,
        };
        loop {
            let (batch, head) = {
                let mut q = lock(&queue);
                if q.waiting.is_empty() {
                    q.writing = false;
                    draining.finished = true;
                    return;
                }
                let n = q.waiting.len().min(MAX_BATCH);
                let batch: Vec<Waiting> = q.waiting.drain(..n).collect();
                (batch, q.head.clone())
            };
            let (outcome, head) = self.write(&stream, &batch, head).await;
            lock(&queue).head = head;
            match outcome {
                Ok(records) => {
                    for (w, r) in batch.into_iter().zip(records) {
                        let _ = w.done.send(r);
                    }
                }
                Err(e) => {
                    for w in batch {
                        let _ = w.done.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// Writes the batch; returns each line's outcome, and the head as far as it is known.
    /// `known` is the head after this process's last write here: the stream can only grow past
    /// it, so a head found behind it means lines committed here were lost.
    async fn write(
        &self,
        stream: &str,
        batch: &[Waiting],
        known: Option<AuditHead>,
    ) -> (Result<Vec<Result<AuditRecord>>>, Option<AuditHead>) {
        let mut head = known.clone().unwrap_or_default();
        for _ in 0..self.optimistic_tries {
            let made = make_lines(stream, batch, &head);
            if made.head == head {
                // Every closure refused: nothing to write.
                return (Ok(made.records), Some(head));
            }
            match self.try_append(stream, batch, &head, &made).await {
                Ok(Ok(())) => return (Ok(made.records), Some(made.head)),
                Ok(Err(moved)) => {
                    if let Err(e) = self.not_behind(stream, known.as_ref(), &moved) {
                        return (Err(e), None);
                    }
                    head = moved;
                }
                Err(e) => return (Err(e), None),
            }
        }
        match self.append_locked(stream, batch, known.as_ref()).await {
            Ok((records, head)) => (Ok(records), Some(head)),
            Err(e) => (Err(e), None),
        }
    }

    /// An error if the stream's head `found` is behind `known`, the head this process wrote.
    fn not_behind(&self, stream: &str, known: Option<&AuditHead>, found: &AuditHead) -> Result<()> {
        match known {
            Some(known) if found.seq < known.seq => Err(StateError::Backend {
                location: self.location.clone(),
                detail: format!(
                    "the audit stream `{stream}` ends at line {}, but this process wrote line {} to it: committed lines were lost (a server that crashed loses commits not yet on its disk) or deleted, so the log no longer records every call",
                    found.seq, known.seq
                ),
            }),
            _ => Ok(()),
        }
    }

    /// One round trip. `Ok(Err(head))`: another writer had moved the head to `head`.
    async fn try_append(
        &self,
        stream: &str,
        batch: &[Waiting],
        head: &AuditHead,
        made: &Made,
    ) -> Result<std::result::Result<(), AuditHead>> {
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| pool_error(&self.location, e))?;
        let out = async {
            let stmt = client
                .prepare_cached(append_statement(stream, batch))
                .await?;
            let params = append_params(stream, head, made);
            let row = client.query_one(&stmt, &params.refs()).await?;
            let written: bool = row.try_get(0)?;
            let seq: i64 = row.try_get(1)?;
            let hash: String = row.try_get(2)?;
            Ok::<_, tokio_postgres::Error>((written, seq, hash))
        }
        .await;
        let (written, seq, hash) = out.map_err(|e| pg_error(&self.location, &e))?;
        if written {
            Ok(Ok(()))
        } else {
            Ok(Err(AuditHead {
                seq: u64::try_from(seq).unwrap_or(0),
                hash: (!hash.is_empty()).then_some(hash),
            }))
        }
    }

    /// Locks the head, makes the lines on it and writes them: two round trips, one commit.
    async fn append_locked(
        &self,
        stream: &str,
        batch: &[Waiting],
        known: Option<&AuditHead>,
    ) -> Result<(Vec<Result<AuditRecord>>, AuditHead)> {
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| pool_error(&self.location, e))?;
        let conn = TxConn::new(client);
        let out: OpResult<_> = async {
            let c = conn.c();
            let (head_row, lock_head, append) = (
                c.prepare_cached(HEAD_ROW).await?,
                c.prepare_cached(LOCK_HEAD).await?,
                c.prepare_cached(append_statement(stream, batch)).await?,
            );
            conn.entering_tx();
            let stream_param: [&(dyn ToSql + Sync); 1] = [&stream];
            let (begin, created, row) = tokio::join!(
                c.batch_execute("BEGIN"),
                c.execute(&head_row, &stream_param),
                c.query_one(&lock_head, &stream_param),
            );
            begin?;
            created?;
            let row = row?;
            let hash: String = row.try_get(1)?;
            let head = AuditHead {
                seq: u64::try_from(row.try_get::<_, i64>(0)?).unwrap_or(0),
                hash: (!hash.is_empty()).then_some(hash),
            };
            if let Err(e) = self.not_behind(stream, known, &head) {
                conn.rollback().await?;
                return Err(OpError::State(e));
            }
            let made = make_lines(stream, batch, &head);
            if made.head == head {
                conn.rollback().await?;
                return Ok((made.records, head));
            }
            let params = append_params(stream, &head, &made);
            let refs = params.refs();
            let (written, commit) = tokio::join!(c.query_one(&append, &refs), conn.commit(),);
            commit?;
            let written: bool = written?.try_get(0)?;
            if !written {
                // The head was locked: nobody else could move it.
                return Err(OpError::State(StateError::Backend {
                    location: String::new(),
                    detail: "the audit head moved while it was locked".into(),
                }));
            }
            Ok((made.records, made.head))
        }
        .await;
        out.map_err(|e| match e {
            OpError::Pg(e) => pg_error(&self.location, &e),
            OpError::State(StateError::Backend { detail, .. }) => StateError::Backend {
                location: self.location.clone(),
                detail,
            },
            OpError::State(e) => e,
            OpError::MissingLedgers => StateError::Backend {
                location: self.location.clone(),
                detail: "unexpected missing ledger in an audit append".into(),
            },
        })
    }
}

/// Runs every closure of the batch on the head its line chains onto. A closure that panics
/// fails its own line, like one that refuses: unwinding out of the writer would drop the
/// batch's waiters before the queue is handed on, and an append racing that hand-over could
/// find the queue still marked as being written and be failed with the panicking batch.
fn make_lines(stream: &str, batch: &[Waiting], head: &AuditHead) -> Made {
    let mut at = head.clone();
    let records = batch
        .iter()
        .map(|w| {
            let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                audit::make_line(stream, &at, &w.make, w.now)
            }));
            let rec = made.unwrap_or_else(|_| {
                Err(StateError::AuditLine {
                    stream: stream.to_string(),
                    message: "the code that makes the audit line panicked".into(),
                })
            })?;
            at = AuditHead {
                seq: rec.seq,
                hash: Some(rec.hash.clone()),
            };
            Ok(rec)
        })
        .collect();
    Made { records, head: at }
}

/// The parameters of `codemode_append_audit` for the lines made.
struct AppendParams<'a> {
    stream: &'a str,
    seq: i64,
    hash: &'a str,
    hashes: Vec<&'a str>,
    lines: Vec<&'a str>,
    at: Vec<i64>,
}

impl AppendParams<'_> {
    fn refs(&self) -> [&(dyn ToSql + Sync); 6] {
        [
            &self.stream,
            &self.seq,
            &self.hash,
            &self.hashes,
            &self.lines,
            &self.at,
        ]
    }
}

fn append_params<'a>(stream: &'a str, head: &'a AuditHead, made: &'a Made) -> AppendParams<'a> {
    let written = made.records.iter().filter_map(|r| r.as_ref().ok());
    let mut p = AppendParams {
        stream,
        seq: i64::try_from(head.seq).unwrap_or(i64::MAX),
        hash: head.hash.as_deref().unwrap_or(""),
        hashes: Vec::new(),
        lines: Vec::new(),
        at: Vec::new(),
    };
    for r in written {
        p.hashes.push(&r.hash);
        p.lines.push(&r.line);
        p.at.push(r.at_ms);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(durable: bool) -> Waiting {
        Waiting {
            make: Box::new(|_| Err("unused".into())),
            now: 0,
            durable,
            done: oneshot::channel().0,
        }
    }

    #[test]
    fn a_batch_waits_for_the_disk_if_any_of_its_lines_must() {
        assert_eq!(append_statement("main", &[waiting(true)]), APPEND);
        assert_eq!(append_statement("main", &[waiting(false)]), APPEND_DEFERRED);
        assert_eq!(
            append_statement("main", &[waiting(false), waiting(true), waiting(false)]),
            APPEND
        );
        // A journal's starts are always followed by their calls' outcome lines.
        assert_eq!(
            append_statement("main.started", &[waiting(true)]),
            APPEND_DEFERRED
        );
    }
}
