//! The tokio `Client` against the in-test fake server: handshake, pipelining
//! from many tasks on one connection, the in-flight bound, answer matching,
//! and every way a connection can fail.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{FakeServer, Options};
use ringkv_client::protocol::LimitError;
use ringkv_client::{Client, ClientError, Limits, OpReply, ProtocolError, RequestOp, Status};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Bounds every await in these tests, so a bug fails instead of hanging.
const TEST_DEADLINE: Duration = Duration::from_secs(20);

async fn bounded<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TEST_DEADLINE, future)
        .await
        .expect("test step timed out")
}

/// A fake server advertising `limits`, and a client connected to it.
async fn connected_with(limits: Limits) -> (FakeServer, Client) {
    let server = FakeServer::start(Options {
        limits,
        ..Options::default()
    })
    .await;
    let client = bounded(Client::connect(server.addr)).await.unwrap();
    (server, client)
}

fn key(text: &str) -> Bytes {
    Bytes::from(text.as_bytes().to_vec())
}

#[tokio::test]
async fn handshake_exposes_limits_and_server_info() {
    let limits = Limits {
        pipeline_depth_max: 7,
        key_bytes_max: 100,
        ..Limits::default()
    };
    let (server, client) = connected_with(limits).await;
    assert_eq!(client.limits(), &limits);
    assert_eq!(client.server_info().server_name, "fake-server");
    assert_eq!(client.server_info().shard_count, 2);
    assert_eq!(client.server_info().server_id, 0xfeed);
    assert_eq!(
        client.protocol_version(),
        ringkv_client::protocol::PROTOCOL_VERSION
    );
    assert_eq!(client.peer_addr(), server.addr);
}

#[tokio::test]
async fn conveniences_round_trip() {
    let server = FakeServer::start(Options::default()).await;
    let client = bounded(Client::connect(server.addr)).await.unwrap();
    bounded(client.put("k", "v")).await.unwrap();
    assert_eq!(bounded(client.get("k")).await.unwrap(), Some(key("v")));
    assert_eq!(bounded(client.get("missing")).await.unwrap(), None);
    assert!(bounded(client.delete("k")).await.unwrap());
    assert!(!bounded(client.delete("k")).await.unwrap());
    bounded(client.ping()).await.unwrap();
    let stats = bounded(client.stats()).await.unwrap();
    assert!(
        stats.contains(&("device.wal.profile".into(), "nvme".into())),
        "{stats:?}"
    );
    assert_eq!(bounded(client.batch(vec![])).await.unwrap(), vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_share_one_connection() {
    let server = FakeServer::start(Options::default()).await;
    let client = Arc::new(bounded(Client::connect(server.addr)).await.unwrap());
    let tasks: Vec<_> = (0..32)
        .map(|task| {
            let client = Arc::clone(&client);
            tokio::spawn(async move {
                for round in 0..20 {
                    let name = format!("t{task}-r{round}");
                    let ops = vec![
                        RequestOp::Put {
                            key: key(&name),
                            value: key(&format!("value of {name}")),
                        },
                        RequestOp::Get { key: key(&name) },
                        RequestOp::Get {
                            key: key(&format!("{name}-missing")),
                        },
                        RequestOp::Delete { key: key(&name) },
                        RequestOp::Get { key: key(&name) },
                    ];
                    let replies = client.batch(ops).await.unwrap();
                    assert_eq!(
                        replies,
                        vec![
                            OpReply::Ok,
                            OpReply::Value(key(&format!("value of {name}"))),
                            OpReply::NotFound,
                            OpReply::Ok,
                            OpReply::NotFound,
                        ]
                    );
                }
            })
        })
        .collect();
    for task in tasks {
        bounded(task).await.unwrap();
    }
    assert_eq!(*server.received.borrow(), 32 * 20);
}

#[tokio::test]
async fn in_flight_frames_never_exceed_the_pipeline_depth() {
    let limits = Limits {
        pipeline_depth_max: 4,
        ..Limits::default()
    };
    let mut server = FakeServer::start(Options {
        limits,
        hold: true,
        ..Options::default()
    })
    .await;
    let client = Arc::new(bounded(Client::connect(server.addr)).await.unwrap());
    let tasks: Vec<_> = (0..10)
        .map(|n| {
            let client = Arc::clone(&client);
            tokio::spawn(async move { client.get(format!("k{n}")).await })
        })
        .collect();
    bounded(server.wait_received(4)).await;
    // Give a misbehaving client time to send more. A slow machine can only
    // hide a violation here, never invent one.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        *server.received.borrow(),
        4,
        "more frames in flight than the server allows"
    );
    server.release();
    for task in tasks {
        assert_eq!(bounded(task).await.unwrap().unwrap(), None);
    }
    assert_eq!(*server.received.borrow(), 10);
}

#[tokio::test]
async fn limits_are_checked_before_sending() {
    let limits = Limits {
        key_bytes_max: 4,
        value_bytes_max: 8,
        ops_per_frame_max: 3,
        ..Limits::default()
    };
    let (server, client) = connected_with(limits).await;
    let error = bounded(client.put("toolong", "v")).await.unwrap_err();
    assert!(
        matches!(
            error,
            ClientError::Limit(LimitError::KeyTooLarge {
                index: 0,
                len: 7,
                max: 4
            })
        ),
        "{error}"
    );
    let error = bounded(client.get("")).await.unwrap_err();
    assert!(
        matches!(error, ClientError::Limit(LimitError::EmptyKey { index: 0 })),
        "{error}"
    );
    let error = bounded(client.batch(vec![RequestOp::Ping; 4]))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            ClientError::Limit(LimitError::TooManyOps { count: 4, max: 3 })
        ),
        "{error}"
    );
    // Nothing reached the server, and the connection is still fine.
    assert_eq!(*server.received.borrow(), 0);
    bounded(client.ping()).await.unwrap();
}

