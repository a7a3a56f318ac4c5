//! Chooses the I/O backend once per process — io_uring, or the fallback
//! (readiness polling + a blocking-I/O thread pool) where the kernel refuses
//! io_uring — and builds each shard's compio runtime on it.
//!
//! What must hold: the probe runs at most once per process and its answer is
//! cached; `auto` falling back says so in exactly one warning line; `uring`
//! never silently falls back (it is an error naming the setting); a runtime
//! built for a backend really runs on that backend's driver.

use compio::driver::{DriverType, ProactorBuilder};
use compio::runtime::{Runtime, RuntimeBuilder};
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use tunables::Backend;

/// The backend a process runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// compio's io_uring driver: file I/O is submitted to the kernel ring.
    Uring,
    /// compio's polling driver: file I/O runs as blocking syscalls on a
    /// thread pool (one hand-off per operation).
    Fallback,
}

impl BackendKind {
    /// The name used in the config file and in reports: "uring" or "fallback".
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Uring => "uring",
            BackendKind::Fallback => "fallback",
        }
    }

    fn driver_type(self) -> DriverType {
        match self {
            BackendKind::Uring => DriverType::IoUring,
            BackendKind::Fallback => DriverType::Poll,
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why the requested backend cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    #[error(
        "io.backend = \"uring\" is set but this system refuses io_uring: {reason}. Allow \
         io_uring (sysctl kernel.io_uring_disabled = 0; a container seccomp profile that \
         permits io_uring_setup, io_uring_enter and io_uring_register), or set io.backend = \
         \"auto\" to run on the fallback backend"
    )]
    UringRefused {
        /// What the probe saw, e.g. "io_uring_setup failed: Operation not permitted".
        reason: String,
    },
}

/// How long the probe may take before io_uring counts as unusable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Submission queue entries of the probe ring.
const PROBE_QUEUE_DEPTH: u32 = 8;

static URING_PROBE: OnceLock<Result<(), String>> = OnceLock::new();
static FALLBACK_WARNED: AtomicBool = AtomicBool::new(false);

/// Whether io_uring works in this process: `Ok(())`, or the reason it does
/// not. Probed on first call (on a helper thread, with a timeout), then cached.
pub fn uring_status() -> &'static Result<(), String> {
    URING_PROBE.get_or_init(probe_uring)
}

/// Picks the backend for `requested` (the `io.backend` setting).
/// `Auto` falls back when io_uring is refused, saying so once in the log;
/// `Uring` turns the refusal into an error; `Fallback` never probes.
pub fn choose_backend(requested: Backend) -> Result<BackendKind, BackendError> {
    match requested {
        // Never probe when the fallback is asked for.
        Backend::Fallback => Ok(BackendKind::Fallback),
        Backend::Uring | Backend::Auto => decide(requested, uring_status()),
    }
}

/// The decision table of [`choose_backend`], given the probe's answer.
fn decide(requested: Backend, uring: &Result<(), String>) -> Result<BackendKind, BackendError> {
    match (requested, uring) {
        (Backend::Fallback, _) => Ok(BackendKind::Fallback),
        (Backend::Uring | Backend::Auto, Ok(())) => Ok(BackendKind::Uring),
        (Backend::Uring, Err(reason)) => Err(BackendError::UringRefused {
            reason: reason.clone(),
        }),
        (Backend::Auto, Err(reason)) => {
            if !FALLBACK_WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "io_uring is not available ({reason}); running on the fallback I/O \
                     backend (readiness polling + a blocking-I/O thread pool): every disk \
                     operation costs a thread hand-off, so expect higher latency and CPU per \
                     operation and lower throughput at depth. Set io.backend = \"uring\" to \
                     make this fatal, or \"fallback\" to choose it explicitly"
                );
            }
            Ok(BackendKind::Fallback)
        }
    }
}

