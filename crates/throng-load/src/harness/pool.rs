//! Where a run's workers run, and how the supervisor reaches them.
//!
//! The supervisor sees its workers as a [`Crew`] (give orders, stop, kill,
//! name the local processes for host samples) and as a [`Feed`] of the
//! record lines they send, from wherever they run. Today every worker is a
//! local child process ([`Pool`]): this binary re-executed
//! ([`WorkerCommand`]), its plan written on its stdin, its stdout read by a
//! thread of its own. Agents on other machines stream the same records
//! through Redis: they are a [`Launch`] that returns another crew and
//! feeds the same feed (`crate::agent::crew`); merging, progress and the
//! result file ([`super::collect`]) do not change.

use std::cell::RefCell;
use std::io::{self, BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};

use serde::Serialize;
use tokio::sync::mpsc;

use super::worker::Order;

/// What arrives from the workers, wherever they run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Feed {
    /// One record line (a result-file record, or anything else it printed).
    Line {
        /// The worker, `0..workers`.
        worker: usize,
        /// The line, without its line break.
        line: String,
    },
    /// The worker is gone: it ended, died, or its link broke. Nothing more
    /// comes from it.
    Gone {
        /// The worker.
        worker: usize,
    },
    /// Something about the workers to show (an agent was lost); with
    /// `stop`, the run stops as Ctrl-C stops it.
    Note {
        /// What to show.
        text: String,
        /// Stop the run.
        stop: bool,
    },
}

/// The workers of a run, as the supervisor commands them.
pub trait Crew {
    /// Workers in the run.
    fn len(&self) -> usize;
    /// Whether the run has no workers.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Worker `worker`'s label (`host/hold-0`).
    fn label(&self, worker: usize) -> &str;
    /// Sends `order` to every worker still listening.
    fn tell_all(&self, order: &Order);
    /// Sends `order` to every worker, then closes their input: nothing
    /// more will be said.
    fn stop_all(&self, order: &Order);
    /// Ends every worker at once.
    fn kill_all(&self);
    /// The processes of this machine to sample, by label.
    fn processes(&self) -> Vec<(String, u32)>;
    /// Waits until every worker process has exited.
    fn wait_all(&self);
}

/// Starts a run's workers somewhere other than this machine (the agents
/// of `throng agent`): their plans go out as JSON, their lines come back
/// on the feed, and the returned [`Crew`] commands them.
pub trait Launch: std::fmt::Debug {
    /// Worker `index`'s label (`agent/hold-3`).
    fn label(&self, role: &str, index: u32) -> String;
    /// How far ahead of now the schedule starts: time to start every worker.
    fn lead(&self) -> std::time::Duration;
    /// Starts the workers, one per `(label, plan)`, sending what they say to `feed`.
    fn launch(
        &self,
        role: &'static str,
        plans: Vec<(String, serde_json::Value)>,
        feed: &mpsc::UnboundedSender<Feed>,
    ) -> io::Result<Box<dyn Crew>>;
}

/// A run's workers somewhere other than this machine, already fitted
/// there: how many, what starts them, and the lines that say how they are
/// shared out (printed at start in place of this machine's plan).
#[derive(Debug, Clone)]
pub struct Remote {
    /// Workers in the whole run.
    pub workers: u32,
    /// Starts them.
    pub launch: std::rc::Rc<dyn Launch>,
    /// How the run is shared out.
    pub lines: Vec<String>,
}

/// How to start one worker: this program re-executed with the role's
/// arguments (`throng hold --worker`); it reads its plan on stdin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

impl WorkerCommand {
    /// This very program with `args`.
    pub fn this_program(args: &[&str]) -> io::Result<Self> {
        let program = std::env::current_exe().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("finding this program to start workers: {e}"),
            )
        })?;
        Ok(Self {
            program,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
        })
    }
}

/// One local worker process and its input.
#[derive(Debug)]
struct Local {
    label: String,
    child: RefCell<Child>,
    /// `None` once closed: the worker's input has ended.
    stdin: RefCell<Option<ChildStdin>>,
}

/// Workers as child processes of this one.
#[derive(Debug)]
pub struct Pool {
    workers: Vec<Local>,
}

