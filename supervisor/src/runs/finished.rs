//! Finished runs kept for `process.wait`, in one queue ordered by the time
//! they ended, within three bounds: how many are kept, how long, and how
//! many bytes of captured output they hold together.
//!
//! Past the output budget the oldest runs' output goes first (their status
//! stays answerable); past the count or the age the oldest runs go
//! altogether. The queue only decides: the caller applies each [`Evict`]
//! to its run table.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How many finished runs are kept and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Finished runs kept at most; the oldest go first.
    pub max_runs: usize,
    /// Bytes of captured output (stdout and stderr) the finished runs hold
    /// together at most; past it the oldest runs' output is dropped.
    pub output_budget: usize,
    /// How long a finished run is kept.
    pub keep_for: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_runs: crate::runs::RunsConfig::DEFAULT_FINISHED_RUNS_MAX,
            output_budget: crate::runs::RunsConfig::DEFAULT_FINISHED_OUTPUT_BUDGET,
            keep_for: Duration::from_secs(600),
        }
    }
}

/// What the caller must do to one finished run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evict {
    /// Forget its captured output; keep its status.
    Output(String),
    /// Forget the run.
    Run(String),
}

#[derive(Debug)]
struct Entry {
    key: String,
    at: Instant,
    /// Output it still holds (0 once dropped).
    bytes: usize,
}

#[derive(Debug)]
pub struct Finished {
    retention: Retention,
    /// Oldest first.
    queue: VecDeque<Entry>,
    /// Entries before this index hold no output (the oldest lose theirs
    /// first), so the next to drop is found without a scan.
    dropped_up_to: usize,
    /// Output held by the queue's entries.
    bytes: usize,
}

impl Finished {
    pub fn new(retention: Retention) -> Self {
        Finished {
            retention,
            queue: VecDeque::new(),
            dropped_up_to: 0,
            bytes: 0,
        }
    }

    /// Finished runs kept.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Output bytes held by the finished runs kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Records that run `key` finished at `now` holding `bytes` of output,
    /// and says what must go to stay within bounds.
    pub fn push(&mut self, key: String, bytes: usize, now: Instant) -> Vec<Evict> {
        self.queue.push_back(Entry {
            key,
            at: now,
            bytes,
        });
        self.bytes += bytes;
        let mut out = self.expire(now);
        while self.queue.len() > self.retention.max_runs {
            out.push(self.pop());
        }
        while self.bytes > self.retention.output_budget && self.dropped_up_to < self.queue.len() {
            let e = &mut self.queue[self.dropped_up_to];
            self.dropped_up_to += 1;
            if e.bytes > 0 {
                self.bytes -= e.bytes;
                e.bytes = 0;
                out.push(Evict::Output(e.key.clone()));
            }
        }
        out
    }

    /// Forgets runs kept longer than the retention allows.
    pub fn expire(&mut self, now: Instant) -> Vec<Evict> {
        let mut out = Vec::new();
        while self
            .queue
            .front()
            .is_some_and(|e| now.saturating_duration_since(e.at) > self.retention.keep_for)
        {
            out.push(self.pop());
        }
        out
    }

    /// Forgets the runs whose keys start with `prefix` (a deleted
    /// session's or agent's); the caller removes them from its table.
    pub fn forget(&mut self, prefix: &str) {
        let mut kept = VecDeque::with_capacity(self.queue.len());
        let mut dropped_up_to = 0;
        for (i, e) in std::mem::take(&mut self.queue).into_iter().enumerate() {
            if e.key.starts_with(prefix) {
                self.bytes -= e.bytes;
                continue;
            }
            if i < self.dropped_up_to {
                dropped_up_to += 1;
            }
            kept.push_back(e);
        }
        self.queue = kept;
        self.dropped_up_to = dropped_up_to;
    }

