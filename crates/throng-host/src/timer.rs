//! A precise timer: one Linux `timerfd` on the monotonic clock (the clock of
//! [`Instant`]), armed in nanoseconds and waited on through tokio's epoll.
//!
//! Why not tokio's timers: they round every deadline up to the next
//! millisecond, so a request `attack` started by them was on average about a
//! millisecond late, and that lag landed in every latency measured from the
//! intended start. A timerfd wakes within microseconds. The server's worker
//! ticks on one too (periodic), so its clock keeps its period whatever else
//! the runtime is doing and counts the ticks it missed.

use std::fs::File;
use std::io::{self, Read as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// One timer, re-armed for each use. Owns one file descriptor.
#[derive(Debug)]
pub struct Timer {
    /// The timerfd, as a `File` so reading its count is a plain safe read.
    fd: AsyncFd<File>,
}

impl Timer {
    /// A new, disarmed timer. Must be called inside a tokio runtime.
    pub fn new() -> io::Result<Self> {
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
        let file = File::from(unsafe { OwnedFd::from_raw_fd(raw) });
        // SAFETY: the AsyncFd owns `file` and keeps it open until it is
        // dropped; a File always reports the same descriptor.
        let fd = unsafe { AsyncFd::register_with_interest(file, Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(Self { fd })
    }

    /// Arms the timer to expire after `first`, then every `period` (zero:
    /// once). A zero `first` would disarm it, so it is made 1 ns.
    fn arm(&self, first: Duration, period: Duration) -> io::Result<()> {
        let spec = |d: Duration| libc::timespec {
            tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(d.subsec_nanos()),
        };
        let first = if first.is_zero() {
            Duration::from_nanos(1)
        } else {
            first
        };
        let value = libc::itimerspec {
            it_interval: spec(period),
            it_value: spec(first),
        };
        // SAFETY: the descriptor is a timerfd we own; `value` outlives the
        // call, and the old value is not asked for (null).
        let r =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &value, std::ptr::null_mut()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits for the next expiry; returns how many expiries there were
    /// since the last wait (more than 1: ticks were missed).
    async fn expiries(&self) -> io::Result<u64> {
        loop {
            let mut guard = self.fd.readable().await?;
            let read = guard.try_io(|fd| {
                let mut count = [0u8; 8];
                let mut file: &File = fd.get_ref();
                file.read_exact(&mut count)?;
                Ok(u64::from_ne_bytes(count))
            });
            match read {
                Ok(result) => return result,
                // Not expired yet: readiness was cleared, wait again.
                Err(_would_block) => {}
            }
        }
    }

    /// Waits until `at` (returns at once if it has passed).
    pub async fn sleep_until(&self, at: Instant) -> io::Result<()> {
        let now = Instant::now();
        if at <= now {
            return Ok(());
        }
        self.arm(at - now, Duration::ZERO)?;
        self.expiries().await.map(drop)
    }

    /// Makes the timer tick every `period` from now on; [`Self::tick`] waits
    /// for each tick.
    pub fn start_ticking(&self, period: Duration) -> io::Result<()> {
        self.arm(period, period)
    }

    /// Waits for the next tick of [`Self::start_ticking`]; returns how many
    /// periods passed since the last call (1, unless the caller was late).
    pub async fn tick(&self) -> io::Result<u64> {
        self.expiries().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn wakes_at_or_after_the_deadline() {
        runtime().block_on(async {
            let t = Timer::new().unwrap();
            for us in [0u64, 50, 300, 2_500] {
                let at = Instant::now() + Duration::from_micros(us);
                t.sleep_until(at).await.unwrap();
                assert!(Instant::now() >= at, "woke before {us} µs");
            }
            // A deadline in the past returns at once.
            t.sleep_until(Instant::now() - Duration::from_millis(1))
                .await
                .unwrap();
        });
    }

    #[test]
    fn ticks_keep_their_period_and_count_missed_ones() {
        runtime().block_on(async {
            let t = Timer::new().unwrap();
            let period = Duration::from_millis(5);
            let start = Instant::now();
            t.start_ticking(period).unwrap();
            let mut ticks = 0;
            while ticks < 4 {
                ticks += t.tick().await.unwrap();
            }
            assert!(start.elapsed() >= period * 4);
            // Late by several periods: one wait reports them all.
            std::thread::sleep(period * 3);
            assert!(t.tick().await.unwrap() >= 3);
        });
    }
}
