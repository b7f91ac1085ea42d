//! Token buckets, one per key (a session): how fast something may be
//! spent on a session's behalf — bytes of spans written, lines of audit —
//! without one session's flood slowing another. A bucket holds up to
//! `burst` tokens and fills at `per_s` a second; what finds it empty is
//! refused (or, for audit lines, counted and said in one line later).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Keys kept before full (idle) buckets are forgotten: a forgotten
/// bucket is a full one, so forgetting changes nothing.
const KEYS_KEPT: usize = 4096;

/// One key's bucket.
#[derive(Debug, Clone)]
struct Bucket {
    tokens: f64,
    last: Instant,
    /// Takes refused and not yet reported.
    refused: u64,
    /// When a count of the refused was last reported.
    reported: Option<Instant>,
}

/// Buckets by key, all with the same rate and burst.
#[derive(Debug)]
pub struct Buckets {
    per_s: f64,
    burst: f64,
    map: Mutex<HashMap<String, Bucket>>,
}

/// A count of refused takes is reported at most this often: the line
/// that says it is itself something the key caused, so it is charged a
/// token, and a flood's count does not become a line between every two
/// allowed.
const REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// What [`Buckets::take`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// Allowed; this many takes were refused since the last report (at
    /// most one a second; a report is charged one token, which may leave
    /// the bucket a token in debt).
    Yes {
        refused_before: u64,
    },
    No,
}

impl Buckets {
    /// `per_s` tokens a second, at most `burst` saved; a rate of 0 allows
    /// everything.
    pub fn new(per_s: u64, burst: u64) -> Buckets {
        Buckets {
            per_s: per_s as f64,
            burst: burst.max(per_s) as f64,
            map: Mutex::new(HashMap::new()),
        }
    }

    pub fn per_s(&self) -> u64 {
        self.per_s as u64
    }

    pub fn burst(&self) -> u64 {
        self.burst as u64
    }

    /// Takes `n` tokens from `key`'s bucket if it holds them.
    pub fn take(&self, key: &str, n: u64) -> Taken {
        self.take_at(key, n, Instant::now())
    }

    fn take_at(&self, key: &str, n: u64, now: Instant) -> Taken {
        if self.per_s == 0.0 {
            return Taken::Yes { refused_before: 0 };
        }
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= KEYS_KEPT && !map.contains_key(key) {
            let (per_s, burst) = (self.per_s, self.burst);
            map.retain(|_, b| {
                b.refused > 0 || b.tokens + now.duration_since(b.last).as_secs_f64() * per_s < burst
            });
        }
        let b = map.entry(key.to_string()).or_insert(Bucket {
            tokens: self.burst,
            last: now,
            refused: 0,
            reported: None,
        });
        let since = now.saturating_duration_since(b.last).as_secs_f64();
        b.tokens = (b.tokens + since * self.per_s).min(self.burst);
        b.last = now;
        let n = n as f64;
        if b.tokens >= n {
            b.tokens -= n;
            let due = b
                .reported
                .is_none_or(|t| now.saturating_duration_since(t) >= REPORT_EVERY);
            if b.refused > 0 && due {
                b.tokens -= 1.0;
                b.reported = Some(now);
                Taken::Yes {
                    refused_before: std::mem::take(&mut b.refused),
                }
            } else {
                Taken::Yes { refused_before: 0 }
            }
        } else {
            b.refused = b.refused.saturating_add(1);
            Taken::No
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate_and_counts_the_refused() {
        let b = Buckets::new(10, 20);
        let t0 = Instant::now();
        for _ in 0..20 {
            assert_eq!(b.take_at("a", 1, t0), Taken::Yes { refused_before: 0 });
        }
        assert_eq!(b.take_at("a", 1, t0), Taken::No);
        assert_eq!(b.take_at("a", 1, t0), Taken::No);
        // Another key is not slowed.
        assert_eq!(b.take_at("b", 1, t0), Taken::Yes { refused_before: 0 });
        // A tenth of a second later: one token.
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(b.take_at("a", 1, t1), Taken::Yes { refused_before: 2 });
        assert_eq!(b.take_at("a", 1, t1), Taken::No);
        // Never more than the burst saved.
        let t2 = t1 + Duration::from_secs(3600);
        assert_eq!(b.take_at("a", 21, t2), Taken::No);
        assert_eq!(b.take_at("a", 20, t2), Taken::Yes { refused_before: 2 });
    }

    #[test]
    fn a_flood_gets_its_rate_and_one_report_a_second_all_charged() {
        // 100 a second, 1,000 at once; a caller trying every millisecond
        // for 10 s.
        let b = Buckets::new(100, 1000);
        let t0 = Instant::now();
        let (mut allowed, mut reports, mut counted) = (0u64, 0u64, 0u64);
        let mut last = 0u64;
        for ms in 0..10_000u64 {
            if let Taken::Yes { refused_before } = b.take_at("a", 1, t0 + Duration::from_millis(ms))
            {
                allowed += 1;
                if refused_before > 0 {
                    reports += 1;
                    counted += refused_before;
                    assert!(
                        reports == 1 || ms - last >= 1000,
                        "a report {} ms after the last",
                        ms - last
                    );
                    last = ms;
                }
            }
        }
        // The burst, the rate, and the reports within them.
        assert!(
            allowed + reports <= 1000 + 100 * 10 + 1,
            "{allowed} + {reports}"
        );
        assert!(allowed >= 1000 + 100 * 9, "{allowed}");
        assert!((8..=10).contains(&reports), "{reports} reports");
        // Every refused take is counted once, in a report or still held.
        let held = b.map.lock().unwrap()["a"].refused;
        assert_eq!(counted + held, 10_000 - allowed);
    }

    #[test]
    fn a_zero_rate_allows_everything_and_idle_keys_are_forgotten() {
        let free = Buckets::new(0, 0);
        assert_eq!(free.take("a", u64::MAX), Taken::Yes { refused_before: 0 });
        let b = Buckets::new(1, 1);
        let t0 = Instant::now();
        for i in 0..KEYS_KEPT + 10 {
            b.take_at(&format!("k{i}"), 1, t0);
        }
        let later = t0 + Duration::from_secs(5);
        b.take_at("new", 1, later);
        assert!(b.map.lock().unwrap().len() < KEYS_KEPT);
    }
}
