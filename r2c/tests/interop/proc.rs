//! Child processes with streamed output and bounded waits.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A running child. Dropping it kills the child (by its pid) if it is still running, so a
/// failing test leaves no process behind.
pub struct Proc {
    child: Option<Child>,
    pub what: String,
    lines: Receiver<String>,
    out: Arc<Mutex<Vec<String>>>,
    err: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
}

/// How a child ended.
#[derive(Debug)]
pub struct Outcome {
    pub what: String,
    pub status: Option<ExitStatus>,
    pub out: String,
    pub err: String,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// The first stdout line containing `head`, from `head` on (the test harness may
    /// print `test role_child ... ` in front of a child's report).
    pub fn line<'a>(&'a self, head: &'a str) -> Option<&'a str> {
        self.lines(head).next()
    }

    /// Every stdout line containing `head`, each from `head` on.
    pub fn lines<'a>(&'a self, head: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.out
            .lines()
            .filter_map(move |l| l.find(head).map(|at| &l[at..]))
    }

    /// Everything, for failure messages.
    pub fn dump(&self) -> String {
        format!(
            "=== {} (status {:?})\n--- stdout\n{}\n--- stderr\n{}\n",
            self.what, self.status, self.out, self.err
        )
    }
}

fn pump(
    r: impl Read + Send + 'static,
    store: Arc<Mutex<Vec<String>>>,
    tx: Option<std::sync::mpsc::Sender<String>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if let Some(tx) = &tx {
                let _ = tx.send(line.clone());
            }
            store.lock().expect("output lock").push(line);
        }
    })
}

impl Proc {
    /// Starts `cmd` with piped stdout/stderr; `stream_stderr` sends stderr lines to
    /// [`Proc::wait_line`] too (tcpdump reports on stderr).
    pub fn spawn(mut cmd: Command, what: &str, stream_stderr: bool) -> Result<Proc, String> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| format!("spawn {what}: {e}"))?;
        let (tx, rx) = channel();
        let out = Arc::new(Mutex::new(Vec::new()));
        let err = Arc::new(Mutex::new(Vec::new()));
        let so = child.stdout.take().expect("piped");
        let se = child.stderr.take().expect("piped");
        let readers = vec![
            pump(so, out.clone(), Some(tx.clone())),
            pump(se, err.clone(), stream_stderr.then_some(tx)),
        ];
        Ok(Proc {
            child: Some(child),
            what: what.to_string(),
            lines: rx,
            out,
            err,
            readers,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Waits up to `timeout` for a streamed line containing `needle`.
    pub fn wait_line(&self, needle: &str, timeout: Duration) -> Option<String> {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(needle) => return Some(l),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// A streamed line containing `needle`, if one has arrived (never blocks).
    pub fn try_line(&self, needle: &str) -> Option<String> {
        while let Ok(l) = self.lines.try_recv() {
            if l.contains(needle) {
                return Some(l);
            }
        }
        None
    }

    /// Whether the child has exited (never blocks).
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => !matches!(c.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// Sends SIGTERM (by pid) and waits up to `grace`, then kills.
    pub fn terminate(self, grace: Duration) -> Outcome {
        let pid = self.pid().to_string();
        let _ = Command::new("kill")
            .args(["-TERM", &pid])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        self.wait(grace)
    }

    /// Waits up to `limit`, then kills the child (by its pid).
    pub fn wait(mut self, limit: Duration) -> Outcome {
        let mut child = self.child.take().expect("not waited yet");
        let end = Instant::now() + limit;
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() > end => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break None,
            }
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        let join = |v: &Arc<Mutex<Vec<String>>>| v.lock().expect("output lock").join("\n");
        Outcome {
            what: self.what.clone(),
            status,
            out: join(&self.out),
            err: join(&self.err),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_stream_and_outcome_collects_them() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo one; echo two >&2; echo x three; exit 3"]);
        let p = Proc::spawn(c, "sh", true).unwrap();
        assert!(p.wait_line("two", Duration::from_secs(10)).is_some());
        let o = p.wait(Duration::from_secs(10));
        assert!(!o.ok());
        assert_eq!(o.status.and_then(|s| s.code()), Some(3));
        assert_eq!(o.line("thr"), Some("three"));
        assert_eq!(o.err, "two");
    }

    #[test]
    fn a_hung_child_is_killed_at_the_limit() {
        let mut c = Command::new("sleep");
        c.arg("30");
        let p = Proc::spawn(c, "sleep", false).unwrap();
        let t = Instant::now();
        let o = p.wait(Duration::from_millis(200));
        assert!(o.status.is_none() && !o.ok());
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn spawning_a_missing_program_is_an_error() {
        let e = Proc::spawn(Command::new("/nonexistent/lio"), "missing", false)
            .err()
            .unwrap();
        assert!(e.contains("missing"), "{e}");
    }
}
