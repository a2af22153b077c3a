//! The task that runs a [`Session`] over real sockets: it connects both
//! connections (again, with backoff, after a loss), moves bytes between
//! them and the session, ticks it, and hands its events to the supervisor.
//! Everything the link decides is the session's.

use std::time::Duration;

use bytes::BytesMut;
use throng_client::link::Stream;
use tokio::io::{AsyncReadExt as _, ReadHalf, WriteHalf};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::error::{Conn, SessionError};
use super::session::{Command, Event, Output, PING_EVERY, REPLY_TIMEOUT, Session};
use super::settings::{CONNECT_TIMEOUT, RedisSettings};

/// First and largest pause between reconnection attempts.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Runs the Redis link until the supervisor drops its command sender;
/// `emit` takes each event for the supervisor.
pub(crate) async fn run(
    settings: RedisSettings,
    max_message: usize,
    mut cmds: mpsc::UnboundedReceiver<Command>,
    mut emit: impl FnMut(Event),
) {
    let mut session = Session::new(settings.clone(), max_message);
    let mut backoff = Backoff::default();
    loop {
        let started = Instant::now();
        let (reason, lasted) = match connect(&settings).await {
            Err(why) => (why, None),
            Ok(conns) => match drive(&mut session, conns, &mut cmds, &mut emit).await {
                None => return,
                Some(why) => (why, Some(started.elapsed())),
            },
        };
        let pause = backoff.after(lasted, fastrand::f64());
        emit(Event::Down {
            reason,
            retry_in: pause,
        });
        let until = Instant::now() + pause;
        // With Sentinel, a failover announced meanwhile ends the pause.
        let switch = super::sentinel::watch(settings.sentinels());
        tokio::pin!(switch);
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => break,
                _ = &mut switch => break,
                cmd = cmds.recv() => match cmd {
                    None => return,
                    Some(cmd) => session.on_command(cmd, std::time::Instant::now()),
                },
            }
            while let Some(out) = session.poll_output() {
                if let Output::Event(ev) = out {
                    emit(ev);
                }
            }
        }
    }
}

/// The pauses between reconnection attempts: from [`BACKOFF_MIN`],
/// doubling to [`BACKOFF_MAX`].
struct Backoff {
    /// The pause before jitter for the next failure.
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: BACKOFF_MIN }
    }
}

impl Backoff {
    /// The pause after a failure: `lasted` is how long the session that
    /// failed had been connected (`None`: connecting failed); `jitter` in
    /// `0..1`.
    fn after(&mut self, lasted: Option<Duration>, jitter: f64) -> Duration {
        // A link that worked for a while retries soon; one that breaks as
        // soon as it is made keeps backing off.
        if lasted.is_some_and(|d| d > BACKOFF_MAX * 2) {
            self.next = BACKOFF_MIN;
        }
        // Jitter keeps a fleet of nodes from reconnecting in lockstep.
        let pause = self.next.mul_f64(0.5 + jitter / 2.0);
        self.next = (self.next * 2).min(BACKOFF_MAX);
        pause
    }
}

/// One connection, greeted, and the bytes that came after its greeting.
type Opened = (Stream, BytesMut);

/// Both connections, subscriber first: plain or TLS as the URL says; at
/// the address the sentinels name when the master is found through them.
async fn connect(settings: &RedisSettings) -> Result<(Opened, Opened), SessionError> {
    let master = settings.master().await?;
    let settings = &settings.at(&master);
    let open = || throng_client::redis::open(&settings.url, settings.tls.as_ref(), CONNECT_TIMEOUT);
    let sub = open().await?;
    let publ = open().await?;
    Ok((sub, publ))
}

/// The two halves of each connection.
struct Halves {
    sub_rd: ReadHalf<Stream>,
    sub_wr: WriteHalf<Stream>,
    pub_rd: ReadHalf<Stream>,
    pub_wr: WriteHalf<Stream>,
}

/// Runs the session over connected sockets until something breaks: the
/// reason, or `None` when the supervisor is gone.
async fn drive(
    session: &mut Session,
    ((sub, sub_in), (publ, pub_in)): (Opened, Opened),
    cmds: &mut mpsc::UnboundedReceiver<Command>,
    emit: &mut impl FnMut(Event),
) -> Option<SessionError> {
    let (sub_rd, sub_wr) = tokio::io::split(sub);
    let (pub_rd, pub_wr) = tokio::io::split(publ);
    let mut io = Halves {
        sub_rd,
        sub_wr,
        pub_rd,
        pub_wr,
    };
    let now = std::time::Instant::now();
    session.on_connected();
    let fed = session
        .on_bytes(Conn::Subscriber, &sub_in, now)
        .and_then(|()| session.on_bytes(Conn::Publisher, &pub_in, now));
    let why = match fed {
        Ok(()) => pump(session, &mut io, cmds, emit).await,
        Err(e) => Some(e),
    };
    session.on_closed(why.as_ref().unwrap_or(&SessionError::Stopping));
    // The failures of what was waiting; nothing is written any more.
    while let Some(out) = session.poll_output() {
        if let Output::Event(ev) = out {
            emit(ev);
        }
    }
    why
}

