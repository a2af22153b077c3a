//! The machine under throng, and the one layer between throng and the
//! operating system: kernel limits and what they allow (`doctor`,
//! `limits`), `/proc` sampling once a second (`sample`), the per-process
//! file budget that decides how many worker processes a run needs, the OS
//! calls both halves make: the epoll set of held connections (`poll`), one owner per
//! listening port (`portlock`), a
//! precise timer (`timer`), this process's memory, CPU clocks and signals
//! and a child that exits with it (`process`), the socket option source
//! spreading needs (`socket`), a private network namespace sized for a run
//! that keeps both ends here (`netns`), counters a supervisor shares with its
//! workers in one sealed memfd (`shared`), and the one grammar of the quantities every
//! command line takes (`units`). Every `unsafe` OS call lives here, behind a
//! safe function.

pub mod doctor;
pub mod fdpass;
pub mod limits;
pub mod netns;
pub mod poll;
pub mod portlock;
pub mod process;
pub mod sample;
pub mod shared;
pub mod socket;
pub mod timer;
pub mod units;