/// Builds a single-threaded compio runtime on `kind`'s driver with
/// `queue_depth` submission entries (io_uring) or events (polling); the
/// fallback's blocking thread pool is limited to `queue_depth` threads.
/// Fails rather than running on another driver than the one asked for.
///
/// On io_uring the ring is set up for a single-threaded owner (see
/// [`RingSetup`]): build the runtime on the thread that will run it.
pub fn build_runtime(kind: BackendKind, queue_depth: u32) -> io::Result<Runtime> {
    assert!(queue_depth > 0, "queue_depth must be positive");
    if kind == BackendKind::Uring {
        let wanted = RingSetup::from_env();
        let mut last_err = None;
        for &setup in wanted.fallbacks() {
            match build_runtime_with(kind, queue_depth, setup) {
                Ok(rt) => {
                    if setup != wanted {
                        note_weaker_setup(wanted, setup, last_err.as_ref());
                    }
                    return Ok(rt);
                }
                // Older kernels refuse the newer flags with EINVAL: try the
                // next, weaker setup.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last_err = Some(e),
                Err(e) => return Err(e),
            }
        }
        return Err(last_err.unwrap_or_else(|| io::Error::other("no io_uring setup to try")));
    }
    build_runtime_with(kind, queue_depth, RingSetup::Plain)
}

/// How a shard's io_uring is set up: who runs completion work and when.
///
/// - `Deferred` (`IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN`,
///   Linux 6.1+): completion work (a socket receive that became ready, a
///   finished write) waits until the owning thread asks for completions,
///   then runs in one batch. The thread is never interrupted for it, and
///   only the thread that built the ring may submit to it.
/// - `Cooperative` (`IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG`,
///   Linux 5.19+): the kernel does not interrupt the thread to run
///   completion work either, but runs it at the next system call.
/// - `Plain`: the kernel's default, where every ready completion signals
///   the thread (an inter-processor interrupt when it runs elsewhere) to
///   run its work at once.
///
/// The default is `Deferred`, falling back to the next setup where the
/// kernel refuses a flag; `RINGKV_URING_SETUP=plain|cooperative|deferred`
/// picks one (to compare them in a benchmark).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingSetup {
    Deferred,
    Cooperative,
    Plain,
}

impl RingSetup {
    /// The setup `RINGKV_URING_SETUP` asks for (read once per process).
    fn from_env() -> RingSetup {
        static CHOSEN: OnceLock<RingSetup> = OnceLock::new();
        *CHOSEN.get_or_init(|| match std::env::var("RINGKV_URING_SETUP").as_deref() {
            Ok("plain") => RingSetup::Plain,
            Ok("cooperative") => RingSetup::Cooperative,
            Ok("deferred") | Err(_) => RingSetup::Deferred,
            Ok(other) => {
                tracing::warn!(
                    "RINGKV_URING_SETUP={other:?} is not one of deferred, cooperative, plain; \
                     using deferred"
                );
                RingSetup::Deferred
            }
        })
    }

    /// This setup, then each weaker one.
    fn fallbacks(self) -> &'static [RingSetup] {
        match self {
            RingSetup::Deferred => &[
                RingSetup::Deferred,
                RingSetup::Cooperative,
                RingSetup::Plain,
            ],
            RingSetup::Cooperative => &[RingSetup::Cooperative, RingSetup::Plain],
            RingSetup::Plain => &[RingSetup::Plain],
        }
    }

    fn apply(self, proactor: &mut ProactorBuilder) {
        match self {
            RingSetup::Deferred => {
                proactor
                    .single_issuer(true)
                    .defer_taskrun(true)
                    .coop_taskrun(true)
                    .taskrun_flag(true);
            }
            RingSetup::Cooperative => {
                proactor.coop_taskrun(true).taskrun_flag(true);
            }
            RingSetup::Plain => {}
        }
    }
}

static WEAKER_SETUP_NOTED: AtomicBool = AtomicBool::new(false);

