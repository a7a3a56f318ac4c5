//! From one RESP command (its arguments) to what runs: a reply known at
//! once, engine operations plus how to turn their results into the reply,
//! or a server command answered from the server's own state — without I/O,
//! so every command's parsing, arity and error texts are tested here.
//!
//! What must hold: argument errors are answered with Redis's texts before
//! anything reaches the engine; a command's engine operations are sent
//! together in its order, and its reply is built only from their results;
//! every read-modify-write is ONE [`engine::Op::Update`] (atomic on the
//! key's shard), never a read followed by a write; nothing here allocates
//! from a number the client sent without bounding it first.

use bytes::{Bytes, BytesMut};
use engine::{Op, OpError, OpResult, TtlUpdate, TtlUpdateFn, Update, UpdateAnswer, UpdateFn};
use ringkv_protocol::resp::{parse_i64, ReplyWriter, Version};

use super::update;
use crate::acl::{self, Identity, Role};

/// The facts planning needs (from the configuration).
#[derive(Debug, Clone, Copy)]
pub struct Env {
    pub value_bytes_max: usize,
    /// Most engine operations in one engine batch (a command with more runs
    /// as several batches, in order).
    pub ops_max: usize,
    /// FLUSHDB/FLUSHALL run (else they are unknown commands).
    pub flush_enabled: bool,
}

/// What one connection remembers between commands.
#[derive(Debug, Clone)]
pub struct Client {
    pub id: i64,
    pub version: Version,
    pub name: Option<Bytes>,
    pub lib_name: Option<Bytes>,
    pub lib_ver: Option<Bytes>,
    /// Whether the client may run commands: true from the start when no
    /// password is configured, else after a successful AUTH (or HELLO AUTH).
    pub authenticated: bool,
    /// The user the client is (`default` until an AUTH names another) and
    /// its role, which [`check`] holds every command to.
    pub identity: Identity,
}

impl Client {
    /// A client of the `default` user as an admin (a server without users).
    pub fn new(id: i64) -> Client {
        Client::with_identity(id, Identity::new(tunables::DEFAULT_USER, Role::Admin))
    }

    pub fn with_identity(id: i64, identity: Identity) -> Client {
        Client {
            id,
            version: Version::Resp2,
            name: None,
            lib_name: None,
            lib_ver: None,
            authenticated: true,
            identity,
        }
    }
}

/// How to build a reply from a command's engine results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// One GET: the value or null.
    Get,
    /// Writes: `+OK` when all succeeded.
    Ok,
    /// One update: its answer.
    Update,
    /// Deletes: how many removed a key.
    Removed,
    /// Reads: how many found their key.
    Found,
    /// Reads: an array of values or nulls.
    Values,
    /// One GET: the value's length (0 when absent).
    Strlen,
    /// One GET: part of the value, Redis's GETRANGE rules.
    Range(i64, i64),
    /// One GET: the key's type.
    Type,
    /// One GET: GETBIT of this bit offset.
    Bit(u64),
    /// Two GETs: LCS of the two values.
    Lcs(LcsOptions),
    /// One GET: BITCOUNT over a range (`None`: the whole value); the bool
    /// says the range is in bits (BIT) rather than bytes.
    BitCount(Option<(i64, i64, bool)>),
}

/// A command answered from the server's state, after every command before
/// it has run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerCommand {
    DbSize,
    /// Sections asked for (lowercase); empty means the default set.
    Info(Vec<String>),
    /// Glob patterns of parameter names.
    ConfigGet(Vec<Bytes>),
    /// FLUSHDB / FLUSHALL.
    Flush,
    /// KEYS pattern.
    Keys(Bytes),
    /// SCAN cursor [MATCH pattern] [COUNT count] [TYPE type].
    Scan {
        cursor: u64,
        pattern: Option<Bytes>,
        count: usize,
        /// False when TYPE asks for a type ringkv does not have.
        strings: bool,
    },
    RandomKey,
    /// BGSAVE: a checkpoint of every shard, in the background.
    BgSave,
    /// LASTSAVE: Unix seconds of the last finished BGSAVE or backup.
    LastSave,
    /// RENAME / RENAMENX (`nx`).
    Rename {
        from: Bytes,
        to: Bytes,
        nx: bool,
    },
    /// COPY source destination [DB 0] [REPLACE].
    Copy {
        from: Bytes,
        to: Bytes,
        replace: bool,
    },
}

/// What a command turned into.
#[derive(Debug)]
pub enum Planned {
    /// The reply, encoded already (errors, PING, HELLO...).
    Ready(Bytes),
    /// Operations for the engine and how to answer from their results.
    Engine {
        ops: Vec<Op>,
        finish: Finish,
    },
    Server(ServerCommand),
    /// Answer `+OK` and close the connection.
    Quit,
    /// MULTI, EXEC, DISCARD, WATCH, UNWATCH: run by the connection's
    /// transaction state (`multi`).
    Multi(MultiCommand),
    /// MSETNX: all keys set or none, as one transaction (`multi`).
    MsetNx(Vec<(Bytes, Bytes)>),
    /// AUTH (or HELLO with AUTH): the executor checks the password, marks
    /// the client authenticated, then answers `+OK` or runs `hello` (the
    /// HELLO without its AUTH option).
    Auth {
        user: Option<Bytes>,
        password: Bytes,
        hello: Option<Vec<Bytes>>,
    },
}

/// The transaction commands of Redis (see [`Planned::Multi`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MultiCommand {
    Multi,
    Exec,
    Discard,
    Watch(Vec<Bytes>),
    Unwatch,
}

/// The commands ringkv answers (COMMAND COUNT counts them).
pub const COMMANDS: &[&str] = &[
    "acl",
    "append",
    "auth",
    "bgsave",
    "bitcount",
    "client",
    "command",
    "config",
    "copy",
    "dbsize",
    "decr",
    "decrby",
    "del",
    "discard",
    "echo",
    "exec",
    "exists",
    "expire",
    "expireat",
    "expiretime",
    "flushall",
    "flushdb",
    "get",
    "getbit",
    "getdel",
    "getex",
    "getrange",
    "getset",
    "hello",
    "incr",
    "incrby",
    "incrbyfloat",
    "info",
    "keys",
    "lastsave",
    "lcs",
    "mget",
    "mset",
    "msetnx",
    "multi",
    "persist",
    "pexpire",
    "pexpireat",
    "pexpiretime",
    "ping",
    "psetex",
    "pttl",
    "quit",
    "randomkey",
    "rename",
    "renamenx",
    "scan",
    "select",
    "set",
    "setbit",
    "setex",
    "setnx",
    "setrange",
    "strlen",
    "substr",
    "time",
    "ttl",
    "type",
    "unlink",
    "unwatch",
    "watch",
];

/// The version Redis clients are told (`redis_version`, HELLO): the Redis
/// release whose behaviour the implemented commands follow.
pub const REDIS_VERSION: &str = "7.0.15";

pub const SYNTAX: &str = "ERR syntax error";

fn ready(version: Version, f: impl FnOnce(&mut ReplyWriter)) -> Planned {
    let mut out = BytesMut::new();
    f(&mut ReplyWriter::new(&mut out, version));
    Planned::Ready(out.freeze())
}

fn error(version: Version, text: &str) -> Planned {
    ready(version, |w| w.error(text))
}

pub fn wrong_arity(name: &str) -> String {
    format!("ERR wrong number of arguments for '{name}' command")
}

