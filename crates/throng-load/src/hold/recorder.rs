//! What a `hold` worker counts while it runs, turned into one
//! [`Interval`] per second ([`Recorder::take`]).
//!
//! Names in the interval (the result-file contract, `docs/results-format.md`):
//! counters `connect.ok`, `connect.error.<kind>` ([`ConnectError`]),
//! `connect.abandoned`, `tls.handshakes.full`/`.resumed`,
//! `messages.received`/`.lost`/`.duplicated`/`.out_of_order`/`.foreign`,
//! `bytes.in`, `closed.<how>` ([`Closed`]); gauges `connections.open`,
//! `connections.target`; histograms (µs) `connect` (from the intended
//! start), `connect.service` (from the actual start), `connect.lag`,
//! `connect.tcp`, `connect.tls`, `connect.upgrade`, `delivery`.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use throng_report::fanout::{MessageId, Spread};
use throng_report::interval::{Interval, new_histogram};

use super::sequence::Arrival;
use crate::harness::failure::{Failure, NetCause, OwnKind, Tally};
use crate::harness::recorder::{Level, Recorder, Take, record};

/// `hold`'s own ways for a connection to fail, beside the socket's and TLS's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handshake {
    /// The server answered the upgrade with a status other than 101.
    BadStatus,
    /// The answer was not a valid WebSocket handshake (bad head, wrong accept key).
    BadHandshake,
}

impl OwnKind for Handshake {
    const ALL: &'static [Self] = &[Self::BadStatus, Self::BadHandshake];
    // A server that hangs up during the TLS handshake reset the connection.
    const TLS_CLOSED: Failure<Self> = Failure::Net(NetCause::Reset);

    fn label(self) -> &'static str {
        match self {
            Self::BadStatus => "bad_status",
            Self::BadHandshake => "bad_handshake",
        }
    }
}

/// Why a connection could not be opened; each kind is its own counter
/// (`connect.error.<label>`).
pub type ConnectError = Failure<Handshake>;

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
    /// MQTT: no PINGRESP came before the next PINGREQ was due (`closed.keepalive`).
    KeepAlive,
    /// Nothing at all arrived for `--read-timeout` (`closed.read_timeout`).
    ReadTimeout,
}

/// Per-interval counts and histograms of one `hold` worker.
#[derive(Debug)]
pub struct HoldRecorder {
    source: String,
    length_ns: u64,
    /// Connections open now (a level, not reset per interval).
    open: Level,
    /// Connections this worker will attempt in total (a level).
    target: i64,
    opened: u64,
    failed: Tally<Handshake>,
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
    /// Messages the server made, timed by their own stamp (`--stamp`).
    pushed: u64,
    delivery_pushed: Histogram<u64>,
    /// When each message the server made (`--stamp`) arrived here, over
    /// the whole run: its fan-out spread, said at the worker's end.
    arrivals: Spread,
    /// Per message (index: sequence number - 1), over the whole run:
    /// deliveries, their latencies' sum and the largest, µs. 24 bytes a
    /// message; what the worker says at its end ([`Self::messages`]).
    messages: Vec<MessageTally>,
}

/// The most messages counted one by one (a longer run counts the rest in
/// the totals only).
pub const MAX_MESSAGES_TALLIED: u64 = 100_000;

/// One message's deliveries on one worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MessageTally {
    /// Its sequence number.
    pub seq: u64,
    /// Deliveries.
    pub count: u64,
    /// Their latencies added, µs.
    pub sum_us: u64,
    /// The largest latency: the last subscriber, µs.
    pub max_us: u64,
}

/// How a `worker.messages` event's text starts: what its numbers are.
const TALLIES_HEAD: &str = "deliveries per message (seq count sum_us max_us): ";

impl MessageTally {
    /// The text of a `worker.messages` event: plain words and numbers
    /// (`...: 1 150 1440466 9000; 2 150 ...`), so a report shows it as it
    /// shows any event, and its numbers group it with other workers'.
    pub fn to_text(tallies: &[Self]) -> String {
        let each: Vec<String> = tallies
            .iter()
            .map(|t| format!("{} {} {} {}", t.seq, t.count, t.sum_us, t.max_us))
            .collect();
        format!("{TALLIES_HEAD}{}", each.join("; "))
    }

    /// The tallies of [`MessageTally::to_text`]; `None` for any other text.
    pub fn parse_text(text: &str) -> Option<Vec<Self>> {
        let list = text.strip_prefix(TALLIES_HEAD)?;
        list.split("; ")
            .filter(|t| !t.is_empty())
            .map(|t| {
                let n: Vec<u64> = t
                    .split(' ')
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .ok()?;
                match n[..] {
                    [seq, count, sum_us, max_us] => Some(Self {
                        seq,
                        count,
                        sum_us,
                        max_us,
                    }),
                    _ => None,
                }
            })
            .collect()
    }
}

