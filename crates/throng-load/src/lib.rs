//! The throng load harness: one core ([`harness`]: worker processes,
//! merging, the live view and the result file, one clock, one failure
//! machinery, one recorder interface) with the roles on it, [`hold`]
//! (hold WebSocket connections, publish, check every delivery) and
//! [`attack`] (HTTP load at a set rate), and [`knee`], which runs them at
//! rising levels to find the tipping point; [`bench`](mod@bench), the one-command proof
//! built on `hold`; and what they share: the open-model [`pacer`], the
//! pass/fail [`threshold`]s and the [`tls`] client.
//!
//! No `unsafe` here: every OS call the harness makes (its epoll set, the
//! schedule's timer, signals, socket options) is `throng-host`'s.

#![forbid(unsafe_code)]

pub mod agent;
pub mod attack;
pub mod bench;
pub mod harness;
pub mod hold;
pub mod knee;
pub mod pacer;
pub mod threshold;
pub mod tls;
