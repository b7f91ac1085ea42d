//! `system.resumed`: what the guest does when the VM manager on the host
//! resumed it or restored it from a snapshot. Its wall clock stood still
//! while it was paused or saved (QEMU stops the guest's clocks with its
//! vCPUs), so it is set from the host's; and after a restore, when two
//! guests may run on from one snapshot, the host's seed is mixed into the
//! kernel's random pool and the pool reseeded at once, so that nothing
//! drawn from it from here on (ids, tokens, keys) is drawn by the other.

use crate::error::RequestError;
use allox_protocol::{ErrorCode, Resumed, SystemResumed};
use rustix::time::{ClockId, Timespec};

/// The size of the seed the host sends.
pub const SEED_LEN: usize = 32;

fn refused(code: ErrorCode, why: String) -> RequestError {
    RequestError::Machine { code, why }
}

/// Sets the clock and reseeds the pool as `r` asks.
pub fn apply(r: &SystemResumed) -> Result<Resumed, RequestError> {
    if !r.seed.is_empty() && r.seed.len() != SEED_LEN {
        return Err(refused(
            ErrorCode::InvalidRequest,
            format!(
                "system.resumed: seed is {} bytes; it must be {SEED_LEN} or none",
                r.seed.len()
            ),
        ));
    }
    // A clock before 2020 is a host's mistake, not a time to set.
    const EARLIEST_NS: u64 = 1_577_836_800 * 1_000_000_000;
    if r.realtime_ns < EARLIEST_NS {
        return Err(refused(
            ErrorCode::InvalidRequest,
            format!(
                "system.resumed: realtime_ns {} is before 2020-01-01: not a host's clock",
                r.realtime_ns
            ),
        ));
    }
    let now = rustix::time::clock_gettime(ClockId::Realtime);
    let now_ns = now.tv_sec as i128 * 1_000_000_000 + now.tv_nsec as i128;
    let step_ns = r.realtime_ns as i128 - now_ns;
    let to = Timespec {
        tv_sec: (r.realtime_ns / 1_000_000_000) as i64,
        tv_nsec: (r.realtime_ns % 1_000_000_000) as _,
    };
    rustix::time::clock_settime(ClockId::Realtime, to).map_err(|e| {
        refused(
            ErrorCode::Internal,
            format!("system.resumed: setting the wall clock: {e}"),
        )
    })?;
    let reseeded = if r.seed.is_empty() {
        false
    } else {
        reseed(&r.seed).map_err(|e| {
            refused(
                ErrorCode::Internal,
                format!("system.resumed: reseeding the kernel's random pool: {e}"),
            )
        })?;
        true
    };
    let mut id = [0u8; 16];
    getrandom::fill(&mut id).map_err(|e| {
        refused(
            ErrorCode::Internal,
            format!("system.resumed: the kernel's random numbers: {e}"),
        )
    })?;
    tracing::info!(
        step_ms = (step_ns / 1_000_000) as i64,
        reseeded,
        "resumed by the VM manager"
    );
    Ok(Resumed {
        clock_step_ms: (step_ns / 1_000_000) as i64,
        reseeded,
        instance: id.iter().map(|b| format!("{b:02x}")).collect(),
    })
}

/// Mixes `seed` into the input pool, credited, then makes the kernel
/// reseed its generator from the pool now (not at its next interval):
/// `RNDADDENTROPY` and `RNDRESEEDCRNG` of random(4), both CAP_SYS_ADMIN.
/// (Two ioctls no safe wrapper of rustix or nix offers.)
#[allow(unsafe_code)]
fn reseed(seed: &[u8]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // `_IOW('R', 0x03, int[2])` and `_IO('R', 0x07)` (linux/random.h).
    const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
    const RNDRESEEDCRNG: libc::c_ulong = 0x5207;
    #[repr(C)]
    struct PoolInfo {
        entropy_count: libc::c_int,
        buf_size: libc::c_int,
        buf: [u8; SEED_LEN],
    }
    let mut info = PoolInfo {
        entropy_count: (SEED_LEN * 8) as libc::c_int,
        buf_size: SEED_LEN as libc::c_int,
        buf: [0; SEED_LEN],
    };
    info.buf.copy_from_slice(seed);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/urandom")?;
    // SAFETY: the argument is a rand_pool_info of `buf_size` bytes that
    // lives across the call; RNDRESEEDCRNG takes none.
    unsafe {
        if libc::ioctl(f.as_raw_fd(), RNDADDENTROPY as _, &info) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::ioctl(f.as_raw_fd(), RNDRESEEDCRNG as _) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_of_the_wrong_size_or_a_clock_before_2020_is_refused() {
        let e = apply(&SystemResumed {
            realtime_ns: 1_800_000_000 * 1_000_000_000,
            seed: vec![1u8; 31].into(),
        })
        .unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidRequest);
        assert!(e.to_string().contains("seed is 31 bytes"), "{e}");
        let e = apply(&SystemResumed {
            realtime_ns: 5,
            seed: Default::default(),
        })
        .unwrap_err();
        assert!(e.to_string().contains("before 2020"), "{e}");
    }
}
