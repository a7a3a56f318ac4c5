//! Property-based fuzzing of the server's per-connection byte processing
//! (`Session`): random and mutated byte streams, split at random points,
//! driven the way the connection reader drives it.
//!
//! Properties, for every input:
//! - no panic; the buffer never grows past one frame plus one read chunk;
//! - a well-formed stream yields the hello-ack then exactly its requests, in
//!   order, however it is split; requests breaking a per-op limit get an
//!   ERROR frame naming their id, and the stream goes on;
//! - on a connection of an older protocol version, a request holding an
//!   operation of a later version gets an UNSUPPORTED ERROR frame naming its
//!   id, and the stream goes on;
//! - a damaged stream yields a correct prefix of that, then at most one
//!   close, and nothing after the close.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use ringkv_protocol::{
    decode_hello_ack, decode_response, encode_hello, encode_request, Hello, HelloAck, Limits,
    Request, RequestOp, ServerFrame, ServerInfo, Status, PROTOCOL_VERSION, SCAN_PATTERN_BYTES_MAX,
};
use ringkv_server::native::session::{feed_checked, CloseReason, Session, Step};

/// The reader's smallest read; the buffer may exceed a frame by this much.
const CHUNK: usize = 4096;

fn limits() -> Limits {
    Limits {
        frame_bytes_max: 16 * 1024,
        ops_per_frame_max: 16,
        key_bytes_max: 32,
        value_bytes_max: 2048,
        pipeline_depth_max: 4,
    }
}

fn new_session() -> Session {
    Session::accepting(
        limits(),
        ServerInfo {
            server_id: 1,
            shard_count: 2,
            server_name: "fuzz".into(),
        },
    )
}

fn drive(input: &[u8], cuts: &[usize]) -> Vec<Step> {
    feed_checked(&mut new_session(), input, cuts, CHUNK)
}

fn key_strategy() -> impl Strategy<Value = Bytes> {
    // Mostly valid keys, sometimes empty or over the 32-byte limit.
    prop_oneof![
        8 => prop::collection::vec(any::<u8>(), 1..=32),
        1 => Just(Vec::new()),
        1 => prop::collection::vec(any::<u8>(), 33..=40),
    ]
    .prop_map(Bytes::from)
}

fn op_strategy() -> impl Strategy<Value = RequestOp> {
    prop_oneof![
        4 => (key_strategy(), prop::collection::vec(any::<u8>(), 0..=2100))
            .prop_map(|(key, value)| RequestOp::Put { key, value: Bytes::from(value) }),
        4 => key_strategy().prop_map(|key| RequestOp::Get { key }),
        2 => key_strategy().prop_map(|key| RequestOp::Delete { key }),
        1 => Just(RequestOp::Ping),
        1 => Just(RequestOp::Stats),
        2 => (key_strategy(), prop::collection::vec(any::<u8>(), 0..=2100), any::<u64>())
            .prop_map(|(key, value, expires_at_ms)| RequestOp::PutExpiring {
                key,
                value: Bytes::from(value),
                expires_at_ms,
            }),
        1 => (key_strategy(), any::<u64>())
            .prop_map(|(key, expires_at_ms)| RequestOp::Expire { key, expires_at_ms }),
        1 => key_strategy().prop_map(|key| RequestOp::Ttl { key }),
        // Patterns sometimes over the limit (the encoder allows up to the
        // u16 field; the limit is 256).
        1 => (
            any::<u64>(),
            any::<u32>(),
            prop_oneof![
                8 => prop::collection::vec(any::<u8>(), 0..=SCAN_PATTERN_BYTES_MAX),
                1 => prop::collection::vec(any::<u8>(), SCAN_PATTERN_BYTES_MAX + 1..=300),
            ],
        )
            .prop_map(|(cursor, count, pattern)| RequestOp::Scan {
                cursor,
                count,
                pattern: Bytes::from(pattern),
            }),
    ]
}

fn request_strategy() -> impl Strategy<Value = Request> {
    // Up to 18 ops: sometimes over the 16-op limit.
    (any::<u64>(), prop::collection::vec(op_strategy(), 1..=18))
        .prop_map(|(id, ops)| Request { id, ops })
}

fn encode_stream(requests: &[Request]) -> Vec<u8> {
    encode_stream_version(requests, PROTOCOL_VERSION)
}

