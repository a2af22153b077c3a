//! What a `/ping` request asked for and what is left of its answer, sans
//! I/O: the parts still to write, the waits before them and the deadline
//! ([`Answer`], 24 bytes). The route (`routes::ping`) writes the parts; a
//! long wait is spent with the worker's sleepers ([`super::sleepers`]),
//! which hold this and the socket.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use throng_proto::http::{self, Request};

/// The answer's body, once and `times` more.
const PONG: &[u8] = b"pong";

/// A sleep at least this long is spent outside the connection's task.
const LEAVE_TASK: Duration = Duration::from_millis(100);

/// What one `/ping` request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ask {
    /// Longest wait before each `pong`, ms (0: none).
    pub(crate) sleep_ms: u64,
    /// `pong`s after the first.
    pub(crate) times: u64,
}

/// Why a `/ping` request's `sleep` or `times` header was refused (400);
/// the text is the answer's body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BadAsk {
    /// The header's number is over this server's limit (`--max-sleep`,
    /// `--max-times`).
    #[error("header '{name}: {text}' is over this server's limit of {max}{unit}\n")]
    OverLimit {
        name: &'static str,
        text: String,
        max: u64,
        unit: &'static str,
    },
    /// The header is not a whole number.
    #[error("header '{name}: {text}' is not a whole number{unit}\n")]
    NotANumber {
        name: &'static str,
        text: String,
        unit: &'static str,
    },
}

/// Reads `sleep` and `times`, within `max_sleep` and `max_times`.
pub(crate) fn parse(req: &Request, max_sleep: Duration, max_times: u64) -> Result<Ask, BadAsk> {
    let max_sleep_ms = u64::try_from(max_sleep.as_millis()).unwrap_or(u64::MAX);
    let number = |name: &'static str, max: u64, unit: &'static str| -> Result<u64, BadAsk> {
        let Some(raw) = req.header(name) else {
            return Ok(0);
        };
        let text = String::from_utf8_lossy(raw);
        let text = text.trim();
        let value = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            text.parse::<u64>().ok()
        } else {
            None
        };
        match value {
            Some(v) if v <= max => Ok(v),
            Some(_) => Err(BadAsk::OverLimit {
                name,
                text: text.to_owned(),
                max,
                unit,
            }),
            None => Err(BadAsk::NotANumber {
                name,
                text: text.to_owned(),
                unit,
            }),
        }
    };
    Ok(Ask {
        sleep_ms: number("sleep", max_sleep_ms, " ms")?,
        times: number("times", max_times, "")?,
    })
}

/// What is left of a `/ping` answer: the parts still to write and the
/// waits before them. Small on purpose: a sleeping request is this, its
/// socket and a place in the sleepers' queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    /// Longest wait before each part, ms (49 days at most).
    sleep_ms: u32,
    /// Pongs after the first still to write.
    left: u32,
    /// The first part (the head, or the whole answer) is still to write.
    first: bool,
    /// More than one pong: parts of a body (chunked for HTTP/1.1).
    parts: bool,
    chunked: bool,
    /// The connection stays open after the answer.
    keep: bool,
    /// The wait ends at `--request-timeout`: the answer is cut off then.
    expired: bool,
    /// The wait before the next part was spent (with the sleepers): write it now.
    due: bool,
    /// `--request-timeout` from the request's start.
    deadline: Moment,
}

/// An instant in 8 bytes (an `Instant` takes 16): nanoseconds from the
/// first one made in this process. One made of an earlier instant is that
/// first one (a deadline already past stays past).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Moment(u64);

/// The instant [`Moment`]s count from.
static EPOCH: OnceLock<Instant> = OnceLock::new();

impl Moment {
    fn of(t: Instant) -> Self {
        let epoch = *EPOCH.get_or_init(Instant::now);
        Self(u64::try_from(t.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX))
    }

    fn instant(self) -> Instant {
        *EPOCH.get_or_init(Instant::now) + Duration::from_nanos(self.0)
    }
}

/// Where an answer's next wait ends ([`Answer::wait`]).
pub(crate) enum Wait {
    /// Spent in the connection's task, until then.
    Here(Instant),
    /// Long: spent with the sleepers, until then.
    Away(Instant),
}

impl Answer {
    /// The answer to `ask` of `req`, cut off at `deadline`.
    pub(crate) fn new(ask: Ask, req: &Request, deadline: Instant) -> Self {
        // Several answers: chunked for HTTP/1.1; an HTTP/1.0 client gets a
        // body that ends when the connection closes.
        let parts = ask.times > 0;
        let chunked = parts && req.minor_version >= 1;
        Self {
            // Both within --max-sleep and --max-times; past u32, the most it holds.
            sleep_ms: u32::try_from(ask.sleep_ms).unwrap_or(u32::MAX),
            left: u32::try_from(ask.times).unwrap_or(u32::MAX),
            first: true,
            parts,
            chunked,
            keep: req.keep_alive() && (!parts || chunked),
            expired: false,
            due: false,
            deadline: Moment::of(deadline),
        }
    }

    /// Its wait reached `--request-timeout`: it is cut off.
    pub(crate) fn expired(&self) -> bool {
        self.expired
    }

    /// Whether its wait was spent with the sleepers (its next part is due
    /// now); asking clears it.
    pub(crate) fn take_due(&mut self) -> bool {
        std::mem::take(&mut self.due)
    }

    /// `Some(keep)` once every part is written: whether the connection
    /// stays open.
    pub(crate) fn done(&self) -> Option<bool> {
        (!self.first && self.left == 0).then_some(self.keep)
    }

