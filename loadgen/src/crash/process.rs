//! The server a crash run kills: `ringkv-server` (or `--server-cmd`) as a
//! child process on a data directory loadgen owns.
//!
//! What must hold: at most one child runs at a time; a child is ready when
//! it logs "ringkv-server ready" (the native listener is bound only after
//! recovery); dropping a [`ServerProcess`] kills and reaps its child, so an
//! error or Ctrl-C leaves no server running.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How to start the server (the same way every time).
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// The program and its leading arguments, run through `sh -c 'exec …'`.
    pub command: String,
    pub data_dir: PathBuf,
    pub durability: &'static str,
    pub tier: &'static str,
    pub profile: &'static str,
    pub shards: u32,
    /// Where the child's stderr is copied (appended across restarts).
    pub log: PathBuf,
}

/// Why the server could not be started or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessError {
    #[error("cannot start `{command}`: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    /// `tail`: the log's last lines, read when it exited (the log lives in
    /// the run's temporary directory, which is gone once the run ends).
    #[error(
        "the server exited before it was ready ({status}); the end of its log ({log}):\n{tail}"
    )]
    Exited {
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("the server was not ready within {seconds:.0} s; its log: {log}")]
    NotReady { seconds: f64, log: PathBuf },
    #[error("cannot stop the server: {0}")]
    Stop(std::io::Error),
}

/// A running child server.
pub struct ServerProcess {
    child: Child,
    pub addr: String,
    pub metrics: Option<String>,
    /// From spawn to the ready line.
    pub start_to_ready: Duration,
}

impl ServerSpec {
    /// `ringkv-server` beside this executable if it is there, else on PATH.
    pub fn default_command() -> String {
        let sibling = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|d| d.join("ringkv-server")));
        match sibling {
            Some(path) if path.is_file() => shell_quote(&path.display().to_string()),
            _ => "ringkv-server".to_string(),
        }
    }

    fn command(&self) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!("exec {} \"$@\"", self.command))
            .arg("ringkv-server")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
            .args(["--durability", self.durability, "--tier", self.tier])
            .args(["--device-profile", self.profile])
            .args(["--shards", &self.shards.to_string()])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // Its own process group: the terminal's Ctrl-C reaches loadgen only,
        // and loadgen stops the server.
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
        c
    }

    /// Starts the server and waits (at most `ready_within`) for its ready line.
    pub fn start(&self, ready_within: Duration) -> Result<ServerProcess, ProcessError> {
        let started = Instant::now();
        let mut child = self
            .command()
            .spawn()
            .map_err(|source| ProcessError::Spawn {
                command: self.command.clone(),
                source,
            })?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let ready = copy_log_until_ready(stderr, self.log.clone());
        let line = match wait_ready(&mut child, &ready, ready_within) {
            Ok(line) => line,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e.with_log(&self.log, ready_within));
            }
        };
        Ok(ServerProcess {
            child,
            addr: field(&line, "addr").unwrap_or_default(),
            metrics: field(&line, "metrics").filter(|m| m != "off"),
            start_to_ready: started.elapsed(),
        })
    }
}

/// Lines of a server's log an exit at start quotes.
const LOG_TAIL_LINES: usize = 12;

/// The last `lines` lines of the file at `path` (or why it cannot be read).
fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read it: {e})"),
    }
}

enum WaitError {
    Exited(String),
    Timeout,
}

impl WaitError {
    fn with_log(self, log: &Path, within: Duration) -> ProcessError {
        match self {
            WaitError::Exited(status) => ProcessError::Exited {
                status,
                log: log.to_path_buf(),
                tail: log_tail(log, LOG_TAIL_LINES),
            },
            WaitError::Timeout => ProcessError::NotReady {
                seconds: within.as_secs_f64(),
                log: log.to_path_buf(),
            },
        }
    }
}

fn wait_ready(
    child: &mut Child,
    ready: &mpsc::Receiver<String>,
    within: Duration,
) -> Result<String, WaitError> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        match ready.recv_timeout(Duration::from_millis(20)) {
            Ok(line) => return Ok(line),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child
                    .wait()
                    .map_or_else(|e| e.to_string(), |s| s.to_string());
                return Err(WaitError::Exited(status));
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(WaitError::Exited(status.to_string()));
        }
    }
    Err(WaitError::Timeout)
}