/// Redis's unknown-command text: the name and the first arguments, cut
/// at about 128 characters.
pub fn unknown_command(args: &[Bytes]) -> String {
    let name = String::from_utf8_lossy(&args[0]);
    let name: String = name.chars().take(128).collect();
    let mut rest = String::new();
    for a in &args[1..] {
        if rest.len() >= 128 {
            break;
        }
        let room = 128 - rest.len();
        let a = String::from_utf8_lossy(a);
        let a: String = a.chars().take(room).collect();
        rest.push_str(&format!("'{a}' "));
    }
    format!("ERR unknown command '{name}', with args beginning with: {rest}")
}

fn unknown_subcommand(sub: &[u8], command: &str) -> String {
    let sub = String::from_utf8_lossy(sub);
    let sub: String = sub.chars().take(128).collect();
    format!(
        "ERR unknown subcommand '{sub}'. Try {} HELP.",
        command.to_ascii_uppercase()
    )
}

fn integer(arg: &[u8]) -> Option<i64> {
    parse_i64(arg)
}

fn update_op(key: &Bytes, apply: UpdateFn, arg: Bytes, number: i64) -> Vec<Op> {
    vec![Op::Update {
        key: key.clone(),
        update: Update { apply, arg, number },
    }]
}

/// The checks Redis makes before it runs or queues a command: a known
/// name, the arity, authentication, the user's permission (`acl`). `Ok`:
/// the command's name in lower case; `Err`: the error reply. Every command
/// passes here, plain or queued after MULTI (and again at EXEC).
pub fn check(args: &[Bytes], client: &Client, env: &Env) -> Result<String, Planned> {
    let v = client.version;
    let name = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
    let n = args.len();
    if !env.flush_enabled && matches!(name.as_str(), "flushdb" | "flushall") {
        return Err(error(v, &unknown_command(args)));
    }
    // (arity: exact when > 0, at least -arity when < 0)
    let arity: i32 = match name.as_str() {
        "ping" | "quit" | "hello" | "info" | "command" => -1,
        "echo" | "select" | "get" | "getdel" | "incr" | "decr" | "strlen" | "type" => 2,
        "auth" | "client" | "config" | "acl" | "mget" | "del" | "unlink" | "exists" => -2,
        "set" | "mset" => -3,
        "setnx" | "getset" | "incrby" | "decrby" | "incrbyfloat" | "append" => 3,
        "getrange" | "substr" | "setrange" => 4,
        "setbit" => 4,
        "lcs" => -3,
        "getbit" => 3,
        "bitcount" => -2,
        "dbsize" | "time" | "randomkey" | "lastsave" => 1,
        "bgsave" => -1,
        "flushdb" | "flushall" => -1,
        "keys" => 2,
        "scan" => -2,
        "rename" | "renamenx" => 3,
        "copy" => -3,
        "ttl" | "pttl" | "expiretime" | "pexpiretime" | "persist" => 2,
        "expire" | "pexpire" | "expireat" | "pexpireat" => -3,
        "setex" | "psetex" => 4,
        "getex" => -2,
        "multi" | "exec" | "discard" | "unwatch" => 1,
        "watch" => -2,
        "msetnx" => -3,
        _ => return Err(error(v, &unknown_command(args))),
    };
    let fits = if arity > 0 {
        n == arity as usize
    } else {
        n >= (-arity) as usize
    };
    if !fits {
        return Err(error(v, &wrong_arity(&name)));
    }
    // Redis's order: unknown names and arity first, then authentication.
    if !client.authenticated && !matches!(name.as_str(), "auth" | "hello" | "quit") {
        return Err(error(v, NOAUTH));
    }
    if !client.identity.role.allows(acl::resp_category(&name, args)) {
        let label = acl::resp_command_label(&name, args);
        return Err(error(v, &acl::noperm_text(&label)));
    }
    Ok(name)
}

/// Plans one command (`args` is never empty). May change `client` (HELLO,
/// CLIENT SETNAME...).
pub fn plan(args: &[Bytes], client: &mut Client, env: &Env) -> Planned {
    let name = match check(args, client, env) {
        Ok(name) => name,
        Err(reply) => return reply,
    };
    let v = client.version;
    plan_server(args, &name, client)
        .or_else(|| plan_read(args, &name, v, env))
        .or_else(|| plan_write(args, &name, v))
        .or_else(|| plan_update(args, &name, v, env))
        .unwrap_or_else(|| error(v, &unknown_command(args)))
}

/// Connection, server and keyspace-wide commands.
fn plan_server(args: &[Bytes], name: &str, client: &mut Client) -> Option<Planned> {
    let v = client.version;
    let n = args.len();
    let key = args.get(1).cloned().unwrap_or_default();
    Some(match name {
        "ping" => match n {
            1 => ready(v, |w| w.simple("PONG")),
            2 => ready(v, |w| w.bulk(&args[1])),
            _ => error(v, &wrong_arity("ping")),
        },
        "echo" => ready(v, |w| w.bulk(&args[1])),
        "quit" => Planned::Quit,
        "select" => match integer(&args[1]) {
            None => error(v, update::NOT_INTEGER),
            Some(0) => ready(v, |w| w.ok()),
            Some(_) => error(v, "ERR DB index is out of range"),
        },
        "auth" => plan_auth(args, v),
        "acl" => {
            let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
            match (sub.as_str(), n) {
                ("whoami", 2) => {
                    let user = client.identity.user.clone();
                    ready(v, |w| w.bulk(user.as_bytes()))
                }
                ("whoami", _) => error(v, &wrong_arity("acl|whoami")),
                _ => error(v, &unknown_subcommand(&args[1], "acl")),
            }
        }
        "hello" => plan_hello(args, client),
        "client" => plan_client(args, client),
        "command" => {
            if n == 1 {
                return Some(error(v, &unknown_subcommand(b"", "command")));
            }
            let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
            match (sub.as_str(), n) {
                ("count", 2) => ready(v, |w| w.int(COMMANDS.len() as i64)),
                ("count", _) => error(v, &wrong_arity("command|count")),
                _ => error(v, &unknown_subcommand(&args[1], "command")),
            }
        }
        "config" => {
            let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
            match sub.as_str() {
                "get" if n >= 3 => Planned::Server(ServerCommand::ConfigGet(args[2..].to_vec())),
                "get" => error(v, &wrong_arity("config|get")),
                _ => error(v, &unknown_subcommand(&args[1], "config")),
            }
        }
        "dbsize" => Planned::Server(ServerCommand::DbSize),
        // BGSAVE [SCHEDULE]: both start a checkpoint of every shard now.
        "bgsave" => match args.get(1) {
            None => Planned::Server(ServerCommand::BgSave),
            Some(a) if n == 2 && a.eq_ignore_ascii_case(b"schedule") => {
                Planned::Server(ServerCommand::BgSave)
            }
            Some(_) => error(v, SYNTAX),
        },
        "lastsave" => Planned::Server(ServerCommand::LastSave),
        "flushdb" | "flushall" => match args.get(1) {
            None => Planned::Server(ServerCommand::Flush),
            Some(mode)
                if n == 2
                    && (mode.eq_ignore_ascii_case(b"sync")
                        || mode.eq_ignore_ascii_case(b"async")) =>
            {
                Planned::Server(ServerCommand::Flush)
            }
            Some(_) => error(v, SYNTAX),
        },
        "keys" => Planned::Server(ServerCommand::Keys(key)),
        "randomkey" => Planned::Server(ServerCommand::RandomKey),
        "rename" | "renamenx" => Planned::Server(ServerCommand::Rename {
            from: key,
            to: args[2].clone(),
            nx: name == "renamenx",
        }),
        "scan" => plan_scan(args, v),
        "copy" => plan_copy(args, v),
        "info" => Planned::Server(ServerCommand::Info(
            args[1..]
                .iter()
                .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
                .collect(),
        )),
        "time" => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            ready(v, |w| {
                w.array(2);
                w.bulk(now.as_secs().to_string().as_bytes());
                w.bulk(now.subsec_micros().to_string().as_bytes());
            })
        }
        _ => return None,
    })
}

