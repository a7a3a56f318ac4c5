//! systemd readiness (`Type=notify`, `packaging/ringkv.service`): the real
//! binary, started with `$NOTIFY_SOCKET` naming a socket this test binds,
//! sends `READY=1` only once it accepts connections, and `STOPPING=1` when
//! told to stop. Also: `log.format = "json"` writes one JSON object per line,
//! and `--version` names the build's commit.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

#[test]
fn ready_arrives_after_the_listeners_accept_and_stopping_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&socket_path).unwrap();
    notify.set_read_timeout(Some(WAIT)).unwrap();
    let config = dir.path().join("ringkv.toml");
    std::fs::write(
        &config,
        "[storage]\nwal_segment_size = \"8MiB\"\n[log]\nformat = \"json\"\n",
    )
    .unwrap();
    let mut child = Command::new(server_binary())
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--listen", "127.0.0.1:0"])
        .env("NOTIFY_SOCKET", &socket_path)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let stderr = child.stderr.take().unwrap();
    let lines = Arc::clone(&log);
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            lines.lock().unwrap().push(line);
        }
    });

    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).expect("READY=1 within the wait");
    assert_eq!(&buf[..n], b"READY=1");
    // At this instant the server must already accept connections: its
    // ready line (logged before READY=1 is sent) names the address.
    std::thread::sleep(Duration::from_millis(50));
    let ready = log
        .lock()
        .unwrap()
        .iter()
        .find(|l| l.contains("ringkv-server ready"))
        .cloned()
        .expect("the ready line was logged before READY=1");
    let json: serde_json::Value = serde_json::from_str(&ready).expect("a JSON log line");
    let addr: std::net::SocketAddr = json["fields"]["addr"]
        .as_str()
        .expect("addr field")
        .parse()
        .unwrap();
    ping_works(addr);

    send_sigterm(child.id());
    let n = notify.recv(&mut buf).expect("STOPPING=1 within the wait");
    assert_eq!(&buf[..n], b"STOPPING=1");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    reader.join().unwrap();
    for line in log.lock().unwrap().iter() {
        assert!(
            serde_json::from_str::<serde_json::Value>(line).is_ok(),
            "not JSON: {line}"
        );
    }
}

fn send_sigterm(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn version_names_the_commit() {
    let out = Command::new(server_binary())
        .arg("--version")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success());
    let commit = text
        .split("(commit ")
        .nth(1)
        .and_then(|rest| rest.strip_suffix(")\n"))
        .unwrap_or_else(|| panic!("no commit in {text:?}"));
    assert!(
        commit == "unknown" || (commit.len() >= 7 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "{text:?}"
    );
    // In a git checkout it is HEAD's short hash.
    if let Ok(head) = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
    {
        if head.status.success() {
            let head = String::from_utf8(head.stdout).unwrap();
            assert!(head.starts_with(commit), "{commit} vs {head}");
        }
    }
}
