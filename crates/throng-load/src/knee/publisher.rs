//! The publisher of a `hold` or `publish` level: timestamped messages on
//! an open-model schedule, so that a slow publish endpoint shows up as
//! latency instead of slowing the load down.
//!
//! `hold`'s own publisher makes one call at a time over one connection,
//! which is right for a message a second and wrong for a search: past
//! the rate one connection carries, it would send less than the level
//! asks for and measure nothing of it (coordinated omission). Here each
//! message is due at a time fixed in advance and carries that time in its
//! timestamp, so its delivery latency counts from when it *should* have
//! gone out; calls run concurrently over a pool of up to `connections`
//! keep-alive connections, and waiting for a free one is the publisher's
//! lag. The counts are `hold`'s (`publish.sent`, `publish.ok`,
//! `publish.error.<kind>`, `publish`, `publish.lag`), in the supervisor's
//! own record of each interval.
//!
//! Several calls in flight may arrive out of order; `hold`'s accounting
//! counts a message that was overtaken as lost and then out of order, so
//! the knee takes losses net of late arrivals.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use throng_report::interval::{Interval, new_histogram};
use tokio::sync::Notify;

use crate::harness::Run;
use crate::harness::clock::{Anchor, micros, now_unix_ns};
use crate::harness::recorder::{Take, record};
use crate::harness::worker::Order;
use crate::hold::message;
use crate::hold::publish::Publisher;
use crate::hold::supervisor::{DRAIN, PUBLISH_SETTLE, PUBLISH_TIMEOUT};
use crate::hold::target::PublishTarget;
use crate::pacer::Pacer;

/// How long the workers get between learning when publishing begins and
/// the first message (as `hold` gives them).
const TELL_WORKERS: Duration = Duration::from_millis(50);

/// What a level publishes.
#[derive(Debug, Clone)]
pub struct PublishPlan {
    /// Where.
    pub target: PublishTarget,
    /// The Redis channel (`<prefix><channel>`); unused over HTTP.
    pub redis_channel: String,
    /// Messages per second.
    pub rate: f64,
    /// Bytes per message.
    pub message_size: usize,
    /// Calls in flight at most (one connection each).
    pub connections: usize,
    /// From the first message, how long before measuring starts.
    pub warmup: Duration,
    /// From the first message, how long to publish (warm-up included).
    pub span: Duration,
}

/// What the publisher counted and not yet handed to an interval.
#[derive(Debug)]
struct Counts {
    /// When each call not yet counted started, Unix ns: a message counts in
    /// the interval it went out in.
    sent_at: Vec<u64>,
    ok: u64,
    errors: BTreeMap<String, u64>,
    call: Histogram<u64>,
    lag: Histogram<u64>,
    /// The first failure, shown once.
    first_error: Option<String>,
}

/// A level's publisher, shared by the level's role and the publishing task.
#[derive(Debug)]
pub struct Publishing {
    plan: PublishPlan,
    counts: RefCell<Counts>,
    /// Every worker opened (or failed) its connections.
    ramp_done: Cell<bool>,
    woken: Notify,
    /// Stop publishing (the run is stopping).
    stop: Cell<bool>,
    /// When measuring starts (Unix ns); `u64::MAX` until publishing begins.
    window_from: Cell<u64>,
    /// When the last message is due (Unix ns); `u64::MAX` until known.
    window_to: Cell<u64>,
    /// The last sequence number sent.
    last_seq: Cell<u64>,
    /// Publishing is over and the workers were told the last message.
    finished: Cell<bool>,
}

impl Publishing {
    /// A publisher by `plan`, not started.
    pub fn new(plan: PublishPlan) -> Self {
        Self {
            plan,
            counts: RefCell::new(Counts {
                sent_at: Vec::new(),
                ok: 0,
                errors: BTreeMap::new(),
                call: new_histogram(),
                lag: new_histogram(),
                first_error: None,
            }),
            ramp_done: Cell::new(false),
            woken: Notify::new(),
            stop: Cell::new(false),
            window_from: Cell::new(u64::MAX),
            window_to: Cell::new(u64::MAX),
            last_seq: Cell::new(0),
            finished: Cell::new(false),
        }
    }

