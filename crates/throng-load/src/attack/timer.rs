//! A precise timer for the schedule.
//!
//! tokio's timers round every deadline up to the next millisecond, so a
//! request started by them is on average about a millisecond late, and that
//! lag lands in every latency measured from the intended start. One Linux
//! `timerfd` per worker, armed with nanoseconds and waited on through the
//! runtime's epoll, wakes the scheduler within microseconds instead.

use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::time::Instant;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A one-shot timer, re-armed for each wait. Owns one file descriptor.
#[derive(Debug)]
pub(crate) struct PreciseTimer {
    fd: AsyncFd<OwnedFd>,
}

impl PreciseTimer {
    /// A new timer on the monotonic clock (the clock of [`Instant`]).
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: plain syscall with constant flags; the result is checked.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: `owned` is an open timerfd that the AsyncFd takes over and
        // keeps open until it is dropped; OwnedFd always reports that fd.
        let fd = unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE) }
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Self { fd })
    }

    /// Waits until `at` (returns at once if it has passed).
    pub(crate) async fn sleep_until(&self, at: Instant) -> io::Result<()> {
        let now = Instant::now();
        if at <= now {
            return Ok(());
        }
        let d = at - now;
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
                tv_nsec: libc::c_long::from(d.subsec_nanos().max(1)),
            },
        };
        // SAFETY: the descriptor is a timerfd we own; `spec` outlives the call
        // and the old value is not asked for (null).
        let r =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        loop {
            let mut guard = self.fd.readable().await?;
            let read = guard.try_io(|fd| {
                let mut expirations = [0u8; 8];
                // SAFETY: reads at most 8 bytes into a buffer of 8.
                let n = unsafe { libc::read(fd.as_raw_fd(), expirations.as_mut_ptr().cast(), 8) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            });
            match read {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => return Err(e),
                // Not expired yet: readiness was cleared, wait again.
                Err(_would_block) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn wakes_at_or_after_the_deadline() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let t = PreciseTimer::new().unwrap();
            for us in [0u64, 50, 300, 2_500] {
                let at = Instant::now() + Duration::from_micros(us);
                t.sleep_until(at).await.unwrap();
                assert!(Instant::now() >= at, "woke before {us} µs");
            }
        });
    }
}
