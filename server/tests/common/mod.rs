//! Helpers for end-to-end tests against the real `ringkv-server` binary: start
//! it on a temp directory and a free loopback port, read its log, signal it,
//! and talk to it with raw sockets (every read has a timeout) or the tokio
//! client. A test never leaves a server running: `Drop` kills it.

#![allow(dead_code)]

pub mod certs;
pub mod resp;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ringkv_protocol::{
    decode_hello_ack, decode_response, encode_hello, encode_request, Hello, HelloAck, Limits,
    Request, RequestOp, ServerFrame,
};

/// Longest any test waits for one thing (start, an answer, an exit).
pub const WAIT: Duration = Duration::from_secs(30);

pub fn server_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ringkv-server"))
}

/// The `ringkv` CLI from the client package: next to the server binary, built
/// on demand when this package's tests were built alone.
pub fn cli_binary() -> PathBuf {
    let path = server_binary().with_file_name("ringkv");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "ringkv-client", "--bin", "ringkv"])
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
            .status()
            .expect("run cargo build for the ringkv CLI");
        assert!(status.success(), "building the ringkv CLI failed");
    }
    assert!(path.exists(), "{} is missing", path.display());
    path
}

/// How many of a server's log lines a failing test prints.
const LOG_TAIL_ON_FAILURE: usize = 60;

/// A running `ringkv-server` process.
pub struct ServerProcess {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub data_dir: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
}

/// Starts the binary with `args` (plus `--data-dir`, `--listen 127.0.0.1:0`
/// unless given) and waits for its "ready" line.
pub fn start_server(data_dir: &Path, args: &[&str]) -> ServerProcess {
    try_start_server(data_dir, args)
        .unwrap_or_else(|log| panic!("server did not become ready; its log:\n{}", log.join("\n")))
}

/// Like [`start_server`]; on failure returns the process's log (it exited).
pub fn try_start_server(data_dir: &Path, args: &[&str]) -> Result<ServerProcess, Vec<String>> {
    match start_server_or_exit(data_dir, args) {
        Started::Ready(server) => Ok(server),
        Started::Exited(_, log) | Started::Hung(log) => Err(log),
    }
}

/// How a start ended: ready, exited before it was (with its status and
/// log), or neither within the wait (killed; its log).
pub enum Started {
    Ready(ServerProcess),
    Exited(ExitStatus, Vec<String>),
    Hung(Vec<String>),
}

/// Like [`start_server`], telling a refused start (the process exited)
/// from one that hung.
pub fn start_server_or_exit(data_dir: &Path, args: &[&str]) -> Started {
    let mut cmd = Command::new(server_binary());
    cmd.arg("--data-dir").arg(data_dir);
    if !args.contains(&"--listen") {
        cmd.args(["--listen", "127.0.0.1:0"]);
    }
    cmd.args(args)
        .env(
            "RUST_LOG",
            std::env::var("RINGKV_TEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn ringkv-server");
    let stderr = child.stderr.take().expect("piped stderr");
    let log = Arc::new(Mutex::new(Vec::new()));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Option<String>>();
    let thread_log = Arc::clone(&log);
    std::thread::spawn(move || {
        let mut ready_tx = Some(ready_tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line.contains("ringkv-server ready") {
                if let Some(tx) = ready_tx.take() {
                    let _ = tx.send(Some(line.clone()));
                }
            }
            thread_log.lock().unwrap().push(line);
        }
        if let Some(tx) = ready_tx.take() {
            let _ = tx.send(None);
        }
    });
    let ready = ready_rx.recv_timeout(WAIT);
    let mut server = ServerProcess {
        child: Some(child),
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        metrics_addr: None,
        data_dir: data_dir.to_path_buf(),
        log,
    };
    match ready {
        Ok(Some(line)) => {
            server.addr = field(&line, "addr")
                .parse()
                .expect("addr in the ready line");
            server.metrics_addr = field(&line, "metrics").parse().ok();
            Started::Ready(server)
        }
        // Its stderr closed before the ready line: it is exiting, and the
        // reader thread has its whole log.
        Ok(None) => match server.try_wait_exit() {
            Some(status) => Started::Exited(status, server.log()),
            None => Started::Hung(server.log()),
        },
        Err(_) => Started::Hung(server.log()),
    }
}

/// Copies the data directory `from` to `to`, file by file, leaving out
/// the lock file (the copy is opened by another process).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else if entry.file_name() != "LOCK" {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The value of `name=value` in a log line (values have no spaces).
pub fn field(line: &str, name: &str) -> String {
    let key = format!("{name}=");
    let start = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&key))
        .unwrap_or_else(|| panic!("no {name}= in {line}"));
    start.trim_matches('"').to_string()
}