    /// Every worker has opened (or failed) its share: publishing may begin.
    pub fn ramp_done(&self) {
        self.ramp_done.set(true);
        self.woken.notify_one();
    }

    /// Stops publishing; the task still tells the workers the last message.
    pub fn stop(&self) {
        self.stop.set(true);
        self.woken.notify_one();
    }

    /// Publishing is over and the workers were told the last message.
    pub fn finished(&self) -> bool {
        self.finished.get()
    }

    /// When measuring starts and when the last message was due, Unix ns
    /// (`u64::MAX` until known).
    pub fn window(&self) -> (u64, u64) {
        (self.window_from.get(), self.window_to.get())
    }

    /// The publisher's counts for the interval at `start_ns`, as `hold`
    /// names them.
    pub fn own(&self, start_ns: u64, length_ns: u64) -> Interval {
        let mut c = self.counts.borrow_mut();
        let c = &mut *c;
        let end = start_ns + length_ns;
        let before = c.sent_at.len();
        c.sent_at.retain(|&at| at >= end);
        let mut sent = (before - c.sent_at.len()) as u64;
        let mut t = Take::default();
        t.count("publish.sent", &mut sent)
            .count("publish.ok", &mut c.ok)
            .histogram("publish", &mut c.call)
            .histogram("publish.lag", &mut c.lag);
        for (kind, mut n) in std::mem::take(&mut c.errors) {
            t.count(&format!("publish.error.{kind}"), &mut n);
        }
        t.into_interval(start_ns, length_ns, String::new())
    }

    /// Waits until the ramp is done; `false` if told to stop first.
    async fn wait_for_ramp(&self) -> bool {
        loop {
            if self.stop.get() {
                return false;
            }
            if self.ramp_done.get() {
                return true;
            }
            self.woken.notified().await;
        }
    }
}

/// The pool of publish connections: idle ones, and how many exist.
struct Pool {
    idle: RefCell<Vec<Publisher>>,
    open: Cell<usize>,
    freed: Notify,
    in_flight: Cell<usize>,
}

/// Publishes the level's messages, then tells the workers the last one and
/// marks the publisher finished.
pub async fn publish(p: Rc<Publishing>, run: Rc<Run>) {
    if p.wait_for_ramp().await {
        tokio::time::sleep(PUBLISH_SETTLE).await;
        if !p.stop.get() {
            send_all(&p, &run).await;
        }
    }
    run.crew().stop_all(&Order::Stop(p.last_seq.get()));
    p.finished.set(true);
}

async fn send_all(p: &Rc<Publishing>, run: &Rc<Run>) {
    let Ok(pacer) = Pacer::constant(p.plan.rate) else {
        return;
    };
    // Tell the workers first, so a connection open before the first
    // message expects sequence number 1.
    run.crew().tell_all(&Order::Publishing(now_unix_ns()));
    tokio::time::sleep(TELL_WORKERS).await;
    let anchor = Anchor::at_unix_ns(now_unix_ns());
    let start = anchor.instant();
    p.window_from.set(anchor.unix_ns_of(start + p.plan.warmup));
    p.window_to.set(anchor.unix_ns_of(start + p.plan.span));
    let pool = Rc::new(Pool {
        idle: RefCell::new(Vec::new()),
        open: Cell::new(0),
        freed: Notify::new(),
        in_flight: Cell::new(0),
    });
    let mut seq = 0u64;
    loop {
        let due = pacer.intended(seq);
        if due >= p.plan.span {
            break;
        }
        let intended = start + due;
        while Instant::now() < intended && !p.stop.get() {
            let step = intended.min(Instant::now() + Duration::from_millis(100));
            tokio::time::sleep_until(step.into()).await;
        }
        if p.stop.get() {
            break;
        }
        let publisher = loop {
            if let Some(one) = pool.idle.borrow_mut().pop() {
                break one;
            }
            if pool.open.get() < p.plan.connections.max(1) {
                pool.open.set(pool.open.get() + 1);
                break Publisher::new(
                    p.plan.target.clone(),
                    p.plan.redis_channel.clone(),
                    PUBLISH_TIMEOUT,
                )
                .numbered(pool.open.get());
            }
            pool.freed.notified().await;
        };
        seq += 1;
        p.last_seq.set(seq);
        pool.in_flight.set(pool.in_flight.get() + 1);
        let lag = micros(Instant::now().saturating_duration_since(intended));
        tokio::task::spawn_local(call(
            p.clone(),
            pool.clone(),
            publisher,
            seq,
            anchor.unix_ns_of(intended),
            lag,
        ));
    }
    // Let calls in flight end (each has its timeout), then messages land.
    let deadline = Instant::now() + PUBLISH_TIMEOUT;
    while pool.in_flight.get() > 0 && Instant::now() < deadline {
        let _ = tokio::time::timeout(Duration::from_millis(100), pool.freed.notified()).await;
    }
    tokio::time::sleep(DRAIN).await;
}