fn note_weaker_setup(wanted: RingSetup, got: RingSetup, why: Option<&io::Error>) {
    if !WEAKER_SETUP_NOTED.swap(true, Ordering::Relaxed) {
        let why = why.map(|e| e.to_string()).unwrap_or_default();
        tracing::info!(
            "this kernel refused the {wanted:?} io_uring setup ({why}); shards run with the \
             {got:?} setup"
        );
    }
}

fn build_runtime_with(
    kind: BackendKind,
    queue_depth: u32,
    setup: RingSetup,
) -> io::Result<Runtime> {
    let mut proactor = ProactorBuilder::new();
    proactor
        .capacity(queue_depth)
        .driver_type(kind.driver_type());
    if kind == BackendKind::Fallback {
        proactor.thread_pool_limit(queue_depth as usize);
    } else {
        setup.apply(&mut proactor);
    }
    let runtime = RuntimeBuilder::new()
        .with_proactor(proactor)
        .build()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "building a compio runtime on the {kind} backend (queue depth {queue_depth}) \
                     failed: {e}"
                ),
            )
        })?;
    let got = runtime.driver_type();
    if got != kind.driver_type() {
        return Err(io::Error::other(format!(
            "asked compio for the {kind} backend but got the {got:?} driver"
        )));
    }
    Ok(runtime)
}