/// Copies the child's stderr to `log` on a thread; sends the ready line.
fn copy_log_until_ready(
    stderr: impl Read + Send + 'static,
    log: PathBuf,
) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .ok();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(f) = file.as_mut() {
                let _ = writeln!(f, "{line}");
            }
            if line.contains("ringkv-server ready") {
                let _ = tx.send(line);
            }
        }
    });
    rx
}

/// `name=value` from a tracing line.
fn field(line: &str, name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&prefix))
        .map(|v| v.trim_matches('"').to_string())
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

impl ServerProcess {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, then reap.
    pub fn kill(mut self) -> Result<(), ProcessError> {
        self.child.kill().map_err(ProcessError::Stop)?;
        self.child.wait().map_err(ProcessError::Stop)?;
        Ok(())
    }

    /// SIGTERM (a clean stop), then reap; SIGKILL after `within`.
    pub fn stop(mut self, within: Duration) -> Result<(), ProcessError> {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid fits pid_t");
        // SAFETY: kill(2) on our own child's pid, which is not yet reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.child.try_wait().map_err(ProcessError::Stop)?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child.kill().map_err(ProcessError::Stop)?;
        self.child.wait().map_err(ProcessError::Stop)?;
        Ok(())
    }

    /// What the server reports about its start-up recovery (/metrics).
    pub fn recovery(&self) -> Option<Recovery> {
        let text = http_get_metrics(self.metrics.as_deref()?).ok()?;
        Some(Recovery::parse(&text))
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The recovery gauges of /metrics, summed (bytes, records) or the slowest
/// shard (duration).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Recovery {
    pub duration_ms: f64,
    pub replayed_bytes: u64,
    pub replayed_records: u64,
}

impl Recovery {
    pub fn parse(text: &str) -> Recovery {
        let mut r = Recovery::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or("");
            let value: f64 = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            match name {
                "ringkv_recovery_duration_seconds" => {
                    r.duration_ms = r.duration_ms.max(value * 1000.0)
                }
                "ringkv_recovery_replayed_bytes" => r.replayed_bytes += value as u64,
                "ringkv_recovery_replayed_records" => r.replayed_records += value as u64,
                _ => {}
            }
        }
        r
    }
}

fn http_get_metrics(addr: &str) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An exit at start quotes the end of the log, which goes away with
    /// the run's temporary directory.
    #[test]
    fn an_exit_at_start_quotes_the_end_of_the_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("server.log");
        let text: String = (1..=30).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&log, text).expect("write");
        let e = WaitError::Exited("exit status: 1".into()).with_log(&log, Duration::from_secs(1));
        let shown = e.to_string();
        assert!(shown.contains("exit status: 1"), "{shown}");
        assert!(
            shown.contains("line 30") && shown.contains("line 19"),
            "{shown}"
        );
        assert!(!shown.contains("line 18\n"), "{shown}");
        let gone = WaitError::Exited("x".into()).with_log(&dir.path().join("none"), Duration::ZERO);
        assert!(gone.to_string().contains("cannot read it"), "{gone}");
    }

    #[test]
    fn the_ready_line_gives_both_addresses() {
        let line = "2026-12-03T08:00:00Z  INFO ringkv_server::server: ringkv-server ready addr=127.0.0.1:4100 metrics=127.0.0.1:4101 resp=off shards=2";
        assert_eq!(field(line, "addr").as_deref(), Some("127.0.0.1:4100"));
        assert_eq!(field(line, "metrics").as_deref(), Some("127.0.0.1:4101"));
        assert_eq!(field(line, "nothing"), None);
    }

    #[test]
    fn recovery_gauges_are_summed_over_shards() {
        let text = "# HELP x\nringkv_recovery_duration_seconds{shard=\"0\"} 0.25\n\
ringkv_recovery_duration_seconds{shard=\"1\"} 0.5\n\
ringkv_recovery_replayed_bytes{shard=\"0\"} 100\n\
ringkv_recovery_replayed_bytes{shard=\"1\"} 28\n\
ringkv_recovery_replayed_records{shard=\"1\"} 3\n";
        let r = Recovery::parse(text);
        assert_eq!(r.replayed_bytes, 128);
        assert_eq!(r.replayed_records, 3);
        assert!((r.duration_ms - 500.0).abs() < 1e-9);
    }
}