/// One publish call: message `seq`, due at `intended_ns`, started `lag_us` late.
async fn call(
    p: Rc<Publishing>,
    pool: Rc<Pool>,
    mut publisher: Publisher,
    seq: u64,
    intended_ns: u64,
    lag_us: u64,
) {
    let mut body = Vec::with_capacity(p.plan.message_size.max(message::MAX_HEADER));
    // The due time, not the send time: a late call's delay is in its deliveries.
    message::encode(&mut body, seq, intended_ns, p.plan.message_size);
    let began = Instant::now();
    {
        let mut c = p.counts.borrow_mut();
        c.sent_at.push(now_unix_ns());
        record(&mut c.lag, lag_us);
    }
    // A knee judges the publish endpoint by its answers: one that came late
    // or not at all is an error here, whatever reached the subscribers.
    let result = publisher.publish(&body, &mut || {}).await.answer;
    {
        let mut c = p.counts.borrow_mut();
        record(&mut c.call, micros(began.elapsed()));
        match result {
            Ok(_) => c.ok += 1,
            Err(e) => {
                *c.errors.entry(e.label().to_owned()).or_insert(0) += 1;
                if c.first_error.is_none() {
                    eprintln!("throng knee: publish failed (first error shown): {e}");
                    c.first_error = Some(e.to_string());
                }
            }
        }
    }
    pool.idle.borrow_mut().push(publisher);
    pool.in_flight.set(pool.in_flight.get() - 1);
    pool.freed.notify_one();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> PublishPlan {
        PublishPlan {
            target: "http://127.0.0.1:9/publish/x".parse().unwrap(),
            redis_channel: "throng:x".into(),
            rate: 10.0,
            message_size: 64,
            connections: 4,
            warmup: Duration::from_secs(1),
            span: Duration::from_secs(3),
        }
    }

    #[test]
    fn a_message_counts_in_the_interval_it_went_out_in() {
        let p = Publishing::new(plan());
        let sec = 1_000_000_000;
        {
            let mut c = p.counts.borrow_mut();
            c.sent_at.extend([10 * sec + 5, 10 * sec + 7, 12 * sec]);
            c.ok = 2;
            c.errors.insert("timeout".into(), 1);
        }
        let first = p.own(10 * sec, sec);
        assert_eq!(first.counter("publish.sent"), 2);
        assert_eq!(first.counter("publish.ok"), 2);
        assert_eq!(first.counter("publish.error.timeout"), 1);
        let second = p.own(11 * sec, sec);
        assert_eq!(second.counter("publish.sent"), 0);
        assert_eq!(p.own(12 * sec, sec).counter("publish.sent"), 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_publisher_told_to_stop_before_the_ramp_never_publishes() {
        let p = Publishing::new(plan());
        p.stop();
        assert!(!p.wait_for_ramp().await);
        assert_eq!(p.window(), (u64::MAX, u64::MAX));
        p.ramp_done();
        assert!(!p.wait_for_ramp().await, "a stop wins over a late ramp");
    }
}
