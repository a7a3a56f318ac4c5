//! Who may run what: the roles a user can have, the category of every RESP
//! command and every native operation, and the one check both listeners
//! make before anything runs or is queued (`docs/security.md`, "Users and
//! roles").
//!
//! What must hold:
//! - this file is the only place that decides a permission: the RESP
//!   listener asks [`resp_category`] in `resp::command::check` (which plain
//!   commands, MULTI's queueing, EXEC and MSETNX all go through), the native
//!   listener asks [`native_category`] for every operation of a request
//!   before the request runs;
//! - a command or operation this file does not name is [`Category::Admin`]:
//!   a new command is refused to every non-admin user until it is
//!   classified here, never let through by default.

use std::sync::Arc;

use bytes::Bytes;
use ringkv_protocol::RequestOp;

/// What a user may do. Each role may do everything the one before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Connection commands and reads.
    ReadOnly,
    /// Also writes, deletes, expiry changes and transactions.
    ReadWrite,
    /// Also FLUSHALL / FLUSHDB, CONFIG and other administrative commands.
    Admin,
}

impl Role {
    /// The role of this name, as the config spells it (`tunables::ROLE_NAMES`).
    pub fn from_name(name: &str) -> Option<Role> {
        match name {
            "read-only" => Some(Role::ReadOnly),
            "read-write" => Some(Role::ReadWrite),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Role::ReadOnly => "read-only",
            Role::ReadWrite => "read-write",
            Role::Admin => "admin",
        }
    }

    /// Whether a user of this role may run a command of `category`.
    pub const fn allows(self, category: Category) -> bool {
        match category {
            Category::Connection | Category::Read => true,
            Category::Write => matches!(self, Role::ReadWrite | Role::Admin),
            Category::Admin => matches!(self, Role::Admin),
        }
    }
}

/// What a command does, for the permission check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// Talks about the connection only: PING, AUTH, HELLO, QUIT, ACL WHOAMI,
    /// and MULTI/EXEC/DISCARD/WATCH (whose queued commands are checked one
    /// by one).
    Connection,
    /// Reads keys or server state: GET, SCAN, TTL, INFO, STATS...
    Read,
    /// Changes keys: SET, DEL, INCR, EXPIRE, RENAME, native PUT and
    /// transactions...
    Write,
    /// Changes the server or every key at once: FLUSHALL, FLUSHDB, CONFIG.
    Admin,
}

/// An authenticated user: its name (for `ACL WHOAMI` and logs) and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: Arc<str>,
    pub role: Role,
}

impl Identity {
    pub fn new(user: &str, role: Role) -> Identity {
        Identity {
            user: Arc::from(user),
            role,
        }
    }
}

/// The category of the RESP command `name` (lower case) with its arguments
/// `args` (`args[0]` is the name). Unknown names are [`Category::Admin`].
pub fn resp_category(name: &str, args: &[Bytes]) -> Category {
    let sub = || {
        args.get(1)
            .map(|a| a.to_ascii_lowercase())
            .unwrap_or_default()
    };
    match name {
        "ping" | "echo" | "quit" | "select" | "auth" | "hello" | "client" | "command" | "time"
        | "multi" | "exec" | "discard" | "watch" | "unwatch" => Category::Connection,
        // ACL WHOAMI answers for the connection; every other ACL subcommand
        // would manage users.
        "acl" if sub() == b"whoami" => Category::Connection,
        "acl" => Category::Admin,
        "get" | "mget" | "exists" | "strlen" | "getrange" | "substr" | "getbit" | "bitcount"
        | "lcs" | "type" | "ttl" | "pttl" | "expiretime" | "pexpiretime" | "keys" | "scan"
        | "randomkey" | "dbsize" | "info" | "lastsave" => Category::Read,
        "set" | "setnx" | "setex" | "psetex" | "mset" | "msetnx" | "getset" | "getdel"
        | "getex" | "del" | "unlink" | "incr" | "decr" | "incrby" | "decrby" | "incrbyfloat"
        | "append" | "setrange" | "setbit" | "expire" | "pexpire" | "expireat" | "pexpireat"
        | "persist" | "rename" | "renamenx" | "copy" => Category::Write,
        // CONFIG GET shows the configuration, as in Redis (@admin).
        "flushall" | "flushdb" | "config" | "bgsave" => Category::Admin,
        _ => Category::Admin,
    }
}

/// The name Redis's NOPERM text gives a command: `set`, or `config|set` for
/// a command with subcommands.
pub fn resp_command_label(name: &str, args: &[Bytes]) -> String {
    match (name, args.get(1)) {
        ("config" | "acl" | "client", Some(sub)) => {
            format!(
                "{name}|{}",
                String::from_utf8_lossy(sub).to_ascii_lowercase()
            )
        }
        _ => name.to_string(),
    }
}

/// Redis's refusal of a command the user's role does not allow.
pub fn noperm_text(label: &str) -> String {
    format!("NOPERM this user has no permissions to run the '{label}' command")
}

