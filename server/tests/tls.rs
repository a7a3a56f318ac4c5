//! TLS end to end against the real binary, with certificates generated here
//! (rcgen): the Rust client and the CLI with `--ca` / `--insecure`,
//! `openssl s_client` (skipped with a message where openssl is absent),
//! HTTPS /metrics, client certificates, reload on SIGHUP, and the bad
//! inputs: a plaintext client on the TLS port, a TLS client on a plaintext
//! port, an untrusted certificate, a TLS handshake that never finishes.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::certs::{issue, new_ca, Ca};
use common::*;
use ringkv_client::{Client, ClientError, ConnectOptions, TlsOptions};
use ringkv_protocol::{
    decode_hello_ack, decode_response, encode_auth, encode_hello, encode_request, Hello, HelloAck,
    Limits, Request, RequestOp, ServerFrame, Status, PROTOCOL_VERSION,
};

const PASSWORD: &str = "tls test password";

struct Setup {
    _dir: tempfile::TempDir,
    server: ServerProcess,
    ca: Ca,
    dir: PathBuf,
}

/// A server with a password and TLS on the native listener (and on
/// /metrics), its certificate for localhost and 127.0.0.1; `extra` adds
/// config lines to `[server]`.
fn start_tls(extra: &str) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let ca = new_ca(&dir, "one");
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    issue(&ca, &["localhost", "127.0.0.1"], &cert, &key);
    let cfg = dir.join("ringkv.toml");
    std::fs::write(
        &cfg,
        format!(
            "[storage]\nwal_segment_size = \"8MiB\"\n[server]\nrequirepass = \"{PASSWORD}\"\n\
             tls_native = true\ntls_metrics = true\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n{extra}",
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let server = start_server(
        &dir.join("d"),
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--metrics-listen",
            "127.0.0.1:0",
            "--shards",
            "2",
        ],
    );
    Setup {
        _dir: tmp,
        server,
        ca,
        dir,
    }
}

fn tls_options(ca: Option<&Path>, insecure: bool) -> ConnectOptions {
    ConnectOptions::new()
        .with_password(PASSWORD.as_bytes())
        .with_tls({
            let mut tls = TlsOptions::new().with_insecure(insecure);
            tls.ca_file = ca.map(Path::to_path_buf);
            tls
        })
        .with_timeout(WAIT)
}

async fn round_trip(addr: &str, options: &ConnectOptions) -> Result<(), ClientError> {
    let c = Client::connect_with(addr, options).await?;
    c.put("tls-key", vec![7u8; 100_000]).await?;
    assert_eq!(
        c.get("tls-key").await?.as_deref(),
        Some(&[7u8; 100_000][..])
    );
    // A batch whose answer spans many TLS records.
    let ops: Vec<RequestOp> = (0..50u64)
        .map(|i| RequestOp::Put {
            key: key(i),
            value: value(i, 4000),
        })
        .collect();
    c.batch(ops).await?;
    c.ping().await?;
    Ok(())
}