    fn pop(&mut self) -> Evict {
        let e = self
            .queue
            .pop_front()
            .expect("pop is only called on a non-empty queue");
        self.bytes -= e.bytes;
        self.dropped_up_to = self.dropped_up_to.saturating_sub(1);
        Evict::Run(e.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retention(max_runs: usize, output_budget: usize) -> Retention {
        Retention {
            max_runs,
            output_budget,
            keep_for: Duration::from_secs(600),
        }
    }

    #[test]
    fn the_oldest_output_goes_first_and_the_status_stays() {
        let mut f = Finished::new(retention(100, 250));
        let t = Instant::now();
        assert!(f.push("r1".into(), 100, t).is_empty());
        assert!(f.push("r2".into(), 100, t).is_empty());
        assert_eq!(f.push("r3".into(), 100, t), [Evict::Output("r1".into())]);
        assert_eq!((f.len(), f.bytes()), (3, 200));
        // Runs without output are passed over.
        assert!(f.push("r4".into(), 0, t).is_empty());
        assert_eq!(f.push("r5".into(), 120, t), [Evict::Output("r2".into())]);
        assert_eq!((f.len(), f.bytes()), (5, 220));
        assert_eq!(
            f.push("r6".into(), 200, t),
            [Evict::Output("r3".into()), Evict::Output("r5".into())]
        );
        assert_eq!((f.len(), f.bytes()), (6, 200));
    }

    #[test]
    fn past_the_count_the_oldest_runs_go() {
        let mut f = Finished::new(retention(3, 1000));
        let t = Instant::now();
        for i in 0..3 {
            assert!(f.push(format!("r{i}"), 10, t).is_empty());
        }
        assert_eq!(f.push("r3".into(), 10, t), [Evict::Run("r0".into())]);
        assert_eq!((f.len(), f.bytes()), (3, 30));
    }

    #[test]
    fn a_run_bigger_than_the_budget_loses_its_own_output() {
        let mut f = Finished::new(retention(10, 50));
        let t = Instant::now();
        assert!(f.push("small".into(), 10, t).is_empty());
        assert_eq!(
            f.push("big".into(), 100, t),
            [Evict::Output("small".into()), Evict::Output("big".into())]
        );
        assert_eq!(f.bytes(), 0);
        // The bookkeeping survives evictions of runs whose output went.
        assert_eq!(f.push("next".into(), 20, t), []);
        let mut f2 = Finished::new(retention(2, 50));
        f2.push("a".into(), 40, t);
        f2.push("b".into(), 40, t);
        assert_eq!(
            f2.push("c".into(), 40, t),
            [Evict::Run("a".into()), Evict::Output("b".into())]
        );
        assert_eq!((f2.len(), f2.bytes()), (2, 40));
    }

    #[test]
    fn a_deleted_session_s_runs_are_forgotten_and_the_bookkeeping_holds() {
        let mut f = Finished::new(retention(100, 250));
        let t = Instant::now();
        f.push("a/s/1".into(), 100, t);
        f.push("a/t/2".into(), 100, t);
        assert_eq!(
            f.push("a/s/3".into(), 100, t),
            [Evict::Output("a/s/1".into())]
        );
        f.forget("a/s/");
        assert_eq!((f.len(), f.bytes()), (1, 100));
        // The next output to go is the one kept, once.
        assert!(f.push("b/s/4".into(), 100, t).is_empty());
        assert_eq!(
            f.push("b/s/5".into(), 100, t),
            [Evict::Output("a/t/2".into())]
        );
        f.forget("b/");
        assert_eq!((f.len(), f.bytes()), (1, 0));
        assert_eq!(
            f.push("c/s/6".into(), 300, t),
            [Evict::Output("c/s/6".into())]
        );
    }

    #[test]
    fn old_runs_expire() {
        let mut f = Finished::new(Retention {
            keep_for: Duration::from_secs(10),
            ..retention(100, 1000)
        });
        let t = Instant::now();
        f.push("old".into(), 10, t);
        f.push("newer".into(), 10, t + Duration::from_secs(5));
        assert!(f.expire(t + Duration::from_secs(10)).is_empty());
        assert_eq!(
            f.expire(t + Duration::from_secs(11)),
            [Evict::Run("old".into())]
        );
        assert_eq!(
            f.push("new".into(), 10, t + Duration::from_secs(16)),
            [Evict::Run("newer".into())]
        );
        assert_eq!((f.len(), f.bytes()), (1, 10));
    }
}
