//! One failure-kind machinery for every role. A failed connection or
//! request is counted by kind (`connect.error.refused`,
//! `requests.error.tls.unknown_issuer`), and the first of each kind is
//! logged with its detail. The kinds are three families:
//!
//! - [`NetCause`]: what the socket said, the same for every role;
//! - [`TlsFailure`]: why a TLS handshake or record failed;
//! - a role's own kinds ([`OwnKind`]): `hold`'s bad upgrade answers,
//!   `attack`'s bad responses.
//!
//! [`Failure<K>`] is one of them; [`Tally`] counts them per interval in a
//! flat array (failures can come by the thousand per second), and
//! [`FirstOfKind`] says which is the first of its kind.

use std::cell::Cell;
use std::fmt;
use std::io;
use std::marker::PhantomData;

use super::recorder::Take;
use crate::tls::{TlsError, TlsFailure};

/// What the socket said when a connect, read or write failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetCause {
    /// The server refused the TCP connection (`ECONNREFUSED`).
    Refused,
    /// No answer within the timeout.
    Timeout,
    /// The connection was reset or broken (`ECONNRESET`, `EPIPE`).
    Reset,
    /// No local port or address was left (`EADDRNOTAVAIL`, `EADDRINUSE`):
    /// the source address × target port space is used up.
    AddrNotAvailable,
    /// Anything else (the error is logged once).
    Other,
}

impl NetCause {
    const ALL: [Self; 5] = [
        Self::Refused,
        Self::Timeout,
        Self::Reset,
        Self::AddrNotAvailable,
        Self::Other,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Timeout => "timeout",
            Self::Reset => "reset",
            Self::AddrNotAvailable => "addr_not_available",
            Self::Other => "other",
        }
    }

    /// Classifies a socket error.
    pub fn of_io(err: &io::Error) -> Self {
        match err.raw_os_error() {
            Some(libc::ECONNREFUSED) => Self::Refused,
            Some(libc::ETIMEDOUT) => Self::Timeout,
            Some(libc::ECONNRESET | libc::EPIPE | libc::ECONNABORTED) => Self::Reset,
            Some(libc::EADDRNOTAVAIL | libc::EADDRINUSE) => Self::AddrNotAvailable,
            _ => match err.kind() {
                io::ErrorKind::UnexpectedEof => Self::Reset,
                io::ErrorKind::TimedOut => Self::Timeout,
                _ => Self::Other,
            },
        }
    }
}

/// A role's own kinds of failure, beside the socket's and TLS's.
pub trait OwnKind: Copy + Eq + fmt::Debug + 'static {
    /// Every kind, in counter order.
    const ALL: &'static [Self];
    /// How the role counts a server that closed the connection in the
    /// middle of the TLS handshake.
    const TLS_CLOSED: Failure<Self>;
    /// The counter suffix: `<prefix>.error.<label>`.
    fn label(self) -> &'static str;
}

/// Why one connection or request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure<K> {
    /// The socket failed.
    Net(NetCause),
    /// The TLS handshake or a TLS record failed (`error.tls.<reason>`).
    Tls(TlsFailure),
    /// One of the role's own kinds.
    Own(K),
}

impl<K: OwnKind> Failure<K> {
    const NET: usize = NetCause::ALL.len();
    const TLS: usize = TlsFailure::ALL.len();

    /// Kinds in all.
    pub fn count() -> usize {
        Self::NET + Self::TLS + K::ALL.len()
    }

    /// Every kind, in counter order.
    pub fn all() -> impl Iterator<Item = Self> {
        let net = NetCause::ALL.into_iter().map(Self::Net);
        let tls = TlsFailure::ALL.into_iter().map(Self::Tls);
        net.chain(tls).chain(K::ALL.iter().map(|k| Self::Own(*k)))
    }

    /// The kind's place in [`Self::all`].
    pub fn index(self) -> usize {
        match self {
            Self::Net(c) => c as usize,
            Self::Tls(r) => Self::NET + r as usize,
            Self::Own(k) => {
                Self::NET + Self::TLS + K::ALL.iter().position(|o| *o == k).unwrap_or(0)
            }
        }
    }

    /// The counter suffix: `refused`, `tls.unknown_issuer`, `bad_status`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Net(c) => c.label(),
            Self::Tls(r) => r.label(),
            Self::Own(k) => k.label(),
        }
    }

    /// Classifies a socket error.
    pub fn from_io(err: &io::Error) -> Self {
        Self::Net(NetCause::of_io(err))
    }

    /// Classifies a failed TLS connection: rustls's reason, or the socket's.
    pub fn from_tls(err: &TlsError) -> Self {
        match err {
            TlsError::Tls(e) => Self::Tls(TlsFailure::of(e)),
            TlsError::Io(e) => Self::from_io(e),
            TlsError::Closed => K::TLS_CLOSED,
            TlsError::TooLarge => Self::Tls(TlsFailure::Protocol),
        }
    }
}

