//! The `ringkv` binary against the in-test fake server: one-shot commands,
//! the `-` stdin mode (order, escapes, errors, many frames), and exit codes.

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use bytes::Bytes;
use common::{FakeServer, Options};
use ringkv_client::{Limits, Status};

const RINGKV: &str = env!("CARGO_BIN_EXE_ringkv");

struct Harness {
    runtime: tokio::runtime::Runtime,
    server: FakeServer,
}

impl Harness {
    fn start(options: Options) -> Harness {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let server = runtime.block_on(FakeServer::start(options));
        Harness { runtime, server }
    }

    fn run(&self, args: &[&str]) -> Output {
        self.run_with_stdin(args, None)
    }

    fn run_with_stdin(&self, args: &[&str], stdin: Option<Vec<u8>>) -> Output {
        let addr = self.server.addr.to_string();
        run(&["--server", &addr, "--timeout", "20"], args, stdin)
    }

    fn received(&self) -> usize {
        let _guard = self.runtime.enter();
        *self.server.received.borrow()
    }
}

fn run(global: &[&str], args: &[&str], stdin: Option<Vec<u8>>) -> Output {
    let mut child = Command::new(RINGKV)
        .args(global)
        .args(args)
        .env_remove("RINGKV_PASSWORD")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ringkv");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin pipe");
        // Written from a thread so a full stdout pipe cannot deadlock us.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    child.wait_with_output().expect("wait for ringkv")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("UTF-8 stdout")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn one_shot_commands_print_and_exit_as_documented() {
    let harness = Harness::start(Options::default());

    let put = harness.run(&["put", "greeting", "hello world"]);
    assert_eq!(
        (put.status.code(), stdout(&put).as_str()),
        (Some(0), "OK\n"),
        "{}",
        stderr(&put)
    );

    let get = harness.run(&["get", "greeting"]);
    assert_eq!(
        (get.status.code(), stdout(&get).as_str()),
        (Some(0), "hello world\n")
    );

    let missing = harness.run(&["get", "nope"]);
    assert_eq!(
        (missing.status.code(), stdout(&missing).as_str()),
        (Some(1), "")
    );

    let del = harness.run(&["del", "greeting"]);
    assert_eq!(
        (del.status.code(), stdout(&del).as_str()),
        (Some(0), "OK\n")
    );
    let del_again = harness.run(&["del", "greeting"]);
    assert_eq!(
        (del_again.status.code(), stdout(&del_again).as_str()),
        (Some(1), "")
    );

    let ping = harness.run(&["ping"]);
    assert_eq!(
        (ping.status.code(), stdout(&ping).as_str()),
        (Some(0), "PONG\n")
    );

    let stats = harness.run(&["stats"]);
    assert_eq!(stats.status.code(), Some(0));
    assert_eq!(stdout(&stats), "shards 2\ndevice.wal.profile nvme\n");

    let info = harness.run(&["info"]);
    assert_eq!(info.status.code(), Some(0));
    let info = stdout(&info);
    assert!(info.contains("server_name fake-server\n"), "{info}");
    assert!(info.contains("pipeline_depth_max 128\n"), "{info}");
}

#[test]
fn stdin_mode_answers_each_line_in_order() {
    let harness = Harness::start(Options::default());
    let input = b"put a 1\nput b two words\n\nget a\nget b\nget c\ndel a\ndel a\nget a\nping\n\
frob x\nput onlykey\nput k \\x00\\xff\\n\\\\end\nget k\nput bad \\q\nGET b\n"
        .to_vec();
    let output = harness.run_with_stdin(&["-"], Some(input));
    let expected = "OK\nOK\n1\ntwo words\n(nil)\nOK\n(nil)\n(nil)\nPONG\n\
ERR unknown command \"frob\" (expected put, get, del or ping)\nERR put needs KEY VALUE\n\
OK\n\\x00\\xff\\n\\\\end\nERR unknown escape \\q at byte 0 (use \\\\ for a backslash)\ntwo words\n";
    assert_eq!(stdout(&output), expected, "{}", stderr(&output));
    // Some lines were errors, so the exit status says so.
    assert_eq!(output.status.code(), Some(3));
}

