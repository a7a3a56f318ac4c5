//! Users and roles end to end, against the real binary: every RESP path a
//! read-only user could write through (plain commands, MULTI/EXEC,
//! MSETNX, read-modify-writes, expiry commands, FLUSHALL/FLUSHDB, CONFIG)
//! answers Redis's `-NOPERM`, every native write path (PUT, DELETE,
//! batches, expiry operations, transactions, `ringkv tx`) answers
//! NO_PERMISSION, and nothing refused changes a key; a read-write user
//! cannot FLUSHALL or CONFIG, an admin can; wrong passwords for named users
//! are refused; `ACL WHOAMI` names the user; a config with only the single
//! password works as before; a broken user config stops the server with a
//! clear error.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use common::resp::{bulk, ok, start_with_resp, RespConn as Resp};
use common::*;
use ringkv_client::{Client, ClientError, ConnectOptions, Status};
use ringkv_protocol::resp::Reply;
use ringkv_protocol::RequestOp;

const ROOT_PW: &str = "root-pw";
const READER_PW: &str = "reader-pw";
const APP_PW: &str = "app-pw";
const OPS_PW: &str = "ops-pw";

/// A config with the single password (the `default` user) and three named
/// users, one per role; `extra` is appended to `[server]`.
fn users_config(dir: &Path, extra: &str) -> std::path::PathBuf {
    let mut users = String::new();
    for (name, pw, role) in [
        ("reader", READER_PW, "read-only"),
        ("app", APP_PW, "read-write"),
        ("ops", OPS_PW, "admin"),
    ] {
        let file = dir.join(format!("{name}.password"));
        std::fs::write(&file, format!("{pw}\n")).unwrap();
        users.push_str(&format!(
            "[users.{name}]\npassword_file = {:?}\nrole = \"{role}\"\n",
            file.to_str().unwrap()
        ));
    }
    let path = dir.join("ringkv.toml");
    std::fs::write(
        &path,
        format!(
            "[storage]\nwal_segment_size = \"8MiB\"\n[server]\nrequirepass = \"{ROOT_PW}\"\n\
             auth_failure_delay = \"10ms\"\n{extra}\n{users}"
        ),
    )
    .unwrap();
    path
}

/// Starts a server with `config`, a RESP listener and two shards; returns
/// it and the RESP address.
fn start_with(dir: &Path, config: &Path) -> (ServerProcess, SocketAddr) {
    start_with_resp(
        dir,
        &["--config", config.to_str().unwrap(), "--shards", "2"],
    )
}

impl Resp {
    /// A connection authenticated with `AUTH user pass`.
    fn login(addr: SocketAddr, user: &str, password: &str) -> Resp {
        let mut c = Resp::connect(addr);
        assert_eq!(c.call(&format!("AUTH {user} {password}")), ok(), "{user}");
        c
    }
}

fn noperm(command: &str) -> Reply {
    Reply::Error(format!(
        "NOPERM this user has no permissions to run the '{command}' command"
    ))
}

fn wrongpass() -> Reply {
    Reply::Error("WRONGPASS invalid username-password pair or user is disabled.".into())
}

/// The commands a read-only user must be refused, and the name NOPERM
/// gives each.
const WRITES: &[(&str, &str)] = &[
    ("SET k x", "set"),
    ("SETNX new x", "setnx"),
    ("SETEX k 100 x", "setex"),
    ("PSETEX k 100000 x", "psetex"),
    ("MSET k x other y", "mset"),
    ("MSETNX new1 x new2 y", "msetnx"),
    ("DEL k", "del"),
    ("UNLINK k", "unlink"),
    ("INCR n", "incr"),
    ("DECR n", "decr"),
    ("INCRBY n 5", "incrby"),
    ("INCRBYFLOAT n 1.5", "incrbyfloat"),
    ("APPEND k x", "append"),
    ("SETRANGE k 0 x", "setrange"),
    ("SETBIT k 0 1", "setbit"),
    ("GETSET k x", "getset"),
    ("GETDEL k", "getdel"),
    ("GETEX k PERSIST", "getex"),
    ("EXPIRE k 1", "expire"),
    ("PEXPIRE k 1", "pexpire"),
    ("EXPIREAT k 1", "expireat"),
    ("PERSIST k", "persist"),
    ("RENAME k k2", "rename"),
    ("COPY k k3", "copy"),
    ("FLUSHALL", "flushall"),
    ("FLUSHDB", "flushdb"),
    ("CONFIG SET maxmemory 1", "config|set"),
    ("CONFIG GET maxmemory", "config|get"),
];

