//! Creation of the per-shard listening sockets: one socket per shard, all on
//! the same address through SO_REUSEPORT, so the kernel spreads incoming
//! connections over the shard threads without any shared accept lock.
//!
//! What must hold: a second process can never silently join our port. The
//! first socket is therefore bound *without* SO_REUSEPORT (so the bind fails
//! with EADDRINUSE if anyone, reuseport or not, already holds the address) and
//! only gets the option after its bind succeeded, before `listen`; the other
//! shards' sockets then join it.

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::{SocketAddr, TcpListener};

/// Listen backlog per socket (the kernel caps it at `net.core.somaxconn`).
pub const LISTEN_BACKLOG: i32 = 1024;

/// Bytes a connection makes room for before its next read, when the message
/// it is reading still wants `wanted_more` bytes and `buffered` are held:
/// at least one `chunk`, and never more than it already holds (or one
/// chunk). A declared length alone never reserves memory: a buffer grows by
/// at most doubling what actually arrived, so a client that announces a
/// 512 MiB value and sends nothing costs one chunk, and a value of V bytes
/// costs at most 2 V of buffer capacity while it arrives (docs/config.md,
/// "Memory per connection").
pub fn read_room(wanted_more: usize, buffered: usize, chunk: usize) -> usize {
    wanted_more.min(buffered.max(chunk)).max(chunk)
}

/// Why the listening sockets could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    #[error("{addr} is already in use (is another server running on it?)")]
    AddrInUse { addr: SocketAddr },
    #[error("cannot {step} the listening socket for {addr}: {source}")]
    Socket {
        addr: SocketAddr,
        step: &'static str,
        source: io::Error,
    },
}

/// Binds `count` (>= 1) listening sockets on `addr`. If `addr` has port 0,
/// the first socket gets an ephemeral port and the others bind that same port.
/// Returns blocking std listeners, close-on-exec.
pub fn bind_reuseport_group(addr: SocketAddr, count: usize) -> Result<Vec<TcpListener>, BindError> {
    assert!(count >= 1, "at least one listener is needed");
    let first_reuse = if count > 1 {
        ReusePort::AfterBind
    } else {
        ReusePort::No
    };
    let first = listening_socket(addr, first_reuse)?;
    let first = TcpListener::from(first);
    let bound = first.local_addr().map_err(|source| BindError::Socket {
        addr,
        step: "read the address of",
        source,
    })?;
    let mut listeners = Vec::with_capacity(count);
    listeners.push(first);
    for _ in 1..count {
        listeners.push(TcpListener::from(listening_socket(
            bound,
            ReusePort::BeforeBind,
        )?));
    }
    Ok(listeners)
}

/// How a socket of a group takes SO_REUSEPORT (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq)]
enum ReusePort {
    /// A group of one: never.
    No,
    /// The group's first socket: only after its bind succeeded, so the bind
    /// refuses an address someone else holds.
    AfterBind,
    /// The later sockets: before their bind, to join the first.
    BeforeBind,
}

/// A socket bound to `addr` and listening.
fn listening_socket(addr: SocketAddr, reuse_port: ReusePort) -> Result<Socket, BindError> {
    let fail =
        |step: &'static str| move |source: io::Error| BindError::Socket { addr, step, source };
    let set_reuse_port = |socket: &Socket| {
        socket
            .set_reuse_port(true)
            .map_err(fail("set SO_REUSEPORT on"))
    };
    let socket = new_socket(addr)?;
    socket
        .set_reuse_address(true)
        .map_err(fail("set SO_REUSEADDR on"))?;
    if reuse_port == ReusePort::BeforeBind {
        set_reuse_port(&socket)?;
    }
    bind(&socket, addr)?;
    if reuse_port == ReusePort::AfterBind {
        set_reuse_port(&socket)?;
    }
    socket.listen(LISTEN_BACKLOG).map_err(fail("listen on"))?;
    Ok(socket)
}

/// A blocking TCP socket for `addr`'s family (socket2 sets close-on-exec).
fn new_socket(addr: SocketAddr) -> Result<Socket, BindError> {
    Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(|source| {
        BindError::Socket {
            addr,
            step: "create",
            source,
        }
    })
}