#[test]
fn stdin_mode_pipelines_many_frames() {
    let harness = Harness::start(Options::default());
    let count = 5000;
    let mut input = String::new();
    for n in 0..count {
        input.push_str(&format!("put key{n} value {n}\n"));
    }
    for n in 0..count {
        input.push_str(&format!("get key{n}\n"));
    }
    let output = harness.run_with_stdin(&["-"], Some(input.into_bytes()));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let out = stdout(&output);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2 * count);
    assert!(lines[..count].iter().all(|line| *line == "OK"));
    for (n, line) in lines[count..].iter().enumerate() {
        assert_eq!(*line, format!("value {n}"));
    }
    // At most 1000 operations go in one frame.
    assert!(
        harness.received() >= 2 * count / 1000,
        "only {} frames",
        harness.received()
    );
}

#[test]
fn limits_and_server_errors_exit_3() {
    let limits = Limits {
        key_bytes_max: 8,
        ..Limits::default()
    };
    let enforced = Limits {
        key_bytes_max: 4,
        ..limits
    };
    let harness = Harness::start(Options {
        limits,
        enforced: Some(enforced),
        ..Options::default()
    });

    // Over the advertised limit: refused locally, nothing sent.
    let local = harness.run(&["put", "much-too-long", "v"]);
    assert_eq!(local.status.code(), Some(3));
    assert!(
        stderr(&local).contains("key of 13 bytes is over the limit of 8"),
        "{}",
        stderr(&local)
    );

    // Under the advertised limit but over the enforced one: the server refuses it.
    let remote = harness.run(&["put", "sixsix", "v"]);
    assert_eq!(remote.status.code(), Some(3));
    assert!(
        stderr(&remote).contains("KEY_TOO_LARGE"),
        "{}",
        stderr(&remote)
    );

    let lines = harness.run_with_stdin(&["-"], Some(b"put much-too-long v\nput ok v\n".to_vec()));
    assert_eq!(
        stdout(&lines),
        "ERR KEY_TOO_LARGE: key of 13 bytes is over the limit of 8 (the server's limits.key_bytes_max)\nOK\n",
        "{}",
        stderr(&lines)
    );
}

#[test]
fn an_unreachable_server_exits_4_with_a_message() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    drop(listener);
    for args in [&["ping"][..], &["-"][..]] {
        let output = run(&["--server", &addr], args, Some(b"get a\n".to_vec()));
        assert_eq!(output.status.code(), Some(4));
        assert!(
            stderr(&output).contains(&format!("cannot talk to {addr}")),
            "{}",
            stderr(&output)
        );
        assert!(stdout(&output).is_empty());
    }
}

#[test]
fn a_connection_lost_mid_stream_exits_4_after_answering_in_order() {
    let harness = Harness::start(Options {
        vanish_after: Some(1),
        ..Options::default()
    });
    let output = harness.run_with_stdin(&["-"], Some(b"get a\n".to_vec()));
    assert_eq!(output.status.code(), Some(4));
    assert!(
        stdout(&output).starts_with("ERR connection closed"),
        "{}",
        stdout(&output)
    );
    assert!(
        stderr(&output).contains("connection closed"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn a_tls_port_is_named_with_the_flag_to_use() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        use std::io::Read;
        let (mut stream, _) = listener.accept().expect("accept");
        let mut hello = [0u8; 8];
        stream.read_exact(&mut hello).expect("read the hello");
        // What a TLS server answers: an alert record (fatal, decode_error).
        stream
            .write_all(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32])
            .expect("write the alert");
        let _ = stream.read(&mut hello);
    });
    let output = run(&["--server", &addr], &["ping"], None);
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    let message = stderr(&output);
    assert!(message.contains("the server speaks TLS"), "{message}");
    assert!(message.contains("--ca FILE"), "{message}");
    assert!(!message.contains("bad magic"), "{message}");
}

#[test]
fn a_missing_password_names_the_flag_and_the_variable_and_exits_3() {
    let harness = Harness::start(Options {
        refuse: Some((
            Status::AuthRequired,
            "authentication required: this server has a password; \
             send it in the hello (protocol version 2, flag AUTH)"
                .into(),
        )),
        ..Options::default()
    });
    let output = harness.run(&["ping"]);
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let message = stderr(&output);
    assert!(message.contains("--password-file FILE"), "{message}");
    assert!(message.contains("RINGKV_PASSWORD"), "{message}");
    assert!(!message.contains("flag AUTH"), "{message}");
}