/// Writes the keys the refusals must leave alone, as the admin `default`.
fn seed(addr: SocketAddr) {
    let mut admin = Resp::login(addr, "default", ROOT_PW);
    assert_eq!(admin.call("SET k v EX 1000"), ok());
    assert_eq!(admin.call("SET n 10"), ok());
}

/// The seeded keys are as [`seed`] left them, and nothing refused exists.
fn assert_untouched(addr: SocketAddr) {
    let mut admin = Resp::login(addr, "default", ROOT_PW);
    assert_eq!(admin.call("GET k"), bulk("v"));
    assert!(matches!(admin.call("TTL k"), Reply::Int(t) if t > 900));
    assert_eq!(admin.call("GET n"), bulk("10"));
    assert_eq!(
        admin.call("EXISTS new new1 new2 k2 k3 other a"),
        Reply::Int(0)
    );
}

#[test]
fn resp_read_only_user_is_refused_every_write_path() {
    let dir = tempfile::tempdir().unwrap();
    let config = users_config(dir.path(), "");
    let (_server, addr) = start_with(dir.path(), &config);
    seed(addr);

    let mut r = Resp::login(addr, "reader", READER_PW);
    assert_eq!(r.call("ACL WHOAMI"), bulk("reader"));
    // Reads and connection commands work.
    assert_eq!(r.call("PING"), Reply::Simple("PONG".into()));
    assert_eq!(r.call("GET k"), bulk("v"));
    assert_eq!(
        r.call("MGET k n"),
        Reply::Array(vec![bulk("v"), bulk("10")])
    );
    assert!(matches!(r.call("TTL k"), Reply::Int(t) if t > 900));
    assert!(matches!(r.call("SCAN 0"), Reply::Array(_)));
    assert!(matches!(r.call("KEYS *"), Reply::Array(keys) if keys.len() == 2));
    assert_eq!(r.call("DBSIZE"), Reply::Int(2));
    assert!(matches!(r.call("INFO keyspace"), Reply::Bulk(_)));
    for (command, name) in WRITES {
        assert_eq!(r.call(command), noperm(name), "{command}");
    }
    // MULTI: the write is refused when queued, and EXEC aborts.
    assert_eq!(r.call("MULTI"), ok());
    assert_eq!(r.call("GET k"), Reply::Simple("QUEUED".into()));
    assert_eq!(r.call("SET a 1"), noperm("set"));
    assert_eq!(r.call("INCR n"), noperm("incr"));
    assert_eq!(
        r.call("EXEC"),
        Reply::Error("EXECABORT Transaction discarded because of previous errors.".into())
    );
    // A MULTI of reads runs.
    assert_eq!(r.call("MULTI"), ok());
    assert_eq!(r.call("GET n"), Reply::Simple("QUEUED".into()));
    assert_eq!(r.call("EXEC"), Reply::Array(vec![bulk("10")]));
    assert_eq!(r.call("ACL WHOAMI"), bulk("reader"));
    assert_untouched(addr);

    // HELLO 3 AUTH and HELLO 2 AUTH log in as the named user too.
    let mut h = Resp::connect(addr);
    assert!(matches!(
        h.call(&format!("HELLO 3 AUTH reader {READER_PW}")),
        Reply::Map(_)
    ));
    assert_eq!(h.call("ACL WHOAMI"), bulk("reader"));
    assert_eq!(h.call("DEL k"), noperm("del"));
    let mut h = Resp::connect(addr);
    assert!(matches!(
        h.call(&format!("HELLO 2 AUTH reader {READER_PW}")),
        Reply::Array(_)
    ));
    assert_eq!(h.call("SET k z"), noperm("set"));
    // A later AUTH as another user changes who the connection is.
    assert_eq!(h.call(&format!("AUTH app {APP_PW}")), ok());
    assert_eq!(h.call("ACL WHOAMI"), bulk("app"));
    assert_eq!(h.call("SET fresh 1"), ok());
}

