//! The listeners' defences against the real binary: TLS on the RESP port
//! (certificates, client certificates, reload), the RESP pre-auth deadline
//! and buffer bound, what a TLS handshake costs before the client proved
//! anything, and the metrics endpoint under slow and wrong-password
//! clients, with `/healthz` and `/readyz`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::certs::{issue, new_ca};
use common::*;
use ringkv_client::TlsOptions;

const PASSWORD: &str = "listener test password";

/// Starts a server with a RESP listener and a metrics endpoint; `server`
/// is extra `[server]` lines. Returns the server and its RESP address.
fn start(dir: &Path, server: &str) -> (ServerProcess, SocketAddr) {
    let cfg = dir.join("ringkv.toml");
    std::fs::write(
        &cfg,
        format!("[storage]\nwal_segment_size = \"8MiB\"\n[server]\n{server}"),
    )
    .unwrap();
    let server = start_server(
        &dir.join("d"),
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--resp-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--shards",
            "2",
        ],
    );
    let line = server.wait_for_log("ringkv-server ready");
    let resp = field(&line, "resp").parse().unwrap();
    (server, resp)
}

/// A blocking RESP client over any stream; every read has a timeout.
struct Resp<S: Read + Write> {
    stream: S,
    buf: Vec<u8>,
}

impl<S: Read + Write> Resp<S> {
    fn send(&mut self, args: &[&[u8]]) -> std::io::Result<()> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        self.stream.write_all(&out)?;
        self.stream.flush()
    }

    /// One reply's first line, and the bulk body if it is a bulk string.
    fn reply(&mut self) -> std::io::Result<(String, Option<Vec<u8>>)> {
        let line = self.line()?;
        if let Some(len) = line.strip_prefix('$') {
            let len: i64 = len.parse().unwrap();
            if len < 0 {
                return Ok((line, None));
            }
            let len = len as usize;
            while self.buf.len() < len + 2 {
                self.fill()?;
            }
            let body = self.buf.drain(..len + 2).take(len).collect();
            return Ok((line, Some(body)));
        }
        Ok((line, None))
    }

    fn line(&mut self) -> std::io::Result<String> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = self.buf.drain(..end + 2).take(end).collect();
                return Ok(String::from_utf8_lossy(&line).into_owned());
            }
            self.fill()?;
        }
    }

    fn fill(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    fn call(&mut self, args: &[&[u8]]) -> std::io::Result<String> {
        self.send(args)?;
        Ok(self.reply()?.0)
    }
}

fn plain(addr: SocketAddr) -> Resp<TcpStream> {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    Resp {
        stream,
        buf: Vec::new(),
    }
}

type TlsStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A RESP client over TLS, trusting `ca`, with an optional client
/// certificate.
fn tls(addr: SocketAddr, ca: &Path, client_cert: Option<(PathBuf, PathBuf)>) -> Resp<TlsStream> {
    let mut options = TlsOptions::new().with_ca_file(ca);
    options.client_cert = client_cert;
    let config = Arc::new(options.client_config().unwrap());
    let name = options.server_name("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(config, name).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    Resp {
        stream: rustls::StreamOwned::new(conn, tcp),
        buf: Vec::new(),
    }
}

/// RESP over TLS: AUTH, a value spanning many TLS records, a pipeline.
fn resp_round_trip<S: Read + Write>(c: &mut Resp<S>) -> std::io::Result<()> {
    assert_eq!(c.call(&[b"AUTH", PASSWORD.as_bytes()])?, "+OK");
    let value = vec![b'v'; 200_000];
    assert_eq!(c.call(&[b"SET", b"tls-key", &value])?, "+OK");
    c.send(&[b"GET", b"tls-key"])?;
    let (line, body) = c.reply()?;
    assert_eq!(line, "$200000");
    assert_eq!(body.unwrap(), value);
    for i in 0..100u32 {
        c.send(&[b"INCR", b"counter"])?;
        let _ = i;
    }
    for i in 1..=100 {
        assert_eq!(c.reply()?.0, format!(":{i}"));
    }
    assert_eq!(c.call(&[b"DEL", b"counter"])?, ":1");
    Ok(())
}

