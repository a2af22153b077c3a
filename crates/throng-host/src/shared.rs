//! Counters shared by a supervisor and the worker processes it starts: an
//! array of `u64` in one sealed `memfd`, mapped by every process, which the
//! workers inherit across `exec` (the descriptor is made without
//! close-on-exec; its number travels in their settings).
//!
//! Each worker writes only its own slot; any process may sum them all. The
//! server uses it for `--max-connections`: every worker knows the node's
//! total at the moment of an upgrade without a round trip to the
//! supervisor, and a slot is set back to 0 when its worker dies (the kernel
//! closed that worker's sockets).
//!
//! The file is sealed against shrinking and growing before any worker maps
//! it, so no process can cut the mapping under another (a read past the
//! end of a shrunk file would be a SIGBUS); [`SharedCounters::inherit`]
//! checks the seals and the size before it maps anything.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// The seals every shared-counter file carries.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A mapped array of `len` counters. Dropping it unmaps the memory and
/// closes this process's descriptor.
pub struct SharedCounters {
    /// Start of the mapping. Invariant: `len` `AtomicU64`s, mapped shared
    /// read-write, valid until `drop` unmaps them.
    ptr: NonNull<AtomicU64>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the memory is only ever touched through `AtomicU64`s, which may
// be shared between threads (and here, processes).
unsafe impl Send for SharedCounters {}
// SAFETY: as above: `&self` gives out only `&AtomicU64`.
unsafe impl Sync for SharedCounters {}

impl fmt::Debug for SharedCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedCounters")
            .field("len", &self.len)
            .field("fd", &self.fd.as_raw_fd())
            .finish()
    }
}

impl SharedCounters {
    /// `len` zeroed counters in a new memfd that child processes inherit.
    pub fn create(len: usize) -> io::Result<Self> {
        let len = len.max(1);
        let name = c"throng-counters";
        // SAFETY: a plain syscall with a NUL-terminated name; the result is
        // checked. No MFD_CLOEXEC: the workers must inherit it.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let file = std::fs::File::from(fd);
        file.set_len((len * size_of::<u64>()) as u64)?;
        let fd = OwnedFd::from(file);
        // SAFETY: fcntl on a descriptor we own, with an int argument.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Self::map(fd, len)
    }

    /// Maps the counters a parent made with [`create`](Self::create) and
    /// whose descriptor this process inherited as `fd`. Refuses (without
    /// taking it) a descriptor that is not such a file of `len` counters.
    pub fn inherit(fd: RawFd, len: usize) -> io::Result<Self> {
        let len = len.max(1);
        let refuse = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("descriptor {fd} is not the supervisor's shared counters: {why}"),
            )
        };
        if fd < 0 {
            return Err(refuse("negative"));
        }
        // SAFETY: fcntl(F_GET_SEALS) only reads the descriptor's state; on a
        // closed or foreign descriptor it fails, checked below.
        let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
        if seals < 0 || seals & SEALS != SEALS {
            return Err(refuse("not a sealed memfd"));
        }
        // SAFETY: the descriptor is open (F_GET_SEALS succeeded) for the
        // borrow, which ends before anything could close it.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let size = borrowed
            .try_clone_to_owned()
            .map(std::fs::File::from)?
            .metadata()?
            .len();
        if size != (len * size_of::<u64>()) as u64 {
            return Err(refuse("wrong size"));
        }
        // SAFETY: this process inherited the descriptor for exactly this
        // use and nothing else in it owns or closes it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<Self> {
        // SAFETY: maps `len` u64s of a file that is at least that long and
        // sealed against shrinking; the result is checked.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len * size_of::<u64>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(addr.cast::<AtomicU64>())
            .ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, len, fd })
    }

    /// The descriptor, for the children to name.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// How many counters there are.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: there is always at least one counter.
    pub fn is_empty(&self) -> bool {
        false
    }

    fn all(&self) -> &[AtomicU64] {
        // SAFETY: the invariant of `ptr`: `len` AtomicU64s (page-aligned),
        // mapped for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Counter `i`; `None` past the end.
    pub fn slot(&self, i: usize) -> Option<&AtomicU64> {
        self.all().get(i)
    }

    /// The sum of every counter now.
    pub fn sum(&self) -> u64 {
        self.all().iter().map(|c| c.load(Ordering::SeqCst)).sum()
    }

    /// Adds one to counter `i` unless the sum would then pass `cap`;
    /// returns whether it did. Add first, then sum: of several processes
    /// racing for the last place, none can see room that another took, so
    /// the cap is never passed (both may refuse, at worst).
    pub fn take_one(&self, i: usize, cap: u64) -> bool {
        let Some(mine) = self.slot(i) else {
            return false;
        };
        mine.fetch_add(1, Ordering::SeqCst);
        if self.sum() > cap {
            mine.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Gives back one taken by [`take_one`](Self::take_one) on counter `i`.
    pub fn give_one(&self, i: usize) {
        if let Some(mine) = self.slot(i) {
            // Saturating: a slot reset after a restart never wraps.
            let _ = mine.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1));
        }
    }
}

impl Drop for SharedCounters {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped; nothing borrows it any
        // more (every borrow is tied to `&self`).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len * size_of::<u64>());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_mapping_sees_the_same_counters_and_the_cap_holds() {
        let a = SharedCounters::create(3).unwrap();
        // What a child does with the inherited number: here a duplicate.
        let dup = a.fd.try_clone().unwrap();
        let raw = dup.as_raw_fd();
        std::mem::forget(dup);
        let b = SharedCounters::inherit(raw, 3).unwrap();
        assert!(a.take_one(0, 3));
        assert!(b.take_one(1, 3));
        assert!(b.take_one(2, 3));
        assert_eq!(a.sum(), 3);
        assert!(!a.take_one(0, 3), "the cap is counted over every slot");
        assert_eq!(b.sum(), 3, "a refusal takes nothing");
        b.give_one(1);
        assert!(a.take_one(0, 3));
        a.slot(0).unwrap().store(0, Ordering::SeqCst);
        a.give_one(0);
        assert_eq!(
            a.slot(0).unwrap().load(Ordering::SeqCst),
            0,
            "never below 0"
        );
    }

    #[test]
    fn inherit_refuses_what_is_not_the_counters() {
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        let e = SharedCounters::inherit(f.as_raw_fd(), 1).unwrap_err();
        assert!(e.to_string().contains("not a sealed memfd"), "{e}");
        let a = SharedCounters::create(2).unwrap();
        let e = SharedCounters::inherit(a.fd(), 5).unwrap_err();
        assert!(e.to_string().contains("wrong size"), "{e}");
        assert!(SharedCounters::inherit(-1, 1).is_err());
        // The refused descriptors are still open and still theirs.
        assert!(f.metadata().is_ok());
        assert_eq!(a.sum(), 0);
    }
}