/// Commands that read keys (and SETBIT, checked against the same value limit).
fn plan_read(args: &[Bytes], name: &str, v: Version, env: &Env) -> Option<Planned> {
    let n = args.len();
    let key = args.get(1).cloned().unwrap_or_default();
    Some(match name {
        "get" => engine(vec![Op::Get { key }], Finish::Get),
        "lcs" => match plan_lcs(args) {
            Ok(options) => engine(
                vec![
                    Op::Get { key },
                    Op::Get {
                        key: args[2].clone(),
                    },
                ],
                Finish::Lcs(options),
            ),
            Err(text) => error(v, text),
        },
        "getbit" => match bit_offset(&args[2]) {
            Some(offset) => engine(vec![Op::Get { key }], Finish::Bit(offset)),
            None => error(v, BIT_OFFSET),
        },
        "setbit" => {
            let Some(offset) = bit_offset(&args[2]) else {
                return Some(error(v, BIT_OFFSET));
            };
            let bit = match integer(&args[3]) {
                Some(b @ (0 | 1)) => b as u64,
                _ => return Some(error(v, "ERR bit is not an integer or out of range")),
            };
            if offset / 8 >= env.value_bytes_max as u64 {
                return Some(error(v, &too_long(env.value_bytes_max)));
            }
            engine(
                update_op(
                    &key,
                    update::set_bit,
                    Bytes::new(),
                    (offset << 1 | bit) as i64,
                ),
                Finish::Update,
            )
        }
        "bitcount" => {
            let range = match n {
                2 => None,
                4 | 5 => {
                    let bits = match args.get(4) {
                        None => false,
                        Some(unit) if unit.eq_ignore_ascii_case(b"bit") => true,
                        Some(unit) if unit.eq_ignore_ascii_case(b"byte") => false,
                        Some(_) => return Some(error(v, SYNTAX)),
                    };
                    match (integer(&args[2]), integer(&args[3])) {
                        (Some(start), Some(end)) => Some((start, end, bits)),
                        _ => return Some(error(v, update::NOT_INTEGER)),
                    }
                }
                _ => return Some(error(v, SYNTAX)),
            };
            engine(vec![Op::Get { key }], Finish::BitCount(range))
        }
        "strlen" => engine(vec![Op::Get { key }], Finish::Strlen),
        "type" => engine(vec![Op::Get { key }], Finish::Type),
        "getrange" | "substr" => match (integer(&args[2]), integer(&args[3])) {
            (Some(start), Some(end)) => engine(vec![Op::Get { key }], Finish::Range(start, end)),
            _ => error(v, update::NOT_INTEGER),
        },
        "mget" | "exists" => {
            let ops = args[1..]
                .iter()
                .map(|k| Op::Get { key: k.clone() })
                .collect();
            let finish = if name == "mget" {
                Finish::Values
            } else {
                Finish::Found
            };
            engine(ops, finish)
        }
        _ => return None,
    })
}

/// Deletes, writes, transactions (MULTI and WATCH) and expiry commands.
fn plan_write(args: &[Bytes], name: &str, v: Version) -> Option<Planned> {
    let n = args.len();
    let key = args.get(1).cloned().unwrap_or_default();
    Some(match name {
        "del" | "unlink" => {
            let ops = args[1..]
                .iter()
                .map(|k| Op::Delete { key: k.clone() })
                .collect();
            engine(ops, Finish::Removed)
        }
        "mset" => {
            if n % 2 != 1 {
                return Some(error(v, &wrong_arity("mset")));
            }
            let ops = args[1..]
                .chunks(2)
                .map(|kv| Op::Put {
                    key: kv[0].clone(),
                    value: kv[1].clone(),
                })
                .collect();
            engine(ops, Finish::Ok)
        }
        "msetnx" => {
            if n % 2 != 1 {
                return Some(error(v, &wrong_arity("msetnx")));
            }
            Planned::MsetNx(
                args[1..]
                    .chunks(2)
                    .map(|kv| (kv[0].clone(), kv[1].clone()))
                    .collect(),
            )
        }
        "multi" => Planned::Multi(MultiCommand::Multi),
        "exec" => Planned::Multi(MultiCommand::Exec),
        "discard" => Planned::Multi(MultiCommand::Discard),
        "watch" => Planned::Multi(MultiCommand::Watch(args[1..].to_vec())),
        "unwatch" => Planned::Multi(MultiCommand::Unwatch),
        "set" => plan_set(args, v),
        "setex" | "psetex" => {
            let unit = if name == "setex" { 1000 } else { 1 };
            match expiry_from_now(&args[2], unit, name, true) {
                Ok(at) => ttl_set(&key, 0, &args[3], at),
                Err(e) => error(v, &e),
            }
        }
        "getex" => plan_getex(args, v),
        "expire" | "pexpire" | "expireat" | "pexpireat" => plan_expire(args, name, v),
        "ttl" | "pttl" | "expiretime" | "pexpiretime" => {
            let what = match name {
                "ttl" => update::TTL_SECONDS,
                "pttl" => update::TTL_MILLIS,
                "expiretime" => update::EXPIRETIME_SECONDS,
                _ => update::EXPIRETIME_MILLIS,
            };
            engine(
                ttl_op(&key, update::ttl, Bytes::new(), what),
                Finish::Update,
            )
        }
        "persist" => engine(
            ttl_op(&key, update::persist, Bytes::new(), 0),
            Finish::Update,
        ),
        _ => return None,
    })
}

/// Read-modify-writes: SETNX, GETSET, GETDEL, INCR and its kin, APPEND, SETRANGE.
fn plan_update(args: &[Bytes], name: &str, v: Version, env: &Env) -> Option<Planned> {
    let key = args.get(1).cloned().unwrap_or_default();
    Some(match name {
        "setnx" => engine(
            update_op(&key, update::set_nx, args[2].clone(), 0),
            Finish::Update,
        ),
        "getset" => engine(
            update_op(&key, update::set, args[2].clone(), update::SET_GET),
            Finish::Update,
        ),
        "getdel" => engine(
            update_op(&key, update::get_del, Bytes::new(), 0),
            Finish::Update,
        ),
        "incr" | "decr" => {
            let delta = if name == "incr" { 1 } else { -1 };
            engine(
                update_op(&key, update::incr_by, Bytes::new(), delta),
                Finish::Update,
            )
        }
        "incrby" | "decrby" => {
            let Some(delta) = integer(&args[2]) else {
                return Some(error(v, update::NOT_INTEGER));
            };
            let delta = if name == "incrby" {
                delta
            } else {
                match delta.checked_neg() {
                    Some(d) => d,
                    None => return Some(error(v, "ERR decrement would overflow")),
                }
            };
            engine(
                update_op(&key, update::incr_by, Bytes::new(), delta),
                Finish::Update,
            )
        }
        "incrbyfloat" => {
            if update::parse_float(&args[2]).is_none() {
                return Some(error(v, update::NOT_FLOAT));
            }
            engine(
                update_op(&key, update::incr_by_float, args[2].clone(), 0),
                Finish::Update,
            )
        }
        "append" => engine(
            update_op(&key, update::append, args[2].clone(), 0),
            Finish::Update,
        ),
        "setrange" => {
            let Some(offset) = integer(&args[2]) else {
                return Some(error(v, update::NOT_INTEGER));
            };
            if offset < 0 {
                return Some(error(v, "ERR offset is out of range"));
            }
            let value = &args[3];
            if !value.is_empty()
                && (offset as u64).saturating_add(value.len() as u64) > env.value_bytes_max as u64
            {
                return Some(error(v, &too_long(env.value_bytes_max)));
            }
            engine(
                update_op(&key, update::set_range, value.clone(), offset),
                Finish::Update,
            )
        }
        _ => return None,
    })
}