#[test]
fn a_wrong_password_exits_3() {
    let harness = Harness::start(Options {
        refuse: Some((
            Status::AuthFailed,
            "authentication failed: wrong password (or unknown user)".into(),
        )),
        ..Options::default()
    });
    let addr = harness.server.addr.to_string();
    let output = Command::new(RINGKV)
        .args(["--server", &addr, "ping"])
        .env("RINGKV_PASSWORD", "wrong")
        .output()
        .expect("run ringkv");
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let message = stderr(&output);
    assert!(message.contains("AUTH_FAILED"), "{message}");
    assert!(message.contains("wrong password"), "{message}");
}

#[test]
fn a_closed_stdout_pipe_ends_quietly_with_141() {
    for args in [&["scan"][..], &["-"][..]] {
        let mut harness = Harness::start(Options {
            hold: true,
            ..Options::default()
        });
        harness
            .server
            .store
            .lock()
            .expect("store")
            .insert(Bytes::from_static(b"a"), Bytes::from_static(b"1"));
        let addr = harness.server.addr.to_string();
        let mut child = Command::new(RINGKV)
            .args(["--server", &addr, "--timeout", "20"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ringkv");
        let mut input = child.stdin.take().expect("stdin pipe");
        input.write_all(b"get a\n").expect("write stdin");
        // The request is at the server, its answer held: close the reading
        // end of stdout, then let the answer go, so the answer's write finds
        // the pipe closed.
        harness.runtime.block_on(harness.server.wait_received(1));
        drop(child.stdout.take());
        harness.server.release();
        drop(input);
        let output = child.wait_with_output().expect("wait for ringkv");
        assert_eq!(
            output.status.code(),
            Some(141),
            "{args:?}: {}",
            stderr(&output)
        );
        assert_eq!(stderr(&output), "", "{args:?}");
    }
}

#[test]
fn stdin_mode_answers_each_line_of_a_frame_refused_for_permission() {
    let harness = Harness::start(Options {
        read_only: true,
        ..Options::default()
    });
    harness
        .server
        .store
        .lock()
        .expect("store")
        .insert(Bytes::from_static(b"a"), Bytes::from_static(b"1"));
    let input = b"put a 2\nget a\nget b\nping\ndel a\nget a\n".to_vec();
    let output = harness.run_with_stdin(&["-"], Some(input));
    let refused = "ERR NO_PERMISSION: NOPERM user 'reader' (read-only) has no permission \
to run operation 0; nothing of this request was applied";
    assert_eq!(
        stdout(&output),
        format!("{refused}\n1\n(nil)\nPONG\n{refused}\n1\n"),
        "{}",
        stderr(&output)
    );
    assert_eq!(output.status.code(), Some(3));
    // Nothing was written.
    let store = harness.server.store.lock().expect("store");
    assert_eq!(store.get(&b"a"[..]), Some(&Bytes::from_static(b"1")));
}

#[test]
fn version_names_the_commit() {
    let output = run(&["--version"], &[], None);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let version = stdout(&output);
    let expected_prefix = format!("ringkv {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(version.starts_with(&expected_prefix), "{version}");
    let commit = version[expected_prefix.len()..]
        .trim_end()
        .strip_suffix(')')
        .unwrap_or_else(|| panic!("{version}"));
    // Built from a git checkout (as this test is), the commit is git's.
    let git = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    match git {
        Ok(git) if git.status.success() => {
            assert_eq!(commit, String::from_utf8_lossy(&git.stdout).trim());
        }
        // No git here: the build could not ask it either.
        _ => assert_eq!(commit, "unknown"),
    }
}

#[test]
fn help_lists_every_exit_status() {
    let output = run(&["--help"], &[], None);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let help = stdout(&output);
    let list = &help[help.find("Exit status:").expect("an exit status list")..];
    for code in ["0", "1", "2", "3", "4", "141"] {
        assert!(
            list.lines()
                .any(|line| line.trim_start().starts_with(&format!("{code} "))),
            "exit status {code} is not listed:\n{list}"
        );
    }
    assert!(list.contains("refused the handshake"), "{list}");
    assert!(list.contains("ringkv scan | head -1"), "{list}");
}
