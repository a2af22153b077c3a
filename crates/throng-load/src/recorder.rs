//! What a `hold` worker counts while it runs, turned into one
//! [`Interval`] per second.
//!
//! Recording is on the hot path (every delivered message of every
//! subscriber), so the recorder keeps plain integer fields and a few
//! histograms, and only builds the named maps of an [`Interval`] once per
//! interval in [`HoldRecorder::take`].

use std::collections::BTreeMap;
use std::io;

use hdrhistogram::Histogram;
use throng_report::interval::{HISTOGRAM_MAX_US, Interval, new_histogram};

use crate::tls::TlsFailure;

/// Why a connection could not be opened; each kind is its own counter
/// (`connect.error.<label>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectError {
    /// The server refused the TCP connection (`ECONNREFUSED`).
    Refused,
    /// TCP connect or the upgrade did not finish within its timeout.
    Timeout,
    /// The server reset or closed the connection during the handshake.
    Reset,
    /// No local port or address was available (`EADDRNOTAVAIL`, `EADDRINUSE`):
    /// the source address × target port space is used up.
    AddrNotAvailable,
    /// The server answered the upgrade with a status other than 101.
    BadStatus,
    /// The answer was not a valid WebSocket handshake (bad head, wrong accept key).
    BadHandshake,
    /// Anything else (the error is logged once per kind).
    Other,
    /// The TLS handshake (or a TLS record) failed, for this reason
    /// (`connect.error.tls.<reason>`).
    Tls(TlsFailure),
}

impl ConnectError {
    /// Kinds in all.
    pub const COUNT: usize = Self::PLAIN.len() + TlsFailure::ALL.len();

    /// The kinds that are not TLS failures, in counter order.
    const PLAIN: [Self; 7] = [
        Self::Refused,
        Self::Timeout,
        Self::Reset,
        Self::AddrNotAvailable,
        Self::BadStatus,
        Self::BadHandshake,
        Self::Other,
    ];

    /// Every kind, in counter order: [`Self::PLAIN`], then one per
    /// [`TlsFailure`].
    pub const ALL: [Self; Self::COUNT] = {
        let mut all = [Self::Other; Self::COUNT];
        let mut i = 0;
        while i < Self::COUNT {
            all[i] = if i < Self::PLAIN.len() {
                Self::PLAIN[i]
            } else {
                Self::Tls(TlsFailure::ALL[i - Self::PLAIN.len()])
            };
            i += 1;
        }
        all
    };

    /// The kind's place in [`Self::ALL`].
    pub fn index(self) -> usize {
        match self {
            Self::Refused => 0,
            Self::Timeout => 1,
            Self::Reset => 2,
            Self::AddrNotAvailable => 3,
            Self::BadStatus => 4,
            Self::BadHandshake => 5,
            Self::Other => 6,
            Self::Tls(r) => Self::PLAIN.len() + r as usize,
        }
    }

    /// The counter suffix: `connect.error.<label>`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Timeout => "timeout",
            Self::Reset => "reset",
            Self::AddrNotAvailable => "addr_not_available",
            Self::BadStatus => "bad_status",
            Self::BadHandshake => "bad_handshake",
            Self::Other => "other",
            Self::Tls(r) => r.label(),
        }
    }

    /// Classifies a failed TLS connection: rustls's reason, or the socket's.
    pub fn from_tls(err: &crate::tls::TlsError) -> Self {
        use crate::tls::TlsError;
        match err {
            TlsError::Tls(e) => Self::Tls(TlsFailure::of(e)),
            TlsError::Io(e) => Self::from_io(e),
            TlsError::Closed => Self::Reset,
            TlsError::TooLarge => Self::Tls(TlsFailure::Protocol),
        }
    }

    /// Classifies a socket error.
    pub fn from_io(err: &io::Error) -> Self {
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

/// How a held connection ended; each is a counter under `closed.`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The server sent a close frame with this code (`closed.server.<code>`,
    /// `closed.server.none` for an empty close).
    ByServer(Option<u16>),
    /// The server closed TCP without a close frame (`closed.eof`).
    Eof,
    /// A read or write failed (`closed.reset`).
    Reset,
    /// The server broke the protocol; closed with 1002/1007/1009 (`closed.protocol`).
    Protocol,
    /// The run ended and the server answered our close (`closed.clean`).
    Clean,
    /// The run ended and the server did not answer our close in time (`closed.timeout`).
    CloseTimeout,
    /// A TLS record failed: decryption, or a fatal alert from the server (`closed.tls`).
    Tls,
}

