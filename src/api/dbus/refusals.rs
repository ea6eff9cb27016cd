//! `Busy` answers, sent after privileged calls.
//!
//! zbus's dispatcher reads the daemon's one bus connection in order. An unprivileged flood
//! keeps as many calls in flight as the bus lets it, and each `Busy` sent at once brings the
//! next: if the dispatcher wrote every refusal before reading on, a privileged call would wait
//! behind all of them in the socket. So a refusal is decided as the call is read
//! ([`super::callers::Callers::gate`]) and put here; one task sends the answers in order,
//! each once no privileged call is unanswered ([`Priority::after_privileged`]). The queue
//! holds at most [`QUEUED`] refusals (a few MiB); beyond, the dispatcher answers itself, as
//! before. Each refused call is answered either way, never dropped.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use zbus::message::Message;
use zbus::Connection;

use super::callers::Priority;
use super::Error;

/// Refusals waiting for their answer at most: more than the bus lets 16 connections hold.
pub(super) const QUEUED: usize = 8192;

/// A refused call and its answer.
pub(super) type Refusal = (Connection, Message, Error);

/// The refusals not answered yet, in the order their calls were read.
#[derive(Default)]
pub(super) struct Refusals {
    queue: Mutex<VecDeque<Refusal>>,
    ready: tokio::sync::Notify,
}

impl Refusals {
    /// Queues a refusal, or gives it back when [`QUEUED`] wait already.
    pub(super) fn push(&self, refusal: Refusal) -> Result<(), Refusal> {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if q.len() >= QUEUED {
            return Err(refusal);
        }
        q.push_back(refusal);
        drop(q);
        self.ready.notify_one();
        Ok(())
    }

    fn pop(&self) -> Option<Refusal> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner).pop_front()
    }

    /// Answers the refusals as they come, each after the privileged calls in flight; until
    /// aborted.
    pub(super) async fn answer(self: Arc<Self>, priority: Arc<Priority>) {
        loop {
            let Some((conn, msg, e)) = self.pop() else {
                self.ready.notified().await;
                continue;
            };
            priority.after_privileged().await;
            if let Err(e) = super::interface::refuse(&conn, &msg, e).await {
                log::debug!("D-Bus: answering a refused call: {e}");
            }
        }
    }
}
