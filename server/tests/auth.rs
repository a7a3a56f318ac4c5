//! Passwords and protected mode against the real binary: without the
//! password nothing is served on any listener, with it everything is, a
//! wrong one is refused (after the delay) and counted; a client that never
//! finishes its handshake is closed; a thousand password guessers neither
//! stop other clients nor grow the server without bound; a non-loopback
//! listener without a password refuses to start.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::*;
use ringkv_client::{Client, ClientError, ConnectOptions, Status};
use ringkv_protocol::{
    decode_hello_ack, decode_response, encode_auth, encode_hello, encode_request, Hello, HelloAck,
    Limits, Request, RequestOp, ServerFrame, PROTOCOL_VERSION,
};

const PASSWORD: &str = "correct horse battery staple";
/// `auth_failure_delay` of the test servers.
const FAILURE_DELAY: Duration = Duration::from_millis(150);

/// Starts a server whose password is in a file, with /metrics on.
fn start_with_password(dir: &Path, extra_config: &str) -> ServerProcess {
    let pw = dir.join("password");
    std::fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    let cfg = dir.join("ringkv.toml");
    std::fs::write(
        &cfg,
        format!(
            "[storage]\nwal_segment_size = \"8MiB\"\n[server]\nauth_failure_delay = \"{}ms\"\n{extra_config}",
            FAILURE_DELAY.as_millis()
        ),
    )
    .unwrap();
    start_server(
        &dir.join("d"),
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--password-file",
            pw.to_str().unwrap(),
            "--metrics-listen",
            "127.0.0.1:0",
            "--shards",
            "2",
        ],
    )
}

fn options(password: Option<&str>) -> ConnectOptions {
    let mut options = ConnectOptions::new().with_timeout(WAIT);
    options.password = password.map(|p| p.as_bytes().to_vec());
    options
}

async fn connect_with(addr: SocketAddr, password: Option<&str>) -> Result<Client, ClientError> {
    Client::connect_with(&addr.to_string(), &options(password)).await
}

/// The hello (+ auth block) bytes a client sends.
fn hello_bytes(version: u16, password: Option<&[u8]>) -> BytesMut {
    let mut b = BytesMut::new();
    match password {
        None => encode_hello(&Hello { version, flags: 0 }, &mut b),
        Some(p) => {
            let flags = ringkv_protocol::hello_flags::AUTH;
            encode_hello(&Hello { version, flags }, &mut b);
            encode_auth(p, &mut b);
        }
    }
    b
}

fn request_bytes(id: u64, op: RequestOp) -> BytesMut {
    let mut b = BytesMut::new();
    encode_request(&Request { id, ops: vec![op] }, &mut b);
    b
}

