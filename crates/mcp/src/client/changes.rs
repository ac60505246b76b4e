//! What a server announced as changed and has not been listed again yet.
//!
//! A server may send `notifications/*/list_changed` as often as it likes. Each server keeps one
//! flag per listing and has a refresher of its own (`follow`): a burst of notifications costs
//! one re-listing, and a server that never answers its re-listing holds up only itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::handler::Listing;
use super::upstream::Upstream;

/// How long a refresher waits after the first announcement before it lists, so that the rest
/// of a burst is taken with it. It also bounds a server's re-listings to one a second: a
/// server announcing every 50 ms had thousands of tools decoded five times a second.
const SETTLE: Duration = Duration::from_secs(1);

const ALL: [Listing; 3] = [Listing::Tools, Listing::Resources, Listing::Prompts];

#[derive(Default)]
pub(crate) struct Changes {
    pending: AtomicU8,
    wake: Notify,
}

impl Changes {
    /// Notes that the server said `what` changed.
    pub(crate) fn mark(&self, what: Listing) {
        self.pending.fetch_or(bit(what), Ordering::AcqRel);
        // Stores a permit when the refresher is busy, so no announcement is missed.
        self.wake.notify_one();
    }

    /// Waits until something was announced, then a moment for the rest of the burst, and takes
    /// everything announced so far.
    async fn next(&self) -> Vec<Listing> {
        loop {
            if self.pending.load(Ordering::Acquire) != 0 {
                tokio::time::sleep(SETTLE).await;
                let taken = self.pending.swap(0, Ordering::AcqRel);
                return ALL.into_iter().filter(|w| taken & bit(*w) != 0).collect();
            }
            self.wake.notified().await;
        }
    }
}

fn bit(what: Listing) -> u8 {
    match what {
        Listing::Tools => 1,
        Listing::Resources => 2,
        Listing::Prompts => 4,
    }
}

/// Lists a server again whenever it announced a change, for as long as the hub runs.
pub(crate) async fn follow(upstream: Arc<Upstream>) {
    loop {
        for what in upstream.changes().next().await {
            upstream.refresh(what).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_burst_of_announcements_is_taken_at_once() {
        let changes = Changes::default();
        for _ in 0..1000 {
            changes.mark(Listing::Tools);
        }
        changes.mark(Listing::Prompts);
        assert_eq!(changes.next().await, [Listing::Tools, Listing::Prompts]);
        let again = tokio::time::timeout(Duration::from_millis(500), changes.next()).await;
        assert!(again.is_err(), "nothing is left: {again:?}");
    }

    #[tokio::test]
    async fn an_announcement_while_busy_is_not_lost() {
        let changes = Arc::new(Changes::default());
        changes.mark(Listing::Tools);
        assert_eq!(changes.next().await, [Listing::Tools]);
        // Announced while the refresher lists, before it waits again.
        changes.mark(Listing::Resources);
        let next = tokio::time::timeout(Duration::from_secs(10), changes.next()).await;
        assert_eq!(next.unwrap(), [Listing::Resources]);
    }
}
