//! `ringkv-server`: parse flags, build the effective configuration, start the
//! server and stop it gracefully on SIGTERM/SIGINT. Everything else lives in
//! the library so loadgen can embed the same server.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::process::ExitCode;

use clap::Parser;
use ringkv_server::cli::Cli;
use ringkv_server::ops::sd_notify::notify_logged;
use ringkv_server::signals::{block_termination_signals, spawn_signal_thread, Signal};
use ringkv_server::sockets::raise_open_files_limit;

/// mimalloc instead of glibc's malloc: a value or an op is often allocated
/// on one shard thread and freed on the other (a cross-shard GET), and
/// glibc's free then takes the owning arena's lock. Under a RESP GET
/// pipeline (P=16) malloc, free and that lock's futex wake-ups were about a
/// third of the server's time; see docs/benchmarks.md.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Descriptors kept for WAL segments, snapshots, listeners and /metrics.
const FD_HEADROOM: u64 = 256;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { usage_exit_code() } else { 0 });
        }
    };

    if let Some(tool) = &cli.command {
        // The offline tools print their report on stdout; the engine's
        // own log lines (recovery's) stay at warnings unless RUST_LOG says.
        init_logging(
            tunables::LogFormat::Text,
            "warn,ringkv_engine::progress=info",
        );
        return ringkv_server::ops::verify::run(tool);
    }

    if let Some(path) = &cli.check_config {
        return check_config(path);
    }

    let config = match cli.effective_config() {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            eprintln!(
                "ringkv-server: {} configuration error(s); nothing was started",
                errors.len()
            );
            return ExitCode::from(2);
        }
    };
    if cli.print_config {
        print!("{}", config.redacted().to_toml_string());
        return ExitCode::SUCCESS;
    }

    init_logging(config.log.format, "info");
    // Before any thread exists, so every thread inherits the mask and only
    // the signal thread ever sees SIGTERM/SIGINT.
    if let Err(e) = block_termination_signals() {
        tracing::error!(error = %e, "cannot block SIGTERM/SIGINT");
        return ExitCode::FAILURE;
    }

    raise_fd_limit(config.server.max_connections);

    let server = match ringkv_server::start(config) {
        Ok(s) => s,
        Err(e) => {
            // Once: the log goes to stderr too. Printed plainly only when
            // RUST_LOG turned error lines off.
            if tracing::enabled!(tracing::Level::ERROR) {
                tracing::error!("cannot start: {e}");
            } else {
                eprintln!("ringkv-server: cannot start: {e}");
            }
            return ExitCode::FAILURE;
        }
    };

    // Recovery is done and every listener accepts connections: tell
    // systemd (Type=notify), if it started us.
    notify_logged("READY=1");

    let stop = server.stop_handle();
    let tls = server.tls_reloader();
    let signals = spawn_signal_thread(move |signal: Signal| on_signal(signal, &stop, tls.as_ref()));
    if let Err(e) = signals {
        tracing::error!(error = %e, "cannot start the signal thread; stopping");
        return exit_after(server.shutdown());
    }

    server.wait();
    // A stop that did not come from a signal (every shard ended) is a stop too.
    notify_logged("STOPPING=1");
    exit_after(server.shutdown())
}

/// The exit code of a command line clap refused. The offline tools keep 2
/// for "the server would refuse to start", so their usage errors exit with
/// their own usage code (3); the server's exit 2, as its configuration
/// errors do.
fn usage_exit_code() -> u8 {
    let tools = ["verify", "inspect", "repair"];
    let tool = std::env::args_os()
        .skip(1)
        .any(|a| a.to_str().is_some_and(|a| tools.contains(&a)));
    if tool {
        ringkv_server::ops::verify::EXIT_USAGE
    } else {
        2
    }
}

/// Every connection is a descriptor: lifts the soft open-files limit to
/// the hard one, and warns when that is below what the connections need.
fn raise_fd_limit(max_connections: u32) {
    let wanted = u64::from(max_connections) + FD_HEADROOM;
    match raise_open_files_limit(wanted) {
        Ok(limit) if limit < wanted => tracing::warn!(
            limit,
            max_connections,
            "the open-files limit is below server.max_connections plus headroom; \
             connections beyond it will fail to be accepted"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot read or raise the open-files limit"),
    }
}

/// What a signal does: SIGHUP reloads the TLS files; the first SIGTERM or
/// SIGINT starts a graceful stop, a second one exits at once.
fn on_signal(
    signal: Signal,
    stop: &ringkv_server::StopHandle,
    tls: Option<&std::sync::Arc<ringkv_server::tls::TlsConfig>>,
) {
    if signal == Signal::Hup {
        match tls {
            None => tracing::info!("SIGHUP: TLS is off; nothing to reload"),
            Some(tls) => match tls.reload() {
                Ok(()) => tracing::info!(
                    reloads = tls.reloads(),
                    "SIGHUP: TLS certificate files reloaded; new connections use them"
                ),
                Err(e) => tracing::error!(
                    error = %e,
                    "SIGHUP: TLS reload failed; the previous certificates stay in use"
                ),
            },
        }
        return;
    }
    if stop.is_stop_requested() {
        tracing::warn!(
            signal = signal.name(),
            "second termination signal: exiting now without finishing the graceful stop"
        );
        std::process::exit(1);
    }
    tracing::info!(
        signal = signal.name(),
        "termination signal received; stopping gracefully"
    );
    notify_logged("STOPPING=1");
    stop.request_stop();
}

fn exit_after(result: Result<(), ringkv_server::ServerError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A poisoned shard (a failed WAL write or fdatasync, e.g. a full
        // disk) refused every write after the failure and acknowledged
        // nothing it could not make durable; the stop itself completed.
        // That is a clean stop: exit 0, and say so (the poisoning itself
        // was logged as an error when it happened).
        Err(ringkv_server::ServerError::Shutdown(e))
            if matches!(e.root(), engine::EngineError::PoisonedAtShutdown { .. }) =>
        {
            tracing::warn!(error = %e, "stopped cleanly with a poisoned shard; a restart recovers from what is on disk");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ringkv-server: {e}");
            ExitCode::FAILURE
        }
    }
}

fn check_config(path: &std::path::Path) -> ExitCode {
    match tunables::Config::load(path) {
        Ok(_) => {
            println!("{}: configuration is valid", path.display());
            ExitCode::SUCCESS
        }
        Err(errors) => {
            // One line per problem, each naming its field.
            eprintln!("{errors}");
            eprintln!("{}: {} error(s)", path.display(), errors.len());
            ExitCode::FAILURE
        }
    }
}

/// Log lines go to stderr (the journal under systemd), as text or one JSON
/// object per line (`log.format`); `RUST_LOG` picks the levels, else
/// `default_level`.
fn init_logging(format: tunables::LogFormat, default_level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        tunables::LogFormat::Json => builder.json().with_current_span(false).init(),
        tunables::LogFormat::Text => {
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            builder.with_ansi(ansi).init()
        }
    }
}