/// `kernel.io_uring_disabled`: 0 allowed, 1 only for `io_uring_group`,
/// 2 disabled for everyone. `None` if the file is absent (older kernels).
fn io_uring_disabled_sysctl() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn probe_uring() -> Result<(), String> {
    let sysctl = io_uring_disabled_sysctl();
    let hint = match sysctl {
        Some(1) => {
            " (kernel.io_uring_disabled = 1: only members of kernel.io_uring_group may use it)"
        }
        Some(2) => " (kernel.io_uring_disabled = 2: disabled for all processes)",
        _ => "",
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("ringkv-uring-probe".to_string())
        .spawn(move || {
            // The receiver may have given up already; nothing to do then.
            let _ = tx.send(probe_uring_on_this_thread());
        });
    if let Err(e) = spawned {
        return Err(format!("could not start the probe thread: {e}"));
    }
    let result = match rx.recv_timeout(PROBE_TIMEOUT) {
        Ok(result) => result,
        Err(_) => Err(format!(
            "a test operation did not complete within {PROBE_TIMEOUT:?}"
        )),
    };
    result.map_err(|reason| format!("{reason}{hint}"))
}

/// Builds an io_uring runtime and pushes one real file operation through it
/// (some sandboxes allow creating a ring but refuse to enter it).
fn probe_uring_on_this_thread() -> Result<(), String> {
    let runtime = build_runtime(BackendKind::Uring, PROBE_QUEUE_DEPTH)
        .map_err(|e| format!("io_uring setup failed: {e}"))?;
    runtime.block_on(async {
        let file = compio::fs::File::open("/dev/null")
            .await
            .map_err(|e| format!("opening /dev/null through io_uring failed: {e}"))?;
        file.metadata()
            .await
            .map_err(|e| format!("statx through io_uring failed: {e}"))?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallback_is_chosen_without_probing() {
        assert_eq!(choose_backend(Backend::Fallback), Ok(BackendKind::Fallback));
    }

    #[test]
    fn auto_and_uring_agree_with_the_probe() {
        eprintln!("io_uring probe: {:?}", uring_status());
        match uring_status() {
            Ok(()) => {
                assert_eq!(choose_backend(Backend::Auto), Ok(BackendKind::Uring));
                assert_eq!(choose_backend(Backend::Uring), Ok(BackendKind::Uring));
            }
            Err(reason) => {
                assert_eq!(choose_backend(Backend::Auto), Ok(BackendKind::Fallback));
                let err = choose_backend(Backend::Uring).unwrap_err();
                let text = err.to_string();
                assert!(text.contains("io.backend = \"uring\""), "{text}");
                assert!(text.contains(reason.as_str()), "{text}");
            }
        }
    }

    #[test]
    fn decision_table() {
        let refused: Result<(), String> = Err("io_uring_setup: Operation not permitted".into());
        let works: Result<(), String> = Ok(());
        assert_eq!(decide(Backend::Auto, &works), Ok(BackendKind::Uring));
        assert_eq!(decide(Backend::Uring, &works), Ok(BackendKind::Uring));
        assert_eq!(decide(Backend::Fallback, &works), Ok(BackendKind::Fallback));
        assert_eq!(decide(Backend::Auto, &refused), Ok(BackendKind::Fallback));
        assert_eq!(
            decide(Backend::Fallback, &refused),
            Ok(BackendKind::Fallback)
        );
        let err = decide(Backend::Uring, &refused).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("io.backend = \"uring\""), "{text}");
        assert!(text.contains("Operation not permitted"), "{text}");
        assert!(text.contains("\"auto\""), "{text}");
    }

    #[test]
    fn each_ring_setup_falls_back_to_weaker_ones_only() {
        assert_eq!(
            RingSetup::Deferred.fallbacks(),
            &[
                RingSetup::Deferred,
                RingSetup::Cooperative,
                RingSetup::Plain
            ]
        );
        assert_eq!(
            RingSetup::Cooperative.fallbacks(),
            &[RingSetup::Cooperative, RingSetup::Plain]
        );
        assert_eq!(RingSetup::Plain.fallbacks(), &[RingSetup::Plain]);
    }

    /// Under every ring setup the kernel accepts, a shard-style runtime
    /// sees socket completions and wake-ups from other threads: with
    /// deferred task work nothing completes unless the runtime asks, so a
    /// runtime that never asked would hang here rather than pass.
    #[test]
    fn every_ring_setup_delivers_socket_completions_and_foreign_wakeups() {
        if uring_status().is_err() {
            eprintln!("io_uring unavailable: nothing to check");
            return;
        }
        for setup in [
            RingSetup::Deferred,
            RingSetup::Cooperative,
            RingSetup::Plain,
        ] {
            let rt = match build_runtime_with(BackendKind::Uring, 16, setup) {
                Ok(rt) => rt,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    eprintln!("{setup:?} refused by this kernel: {e}");
                    continue;
                }
                Err(e) => panic!("{setup:?}: {e}"),
            };
            let got = rt.block_on(async {
                use compio::io::{AsyncReadExt, AsyncWriteExt};
                let listener = compio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = listener.local_addr().unwrap();
                let (tx, rx) = futures::channel::oneshot::channel::<u32>();
                // A wake-up from another thread while the runtime is parked.
                let other = std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(20));
                    tx.send(7).unwrap();
                });
                let woken = rx.await.unwrap();
                other.join().unwrap();
                let client = compio::runtime::spawn(async move {
                    let mut s = compio::net::TcpStream::connect(addr).await.unwrap();
                    let compio::buf::BufResult(r, _) = s.write_all(b"ping").await;
                    r.unwrap();
                    let compio::buf::BufResult(r, buf) = s.read_exact(vec![0u8; 4]).await;
                    r.unwrap();
                    buf
                });
                let (mut server, _) = listener.accept().await.unwrap();
                let compio::buf::BufResult(r, buf) = server.read_exact(vec![0u8; 4]).await;
                r.unwrap();
                let compio::buf::BufResult(r, _) = server.write_all(buf).await;
                r.unwrap();
                (woken, client.await.unwrap())
            });
            assert_eq!(got, (7, b"ping".to_vec()), "{setup:?}");
        }
    }

    #[test]
    fn runtime_runs_on_the_requested_driver() {
        let rt = build_runtime(BackendKind::Fallback, 16).unwrap();
        assert_eq!(rt.driver_type(), DriverType::Poll);
        if uring_status().is_ok() {
            let rt = build_runtime(BackendKind::Uring, 16).unwrap();
            assert_eq!(rt.driver_type(), DriverType::IoUring);
        }
    }
}
