//! Micro-benchmark of the frame codec hot paths: CRC-32 throughput, and
//! encoding/decoding a 1,000-op request and its response. Prints time per
//! round, GiB/s and Mops/s: `cargo bench -p ringkv-client --bench frame_codec`.
//! Without the `--bench` flag (as `cargo test --benches` runs it) it does one
//! tiny pass, so it keeps compiling and running.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ringkv_protocol::{
    decode_request, decode_response, encode_request, encode_response, Limits, OpReply, Request,
    RequestOp, Response,
};

struct Sample {
    name: &'static str,
    rounds: u64,
    elapsed: Duration,
    bytes_per_round: usize,
    ops_per_round: usize,
}

impl Sample {
    fn print(&self) {
        let secs = self.elapsed.as_secs_f64();
        let per_round_us = secs * 1e6 / self.rounds as f64;
        let gib_s =
            (self.bytes_per_round as f64 * self.rounds as f64) / secs / f64::from(1u32 << 30);
        let mops = (self.ops_per_round as f64 * self.rounds as f64) / secs / 1e6;
        println!(
            "{:<28} {:>10.2} us/round {:>8.2} GiB/s {:>9.2} Mops/s  ({} rounds, {} bytes/round)",
            self.name, per_round_us, gib_s, mops, self.rounds, self.bytes_per_round
        );
    }
}

fn run(
    name: &'static str,
    budget: Duration,
    bytes: usize,
    ops: usize,
    mut round: impl FnMut(),
) -> Sample {
    let start = Instant::now();
    let mut rounds = 0;
    while rounds == 0 || start.elapsed() < budget {
        round();
        rounds += 1;
    }
    Sample {
        name,
        rounds,
        elapsed: start.elapsed(),
        bytes_per_round: bytes,
        ops_per_round: ops,
    }
}

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let budget = if full {
        Duration::from_secs(2)
    } else {
        Duration::from_millis(1)
    };
    println!(
        "frame_codec: {} build, {} mode, {} cpus",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        if full { "full" } else { "smoke" },
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    let blob = vec![0xa5u8; 1 << 20];
    run("crc32 1 MiB", budget, blob.len(), 0, || {
        black_box(crc32fast::hash(black_box(&blob)));
    })
    .print();

    let value = Bytes::from(vec![b'v'; 100]);
    let request = Request {
        id: 1,
        ops: (0..1000u32)
            .map(|n| RequestOp::Put {
                key: Bytes::from(format!("key-{n:012}")),
                value: value.clone(),
            })
            .collect(),
    };
    let request_bytes = request.encoded_len();
    let mut buf = BytesMut::with_capacity(request_bytes);
    run(
        "encode 1000 puts (16B/100B)",
        budget,
        request_bytes,
        1000,
        || {
            buf.clear();
            encode_request(black_box(&request), &mut buf);
        },
    )
    .print();

    let mut encoded = BytesMut::new();
    encode_request(&request, &mut encoded);
    let encoded = encoded.freeze();
    let limits = Limits::default();
    run(
        "decode 1000 puts (16B/100B)",
        budget,
        request_bytes,
        1000,
        || {
            let mut input = BytesMut::from(&encoded[..]);
            black_box(decode_request(&mut input, &limits).ok());
        },
    )
    .print();

    let response = Response {
        id: 1,
        results: (0..1000).map(|_| OpReply::Value(value.clone())).collect(),
    };
    let response_bytes = response.encoded_len();
    let mut out = BytesMut::with_capacity(response_bytes);
    run(
        "encode 1000 values (100B)",
        budget,
        response_bytes,
        1000,
        || {
            out.clear();
            encode_response(black_box(&response), &mut out);
        },
    )
    .print();
    out.clear();
    encode_response(&response, &mut out);
    let out = out.freeze();
    run(
        "decode 1000 values (100B)",
        budget,
        response_bytes,
        1000,
        || {
            let mut input = BytesMut::from(&out[..]);
            black_box(decode_response(&mut input, &limits).ok());
        },
    )
    .print();
}