impl HoldRecorder {
    /// A recorder for `source` (`"host/hold-0"`) with intervals of
    /// `length_ns`, for a worker that will open `target` connections.
    pub fn new(source: String, length_ns: u64, target: u64) -> Self {
        Self {
            source,
            length_ns,
            open: Level::default(),
            target: i64::try_from(target).unwrap_or(i64::MAX),
            opened: 0,
            failed: Tally::default(),
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
            pushed: 0,
            delivery_pushed: new_histogram(),
            arrivals: Spread::default(),
            messages: Vec::new(),
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
        self.open.up();
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
        self.failed.add(kind);
    }

    /// A connection still opening when the run stopped was given up.
    pub fn abandoned(&mut self) {
        self.abandoned += 1;
    }

    /// A held connection ended.
    pub fn closed(&mut self, how: Closed) {
        self.open.down();
        let name = match how {
            Closed::ByServer(Some(code)) => format!("closed.server.{code}"),
            Closed::ByServer(None) => "closed.server.none".to_owned(),
            Closed::Eof => "closed.eof".to_owned(),
            Closed::Reset => "closed.reset".to_owned(),
            Closed::Protocol => "closed.protocol".to_owned(),
            Closed::Clean => "closed.clean".to_owned(),
            Closed::CloseTimeout => "closed.timeout".to_owned(),
            Closed::Tls => "closed.tls".to_owned(),
            Closed::KeepAlive => "closed.keepalive".to_owned(),
            Closed::ReadTimeout => "closed.read_timeout".to_owned(),
        };
        *self.closed.entry(name).or_insert(0) += 1;
    }

    /// `n` bytes arrived on a held connection.
    pub fn bytes_in(&mut self, n: usize) {
        self.bytes_in += n as u64;
    }

    /// Message `seq` arrived `latency_us` after it was published, and
    /// meant `arrival` for its connection's sequence.
    pub fn delivered(&mut self, seq: u64, latency_us: u64, arrival: Arrival) {
        self.received += 1;
        record(&mut self.delivery, latency_us);
        if (1..=MAX_MESSAGES_TALLIED).contains(&seq) {
            let i = (seq - 1) as usize;
            if self.messages.len() <= i {
                self.messages.resize(i + 1, MessageTally::default());
            }
            let m = &mut self.messages[i];
            m.seq = seq;
            m.count += 1;
            m.sum_us = m.sum_us.saturating_add(latency_us);
            m.max_us = m.max_us.max(latency_us);
        }
        match arrival {
            Arrival::Next { lost } => self.lost += lost,
            Arrival::Duplicate => self.duplicated += 1,
            Arrival::OutOfOrder => self.out_of_order += 1,
        }
    }

    /// `n` messages never arrived (the tail a connection missed at the end).
    pub fn lost(&mut self, n: u64) {
        self.lost += n;
    }

    /// A data message that is not one of ours; `id`: what tells it from
    /// the server's other messages, when they are measured (`--stamp`).
    pub fn foreign(&mut self, id: Option<MessageId>, now_ns: u64) {
        self.foreign += 1;
        if let Some(id) = id {
            self.arrivals.arrived(id, now_ns);
        }
    }

    /// A message the server made (not ours), `id`, arrived at `now_ns`,
    /// `latency_us` after the send time it holds (`--stamp`).
    /// `arrival`: what its own sequence number meant for its connection
    /// (gaps are losses, as for ours).
    pub fn pushed(
        &mut self,
        id: MessageId,
        now_ns: u64,
        latency_us: u64,
        arrival: Option<Arrival>,
    ) {
        self.pushed += 1;
        record(&mut self.delivery_pushed, latency_us);
        self.arrivals.arrived(id, now_ns);
        match arrival {
            Some(Arrival::Next { lost }) => self.lost += lost,
            Some(Arrival::Duplicate) => self.duplicated += 1,
            Some(Arrival::OutOfOrder) => self.out_of_order += 1,
            None => {}
        }
    }

    /// Connections open now.
    pub fn open_now(&self) -> i64 {
        self.open.get()
    }

    /// When each message the server made arrived here so far.
    pub fn arrivals(&self) -> &Spread {
        &self.arrivals
    }

    /// Each message's deliveries here so far, those that had any.
    pub fn messages(&self) -> Vec<MessageTally> {
        self.messages
            .iter()
            .filter(|m| m.count > 0)
            .copied()
            .collect()
    }
}

impl Recorder for HoldRecorder {
    fn take(&mut self, start_ns: u64) -> Interval {
        let mut t = Take::default();
        t.count("connect.ok", &mut self.opened);
        self.failed.take_into("connect.error", &mut t);
        t.count("tls.handshakes.full", &mut self.tls_full)
            .count("tls.handshakes.resumed", &mut self.tls_resumed)
            .count("connect.abandoned", &mut self.abandoned)
            .count("messages.received", &mut self.received)
            .count("messages.lost", &mut self.lost)
            .count("messages.duplicated", &mut self.duplicated)
            .count("messages.out_of_order", &mut self.out_of_order)
            .count("messages.foreign", &mut self.foreign)
            .count("messages.pushed", &mut self.pushed)
            .count("bytes.in", &mut self.bytes_in)
            .counts(&mut self.closed)
            .histogram("connect", &mut self.connect)
            .histogram("connect.service", &mut self.connect_service)
            .histogram("connect.lag", &mut self.connect_lag)
            .histogram("connect.tcp", &mut self.connect_tcp)
            .histogram("connect.tls", &mut self.connect_tls)
            .histogram("connect.upgrade", &mut self.connect_upgrade)
            .histogram("delivery", &mut self.delivery)
            .histogram("delivery.pushed", &mut self.delivery_pushed)
            .level("connections.open", &mut self.open)
            .gauge("connections.target", self.target);
        t.into_interval(start_ns, self.length_ns, self.source.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hold::sequence::Sequence;
    use crate::tls::TlsFailure;

    #[test]
    fn take_resets_counts_but_keeps_levels() {
        let mut r = HoldRecorder::new("h/hold-0".into(), 1_000_000_000, 10);
        r.started(5);
        r.opened(1500, 900);
        r.opened(2500, 1000);
        r.failed(Failure::Net(NetCause::Refused));
        r.failed(Failure::Tls(TlsFailure::UnknownIssuer));
        r.failed(Failure::Own(Handshake::BadStatus));
        r.phases(100, Some(700), 300);
        r.tls_handshake(true);
        r.delivered(1, 300, Arrival::Next { lost: 2 });
        r.closed(Closed::ByServer(Some(1008)));
        let iv = r.take(1_000_000_000);
        assert_eq!(iv.counter("connect.ok"), 2);
        assert_eq!(iv.counter("connect.error.refused"), 1);
        assert_eq!(iv.counter("connect.error.tls.unknown_issuer"), 1);
        assert_eq!(iv.counter("connect.error.bad_status"), 1);
        assert_eq!(iv.counter("tls.handshakes.resumed"), 1);
        assert_eq!(iv.histograms["connect.tls"].len(), 1);
        assert_eq!(iv.counter("closed.server.1008"), 1);
        assert_eq!(iv.counter("messages.lost"), 2);
        assert_eq!(iv.gauges["connections.open"], 1);
        assert_eq!(iv.gauges["connections.target"], 10);
        assert_eq!(iv.histograms["connect"].len(), 2);
        assert_eq!(iv.histograms["delivery"].len(), 1);
        let next = r.take(2_000_000_000);
        assert!(next.counters.is_empty());
        assert!(next.histograms.is_empty());
        assert_eq!(next.gauges["connections.open"], 1);
    }

    /// The worker's accounting in memory: two subscribers, one that opened
    /// before publishing began and one after, fed what arrives.
    #[test]
    fn deliveries_are_counted_as_their_sequences_say() {
        let mut r = HoldRecorder::new("h/hold-0".into(), 1_000_000_000, 2);
        let mut subscribers = [Sequence::new(10), Sequence::new(30)];
        for (seq, who) in [(1, 0), (2, 1), (3, 0), (3, 0)] {
            let arrival = subscribers[who].receive(seq, 20);
            r.delivered(seq, 100 * seq, arrival);
        }
        let [early, late] = subscribers;
        r.lost(early.missing_at_end(4, 20) + late.missing_at_end(4, 20));
        let iv = r.take(0);
        assert_eq!(iv.counter("messages.received"), 4);
        // early: 2 skipped, 4 missing at the end; late: 3 and 4 missing at the end.
        assert_eq!(iv.counter("messages.lost"), 4);
        assert_eq!(iv.counter("messages.duplicated"), 1);
        assert_eq!(iv.counter("messages.out_of_order"), 0);
        // Per message over the run: message 3 twice (once a duplicate).
        let tally = |seq, count, sum_us, max_us| MessageTally {
            seq,
            count,
            sum_us,
            max_us,
        };
        assert_eq!(
            r.messages(),
            [
                tally(1, 1, 100, 100),
                tally(2, 1, 200, 200),
                tally(3, 2, 600, 300)
            ]
        );
    }

    #[test]
    fn message_tallies_read_back_from_their_text_and_nothing_else_does() {
        let t = [
            MessageTally {
                seq: 1,
                count: 150,
                sum_us: 1_440_466,
                max_us: 9_000,
            },
            MessageTally {
                seq: 2,
                count: 149,
                sum_us: 1_380_000,
                max_us: 8_800,
            },
        ];
        let text = MessageTally::to_text(&t);
        assert!(
            text.ends_with(": 1 150 1440466 9000; 2 149 1380000 8800"),
            "{text}"
        );
        assert_eq!(MessageTally::parse_text(&text).as_deref(), Some(&t[..]));
        assert_eq!(
            MessageTally::parse_text(&MessageTally::to_text(&[])),
            Some(vec![])
        );
        for bad in [
            "150 connections attempted",
            &text.replace("9000", "9x00"),
            &text.replace("; 2 149 1380000 8800", "; 2 149 1380000"),
            &text.replace("1 150", "1 -150"),
        ] {
            assert_eq!(MessageTally::parse_text(bad), None, "{bad}");
        }
    }
}