#[tokio::test]
async fn a_rejected_request_fails_alone() {
    // The server advertises 16-byte keys but enforces 4: its decoder rejects
    // the frame with an ERROR naming the request, and the connection lives on.
    let limits = Limits {
        key_bytes_max: 16,
        ..Limits::default()
    };
    let enforced = Limits {
        key_bytes_max: 4,
        ..limits
    };
    let server = FakeServer::start(Options {
        limits,
        enforced: Some(enforced),
        ..Options::default()
    })
    .await;
    let client = bounded(Client::connect(server.addr)).await.unwrap();
    let error = bounded(client.put("longkey", "v")).await.unwrap_err();
    match error {
        ClientError::Server { status, message } => {
            assert_eq!(status, Status::KeyTooLarge);
            assert!(message.contains("7 bytes"), "{message}");
        }
        other => panic!("expected a server error, got {other}"),
    }
    bounded(client.put("k", "v")).await.unwrap();
    assert_eq!(bounded(client.get("k")).await.unwrap(), Some(key("v")));
}

#[tokio::test]
async fn answers_out_of_order_are_a_protocol_violation() {
    let mut server = FakeServer::start(Options {
        swap_first_two: true,
        ..Options::default()
    })
    .await;
    let client = Arc::new(bounded(Client::connect(server.addr)).await.unwrap());
    let first = {
        let client = Arc::clone(&client);
        tokio::spawn(async move { client.ping().await })
    };
    bounded(server.wait_received(1)).await;
    let second = {
        let client = Arc::clone(&client);
        tokio::spawn(async move { client.ping().await })
    };
    for task in [first, second] {
        let error = bounded(task).await.unwrap().unwrap_err();
        assert!(
            matches!(
                error,
                ClientError::Protocol(ProtocolError::IdMismatch {
                    expected: 1,
                    got: 2
                })
            ),
            "{error}"
        );
    }
    let error = bounded(client.ping()).await.unwrap_err();
    assert!(matches!(error, ClientError::Closed { .. }), "{error}");
    assert!(client
        .closed_reason()
        .unwrap()
        .contains("protocol violation"));
}

