//! [`QueueStore`] over Azure Queue Storage (and Azurite) with `azure_storage_queues` 0.21.
//!
//! Message text is stored verbatim: the crate does not base64-encode, and Functions queue
//! triggers expect base64, so callers encode with [`super::MessageEncoding`] first. Updating only a
//! message's visibility is done here directly, since the crate's update always replaces the text.
//!
//! Invariants:
//! - A store is built from a [`StorageAccount`] (`account.queue_store(counters)`) and sends through
//!   the account's pooled HTTP client.
//! - Every attempt is counted as one request of its kind and transient failures are retried under
//!   the account's policy, so callers see final outcomes only.
//! - Message text is at most 64 KiB, checked before sending; durations go to the service as whole
//!   seconds rounded up, so a message never shows earlier than asked.

use std::sync::Arc;
use std::time::Duration;

use azure_core::headers::{HeaderName, Headers};
use azure_core::Method;
use azure_storage::clients::ServiceType;
use azure_storage::CloudLocation;
use azure_storage_queues::{
    PopReceipt, QueueClient, QueueServiceClient, QueueServiceClientBuilder,
};

use super::auth::sdk_credentials;
use super::azure::{client_options, map_sdk_error, percent_encode, Service};
use super::connection::StorageAccount;
use super::request_counts::{RequestCounters, RequestKind};
use super::{
    QueueStore, ReceivedMessage, StorageError, StorageErrorKind, StorageResult, MAX_MESSAGE_TEXT,
};

/// Most messages one receive may return.
const MAX_MESSAGES_PER_GET: u8 = 32;

impl StorageAccount {
    /// A queue store over this account, counting requests in `counters`.
    pub fn queue_store(&self, counters: Arc<RequestCounters>) -> AzureQueueStore {
        AzureQueueStore::new(self, counters)
    }
}

/// Azure Queue Storage behind the [`QueueStore`] interface. Cheap to clone; clones share the
/// HTTP connection pool and the request counters.
#[derive(Clone)]
pub struct AzureQueueStore {
    service: Service,
    client: QueueServiceClient,
}

impl AzureQueueStore {
    pub(crate) fn new(account: &StorageAccount, counters: Arc<RequestCounters>) -> Self {
        let location = CloudLocation::Custom {
            account: account.account_name().to_string(),
            uri: account.queue_endpoint().to_string(),
        };
        let client = QueueServiceClientBuilder::with_location(location, sdk_credentials(account))
            .client_options(client_options(account))
            .build();
        AzureQueueStore {
            service: Service::new(
                account,
                ServiceType::Queue,
                account.queue_endpoint(),
                counters,
            ),
            client,
        }
    }

    fn queue(&self, queue: &str) -> QueueClient {
        self.client.queue_client(queue)
    }

    async fn update_visibility_only(
        &self,
        queue: &str,
        id: &str,
        pop_receipt: &str,
        visibility_timeout: Duration,
    ) -> StorageResult<String> {
        let mut url = self.service.url(&format!(
            "{}/messages/{}",
            percent_encode(queue),
            percent_encode(id)
        ))?;
        url.query_pairs_mut()
            .append_pair("popreceipt", pop_receipt)
            .append_pair(
                "visibilitytimeout",
                &whole_seconds(visibility_timeout).to_string(),
            );
        let response = self
            .service
            .send_raw(Method::Put, url, Headers::new(), None)
            .await
            .map_err(|e| map_sdk_error(&format!("update message in queue {queue}"), e))?;
        response
            .headers()
            .get_optional_string(&HeaderName::from_static("x-ms-popreceipt"))
            .ok_or_else(|| {
                StorageError::invalid_response("update message response without x-ms-popreceipt")
            })
    }
}

/// The body of a Put Message request (`<QueueMessage><MessageText>…`), XML-escaped by the
/// SDK's serializer.
#[derive(serde::Serialize)]
#[serde(rename = "QueueMessage")]
struct MessageSubmit<'a> {
    #[serde(rename = "MessageText")]
    text: &'a str,
}

/// Refuses message text over the service's 64 KiB (UTF-8 bytes of the text) before sending.
fn check_text(text: &str) -> StorageResult<()> {
    if text.len() > MAX_MESSAGE_TEXT {
        return Err(StorageError::invalid_input(format!(
            "queue message text is {} bytes, over the {MAX_MESSAGE_TEXT}-byte (64 KiB) limit",
            text.len()
        )));
    }
    Ok(())
}