#[test]
fn resp_read_write_user_cannot_administer_and_admin_can() {
    let dir = tempfile::tempdir().unwrap();
    let config = users_config(dir.path(), "");
    let (_server, addr) = start_with(dir.path(), &config);

    let mut app = Resp::login(addr, "app", APP_PW);
    assert_eq!(app.call("ACL WHOAMI"), bulk("app"));
    assert_eq!(app.call("SET a 1"), ok());
    assert_eq!(app.call("INCR a"), Reply::Int(2));
    assert_eq!(app.call("EXPIRE a 100"), Reply::Int(1));
    assert_eq!(app.call("PERSIST a"), Reply::Int(1));
    assert_eq!(app.call("MSETNX b 1 c 2"), Reply::Int(1));
    assert_eq!(app.call("MULTI"), ok());
    assert_eq!(app.call("SET d 4"), Reply::Simple("QUEUED".into()));
    assert_eq!(app.call("DEL b"), Reply::Simple("QUEUED".into()));
    assert_eq!(app.call("EXEC"), Reply::Array(vec![ok(), Reply::Int(1)]));
    assert_eq!(app.call("FLUSHALL"), noperm("flushall"));
    assert_eq!(app.call("FLUSHDB"), noperm("flushdb"));
    assert_eq!(app.call("CONFIG SET maxmemory 1"), noperm("config|set"));
    assert_eq!(app.call("DBSIZE"), Reply::Int(3));

    let mut ops = Resp::login(addr, "ops", OPS_PW);
    assert_eq!(ops.call("ACL WHOAMI"), bulk("ops"));
    // ringkv has no CONFIG SET: an admin gets past the permission check
    // to the unknown-subcommand answer.
    assert!(
        matches!(ops.call("CONFIG SET maxmemory 1"), Reply::Error(e) if e.starts_with("ERR unknown subcommand 'SET'")),
    );
    assert!(matches!(ops.call("CONFIG GET maxmemory"), Reply::Array(_)));
    assert_eq!(ops.call("FLUSHALL"), ok());
    assert_eq!(ops.call("DBSIZE"), Reply::Int(0));
    assert_eq!(app.call("SET e 1"), ok());
    assert_eq!(ops.call("FLUSHDB"), ok());
    assert_eq!(app.call("DBSIZE"), Reply::Int(0));
}

#[test]
fn wrong_passwords_for_named_users_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = users_config(dir.path(), "");
    let (server, addr) = start_with(dir.path(), &config);
    let mut c = Resp::connect(addr);
    for line in [
        "AUTH reader wrong".to_string(),
        format!("AUTH reader {ROOT_PW}"),
        format!("AUTH reader {APP_PW}"),
        format!("AUTH Reader {READER_PW}"),
        format!("AUTH nobody {READER_PW}"),
        format!("AUTH {READER_PW}"),
        format!("HELLO 3 AUTH app {READER_PW}"),
    ] {
        assert_eq!(c.call(&line), wrongpass(), "{line}");
        assert_eq!(
            c.call("GET k"),
            Reply::Error("NOAUTH Authentication required.".into()),
            "{line}"
        );
    }
    assert_eq!(c.call(&format!("AUTH ops {OPS_PW}")), ok());
    // A failed AUTH keeps the user the connection had.
    assert_eq!(c.call("AUTH reader wrong"), wrongpass());
    assert_eq!(c.call("ACL WHOAMI"), bulk("ops"));

    with_runtime(async {
        for (user, pw) in [
            ("reader", "wrong"),
            ("reader", ROOT_PW),
            ("nobody", READER_PW),
        ] {
            match native(server.addr, Some(user), pw).await {
                Err(ClientError::Refused { status, .. }) => {
                    assert_eq!(status, Status::AuthFailed, "{user}")
                }
                other => panic!(
                    "{user}/{pw}: expected a refusal, got {:?}",
                    other.map(|_| ())
                ),
            }
        }
    });
}

