//! A tiny in-test ringkv server on tokio, built on the crate's own codec: an
//! in-memory map behind the real handshake and framing, plus switches that
//! make it misbehave the ways the client must survive. Binds 127.0.0.1 only.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use ringkv_client::protocol::{
    decode_hello, decode_request, encode_error, encode_hello_ack, encode_response, ErrorFrame,
    HelloAck, Limits, OpReply, Request, RequestOp, Response, ServerInfo, Status,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How the fake server behaves.
#[derive(Clone)]
pub struct Options {
    /// Limits advertised in the hello-ack.
    pub limits: Limits,
    /// Limits the decoder enforces; `None` means the advertised ones.
    pub enforced: Option<Limits>,
    /// Refuse every handshake with this status and message.
    pub refuse: Option<(Status, String)>,
    /// Hold every answer until [`FakeServer::release`].
    pub hold: bool,
    /// Answer the first two requests of a connection in reverse order.
    pub swap_first_two: bool,
    /// Answer GETs with a bare OK (not a valid GET reply).
    pub ok_for_get: bool,
    /// After answering this many requests, send ERROR SHUTTING_DOWN with CLOSE.
    pub shut_down_after: Option<usize>,
    /// After reading this many requests, close the socket without answering.
    pub vanish_after: Option<usize>,
    /// Answer to STATS.
    pub stats: Vec<(String, String)>,
    /// Speak protocol versions up to this one only (an older server):
    /// later hellos are refused with UNSUPPORTED naming it.
    pub max_version: Option<u16>,
    /// Act as a read-only user does on the real server: a frame holding a
    /// write (PUT, DELETE, ...) is refused as a whole with an ERROR frame
    /// NO_PERMISSION, and nothing of it is applied.
    pub read_only: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            limits: Limits::default(),
            enforced: None,
            refuse: None,
            hold: false,
            swap_first_two: false,
            ok_for_get: false,
            shut_down_after: None,
            vanish_after: None,
            stats: vec![
                ("shards".into(), "2".into()),
                ("device.wal.profile".into(), "nvme".into()),
            ],
            max_version: None,
            read_only: false,
        }
    }
}

pub struct FakeServer {
    pub addr: SocketAddr,
    /// Requests read so far, over all connections.
    pub received: watch::Receiver<usize>,
    release: watch::Sender<bool>,
    pub store: Arc<Mutex<HashMap<Bytes, Bytes>>>,
}

struct Shared {
    options: Options,
    store: Arc<Mutex<HashMap<Bytes, Bytes>>>,
    received: watch::Sender<usize>,
    release: watch::Receiver<bool>,
    connections: AtomicUsize,
}

impl FakeServer {
    /// Starts the server on the current tokio runtime.
    pub async fn start(options: Options) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let store = Arc::new(Mutex::new(HashMap::new()));
        let (received_tx, received) = watch::channel(0);
        let (release, release_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            options,
            store: Arc::clone(&store),
            received: received_tx,
            release: release_rx,
            connections: AtomicUsize::new(0),
        });
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                shared.connections.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(serve(stream, Arc::clone(&shared)));
            }
        });
        FakeServer {
            addr,
            received,
            release,
            store,
        }
    }

    /// Sends every held answer, and answers at once from now on.
    pub fn release(&self) {
        self.release.send_replace(true);
    }

    /// Waits until the server has read at least `count` requests.
    pub async fn wait_received(&mut self, count: usize) {
        self.received
            .wait_for(|&received| received >= count)
            .await
            .expect("server alive");
    }
}

