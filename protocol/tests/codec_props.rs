//! Property tests of the sans-IO codec: round trips, every strict prefix is
//! "need more", garbage and mutations never panic, and lengths are checked
//! against the limits before anything is buffered or allocated.

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use ringkv_protocol::{
    check_frame, decode_hello, decode_hello_ack, decode_request, decode_response, encode_error,
    encode_hello, encode_hello_ack, encode_request, encode_response, frame_kind, DecodeError,
    ErrorFrame, Expiry, Hello, HelloAck, Limits, OpReply, Request, RequestOp, Response,
    ServerFrame, ServerInfo, Status, FRAME_HEADER_BYTES, SCAN_PATTERN_BYTES_MAX,
};

fn bytes(len: std::ops::Range<usize>) -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), len).prop_map(Bytes::from)
}

fn op() -> impl Strategy<Value = RequestOp> {
    prop_oneof![
        (bytes(1..48), bytes(0..300)).prop_map(|(key, value)| RequestOp::Put { key, value }),
        bytes(1..48).prop_map(|key| RequestOp::Get { key }),
        bytes(1..48).prop_map(|key| RequestOp::Delete { key }),
        Just(RequestOp::Ping),
        Just(RequestOp::Stats),
        (bytes(1..64), any::<u64>()).prop_map(|(dest, rate_bytes_per_sec)| RequestOp::Backup {
            dest,
            rate_bytes_per_sec
        }),
        (bytes(1..48), bytes(0..300), any::<u64>()).prop_map(|(key, value, expires_at_ms)| {
            RequestOp::PutExpiring {
                key,
                value,
                expires_at_ms,
            }
        }),
        (bytes(1..48), any::<u64>())
            .prop_map(|(key, expires_at_ms)| RequestOp::Expire { key, expires_at_ms }),
        bytes(1..48).prop_map(|key| RequestOp::Ttl { key }),
        (
            any::<u64>(),
            any::<u32>(),
            bytes(0..SCAN_PATTERN_BYTES_MAX + 1)
        )
            .prop_map(|(cursor, count, pattern)| RequestOp::Scan {
                cursor,
                count,
                pattern
            }),
    ]
}

fn request() -> impl Strategy<Value = Request> {
    (any::<u64>(), proptest::collection::vec(op(), 1..24)).prop_map(|(id, ops)| Request { id, ops })
}

fn error_status() -> impl Strategy<Value = Status> {
    proptest::sample::select(
        Status::ALL
            .iter()
            .copied()
            .filter(|s| s.is_error())
            .collect::<Vec<_>>(),
    )
}

fn text() -> impl Strategy<Value = String> {
    // At most 200 chars of up to 4 bytes: under every text limit, so no cut.
    proptest::collection::vec(any::<char>(), 0..200).prop_map(|chars| chars.into_iter().collect())
}

fn reply() -> impl Strategy<Value = OpReply> {
    prop_oneof![
        Just(OpReply::Ok),
        Just(OpReply::NotFound),
        bytes(0..300).prop_map(OpReply::Value),
        proptest::collection::vec((text(), text()), 0..6).prop_map(OpReply::Stats),
        Just(OpReply::Expiry(None)),
        (1..=u64::MAX, any::<u64>())
            .prop_map(|(at_ms, left_ms)| OpReply::Expiry(Some(Expiry { at_ms, left_ms }))),
        (any::<u64>(), proptest::collection::vec(bytes(1..48), 0..20))
            .prop_map(|(cursor, keys)| OpReply::Keys { cursor, keys }),
        (error_status(), text()).prop_map(|(status, message)| OpReply::Error { status, message }),
    ]
}

fn server_frame() -> impl Strategy<Value = ServerFrame> {
    prop_oneof![
        (any::<u64>(), proptest::collection::vec(reply(), 1..24))
            .prop_map(|(id, results)| ServerFrame::Response(Response { id, results })),
        (
            proptest::option::of(any::<u64>()),
            error_status(),
            text(),
            any::<bool>()
        )
            .prop_map(
                |(id, status, message, close)| ServerFrame::Error(ErrorFrame {
                    id,
                    status,
                    message,
                    // An ERROR frame that keeps the connection names its request.
                    close: close || id.is_none(),
                })
            ),
    ]
}

fn hello_ack() -> impl Strategy<Value = HelloAck> {
    // At most 64 chars: under SERVER_NAME_BYTES_MAX (256), so no cut.
    let name = proptest::collection::vec(any::<char>(), 0..64)
        .prop_map(|chars| chars.into_iter().collect::<String>());
    let accepted = (
        any::<u64>(),
        any::<u32>(),
        name,
        1u32..100_000,
        1u32..=u32::MAX,
        1u32..1024,
    )
        .prop_map(|(server_id, shard_count, server_name, ops, key, depth)| {
            let frame_bytes_max = Limits::frame_bytes_min(ops) as u32 + 1000;
            HelloAck::Accepted {
                version: 1,
                limits: Limits {
                    frame_bytes_max,
                    ops_per_frame_max: ops,
                    key_bytes_max: key,
                    value_bytes_max: key / 2,
                    pipeline_depth_max: depth,
                },
                server: ServerInfo {
                    server_id,
                    shard_count,
                    server_name,
                },
            }
        });
    let refused = (any::<u16>(), error_status(), text()).prop_map(|(version, status, message)| {
        HelloAck::Refused {
            version,
            status,
            message,
        }
    });
    prop_oneof![accepted, refused]
}

