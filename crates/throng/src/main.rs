//! throng: hold millions of connections, push to all of them, and prove it under load.
//!
//! The binary only parses arguments and wires the crates together; each
//! subcommand lives in its own module under `cmd/`.

// The doc comments of the clap structs are the `--help` a user reads in a
// terminal: `<channel>` and `[user:password@]` there are what to type, not
// HTML or links, so rustdoc is told not to read them as such.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;
mod layers;

/// Hold millions of connections, push to all of them, and prove it under load.
#[derive(Debug, Parser)]
#[command(name = "throng", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    // Boxed: its options (access control included) outweigh the others'.
    /// Run the WebSocket push server: subscribe on /<channel>, publish with POST /publish/<channel>.
    Serve(Box<cmd::serve::Args>),
    // Boxed too: their rates (stages kept inline) outweigh the others'.
    /// Open and hold many WebSocket connections at a set rate and measure every push.
    Hold(Box<cmd::hold::Args>),
    /// Drive HTTP load at a set request rate (open model), measured without coordinated omission.
    Attack(Box<cmd::attack::Args>),
    /// Find the tipping point: raise a load level by level until the target misses its objective.
    Knee(Box<cmd::knee::Args>),
    /// Read and merge result files into a text, JSON or HTML report.
    Report(cmd::report::Args),
    /// One-command proof on this machine: serve + hold + publish + host sampling, then a report.
    Bench(cmd::bench::Args),
    /// Check this machine's limits for a run of N connections and print the fixes.
    Doctor(cmd::doctor::Args),
    /// Be one load machine of a distributed run: register in Redis, run what a controller sends.
    Agent(cmd::agent::AgentArgs),
    /// List the live agents in Redis: capacity, clock offset, what they run.
    Agents(cmd::agent::AgentsArgs),
}

fn main() -> ExitCode {
    // `serve` reads a settings file and the environment under its flags.
    let cli = match layers::parse::<Cli>() {
        Ok((mut cli, shown)) => {
            if let Command::Serve(args) = &mut cli.command {
                args.shown = shown;
            }
            cli
        }
        Err(err) => {
            eprintln!("throng: error: {err}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Serve(args) => cmd::serve::run(*args),
        Command::Hold(args) => cmd::hold::run(*args),
        Command::Attack(args) => cmd::attack::run(*args),
        Command::Knee(args) => cmd::knee::run(*args),
        Command::Report(args) => cmd::report::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Doctor(args) => cmd::doctor::run(args),
        Command::Agent(args) => cmd::agent::run_agent(args),
        Command::Agents(args) => cmd::agent::run_agents(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("throng: error: {err:#}");
            ExitCode::from(2)
        }
    }
}