#[tokio::test]
async fn a_reply_of_the_wrong_kind_is_a_protocol_violation() {
    let server = FakeServer::start(Options {
        ok_for_get: true,
        ..Options::default()
    })
    .await;
    let client = bounded(Client::connect(server.addr)).await.unwrap();
    let error = bounded(client.get("k")).await.unwrap_err();
    assert!(
        matches!(
            error,
            ClientError::Protocol(ProtocolError::UnexpectedReply {
                index: 0,
                op: "GET",
                reply: Status::Ok,
                ..
            })
        ),
        "{error}"
    );
    assert!(matches!(
        bounded(client.ping()).await.unwrap_err(),
        ClientError::Closed { .. }
    ));
}

#[tokio::test]
async fn a_closing_error_frame_fails_everything_outstanding() {
    let limits = Limits {
        pipeline_depth_max: 16,
        ..Limits::default()
    };
    let mut server = FakeServer::start(Options {
        limits,
        hold: true,
        shut_down_after: Some(1),
        ..Options::default()
    })
    .await;
    let client = Arc::new(bounded(Client::connect(server.addr)).await.unwrap());
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let client = Arc::clone(&client);
            tokio::spawn(async move { client.ping().await })
        })
        .collect();
    bounded(server.wait_received(3)).await;
    server.release();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(bounded(task).await.unwrap());
    }
    // One request was answered, the two others get the shutdown.
    assert_eq!(
        outcomes.iter().filter(|outcome| outcome.is_ok()).count(),
        1,
        "{outcomes:?}"
    );
    for outcome in outcomes.iter().filter(|outcome| outcome.is_err()) {
        match outcome {
            Err(ClientError::Server {
                status: Status::ShuttingDown,
                message,
            }) => {
                assert!(message.contains("shutting down"))
            }
            other => panic!("expected SHUTTING_DOWN, got {other:?}"),
        }
    }
    let error = bounded(client.ping()).await.unwrap_err();
    match error {
        ClientError::Closed { reason } => assert!(reason.contains("SHUTTING_DOWN"), "{reason}"),
        other => panic!("expected Closed, got {other}"),
    }
}

#[tokio::test]
async fn a_vanished_server_fails_outstanding_and_later_calls() {
    let server = FakeServer::start(Options {
        vanish_after: Some(2),
        ..Options::default()
    })
    .await;
    let client = bounded(Client::connect(server.addr)).await.unwrap();
    bounded(client.ping()).await.unwrap();
    let error = bounded(client.ping()).await.unwrap_err();
    match error {
        ClientError::Closed { reason } => {
            assert!(reason.contains("closed the connection"), "{reason}")
        }
        other => panic!("expected Closed, got {other}"),
    }
    assert!(matches!(
        bounded(client.ping()).await.unwrap_err(),
        ClientError::Closed { .. }
    ));
}

#[tokio::test]
async fn a_refused_handshake_reports_status_and_message() {
    let server = FakeServer::start(Options {
        refuse: Some((Status::Overloaded, "too many connections".into())),
        ..Options::default()
    })
    .await;
    let error = bounded(Client::connect(server.addr)).await.unwrap_err();
    match error {
        ClientError::Refused {
            status,
            message,
            server_version,
        } => {
            assert_eq!(
                (status, message.as_str(), server_version),
                (
                    Status::Overloaded,
                    "too many connections",
                    ringkv_client::protocol::PROTOCOL_VERSION
                )
            );
        }
        other => panic!("expected Refused, got {other}"),
    }
}

#[tokio::test]
async fn a_server_that_is_not_ringkv_is_detected() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut hello = [0u8; 8];
        stream.read_exact(&mut hello).await.unwrap();
        stream.write_all(b"-ERR unknown command\r\n").await.unwrap();
        // Keep the socket open until the client hangs up.
        let _ = stream.read(&mut hello).await;
    });
    let error = bounded(Client::connect(addr)).await.unwrap_err();
    assert!(
        matches!(error, ClientError::Protocol(ProtocolError::Decode(ref decode)) if decode.to_string().contains("bad magic")),
        "{error}"
    );
}