fn encode_server_frame(frame: &ServerFrame, buf: &mut BytesMut) {
    match frame {
        ServerFrame::Response(response) => encode_response(response, buf),
        ServerFrame::Error(error) => encode_error(error, buf),
    }
}

/// Rewrites the length prefix and checksum of a frame after an edit.
fn reseal(frame: &mut BytesMut) {
    let len = (frame.len() - 4) as u32;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32fast::hash(&frame[8..]);
    frame[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes frames until the buffer is empty, incomplete or fatally bad.
/// Every successful step must consume bytes, so this always ends.
fn drain_requests(buf: &mut BytesMut, limits: &Limits) {
    loop {
        let before = buf.len();
        match decode_request(buf, limits) {
            Ok(Some(_)) | Err(DecodeError::Rejected { .. }) => {
                assert!(
                    buf.len() < before,
                    "a decoded or rejected frame must be consumed"
                )
            }
            Ok(None) => {
                assert_eq!(
                    buf.len(),
                    before,
                    "an incomplete frame must not be consumed"
                );
                return;
            }
            Err(error) => {
                assert!(error.closes_connection(), "{error:?}");
                return;
            }
        }
    }
}

fn drain_responses(buf: &mut BytesMut, limits: &Limits) {
    loop {
        let before = buf.len();
        match decode_response(buf, limits) {
            Ok(Some(_)) | Err(DecodeError::Rejected { .. }) => assert!(buf.len() < before),
            Ok(None) => {
                assert_eq!(buf.len(), before);
                return;
            }
            Err(_) => return,
        }
    }
}

proptest! {
    #[test]
    fn requests_round_trip(request in request()) {
        let mut buf = BytesMut::new();
        encode_request(&request, &mut buf);
        prop_assert_eq!(buf.len(), request.encoded_len());
        let encoded = buf.clone();
        let decoded = decode_request(&mut buf, &Limits::default()).unwrap().unwrap();
        prop_assert!(buf.is_empty());
        prop_assert_eq!(&decoded, &request);
        let mut again = BytesMut::new();
        encode_request(&decoded, &mut again);
        prop_assert_eq!(again, encoded);
    }

    #[test]
    fn server_frames_round_trip(frame in server_frame()) {
        let mut buf = BytesMut::new();
        encode_server_frame(&frame, &mut buf);
        if let ServerFrame::Response(response) = &frame {
            prop_assert_eq!(buf.len(), response.encoded_len());
        }
        let decoded = decode_response(&mut buf, &Limits::default()).unwrap().unwrap();
        prop_assert!(buf.is_empty());
        prop_assert_eq!(decoded, frame);
    }

    #[test]
    fn handshakes_round_trip(ack in hello_ack(), version in any::<u16>(), flags in any::<u16>()) {
        let mut buf = BytesMut::new();
        encode_hello_ack(&ack, &mut buf);
        prop_assert_eq!(decode_hello_ack(&mut buf), Ok(Some(ack)));
        prop_assert!(buf.is_empty());

        let hello = Hello { version, flags };
        encode_hello(&hello, &mut buf);
        match decode_hello(&mut buf) {
            Ok(decoded) => prop_assert_eq!(decoded, Some(hello)),
            Err(error) => {
                prop_assert!(version != 1 || flags != 0, "{:?}", error);
                prop_assert!(error.closes_connection());
            }
        }
    }

    #[test]
    fn every_strict_prefix_is_incomplete(request in request(), frame in server_frame(), ack in hello_ack()) {
        let limits = Limits::default();
        let mut full = BytesMut::new();
        encode_request(&request, &mut full);
        for cut in 0..full.len() {
            let mut buf = BytesMut::from(&full[..cut]);
            prop_assert_eq!(decode_request(&mut buf, &limits), Ok(None), "cut at {}", cut);
            prop_assert_eq!(buf.len(), cut);
            let need_more = matches!(check_frame(&full[..cut], &limits), Err(DecodeError::NeedMore { .. }));
            prop_assert!(need_more);
        }
        let mut full = BytesMut::new();
        encode_server_frame(&frame, &mut full);
        for cut in 0..full.len() {
            let mut buf = BytesMut::from(&full[..cut]);
            prop_assert_eq!(decode_response(&mut buf, &limits), Ok(None), "cut at {}", cut);
        }
        let mut full = BytesMut::new();
        encode_hello_ack(&ack, &mut full);
        for cut in 0..full.len() {
            let mut buf = BytesMut::from(&full[..cut]);
            prop_assert_eq!(decode_hello_ack(&mut buf), Ok(None), "cut at {}", cut);
        }
        encode_hello(&Hello::current(), &mut full);
        let hello = full.split_off(full.len() - 8);
        for cut in 0..hello.len() {
            let mut buf = BytesMut::from(&hello[..cut]);
            prop_assert_eq!(decode_hello(&mut buf), Ok(None), "cut at {}", cut);
        }
    }

    #[test]
    fn garbage_never_panics(garbage in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let limits = Limits { frame_bytes_max: 4096, ..Limits::default() };
        drain_requests(&mut BytesMut::from(&garbage[..]), &limits);
        drain_responses(&mut BytesMut::from(&garbage[..]), &limits);
        let _ = decode_hello(&mut BytesMut::from(&garbage[..]));
        let _ = decode_hello_ack(&mut BytesMut::from(&garbage[..]));
    }

    /// Random bodies behind a valid length and checksum reach every content
    /// check; the frame is decoded or rejected, and consumed either way.
    #[test]
    fn sealed_garbage_is_decoded_or_rejected(
        kind in prop_oneof![Just(frame_kind::REQUEST), Just(frame_kind::RESPONSE), Just(frame_kind::ERROR), any::<u8>()],
        count in prop_oneof![0u32..30, any::<u32>()],
        id in any::<u64>(),
        body in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        let mut frame = BytesMut::new();
        frame.put_u64_le(0);
        frame.put_u8(kind);
        frame.put_bytes(0, 3);
        frame.put_u32_le(count);
        frame.put_u64_le(id);
        frame.put_slice(&body);
        reseal(&mut frame);
        let limits = Limits::default();
        for decoded_kind in [frame_kind::REQUEST, frame_kind::RESPONSE] {
            let mut buf = frame.clone();
            let outcome = if decoded_kind == frame_kind::REQUEST {
                decode_request(&mut buf, &limits).map(|r| r.map(|_| ()))
            } else {
                decode_response(&mut buf, &limits).map(|r| r.map(|_| ()))
            };
            match outcome {
                Ok(Some(())) => {}
                Err(DecodeError::Rejected { id: got, .. }) => prop_assert_eq!(got, id),
                other => prop_assert!(false, "unexpected {:?}", other),
            }
            prop_assert!(buf.is_empty());
        }
    }

    /// Any single flipped byte of a frame is caught by the checksum or the
    /// length checks: it never decodes to a different request.
    #[test]
    fn flipped_bytes_never_decode_to_another_request(request in request(), at in any::<prop::sample::Index>(), mask in 1u8..) {
        let limits = Limits::default();
        let mut buf = BytesMut::new();
        encode_request(&request, &mut buf);
        let at = at.index(buf.len());
        buf[at] ^= mask;
        match decode_request(&mut buf, &limits) {
            Ok(Some(decoded)) => prop_assert!(false, "flip at {} decoded to {:?}", at, decoded),
            Ok(None) => prop_assert!(at < 4, "only a grown length prefix waits for more"),
            Err(error) => prop_assert!(error.closes_connection(), "{:?}", error),
        }
    }

    /// A flipped opcode or length behind a valid checksum is either another
    /// valid request or a rejection of this one; never a panic.
    #[test]
    fn resealed_flips_are_rejected_or_valid(request in request(), at in any::<prop::sample::Index>(), mask in 1u8..) {
        let limits = Limits::default();
        let mut buf = BytesMut::new();
        encode_request(&request, &mut buf);
        let at = FRAME_HEADER_BYTES + at.index(buf.len() - FRAME_HEADER_BYTES);
        buf[at] ^= mask;
        reseal(&mut buf);
        match decode_request(&mut buf, &limits) {
            Ok(Some(decoded)) => prop_assert_eq!(decoded.id, request.id),
            Err(DecodeError::Rejected { id, .. }) => prop_assert_eq!(id, request.id),
            other => prop_assert!(false, "unexpected {:?}", other),
        }
        prop_assert!(buf.is_empty());
    }

    /// A length prefix over the limit is refused from its 4 bytes alone,
    /// before the decoder buffers or reserves anything for the body.
    #[test]
    fn oversized_length_prefix_is_rejected_before_allocation(frame_bytes_max in 4096u32..1_000_000, excess in 1u64..u64::from(u32::MAX)) {
        let limits = Limits { frame_bytes_max, ops_per_frame_max: 100, ..Limits::default() };
        let len = (u64::from(frame_bytes_max) - 4 + excess).min(u64::from(u32::MAX)) as u32;
        let mut buf = BytesMut::with_capacity(16);
        buf.put_u32_le(len);
        let capacity = buf.capacity();
        let expected = DecodeError::FrameTooLarge { len: 4 + u64::from(len), max: frame_bytes_max };
        prop_assert_eq!(decode_request(&mut buf, &limits), Err(expected.clone()));
        prop_assert_eq!(decode_response(&mut buf, &limits), Err(expected));
        prop_assert_eq!(buf.capacity(), capacity);
        prop_assert_eq!(buf.len(), 4);
    }
}
