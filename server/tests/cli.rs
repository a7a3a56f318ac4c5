//! The `ringkv` CLI against the real server, and the server's own
//! configuration flags (`--check-config`, `--print-config`, flags over file).

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use common::*;

fn ringkv(addr: std::net::SocketAddr, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(cli_binary());
    cmd.arg("--server")
        .arg(addr.to_string())
        .args(["--timeout", "20"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = cmd.spawn().expect("spawn ringkv");
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(text.as_bytes()).unwrap();
    }
    child.wait_with_output().expect("ringkv output")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn cli_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &["--shards", "2"]);
    let addr = server.addr;

    let put = ringkv(addr, &["put", "a", "1"], None);
    assert!(put.status.success(), "{put:?}");
    assert_eq!(stdout(&put), "OK\n");

    let get = ringkv(addr, &["get", "a"], None);
    assert!(get.status.success(), "{get:?}");
    assert_eq!(stdout(&get), "1\n");

    let missing = ringkv(addr, &["get", "nope"], None);
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    assert_eq!(stdout(&missing), "");

    let del = ringkv(addr, &["del", "a"], None);
    assert!(del.status.success(), "{del:?}");
    let gone = ringkv(addr, &["get", "a"], None);
    assert_eq!(gone.status.code(), Some(1));

    let script = "put k1 hello world\nget k1\nping\n\nget k2\ndel k1\nget k1\n";
    let batch = ringkv(addr, &["-"], Some(script));
    assert!(batch.status.success(), "{batch:?}");
    assert_eq!(stdout(&batch), "OK\nhello world\nPONG\n(nil)\nOK\n(nil)\n");

    let stats = ringkv(addr, &["stats"], None);
    assert!(stats.status.success());
    let text = stdout(&stats);
    assert!(text.lines().any(|l| l == "server.shards 2"), "{text}");
    assert!(
        text.lines().any(|l| l == "server.durability sync"),
        "{text}"
    );
    assert!(text.lines().any(|l| l == "server.tier memory"), "{text}");
}

#[test]
fn cli_expiry_times_and_scan() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), &["--shards", "2"]);
    let addr = server.addr;
    let run = |args: &[&str]| ringkv(addr, args, None);
    let number = |o: &Output| -> u64 {
        stdout(o)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("not a number: {o:?}"))
    };

    let set = run(&["set", "a", "1", "--ex", "100"]);
    assert!(set.status.success(), "{set:?}");
    assert_eq!(stdout(&set), "OK\n");
    let ttl = run(&["ttl", "a"]);
    assert!(ttl.status.success(), "{ttl:?}");
    assert!((99..=100).contains(&number(&ttl)), "{ttl:?}");
    let now_ms = ringkv_client::expiry_time_ms(std::time::Duration::ZERO);
    let at = number(&run(&["ttl", "a", "--at"]));
    assert!(
        at > now_ms + 90_000 && at <= now_ms + 100_000,
        "{at} vs {now_ms}"
    );

    let persist = run(&["persist", "a"]);
    assert_eq!(stdout(&persist), "OK\n", "{persist:?}");
    assert_eq!(stdout(&run(&["ttl", "a"])), "none\n");
    let expire = run(&["expire", "a", "50"]);
    assert_eq!(stdout(&expire), "OK\n", "{expire:?}");
    let ms = number(&run(&["ttl", "a", "--ms"]));
    assert!((45_000..=50_000).contains(&ms), "{ms}");
    assert_eq!(stdout(&run(&["get", "a"])), "1\n");

    for args in [
        &["ttl", "nope"][..],
        &["persist", "nope"][..],
        &["expire", "nope", "5"][..],
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        assert_eq!(stdout(&out), "");
    }
    let bad = run(&["put", "x", "1", "--ex", "1", "--px", "5"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");

    let short = run(&["put", "b", "2", "--px", "300"]);
    assert!(short.status.success(), "{short:?}");
    assert_eq!(stdout(&run(&["get", "b"])), "2\n");
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(run(&["get", "b"]).status.code(), Some(1), "b has expired");

    let script: String = (0..30).map(|i| format!("put k{i} v\n")).collect();
    assert!(ringkv(addr, &["-"], Some(&script)).status.success());
    let scan = run(&["scan"]);
    assert!(scan.status.success(), "{scan:?}");
    let mut keys: Vec<String> = stdout(&scan).lines().map(str::to_string).collect();
    keys.sort();
    let mut expected: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    expected.push("a".to_string());
    expected.sort();
    assert_eq!(keys, expected);
    let matched = run(&["scan", "--match", "k1*", "--count", "1"]);
    let mut keys: Vec<String> = stdout(&matched).lines().map(str::to_string).collect();
    keys.sort();
    let mut expected: Vec<String> = std::iter::once("k1".to_string())
        .chain((10..20).map(|i| format!("k{i}")))
        .collect();
    expected.sort();
    assert_eq!(keys, expected, "{matched:?}");
}

#[test]
fn cli_reports_an_unreachable_server() {
    // A port nobody listens on: bind, learn it, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = ringkv(port, &["get", "a"], None);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
}

#[test]
fn check_config_names_every_bad_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[server]\nmax_conections = 10\n\n[io]\nqueue_depth = 100000\n\n[storage]\nflush_interval = \"10 parsecs\"\n",
    )
    .unwrap();
    let out = Command::new(server_binary())
        .arg("--check-config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let problems: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with(path.to_str().unwrap()) && !l.ends_with("error(s)"))
        .collect();
    assert_eq!(problems.len(), 3, "{err}");
    assert!(
        problems.iter().any(|l| l.contains("server.max_conections")),
        "{err}"
    );
    assert!(
        problems.iter().any(|l| l.contains("io.queue_depth")),
        "{err}"
    );
    assert!(
        problems
            .iter()
            .any(|l| l.contains("storage.flush_interval")),
        "{err}"
    );

    let good = dir.path().join("good.toml");
    std::fs::write(&good, "shards = 2\n[storage]\ndurability = \"async\"\n").unwrap();
    let ok = Command::new(server_binary())
        .arg("--check-config")
        .arg(&good)
        .output()
        .unwrap();
    assert!(ok.status.success(), "{ok:?}");
}

#[test]
fn print_config_shows_flags_over_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ringkv.toml");
    std::fs::write(&path, "shards = 3\n[server]\nlisten = \"127.0.0.1:9999\"\n").unwrap();
    let out = Command::new(server_binary())
        .args(["--config", path.to_str().unwrap()])
        .args(["--listen", "127.0.0.1:4444", "--durability", "none"])
        .args(["--device-profile", "nvme", "--print-config"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let config = tunables::Config::from_toml_str(&text).expect("printed config parses back");
    assert_eq!(config.shards, 3);
    assert_eq!(config.server.listen, "127.0.0.1:4444");
    assert_eq!(config.storage.durability, tunables::Durability::None);
    assert_eq!(config.devices["wal"].profile, "nvme");
}

#[test]
fn bad_flag_values_stop_before_starting() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(server_binary())
        .args(["--data-dir", dir.path().to_str().unwrap()])
        .args(["--device-profile", "floppy", "--print-config"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("floppy"), "{err}");
}
