//! A connection's queue of frames to write, bounded in bytes.
//!
//! Every frame takes as many permits of the connection's byte budget as it
//! has bytes (at most the whole budget) before it is queued, and gives them
//! back once written: a client that does not read holds at most the budget
//! in the supervisor's memory, and the tasks with more to say wait (and so
//! slow down the runs whose output they carry) until it reads or is dropped
//! for not reading.

use std::sync::Arc;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// One frame on its way out.
pub struct Outgoing {
    /// The conversation it belongs to (0: a notice to whoever is there).
    pub conversation: u64,
    pub bytes: Vec<u8>,
    /// A followed stream's event (a run's output): a client that does not
    /// read it (a stopped `alloxctl`) slows the run, and is not dropped
    /// for it. Answers have the write limit.
    pub patient: bool,
    _budget: OwnedSemaphorePermit,
}

/// The writer went away: the connection is over.
#[derive(Debug)]
pub struct Closed;

#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Outgoing>,
    budget: Arc<Semaphore>,
    cap: usize,
}

impl Outbox {
    /// A queue of at most `cap_bytes` unwritten bytes, and its receiving end.
    pub fn new(cap_bytes: usize) -> (Outbox, mpsc::UnboundedReceiver<Outgoing>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let cap = cap_bytes.clamp(1, Semaphore::MAX_PERMITS);
        let outbox = Outbox {
            tx,
            budget: Arc::new(Semaphore::new(cap)),
            cap,
        };
        (outbox, rx)
    }

    /// Queues `bytes`, waiting for room in the budget first.
    pub async fn send(&self, conversation: u64, bytes: Vec<u8>) -> Result<(), Closed> {
        self.queue(conversation, bytes, false).await
    }

    /// Queues a stream's event ([`Outgoing::patient`]).
    pub async fn send_event(&self, conversation: u64, bytes: Vec<u8>) -> Result<(), Closed> {
        self.queue(conversation, bytes, true).await
    }

    async fn queue(&self, conversation: u64, bytes: Vec<u8>, patient: bool) -> Result<(), Closed> {
        let n = bytes.len().clamp(1, self.cap) as u32;
        let permit = self
            .budget
            .clone()
            .acquire_many_owned(n)
            .await
            .map_err(|_| Closed)?;
        self.tx
            .send(Outgoing {
                conversation,
                bytes,
                patient,
                _budget: permit,
            })
            .map_err(|_| Closed)
    }

    /// Bytes queued and not yet written.
    pub fn queued(&self) -> usize {
        self.cap - self.budget.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_reader_that_does_not_read_holds_at_most_the_budget() {
        let (out, mut rx) = Outbox::new(1000);
        out.send(1, vec![0; 600]).await.unwrap();
        out.send(1, vec![0; 400]).await.unwrap();
        assert_eq!(out.queued(), 1000);
        // The next frame waits until something is written.
        let o2 = out.clone();
        let blocked = tokio::spawn(async move { o2.send(1, vec![0; 10]).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!blocked.is_finished(), "queued past the budget");
        drop(rx.recv().await.unwrap());
        blocked.await.unwrap().unwrap();
        assert_eq!(out.queued(), 410);
        // A frame larger than the whole budget still goes, alone.
        drop(rx.recv().await.unwrap());
        drop(rx.recv().await.unwrap());
        out.send(1, vec![0; 5000]).await.unwrap();
        assert_eq!(out.queued(), 1000);
        drop(rx);
        assert!(out.send(1, vec![1]).await.is_err());
    }
}