/// TLS on the RESP port: a trusting client is served; plaintext gets
/// nothing; a client that trusts another CA refuses the server; after a
/// rotation and SIGHUP, new connections get the new certificate.
#[test]
fn resp_speaks_tls_and_reloads_its_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ca = new_ca(dir, "one");
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    issue(&ca, &["127.0.0.1"], &cert, &key);
    let (server, resp) = start(
        dir,
        &format!(
            "requirepass = \"{PASSWORD}\"\ntls_resp = true\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
            cert.display(),
            key.display()
        ),
    );
    let mut c = tls(resp, &ca.pem, None);
    resp_round_trip(&mut c).expect("RESP over TLS");

    // Plaintext RESP on the TLS port is not served.
    let mut p = plain(resp);
    let answer = p.call(&[b"PING"]);
    assert!(answer.is_err(), "plaintext was answered: {answer:?}");

    // Rotate to a certificate from another CA and reload.
    let two = new_ca(dir, "two");
    issue(&two, &["127.0.0.1"], &cert, &key);
    server.signal(libc::SIGHUP);
    server.wait_for_log("TLS certificate files reloaded");
    let mut old_trust = tls(resp, &ca.pem, None);
    assert!(
        old_trust.call(&[b"PING"]).is_err(),
        "a client trusting the old CA accepted the new certificate"
    );
    let mut c = tls(resp, &two.pem, None);
    resp_round_trip(&mut c).expect("RESP over TLS after the reload");
}

/// With `server.tls_client_ca_file`, the RESP port refuses a client
/// without a certificate and one whose certificate another CA signed.
#[test]
fn resp_requires_client_certificates_when_a_client_ca_is_set() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ca = new_ca(dir, "server");
    let clients = new_ca(dir, "clients");
    let stranger = new_ca(dir, "stranger");
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    issue(&ca, &["127.0.0.1"], &cert, &key);
    let good = (dir.join("good.pem"), dir.join("good.key"));
    issue(&clients, &["client.example"], &good.0, &good.1);
    let bad = (dir.join("bad.pem"), dir.join("bad.key"));
    issue(&stranger, &["client.example"], &bad.0, &bad.1);
    let (server, resp) = start(
        dir,
        &format!(
            "requirepass = \"{PASSWORD}\"\ntls_resp = true\ntls_cert_file = \"{}\"\n\
             tls_key_file = \"{}\"\ntls_client_ca_file = \"{}\"\n",
            cert.display(),
            key.display(),
            clients.pem.display()
        ),
    );
    // TLS 1.3 reports a refused client certificate after the client's side
    // of the handshake: the first exchange fails either way.
    let mut none = tls(resp, &ca.pem, None);
    assert!(
        none.call(&[b"PING"]).is_err(),
        "served without a certificate"
    );
    let mut wrong = tls(resp, &ca.pem, Some(bad));
    assert!(
        wrong.call(&[b"PING"]).is_err(),
        "served with a certificate of another CA"
    );
    let mut right = tls(resp, &ca.pem, Some(good));
    resp_round_trip(&mut right).expect("served with a good certificate");
    let page = scrape(server.metrics_addr.unwrap(), Some(PASSWORD)).1;
    let tls_errors = metric(
        &page,
        "ringkv_connections_closed_total{reason=\"tls_error\"}",
    );
    assert!(tls_errors >= 2, "{tls_errors} TLS errors counted");
}