fn engine(ops: Vec<Op>, finish: Finish) -> Planned {
    Planned::Engine { ops, finish }
}

fn too_long(max: usize) -> String {
    format!(
        "ERR string exceeds maximum allowed size (ringkv's limits.value_bytes_max = {max} bytes)"
    )
}

/// COPY source destination [DB index] [REPLACE]: only database 0 exists.
fn plan_copy(args: &[Bytes], v: Version) -> Planned {
    let mut replace = false;
    let mut i = 3;
    while i < args.len() {
        if args[i].eq_ignore_ascii_case(b"replace") {
            replace = true;
        } else if args[i].eq_ignore_ascii_case(b"db") && i + 1 < args.len() {
            match integer(&args[i + 1]).and_then(|n| i32::try_from(n).ok()) {
                None => return error(v, update::NOT_INTEGER),
                Some(0) => {}
                Some(_) => return error(v, "ERR DB index is out of range"),
            }
            i += 1;
        } else {
            return error(v, SYNTAX);
        }
        i += 1;
    }
    if args[1] == args[2] {
        return error(v, "ERR source and destination objects are the same");
    }
    Planned::Server(ServerCommand::Copy {
        from: args[1].clone(),
        to: args[2].clone(),
        replace,
    })
}

/// SCAN's cursor is a shard and a partition: `shard * partitions +
/// partition`; 0 starts a scan and ends one.
fn plan_scan(args: &[Bytes], v: Version) -> Planned {
    let Some(cursor) = std::str::from_utf8(&args[1])
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return error(v, "ERR invalid cursor");
    };
    let mut pattern = None;
    let mut count = 10usize;
    let mut strings = true;
    let mut i = 2;
    while i < args.len() {
        let opt = String::from_utf8_lossy(&args[i]).to_ascii_uppercase();
        let Some(value) = args.get(i + 1) else {
            return error(v, SYNTAX);
        };
        match opt.as_str() {
            "MATCH" => pattern = Some(value.clone()),
            "COUNT" => match integer(value) {
                None => return error(v, update::NOT_INTEGER),
                Some(c) if c < 1 => return error(v, SYNTAX),
                Some(c) => count = c.min(1 << 20) as usize,
            },
            "TYPE" => strings = value.eq_ignore_ascii_case(b"string"),
            _ => return error(v, SYNTAX),
        }
        i += 2;
    }
    Planned::Server(ServerCommand::Scan {
        cursor,
        pattern,
        count,
        strings,
    })
}

fn ttl_op(key: &Bytes, apply: TtlUpdateFn, arg: Bytes, number: i64) -> Vec<Op> {
    vec![Op::UpdateTtl {
        key: key.clone(),
        update: TtlUpdate { apply, arg, number },
    }]
}

/// An expiry-setting SET: flags byte, then the value (see
/// [`update::set_expiring`]).
fn ttl_set(key: &Bytes, flags: u8, value: &Bytes, at: i64) -> Planned {
    let mut arg = BytesMut::with_capacity(1 + value.len());
    arg.extend_from_slice(&[flags]);
    arg.extend_from_slice(value);
    engine(
        ttl_op(key, update::set_expiring, arg.freeze(), at),
        Finish::Update,
    )
}

fn invalid_expire(command: &str) -> String {
    format!("ERR invalid expire time in '{command}' command")
}

/// An expiry time (Unix ms) from an argument in `unit_ms` units, relative
/// to now unless `absolute`: Redis's checks and texts. `positive`: the
/// SET-family rule that the number must be above 0.
fn expiry_time(
    arg: &[u8],
    unit_ms: i64,
    absolute: bool,
    command: &str,
    positive: bool,
) -> Result<i64, String> {
    let n = integer(arg).ok_or_else(|| update::NOT_INTEGER.to_string())?;
    if positive && n <= 0 {
        return Err(invalid_expire(command));
    }
    let ms = n
        .checked_mul(unit_ms)
        .ok_or_else(|| invalid_expire(command))?;
    if absolute {
        return Ok(ms);
    }
    let now = i64::try_from(engine::clock::now_ms()).unwrap_or(i64::MAX);
    ms.checked_add(now).ok_or_else(|| invalid_expire(command))
}

fn expiry_from_now(arg: &[u8], unit_ms: i64, command: &str, positive: bool) -> Result<i64, String> {
    expiry_time(arg, unit_ms, false, command, positive)
}

/// The expiry option of SET / GETEX at `args[i]`: (its time, how many
/// arguments it took), or `None` if `args[i]` is not one.
fn expiry_option(args: &[Bytes], i: usize, command: &str) -> Option<Result<i64, String>> {
    let opt = String::from_utf8_lossy(&args[i]).to_ascii_uppercase();
    let (unit, absolute) = match opt.as_str() {
        "EX" => (1000, false),
        "PX" => (1, false),
        "EXAT" => (1000, true),
        "PXAT" => (1, true),
        _ => return None,
    };
    Some(match args.get(i + 1) {
        None => Err(SYNTAX.to_string()),
        Some(a) => expiry_time(a, unit, absolute, command, true),
    })
}

fn plan_set(args: &[Bytes], v: Version) -> Planned {
    let mut flags = 0;
    let mut keep_ttl = false;
    let mut at: Option<i64> = None;
    let mut i = 3;
    while i < args.len() {
        if let Some(found) = expiry_option(args, i, "set") {
            if at.is_some() || keep_ttl {
                return error(v, SYNTAX);
            }
            match found {
                Ok(t) => at = Some(t),
                Err(e) => return error(v, &e),
            }
            i += 2;
            continue;
        }
        let opt = String::from_utf8_lossy(&args[i]).to_ascii_uppercase();
        match opt.as_str() {
            "NX" if flags & update::SET_XX == 0 => flags |= update::SET_NX,
            "XX" if flags & update::SET_NX == 0 => flags |= update::SET_XX,
            "GET" => flags |= update::SET_GET,
            "KEEPTTL" if at.is_none() => keep_ttl = true,
            _ => return error(v, SYNTAX),
        }
        i += 1;
    }
    let key = args[1].clone();
    let value = args[2].clone();
    if keep_ttl || at.is_some() {
        let mut byte = flags as u8;
        if keep_ttl {
            byte |= update::SET_KEEPTTL;
        }
        return ttl_set(&key, byte, &value, at.unwrap_or(0));
    }
    if flags == 0 {
        return engine(vec![Op::Put { key, value }], Finish::Ok);
    }
    engine(update_op(&key, update::set, value, flags), Finish::Update)
}

/// GETEX key [EX s | PX ms | EXAT s | PXAT ms | PERSIST].
fn plan_getex(args: &[Bytes], v: Version) -> Planned {
    let key = args[1].clone();
    let (flag, at) = match args.len() {
        2 => (0, 0),
        3 if args[2].eq_ignore_ascii_case(b"persist") => (update::GETEX_PERSIST, 0),
        4 => match expiry_option(args, 2, "getex") {
            Some(Ok(t)) => (update::GETEX_SET, t),
            Some(Err(e)) => return error(v, &e),
            None => return error(v, SYNTAX),
        },
        _ => return error(v, SYNTAX),
    };
    engine(
        ttl_op(&key, update::get_ex, Bytes::copy_from_slice(&[flag]), at),
        Finish::Update,
    )
}