impl Pool {
    /// Starts one worker per `(label, plan)`, writes each its plan, and
    /// sends what they print to `feed`.
    pub fn spawn<P: Serialize>(
        command: &WorkerCommand,
        plans: Vec<(String, P)>,
        feed: &mpsc::UnboundedSender<Feed>,
    ) -> io::Result<Self> {
        let mut workers = Vec::with_capacity(plans.len());
        for (index, (label, plan)) in plans.into_iter().enumerate() {
            let mut cmd = Command::new(&command.program);
            cmd.args(&command.args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            {
                use std::os::unix::process::CommandExt as _;
                // Own process group: Ctrl-C reaches only the supervisor,
                // which then ends the run cleanly through the workers.
                cmd.process_group(0);
            }
            let mut child = cmd.spawn().map_err(|e| {
                io::Error::new(e.kind(), format!("cannot start worker {index}: {e}"))
            })?;
            let mut stdin = child.stdin.take();
            if let Some(input) = stdin.as_mut() {
                let line = serde_json::to_string(&plan).map_err(io::Error::other)?;
                input.write_all(line.as_bytes())?;
                input.write_all(b"\n")?;
                input.flush()?;
            }
            if let Some(stdout) = child.stdout.take() {
                read_lines(index, stdout, feed.clone());
            }
            workers.push(Local {
                label,
                child: RefCell::new(child),
                stdin: RefCell::new(stdin),
            });
        }
        Ok(Self { workers })
    }
}

/// Sends every line of `from` to `feed`, then [`Feed::Gone`]: on a thread,
/// because the pipe blocks.
fn read_lines(
    worker: usize,
    from: impl io::Read + Send + 'static,
    feed: mpsc::UnboundedSender<Feed>,
) {
    std::thread::spawn(move || {
        let mut r = BufReader::new(from);
        let mut line = String::new();
        loop {
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = line.trim_end().to_owned();
                    if feed.send(Feed::Line { worker, line }).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = feed.send(Feed::Gone { worker });
    });
}

impl Crew for Pool {
    fn len(&self) -> usize {
        self.workers.len()
    }

    fn label(&self, worker: usize) -> &str {
        self.workers.get(worker).map_or("?", |w| w.label.as_str())
    }

    fn tell_all(&self, order: &Order) {
        for w in &self.workers {
            if let Some(input) = w.stdin.borrow_mut().as_mut() {
                // A worker that is gone is reported by its reader thread.
                let _ = writeln!(input, "{order}").and_then(|()| input.flush());
            }
        }
    }

    fn stop_all(&self, order: &Order) {
        self.tell_all(order);
        for w in &self.workers {
            w.stdin.borrow_mut().take();
        }
    }

    fn kill_all(&self) {
        for w in &self.workers {
            let _ = w.child.borrow_mut().kill();
        }
    }

    fn processes(&self) -> Vec<(String, u32)> {
        self.workers
            .iter()
            .map(|w| (w.label.clone(), w.child.borrow().id()))
            .collect()
    }

    fn wait_all(&self) {
        for w in &self.workers {
            w.stdin.borrow_mut().take();
            let _ = w.child.borrow_mut().wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_writes_plans_and_feeds_back_what_its_workers_print() {
        // `head -n 2` echoes its plan and the order after it, then exits.
        let command = WorkerCommand {
            program: "head".into(),
            args: vec!["-n".into(), "2".into()],
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let plans = vec![("h/t-0".to_owned(), 10), ("h/t-1".to_owned(), 11)];
        let pool = Pool::spawn(&command, plans, &tx).unwrap();
        drop(tx);
        assert_eq!(pool.len(), 2);
        assert_eq!(pool.label(1), "h/t-1");
        pool.stop_all(&Order::Stop(3));
        let mut got = Vec::new();
        while let Some(f) = rx.blocking_recv() {
            got.push(f);
        }
        pool.wait_all();
        for worker in 0..2 {
            let of: Vec<&Feed> = got
                .iter()
                .filter(|f| matches!(f, Feed::Line { worker: w, .. } | Feed::Gone { worker: w } if *w == worker))
                .collect();
            let plan = (10 + worker).to_string();
            assert_eq!(
                of,
                [
                    &Feed::Line { worker, line: plan },
                    &Feed::Line {
                        worker,
                        line: "stop 3".into()
                    },
                    &Feed::Gone { worker }
                ]
            );
        }
    }
}