#[test]
fn the_rust_client_and_the_cli_speak_tls() {
    let s = start_tls("");
    let addr = s.server.addr;
    with_runtime(async {
        for host in [
            format!("127.0.0.1:{}", addr.port()),
            format!("localhost:{}", addr.port()),
        ] {
            round_trip(&host, &tls_options(Some(&s.ca.pem), false))
                .await
                .unwrap_or_else(|e| panic!("{host}: {e}"));
        }
        round_trip(&addr.to_string(), &tls_options(None, true))
            .await
            .expect("--insecure");
        // Without a CA and without --insecure the client refuses to guess.
        match Client::connect_with(&addr.to_string(), &tls_options(None, false)).await {
            Err(ClientError::TlsSetup(_)) => {}
            other => panic!("expected a setup error, got {other:?}"),
        }
    });
    let out = Command::new(cli_binary())
        .args(["--server", &addr.to_string(), "--ca"])
        .arg(&s.ca.pem)
        .args(["put", "cli-tls", "ok"])
        .env("RINGKV_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = Command::new(cli_binary())
        .args([
            "--server",
            &addr.to_string(),
            "--insecure",
            "get",
            "cli-tls",
        ])
        .env("RINGKV_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n", "{out:?}");
}

#[test]
fn bad_tls_inputs_are_refused_and_the_server_keeps_serving() {
    let s = start_tls("handshake_timeout = \"3s\"\n");
    let addr = s.server.addr;
    let good = tls_options(Some(&s.ca.pem), false);

    // A plaintext client on the TLS port: its hello is not TLS; closed.
    let mut plain = raw_connect(addr);
    let mut hello = BytesMut::new();
    encode_hello(&Hello::with_password(), &mut hello);
    encode_auth(PASSWORD.as_bytes(), &mut hello);
    plain.write_all(&hello).unwrap();
    let reply = read_to_close(&mut plain);
    assert!(
        decode_hello_ack(&mut BytesMut::from(&reply[..])).is_err() || reply.is_empty(),
        "a plaintext client gets no ringkv answer: {reply:?}"
    );
    with_runtime(async {
        // The Rust client without TLS.
        let mut plain = good.clone();
        plain.tls = None;
        assert!(Client::connect_with(&addr.to_string(), &plain)
            .await
            .is_err());
        // A certificate from another CA.
        let other = new_ca(&s.dir, "other");
        match Client::connect_with(&addr.to_string(), &tls_options(Some(&other.pem), false)).await {
            Err(ClientError::TlsHandshake { source, .. }) => {
                assert!(source.to_string().contains("UnknownIssuer"), "{source}")
            }
            other => panic!("expected an untrusted certificate, got {other:?}"),
        }
        // The wrong name.
        let mut wrong_name = good.clone();
        wrong_name.tls.as_mut().unwrap().server_name = Some("db.example.com".into());
        assert!(Client::connect_with(&addr.to_string(), &wrong_name)
            .await
            .is_err());
        // The right certificate and the wrong password.
        let mut wrong_password = good.clone();
        wrong_password.password = Some(b"guess".to_vec());
        match Client::connect_with(&addr.to_string(), &wrong_password).await {
            Err(ClientError::Refused { status, .. }) => assert_eq!(status, Status::AuthFailed),
            other => panic!("expected AUTH_FAILED, got {other:?}"),
        }
    });
    // A TLS handshake that never finishes: a ClientHello cut short, and silence.
    let mut stalled = raw_connect(addr);
    stalled
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .unwrap();
    let mut silent = raw_connect(addr);
    let started = Instant::now();
    read_to_close(&mut stalled);
    read_to_close(&mut silent);
    assert!(started.elapsed() < WAIT);
    with_runtime(async {
        round_trip(&addr.to_string(), &good)
            .await
            .expect("still serving")
    });
    // A timed-out handshake's socket is shut first and its close counted
    // when its task next runs: poll for the count.
    let deadline = Instant::now() + WAIT;
    let page = loop {
        let page = https_get(s.server.metrics_addr.unwrap(), &s.ca.pem, Some(PASSWORD));
        if page.contains("ringkv_connections_closed_total{reason=\"handshake_timeout\"} 2") {
            break page;
        }
        assert!(Instant::now() < deadline, "{page}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        !page.contains("ringkv_connections_closed_total{reason=\"tls_error\"} 0"),
        "TLS errors are counted: {page}"
    );
}

#[test]
fn a_tls_client_on_a_plaintext_port_gets_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let ca = new_ca(dir.path(), "one");
    let server = start_server(&dir.path().join("d"), &["--shards", "1"]);
    with_runtime(async {
        let options = ConnectOptions::new()
            .with_tls(TlsOptions::new().with_ca_file(&ca.pem))
            .with_timeout(WAIT);
        match Client::connect_with(&server.addr.to_string(), &options).await {
            Err(ClientError::TlsHandshake { .. }) => {}
            other => panic!("expected a TLS handshake error, got {other:?}"),
        }
    });
    // The server saw a bad magic and said so, then kept serving.
    ping_works(server.addr);
    assert!(server.log().join("\n").contains("bad magic"));
}

/// HTTPS GET /metrics with a rustls client.
fn https_get(addr: SocketAddr, ca: &Path, password: Option<&str>) -> String {
    let options = TlsOptions::new().with_ca_file(ca);
    let config = Arc::new(options.client_config().unwrap());
    let name = options.server_name("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(config, name).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let auth = password
        .map(|p| {
            // "u:" + password, base64 by hand (only test passwords here).
            format!("Authorization: Basic {}\r\n", base64(&format!("u:{p}")))
        })
        .unwrap_or_default();
    write!(tls, "GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}\r\n").unwrap();
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn metrics_are_served_over_https_with_the_password() {
    let s = start_tls("");
    let metrics = s.server.metrics_addr.unwrap();
    let page = https_get(metrics, &s.ca.pem, Some(PASSWORD));
    assert!(page.starts_with("HTTP/1.1 200 "), "{page}");
    assert!(page.contains("ringkv_auth_required 1"), "{page}");
    let denied = https_get(metrics, &s.ca.pem, None);
    assert!(denied.starts_with("HTTP/1.1 401 "), "{denied}");
    // Plain HTTP on the HTTPS port gets nothing readable.
    let mut plain = TcpStream::connect(metrics).unwrap();
    plain.set_read_timeout(Some(WAIT)).unwrap();
    plain.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut out = Vec::new();
    let _ = plain.read_to_end(&mut out);
    assert!(!String::from_utf8_lossy(&out).contains("ringkv_"));
}

#[test]
fn client_certificates_are_required_when_a_client_ca_is_set() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ca = new_ca(dir, "server");
    let client_ca = new_ca(dir, "clients");
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    issue(&ca, &["127.0.0.1"], &cert, &key);
    let (ccert, ckey) = (dir.join("client.pem"), dir.join("client.key"));
    issue(&client_ca, &["client.example"], &ccert, &ckey);
    let server = start_server(
        &dir.join("d"),
        &[
            "--shards",
            "1",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls-client-ca",
            client_ca.pem.to_str().unwrap(),
        ],
    );
    let addr = server.addr.to_string();
    with_runtime(async {
        let mut options = ConnectOptions::new()
            .with_tls(TlsOptions::new().with_ca_file(&ca.pem))
            .with_timeout(WAIT);
        // TLS 1.3 reports a missing client certificate after the client's
        // handshake is done: the first exchange fails either way.
        let without = match Client::connect_with(&addr, &options).await {
            Ok(c) => c.ping().await.map(|_| ()),
            Err(e) => Err(e),
        };
        assert!(without.is_err(), "no client certificate must not be served");
        options.tls.as_mut().unwrap().client_cert = Some((ccert.clone(), ckey.clone()));
        let c = Client::connect_with(&addr, &options)
            .await
            .expect("with a client certificate");
        c.ping().await.unwrap();
    });
}

#[test]
fn certificates_are_reloaded_on_sighup() {
    let s = start_tls("");
    let addr = s.server.addr.to_string();
    let old = tls_options(Some(&s.ca.pem), false);
    with_runtime(async {
        let held = Client::connect_with(&addr, &old).await.expect("before");

        let ca2 = new_ca(&s.dir, "two");
        issue(
            &ca2,
            &["127.0.0.1"],
            &s.dir.join("server.pem"),
            &s.dir.join("server.key"),
        );
        s.server.signal(libc::SIGHUP);
        s.server.wait_for_log("TLS certificate files reloaded");
        let new = tls_options(Some(&ca2.pem), false);
        round_trip(&addr, &new)
            .await
            .expect("the new certificate is served");
        assert!(
            Client::connect_with(&addr, &old).await.is_err(),
            "the old CA no longer matches"
        );
        // A connection opened before the reload keeps working.
        held.ping().await.expect("old connection");

        // A broken file is refused and the current certificate stays.
        std::fs::write(s.dir.join("server.key"), "not a key").unwrap();
        s.server.signal(libc::SIGHUP);
        s.server.wait_for_log("TLS reload failed");
        round_trip(&addr, &new)
            .await
            .expect("still the new certificate");
    });
}

#[test]
fn openssl_s_client_talks_to_the_tls_listener() {
    if Command::new("openssl").arg("version").output().is_err() {
        assert!(
            std::env::var_os("RINGKV_REQUIRE_OPENSSL").is_none(),
            "RINGKV_REQUIRE_OPENSSL is set but openssl is not installed"
        );
        eprintln!("skipped: openssl is not installed (scripts/ci-security.sh installs it)");
        return;
    }
    let s = start_tls("");
    let mut child = Command::new("openssl")
        .args(["s_client", "-quiet", "-verify_return_error", "-connect"])
        .arg(s.server.addr.to_string())
        .arg("-CAfile")
        .arg(&s.ca.pem)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn openssl");
    let mut input = BytesMut::new();
    encode_hello(&Hello::with_password(), &mut input);
    encode_auth(PASSWORD.as_bytes(), &mut input);
    encode_request(
        &Request {
            id: 9,
            ops: vec![RequestOp::Ping],
        },
        &mut input,
    );
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&input).unwrap();
    stdin.flush().unwrap();
    // Read the answers on a thread so a silent server cannot hang the test.
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = BytesMut::new();
        let mut chunk = [0u8; 4096];
        let mut ack = None;
        loop {
            if ack.is_none() {
                ack = decode_hello_ack(&mut buf).ok().flatten();
            }
            if ack.is_some() {
                if let Ok(Some(frame)) = decode_response(&mut buf, &Limits::default()) {
                    let _ = tx.send(Some((ack, frame)));
                    return;
                }
            }
            match stdout.read(&mut chunk) {
                Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                _ => {
                    let _ = tx.send(None);
                    return;
                }
            }
        }
    });
    let got = rx.recv_timeout(WAIT);
    drop(stdin);
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    let Ok(Some((ack, frame))) = got else {
        panic!(
            "no answer through openssl s_client: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    assert!(
        matches!(
            ack,
            Some(HelloAck::Accepted {
                version: PROTOCOL_VERSION,
                ..
            })
        ),
        "{ack:?}"
    );
    assert!(
        matches!(frame, ServerFrame::Response(ref r) if r.id == 9),
        "{frame:?}"
    );
    // Give the log a moment, then check the server is fine.
    std::thread::sleep(Duration::from_millis(50));
    with_runtime(async {
        round_trip(
            &s.server.addr.to_string(),
            &tls_options(Some(&s.ca.pem), false),
        )
        .await
        .unwrap()
    });
}
