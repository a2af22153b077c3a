//! The machine under throng: kernel limits and what they allow (`doctor`),
//! `/proc` sampling once a second, the per-process file budget that
//! decides how many worker processes a run needs, and the one grammar of
//! the quantities every command line takes (`units`).

pub mod doctor;
pub mod limits;
pub mod sample;
pub mod units;
