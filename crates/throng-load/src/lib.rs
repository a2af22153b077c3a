//! The throng load harness: the open-model [`pacer`], target and source
//! parsing ([`target`]), plan fitting ([`plan`]), the `hold` client
//! ([`hold`]) with its recorder ([`recorder`]), the timestamped message
//! ([`message`]), publishers ([`publish`]) and the supervisor that runs
//! worker processes ([`supervisor`]).

pub mod attack;
pub mod bench;
pub mod hold;
pub mod message;
pub mod pacer;
pub mod plan;
pub mod publish;
pub mod recorder;
pub mod supervisor;
pub mod target;
pub mod tls;
