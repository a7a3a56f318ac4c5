//! Fuzz target: arbitrary bytes through the RESP listener's pure path: the
//! command decoder (`RespDecoder`), fed in reads of fuzzer-chosen sizes,
//! then every decoded command through the planner (`plan`), with and
//! without the limits for a client that has not authenticated.
//!
//! Must hold: nothing panics; a read split differently decodes to the same
//! commands and the same error; a decoded command is never empty and never
//! breaks the limits; planning any command answers without panicking.
//!
//! Run from `server/`: `cargo +nightly fuzz run resp -- -max_total_time=60`.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use ringkv_protocol::resp::{Command, RespDecoder, RespLimits, LINE_BYTES_MAX};
use ringkv_server::resp::command::{plan, Client, Env};

const LIMITS: RespLimits = RespLimits {
    bulk_bytes_max: 4096,
    args_max: 64,
    command_bytes_max: 16 * 1024,
};

const ENV: Env = Env {
    value_bytes_max: 4096,
    ops_max: 16,
    flush_enabled: true,
};

/// Decodes `input` fed in pieces of the given sizes (cycled); returns the
/// commands and the error text, if any.
fn decode(input: &[u8], sizes: &[u8], unauthenticated: bool) -> (Vec<Command>, Option<String>) {
    let mut decoder = RespDecoder::new(LIMITS);
    decoder.set_unauthenticated(unauthenticated);
    let mut buf = BytesMut::new();
    let mut commands = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < input.len() {
        let size = sizes
            .get(i % sizes.len().max(1))
            .map_or(input.len(), |&s| usize::from(s).max(1));
        i += 1;
        let end = (at + size).min(input.len());
        buf.extend_from_slice(&input[at..end]);
        at = end;
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(cmd)) => {
                    assert!(!cmd.is_empty(), "an empty command");
                    // A multibulk command obeys LIMITS; an inline one is
                    // one line of at most LINE_BYTES_MAX.
                    assert!(cmd.len() <= LIMITS.args_max.max(LINE_BYTES_MAX / 2 + 1));
                    for arg in &cmd {
                        assert!(arg.len() <= LIMITS.bulk_bytes_max.max(LINE_BYTES_MAX));
                    }
                    commands.push(cmd);
                }
                Ok(None) => break,
                Err(e) => return (commands, Some(e.to_string())),
            }
        }
    }
    (commands, None)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let split = usize::from(data[0]) % 16;
    let unauthenticated = data[1] & 1 == 1;
    let (sizes, input) = data[2..].split_at(split.min(data.len() - 2));
    let (commands, error) = decode(input, sizes, unauthenticated);
    let (whole, whole_error) = decode(input, &[], unauthenticated);
    assert_eq!(commands, whole, "the read split changed the commands");
    assert_eq!(error, whole_error, "the read split changed the error");
    let mut client = Client::new(1);
    client.authenticated = !unauthenticated;
    for cmd in &commands {
        let _ = plan(cmd, &mut client, &ENV);
    }
});
