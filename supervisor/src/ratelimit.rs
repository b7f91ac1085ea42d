//! A token bucket for things a guest workload or a local user can make
//! happen as often as it likes (log lines, audit records): a burst, then a
//! steady rate, and a count of what was held back so the next line that
//! goes out can say so.

use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct RateLimit {
    burst: u32,
    every: Duration,
    /// Whole tokens available.
    tokens: u32,
    /// When the next token is due.
    next: Instant,
    suppressed: u64,
}

impl RateLimit {
    /// Allows `burst` at once, then one every `every`.
    pub fn new(burst: u32, every: Duration, now: Instant) -> RateLimit {
        RateLimit {
            burst: burst.max(1),
            every: every.max(Duration::from_nanos(1)),
            tokens: burst.max(1),
            next: now + every,
            suppressed: 0,
        }
    }

    /// `Some(n)` when the event may go out, `n` being how many were held
    /// back since the last one that did; `None` when it is held back.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        while self.tokens < self.burst && now >= self.next {
            self.tokens += 1;
            self.next += self.every;
        }
        if self.tokens == 0 {
            self.suppressed += 1;
            return None;
        }
        if self.tokens == self.burst {
            // A full bucket banks no time: the next token is due a whole
            // period after this one.
            self.next = now + self.every;
        }
        self.tokens -= 1;
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_a_steady_rate_with_the_held_back_counted() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut r = RateLimit::new(3, ms(100), t0);
        assert_eq!(r.allow(t0), Some(0));
        assert_eq!(r.allow(t0), Some(0));
        assert_eq!(r.allow(t0), Some(0));
        assert_eq!(r.allow(t0), None);
        assert_eq!(r.allow(t0 + ms(50)), None);
        // One token back after 100 ms, reporting the two held back.
        assert_eq!(r.allow(t0 + ms(100)), Some(2));
        assert_eq!(r.allow(t0 + ms(150)), None);
        assert_eq!(r.allow(t0 + ms(200)), Some(1));
        // A long quiet spell refills the burst, no more.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(r.allow(later), Some(0));
        }
        assert_eq!(r.allow(later), None);
    }
}