    /// The wait before its next part from `now`: a random 0..=`sleep_ms`,
    /// cut off at the deadline; one of [`LEAVE_TASK`] or more is spent
    /// away when it `may_leave` (the part is then due when it comes back).
    pub(crate) fn wait(&mut self, now: Instant, may_leave: bool) -> Wait {
        let ms = if self.sleep_ms > 0 {
            fastrand::u32(0..=self.sleep_ms)
        } else {
            0
        };
        let mut wake = now + Duration::from_millis(u64::from(ms));
        let deadline = self.deadline.instant();
        if wake >= deadline {
            // Cut off at --request-timeout, whether it waits here or there.
            wake = deadline;
            self.expired = true;
        }
        if may_leave && wake - now >= LEAVE_TASK {
            self.due = !self.expired;
            return Wait::Away(wake);
        }
        Wait::Here(wake)
    }

    /// Encodes the part that is due into `out` (and the end of the body
    /// after the last pong).
    pub(crate) fn part(&mut self, out: &mut Vec<u8>) {
        let conn = if self.keep { "keep-alive" } else { "close" };
        if self.first {
            self.first = false;
            if !self.parts {
                http::write_response(
                    out,
                    200,
                    &[("Content-Type", "text/plain"), ("Connection", conn)],
                    PONG,
                );
            } else {
                let mut headers = vec![("Content-Type", "text/plain"), ("Connection", conn)];
                if self.chunked {
                    headers.push(("Transfer-Encoding", "chunked"));
                }
                http::write_response_head(out, 200, &headers);
                push_pong(out, self.chunked);
            }
        } else {
            self.left -= 1;
            push_pong(out, self.chunked);
        }
        if self.parts && self.left == 0 && self.chunked {
            http::write_chunk(out, b"");
        }
    }
}

fn push_pong(out: &mut Vec<u8>, chunked: bool) {
    if chunked {
        http::write_chunk(out, PONG);
    } else {
        out.extend_from_slice(PONG);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_and_its_moment_are_small_and_exact() {
        assert_eq!(size_of::<Answer>(), 24);
        let t = Instant::now() + Duration::from_millis(1234);
        assert_eq!(Moment::of(t).instant(), t);
    }

    fn req(headers: &[(&str, &str)]) -> Request {
        Request {
            method: "POST".into(),
            target: "/ping".into(),
            minor_version: 1,
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
                .collect(),
        }
    }

    #[test]
    fn sleep_and_times() {
        let max = Duration::from_secs(3600);
        assert_eq!(
            parse(&req(&[]), max, 1000),
            Ok(Ask {
                sleep_ms: 0,
                times: 0
            })
        );
        assert_eq!(
            parse(&req(&[("Sleep", "5000"), ("times", " 2 ")]), max, 1000),
            Ok(Ask {
                sleep_ms: 5000,
                times: 2
            })
        );
        for bad in [
            ("sleep", "-1"),
            ("sleep", "1.5"),
            ("sleep", "soon"),
            ("sleep", ""),
            ("times", "1001"),
            ("sleep", "3600001"),
        ] {
            let e = parse(&req(&[bad]), max, 1000).unwrap_err().to_string();
            assert!(e.contains(bad.0), "{bad:?}: {e}");
        }
        assert_eq!(
            parse(&req(&[("times", "1001")]), max, 1000)
                .unwrap_err()
                .to_string(),
            "header 'times: 1001' is over this server's limit of 1000\n"
        );
        assert!(parse(&req(&[("sleep", "99999999999999999999999")]), max, 1000).is_err());
    }

    #[test]
    fn an_answer_of_three_pongs_is_one_chunked_response_in_three_parts() {
        Moment::of(Instant::now());
        let now = Instant::now();
        let ask = Ask {
            sleep_ms: 0,
            times: 2,
        };
        let mut a = Answer::new(ask, &req(&[]), now + Duration::from_secs(1));
        let mut parts = Vec::new();
        while a.done().is_none() {
            assert!(matches!(a.wait(now, true), Wait::Here(at) if at == now));
            let mut out = Vec::new();
            a.part(&mut out);
            parts.push(String::from_utf8(out).unwrap());
        }
        assert_eq!(a.done(), Some(true), "HTTP/1.1 keeps the connection");
        assert_eq!(parts.len(), 3);
        assert!(parts[0].starts_with("HTTP/1.1 200 OK\r\n"), "{}", parts[0]);
        assert!(parts[0].contains("Transfer-Encoding: chunked\r\n"));
        assert!(
            parts[0].ends_with("\r\n\r\n4\r\npong\r\n"),
            "{:?}",
            parts[0]
        );
        assert_eq!(parts[1], "4\r\npong\r\n");
        assert_eq!(parts[2], "4\r\npong\r\n0\r\n\r\n");
    }

    #[test]
    fn a_wait_past_the_deadline_cuts_the_answer_off_and_no_sleep_waits_here() {
        // Moments count from the first one made: made before `now`.
        Moment::of(Instant::now());
        let now = Instant::now();
        let ask = Ask {
            sleep_ms: 0,
            times: 0,
        };
        let mut a = Answer::new(ask, &req(&[]), now + Duration::from_millis(50));
        let later = now + Duration::from_millis(10);
        assert!(
            matches!(a.wait(later, true), Wait::Here(_)),
            "no sleep asked"
        );
        assert!(!a.expired() && !a.take_due());
        let ask = Ask {
            sleep_ms: 1,
            times: 0,
        };
        // Past the deadline: the wait ends there, the answer is cut off,
        // and nothing is due when it comes back.
        let mut a = Answer::new(ask, &req(&[]), now);
        assert!(matches!(a.wait(later, true), Wait::Here(at) if at == now));
        assert!(a.expired() && !a.take_due());
    }
}
