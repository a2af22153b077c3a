//! throng result files: the per-interval records every worker writes, the
//! versioned file format that holds them, exact merging across workers and
//! machines, and text, JSON and HTML reports; and the result of a knee
//! search ([`knee`]) with its table and page; Vegeta's result files read
//! beside them ([`vegeta`]) and Vegeta's latency buckets ([`hist`]).

pub mod bench;
pub mod events;
pub mod fanout;
pub mod format;
pub mod hist;
pub mod html;
pub mod interval;
pub mod knee;
pub mod merge;
pub mod summary;
pub mod text;
pub mod vegeta;