/// EXPIRE / PEXPIRE / EXPIREAT / PEXPIREAT key time [NX | XX | GT | LT].
fn plan_expire(args: &[Bytes], name: &str, v: Version) -> Planned {
    let mut flags = 0u8;
    for opt in &args[3..] {
        let opt = String::from_utf8_lossy(opt).to_ascii_uppercase();
        flags |= match opt.as_str() {
            "NX" => update::EXPIRE_NX,
            "XX" => update::EXPIRE_XX,
            "GT" => update::EXPIRE_GT,
            "LT" => update::EXPIRE_LT,
            _ => return error(v, &format!("ERR Unsupported option {opt}")),
        };
    }
    if flags & update::EXPIRE_NX != 0 && flags & !update::EXPIRE_NX != 0 {
        return error(
            v,
            "ERR NX and XX, GT or LT options at the same time are not compatible",
        );
    }
    if flags & update::EXPIRE_GT != 0 && flags & update::EXPIRE_LT != 0 {
        return error(
            v,
            "ERR GT and LT options at the same time are not compatible",
        );
    }
    let (unit, absolute) = match name {
        "expire" => (1000, false),
        "pexpire" => (1, false),
        "expireat" => (1000, true),
        _ => (1, true),
    };
    match expiry_time(&args[2], unit, absolute, name, false) {
        Ok(at) => engine(
            ttl_op(
                &args[1],
                update::expire,
                Bytes::copy_from_slice(&[flags]),
                at,
            ),
            Finish::Update,
        ),
        Err(e) => error(v, &e),
    }
}

const NO_PASSWORD: &str = "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?";
const WRONG_PASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// The reply before AUTH when a password is configured (Redis's text).
pub const NOAUTH: &str = "NOAUTH Authentication required.";
/// HELLO without AUTH from a client that has not authenticated.
const HELLO_NOAUTH: &str = "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time";

/// How an [`Planned::Auth`] ends.
pub const AUTH_NO_PASSWORD: &str = NO_PASSWORD;
pub const AUTH_WRONG_PASS: &str = WRONG_PASS;

/// AUTH [user] password: checked by the executor against the `default`
/// user's password (`server.requirepass` / `server.password_file`) or the
/// named user's (`[users.NAME]`).
fn plan_auth(args: &[Bytes], v: Version) -> Planned {
    match args.len() {
        2 => Planned::Auth {
            user: None,
            password: args[1].clone(),
            hello: None,
        },
        3 => Planned::Auth {
            user: Some(args[1].clone()),
            password: args[2].clone(),
            hello: None,
        },
        _ => error(v, SYNTAX),
    }
}

pub fn plan_hello(args: &[Bytes], client: &mut Client) -> Planned {
    let v = client.version;
    let mut version = client.version;
    let mut i = 1;
    if args.len() > 1 {
        match integer(&args[1]) {
            Some(2) => version = Version::Resp2,
            Some(3) => version = Version::Resp3,
            Some(_) => return error(v, "NOPROTO unsupported protocol version"),
            None => return error(v, "ERR Protocol version is not an integer or out of range"),
        }
        i = 2;
    }
    let mut name = None;
    let mut auth = None;
    while i < args.len() {
        let opt = String::from_utf8_lossy(&args[i]).to_ascii_uppercase();
        let left = args.len() - i - 1;
        match opt.as_str() {
            "AUTH" if left >= 2 => {
                auth = Some((args[i + 1].clone(), args[i + 2].clone()));
                i += 3;
            }
            "SETNAME" if left >= 1 => {
                if !valid_name(&args[i + 1]) {
                    return error(v, BAD_NAME);
                }
                name = Some(args[i + 1].clone());
                i += 2;
            }
            _ => {
                return error(
                    v,
                    &format!(
                        "ERR Syntax error in HELLO option '{}'",
                        String::from_utf8_lossy(&args[i])
                    ),
                )
            }
        }
    }
    if let Some((user, password)) = auth {
        // The executor checks the password, then runs this HELLO again
        // without its AUTH option.
        let mut rest = vec![args[0].clone()];
        if args.len() > 1 {
            rest.push(args[1].clone());
        }
        if let Some(name) = name {
            rest.push(Bytes::from_static(b"SETNAME"));
            rest.push(name);
        }
        return Planned::Auth {
            user: Some(user),
            password,
            hello: Some(rest),
        };
    }
    if !client.authenticated {
        return error(v, HELLO_NOAUTH);
    }
    if let Some(name) = name {
        client.name = (!name.is_empty()).then_some(name);
    }
    client.version = version;
    let id = client.id;
    ready(version, |w| {
        w.map(7);
        w.bulk(b"server");
        w.bulk(b"redis");
        w.bulk(b"version");
        w.bulk(REDIS_VERSION.as_bytes());
        w.bulk(b"proto");
        w.int(version.number());
        w.bulk(b"id");
        w.int(id);
        w.bulk(b"mode");
        w.bulk(b"standalone");
        w.bulk(b"role");
        w.bulk(b"master");
        w.bulk(b"modules");
        w.array(0);
    })
}

const BAD_NAME: &str = "ERR Client names cannot contain spaces, newlines or special characters.";

/// Redis accepts names of printable characters without spaces.
fn valid_name(name: &[u8]) -> bool {
    name.iter().all(|&c| (b'!'..=b'~').contains(&c))
}

fn plan_client(args: &[Bytes], client: &mut Client) -> Planned {
    let v = client.version;
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
    let n = args.len();
    match sub.as_str() {
        "id" if n == 2 => ready(v, |w| w.int(client.id)),
        "getname" if n == 2 => match &client.name {
            Some(name) => {
                let name = name.clone();
                ready(v, |w| w.bulk(&name))
            }
            None => ready(v, |w| w.null()),
        },
        "setname" if n == 3 => {
            if !valid_name(&args[2]) {
                return error(v, BAD_NAME);
            }
            client.name = (!args[2].is_empty()).then(|| args[2].clone());
            ready(v, |w| w.ok())
        }
        "setinfo" if n == 4 => {
            let attr = String::from_utf8_lossy(&args[2]).to_ascii_lowercase();
            let value = args[3].clone();
            if !valid_name(&value) {
                return error(
                    v,
                    &format!("ERR {attr} cannot contain spaces, newlines or special characters."),
                );
            }
            match attr.as_str() {
                "lib-name" => client.lib_name = Some(value),
                "lib-ver" => client.lib_ver = Some(value),
                _ => {
                    return error(
                        v,
                        &format!(
                            "ERR Unrecognized option '{}'",
                            String::from_utf8_lossy(&args[2])
                        ),
                    )
                }
            }
            ready(v, |w| w.ok())
        }
        "id" | "getname" | "setname" | "setinfo" => {
            error(v, &wrong_arity(&format!("client|{sub}")))
        }
        _ => error(v, &unknown_subcommand(&args[1], "client")),
    }
}

/// The Redis error text for an engine refusal.
pub fn op_error_text(e: &OpError) -> String {
    match e {
        OpError::EmptyKey => "ERR empty keys are not supported by ringkv".to_string(),
        OpError::KeyTooLarge { len, max } => format!(
            "ERR key of {len} bytes is over ringkv's limit of {max} (limits.key_bytes_max)"
        ),
        OpError::ValueTooLarge { len, max } => format!(
            "ERR string exceeds maximum allowed size (value of {len} bytes, ringkv's limits.value_bytes_max = {max})"
        ),
        OpError::Poisoned { .. } => format!("MISCONF {e}"),
        OpError::Locked { .. } => format!("LOCKED {e}"),
        // Redis's own words: clients and scripts match them.
        OpError::OutOfMemory { .. } => {
            "OOM command not allowed when used memory > 'maxmemory'.".to_string()
        }
        other => format!("ERR {other}"),
    }
}

