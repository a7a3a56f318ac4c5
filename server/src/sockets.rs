//! Creation of the per-shard listening sockets: one socket per shard, all on
//! the same address through SO_REUSEPORT, so the kernel spreads incoming
//! connections over the shard threads without any shared accept lock.
//!
//! What must hold: a second process can never silently join our port. The
//! first socket is therefore bound *without* SO_REUSEPORT (so the bind fails
//! with EADDRINUSE if anyone, reuseport or not, already holds the address) and
//! only gets the option after its bind succeeded, before `listen`; the other
//! shards' sockets then join it.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Listen backlog per socket (the kernel caps it at `net.core.somaxconn`).
pub const LISTEN_BACKLOG: libc::c_int = 1024;

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
    let first = new_socket(addr)?;
    set_flag(&first, libc::SO_REUSEADDR, addr, "set SO_REUSEADDR on")?;
    bind(&first, addr)?;
    if count > 1 {
        set_flag(&first, libc::SO_REUSEPORT, addr, "set SO_REUSEPORT on")?;
    }
    listen(&first, addr)?;
    let first = TcpListener::from(first);
    let bound = first.local_addr().map_err(|source| BindError::Socket {
        addr,
        step: "read the address of",
        source,
    })?;
    let mut listeners = Vec::with_capacity(count);
    listeners.push(first);
    for _ in 1..count {
        let socket = new_socket(bound)?;
        set_flag(&socket, libc::SO_REUSEADDR, bound, "set SO_REUSEADDR on")?;
        set_flag(&socket, libc::SO_REUSEPORT, bound, "set SO_REUSEPORT on")?;
        bind(&socket, bound)?;
        listen(&socket, bound)?;
        listeners.push(TcpListener::from(socket));
    }
    Ok(listeners)
}

fn new_socket(addr: SocketAddr) -> Result<OwnedFd, BindError> {
    let domain = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain syscall; the result is checked before it is used as a fd.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(BindError::Socket {
            addr,
            step: "create",
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: `fd` is a freshly created descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn set_flag(
    fd: &OwnedFd,
    option: libc::c_int,
    addr: SocketAddr,
    step: &'static str,
) -> Result<(), BindError> {
    let one: libc::c_int = 1;
    // SAFETY: `one` outlives the call and the length matches its type.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(BindError::Socket {
            addr,
            step,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

fn bind(fd: &OwnedFd, addr: SocketAddr) -> Result<(), BindError> {
    let rc = match addr {
        SocketAddr::V4(v4) => {
            let sa = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    // Network order in memory: the octets as written.
                    s_addr: u32::from_be_bytes(v4.ip().octets()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: `sa` is a valid sockaddr_in and the length is its size.
            unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&sa as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            }
        }
        SocketAddr::V6(v6) => {
            let sa = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: `sa` is a valid sockaddr_in6 and the length is its size.
            unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&sa as *const libc::sockaddr_in6).cast(),
                    std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                )
            }
        }
    };
    if rc != 0 {
        let source = io::Error::last_os_error();
        if source.raw_os_error() == Some(libc::EADDRINUSE) {
            return Err(BindError::AddrInUse { addr });
        }
        return Err(BindError::Socket {
            addr,
            step: "bind",
            source,
        });
    }
    Ok(())
}

fn listen(fd: &OwnedFd, addr: SocketAddr) -> Result<(), BindError> {
    // SAFETY: plain syscall on a descriptor we own.
    let rc = unsafe { libc::listen(fd.as_raw_fd(), LISTEN_BACKLOG) };
    if rc != 0 {
        return Err(BindError::Socket {
            addr,
            step: "listen on",
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Raises this process's soft RLIMIT_NOFILE towards `wanted` (never above
/// the hard limit, never lowering it). Returns the soft limit now in force.
pub fn raise_open_files_limit(wanted: u64) -> io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid out pointer for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let target = wanted.min(limit.rlim_max);
    if target <= limit.rlim_cur {
        return Ok(limit.rlim_cur);
    }
    let raised = libc::rlimit {
        rlim_cur: target,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: `raised` is a valid rlimit; raising the soft limit up to the
    // hard one needs no privilege.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(io::Error::last_os_error());
    }
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