/// With a password, a RESP connection that does not authenticate within
/// `server.handshake_timeout` is closed (not after `idle_timeout`), even
/// while it sends commands; one that authenticated stays open.
#[test]
fn resp_closes_connections_that_do_not_authenticate_in_time() {
    let tmp = tempfile::tempdir().unwrap();
    let (server, resp) = start(
        tmp.path(),
        &format!("requirepass = \"{PASSWORD}\"\nhandshake_timeout = \"500ms\"\n"),
    );
    let started = Instant::now();
    let mut silent = plain(resp);
    let mut chatty = plain(resp);
    let mut authed = plain(resp);
    assert_eq!(authed.call(&[b"AUTH", PASSWORD.as_bytes()]).unwrap(), "+OK");
    // The chatty one keeps sending commands it may not run.
    let mut chatty_closed = None;
    while started.elapsed() < Duration::from_secs(10) {
        match chatty.call(&[b"GET", b"k"]) {
            Ok(reply) => assert!(reply.starts_with("-NOAUTH"), "{reply}"),
            Err(_) => {
                chatty_closed = Some(started.elapsed());
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let chatty_closed = chatty_closed.expect("an unauthenticated client was not closed");
    assert!(
        chatty_closed >= Duration::from_millis(400),
        "{chatty_closed:?}"
    );
    // The silent one is gone too: its read sees the close.
    silent
        .stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut byte = [0u8; 1];
    let read = silent.stream.read(&mut byte);
    assert!(
        matches!(&read, Ok(0))
            || matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "{read:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // The authenticated one is served past the deadline.
    assert_eq!(authed.call(&[b"SET", b"a", b"1"]).unwrap(), "+OK");
    let page = scrape(server.metrics_addr.unwrap(), Some(PASSWORD)).1;
    assert!(
        metric(
            &page,
            "ringkv_connections_closed_total{reason=\"handshake_timeout\"}"
        ) >= 2,
        "{page}"
    );
}

/// Before AUTH a RESP client may not make the server buffer more than the
/// native port's pre-auth buffer: a command declaring more is refused as
/// soon as its length is read (its body never sent), as is a longer line
/// or a huge array; after AUTH, large values work.
#[test]
fn resp_refuses_oversized_commands_before_auth() {
    let tmp = tempfile::tempdir().unwrap();
    let (_server, resp) = start(tmp.path(), &format!("requirepass = \"{PASSWORD}\"\n"));
    let refused = |input: &[u8]| {
        let mut c = plain(resp);
        c.stream.write_all(input).unwrap();
        let started = Instant::now();
        let line = c.line().expect("an error reply before the body was sent");
        assert!(
            line.starts_with("-ERR Protocol error: unauthenticated"),
            "{line}"
        );
        assert!(c.line().is_err(), "the connection stays open after {line}");
        assert!(started.elapsed() < Duration::from_secs(5));
    };
    // 5,000 bytes declared: under Redis's 16 KiB, over the pre-auth buffer.
    refused(b"*2\r\n$4\r\nAUTH\r\n$5000\r\n");
    // 100 MB declared.
    refused(b"*2\r\n$3\r\nGET\r\n$100000000\r\n");
    // A huge array.
    refused(b"*1000000\r\n");
    // An inline command that never ends.
    let mut line = b"AUTH ".to_vec();
    line.resize(4096, b'x');
    refused(&line);
    // Several small arguments adding up past the bound.
    let mut parts = b"*5\r\n$4\r\nAUTH\r\n".to_vec();
    for _ in 0..3 {
        parts.extend_from_slice(b"$400\r\n");
        parts.extend_from_slice(&[b'p'; 400]);
        parts.extend_from_slice(b"\r\n");
    }
    refused(&parts);

    // A long but legal AUTH fits; then large commands are accepted.
    let mut c = plain(resp);
    assert_eq!(
        c.call(&[b"AUTH", b"default", &[b'x'; 512]]).unwrap(),
        "-WRONGPASS invalid username-password pair or user is disabled."
    );
    assert_eq!(c.call(&[b"AUTH", PASSWORD.as_bytes()]).unwrap(), "+OK");
    let value = vec![b'v'; 100_000];
    assert_eq!(c.call(&[b"SET", b"big", &value]).unwrap(), "+OK");
    assert_eq!(c.call(&[b"STRLEN", b"big"]).unwrap(), ":100000");
}

/// Resident memory of a process, from /proc.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

fn raise_fd_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out pointer; then raising the soft limit to the hard one.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
    }
    limit.rlim_cur
}

/// What a TLS handshake costs the server before the client proved
/// anything: connections that sent their ClientHello and stopped, held
/// open, on the native port. Prints the measured cost per connection.
#[test]
fn a_stalled_tls_handshake_costs_little_memory() {
    const STALLED: usize = 1000;
    if raise_fd_limit() < (STALLED + 100) as u64 {
        eprintln!("skipped: the open-files limit is below {}", STALLED + 100);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ca = new_ca(dir, "one");
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    issue(&ca, &["127.0.0.1"], &cert, &key);
    let (server, _) = start(
        dir,
        &format!(
            "requirepass = \"{PASSWORD}\"\nhandshake_timeout = \"120s\"\ntls_native = true\n\
             tls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
            cert.display(),
            key.display()
        ),
    );
    let options = TlsOptions::new().with_ca_file(&ca.pem);
    let config = Arc::new(options.client_config().unwrap());
    let hello = || {
        let name = options.server_name("127.0.0.1").unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::clone(&config), name).unwrap();
        let mut bytes = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut bytes).unwrap();
        }
        bytes
    };
    let metrics = server.metrics_addr.unwrap();
    let open = || {
        metric(
            &scrape(metrics, Some(PASSWORD)).1,
            "ringkv_connections_open",
        )
    };
    // Warm up: the first connections grow the server's allocator arenas.
    let mut held = Vec::with_capacity(STALLED + 50);
    for _ in 0..50 {
        let mut s = TcpStream::connect(server.addr).unwrap();
        s.write_all(&hello()).unwrap();
        held.push(s);
    }
    wait_until(|| open() >= 50);
    std::thread::sleep(Duration::from_millis(300));
    let before = rss_bytes(server.pid());
    for _ in 0..STALLED {
        let mut s = TcpStream::connect(server.addr).unwrap();
        s.write_all(&hello()).unwrap();
        held.push(s);
    }
    wait_until(|| open() >= (STALLED + 50) as u64);
    // Let every server task process its ClientHello and answer it.
    std::thread::sleep(Duration::from_millis(500));
    let grown = rss_bytes(server.pid()).saturating_sub(before);
    let per_connection = grown / STALLED as u64;
    println!(
        "{STALLED} TLS handshakes stalled after the ClientHello: RSS grew {grown} bytes, \
         {per_connection} per connection"
    );
    assert!(
        per_connection < 24 * 1024,
        "a stalled TLS handshake costs {per_connection} bytes"
    );
    drop(held);
    ping_works_tls(server.addr, &ca.pem);
}