/// Writes the reply of a command from its engine results (in its op order).
pub fn finish(finish: Finish, results: &[OpResult], w: &mut ReplyWriter) {
    if let Some(e) = results.iter().find_map(|r| match r {
        OpResult::Err(e) => Some(e),
        _ => None,
    }) {
        w.error(&op_error_text(e));
        return;
    }
    let value = || match results.first() {
        Some(OpResult::Value(v)) => Some(v.clone()),
        _ => None,
    };
    match finish {
        Finish::Get => match value() {
            Some(v) => w.bulk(&v),
            None => w.null(),
        },
        Finish::Ok => w.ok(),
        Finish::Removed => w.int(results.iter().filter(|r| **r == OpResult::Ok).count() as i64),
        Finish::Found => w.int(
            results
                .iter()
                .filter(|r| matches!(r, OpResult::Value(_)))
                .count() as i64,
        ),
        Finish::Values => {
            w.array(results.len());
            for r in results {
                match r {
                    OpResult::Value(v) => w.bulk(v),
                    _ => w.null(),
                }
            }
        }
        Finish::Strlen => w.int(value().map_or(0, |v| v.len() as i64)),
        Finish::Range(start, end) => {
            let v = value().unwrap_or_default();
            let (s, e) = range(v.len(), start, end);
            w.bulk(&v[s..e]);
        }
        Finish::Type => w.simple(if value().is_some() { "string" } else { "none" }),
        Finish::Bit(offset) => {
            let v = value().unwrap_or_default();
            let bit = usize::try_from(offset / 8)
                .ok()
                .and_then(|byte| v.get(byte))
                .map_or(0, |b| (b >> (7 - offset % 8)) & 1);
            w.int(bit as i64)
        }
        Finish::Lcs(options) => {
            let a = value().unwrap_or_default();
            let b = match results.get(1) {
                Some(OpResult::Value(v)) => v.clone(),
                _ => Bytes::new(),
            };
            lcs_reply(&a, &b, options, w)
        }
        Finish::BitCount(range) => {
            let v = value().unwrap_or_default();
            w.int(bit_count(&v, range) as i64)
        }
        Finish::Update => match results.first() {
            Some(OpResult::Updated(answer)) => match answer {
                UpdateAnswer::Nil => w.null(),
                UpdateAnswer::Ok => w.ok(),
                UpdateAnswer::Int(n) => w.int(*n),
                UpdateAnswer::Value(v) => w.bulk(v),
                UpdateAnswer::Refused(text) => w.error(text),
            },
            other => w.error(&format!("ERR unexpected engine answer {other:?}")),
        },
    }
}

/// LCS's options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LcsOptions {
    len: bool,
    idx: bool,
    with_match_len: bool,
    min_match_len: u64,
}

/// Most cells of LCS's table (4 bytes each: 64 MiB): bounds the memory
/// and the time one LCS takes on its shard thread.
const LCS_CELLS_MAX: u64 = 16 << 20;

/// LCS key1 key2 [LEN] [IDX] [MINMATCHLEN len] [WITHMATCHLEN].
fn plan_lcs(args: &[Bytes]) -> Result<LcsOptions, &'static str> {
    let mut o = LcsOptions {
        len: false,
        idx: false,
        with_match_len: false,
        min_match_len: 0,
    };
    let mut i = 3;
    while i < args.len() {
        let opt = &args[i];
        if opt.eq_ignore_ascii_case(b"idx") {
            o.idx = true;
        } else if opt.eq_ignore_ascii_case(b"len") {
            o.len = true;
        } else if opt.eq_ignore_ascii_case(b"withmatchlen") {
            o.with_match_len = true;
        } else if opt.eq_ignore_ascii_case(b"minmatchlen") && i + 1 < args.len() {
            let n = integer(&args[i + 1]).ok_or(update::NOT_INTEGER)?;
            o.min_match_len = n.max(0) as u64;
            i += 1;
        } else {
            return Err(SYNTAX);
        }
        i += 1;
    }
    if o.len && o.idx {
        return Err("ERR If you want both the length and indexes, please just use IDX.");
    }
    Ok(o)
}

/// LCS's reply, Redis's algorithm (a table of prefix LCS lengths, then a
/// walk back from the end that collects the common string and the
/// matching ranges, last range first).
fn lcs_reply(a: &[u8], b: &[u8], o: LcsOptions, w: &mut ReplyWriter) {
    let (alen, blen) = (a.len(), b.len());
    if (alen as u64 + 1).saturating_mul(blen as u64 + 1) > LCS_CELLS_MAX {
        return w.error(&format!(
            "ERR ringkv computes LCS of strings whose (length + 1) products are at most {LCS_CELLS_MAX}"
        ));
    }
    let width = blen + 1;
    let mut table = vec![0u32; (alen + 1) * width];
    for i in 1..=alen {
        for j in 1..=blen {
            table[i * width + j] = if a[i - 1] == b[j - 1] {
                table[(i - 1) * width + j - 1] + 1
            } else {
                table[(i - 1) * width + j].max(table[i * width + j - 1])
            };
        }
    }
    let lcs_len = table[alen * width + blen] as usize;
    if o.len {
        return w.int(lcs_len as i64);
    }
    let mut common = vec![0u8; lcs_len];
    // (a start, a end, b start, b end) of each match, last first.
    let mut ranges: Vec<(usize, usize, usize, usize)> = Vec::new();
    let mut current: Option<(usize, usize, usize, usize)> = None;
    let (mut i, mut j, mut left) = (alen, blen, lcs_len);
    while i > 0 && j > 0 {
        let mut emit = false;
        if a[i - 1] == b[j - 1] {
            common[left - 1] = a[i - 1];
            current = match current {
                None => Some((i - 1, i - 1, j - 1, j - 1)),
                Some((a_start, a_end, b_start, b_end)) if a_start == i && b_start == j => {
                    Some((i - 1, a_end, j - 1, b_end))
                }
                Some(range) => {
                    // Not contiguous (cannot happen after a match step,
                    // kept from Redis's walk).
                    emit = true;
                    Some(range)
                }
            };
            if current.is_some_and(|(a_start, _, b_start, _)| a_start == 0 || b_start == 0) {
                emit = true;
            }
            left -= 1;
            i -= 1;
            j -= 1;
        } else {
            if table[(i - 1) * width + j] > table[i * width + j - 1] {
                i -= 1;
            } else {
                j -= 1;
            }
            emit = current.is_some();
        }
        if emit {
            if let Some(range) = current.take() {
                let match_len = (range.1 - range.0 + 1) as u64;
                if o.min_match_len == 0 || match_len >= o.min_match_len {
                    ranges.push(range);
                }
            }
        }
    }
    if !o.idx {
        return w.bulk(&common);
    }
    w.map(2);
    w.bulk(b"matches");
    w.array(ranges.len());
    for (a_start, a_end, b_start, b_end) in ranges {
        w.array(2 + usize::from(o.with_match_len));
        w.array(2);
        w.int(a_start as i64);
        w.int(a_end as i64);
        w.array(2);
        w.int(b_start as i64);
        w.int(b_end as i64);
        if o.with_match_len {
            w.int((a_end - a_start + 1) as i64);
        }
    }
    w.bulk(b"len");
    w.int(lcs_len as i64);
}

/// Redis's text for a bad SETBIT/GETBIT offset.
const BIT_OFFSET: &str = "ERR bit offset is not an integer or out of range";

/// A SETBIT/GETBIT offset: an integer in `0..2^32` (Redis's 512 MB
/// string limit in bits).
fn bit_offset(arg: &[u8]) -> Option<u64> {
    integer(arg)
        .and_then(|n| u64::try_from(n).ok())
        .filter(|&n| n < 1 << 32)
}

