//! The server on a file system that fills up (a loop-mounted ext4 image the
//! test creates; skipped, saying so, where mounting is not permitted):
//! writes answer POISONED and reads keep working, SIGTERM still stops it
//! cleanly with exit code 0, and it starts again on the full disk.

mod common;
#[path = "../../engine/tests/common/small_fs.rs"]
mod small_fs;

use common::*;
use ringkv_protocol::{OpReply, RequestOp, ServerFrame, Status};
use small_fs::mount_small_fs;
use std::path::{Path, PathBuf};

fn config(dir: &Path) -> PathBuf {
    let path = dir.join("ringkv.toml");
    std::fs::write(
        &path,
        "[storage]\nwal_segment_size = \"4MiB\"\ngroup_commit_max_bytes = \"2MiB\"\ncheckpoint_wal_bytes = \"1GiB\"\n",
    )
    .unwrap();
    path
}

#[test]
fn a_full_disk_poisons_writes_and_sigterm_still_exits_0() {
    let fs = match mount_small_fs("ringkv-server-disk-full", 48) {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("SKIPPED: cannot mount a small file system here ({why})");
            return;
        }
    };
    let conf_dir = tempfile::tempdir().unwrap();
    let config = config(conf_dir.path());
    let data = fs.path().join("data");
    let args = ["--config", config.to_str().unwrap(), "--shards", "1"];
    let mut server = start_server(&data, &args);
    let mut c = RawConn::open(server.addr);
    let mut acknowledged = Vec::new();
    let mut poisoned = false;
    for id in 0..200u64 {
        let keys: Vec<u64> = (id * 8..id * 8 + 8).collect();
        let ops = keys
            .iter()
            .map(|&k| RequestOp::Put {
                key: key(k),
                value: value(k, 200_000),
            })
            .collect();
        c.send(id, ops);
        let Some(ServerFrame::Response(r)) = c.read_frame() else {
            panic!("no response");
        };
        for (k, reply) in keys.iter().zip(&r.results) {
            match reply {
                OpReply::Ok => acknowledged.push(*k),
                OpReply::Error { status, message } => {
                    assert_eq!(*status, Status::Poisoned, "{message}");
                    poisoned = true;
                }
                other => panic!("{other:?}"),
            }
        }
        if poisoned {
            break;
        }
    }
    assert!(poisoned, "the disk never filled up");
    // Reads keep working.
    c.send(1_000, vec![RequestOp::Get { key: key(0) }]);
    let Some(ServerFrame::Response(r)) = c.read_frame() else {
        panic!("no response to a read");
    };
    assert!(matches!(&r.results[0], OpReply::Value(v) if *v == value(0, 200_000)));
    drop(c);
    let status = server.terminate();
    assert_eq!(
        status.code(),
        Some(0),
        "a poisoned server stops cleanly with exit 0; log:\n{}",
        server.log().join("\n")
    );

    // It starts again on the full disk and serves every acknowledged write.
    let server = start_server(&data, &args);
    let mut c = RawConn::open(server.addr);
    for chunk in acknowledged.chunks(50) {
        c.send(
            2_000,
            chunk
                .iter()
                .map(|&k| RequestOp::Get { key: key(k) })
                .collect(),
        );
        let Some(ServerFrame::Response(r)) = c.read_frame() else {
            panic!("no response after restart");
        };
        for (k, reply) in chunk.iter().zip(&r.results) {
            assert!(
                matches!(reply, OpReply::Value(v) if *v == value(*k, 200_000)),
                "key {k}: {reply:?}"
            );
        }
    }
}
