//! The worker side of the core: what every role's worker process does
//! besides its own work. It reads its plan (the first line of its input,
//! JSON), runs one single-threaded tokio runtime, takes [`Order`]s from the
//! supervisor on the following lines, and writes result-file records on
//! its output: one interval per [`Ticker`] tick (with the CPU time the
//! worker used in it, `worker.cpu_us`), events, and a `worker.done` event
//! last.
//!
//! Input and output are any `BufRead` and `Write`: a worker process uses
//! its stdin and stdout; a test drives one in memory.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::io::{self, BufRead, Write};
use std::time::Duration;

use serde::de::DeserializeOwned;
use throng_report::format::{Event, encode_event, encode_interval};
use throng_report::interval::Interval;
use tokio::sync::{Notify, mpsc};

use super::clock::{interval_start, now_unix_ns, start_late};

/// The event of a worker that was ready after the run's start.
pub const LATE: &str = "worker.late";
use super::recorder::Recorder;

/// What the supervisor tells a running worker, one line each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// `publishing <unix_ns>`: the first message is about to be published
    /// at this time (a connection open before it should receive every message).
    Publishing(u64),
    /// `stop <final_seq>`: end the run; the last message published had
    /// this sequence number (0: none, or not a publishing run).
    Stop(u64),
}

impl Order {
    /// The order on `line`; `None` for a line that is not one.
    pub fn parse(line: &str) -> Option<Self> {
        let mut words = line.split_whitespace();
        let word = words.next()?;
        let arg = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
        match word {
            "publishing" => Some(Self::Publishing(arg)),
            "stop" => Some(Self::Stop(arg)),
            _ => None,
        }
    }
}

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Publishing(ns) => write!(f, "publishing {ns}"),
            Self::Stop(seq) => write!(f, "stop {seq}"),
        }
    }
}

/// The orders arriving on the worker's input. The end of the input (the
/// supervisor went away) reads as `Stop(0)`.
#[derive(Debug)]
pub struct Orders(mpsc::UnboundedReceiver<Order>);

impl Orders {
    /// Reads `control` on a thread of its own (it blocks).
    fn start(mut control: impl BufRead + Send + 'static) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            loop {
                line.clear();
                match control.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if let Some(order) = Order::parse(&line)
                    && tx.send(order).is_err()
                {
                    return;
                }
            }
            let _ = tx.send(Order::Stop(0));
        });
        Self(rx)
    }

    /// The next order; `None` once the input has ended and every order was read.
    pub async fn next(&mut self) -> Option<Order> {
        self.0.recv().await
    }
}

/// Reads the plan from the first line of `control`, then runs `work` with
/// it on a single-threaded runtime; the rest of `control` becomes its
/// [`Orders`]. Returns when `work` does.
pub fn run<P, W, F>(mut control: impl BufRead + Send + 'static, work: W) -> io::Result<()>
where
    P: DeserializeOwned,
    W: FnOnce(P, Orders) -> F,
    F: Future<Output = io::Result<()>>,
{
    let mut first = String::new();
    control.read_line(&mut first)?;
    let plan: P = serde_json::from_str(&first).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad worker plan on stdin: {e}"),
        )
    })?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move { work(plan, Orders::start(control)).await })
}

/// [`run`] as a worker process: takes every file the hard limit allows
/// (workers hold the connections), reads stdin, writes to stdout.
pub fn run_process<P, W, F>(work: W) -> io::Result<()>
where
    P: DeserializeOwned,
    W: FnOnce(P, Orders, Box<dyn Write>) -> F,
    F: Future<Output = io::Result<()>>,
{
    throng_host::limits::raise_nofile()
        .map_err(|e| io::Error::new(e.kind(), format!("raising the open-file limit: {e}")))?;
    let stdin = io::BufReader::new(io::stdin());
    run(stdin, |plan, orders| {
        work(plan, orders, Box::new(io::stdout()))
    })
}

/// Where a worker's records go, one line each (its stdout).
pub struct Output {
    /// The worker's label, the `source` of its records (`host/hold-0`).
    label: String,
    out: RefCell<Box<dyn Write>>,
}

impl fmt::Debug for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Output({})", self.label)
    }
}

impl Output {
    /// Records of `label` to `out`.
    pub fn new(label: String, out: Box<dyn Write>) -> Self {
        Self {
            label,
            out: RefCell::new(out),
        }
    }

    /// The worker's label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Writes one record line.
    pub fn line(&self, line: &str) {
        let mut out = self.out.borrow_mut();
        // A supervisor that went away also closes the worker's input, which
        // stops the run; nothing more to do about a failed write here.
        let _ = out
            .write_all(line.as_bytes())
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush());
    }

    /// Writes an event.
    pub fn event(&self, kind: &str, text: String) {
        self.line(&encode_event(&Event {
            at_ns: now_unix_ns(),
            source: self.label.clone(),
            kind: kind.to_owned(),
            text,
        }));
    }

    /// Says the worker was ready `late_ns` after the run's start (see
    /// `clock::start_late`): the supervisor warns about it and sums it up.
    pub fn late(&self, late_ns: u64) {
        self.event(
            LATE,
            format!(
                "ready {:.3} s after the run's start (sending and parsing its plan took longer than the lead); its schedule starts when it was ready, for the whole duration",
                late_ns as f64 / 1e9
            ),
        );
    }

    /// The worker is ready to start its schedule at `start_unix_ns`: one
    /// already past moves to now, and the worker says how late it is.
    pub fn ready(&self, start_unix_ns: &mut u64) {
        if let Some(late) = start_late(start_unix_ns) {
            self.late(late);
        }
    }

    /// Writes an interval.
    pub fn interval(&self, iv: &Interval) {
        self.line(&encode_interval(iv));
    }
}