/// BITCOUNT of `value` over `range` (Redis's rules: negative indexes
/// count from the end, bounds are clamped, an empty range counts 0).
pub fn bit_count(value: &[u8], within: Option<(i64, i64, bool)>) -> u64 {
    let ones = |bytes: &[u8]| bytes.iter().map(|b| u64::from(b.count_ones())).sum::<u64>();
    match within {
        None => ones(value),
        Some((start, end, false)) => {
            let (s, e) = range(value.len(), start, end);
            ones(&value[s..e])
        }
        Some((start, end, true)) => {
            let (s, e) = range(value.len() * 8, start, end);
            (s..e)
                .filter(|&bit| (value[bit / 8] >> (7 - bit % 8)) & 1 == 1)
                .count() as u64
        }
    }
}

/// GETRANGE's byte range `[start, end)` of a value of `len` bytes.
pub fn range(len: usize, start: i64, end: i64) -> (usize, usize) {
    let len = len as i64;
    if start < 0 && end < 0 && start > end {
        return (0, 0);
    }
    let mut start = if start < 0 { len + start } else { start };
    let mut end = if end < 0 { len + end } else { end };
    start = start.max(0);
    end = end.max(0);
    if end >= len {
        end = len - 1;
    }
    if len == 0 || start > end {
        return (0, 0);
    }
    (start as usize, end as usize + 1)
}

// The glob matcher of CONFIG GET, KEYS and SCAN is shared with the native
// protocol's SCAN.
pub use crate::glob::{glob_match, glob_match_nocase};

#[cfg(test)]
mod tests {
    use super::*;
    use ringkv_protocol::resp::{decode_reply, Reply, ReplyLimits};

    const ENV: Env = Env {
        value_bytes_max: 1024,
        ops_max: 100,
        flush_enabled: true,
    };

    fn args(line: &str) -> Vec<Bytes> {
        line.split(' ')
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect()
    }

    fn reply_of(p: Planned) -> Reply {
        match p {
            Planned::Ready(b) => decode_reply(&mut BytesMut::from(&b[..]), &ReplyLimits::default())
                .unwrap()
                .unwrap(),
            other => panic!("not ready: {other:?}"),
        }
    }

    fn now(line: &str) -> Reply {
        reply_of(plan(&args(line), &mut Client::new(7), &ENV))
    }

    fn err(text: &str) -> Reply {
        Reply::Error(text.to_string())
    }

    #[test]
    fn bit_count_follows_redis_ranges() {
        // 0x01 0x03 0xff: bits set 1, 2, 8.
        let v = [0x01u8, 0x03, 0xff];
        assert_eq!(bit_count(&v, None), 11);
        assert_eq!(bit_count(&v, Some((0, -1, false))), 11);
        assert_eq!(bit_count(&v, Some((1, 1, false))), 2);
        assert_eq!(bit_count(&v, Some((-2, -1, false))), 10);
        assert_eq!(bit_count(&v, Some((2, 1, false))), 0);
        assert_eq!(bit_count(&v, Some((-1, -2, false))), 0);
        // Bits 7..=15: the last bit of byte 0 and all of byte 1.
        assert_eq!(bit_count(&v, Some((7, 15, true))), 3);
        assert_eq!(bit_count(&v, Some((-8, -1, true))), 8);
        assert_eq!(bit_count(&[], Some((0, -1, true))), 0);
        assert_eq!(bit_offset(b"4294967295"), Some(u32::MAX as u64));
        assert_eq!(bit_offset(b"4294967296"), None);
        assert_eq!(bit_offset(b"-1"), None);
    }

    #[test]
    fn redis_error_texts() {
        assert_eq!(
            now("foo a b"),
            err("ERR unknown command 'foo', with args beginning with: 'a' 'b' ")
        );
        assert_eq!(
            now("FOO"),
            err("ERR unknown command 'FOO', with args beginning with: ")
        );
        assert_eq!(
            now("GET"),
            err("ERR wrong number of arguments for 'get' command")
        );
        assert_eq!(
            now("ping x y z"),
            err("ERR wrong number of arguments for 'ping' command")
        );
        assert_eq!(
            now("mset a b c"),
            err("ERR wrong number of arguments for 'mset' command")
        );
        assert_eq!(now("set a b nx xx"), err(SYNTAX));
        assert_eq!(now("set a b foo"), err(SYNTAX));
        assert_eq!(now("incrby a x"), err(update::NOT_INTEGER));
        assert_eq!(
            now("decrby a -9223372036854775808"),
            err("ERR decrement would overflow")
        );
        assert_eq!(now("incrbyfloat a x"), err(update::NOT_FLOAT));
        assert_eq!(now("select 1"), err("ERR DB index is out of range"));
        assert_eq!(now("select x"), err(update::NOT_INTEGER));
        assert_eq!(now("setrange k -1 x"), err("ERR offset is out of range"));
        assert!(
            matches!(now("setrange k 1024 x"), Reply::Error(e) if e.starts_with("ERR string exceeds maximum allowed size"))
        );
        assert_eq!(now("auth a b c"), err(SYNTAX));
        assert_eq!(
            now("client kill x"),
            err("ERR unknown subcommand 'kill'. Try CLIENT HELP.")
        );
        assert_eq!(
            now("config set a b"),
            err("ERR unknown subcommand 'set'. Try CONFIG HELP.")
        );
        assert_eq!(now("hello 4"), err("NOPROTO unsupported protocol version"));
        assert_eq!(now("client setname a\tb"), err(BAD_NAME));
    }

    #[test]
    fn auth_is_checked_by_the_executor_and_required_first() {
        let mut c = Client::new(1);
        assert!(matches!(
            plan(&args("auth default pw"), &mut c, &ENV),
            Planned::Auth {
                user: Some(_),
                hello: None,
                ..
            }
        ));
        assert!(matches!(
            plan(&args("hello 3 auth default pw setname n"), &mut c, &ENV),
            Planned::Auth { hello: Some(h), .. } if h.len() == 4
        ));
        c.authenticated = false;
        assert_eq!(reply_of(plan(&args("get k"), &mut c, &ENV)), err(NOAUTH));
        assert_eq!(reply_of(plan(&args("ping"), &mut c, &ENV)), err(NOAUTH));
        assert!(
            matches!(reply_of(plan(&args("hello 3"), &mut c, &ENV)), Reply::Error(e) if e.starts_with("NOAUTH HELLO"))
        );
        assert!(matches!(plan(&args("quit"), &mut c, &ENV), Planned::Quit));
        assert!(
            matches!(reply_of(plan(&args("get"), &mut c, &ENV)), Reply::Error(e) if e.starts_with("ERR wrong number"))
        );
    }

    #[test]
    fn flush_can_be_disabled() {
        let env = Env {
            flush_enabled: false,
            ..ENV
        };
        let mut c = Client::new(1);
        assert!(matches!(
            reply_of(plan(&args("FLUSHALL"), &mut c, &env)),
            Reply::Error(e) if e.starts_with("ERR unknown command 'FLUSHALL'")
        ));
        assert!(matches!(
            plan(&args("flushdb"), &mut c, &ENV),
            Planned::Server(ServerCommand::Flush)
        ));
    }

    #[test]
    fn immediate_replies() {
        assert_eq!(now("PING"), Reply::Simple("PONG".into()));
        assert_eq!(now("ping hi"), Reply::Bulk(Bytes::from_static(b"hi")));
        assert_eq!(now("echo x"), Reply::Bulk(Bytes::from_static(b"x")));
        assert_eq!(now("select 0"), Reply::Simple("OK".into()));
        assert_eq!(now("command count"), Reply::Int(COMMANDS.len() as i64));
        assert!(matches!(now("time"), Reply::Array(a) if a.len() == 2));
    }