/// Sends `bytes`, reads to the close, and returns the refusal; asserts that
/// nothing followed it (no request was answered).
fn refused(addr: SocketAddr, bytes: &[u8]) -> (Status, String, u16) {
    let mut s = raw_connect(addr);
    s.write_all(bytes).unwrap();
    let mut reply = BytesMut::from(&read_to_close(&mut s)[..]);
    match decode_hello_ack(&mut reply) {
        Ok(Some(HelloAck::Refused {
            status,
            message,
            version,
        })) => {
            assert!(
                reply.is_empty(),
                "{} bytes followed the refusal: a request was answered",
                reply.len()
            );
            (status, message, version)
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn all_ops() -> Vec<RequestOp> {
    vec![
        RequestOp::Put {
            key: Bytes::from_static(b"stolen"),
            value: Bytes::from_static(b"x"),
        },
        RequestOp::Get {
            key: Bytes::from_static(b"stolen"),
        },
        RequestOp::Delete {
            key: Bytes::from_static(b"stolen"),
        },
        RequestOp::Ping,
        RequestOp::Stats,
    ]
}

/// GET /metrics, with HTTP Basic credentials when `password` is given.
fn scrape(addr: SocketAddr, password: Option<&str>) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let auth = password
        .map(|p| {
            format!(
                "Authorization: Basic {}\r\n",
                base64(&format!("prometheus:{p}"))
            )
        })
        .unwrap_or_default();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The value of a metric line `name value` (or `name{labels} value`).
fn metric(page: &str, name: &str) -> u64 {
    page.lines()
        .find(|l| {
            l.starts_with(name) && l[name.len()..].starts_with([' ', '{']) && !l.starts_with('#')
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or_else(|| panic!("no metric {name} in\n{page}"))
}

fn ringkv(addr: SocketAddr, password: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(cli_binary());
    cmd.arg("--server")
        .arg(addr.to_string())
        .args(["--timeout", "20"])
        .args(args)
        .env_remove("RINGKV_PASSWORD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(p) = password {
        cmd.env("RINGKV_PASSWORD", p);
    }
    cmd.output().expect("run ringkv")
}

#[test]
fn without_the_password_every_operation_is_refused_on_every_listener() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_with_password(dir.path(), "");
    let addr = server.addr;

    // Native, protocol 2 without a password: every kind of operation,
    // pipelined right behind the hello, gets AUTH_REQUIRED and nothing else.
    for (id, op) in all_ops().into_iter().enumerate() {
        let mut bytes = hello_bytes(2, None);
        bytes.extend_from_slice(&request_bytes(id as u64 + 1, op.clone()));
        let (status, message, _) = refused(addr, &bytes);
        assert_eq!(status, Status::AuthRequired, "{op:?}: {message}");
        assert!(message.contains("password"), "{message}");
    }
    // Protocol 1 cannot carry a password: UNSUPPORTED, naming the latest version.
    let mut bytes = hello_bytes(1, None);
    bytes.extend_from_slice(&request_bytes(1, RequestOp::Ping));
    let (status, message, version) = refused(addr, &bytes);
    assert_eq!(
        (status, version),
        (Status::Unsupported, PROTOCOL_VERSION),
        "{message}"
    );
    assert!(message.contains("requires a password"), "{message}");

    // The Rust client and the CLI without a password.
    with_runtime(async {
        match connect_with(addr, None).await {
            Err(ClientError::Refused { status, .. }) => assert_eq!(status, Status::AuthRequired),
            other => panic!("expected a refusal, got {other:?}"),
        }
    });
    let cli = ringkv(addr, None, &["ping"]);
    assert_eq!(cli.status.code(), Some(3), "{cli:?}");
    assert!(
        String::from_utf8_lossy(&cli.stderr).contains("AUTH_REQUIRED"),
        "{cli:?}"
    );

    // /metrics without credentials.
    let metrics = server.metrics_addr.unwrap();
    let page = scrape(metrics, None);
    assert!(page.starts_with("HTTP/1.1 401 "), "{page}");
    assert!(!page.contains("ringkv_"), "{page}");

    // None of the refused PUTs was applied.
    with_runtime(async {
        let c = connect_with(addr, Some(PASSWORD)).await.expect("connect");
        assert_eq!(c.get("stolen").await.unwrap(), None);
    });
}

#[test]
fn with_the_password_everything_works() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_with_password(dir.path(), "");
    let addr = server.addr;
    with_runtime(async {
        let c = connect_with(addr, Some(PASSWORD)).await.expect("connect");
        assert_eq!(c.protocol_version(), PROTOCOL_VERSION);
        c.ping().await.unwrap();
        c.put("k", "v").await.unwrap();
        assert_eq!(c.get("k").await.unwrap().as_deref(), Some(&b"v"[..]));
        assert!(c.delete("k").await.unwrap());
        let stats = c.stats().await.unwrap();
        assert!(
            stats.iter().any(|(n, _)| n == "server.auth_failures"),
            "{stats:?}"
        );
    });
    // A raw version-2 hello with the password, requests pipelined behind it.
    let mut bytes = hello_bytes(2, Some(PASSWORD.as_bytes()));
    bytes.extend_from_slice(&request_bytes(7, RequestOp::Ping));
    let mut s = raw_connect(addr);
    s.write_all(&bytes).unwrap();
    let mut buf = BytesMut::new();
    let mut chunk = [0u8; 4096];
    let ack = loop {
        if let Some(ack) = decode_hello_ack(&mut buf).unwrap() {
            break ack;
        }
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "closed before the ack");
        buf.extend_from_slice(&chunk[..n]);
    };
    assert!(
        matches!(ack, HelloAck::Accepted { version: 2, .. }),
        "{ack:?}"
    );
    let frame = loop {
        if let Some(frame) = decode_response(&mut buf, &Limits::default()).unwrap() {
            break frame;
        }
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "closed before the answer");
        buf.extend_from_slice(&chunk[..n]);
    };
    assert!(
        matches!(frame, ServerFrame::Response(ref r) if r.id == 7),
        "{frame:?}"
    );

    let put = ringkv(addr, Some(PASSWORD), &["put", "cli", "yes"]);
    assert!(put.status.success(), "{put:?}");
    let get = ringkv(addr, Some(PASSWORD), &["get", "cli"]);
    assert_eq!(String::from_utf8_lossy(&get.stdout), "yes\n", "{get:?}");

    let page = scrape(server.metrics_addr.unwrap(), Some(PASSWORD));
    assert!(page.starts_with("HTTP/1.1 200 "), "{page}");
    assert_eq!(metric(&page, "ringkv_auth_required"), 1);
}

#[test]
fn a_wrong_password_is_refused_after_the_delay_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_with_password(dir.path(), "");
    let addr = server.addr;
    let metrics = server.metrics_addr.unwrap();
    let before = metric(
        &scrape(metrics, Some(PASSWORD)),
        "ringkv_auth_failures_total",
    );

    let started = Instant::now();
    let (status, message, _) = refused(addr, &hello_bytes(2, Some(b"correct horse")));
    // A sleep of the delay happens first; this bound cannot fail on a slow machine.
    assert!(
        started.elapsed() >= FAILURE_DELAY,
        "answered after {:?}",
        started.elapsed()
    );
    assert_eq!(status, Status::AuthFailed, "{message}");
    assert!(!message.contains(PASSWORD), "{message}");

    with_runtime(async {
        match connect_with(addr, Some("nope")).await {
            Err(ClientError::Refused { status, .. }) => assert_eq!(status, Status::AuthFailed),
            other => panic!("expected a refusal, got {other:?}"),
        }
    });
    let cli = ringkv(addr, Some("also wrong"), &["ping"]);
    assert_eq!(cli.status.code(), Some(3), "{cli:?}");
    assert!(
        String::from_utf8_lossy(&cli.stderr).contains("AUTH_FAILED"),
        "{cli:?}"
    );
    // A wrong password on /metrics.
    let page = scrape(metrics, Some("guess"));
    assert!(page.starts_with("HTTP/1.1 401 "), "{page}");

    let page = scrape(metrics, Some(PASSWORD));
    assert_eq!(
        metric(&page, "ringkv_auth_failures_total") - before,
        4,
        "three native refusals and one /metrics refusal"
    );
    assert!(
        page.contains("ringkv_connections_closed_total{reason=\"auth_failed\"} 3"),
        "{page}"
    );
    let log = server.log().join("\n");
    assert!(log.contains("authentication failed"), "{log}");
    assert!(!log.contains(PASSWORD), "the log never shows the password");
}

