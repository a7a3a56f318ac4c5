//! SIGTERM / SIGINT (stop) and SIGHUP (reload the TLS files) handling for the daemon without async signal handlers:
//! the signals are blocked in every thread (the mask is set before any thread
//! starts and is inherited), and one dedicated thread takes them with
//! `sigwait`. So no code ever runs in signal context.
//!
//! Library users (loadgen's embedded server) do not call this; only `main`.

use std::io;

/// A termination signal the server reacts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Term,
    Int,
    /// Reload: read the TLS certificate files again.
    Hup,
}

impl Signal {
    pub fn name(self) -> &'static str {
        match self {
            Signal::Term => "SIGTERM",
            Signal::Int => "SIGINT",
            Signal::Hup => "SIGHUP",
        }
    }

    fn from_raw(n: libc::c_int) -> Option<Signal> {
        match n {
            libc::SIGTERM => Some(Signal::Term),
            libc::SIGINT => Some(Signal::Int),
            libc::SIGHUP => Some(Signal::Hup),
            _ => None,
        }
    }
}

fn termination_set() -> io::Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it fully before
    // sigaddset reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        if libc::sigemptyset(&mut set) != 0
            || libc::sigaddset(&mut set, libc::SIGTERM) != 0
            || libc::sigaddset(&mut set, libc::SIGINT) != 0
            || libc::sigaddset(&mut set, libc::SIGHUP) != 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(set)
    }
}

/// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread and every thread it starts
/// afterwards. Call first thing in `main`, before any thread exists.
pub fn block_termination_signals() -> io::Result<()> {
    let set = termination_set()?;
    // SAFETY: `set` is initialised; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Starts the thread that waits for SIGTERM/SIGINT and calls `on_signal` for
/// each one, in order. [`block_termination_signals`] must have run first, or
/// the default action (exit) wins the race.
pub fn spawn_signal_thread(
    mut on_signal: impl FnMut(Signal) + Send + 'static,
) -> io::Result<std::thread::JoinHandle<()>> {
    let set = termination_set()?;
    std::thread::Builder::new()
        .name("ringkv-signals".to_string())
        .spawn(move || loop {
            let mut raw: libc::c_int = 0;
            // SAFETY: `set` is an initialised sigset_t owned by this closure
            // and `raw` is a valid out pointer.
            let rc = unsafe { libc::sigwait(&set, &mut raw) };
            if rc != 0 {
                tracing::error!(error = %io::Error::from_raw_os_error(rc), "sigwait failed; signals are no longer handled");
                return;
            }
            if let Some(signal) = Signal::from_raw(raw) {
                on_signal(signal);
            }
        })
}