impl ServerProcess {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Waits until a log line contains `needle`.
    pub fn wait_for_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(line) = self.log().into_iter().find(|l| l.contains(needle)) {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needle:?}:\n{}",
                self.log().join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: plain kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.pid() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill({signal}) failed");
    }

    /// Waits (bounded) for the exit; `None` if it did not exit in time.
    pub fn try_wait_exit(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut().expect("running");
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        let child = self.child.as_mut().expect("running");
        child.try_wait().expect("try_wait").is_none()
    }

    /// Waits for the process to exit (bounded) and returns its status.
    pub fn wait_exit(&mut self) -> ExitStatus {
        match self.try_wait_exit() {
            Some(status) => status,
            None => {
                if let Some(child) = self.child.as_mut() {
                    let _ = child.kill();
                }
                panic!(
                    "server did not exit within {WAIT:?}:\n{}",
                    self.log().join("\n")
                );
            }
        }
    }

    /// SIGTERM, then wait for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait_exit()
    }

    /// SIGKILL, then wait for the exit.
    pub fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        self.wait_exit();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // A failing test shows what the server said: its last lines are
        // often the reason (a poisoned shard names the failed write).
        if std::thread::panicking() {
            let log = self.log();
            let from = log.len().saturating_sub(LOG_TAIL_ON_FAILURE);
            eprintln!(
                "--- the server's last {} log lines (of {}) ---\n{}\n---",
                log.len() - from,
                log.len(),
                log[from..].join("\n")
            );
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A raw protocol connection over a blocking socket with read timeouts.
pub struct RawConn {
    pub stream: TcpStream,
    pub buf: BytesMut,
    pub limits: Limits,
}

pub fn raw_connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect_timeout(&addr, WAIT).expect("connect");
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream.set_write_timeout(Some(WAIT)).unwrap();
    stream
}

impl RawConn {
    /// Connects and does the handshake.
    pub fn open(addr: SocketAddr) -> RawConn {
        let mut stream = raw_connect(addr);
        let mut hello = BytesMut::new();
        encode_hello(&Hello::current(), &mut hello);
        stream.write_all(&hello).unwrap();
        let mut conn = RawConn {
            stream,
            buf: BytesMut::new(),
            limits: Limits::default(),
        };
        match conn.read_hello_ack() {
            HelloAck::Accepted { limits, .. } => conn.limits = limits,
            refused => panic!("handshake refused: {refused:?}"),
        }
        conn
    }

    fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 64 * 1024];
        let n = self.stream.read(&mut chunk).expect("read (timed out?)");
        self.buf.extend_from_slice(&chunk[..n]);
        n
    }

    pub fn read_hello_ack(&mut self) -> HelloAck {
        loop {
            if let Some(ack) = decode_hello_ack(&mut self.buf).expect("valid hello-ack") {
                return ack;
            }
            assert!(self.fill() > 0, "closed before the hello-ack");
        }
    }

    /// The next server frame, or `None` at end of stream.
    pub fn read_frame(&mut self) -> Option<ServerFrame> {
        loop {
            if let Some(frame) = decode_response(&mut self.buf, &self.limits).expect("valid frame")
            {
                return Some(frame);
            }
            if self.fill() == 0 {
                assert!(self.buf.is_empty(), "stream ended inside a frame");
                return None;
            }
        }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    pub fn send(&mut self, id: u64, ops: Vec<RequestOp>) {
        let mut b = BytesMut::new();
        encode_request(&Request { id, ops }, &mut b);
        self.send_raw(&b);
    }

    /// Reads until end of stream, expecting no more frames.
    pub fn expect_eof(&mut self) {
        assert!(self.read_frame().is_none(), "expected the server to close");
    }
}

/// Reads everything until the peer closes (bounded by the read timeout).
pub fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return out,
            Err(e) => panic!("read failed before close: {e}"),
        }
    }
}

pub fn key(i: u64) -> Bytes {
    Bytes::from(format!("key-{i:08}"))
}

pub fn value(i: u64, len: usize) -> Bytes {
    let mut v = format!("value-{i}-").into_bytes();
    v.resize(len, b'a' + (i % 26) as u8);
    Bytes::from(v)
}

/// Runs `f` on a fresh multi-thread tokio runtime with an overall timeout.
pub fn with_runtime<F, T>(f: F) -> T
where
    F: std::future::Future<Output = T>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), f)
            .await
            .expect("test timed out")
    })
}

pub async fn connect(addr: SocketAddr) -> ringkv_client::Client {
    ringkv_client::Client::connect_timeout(addr, WAIT)
        .await
        .expect("connect")
}

/// GET over a fresh connection (checks that a normal client is served).
pub fn ping_works(addr: SocketAddr) {
    with_runtime(async {
        let c = connect(addr).await;
        tokio::time::timeout(WAIT, c.ping())
            .await
            .expect("ping timed out")
            .expect("ping");
        c.put("liveness", "ok").await.expect("put");
        assert_eq!(
            c.get("liveness").await.expect("get").as_deref(),
            Some(&b"ok"[..])
        );
    });
}

/// Standard base64 with padding, for HTTP Basic authorization headers
/// (test passwords only).
pub fn base64(text: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