#[tokio::test]
async fn a_silent_server_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let error = bounded(Client::connect_timeout(addr, Duration::from_millis(200)))
        .await
        .unwrap_err();
    assert!(matches!(error, ClientError::Timeout { .. }), "{error}");
    drop(listener);
}

#[tokio::test]
async fn a_missing_server_is_a_connect_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let error = bounded(Client::connect(addr)).await.unwrap_err();
    match error {
        ClientError::Connect { addrs, .. } => assert_eq!(addrs, vec![addr]),
        other => panic!("expected Connect, got {other}"),
    }
}

#[tokio::test]
async fn an_older_server_is_spoken_to_in_its_version() {
    let server = FakeServer::start(Options {
        max_version: Some(2),
        ..Options::default()
    })
    .await;
    let client = bounded(Client::connect(server.addr)).await.unwrap();
    assert_eq!(client.protocol_version(), 2);
    bounded(client.put(key("k"), key("v"))).await.unwrap();
    assert_eq!(bounded(client.get(key("k"))).await.unwrap(), Some(key("v")));
    // Version 3 operations fail before anything is sent.
    match bounded(client.ttl(key("k"))).await {
        Err(ClientError::NeedsVersion {
            op: "TTL",
            since: 3,
            version: 2,
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        bounded(client.scan(0, 10, Bytes::new())).await,
        Err(ClientError::NeedsVersion { op: "SCAN", .. })
    ));
    // Nothing reached the server but the PUT and the GET.
    assert_eq!(*server.received.borrow(), 2);
    // A current server is spoken to in the latest version.
    let current = FakeServer::start(Options::default()).await;
    let client = bounded(Client::connect(current.addr)).await.unwrap();
    assert_eq!(
        client.protocol_version(),
        ringkv_client::protocol::PROTOCOL_VERSION
    );
}

/// A TLS server reading a plain ringkv hello answers with a TLS alert
/// record; `bytes_first` is how much of it goes in the first write.
async fn tls_alert_server(bytes_first: usize) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut hello = [0u8; 8];
        stream.read_exact(&mut hello).await.unwrap();
        // Alert record, TLS 1.2 record version, 2 bytes: fatal, decode_error.
        let alert = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32];
        stream.write_all(&alert[..bytes_first]).await.unwrap();
        stream.flush().await.unwrap();
        stream.write_all(&alert[bytes_first..]).await.unwrap();
        // Keep the socket open until the client hangs up.
        let _ = stream.read(&mut hello).await;
    });
    addr
}

#[tokio::test]
async fn a_tls_server_reached_without_tls_is_named() {
    // Whole, or split so the client first sees a single byte.
    for bytes_first in [7, 1] {
        let addr = tls_alert_server(bytes_first).await;
        let error = bounded(Client::connect(addr)).await.unwrap_err();
        match &error {
            ClientError::TlsRequired { peer, first_bytes } => {
                assert_eq!(*peer, addr);
                assert_eq!(first_bytes[..3], [0x15, 0x03, 0x03]);
            }
            other => panic!("expected TlsRequired, got {other}"),
        }
        assert!(error.to_string().contains("speaks TLS"), "{error}");
    }
}

#[test]
fn connect_options_are_built_with_setters() {
    let options = ringkv_client::ConnectOptions::new()
        .with_user("app")
        .with_password(b"pw".to_vec())
        .with_tls(ringkv_client::TlsOptions::default())
        .with_timeout(Duration::from_millis(1500));
    assert_eq!(options.user.as_deref(), Some(&b"app"[..]));
    assert_eq!(options.password.as_deref(), Some(&b"pw"[..]));
    assert!(options.tls.is_some());
    assert_eq!(options.timeout, Duration::from_millis(1500));
    // Debug never shows the password.
    assert!(format!("{options:?}").contains("<redacted>"), "{options:?}");
    let default = ringkv_client::ConnectOptions::default();
    assert_eq!(
        (default.user, default.password, default.tls.is_none()),
        (None, None, true)
    );
    assert_eq!(default.timeout, ringkv_client::CONNECT_TIMEOUT_DEFAULT);
}
