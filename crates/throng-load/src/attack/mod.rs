//! `throng attack`: HTTP/1.1 load at a set request rate (open model), or the
//! most a closed pool of connections can do, measured without coordinated
//! omission.
//!
//! Every request's latency counts from its *intended* start, fixed by the
//! [`crate::pacer`] schedule before the run; the service time counts from the
//! moment the generator actually started it. When the generator falls behind
//! it records its lag and the requests it started late, and still sends every
//! request of the schedule.
