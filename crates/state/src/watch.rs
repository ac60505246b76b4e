//! Waiting for a change made elsewhere: an approval answered on another replica, a cell that
//! moved on.
//!
//! Every write that changes a cell or an approval notifies its [`Topic`] after it commits:
//! in-process through a broadcast channel, and on PostgreSQL to every replica through
//! `NOTIFY`. A second process on the same SQLite file cannot notify this one, so SQLite
//! watches also wake on a poll interval. A wake means "look again", never "it changed": the
//! waiter re-reads the state, so a missed or spurious wake costs at most one poll.

use std::time::Duration;

use tokio::sync::broadcast;

/// What a waiter waits on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Topic {
    Cell(String),
    Approval(String),
}

impl Topic {
    /// The text sent through PostgreSQL `NOTIFY`.
    pub(crate) fn encode(&self) -> String {
        match self {
            Topic::Cell(id) => format!("cell:{id}"),
            Topic::Approval(id) => format!("approval:{id}"),
        }
    }

    pub(crate) fn decode(s: &str) -> Option<Topic> {
        if let Some(id) = s.strip_prefix("cell:") {
            Some(Topic::Cell(id.to_string()))
        } else {
            s.strip_prefix("approval:")
                .map(|id| Topic::Approval(id.to_string()))
        }
    }
}

/// The in-process side of notifications; cheap to clone.
#[derive(Clone)]
pub(crate) struct Notifier {
    tx: broadcast::Sender<Topic>,
    poll: Option<Duration>,
}

impl Notifier {
    pub(crate) fn new(poll: Option<Duration>) -> Self {
        let (tx, _) = broadcast::channel(1024);
        Notifier { tx, poll }
    }

    pub(crate) fn notify(&self, topic: Topic) {
        // No receiver is fine: nobody waits.
        let _ = self.tx.send(topic);
    }

    pub(crate) fn watch(&self, topic: Topic) -> Watch {
        Watch {
            topic,
            rx: self.tx.subscribe(),
            poll: self.poll,
        }
    }
}

/// A subscription to one topic. Make it *before* reading the state it guards, then await
/// [`Watch::changed`] and read again: a change committed in between is never missed.
pub struct Watch {
    topic: Topic,
    rx: broadcast::Receiver<Topic>,
    poll: Option<Duration>,
}

impl Watch {
    pub fn topic(&self) -> &Topic {
        &self.topic
    }

    /// Resolves when the topic may have changed, or after the backend's poll interval. Put a
    /// timeout around it: on the in-memory backend nothing else ends the wait.
    pub async fn changed(&mut self) {
        let heard = async {
            loop {
                match self.rx.recv().await {
                    Ok(t) if t == self.topic => return,
                    Ok(_) => continue,
                    // Too many changes to follow: look again.
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
                }
            }
        };
        match self.poll {
            Some(every) => {
                tokio::select! {
                    _ = heard => {}
                    _ = tokio::time::sleep(every) => {}
                }
            }
            None => heard.await,
        }
    }
}