    #[test]
    fn hello_switches_the_version_and_client_remembers_its_name() {
        let mut c = Client::new(9);
        let r = reply_of(plan(&args("hello 3 setname me"), &mut c, &ENV));
        assert_eq!(c.version, Version::Resp3);
        let Reply::Map(pairs) = r else {
            panic!("{r:?}")
        };
        assert!(pairs.contains(&(Reply::Bulk(Bytes::from_static(b"proto")), Reply::Int(3))));
        assert!(pairs.contains(&(Reply::Bulk(Bytes::from_static(b"id")), Reply::Int(9))));
        assert_eq!(
            reply_of(plan(&args("client getname"), &mut c, &ENV)),
            Reply::Bulk(Bytes::from_static(b"me"))
        );
        let r = reply_of(plan(&args("hello 2"), &mut c, &ENV));
        assert!(matches!(r, Reply::Array(a) if a.len() == 14));
        assert_eq!(
            reply_of(plan(&args("client setname"), &mut c, &ENV)),
            err("ERR wrong number of arguments for 'client|setname' command")
        );
        reply_of(plan(&args("client setname x"), &mut c, &ENV));
        assert_eq!(c.name, Some(Bytes::from_static(b"x")));
        assert_eq!(
            reply_of(plan(&args("client id"), &mut c, &ENV)),
            Reply::Int(9)
        );
    }

    #[test]
    fn read_modify_writes_are_single_updates() {
        for line in [
            "incr k",
            "decrby k 3",
            "setnx k v",
            "getset k v",
            "getdel k",
            "append k v",
            "setrange k 2 v",
            "incrbyfloat k 1.5",
            "set k v nx",
            "set k v xx get",
        ] {
            match plan(&args(line), &mut Client::new(1), &ENV) {
                Planned::Engine { ops, finish } => {
                    assert_eq!(ops.len(), 1, "{line}");
                    assert!(matches!(ops[0], Op::Update { .. }), "{line}");
                    assert_eq!(finish, Finish::Update, "{line}");
                }
                other => panic!("{line}: {other:?}"),
            }
        }
        assert!(matches!(
            plan(&args("set k v"), &mut Client::new(1), &ENV),
            Planned::Engine { ref ops, finish: Finish::Ok } if matches!(ops[0], Op::Put { .. })
        ));
    }

    fn finished(f: Finish, results: &[OpResult], version: Version) -> Reply {
        let mut out = BytesMut::new();
        finish(f, results, &mut ReplyWriter::new(&mut out, version));
        decode_reply(&mut out, &ReplyLimits::default())
            .unwrap()
            .unwrap()
    }

    #[test]
    fn lcs_follows_redis() {
        let v = |s: &'static str| OpResult::Value(Bytes::from_static(s.as_bytes()));
        let keys = [v("ohmytext"), v("mynewtext")];
        let lcs = |line: &str, version| {
            let args: Vec<Bytes> = line
                .split(' ')
                .map(|a| Bytes::copy_from_slice(a.as_bytes()))
                .collect();
            match plan_lcs(&args) {
                Ok(o) => finished(Finish::Lcs(o), &keys, version),
                Err(e) => Reply::Error(e.to_string()),
            }
        };
        let r2 = Version::Resp2;
        let int = Reply::Int;
        let pair = |a, b| Reply::Array(vec![int(a), int(b)]);
        let bulk = |s: &str| Reply::Bulk(Bytes::copy_from_slice(s.as_bytes()));
        assert_eq!(lcs("lcs a b", r2), bulk("mytext"));
        assert_eq!(lcs("lcs a b LEN", r2), int(6));
        assert_eq!(
            lcs("lcs a b IDX", r2),
            Reply::Array(vec![
                bulk("matches"),
                Reply::Array(vec![
                    Reply::Array(vec![pair(4, 7), pair(5, 8)]),
                    Reply::Array(vec![pair(2, 3), pair(0, 1)]),
                ]),
                bulk("len"),
                int(6),
            ])
        );
        assert_eq!(
            lcs("lcs a b IDX MINMATCHLEN 4 WITHMATCHLEN", Version::Resp3),
            Reply::Map(vec![
                (
                    bulk("matches"),
                    Reply::Array(vec![Reply::Array(vec![pair(4, 7), pair(5, 8), int(4)])])
                ),
                (bulk("len"), int(6)),
            ])
        );
        assert!(
            matches!(lcs("lcs a b LEN IDX", r2), Reply::Error(e) if e.contains("just use IDX"))
        );
        assert_eq!(
            lcs("lcs a b MINMATCHLEN", r2),
            Reply::Error(SYNTAX.to_string())
        );
        assert_eq!(
            lcs("lcs a b MINMATCHLEN x", r2),
            Reply::Error(update::NOT_INTEGER.to_string())
        );
        // Missing keys are empty strings.
        assert_eq!(
            finished(
                Finish::Lcs(plan_lcs(&[]).unwrap()),
                &[OpResult::NotFound, v("x")],
                r2
            ),
            bulk("")
        );
    }

    #[test]
    fn replies_from_engine_results() {
        let v = |s: &'static str| OpResult::Value(Bytes::from_static(s.as_bytes()));
        let r2 = Version::Resp2;
        assert_eq!(
            finished(Finish::Get, &[OpResult::NotFound], r2),
            Reply::Null
        );
        assert_eq!(
            finished(Finish::Get, &[v("x")], r2),
            Reply::Bulk(Bytes::from_static(b"x"))
        );
        assert_eq!(
            finished(
                Finish::Removed,
                &[OpResult::Ok, OpResult::NotFound, OpResult::Ok],
                r2
            ),
            Reply::Int(2)
        );
        assert_eq!(
            finished(Finish::Found, &[v("a"), OpResult::NotFound], r2),
            Reply::Int(1)
        );
        assert_eq!(
            finished(
                Finish::Values,
                &[v("a"), OpResult::NotFound],
                Version::Resp3
            ),
            Reply::Array(vec![Reply::Bulk(Bytes::from_static(b"a")), Reply::Null])
        );
        assert_eq!(finished(Finish::Strlen, &[v("abc")], r2), Reply::Int(3));
        assert_eq!(
            finished(Finish::Range(1, -1), &[v("hello")], r2),
            Reply::Bulk(Bytes::from_static(b"ello"))
        );
        assert_eq!(
            finished(Finish::Type, &[v("a")], r2),
            Reply::Simple("string".into())
        );
        assert_eq!(
            finished(Finish::Type, &[OpResult::NotFound], r2),
            Reply::Simple("none".into())
        );
        assert_eq!(
            finished(
                Finish::Ok,
                &[OpResult::Ok, OpResult::Err(OpError::EmptyKey)],
                r2
            ),
            err("ERR empty keys are not supported by ringkv")
        );
        assert_eq!(
            finished(
                Finish::Update,
                &[OpResult::Updated(UpdateAnswer::Refused(update::OVERFLOW))],
                r2
            ),
            err(update::OVERFLOW)
        );
    }

    #[test]
    fn getrange_follows_redis() {
        assert_eq!(range(5, 0, -1), (0, 5));
        assert_eq!(range(5, -3, -1), (2, 5));
        assert_eq!(range(5, 3, 1), (0, 0));
        assert_eq!(range(5, -1, -3), (0, 0));
        assert_eq!(range(5, 0, 100), (0, 5));
        assert_eq!(range(0, 0, -1), (0, 0));
        assert_eq!(range(5, -100, 1), (0, 2));
    }
}