/// Failures counted by kind during one interval.
#[derive(Debug)]
pub struct Tally<K> {
    counts: Box<[u64]>,
    kind: PhantomData<K>,
}

impl<K: OwnKind> Default for Tally<K> {
    fn default() -> Self {
        Self {
            counts: vec![0; Failure::<K>::count()].into_boxed_slice(),
            kind: PhantomData,
        }
    }
}

impl<K: OwnKind> Tally<K> {
    /// One more failure of `kind`.
    pub fn add(&mut self, kind: Failure<K>) {
        self.add_n(kind, 1);
    }

    /// `n` more failures of `kind`.
    pub fn add_n(&mut self, kind: Failure<K>, n: u64) {
        if let Some(c) = self.counts.get_mut(kind.index()) {
            *c += n;
        }
    }

    /// Moves every count into `take` as `<prefix>.<label>` and starts again.
    pub fn take_into(&mut self, prefix: &str, take: &mut Take) {
        for kind in Failure::<K>::all() {
            if let Some(c) = self.counts.get_mut(kind.index()) {
                take.count(&format!("{prefix}.{}", kind.label()), c);
            }
        }
    }
}

/// Which kinds have been seen: the first of each is logged with its
/// detail, the rest only counted, so a failing run does not flood its log.
#[derive(Debug, Default)]
pub struct FirstOfKind(Cell<u64>);

impl FirstOfKind {
    /// Whether `kind` is seen for the first time (and marks it seen).
    pub fn first<K: OwnKind>(&self, kind: Failure<K>) -> bool {
        let bit = 1u64.checked_shl(kind.index() as u32).unwrap_or(0);
        let seen = self.0.get();
        self.0.set(seen | bit);
        seen & bit == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Own {
        BadStatus,
        Canceled,
    }

    impl OwnKind for Own {
        const ALL: &'static [Self] = &[Self::BadStatus, Self::Canceled];
        const TLS_CLOSED: Failure<Self> = Failure::Net(NetCause::Reset);
        fn label(self) -> &'static str {
            match self {
                Self::BadStatus => "bad_status",
                Self::Canceled => "canceled",
            }
        }
    }

    #[test]
    fn every_kind_has_its_own_slot_and_label() {
        let mut labels = std::collections::BTreeSet::new();
        for (i, k) in Failure::<Own>::all().enumerate() {
            assert_eq!(k.index(), i, "{k:?}");
            assert!(labels.insert(k.label()), "{k:?}");
        }
        assert_eq!(labels.len(), Failure::<Own>::count());
        assert!(Failure::<Own>::count() <= 64, "FirstOfKind holds 64 kinds");
    }

    #[test]
    fn counts_move_out_under_their_names() {
        let mut t = Tally::<Own>::default();
        t.add(Failure::Own(Own::Canceled));
        t.add_n(Failure::Net(NetCause::Refused), 2);
        t.add(Failure::Tls(TlsFailure::UnknownIssuer));
        let mut take = Take::default();
        t.take_into("requests.error", &mut take);
        let iv = take.into_interval(0, 1, String::new());
        assert_eq!(iv.counter("requests.error.canceled"), 1);
        assert_eq!(iv.counter("requests.error.refused"), 2);
        assert_eq!(iv.counter("requests.error.tls.unknown_issuer"), 1);
        assert_eq!(iv.counters.len(), 3);
        let mut again = Take::default();
        t.take_into("requests.error", &mut again);
        assert!(again.into_interval(0, 1, String::new()).counters.is_empty());
    }

    #[test]
    fn classifies_socket_and_tls_errors() {
        let io = |e| io::Error::from_raw_os_error(e);
        assert_eq!(NetCause::of_io(&io(libc::ECONNREFUSED)), NetCause::Refused);
        assert_eq!(
            NetCause::of_io(&io(libc::EADDRNOTAVAIL)),
            NetCause::AddrNotAvailable
        );
        let eof = io::Error::from(io::ErrorKind::UnexpectedEof);
        assert_eq!(NetCause::of_io(&eof), NetCause::Reset);
        assert_eq!(
            Failure::<Own>::from_tls(&TlsError::Closed),
            Failure::Net(NetCause::Reset)
        );
        assert_eq!(
            Failure::<Own>::from_tls(&TlsError::TooLarge),
            Failure::Tls(TlsFailure::Protocol)
        );
    }

    #[test]
    fn the_first_of_each_kind_is_the_only_first() {
        let seen = FirstOfKind::default();
        let refused = Failure::<Own>::Net(NetCause::Refused);
        assert!(seen.first(refused));
        assert!(!seen.first(refused));
        assert!(seen.first(Failure::<Own>::Own(Own::BadStatus)));
    }
}