/// The hello of `version`, then `requests`. SCAN patterns over the limit
/// are written with their true length field (the encoder refuses them).
fn encode_stream_version(requests: &[Request], version: u16) -> Vec<u8> {
    let mut buf = BytesMut::new();
    encode_hello(&Hello { version, flags: 0 }, &mut buf);
    for r in requests {
        encode_request_unchecked(r, &mut buf);
    }
    buf.to_vec()
}

/// Like `encode_request`, but also for SCAN patterns over the limit.
fn encode_request_unchecked(r: &Request, buf: &mut BytesMut) {
    let long_pattern = |op: &RequestOp| matches!(op, RequestOp::Scan { pattern, .. } if pattern.len() > SCAN_PATTERN_BYTES_MAX);
    if !r.ops.iter().any(long_pattern) {
        encode_request(r, buf);
        return;
    }
    let mut body = Vec::new();
    for op in &r.ops {
        match op {
            RequestOp::Scan {
                cursor,
                count,
                pattern,
            } => {
                body.push(op.opcode());
                body.extend_from_slice(&cursor.to_le_bytes());
                body.extend_from_slice(&count.to_le_bytes());
                body.extend_from_slice(&(pattern.len() as u16).to_le_bytes());
                body.extend_from_slice(pattern);
            }
            other => {
                // The op alone in a frame, without the 24-byte header.
                let mut one = BytesMut::new();
                encode_request(
                    &Request {
                        id: 0,
                        ops: vec![other.clone()],
                    },
                    &mut one,
                );
                body.extend_from_slice(&one[24..]);
            }
        }
    }
    let mut after_crc = vec![ringkv_protocol::frame_kind::REQUEST, 0, 0, 0];
    after_crc.extend_from_slice(&(r.ops.len() as u32).to_le_bytes());
    after_crc.extend_from_slice(&r.id.to_le_bytes());
    after_crc.extend_from_slice(&body);
    buf.extend_from_slice(&((4 + after_crc.len()) as u32).to_le_bytes());
    buf.extend_from_slice(&crc32fast::hash(&after_crc).to_le_bytes());
    buf.extend_from_slice(&after_crc);
}

/// What the server must do with one request of a well-formed stream.
#[derive(Debug, PartialEq)]
enum Expect {
    Run(Request),
    Reject { id: u64, status: Status },
    CloseTooLarge,
}

fn expectation(r: &Request) -> Expect {
    expectation_at(r, PROTOCOL_VERSION)
}

/// What the server must do with `r` on a connection of protocol `version`.
fn expectation_at(r: &Request, version: u16) -> Expect {
    // The server judges the length prefix before it looks inside the frame.
    if r.encoded_len() > limits().frame_bytes_max as usize {
        return Expect::CloseTooLarge;
    }
    let reject = |status| Expect::Reject { id: r.id, status };
    if r.ops.len() > limits().ops_per_frame_max as usize {
        return reject(Status::TooManyOps);
    }
    // Op by op, in order: the first op the connection's version lacks or
    // that breaks a limit refuses the request.
    for (index, op) in r.ops.iter().enumerate() {
        if op.since_version() > version {
            return reject(Status::Unsupported);
        }
        if let Err(e) = limits().check_op(index, op) {
            return reject(e.status());
        }
    }
    Expect::Run(r.clone())
}

fn error_frame_of(bytes: &Bytes) -> (Option<u64>, Status, bool) {
    let mut b = BytesMut::from(&bytes[..]);
    match decode_response(&mut b, &limits()) {
        Ok(Some(ServerFrame::Error(e))) => (e.id, e.status, e.close),
        other => panic!("expected an ERROR frame, got {other:?}"),
    }
}

fn check_hello_ack(step: &Step) {
    let Step::Send(bytes) = step else {
        panic!("first step is not the hello-ack: {step:?}")
    };
    let mut b = BytesMut::from(&bytes[..]);
    assert!(matches!(
        decode_hello_ack(&mut b),
        Ok(Some(HelloAck::Accepted { .. }))
    ));
}

/// Checks `steps` (after the hello-ack) against `requests`; returns how many
/// requests were matched before the steps ran out or closed.
fn check_against(requests: &[Request], steps: &[Step], exact: bool) -> usize {
    check_against_at(requests, steps, exact, PROTOCOL_VERSION)
}