/// The category of one native operation. Transaction operations are
/// writes (GET_FOR_UPDATE takes a write lock); a read-only user reads with
/// GET and SCAN.
pub fn native_category(op: &RequestOp) -> Category {
    match op {
        RequestOp::Ping => Category::Connection,
        RequestOp::Get { .. }
        | RequestOp::Ttl { .. }
        | RequestOp::Scan { .. }
        | RequestOp::Stats => Category::Read,
        RequestOp::Put { .. }
        | RequestOp::Delete { .. }
        | RequestOp::PutExpiring { .. }
        | RequestOp::Expire { .. }
        | RequestOp::Begin
        | RequestOp::GetForUpdate { .. }
        | RequestOp::Commit
        | RequestOp::Rollback => Category::Write,
        #[allow(unreachable_patterns)]
        _ => Category::Admin,
    }
}

/// The first operation of `ops` that `role` may not run, with its index.
pub fn first_refused(role: Role, ops: &[RequestOp]) -> Option<(usize, &RequestOp)> {
    ops.iter()
        .enumerate()
        .find(|(_, op)| !role.allows(native_category(op)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::command::COMMANDS;

    fn args(line: &str) -> Vec<Bytes> {
        line.split(' ')
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect()
    }

    #[test]
    fn roles_nest() {
        let all = [
            Category::Connection,
            Category::Read,
            Category::Write,
            Category::Admin,
        ];
        for role in [Role::ReadOnly, Role::ReadWrite, Role::Admin] {
            assert_eq!(Role::from_name(role.name()), Some(role));
            let allowed: Vec<_> = all.iter().filter(|c| role.allows(**c)).collect();
            assert_eq!(allowed.len(), role as usize + 2, "{role:?}");
        }
        for name in tunables::ROLE_NAMES {
            assert!(Role::from_name(name).is_some(), "{name}");
        }
        assert_eq!(Role::from_name("root"), None);
    }

    /// Every command the RESP listener answers is named in
    /// `resp_category` (the fallback is for names not yet classified).
    #[test]
    fn every_resp_command_is_classified() {
        let reads = [
            "get",
            "mget",
            "exists",
            "strlen",
            "getrange",
            "substr",
            "getbit",
            "bitcount",
            "lcs",
            "type",
            "ttl",
            "pttl",
            "expiretime",
            "pexpiretime",
            "keys",
            "scan",
            "randomkey",
            "dbsize",
            "info",
            "lastsave",
        ];
        let connection = [
            "ping", "echo", "quit", "select", "auth", "hello", "client", "command", "time",
            "multi", "exec", "discard", "watch", "unwatch",
        ];
        let admin = ["flushall", "flushdb", "config", "bgsave"];
        for name in COMMANDS {
            let category = resp_category(name, &args(name));
            let expected = if reads.contains(name) {
                Category::Read
            } else if connection.contains(name) {
                Category::Connection
            } else if admin.contains(name) || *name == "acl" {
                Category::Admin
            } else {
                Category::Write
            };
            assert_eq!(category, expected, "{name}");
        }
        assert_eq!(
            resp_category("acl", &args("acl WhoAmI")),
            Category::Connection
        );
        assert_eq!(resp_category("somenewcommand", &args("x")), Category::Admin);
    }

    #[test]
    fn noperm_text_follows_redis() {
        assert_eq!(
            noperm_text(&resp_command_label("set", &args("set k v"))),
            "NOPERM this user has no permissions to run the 'set' command"
        );
        assert_eq!(
            resp_command_label("config", &args("config SET x y")),
            "config|set"
        );
    }

    #[test]
    fn native_writes_and_transactions_need_read_write() {
        let k = || Bytes::from_static(b"k");
        let ops = vec![
            RequestOp::Get { key: k() },
            RequestOp::Ping,
            RequestOp::Stats,
            RequestOp::Ttl { key: k() },
            RequestOp::Put {
                key: k(),
                value: k(),
            },
        ];
        assert_eq!(first_refused(Role::ReadOnly, &ops).map(|(i, _)| i), Some(4));
        assert_eq!(first_refused(Role::ReadWrite, &ops), None);
        for op in [
            RequestOp::Delete { key: k() },
            RequestOp::Expire {
                key: k(),
                expires_at_ms: 0,
            },
            RequestOp::PutExpiring {
                key: k(),
                value: k(),
                expires_at_ms: 1,
            },
            RequestOp::Begin,
            RequestOp::GetForUpdate { key: k() },
            RequestOp::Commit,
            RequestOp::Rollback,
        ] {
            assert_eq!(native_category(&op), Category::Write, "{op:?}");
        }
        let backup = RequestOp::Backup {
            dest: Bytes::from_static(b"/backups/x"),
            rate_bytes_per_sec: 0,
        };
        assert_eq!(native_category(&backup), Category::Admin);
        assert!(first_refused(Role::ReadWrite, std::slice::from_ref(&backup)).is_some());
    }
}
