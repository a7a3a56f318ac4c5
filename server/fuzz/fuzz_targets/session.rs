//! Fuzz target: arbitrary bytes through the server's per-connection frame
//! processing (`Session`), split into reads of fuzzer-chosen sizes, with or
//! without a valid hello in front (of the current protocol version, or of
//! the one before, whose connections must refuse the newer opcodes: the
//! expiry operations and SCAN). Every invariant `feed_checked` asserts
//! (bounded buffer, nothing after a close, progress) must hold, and every
//! request handed to the engine must satisfy the advertised limits and hold
//! only operations of the connection's version.
//!
//! Run from `server/`: `cargo +nightly fuzz run session -- -max_total_time=60`.
//! `fuzz/seeds/session/` holds inputs that reach the version 3 opcodes;
//! give it as a second corpus directory after the corpus itself (as
//! `.ci/run` does). `server/tests/session_fuzz.rs` checks the seeds.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use ringkv_protocol::{encode_hello, Hello, Limits, ServerInfo, PROTOCOL_VERSION};
use ringkv_server::native::session::{feed_checked, Session, Step};

fn limits() -> Limits {
    Limits {
        frame_bytes_max: 16 * 1024,
        ops_per_frame_max: 64,
        key_bytes_max: 64,
        value_bytes_max: 4096,
        pipeline_depth_max: 8,
    }
}

fn session() -> Session {
    Session::accepting(
        limits(),
        ServerInfo {
            server_id: 1,
            shard_count: 2,
            server_name: "fuzz".into(),
        },
    )
}

/// Wraps fuzzer bytes into frames with a correct length prefix and CRC, so
/// the request parser behind the checksum gets exercised: the input is a
/// sequence of (u16 little-endian body length, body) pieces, where a body is
/// everything after the checksum (kind, reserved, count, id, operations).
fn checksummed_frames(mut rest: &[u8], out: &mut Vec<u8>) {
    while rest.len() >= 2 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let body = &rest[2..2 + len];
        rest = &rest[2 + len..];
        let after_prefix = (4 + body.len()) as u32;
        out.extend_from_slice(&after_prefix.to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        out.extend_from_slice(body);
    }
}

fuzz_target!(|data: &[u8]| {
    // Byte 0: bit 0 = prepend a valid hello; bit 1 = wrap the rest into
    // checksummed frames; bit 2 = the hello asks for the previous protocol
    // version; bits 3..8 seed the read sizes.
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut input = Vec::with_capacity(rest.len() + 64);
    let version = if mode & 4 == 4 {
        PROTOCOL_VERSION - 1
    } else {
        PROTOCOL_VERSION
    };
    if mode & 1 == 1 {
        let mut hello = BytesMut::new();
        encode_hello(&Hello { version, flags: 0 }, &mut hello);
        input.extend_from_slice(&hello);
    }
    if mode & 2 == 2 {
        checksummed_frames(rest, &mut input);
    } else {
        input.extend_from_slice(rest);
    }
    let seed = usize::from(mode >> 3) + 1;
    let cuts: Vec<usize> = (0..input.len())
        .map(|i| 1 + (i * 31 + seed * 17) % (seed * 97))
        .collect();
    let steps = feed_checked(&mut session(), &input, &cuts, 4096);
    for step in steps {
        if let Step::Run { request, .. } = step {
            assert_eq!(limits().check_request(&request), Ok(()), "{request:?}");
            // A connection runs only its version's ops (without the
            // prepended hello, the input's own hello chose the version).
            assert!(
                mode & 1 == 0 || request.ops.iter().all(|op| op.since_version() <= version),
                "a version {version} connection ran {request:?}"
            );
        }
    }
});