fn check_against_at(requests: &[Request], steps: &[Step], exact: bool, version: u16) -> usize {
    let mut matched = 0;
    for step in steps {
        let Some(r) = requests.get(matched) else {
            // Past the known requests only a close may appear (damage).
            assert!(!exact, "extra step {step:?}");
            assert!(matches!(step, Step::Close { .. }), "extra step {step:?}");
            return matched;
        };
        let expect = expectation_at(r, version);
        match (step, &expect) {
            (
                Step::Run {
                    request,
                    frame_bytes,
                },
                Expect::Run(want),
            ) if request == want => {
                assert_eq!(*frame_bytes, want.encoded_len());
            }
            (Step::Send(bytes), Expect::Reject { id, status }) => {
                let (got_id, got_status, close) = error_frame_of(bytes);
                assert_eq!((got_id, got_status, close), (Some(*id), *status, false));
            }
            (
                Step::Close {
                    reply: Some(bytes),
                    reason,
                },
                Expect::CloseTooLarge,
            ) => {
                assert_eq!(*reason, CloseReason::ProtocolError);
                let (_, status, close) = error_frame_of(bytes);
                assert_eq!((status, close), (Status::FrameTooLarge, true));
                return matched;
            }
            (Step::Close { .. }, _) if !exact => return matched,
            (step, expect) => panic!("request {matched}: expected {expect:?}, got {step:?}"),
        }
        matched += 1;
    }
    matched
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_bytes_never_break_the_session(
        input in prop::collection::vec(any::<u8>(), 0..20_000),
        cuts in prop::collection::vec(1usize..3000, 0..50),
    ) {
        let steps = drive(&input, &cuts);
        // Random bytes almost never start with the magic; whatever happens,
        // at most one close and it is last (checked in drive).
        let closes = steps.iter().filter(|s| matches!(s, Step::Close { .. })).count();
        prop_assert!(closes <= 1);
    }

    #[test]
    fn valid_hello_then_garbage(
        garbage in prop::collection::vec(any::<u8>(), 0..20_000),
        cuts in prop::collection::vec(1usize..3000, 0..50),
    ) {
        let mut input = Vec::new();
        let mut hello = BytesMut::new();
        encode_hello(&Hello::current(), &mut hello);
        input.extend_from_slice(&hello);
        input.extend_from_slice(&garbage);
        let steps = drive(&input, &cuts);
        check_hello_ack(&steps[0]);
        for step in &steps[1..] {
            match step {
                Step::Send(bytes) => {
                    let (id, status, close) = error_frame_of(bytes);
                    prop_assert!(id.is_some() && !close && status.is_error());
                }
                Step::Run { request, .. } => {
                    prop_assert_eq!(limits().check_request(request), Ok(()));
                }
                Step::Close { reply, .. } => {
                    if let Some(bytes) = reply {
                        let (_, status, close) = error_frame_of(bytes);
                        prop_assert!(close && status.is_error());
                    }
                }
            }
        }
    }

    #[test]
    fn well_formed_streams_are_answered_exactly_however_split(
        requests in prop::collection::vec(request_strategy(), 1..12),
        cuts in prop::collection::vec(1usize..5000, 0..80),
    ) {
        let input = encode_stream(&requests);
        let steps = drive(&input, &cuts);
        check_hello_ack(&steps[0]);
        let matched = check_against(&requests, &steps[1..], true);
        // Either every request was handled, or one over the frame limit
        // closed the stream at its position.
        if matched < requests.len() {
            prop_assert_eq!(expectation(&requests[matched]), Expect::CloseTooLarge);
        }
    }

    #[test]
    fn older_versions_refuse_newer_ops_and_go_on(
        requests in prop::collection::vec(request_strategy(), 1..12),
        version in 1u16..PROTOCOL_VERSION,
        cuts in prop::collection::vec(1usize..5000, 0..80),
    ) {
        let input = encode_stream_version(&requests, version);
        let steps = feed_checked(&mut new_session(), &input, &cuts, CHUNK);
        check_hello_ack(&steps[0]);
        let matched = check_against_at(&requests, &steps[1..], true, version);
        if matched < requests.len() {
            prop_assert_eq!(expectation_at(&requests[matched], version), Expect::CloseTooLarge);
        }
    }

    #[test]
    fn damaged_streams_yield_a_correct_prefix_then_at_most_a_close(
        requests in prop::collection::vec(request_strategy(), 1..8),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..4),
        truncate in prop::option::of(any::<prop::sample::Index>()),
        cuts in prop::collection::vec(1usize..5000, 0..80),
    ) {
        let mut input = encode_stream(&requests);
        for (at, bit) in &flips {
            let i = at.index(input.len());
            input[i] ^= 1 << bit;
        }
        if let Some(at) = truncate {
            let len = at.index(input.len() + 1);
            input.truncate(len);
        }
        let steps = drive(&input, &cuts);
        if let Some(Step::Send(_)) = steps.first() {
            // The hello survived (or a flip made another valid hello).
            let rest = &steps[1..];
            check_against(&requests, rest, false);
        } else if let Some(step) = steps.first() {
            // A flip in the hello may break it, or set its auth flag on a
            // server that has no password: either way one refusal and close.
            let is_close = matches!(
                step,
                Step::Close { reason: CloseReason::BadHandshake | CloseReason::AuthFailed, .. }
            );
            prop_assert!(is_close, "unexpected first step {:?}", step);
            if let Step::Close { reply: Some(bytes), .. } = step {
                let mut b = BytesMut::from(&bytes[..]);
                let refused = matches!(decode_hello_ack(&mut b), Ok(Some(HelloAck::Refused { .. })));
                prop_assert!(refused, "close reply is not a refusal: {:?}", bytes);
            }
        }
    }
}

