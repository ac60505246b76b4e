//! A stdio transport that never lets a request's cancellation overtake the request.
//!
//! rmcp writes every outgoing message from a task of its own, and each of those tasks takes the
//! writer's lock when it first runs. A cancellation queued right after its request (a script
//! that returns while a call is going out) can therefore be written first; the server ignores a
//! cancellation for an id it has not seen, then runs the request to the end. This wrapper makes a
//! `notifications/cancelled` wait until the request it names has been written (or failed to be),
//! so the server always reads the request before its cancellation.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use rmcp::model::{ClientJsonRpcMessage, ClientNotification, JsonRpcMessage, RequestId};
use rmcp::service::{RoleClient, RxJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::sync::watch;

/// Requests handed to the transport whose write has not finished, by id.
type Writing = Arc<Mutex<HashMap<RequestId, watch::Receiver<()>>>>;

pub(crate) struct CancelAfterRequest<T> {
    inner: T,
    writing: Writing,
}

impl<T> CancelAfterRequest<T> {
    pub(crate) fn new(inner: T) -> Self {
        CancelAfterRequest {
            inner,
            writing: Writing::default(),
        }
    }
}

/// Ends the request's entry when its write is over, however it ended (dropping the sender
/// wakes every waiting cancellation).
struct Written {
    writing: Writing,
    id: RequestId,
    _done: watch::Sender<()>,
}

impl Drop for Written {
    fn drop(&mut self) {
        lock(&self.writing).remove(&self.id);
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for CancelAfterRequest<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        // `send` is called in the order rmcp queued the messages; the writes happen later.
        let mut written = None;
        let mut after = None;
        match &item {
            JsonRpcMessage::Request(request) => {
                let (done, receiver) = watch::channel(());
                lock(&self.writing).insert(request.id.clone(), receiver);
                written = Some(Written {
                    writing: self.writing.clone(),
                    id: request.id.clone(),
                    _done: done,
                });
            }
            JsonRpcMessage::Notification(note) => {
                if let ClientNotification::CancelledNotification(cancelled) = &note.notification {
                    after = cancelled
                        .params
                        .request_id
                        .as_ref()
                        .and_then(|id| lock(&self.writing).get(id).cloned());
                }
            }
            _ => {}
        }
        let send = self.inner.send(item);
        async move {
            if let Some(mut request) = after {
                // Resolves with an error once the request's write ended and dropped its sender.
                while request.changed().await.is_ok() {}
            }
            let result = send.await;
            drop(written);
            result
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.inner.receive()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest};
    use std::time::Duration;

    /// Records what was written, in order; a request's write takes a while.
    #[derive(Clone, Default)]
    struct Slow {
        written: Arc<Mutex<Vec<String>>>,
    }

    impl Transport<RoleClient> for Slow {
        type Error = std::io::Error;
        fn send(
            &mut self,
            item: ClientJsonRpcMessage,
        ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
            let written = self.written.clone();
            async move {
                let what = match &item {
                    JsonRpcMessage::Request(r) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        format!("request {}", r.id)
                    }
                    _ => "cancel".to_string(),
                };
                lock(&written).push(what);
                Ok(())
            }
        }
        fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
            std::future::pending()
        }
        fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
            std::future::ready(Ok(()))
        }
    }

    fn request(id: i64) -> ClientJsonRpcMessage {
        let call = CallToolRequest::new(CallToolRequestParams::new("hang"));
        ClientJsonRpcMessage::request(ClientRequest::CallToolRequest(call), RequestId::Number(id))
    }

    fn cancel(id: i64) -> ClientJsonRpcMessage {
        serde_json::from_value(serde_json::json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": { "requestId": id },
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_cancellation_polled_first_is_still_written_after_its_request() {
        let slow = Slow::default();
        let mut transport = CancelAfterRequest::new(slow.clone());
        let req = transport.send(request(7));
        let can = transport.send(cancel(7));
        // The cancellation's write starts first, as it may under rmcp's scheduling.
        let can = tokio::spawn(can);
        tokio::task::yield_now().await;
        let (a, b) = tokio::join!(req, can);
        a.unwrap();
        b.unwrap().unwrap();
        assert_eq!(*lock(&slow.written), vec!["request 7", "cancel"]);
        assert!(lock(&transport.writing).is_empty(), "entries are removed");
    }

    #[tokio::test]
    async fn a_cancellation_for_a_request_already_written_or_unknown_does_not_wait() {
        let slow = Slow::default();
        let mut transport = CancelAfterRequest::new(slow.clone());
        transport.send(request(1)).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), transport.send(cancel(1)))
            .await
            .unwrap()
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), transport.send(cancel(99)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(*lock(&slow.written), vec!["request 1", "cancel", "cancel"]);
    }

    #[tokio::test]
    async fn a_request_whose_write_is_dropped_releases_its_cancellation() {
        let slow = Slow::default();
        let mut transport = CancelAfterRequest::new(slow.clone());
        let req = transport.send(request(3));
        let can = transport.send(cancel(3));
        drop(req);
        tokio::time::timeout(Duration::from_secs(5), can)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(*lock(&slow.written), vec!["cancel"]);
    }
}