async fn native(
    addr: SocketAddr,
    user: Option<&str>,
    password: &str,
) -> Result<Client, ClientError> {
    let mut options = ConnectOptions::new()
        .with_password(password.as_bytes())
        .with_timeout(WAIT);
    options.user = user.map(|u| u.as_bytes().to_vec());
    Client::connect_with(&addr.to_string(), &options).await
}

fn assert_no_permission<T: std::fmt::Debug>(result: Result<T, ClientError>, what: &str) {
    match result {
        Err(ClientError::Server { status, message }) => {
            assert_eq!(status, Status::NoPermission, "{what}: {message}");
            assert!(
                message.contains("NOPERM user 'reader'"),
                "{what}: {message}"
            );
        }
        other => panic!("{what}: expected NO_PERMISSION, got {other:?}"),
    }
}

#[test]
fn native_read_only_user_is_refused_every_write_path() {
    let dir = tempfile::tempdir().unwrap();
    let config = users_config(dir.path(), "");
    let (server, resp) = start_with(dir.path(), &config);
    seed(resp);
    with_runtime(async {
        let reader = native(server.addr, Some("reader"), READER_PW)
            .await
            .unwrap();
        assert_eq!(reader.protocol_version(), ringkv_protocol::PROTOCOL_VERSION);
        assert_eq!(
            reader.get("k").await.unwrap(),
            Some(Bytes::from_static(b"v"))
        );
        reader.ping().await.unwrap();
        assert!(!reader.stats().await.unwrap().is_empty());
        assert!(reader.scan(0, 100, "").await.is_ok());
        assert_no_permission(reader.put("k", "x").await, "PUT");
        assert_no_permission(reader.delete("k").await, "DELETE");
        assert_no_permission(reader.persist("k").await, "EXPIRE (persist)");
        assert_no_permission(
            reader.expire_in("k", Duration::from_secs(1)).await,
            "EXPIRE",
        );
        assert_no_permission(
            reader
                .put_expiring_in("new", "x", Duration::from_secs(100))
                .await,
            "PUT_EXPIRING",
        );
        // A batch with one write among reads is refused as a whole.
        let batch = vec![
            RequestOp::Get {
                key: Bytes::from_static(b"k"),
            },
            RequestOp::Put {
                key: Bytes::from_static(b"a"),
                value: Bytes::from_static(b"1"),
            },
        ];
        assert_no_permission(reader.batch(batch).await, "batch");
        // Transactions.
        let mut txn = reader.transaction();
        assert_no_permission(txn.put("a", "1").await, "transaction PUT");
        let mut txn = reader.transaction();
        assert_no_permission(txn.get_for_update("k").await, "GET_FOR_UPDATE");
        // The connection is still usable.
        assert_eq!(
            reader.get("n").await.unwrap(),
            Some(Bytes::from_static(b"10"))
        );

        // read-write and the default user write.
        let app = native(server.addr, Some("app"), APP_PW).await.unwrap();
        app.put("written", "1").await.unwrap();
        let mut txn = app.transaction();
        txn.put("txn", "1").await.unwrap();
        txn.commit().await.unwrap();
        let default = native(server.addr, None, ROOT_PW).await.unwrap();
        assert!(default.delete("written").await.unwrap());
        assert!(default.delete("txn").await.unwrap());
    });
    assert_untouched(resp);

    // `ringkv tx` as the read-only user: refused, nothing committed.
    let script = dir.path().join("script.tx");
    std::fs::write(&script, "put a 1\nget k\n").unwrap();
    let run = |user: &str, pw: &str| {
        std::process::Command::new(cli_binary())
            .args(["--server", &server.addr.to_string(), "--user", user, "tx"])
            .arg(&script)
            .env("RINGKV_PASSWORD", pw)
            .output()
            .expect("run ringkv tx")
    };
    let out = run("reader", READER_PW);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("NO_PERMISSION"), "{stderr}");
    assert_untouched(resp);
    let out = run("app", APP_PW);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "OK\nv\nCOMMITTED\n");
}