/// Per-interval counts and histograms of one `hold` worker.
#[derive(Debug)]
pub struct HoldRecorder {
    source: String,
    length_ns: u64,
    /// Connections open now (a level, not reset per interval).
    open: i64,
    /// Connections this worker will attempt in total (a level).
    target: i64,
    opened: u64,
    failed: [u64; ConnectError::COUNT],
    tls_full: u64,
    tls_resumed: u64,
    abandoned: u64,
    closed: BTreeMap<String, u64>,
    received: u64,
    lost: u64,
    duplicated: u64,
    out_of_order: u64,
    foreign: u64,
    bytes_in: u64,
    connect: Histogram<u64>,
    connect_service: Histogram<u64>,
    connect_lag: Histogram<u64>,
    connect_tcp: Histogram<u64>,
    connect_tls: Histogram<u64>,
    connect_upgrade: Histogram<u64>,
    delivery: Histogram<u64>,
}

fn record(h: &mut Histogram<u64>, us: u64) {
    h.saturating_record(us.clamp(1, HISTOGRAM_MAX_US));
}

impl HoldRecorder {
    /// A recorder for `source` (`"host/hold-0"`) with intervals of `length_ns`.
    pub fn new(source: String, length_ns: u64, target: u64) -> Self {
        Self {
            source,
            length_ns,
            open: 0,
            target: i64::try_from(target).unwrap_or(i64::MAX),
            opened: 0,
            failed: [0; ConnectError::COUNT],
            tls_full: 0,
            tls_resumed: 0,
            abandoned: 0,
            closed: BTreeMap::new(),
            received: 0,
            lost: 0,
            duplicated: 0,
            out_of_order: 0,
            foreign: 0,
            bytes_in: 0,
            connect: new_histogram(),
            connect_service: new_histogram(),
            connect_lag: new_histogram(),
            connect_tcp: new_histogram(),
            connect_tls: new_histogram(),
            connect_upgrade: new_histogram(),
            delivery: new_histogram(),
        }
    }

    /// A connection was started `lag_us` after its intended time.
    pub fn started(&mut self, lag_us: u64) {
        record(&mut self.connect_lag, lag_us);
    }

    /// A handshake completed: `total_us` from the intended start, `service_us`
    /// from the actual start.
    pub fn opened(&mut self, total_us: u64, service_us: u64) {
        self.opened += 1;
        self.open += 1;
        record(&mut self.connect, total_us);
        record(&mut self.connect_service, service_us);
    }

    /// How long each phase of an opened connection took: TCP connect, the
    /// TLS handshake (`None` for `ws://`), the WebSocket upgrade.
    pub fn phases(&mut self, tcp_us: u64, tls_us: Option<u64>, upgrade_us: u64) {
        record(&mut self.connect_tcp, tcp_us);
        if let Some(us) = tls_us {
            record(&mut self.connect_tls, us);
        }
        record(&mut self.connect_upgrade, upgrade_us);
    }

    /// A TLS handshake completed; `resumed`: it resumed an earlier session.
    pub fn tls_handshake(&mut self, resumed: bool) {
        if resumed {
            self.tls_resumed += 1;
        } else {
            self.tls_full += 1;
        }
    }

    /// A connection attempt failed.
    pub fn failed(&mut self, kind: ConnectError) {
        self.failed[kind.index()] += 1;
    }

    /// A connection still opening when the run stopped was given up.
    pub fn abandoned(&mut self) {
        self.abandoned += 1;
    }

    /// A held connection ended.
    pub fn closed(&mut self, how: Closed) {
        self.open -= 1;
        let name = match how {
            Closed::ByServer(Some(code)) => format!("closed.server.{code}"),
            Closed::ByServer(None) => "closed.server.none".to_owned(),
            Closed::Eof => "closed.eof".to_owned(),
            Closed::Reset => "closed.reset".to_owned(),
            Closed::Protocol => "closed.protocol".to_owned(),
            Closed::Clean => "closed.clean".to_owned(),
            Closed::CloseTimeout => "closed.timeout".to_owned(),
            Closed::Tls => "closed.tls".to_owned(),
        };
        *self.closed.entry(name).or_insert(0) += 1;
    }

    /// `n` bytes arrived on a held connection.
    pub fn bytes_in(&mut self, n: usize) {
        self.bytes_in += n as u64;
    }

    /// One of our messages arrived `latency_us` after it was published.
    pub fn delivered(&mut self, latency_us: u64) {
        self.received += 1;
        record(&mut self.delivery, latency_us);
    }

    /// `n` messages never arrived (a gap in sequence numbers).
    pub fn lost(&mut self, n: u64) {
        self.lost += n;
    }

    /// A message arrived twice.
    pub fn duplicated(&mut self) {
        self.duplicated += 1;
    }

    /// A message arrived after a later one.
    pub fn out_of_order(&mut self) {
        self.out_of_order += 1;
    }

    /// A data message that is not one of ours.
    pub fn foreign(&mut self) {
        self.foreign += 1;
    }

