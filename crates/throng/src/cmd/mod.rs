//! One module per subcommand: its arguments (clap) and its `run`, which
//! builds the library's request from them, calls the library and prints.

pub(crate) mod agent;
pub(crate) mod attack;
pub(crate) mod bench;
pub(crate) mod client;
pub(crate) mod doctor;
pub(crate) mod hold;
pub(crate) mod knee;
pub(crate) mod report;
pub(crate) mod serve;