/// The cargo-fuzz target's seeds (`server/fuzz/seeds/session/`), unwrapped
/// the way the target does (mode byte, then u16-length-prefixed frame
/// bodies that get a length prefix and checksum), reach the expiry and
/// SCAN opcodes: run on a version 3 connection, refused on version 2.
#[test]
fn the_fuzz_seeds_reach_the_version_3_opcodes() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/session");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        let (&mode, mut rest) = data.split_first().unwrap();
        assert_eq!(mode & 3, 3, "a seed has a hello and checksummed frames");
        // Version 2: the last one without the version 3 opcodes.
        let version = if mode & 4 == 4 { 2 } else { PROTOCOL_VERSION };
        let mut input = BytesMut::new();
        encode_hello(&Hello { version, flags: 0 }, &mut input);
        while rest.len() >= 2 {
            let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
            let body = &rest[2..2 + len];
            rest = &rest[2 + len..];
            input.extend_from_slice(&((4 + body.len()) as u32).to_le_bytes());
            input.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
            input.extend_from_slice(body);
        }
        let steps = drive(&input, &[]);
        check_hello_ack(&steps[0]);
        let mut opcodes = std::collections::BTreeSet::new();
        for step in &steps[1..] {
            match step {
                Step::Run { request, .. } if version == PROTOCOL_VERSION => {
                    opcodes.extend(request.ops.iter().map(RequestOp::opcode));
                }
                Step::Send(bytes) if version < 3 => {
                    let (id, status, close) = error_frame_of(bytes);
                    assert!(id.is_some() && !close);
                    assert_eq!(status, Status::Unsupported);
                }
                other => panic!("seed {mode:#04x}: unexpected {other:?}"),
            }
        }
        if version == PROTOCOL_VERSION {
            for code in [0x06, 0x07, 0x08, 0x20] {
                assert!(opcodes.contains(&code), "no seed op {code:#04x}");
            }
        }
        seen += 1;
    }
    assert!(seen >= 2, "the seeds are missing from {}", dir.display());
}

#[test]
fn thousand_pipelined_frames_split_byte_by_byte_in_places() {
    let requests: Vec<Request> = (0..1000u64)
        .map(|i| Request {
            id: i,
            ops: vec![RequestOp::Put {
                key: Bytes::from(format!("key-{i}")),
                value: Bytes::from(vec![(i % 251) as u8; (i % 300) as usize]),
            }],
        })
        .collect();
    let input = encode_stream(&requests);
    let cuts: Vec<usize> = (0..5000).map(|i| 1 + (i * 7919) % 13).collect();
    let steps = drive(&input, &cuts);
    check_hello_ack(&steps[0]);
    assert_eq!(check_against(&requests, &steps[1..], true), 1000);
}