    /// Connections open now.
    pub fn open_now(&self) -> i64 {
        self.open
    }

    /// The interval starting at `start_ns`: everything counted since the last
    /// call. Counters and histograms restart from zero; levels carry on.
    pub fn take(&mut self, start_ns: u64) -> Interval {
        let mut counters = BTreeMap::new();
        let mut put = |name: &str, v: u64| {
            if v > 0 {
                counters.insert(name.to_owned(), v);
            }
        };
        put("connect.ok", self.opened);
        for kind in ConnectError::ALL {
            put(
                &format!("connect.error.{}", kind.label()),
                self.failed[kind.index()],
            );
        }
        put("tls.handshakes.full", self.tls_full);
        put("tls.handshakes.resumed", self.tls_resumed);
        put("connect.abandoned", self.abandoned);
        put("messages.received", self.received);
        put("messages.lost", self.lost);
        put("messages.duplicated", self.duplicated);
        put("messages.out_of_order", self.out_of_order);
        put("messages.foreign", self.foreign);
        put("bytes.in", self.bytes_in);
        counters.append(&mut self.closed);

        let mut histograms = BTreeMap::new();
        for (name, h) in [
            ("connect", &mut self.connect),
            ("connect.service", &mut self.connect_service),
            ("connect.lag", &mut self.connect_lag),
            ("connect.tcp", &mut self.connect_tcp),
            ("connect.tls", &mut self.connect_tls),
            ("connect.upgrade", &mut self.connect_upgrade),
            ("delivery", &mut self.delivery),
        ] {
            if !h.is_empty() {
                histograms.insert(name.to_owned(), h.clone());
                h.reset();
            }
        }
        let gauges = BTreeMap::from([
            ("connections.open".to_owned(), self.open),
            ("connections.target".to_owned(), self.target),
        ]);
        self.opened = 0;
        self.failed = [0; ConnectError::COUNT];
        self.tls_full = 0;
        self.tls_resumed = 0;
        self.abandoned = 0;
        self.received = 0;
        self.lost = 0;
        self.duplicated = 0;
        self.out_of_order = 0;
        self.foreign = 0;
        self.bytes_in = 0;
        Interval {
            start_ns,
            length_ns: self.length_ns,
            source: self.source.clone(),
            counters,
            gauges,
            histograms,
            host: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_counter_slot_and_label() {
        let mut labels = std::collections::BTreeSet::new();
        for (i, k) in ConnectError::ALL.iter().enumerate() {
            assert_eq!(k.index(), i, "{k:?}");
            assert!(labels.insert(k.label()), "{k:?}");
        }
        assert_eq!(labels.len(), ConnectError::COUNT);
    }

    #[test]
    fn take_resets_counts_but_keeps_levels() {
        let mut r = HoldRecorder::new("h/hold-0".into(), 1_000_000_000, 10);
        r.started(5);
        r.opened(1500, 900);
        r.opened(2500, 1000);
        r.failed(ConnectError::Refused);
        r.failed(ConnectError::Tls(TlsFailure::UnknownIssuer));
        r.phases(100, Some(700), 300);
        r.tls_handshake(true);
        r.delivered(300);
        r.lost(2);
        r.closed(Closed::ByServer(Some(1008)));
        let iv = r.take(1_000_000_000);
        assert_eq!(iv.counters["connect.ok"], 2);
        assert_eq!(iv.counters["connect.error.refused"], 1);
        assert_eq!(iv.counters["connect.error.tls.unknown_issuer"], 1);
        assert_eq!(iv.counters["tls.handshakes.resumed"], 1);
        assert_eq!(iv.histograms["connect.tls"].len(), 1);
        assert_eq!(iv.counters["closed.server.1008"], 1);
        assert_eq!(iv.counters["messages.lost"], 2);
        assert_eq!(iv.gauges["connections.open"], 1);
        assert_eq!(iv.gauges["connections.target"], 10);
        assert_eq!(iv.histograms["connect"].len(), 2);
        assert_eq!(iv.histograms["delivery"].len(), 1);
        let next = r.take(2_000_000_000);
        assert!(next.counters.is_empty());
        assert!(next.histograms.is_empty());
        assert_eq!(next.gauges["connections.open"], 1);
    }

    #[test]
    fn classifies_socket_errors() {
        let e = io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert_eq!(ConnectError::from_io(&e), ConnectError::Refused);
        let e = io::Error::from_raw_os_error(libc::EADDRNOTAVAIL);
        assert_eq!(ConnectError::from_io(&e), ConnectError::AddrNotAvailable);
        let e = io::Error::from(io::ErrorKind::UnexpectedEof);
        assert_eq!(ConnectError::from_io(&e), ConnectError::Reset);
    }
}
