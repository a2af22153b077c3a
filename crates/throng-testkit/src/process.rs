//! Starting programs from a test: the open-file limit every child inherits,
//! a test that has the machine to itself, a run with a deadline, and signals.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::sync::{Once, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

/// A `Command` for `program`, after this process's soft open-file limit was
/// raised to its hard limit (once per process). Children inherit the limit:
/// a peer holding a thousand test connections must not stop at a shell's
/// default of 1024. While a test runs [`alone`], this waits for it to end.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    raise_open_files();
    share_the_machine();
    Command::new(program)
}

/// Held for reading by every test of this process that started a program,
/// for writing by one that runs [`alone`].
static STARTED: RwLock<()> = RwLock::new(());

/// What the test on this thread holds of [`STARTED`], kept only to be
/// dropped: the guard goes with the thread, which the test harness ends with
/// the test (passed or not).
enum Held {
    Shared {
        _guard: RwLockReadGuard<'static, ()>,
    },
    Alone {
        _guard: RwLockWriteGuard<'static, ()>,
    },
}

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Whether this is a test's own thread: the harness names each after its
/// test. Threads a test spawns are unnamed and take no part, so a helper
/// thread cannot wait on a test that waits on it.
fn on_a_test_thread() -> bool {
    std::thread::current()
        .name()
        .is_some_and(|name| name != "main")
}

fn share_the_machine() {
    if !on_a_test_thread() {
        return;
    }
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        if held.is_none() {
            let guard = STARTED.read().unwrap_or_else(PoisonError::into_inner);
            *held = Some(Held::Shared { _guard: guard });
        }
    });
}

/// Gives the calling test this process to itself until it ends: waits for
/// the other tests that started programs to end, and keeps the rest from
/// starting any. For a test that checks host-wide counts (`sockstat`, memory)
/// that other tests' sockets would move. Call it first, before starting
/// anything.
pub fn alone() {
    assert!(on_a_test_thread(), "alone() is for a test's own thread");
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        assert!(
            held.is_none(),
            "call alone() before the test starts any program"
        );
        let guard = STARTED.write().unwrap_or_else(PoisonError::into_inner);
        *held = Some(Held::Alone { _guard: guard });
    });
}

/// Raises this process's soft open-file limit to its hard limit, once. The
/// tests that open many sockets themselves call it before they start.
pub fn raise_open_files() {
    static RAISED: Once = Once::new();
    RAISED.call_once(|| {
        if let Err(e) = throng_host::limits::raise_nofile() {
            // Not fatal: a test that needs more files fails on its own, with EMFILE.
            eprintln!("could not raise the open-file limit: {e}");
        }
    });
}

/// Runs `cmd` (stdin closed, stdout and stderr collected) and kills it if it
/// has not ended within `limit`, failing the test: a hang in the program
/// under test must not hang the suite.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
    // Read both pipes while waiting, so a child that writes more than a
    // pipe holds does not stall until the deadline.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

/// Sends signal `sig` (`TERM`, `KILL`, `STOP`, ...) to process `pid` with `kill(1)`.
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args(["-s", sig, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -s {sig} {pid}: {status}");
}

/// Lossy UTF-8 of a child's output, for assertions and their messages.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::thread;

    use super::*;

    #[test]
    fn output_within_reads_more_than_a_pipe_holds() {
        let out = output_within(
            Command::new("head").args(["-c", "1000000", "/dev/zero"]),
            Duration::from_secs(10),
        );
        assert!(out.status.success());
        assert_eq!(out.stdout.len(), 1_000_000);
    }

    #[test]
    #[should_panic(expected = "did not end within")]
    fn output_within_kills_a_program_past_its_time() {
        output_within(Command::new("sleep").arg("10"), Duration::from_millis(200));
    }

    /// A test that runs alone holds back every other test's next program
    /// until it ends.
    #[test]
    fn a_test_alone_holds_back_the_others() {
        let (started, alone_since) = mpsc::channel();
        let hold = Duration::from_millis(300);
        let alone_test = thread::Builder::new()
            .name("testkit::the_test_alone".into())
            .spawn(move || {
                alone();
                started.send(Instant::now()).unwrap();
                thread::sleep(hold);
            })
            .unwrap();
        let since = alone_since.recv().unwrap();
        let _ = command("true");
        assert!(
            since.elapsed() >= hold,
            "started a program {:?} into another test's time alone",
            since.elapsed()
        );
        alone_test.join().unwrap();
    }
}
