//! systemd's readiness protocol (`sd_notify(3)`), without libsystemd: one
//! datagram on the Unix socket named by `$NOTIFY_SOCKET`. The unit
//! (`packaging/ringkv.service`, `Type=notify`) counts the service started
//! when `READY=1` arrives, and stopping when `STOPPING=1` does.
//!
//! What must hold: `READY=1` is sent only after recovery finished and every
//! listener accepts connections; without `$NOTIFY_SOCKET` nothing is sent.
//! A failed send is logged and otherwise ignored (systemd then times the
//! start out, which says more than a server refusing to run would).

use std::io;
use std::os::unix::net::UnixDatagram;

/// The environment variable systemd sets for `Type=notify` services.
pub const NOTIFY_SOCKET_ENV: &str = "NOTIFY_SOCKET";

/// Sends `state` (e.g. `"READY=1"`) to `$NOTIFY_SOCKET`. `Ok(false)` when
/// the variable is not set (not started by systemd).
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(target) = std::env::var_os(NOTIFY_SOCKET_ENV) else {
        return Ok(false);
    };
    let target = target.into_encoded_bytes();
    let socket = UnixDatagram::unbound()?;
    match target.first() {
        // A name in the abstract namespace ("@name" stands for "\0name").
        Some(b'@') => send_abstract(&socket, &target[1..], state)?,
        Some(b'/') => {
            let path = std::path::PathBuf::from(std::ffi::OsString::from_vec(target));
            socket.send_to(state.as_bytes(), path)?;
        }
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "NOTIFY_SOCKET is neither an absolute path nor an abstract name (@...)",
            ))
        }
    }
    Ok(true)
}

use std::os::unix::ffi::OsStringExt;

fn send_abstract(socket: &UnixDatagram, name: &[u8], state: &str) -> io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    socket.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

/// [`notify`], logging the outcome instead of returning it.
pub fn notify_logged(state: &str) {
    match notify(state) {
        Ok(true) => tracing::debug!(state, "sent to systemd"),
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, state, "cannot notify systemd ($NOTIFY_SOCKET)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_reaches_the_socket_named_by_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let receiver = UnixDatagram::bind(&path).unwrap();
        receiver
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        // The only test in this binary that touches the variable.
        std::env::set_var(NOTIFY_SOCKET_ENV, &path);
        assert!(notify("READY=1").unwrap());
        std::env::remove_var(NOTIFY_SOCKET_ENV);
        let mut buf = [0u8; 64];
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        assert!(!notify("READY=1").unwrap());
    }
}