/// Interval boundaries on the wall clock, shared by every worker so that
/// their records line up.
#[derive(Debug)]
pub struct Ticker {
    length_ns: u64,
    /// The start of the next interval to hand out (0 before the first).
    next_start: Cell<u64>,
    /// This process's CPU time as of the last record, µs.
    cpu_us: Cell<u64>,
}

impl Ticker {
    /// Intervals of `length_ns`.
    pub fn new(length_ns: u64) -> Self {
        Self {
            length_ns: length_ns.max(1),
            next_start: Cell::new(0),
            cpu_us: Cell::new(cpu_us()),
        }
    }

    /// Adds to `iv` the CPU time this process used since the last record
    /// (`worker.cpu_us`): each worker's own, wherever it runs, so a
    /// generator on agents is judged by its CPU too (knee's verdict).
    fn with_cpu(&self, mut iv: Interval) -> Interval {
        let now = cpu_us();
        let used = now.saturating_sub(self.cpu_us.replace(now));
        if used > 0 {
            iv.counters.insert(CPU_COUNTER.to_owned(), used);
        }
        iv
    }

    /// At the end of every interval, writes `rec`'s record for it to `out`
    /// and calls `after`. Runs until dropped (the caller aborts its task).
    pub async fn run(&self, rec: &RefCell<impl Recorder>, out: &Output, mut after: impl FnMut()) {
        let length = self.length_ns;
        loop {
            let now = now_unix_ns();
            let end = (interval_start(now, length) + length).max(self.next_start.get() + length);
            tokio::time::sleep(Duration::from_nanos(end.saturating_sub(now))).await;
            self.next_start.set(end);
            let iv = self.with_cpu(rec.borrow_mut().take(end - length));
            out.interval(&iv);
            after();
        }
    }

    /// Writes the last record, for whatever was counted since the last
    /// tick. The monotonic clock the ticker sleeps on and the wall clock may
    /// disagree by a little: it never reuses a start already written.
    pub fn last(&self, rec: &RefCell<impl Recorder>, out: &Output) {
        let start = interval_start(now_unix_ns(), self.length_ns).max(self.next_start.get());
        let iv = self.with_cpu(rec.borrow_mut().take(start));
        out.interval(&iv);
    }
}

/// The counter of a worker's CPU time in each interval, µs.
pub const CPU_COUNTER: &str = "worker.cpu_us";

fn cpu_us() -> u64 {
    u64::try_from(throng_host::process::process_cpu().as_micros()).unwrap_or(u64::MAX)
}

/// Tasks still running; wakes whoever waits when the count drops to zero.
#[derive(Debug, Default)]
pub struct Live {
    n: Cell<u64>,
    idle: Notify,
}

impl Live {
    /// One more task.
    pub fn add(&self) {
        self.n.set(self.n.get() + 1);
    }

    /// One task ended.
    pub fn done(&self) {
        let left = self.n.get().saturating_sub(1);
        self.n.set(left);
        if left == 0 {
            self.idle.notify_one();
        }
    }

    /// Tasks running.
    pub fn get(&self) -> u64 {
        self.n.get()
    }

    /// Wakes the waiter without a change (the run is stopping).
    pub fn wake(&self) {
        self.idle.notify_one();
    }

    /// Waits for a wake-up: the last task ended, or [`Self::wake`].
    pub async fn changed(&self) {
        self.idle.notified().await;
    }
}

/// The run is ending: set once, and everything waiting on it wakes.
#[derive(Debug, Default)]
pub struct Stop {
    set: Cell<bool>,
    notify: Notify,
}

impl Stop {
    /// Whether the run is ending.
    pub fn is_set(&self) -> bool {
        self.set.get()
    }

    /// Ends the run; `false` if it was already ending.
    pub fn set(&self) -> bool {
        if self.set.replace(true) {
            return false;
        }
        self.notify.notify_waiters();
        true
    }

    /// Resolves when the run ends from now on. Take it before checking
    /// [`Self::is_set`] and waiting: a future taken before [`Self::set`]
    /// is woken by it even if not polled yet.
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_read_and_print_the_same() {
        for order in [Order::Publishing(1_700_000_000_000_000_000), Order::Stop(7)] {
            assert_eq!(Order::parse(&order.to_string()), Some(order));
        }
        assert_eq!(Order::parse("stop"), Some(Order::Stop(0)));
        assert_eq!(Order::parse("stop\n"), Some(Order::Stop(0)));
        assert_eq!(Order::parse("dance 5"), None);
        assert_eq!(Order::parse(""), None);
    }

    #[test]
    fn a_worker_reads_its_plan_then_its_orders_and_ends_on_end_of_input() {
        let input = "{\"n\": 3}\npublishing 42\nnonsense\n";
        let got = std::rc::Rc::new(RefCell::new(Vec::new()));
        let seen = got.clone();
        run(
            io::Cursor::new(input),
            |plan: serde_json::Value, mut orders| async move {
                seen.borrow_mut().push(format!("plan {}", plan["n"]));
                while let Some(order) = orders.next().await {
                    seen.borrow_mut().push(order.to_string());
                }
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(*got.borrow(), ["plan 3", "publishing 42", "stop 0"]);
        let bad = run(
            io::Cursor::new("not json\n"),
            |_: serde_json::Value, _| async { Ok(()) },
        );
        assert_eq!(bad.unwrap_err().kind(), io::ErrorKind::InvalidData);
    }
}