fn ping_works_tls(addr: SocketAddr, ca: &Path) {
    let options = ringkv_client::ConnectOptions::new()
        .with_password(PASSWORD.as_bytes())
        .with_tls(TlsOptions::new().with_ca_file(ca))
        .with_timeout(WAIT);
    with_runtime(async {
        let c = ringkv_client::Client::connect_with(&addr.to_string(), &options)
            .await
            .expect("connect");
        c.ping().await.expect("ping");
    });
}

fn wait_until(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// GET `path` on the metrics endpoint: (status line, whole answer).
fn http_get(addr: SocketAddr, path: &str, password: Option<&str>) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let auth = password
        .map(|p| format!("Authorization: Basic {}\r\n", base64(&format!("u:{p}"))))
        .unwrap_or_default();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n").unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.lines().next().unwrap_or("").to_string();
    (status, text)
}

fn scrape(addr: SocketAddr, password: Option<&str>) -> (String, String) {
    http_get(addr, "/metrics", password)
}

fn metric(page: &str, name: &str) -> u64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .map(|v| v.trim().parse::<f64>().unwrap() as u64)
        .unwrap_or_else(|| panic!("no {name} in the page"))
}

/// 64 clients that connect and send half a request head (and then
/// nothing) do not stop a scrape: it completes while they hold their
/// connections, and each of them is cut off by the read deadline.
#[test]
fn slow_clients_do_not_stop_a_scrape() {
    let tmp = tempfile::tempdir().unwrap();
    let (server, _) = start(tmp.path(), &format!("requirepass = \"{PASSWORD}\"\n"));
    let metrics = server.metrics_addr.unwrap();
    let mut slow = Vec::new();
    for _ in 0..64 {
        let mut s = TcpStream::connect(metrics).unwrap();
        s.write_all(b"GET /metr").unwrap();
        slow.push(s);
    }
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let (status, page) = scrape(metrics, Some(PASSWORD));
    let took = started.elapsed();
    assert!(status.starts_with("HTTP/1.1 200 "), "{status}");
    assert!(page.contains("ringkv_connections_open"));
    // Served one at a time, it would wait 2 s (the head deadline) per
    // slow client: over two minutes.
    assert!(
        took < Duration::from_secs(10),
        "a scrape took {took:?} behind 64 slow clients"
    );
    // The slow clients are closed by the read deadline, not kept forever.
    for mut s in slow {
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
    }
    assert!(started.elapsed() < WAIT);
}

/// Wrong passwords wait `server.auth_failure_delay` on their own
/// connection: a right-password scrape sent while many of them wait is
/// answered without waiting for them.
#[test]
fn wrong_passwords_do_not_delay_a_right_scrape() {
    let tmp = tempfile::tempdir().unwrap();
    let (server, _) = start(
        tmp.path(),
        &format!("requirepass = \"{PASSWORD}\"\nauth_failure_delay = \"5s\"\n"),
    );
    let metrics = server.metrics_addr.unwrap();
    let started = Instant::now();
    let (status, _) = scrape(metrics, Some(PASSWORD));
    let alone = started.elapsed();
    assert!(status.starts_with("HTTP/1.1 200 "), "{status}");
    let guessers: Vec<_> = (0..16)
        .map(|i| std::thread::spawn(move || scrape(metrics, Some(&format!("guess-{i}")))))
        .collect();
    // Let the guessers reach the server first.
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let (status, _) = scrape(metrics, Some(PASSWORD));
    let beside_guessers = started.elapsed();
    assert!(status.starts_with("HTTP/1.1 200 "), "{status}");
    // Behind even one guesser it would take 5 s more.
    assert!(
        beside_guessers < alone + Duration::from_secs(3),
        "a scrape took {beside_guessers:?} beside wrong passwords (alone: {alone:?}); \
         the failure delay is 5 s"
    );
    for g in guessers {
        let (status, _) = g.join().unwrap();
        assert!(status.starts_with("HTTP/1.1 401 "), "{status}");
    }
}