async fn serve(mut stream: TcpStream, shared: Arc<Shared>) {
    let options = &shared.options;
    let mut buf = BytesMut::new();
    let mut out = BytesMut::new();
    let version = loop {
        match decode_hello(&mut buf) {
            Ok(Some(hello)) => break hello.version,
            Ok(None) => {}
            Err(error) => {
                if let Some(ack) = HelloAck::refusal_for(&error) {
                    encode_hello_ack(&ack, &mut out);
                    let _ = stream.write_all(&out).await;
                }
                return;
            }
        }
        if stream.read_buf(&mut buf).await.unwrap_or(0) == 0 {
            return;
        }
    };
    let too_new = options.max_version.filter(|&max| version > max);
    let refuse = match too_new {
        Some(max) => Some((
            Status::Unsupported,
            format!(
                "protocol version {version} is not supported; this side speaks versions 1..={max}"
            ),
        )),
        None => options.refuse.clone(),
    };
    let ack = match &refuse {
        Some((status, message)) => HelloAck::Refused {
            version: too_new.unwrap_or(version),
            status: *status,
            message: message.clone(),
        },
        None => HelloAck::Accepted {
            version,
            limits: options.limits,
            server: ServerInfo {
                server_id: 0xfeed,
                shard_count: 2,
                server_name: "fake-server".into(),
            },
        },
    };
    encode_hello_ack(&ack, &mut out);
    if stream.write_all(&out).await.is_err() || refuse.is_some() {
        return;
    }
    out.clear();

    let enforced = options.enforced.unwrap_or(options.limits);
    let mut release = shared.release.clone();
    let mut held: Vec<BytesMut> = Vec::new();
    let mut read_count = 0usize;
    let mut answered = 0usize;
    loop {
        // Answer every complete frame in the buffer.
        loop {
            let frame = match decode_request(&mut buf, &enforced) {
                Ok(Some(request)) => {
                    read_count += 1;
                    shared.received.send_modify(|count| *count += 1);
                    if options.vanish_after == Some(read_count) {
                        return;
                    }
                    let mut frame = BytesMut::new();
                    match refusal(options, &request) {
                        Some(error) => encode_error(&error, &mut frame),
                        None => encode_response(&answer(&shared, request), &mut frame),
                    }
                    frame
                }
                Ok(None) => break,
                Err(error) => {
                    let mut frame = BytesMut::new();
                    let error_frame = ErrorFrame::from_decode_error(&error).expect("a real error");
                    encode_error(&error_frame, &mut frame);
                    if error_frame.close {
                        let _ = stream.write_all(&frame).await;
                        return;
                    }
                    frame
                }
            };
            held.push(frame);
        }
        let holding = options.hold && !*release.borrow();
        let swapping = options.swap_first_two && answered == 0;
        let waiting_for_pair = swapping && held.len() < 2;
        if !(holding || waiting_for_pair) {
            if swapping {
                held.swap(0, 1);
            }
            for frame in held.drain(..) {
                answered += 1;
                if stream.write_all(&frame).await.is_err() {
                    return;
                }
                if options.shut_down_after == Some(answered) {
                    let mut bye = BytesMut::new();
                    encode_error(
                        &ErrorFrame {
                            id: None,
                            status: Status::ShuttingDown,
                            message: "the server is shutting down".into(),
                            close: true,
                        },
                        &mut bye,
                    );
                    let _ = stream.write_all(&bye).await;
                    return;
                }
            }
        }
        tokio::select! {
            read = stream.read_buf(&mut buf) => {
                if read.unwrap_or(0) == 0 {
                    return;
                }
            }
            changed = release.changed(), if holding => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

/// The ERROR frame refusing `request` as a whole, as the real server does
/// when an operation of it is not allowed for the user.
fn refusal(options: &Options, request: &Request) -> Option<ErrorFrame> {
    if !options.read_only {
        return None;
    }
    let index = request.ops.iter().position(|op| {
        !matches!(
            op,
            RequestOp::Get { .. }
                | RequestOp::Ping
                | RequestOp::Stats
                | RequestOp::Ttl { .. }
                | RequestOp::Scan { .. }
        )
    })?;
    Some(ErrorFrame {
        id: Some(request.id),
        status: Status::NoPermission,
        message: format!(
            "NOPERM user 'reader' (read-only) has no permission to run operation {index}; \
             nothing of this request was applied"
        ),
        close: false,
    })
}

fn answer(shared: &Shared, request: Request) -> Response {
    let mut store = shared.store.lock().expect("store lock");
    let results = request
        .ops
        .into_iter()
        .map(|op| match op {
            RequestOp::Put { key, value } => {
                store.insert(key, value);
                OpReply::Ok
            }
            RequestOp::Get { .. } if shared.options.ok_for_get => OpReply::Ok,
            RequestOp::Get { key } => match store.get(&key) {
                Some(value) => OpReply::Value(value.clone()),
                None => OpReply::NotFound,
            },
            RequestOp::Delete { key } => match store.remove(&key) {
                Some(_) => OpReply::Ok,
                None => OpReply::NotFound,
            },
            RequestOp::Ping => OpReply::Ok,
            RequestOp::Stats => OpReply::Stats(shared.options.stats.clone()),
            // One step walks every key.
            RequestOp::Scan { .. } => {
                let mut keys: Vec<Bytes> = store.keys().cloned().collect();
                keys.sort();
                OpReply::Keys { cursor: 0, keys }
            }
            // This fake server has no transactions nor expiry times.
            RequestOp::Begin
            | RequestOp::GetForUpdate { .. }
            | RequestOp::Commit
            | RequestOp::Rollback
            | RequestOp::PutExpiring { .. }
            | RequestOp::Expire { .. }
            | RequestOp::Ttl { .. }
            | RequestOp::Backup { .. } => OpReply::Error {
                status: ringkv_client::Status::Unsupported,
                message: "no transactions nor expiry times here".to_string(),
            },
        })
        .collect();
    Response {
        id: request.id,
        results,
    }
}