/// Whole seconds, rounded up: the service takes seconds, and rounding a 1.5 s visibility down
/// would show a message earlier than asked.
fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl QueueStore for AzureQueueStore {
    async fn create_queue(&self, queue: &str) -> StorageResult<()> {
        let result = self
            .service
            .attempts(RequestKind::QueueAdmin, || async {
                self.queue(queue)
                    .create()
                    .await
                    .map_err(|e| map_sdk_error(&format!("create queue {queue}"), e))
            })
            .await;
        match result {
            Ok(_) => Ok(()),
            // Exists with other metadata: still "exists", which is all callers ask for.
            Err(e)
                if e.kind == StorageErrorKind::Conflict
                    && e.code.as_deref() == Some("QueueAlreadyExists") =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn delete_queue(&self, queue: &str) -> StorageResult<bool> {
        let result = self
            .service
            .attempts(RequestKind::QueueAdmin, || async {
                self.queue(queue)
                    .delete()
                    .await
                    .map_err(|e| map_sdk_error(&format!("delete queue {queue}"), e))
            })
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn put_message(
        &self,
        queue: &str,
        text: &str,
        visibility_delay: Duration,
    ) -> StorageResult<()> {
        check_text(text)?;
        self.service
            .attempts(RequestKind::QueuePut, || async {
                let mut builder = self.queue(queue).put_message(text);
                if !visibility_delay.is_zero() {
                    builder = builder
                        .visibility_timeout(Duration::from_secs(whole_seconds(visibility_delay)));
                }
                builder
                    .await
                    .map_err(|e| map_sdk_error(&format!("put message in queue {queue}"), e))
            })
            .await
            .map(|_| ())
    }

    async fn put_message_never_expiring(&self, queue: &str, text: &str) -> StorageResult<()> {
        check_text(text)?;
        // Sent directly: the crate's `MessageTTL` takes a `Duration`, which cannot say -1.
        let mut url = self
            .service
            .url(&format!("{}/messages", percent_encode(queue)))?;
        url.query_pairs_mut().append_pair("messagettl", "-1");
        let body = azure_core::xml::to_xml(&MessageSubmit { text })
            .map_err(|e| map_sdk_error("encode a queue message", e))?;
        self.service
            .attempts(RequestKind::QueuePut, || async {
                self.service
                    .send_raw(
                        Method::Post,
                        url.clone(),
                        Headers::new(),
                        Some(body.clone()),
                    )
                    .await
                    .map_err(|e| map_sdk_error(&format!("put message in queue {queue}"), e))
            })
            .await
            .map(|_| ())
    }

    async fn get_messages(
        &self,
        queue: &str,
        max: u8,
        visibility_timeout: Duration,
    ) -> StorageResult<Vec<ReceivedMessage>> {
        if max == 0 || max > MAX_MESSAGES_PER_GET {
            return Err(StorageError::invalid_input(format!(
                "can receive 1..={MAX_MESSAGES_PER_GET} messages at once, asked {max}"
            )));
        }
        // The service needs at least one second.
        let seconds = whole_seconds(visibility_timeout).max(1);
        let response = self
            .service
            .attempts(RequestKind::QueueGet, || async {
                self.queue(queue)
                    .get_messages()
                    .number_of_messages(max)
                    .visibility_timeout(Duration::from_secs(seconds))
                    .await
                    .map_err(|e| map_sdk_error(&format!("get messages from queue {queue}"), e))
            })
            .await?;
        Ok(response
            .messages
            .into_iter()
            .map(|m| ReceivedMessage {
                id: m.message_id,
                pop_receipt: m.pop_receipt,
                dequeue_count: m.dequeue_count,
                text: m.message_text,
                insertion_time: m.insertion_time,
                expiration_time: m.expiration_time,
                next_visible_time: m.time_next_visible,
            })
            .collect())
    }

    async fn delete_message(&self, queue: &str, id: &str, pop_receipt: &str) -> StorageResult<()> {
        self.service
            .attempts(RequestKind::QueueDelete, || async {
                self.queue(queue)
                    .pop_receipt_client(PopReceipt::new(id, pop_receipt))
                    .delete()
                    .await
                    .map_err(|e| map_sdk_error(&format!("delete message from queue {queue}"), e))
            })
            .await
            .map(|_| ())
    }

    async fn update_message(
        &self,
        queue: &str,
        id: &str,
        pop_receipt: &str,
        visibility_timeout: Duration,
        text: Option<&str>,
    ) -> StorageResult<String> {
        if let Some(text) = text {
            check_text(text)?;
        }
        self.service
            .attempts(RequestKind::QueueUpdate, || async {
                match text {
                    Some(text) => self
                        .queue(queue)
                        .pop_receipt_client(PopReceipt::new(id, pop_receipt))
                        .update(text, Duration::from_secs(whole_seconds(visibility_timeout)))
                        .await
                        .map(|r| r.pop_receipt)
                        .map_err(|e| map_sdk_error(&format!("update message in queue {queue}"), e)),
                    None => {
                        self.update_visibility_only(queue, id, pop_receipt, visibility_timeout)
                            .await
                    }
                }
            })
            .await
    }

    async fn approximate_count(&self, queue: &str) -> StorageResult<u64> {
        self.service
            .attempts(RequestKind::QueueAdmin, || async {
                self.queue(queue)
                    .get_metadata()
                    .await
                    .map_err(|e| map_sdk_error(&format!("read metadata of queue {queue}"), e))
            })
            .await
            .map(|r| r.approximate_messages_count as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up() {
        assert_eq!(whole_seconds(Duration::ZERO), 0);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(whole_seconds(Duration::from_secs(30)), 30);
    }
}