/// `/healthz` and `/readyz` need no password and answer 200 on a serving
/// server; `/readyz` answers 503 while recovery runs (made slow with a
/// throttled WAL device, as in the RESP loading test), then 200. Meanwhile
/// the RESP port with TLS answers `-LOADING` inside TLS.
#[test]
fn healthz_and_readyz() {
    use std::io::BufRead;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let data = dir.join("data");
    let fast = dir.join("fast.toml");
    std::fs::write(
        &fast,
        format!(
            "[storage]\nwal_segment_size = \"8MiB\"\ncheckpoint_wal_bytes = \"1GiB\"\n\
             [server]\nrequirepass = \"{PASSWORD}\"\n"
        ),
    )
    .unwrap();
    {
        let mut server = start_server(
            &data,
            &[
                "--config",
                fast.to_str().unwrap(),
                "--metrics-listen",
                "127.0.0.1:0",
                "--shards",
                "1",
            ],
        );
        let metrics = server.metrics_addr.unwrap();
        assert!(http_get(metrics, "/healthz", None)
            .0
            .starts_with("HTTP/1.1 200 "));
        let (status, body) = http_get(metrics, "/readyz", None);
        assert!(status.starts_with("HTTP/1.1 200 "), "{body}");
        assert!(scrape(metrics, None).0.starts_with("HTTP/1.1 401 "));
        let options = ringkv_client::ConnectOptions::new()
            .with_password(PASSWORD.as_bytes())
            .with_timeout(WAIT);
        let addr = server.addr.to_string();
        with_runtime(async {
            let c = ringkv_client::Client::connect_with(&addr, &options)
                .await
                .unwrap();
            for i in 0..512u64 {
                c.put(key(i), value(i, 8 * 1024)).await.unwrap();
            }
        });
        // No checkpoint at a clean stop: recovery replays the WAL.
        server.kill9();
    }
    let ca = new_ca(dir, "one");
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    issue(&ca, &["127.0.0.1"], &cert, &key);
    let slow = dir.join("slow.toml");
    std::fs::write(
        &slow,
        format!(
            "[storage]\nwal_segment_size = \"8MiB\"\ncheckpoint_wal_bytes = \"1GiB\"\n\
             [server]\nrequirepass = \"{PASSWORD}\"\ntls_resp = true\n\
             tls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n\
             [profiles.slow]\niops = 400\nburst_iops = 400\nio_unit = \"4KiB\"\n\
             [devices.wal]\nprofile = \"slow\"\n",
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(server_binary())
        .arg("--data-dir")
        .arg(&data)
        .args(["--config", slow.to_str().unwrap()])
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--resp-listen", "127.0.0.1:0", "--shards", "1"])
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn ringkv-server");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let next_line_with = |needle: &str| -> String {
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("no log line with {needle:?}"));
            if line.contains(needle) {
                return line;
            }
            assert!(
                !line.contains("ringkv-server ready") || needle.contains("ready"),
                "ready before the test saw the endpoint loading: {line}"
            );
        }
    };
    let line = next_line_with("answers -LOADING");
    let resp: SocketAddr = field(&line, "resp").parse().unwrap();
    let line = next_line_with("answers /readyz 503");
    let metrics: SocketAddr = field(&line, "metrics").parse().unwrap();
    assert!(http_get(metrics, "/healthz", None)
        .0
        .starts_with("HTTP/1.1 200 "));
    let (status, body) = http_get(metrics, "/readyz", None);
    assert!(status.starts_with("HTTP/1.1 503 "), "{body}");
    assert!(body.contains("loading"), "{body}");
    let mut c = tls(resp, &ca.pem, None);
    assert_eq!(
        c.call(&[b"PING"]).expect("a TLS answer while loading"),
        "-LOADING ringkv is loading the dataset in memory"
    );
    let ready = next_line_with("ringkv-server ready");
    assert_eq!(
        field(&ready, "metrics").parse::<SocketAddr>().unwrap(),
        metrics
    );
    let (status, body) = http_get(metrics, "/readyz", None);
    assert!(status.starts_with("HTTP/1.1 200 "), "{body}");
    let (status, page) = scrape(metrics, Some(PASSWORD));
    assert!(status.starts_with("HTTP/1.1 200 "), "{page}");
    let mut c = tls(resp, &ca.pem, None);
    resp_round_trip(&mut c).expect("RESP over TLS after recovery");
    let _ = child.kill();
    let _ = child.wait();
}