#[test]
fn a_password_sent_to_a_server_without_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &["--shards", "1"]);
    let (status, message, _) = refused(server.addr, &hello_bytes(2, Some(b"pw")));
    assert_eq!(status, Status::AuthFailed);
    assert!(message.contains("no password"), "{message}");
    // Version 1 and 2 clients without a password are served.
    ping_works(server.addr);
    let mut v1 = RawConn {
        stream: raw_connect(server.addr),
        buf: BytesMut::new(),
        limits: Limits::default(),
    };
    v1.send_raw(&hello_bytes(1, None));
    assert!(matches!(
        v1.read_hello_ack(),
        HelloAck::Accepted { version: 1, .. }
    ));
    v1.send(3, vec![RequestOp::Ping]);
    assert!(matches!(v1.read_frame(), Some(ServerFrame::Response(r)) if r.id == 3));
}

#[test]
fn protected_mode_refuses_a_non_loopback_listener_without_a_password() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["--listen", "0.0.0.0:0"][..],
        &["--listen", "127.0.0.1:0", "--metrics-listen", "0.0.0.0:0"][..],
    ] {
        let out = Command::new(server_binary())
            .arg("--data-dir")
            .arg(dir.path().join("d"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run ringkv-server");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        for needle in [
            "protected mode",
            "0.0.0.0:0",
            "server.requirepass",
            "server.password_file",
            "--dangerously-listen-without-password",
        ] {
            assert!(stderr.contains(needle), "{needle} missing from: {stderr}");
        }
        assert!(!dir.path().join("d").exists(), "nothing was started");
    }
    // The same address with a password file is accepted by the checks
    // (--print-config validates and exits without binding anything).
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "x\n").unwrap();
    let out = Command::new(server_binary())
        .args(["--listen", "0.0.0.0:0", "--print-config", "--password-file"])
        .arg(&pw)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn print_config_redacts_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("ringkv.toml");
    std::fs::write(&cfg, "[server]\nrequirepass = \"hunter2-secret\"\n").unwrap();
    let out = Command::new(server_binary())
        .args(["--print-config", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("requirepass = \"<redacted>\""), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

#[test]
fn a_client_that_never_finishes_the_handshake_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_with_password(dir.path(), "handshake_timeout = \"300ms\"\n");
    let addr = server.addr;
    let mut partial_auth = BytesMut::new();
    encode_hello(&Hello::with_password(), &mut partial_auth);
    partial_auth.extend_from_slice(&[40, 0, b'a', b'b']); // 40 bytes announced, 2 sent
    let stalls: [&[u8]; 3] = [b"", b"RKV", &partial_auth];
    let mut conns = Vec::new();
    for bytes in stalls {
        let mut s = raw_connect(addr);
        s.write_all(bytes).unwrap();
        conns.push(s);
    }
    for mut s in conns {
        let started = Instant::now();
        let rest = read_to_close(&mut s);
        assert!(rest.is_empty(), "no answer to a half handshake: {rest:?}");
        assert!(started.elapsed() < WAIT);
    }
    with_runtime(async {
        let c = connect_with(addr, Some(PASSWORD)).await.expect("connect");
        c.ping().await.unwrap();
    });
    // The socket is shut down when the deadline passes; the connection's
    // task counts the close when it next runs, which on a loaded machine
    // can be after the client saw the close. Wait for the count.
    let name = "ringkv_connections_closed_total{reason=\"handshake_timeout\"}";
    let deadline = Instant::now() + WAIT;
    loop {
        let page = scrape(server.metrics_addr.unwrap(), Some(PASSWORD));
        let closed = metric(&page, name);
        if closed == 3 {
            break;
        }
        assert!(closed < 3 && Instant::now() < deadline, "{page}");
        std::thread::sleep(Duration::from_millis(20));
    }
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

#[test]
fn a_thousand_password_guessers_are_refused_and_others_keep_being_served() {
    const GUESSERS: usize = 1000;
    if raise_fd_limit() < (2 * GUESSERS + 100) as u64 {
        eprintln!(
            "skipped: the open-files limit is below {}",
            2 * GUESSERS + 100
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = start_with_password(dir.path(), "handshake_timeout = \"60s\"\n");
    let addr = server.addr;
    let metrics = server.metrics_addr.unwrap();

    // Memory: hold GUESSERS connections that sent only part of a handshake.
    let rss_before = rss_bytes(server.pid());
    let mut held = Vec::with_capacity(GUESSERS);
    for _ in 0..GUESSERS {
        let mut s = raw_connect(addr);
        s.write_all(&hello_bytes(2, None)[..6]).unwrap();
        held.push(s);
    }
    // Let the server accept and park every one of them.
    let deadline = Instant::now() + WAIT;
    while metric(&scrape(metrics, Some(PASSWORD)), "ringkv_connections_open") < GUESSERS as u64 {
        assert!(Instant::now() < deadline, "connections were not accepted");
        std::thread::sleep(Duration::from_millis(50));
    }
    let grown = rss_bytes(server.pid()).saturating_sub(rss_before);
    let per_connection = grown / GUESSERS as u64;
    println!("{GUESSERS} unauthenticated connections: RSS grew {grown} bytes, {per_connection} per connection");
    assert!(
        per_connection < 32 * 1024,
        "an unauthenticated connection costs {per_connection} bytes"
    );
    drop(held);

    // GUESSERS connections with wrong passwords at once, while a real client works.
    let worker = std::thread::spawn(move || {
        with_runtime(async {
            let c = connect_with(addr, Some(PASSWORD)).await.expect("connect");
            for i in 0..200u64 {
                c.put(key(i), value(i, 100))
                    .await
                    .expect("served during the attack");
                assert_eq!(c.get(key(i)).await.unwrap(), Some(value(i, 100)));
            }
        })
    });
    let mut guessers = Vec::with_capacity(GUESSERS);
    for i in 0..GUESSERS {
        let mut s = raw_connect(addr);
        s.write_all(&hello_bytes(2, Some(format!("guess-{i}").as_bytes())))
            .unwrap();
        guessers.push(s);
    }
    let mut refused_count = 0;
    for mut s in guessers {
        let mut reply = BytesMut::from(&read_to_close(&mut s)[..]);
        match decode_hello_ack(&mut reply) {
            Ok(Some(HelloAck::Refused { status, .. })) => {
                assert_eq!(status, Status::AuthFailed);
                refused_count += 1;
            }
            Ok(None) if reply.is_empty() => {} // closed (reset) before the answer
            other => panic!("unexpected answer to a wrong password: {other:?}"),
        }
    }
    worker.join().expect("the real client was served");
    assert!(refused_count > 0);
    let page = scrape(metrics, Some(PASSWORD));
    assert!(
        metric(&page, "ringkv_auth_failures_total") >= GUESSERS as u64,
        "{page}"
    );
    ping_with_password(addr);
}

fn ping_with_password(addr: SocketAddr) {
    with_runtime(async {
        let c = connect_with(addr, Some(PASSWORD)).await.expect("connect");
        c.ping().await.unwrap();
    });
}