/// A config with only the single password: the `default` user is an admin
/// on both ports, as before users existed; `server.default_role` limits it.
#[test]
fn the_single_password_still_works_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ringkv.toml");
    std::fs::write(
        &config,
        format!("[server]\nrequirepass = \"{ROOT_PW}\"\nauth_failure_delay = \"10ms\"\n"),
    )
    .unwrap();
    let (server, addr) = start_with(dir.path(), &config);
    let mut c = Resp::connect(addr);
    assert_eq!(c.call(&format!("AUTH {ROOT_PW}")), ok());
    assert_eq!(c.call("ACL WHOAMI"), bulk("default"));
    assert_eq!(c.call("SET a 1"), ok());
    assert_eq!(c.call("FLUSHALL"), ok());
    assert_eq!(c.call("DBSIZE"), Reply::Int(0));
    assert_eq!(c.call("AUTH reader x"), wrongpass());
    with_runtime(async {
        let client = native(server.addr, None, ROOT_PW).await.unwrap();
        client.put("a", "1").await.unwrap();
        assert!(client.delete("a").await.unwrap());
    });
    drop(server);

    // default_role = "read-only": the single password now only reads.
    let dir = tempfile::tempdir().unwrap();
    let config = users_config(dir.path(), "default_role = \"read-only\"");
    let (server, addr) = start_with(dir.path(), &config);
    let mut c = Resp::login(addr, "default", ROOT_PW);
    assert_eq!(c.call("GET a"), Reply::Null);
    assert_eq!(c.call("SET a 1"), noperm("set"));
    with_runtime(async {
        let client = native(server.addr, None, ROOT_PW).await.unwrap();
        match client.put("a", "1").await {
            Err(ClientError::Server { status, .. }) => assert_eq!(status, Status::NoPermission),
            other => panic!("expected NO_PERMISSION, got {other:?}"),
        }
    });
}

/// A broken user config stops the server and says which user and why.
#[test]
fn a_broken_user_config_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "[users.bob]\npassword_file = \"/nonexistent/bob.password\"\nrole = \"read-only\"\n",
            "users.bob.password_file",
        ),
        (
            "[users.bob]\nrole = \"read-only\"\n",
            "every user needs a password file",
        ),
        (
            "[users.bob]\npassword_file = \"/tmp/x\"\nrole = \"superuser\"\n",
            "users.bob.role",
        ),
        (
            "[users.default]\npassword_file = \"/tmp/x\"\n",
            "duplicate user",
        ),
        (
            "[users.bob]\npassword_file = \"/tmp/x\"\n[users.bob]\npassword_file = \"/tmp/y\"\n",
            // TOML itself refuses the second table, pointing at it.
            "line 5, column 8: TOML syntax error: duplicate key",
        ),
    ];
    for (i, (users, expected)) in cases.into_iter().enumerate() {
        let config = dir.path().join(format!("c{i}.toml"));
        std::fs::write(&config, format!("[server]\nrequirepass = \"pw\"\n{users}")).unwrap();
        let log = match try_start_server(
            &dir.path().join(format!("d{i}")),
            &["--config", config.to_str().unwrap()],
        ) {
            Ok(_) => panic!("case {i}: the server started"),
            Err(log) => log.join("\n"),
        };
        assert!(log.contains(expected), "case {i}: {log}");
    }
}