/// Moves bytes, commands and ticks into the session and its outputs out,
/// until a connection fails (the reason) or the supervisor is gone (`None`).
async fn pump(
    session: &mut Session,
    io: &mut Halves,
    cmds: &mut mpsc::UnboundedReceiver<Command>,
    emit: &mut impl FnMut(Event),
) -> Option<SessionError> {
    let mut tick = tokio::time::interval(PING_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sub_buf = BytesMut::with_capacity(64 * 1024);
    let mut pub_buf = BytesMut::with_capacity(16 * 1024);
    // With Sentinel: a failover announced while this master still answers
    // ends the session (pending forever otherwise).
    let switch = super::sentinel::watch(session.settings().sentinels());
    tokio::pin!(switch);
    loop {
        if let Err(e) = flush(session, io, emit).await {
            return Some(e);
        }
        // Backpressure: read the subscriber connection only with a place
        // in hand for the next message.
        let wants_permit = session.wants_permit();
        let in_flight = session.in_flight();
        let fed = tokio::select! {
            p = in_flight.acquire_owned(), if wants_permit => match p {
                Ok(p) => session.on_permit(p, std::time::Instant::now()),
                Err(_) => return None,
            },
            r = io.sub_rd.read_buf(&mut sub_buf), if !wants_permit => {
                read(session, Conn::Subscriber, r, &mut sub_buf)
            }
            r = io.pub_rd.read_buf(&mut pub_buf) => {
                read(session, Conn::Publisher, r, &mut pub_buf)
            }
            cmd = cmds.recv() => match cmd {
                None => return None,
                Some(cmd) => {
                    session.on_command(cmd, std::time::Instant::now());
                    Ok(())
                }
            },
            _ = tick.tick() => session.on_tick(std::time::Instant::now()),
            to = &mut switch => Err(SessionError::Switched(to)),
        };
        if let Err(e) = fed {
            return Some(e);
        }
    }
}

/// Hands what a read of `conn` brought to the session.
fn read(
    session: &mut Session,
    conn: Conn,
    r: std::io::Result<usize>,
    buf: &mut BytesMut,
) -> Result<(), SessionError> {
    match r {
        Ok(0) => Err(SessionError::Closed(conn)),
        Err(e) => Err(SessionError::Read(conn, e)),
        Ok(_) => {
            let fed = session.on_bytes(conn, buf, std::time::Instant::now());
            buf.clear();
            fed
        }
    }
}

/// Writes what the session wants written and hands its events on.
async fn flush(
    session: &mut Session,
    io: &mut Halves,
    emit: &mut impl FnMut(Event),
) -> Result<(), SessionError> {
    while let Some(out) = session.poll_output() {
        match out {
            Output::Event(ev) => emit(ev),
            Output::Write(Conn::Subscriber, bytes) => write(&mut io.sub_wr, &bytes).await?,
            Output::Write(Conn::Publisher, bytes) => write(&mut io.pub_wr, &bytes).await?,
        }
    }
    Ok(())
}

async fn write(w: &mut WriteHalf<Stream>, bytes: &[u8]) -> Result<(), SessionError> {
    match tokio::time::timeout(REPLY_TIMEOUT, throng_client::link::write_all(w, bytes)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(SessionError::Write(e)),
        Err(_) => Err(SessionError::WriteStalled(REPLY_TIMEOUT)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_starts_over_after_a_link_that_lasted() {
        let mut b = Backoff::default();
        let ms = |d: Duration| d.as_millis();
        let pauses: Vec<u128> = (0..8).map(|_| ms(b.after(None, 1.0))).collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        // Broke at once after connecting: still backing off.
        assert_eq!(ms(b.after(Some(Duration::from_secs(1)), 1.0)), 5000);
        // Worked for longer than twice the cap: soon again, jitter halves at most.
        assert_eq!(ms(b.after(Some(Duration::from_secs(11)), 0.0)), 50);
        assert_eq!(ms(b.after(None, 1.0)), 200);
    }
}
