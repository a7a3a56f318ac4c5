//! Property tests of the RESP command decoder: any command encoded as a
//! multibulk decodes back to itself however the bytes are split across
//! reads; arbitrary bytes never panic, and the decoder never holds more than
//! its limits allow before it refuses.

use bytes::{BufMut, BytesMut};
use proptest::prelude::*;
use ringkv_protocol::resp::{RespDecoder, RespLimits, LINE_BYTES_MAX};

const LIMITS: RespLimits = RespLimits {
    bulk_bytes_max: 512,
    args_max: 12,
    command_bytes_max: 8192,
};

fn encode(args: &[Vec<u8>], out: &mut BytesMut) {
    out.put_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.put_slice(format!("${}\r\n", a.len()).as_bytes());
        out.put_slice(a);
        out.put_slice(b"\r\n");
    }
}

fn commands() -> impl Strategy<Value = Vec<Vec<Vec<u8>>>> {
    let arg = proptest::collection::vec(any::<u8>(), 0..64);
    let command = proptest::collection::vec(arg, 1..=12);
    proptest::collection::vec(command, 1..8)
}

proptest! {
    #[test]
    fn multibulk_round_trips_across_any_split(cmds in commands(), cuts in proptest::collection::vec(1usize..97, 1..40)) {
        let mut wire = BytesMut::new();
        for c in &cmds {
            encode(c, &mut wire);
        }
        let mut decoder = RespDecoder::new(LIMITS);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut offset = 0;
        let mut cut = cuts.iter().cycle();
        while offset < wire.len() {
            let n = (*cut.next().unwrap()).min(wire.len() - offset);
            buf.extend_from_slice(&wire[offset..offset + n]);
            offset += n;
            while let Some(cmd) = decoder.decode(&mut buf).unwrap() {
                got.push(cmd.iter().map(|a| a.to_vec()).collect::<Vec<_>>());
            }
        }
        prop_assert_eq!(got, cmds);
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_stay_bounded(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..2048), 1..40)) {
        let mut decoder = RespDecoder::new(LIMITS);
        let mut buf = BytesMut::new();
        'outer: for chunk in chunks {
            buf.extend_from_slice(&chunk);
            loop {
                match decoder.decode(&mut buf) {
                    Ok(Some(cmd)) => {
                        prop_assert!(!cmd.is_empty());
                        prop_assert!(cmd.len() <= LINE_BYTES_MAX);
                    }
                    Ok(None) => break,
                    Err(_) => break 'outer,
                }
            }
            // What is kept waiting is at most one command or one line
            // (plus the chunk just added).
            prop_assert!(buf.len() <= LIMITS.command_bytes_max.max(LINE_BYTES_MAX) + 2048 + 2);
        }
    }

    #[test]
    fn structured_garbage_never_panics(parts in proptest::collection::vec(prop_oneof![
        Just(b"*".to_vec()), Just(b"$".to_vec()), Just(b"\r\n".to_vec()), Just(b"\n".to_vec()),
        Just(b"-1".to_vec()), Just(b"3".to_vec()), Just(b"99999999999999999999".to_vec()),
        Just(b"\"".to_vec()), Just(b"'".to_vec()), Just(b" ".to_vec()), Just(b"\\x4".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..8),
    ], 0..60)) {
        let mut decoder = RespDecoder::new(LIMITS);
        let mut buf = BytesMut::from(&parts.concat()[..]);
        for _ in 0..100 {
            match decoder.decode(&mut buf) {
                Ok(Some(_)) => {}
                _ => break,
            }
        }
    }
}
