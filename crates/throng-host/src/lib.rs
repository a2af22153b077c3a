//! The machine under throng: kernel limits and what they allow (`doctor`),
//! `/proc` sampling once a second, and the per-process file budget that
//! decides how many worker processes a run needs.

pub mod doctor;
pub mod limits;
pub mod sample;