fn bind(socket: &Socket, addr: SocketAddr) -> Result<(), BindError> {
    socket.bind(&SockAddr::from(addr)).map_err(|source| {
        if source.kind() == io::ErrorKind::AddrInUse {
            BindError::AddrInUse { addr }
        } else {
            BindError::Socket {
                addr,
                step: "bind",
                source,
            }
        }
    })
}

/// Raises this process's soft RLIMIT_NOFILE towards `wanted` (never above
/// the hard limit, never lowering it). Returns the soft limit now in force.
pub fn raise_open_files_limit(wanted: u64) -> io::Result<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    // `None` is "unlimited".
    let current = limit.current.unwrap_or(u64::MAX);
    let target = wanted.min(limit.maximum.unwrap_or(u64::MAX));
    if target <= current {
        return Ok(current);
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(target),
            maximum: limit.maximum,
        },
    )?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn group_shares_one_ephemeral_port_and_spreads_connections() {
        let listeners = bind_reuseport_group("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        let port = listeners[0].local_addr().unwrap().port();
        assert_ne!(port, 0);
        for l in &listeners {
            assert_eq!(l.local_addr().unwrap().port(), port);
            l.set_nonblocking(true).unwrap();
        }
        // 48 connections hashed over 3 sockets: every socket (including the
        // first, which got SO_REUSEPORT only after its bind) takes some.
        let connection_count = 48;
        let mut clients = Vec::new();
        for _ in 0..connection_count {
            let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            c.write_all(b"x").unwrap();
            clients.push(c);
        }
        let mut accepted = [0usize; 3];
        for _ in 0..500 {
            for (i, l) in listeners.iter().enumerate() {
                while let Ok((mut s, _)) = l.accept() {
                    s.set_nonblocking(false).unwrap();
                    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                        .unwrap();
                    let mut b = [0u8; 1];
                    s.read_exact(&mut b).unwrap();
                    assert_eq!(&b, b"x");
                    accepted[i] += 1;
                }
            }
            if accepted.iter().sum::<usize>() == connection_count {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(accepted.iter().sum::<usize>(), connection_count);
        assert!(
            accepted.iter().all(|&n| n > 0),
            "uneven spread: {accepted:?}"
        );
    }

    #[test]
    fn second_group_on_same_port_is_refused() {
        let listeners = bind_reuseport_group("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let addr = listeners[0].local_addr().unwrap();
        match bind_reuseport_group(addr, 2) {
            Err(BindError::AddrInUse { addr: a }) => assert_eq!(a, addr),
            other => panic!("expected AddrInUse, got {other:?}"),
        }
        match bind_reuseport_group(addr, 1) {
            Err(BindError::AddrInUse { .. }) => {}
            other => panic!("expected AddrInUse, got {other:?}"),
        }
    }

    #[test]
    fn open_files_limit_is_never_lowered() {
        let now = raise_open_files_limit(0).unwrap();
        assert!(now > 0);
        assert_eq!(raise_open_files_limit(1).unwrap(), now);
    }

    #[test]
    fn ipv6_loopback_binds_when_available() {
        // Some sandboxes have no IPv6; only check the address if bind works.
        if let Ok(listeners) = bind_reuseport_group("[::1]:0".parse().unwrap(), 2) {
            let a = listeners[0].local_addr().unwrap();
            assert!(a.is_ipv6());
            assert_eq!(listeners[1].local_addr().unwrap(), a);
        }
    }
}

#[cfg(test)]
mod read_room_tests {
    use super::read_room;

    #[test]
    fn a_declared_size_reserves_at_most_what_arrived() {
        let chunk = 64 * 1024;
        // A 512 MiB bulk announced, nothing of it received yet: one chunk.
        assert_eq!(read_room(512 << 20, 20, chunk), chunk);
        // Growing with what arrived: at most doubling.
        assert_eq!(read_room(512 << 20, 1 << 20, chunk), 1 << 20);
        // The last bytes: only what is still wanted (at least a chunk).
        assert_eq!(read_room(100, 1 << 20, chunk), chunk);
        assert_eq!(read_room(300 << 10, 1 << 20, chunk), 300 << 10);
    }
}
