//! `ringkv`: the command-line client. One command per invocation, or `-` to
//! read commands from stdin and answer each with exactly one line, in order,
//! while batching lines into frames and pipelining frames.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::ffi::OsString;
use std::future::Future;
use std::io::{self, BufRead, Write};
use std::os::unix::ffi::OsStringExt;
use std::process::ExitCode;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, Subcommand};
use ringkv_client::args::PASSWORD_ENV;
use ringkv_client::{Client, ClientError, ConnectArgs, KeyTtl, Limits, OpReply, RequestOp, Status};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Exit status: a GET or DEL found no such key.
const EXIT_NOT_FOUND: u8 = 1;
/// Exit status: the server answered an error (or a request broke its limits).
const EXIT_SERVER_ERROR: u8 = 3;
/// Exit status: the server could not be reached, or the connection failed.
const EXIT_CONNECTION: u8 = 4;
/// Exit status when stdout is a pipe whose reader has gone (`ringkv scan |
/// head -1`): 128 + SIGPIPE, what a shell reports for a tool that SIGPIPE
/// killed. Nothing is printed on stderr.
const EXIT_BROKEN_PIPE: u8 = 141;

/// Most operations the `-` mode puts in one frame.
const STDIN_OPS_PER_FRAME_MAX: usize = 1000;
/// Frames the `-` mode keeps in flight (also bounded by the server's depth).
const STDIN_FRAMES_IN_FLIGHT_MAX: usize = 8;
/// Lines read ahead of the batcher.
const STDIN_LINES_QUEUED_MAX: usize = 4096;
/// A partial batch is sent once no new line arrived for this long, so
/// interactive use answers at once.
const STDIN_IDLE_FLUSH: Duration = Duration::from_millis(2);

/// `ringkv --version`: the package version and the git commit it was built
/// from (`unknown` when built outside a git checkout; see build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("RINGKV_GIT_COMMIT"),
    ")"
);

#[derive(Parser, Debug)]
#[command(
    name = "ringkv",
    version = VERSION,
    about = "Command-line client for a ringkv server",
    after_help = "\
Exit status:
  0    success
  1    get/del/expire/ttl/persist: no such key
  2    usage error
  3    the server answered an error: it refused the handshake (no password, a
       wrong password, an unknown user), refused the request, or the request
       breaks the server's limits or needs a newer server; with `-`, some
       line was answered `ERR ...`
  4    the server cannot be reached or the connection failed (also: stdin
       cannot be read, or stdout cannot be written for another reason than a
       closed pipe)
  141  stdout was closed before everything was written (a broken pipe, as in
       `ringkv scan | head -1`): ringkv stops without a message, like a tool
       that SIGPIPE killed

With `-`, each stdin line is one command: `put KEY VALUE`, `get KEY`, `del KEY` or
`ping`. VALUE is the rest of the line after KEY. Each command gets one output line,
in order: `OK`, `PONG`, the value, `(nil)` or `ERR <message>`; blank lines are
skipped. Keys and values in this mode use backslash escapes (\\\\ \\n \\r \\t \\xHH)
on input and output, so every answer stays on one line.
A command the user has no permission for (a `put` by a read-only user) gets
`ERR NO_PERMISSION: ...` on its own line; the other lines are answered as usual.

A server with a password: put it in a file (--password-file FILE) or in the
RINGKV_PASSWORD environment variable. A server with TLS: --ca FILE (the CA that
signed its certificate), or --insecure for a self-signed test server."
)]
struct Cli {
    /// Server address (host:port).
    #[arg(long, short, default_value = "127.0.0.1:7379")]
    server: String,
    /// How long to wait for the connection, and for each answer: seconds
    /// (10, 0.5) or a whole number with a unit (250ms, 10s, 2m), as
    /// loadgen's duration flags and the config file's durations.
    #[arg(long, default_value = "10", value_parser = parse_duration, value_name = "DURATION")]
    timeout: Duration,
    #[command(flatten)]
    connect: ConnectArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Set KEY to VALUE; prints OK. With --ex or --px the key expires that
    /// long from now (by this machine's clock); without, it has no expiry.
    #[command(visible_alias = "set")]
    Put {
        #[arg(value_parser = clap::value_parser!(OsString))]
        key: OsString,
        #[arg(value_parser = clap::value_parser!(OsString))]
        value: OsString,
        /// Expire in SECS seconds (at least 1).
        #[arg(long, value_name = "SECS", conflicts_with = "px", value_parser = clap::value_parser!(u64).range(1..))]
        ex: Option<u64>,
        /// Expire in MS milliseconds (at least 1).
        #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
        px: Option<u64>,
    },
    /// Print the value of KEY; prints nothing and exits 1 if there is none.
    Get {
        #[arg(value_parser = clap::value_parser!(OsString))]
        key: OsString,
    },
    /// Remove KEY; prints OK, or nothing and exits 1 if there was none.
    Del {
        #[arg(value_parser = clap::value_parser!(OsString))]
        key: OsString,
    },
    /// Make KEY expire SECS seconds from now (0: at once, deleting it);
    /// prints OK, or nothing and exits 1 if there is no such key.
    Expire {
        #[arg(value_parser = clap::value_parser!(OsString))]
        key: OsString,
        secs: u64,
    },
    /// Print the seconds KEY has left (rounded), or `none` if it has no
    /// expiry; prints nothing and exits 1 if there is no such key.
    Ttl {
        #[arg(value_parser = clap::value_parser!(OsString))]
        key: OsString,
        /// Print milliseconds left instead of seconds.
        #[arg(long, conflicts_with = "at")]
        ms: bool,
        /// Print the expiry time instead: Unix time in milliseconds.
        #[arg(long)]
        at: bool,
    },
    /// Remove KEY's expiry; prints OK, or nothing and exits 1 if there is
    /// no such key.
    Persist {
        #[arg(value_parser = clap::value_parser!(OsString))]
        key: OsString,
    },
    /// Print every key, one per line, walking all shards with SCAN. A key
    /// present for the whole walk is printed at least once; keys come in no
    /// particular order.
    Scan {
        /// Only keys matching this glob (`*`, `?`, `[a-z]`, `\x`).
        #[arg(long = "match", value_name = "PATTERN", value_parser = clap::value_parser!(OsString))]
        pattern: Option<OsString>,
        /// Keys the server visits per step (a hint; 0: its default).
        #[arg(long, value_name = "N", default_value_t = 1000)]
        count: u32,
    },
    /// Round trip to the server; prints PONG.
    Ping,
    /// Print the server's counters, one `name value` per line.
    Stats,
    /// Print what the server said in the handshake: name, id, shards, limits.
    Info,
    /// Take an online backup: the server writes a consistent copy of every
    /// shard into DIR (on the server's machine; new or empty) while it keeps
    /// serving. Waits for the end (no --timeout) and prints what was
    /// written. Restore: start a server with `--data-dir DIR`.
    Backup {
        /// The directory to write, as the server's process sees it.
        #[arg(long = "to", value_name = "DIR")]
        to: String,
        /// Most MiB per second the server copies (0: no limit); hard-linked
        /// files cost nothing.
        #[arg(long, value_name = "MIB", default_value_t = 0)]
        rate_mib: u64,
    },
    /// Read commands from stdin, one per line (see below).
    #[command(name = "-")]
    Stdin,
    /// Run a script as one transaction, in one frame: BEGIN, the script's
    /// lines, COMMIT (or ROLLBACK if its last line says `rollback`). Lines:
    /// `get KEY`, `getu KEY` (get for update: lock and read), `put KEY VALUE`,
    /// `del KEY`, `rollback`; `#` starts a comment. Prints one line per op
    /// (its value, OK, NOT_FOUND or `ERROR STATUS message`), then COMMITTED
    /// or ROLLED BACK. Exits 3 if the transaction did not commit.
    Tx {
        /// The script file; `-` reads stdin.
        script: std::path::PathBuf,
        /// Run the script again this many times when the server aborts it
        /// (DIE, LOCK_TIMEOUT, ABORTED).
        #[arg(long, default_value_t = 0)]
        retries: u32,
    },
}

/// A failure that ends the program with a message on stderr.
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    /// A failed write to stdout. A reader that went away (a broken pipe) is
    /// not an error to report: the program stops quietly.
    fn stdout(error: io::Error) -> Failure {
        if error.kind() == io::ErrorKind::BrokenPipe {
            return Failure {
                code: EXIT_BROKEN_PIPE,
                message: String::new(),
            };
        }
        Failure {
            code: EXIT_CONNECTION,
            message: format!("cannot write to stdout: {error}"),
        }
    }

    /// A failed connection to `server`, said in terms of this program's
    /// flags where the library's words would be the protocol's.
    fn connect(server: &str, error: ClientError, had_password: bool) -> Failure {
        let code = match error {
            ClientError::Refused { .. } => EXIT_SERVER_ERROR,
            _ => EXIT_CONNECTION,
        };
        let what = match &error {
            ClientError::TlsRequired { first_bytes, .. } => format!(
                "the server speaks TLS (it answered with a TLS record, first bytes \
                 {first_bytes:02x?}): connect with --ca FILE (the CA that signed its \
                 certificate), or --insecure for a self-signed test server"
            ),
            ClientError::Refused {
                status: Status::AuthRequired,
                ..
            } if !had_password => format!(
                "the server requires a password (AUTH_REQUIRED): give it with \
                 --password-file FILE or the {PASSWORD_ENV} environment variable \
                 (and --user NAME to log in as a user other than `default`)"
            ),
            _ => error.to_string(),
        };
        Failure {
            code,
            message: format!("cannot talk to {server}: {what}"),
        }
    }

    fn from_client(error: ClientError) -> Failure {
        let code = match &error {
            ClientError::Server { .. }
            | ClientError::Limit(_)
            | ClientError::Refused { .. }
            | ClientError::NeedsVersion { .. } => EXIT_SERVER_ERROR,
            _ => EXIT_CONNECTION,
        };
        Failure {
            code,
            message: error.to_string(),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("ringkv: cannot start the async runtime: {error}");
            return ExitCode::from(EXIT_CONNECTION);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            if failure.code != EXIT_BROKEN_PIPE {
                eprintln!("ringkv: {}", failure.message);
            }
            ExitCode::from(failure.code)
        }
    }
}

/// A duration flag: a number of seconds (`10`, `0.5`) or a whole number with
/// a unit (`ns`, `us`, `ms`, `s`, `m`/`min`, `h`); more than zero.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let bad = || {
        format!(
            "{text:?} is not a duration: give seconds (10, 0.5) or a whole number with a unit (250ms, 10s, 2m)"
        )
    };
    let d = if unit.is_empty() {
        let secs: f64 = number.parse().map_err(|_| bad())?;
        Duration::try_from_secs_f64(secs).map_err(|_| bad())?
    } else {
        let n: u64 = number.parse().map_err(|_| bad())?;
        let per = match unit {
            "ns" => Duration::from_nanos(1),
            "us" => Duration::from_micros(1),
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" | "min" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            _ => return Err(bad()),
        };
        per.checked_mul(u32::try_from(n).map_err(|_| bad())?)
            .ok_or_else(bad)?
    };
    if d.is_zero() {
        return Err(format!("{text:?}: the timeout must be more than zero"));
    }
    Ok(d)
}

async fn run(cli: Cli) -> Result<u8, Failure> {
    let timeout = cli.timeout;
    let options = cli
        .connect
        .options(timeout)
        .map_err(|message| Failure { code: 2, message })?;
    let client = Client::connect_with(cli.server.as_str(), &options)
        .await
        .map_err(|error| Failure::connect(&cli.server, error, options.password.is_some()))?;
    let mut out = io::stdout().lock();
    let printed = match cli.command {
        Command::Put { key, value, ex, px } => {
            let (key, value) = (key.into_vec(), value.into_vec());
            let ttl = match (ex, px) {
                (Some(secs), _) => Some(Duration::from_secs(secs)),
                (None, Some(ms)) => Some(Duration::from_millis(ms)),
                (None, None) => None,
            };
            match ttl {
                Some(ttl) => within(timeout, client.put_expiring_in(key, value, ttl)).await?,
                None => within(timeout, client.put(key, value)).await?,
            }
            writeln!(out, "OK")
        }
        Command::Expire { key, secs } => {
            let ttl = Duration::from_secs(secs);
            if !within(timeout, client.expire_in(key.into_vec(), ttl)).await? {
                return Ok(EXIT_NOT_FOUND);
            }
            writeln!(out, "OK")
        }
        Command::Ttl { key, ms, at } => match within(timeout, client.ttl(key.into_vec())).await? {
            KeyTtl::NotFound => return Ok(EXIT_NOT_FOUND),
            KeyTtl::Persistent => writeln!(out, "none"),
            KeyTtl::Expires(expiry) if at => writeln!(out, "{}", expiry.at_ms),
            KeyTtl::Expires(expiry) if ms => writeln!(out, "{}", expiry.left_ms),
            KeyTtl::Expires(expiry) => {
                writeln!(out, "{}", expiry.left_ms.saturating_add(500) / 1000)
            }
        },
        Command::Persist { key } => {
            if !within(timeout, client.persist(key.into_vec())).await? {
                return Ok(EXIT_NOT_FOUND);
            }
            writeln!(out, "OK")
        }
        Command::Scan { pattern, count } => {
            let pattern = Bytes::from(pattern.map(OsString::into_vec).unwrap_or_default());
            let mut cursor = 0;
            loop {
                let page = within(timeout, client.scan(cursor, count, pattern.clone())).await?;
                for key in &page.keys {
                    out.write_all(key)
                        .and_then(|()| out.write_all(b"\n"))
                        .map_err(Failure::stdout)?;
                }
                if page.cursor == 0 {
                    break Ok(());
                }
                cursor = page.cursor;
            }
        }
        Command::Get { key } => match within(timeout, client.get(key.into_vec())).await? {
            Some(value) => out.write_all(&value).and_then(|()| out.write_all(b"\n")),
            None => return Ok(EXIT_NOT_FOUND),
        },
        Command::Del { key } => {
            if !within(timeout, client.delete(key.into_vec())).await? {
                return Ok(EXIT_NOT_FOUND);
            }
            writeln!(out, "OK")
        }
        Command::Ping => {
            within(timeout, client.ping()).await?;
            writeln!(out, "PONG")
        }
        Command::Stats => {
            let entries = within(timeout, client.stats()).await?;
            entries
                .iter()
                .try_for_each(|(name, value)| writeln!(out, "{name} {value}"))
        }
        Command::Info => print_info(&mut out, &client),
        Command::Backup { to, rate_mib } => {
            // The BACKUP request holds its connection until the backup is
            // done: a second one reads its progress meanwhile.
            let watcher = match Client::connect_with(cli.server.as_str(), &options).await {
                Ok(watch) => Some(tokio::spawn(report_backup_progress(watch))),
                Err(error) => {
                    eprintln!("ringkv: no progress lines (a second connection failed: {error})");
                    None
                }
            };
            let answer = client.backup(&to, rate_mib.saturating_mul(1 << 20)).await;
            if let Some(watcher) = watcher {
                watcher.abort();
            }
            let entries = answer.map_err(Failure::from_client)?;
            let get = |name: &str| {
                entries
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or("?", |(_, v)| v.as_str())
            };
            let bytes: f64 = get("backup.bytes").parse().unwrap_or(0.0);
            let secs: f64 = get("backup.seconds").parse().unwrap_or(0.0);
            writeln!(
                out,
                "backup {}: {} files ({} hard-linked), {:.1} MiB in {secs:.1} s ({:.1} MiB/s)",
                get("backup.dest"),
                get("backup.files"),
                get("backup.linked_files"),
                bytes / 1048576.0,
                bytes / 1048576.0 / secs.max(0.001),
            )
            .and_then(|()| {
                entries
                    .iter()
                    .filter(|(n, _)| n.starts_with("backup.shard."))
                    .try_for_each(|(name, value)| writeln!(out, "{name} {value}"))
            })
        }
        Command::Stdin => {
            drop(out);
            return run_stdin(Arc::new(client), timeout).await;
        }
        Command::Tx { script, retries } => {
            drop(out);
            return run_tx(&client, &script, retries, timeout).await;
        }
    };
    printed
        .and_then(|()| out.flush())
        .map_err(Failure::stdout)?;
    Ok(0)
}

/// Parses a transaction script: its ops, and whether it ends in rollback.
fn parse_tx_script(text: &str) -> Result<(Vec<RequestOp>, bool), String> {
    let mut ops = Vec::new();
    let mut rollback = false;
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if rollback {
            return Err(format!("line {}: nothing may follow `rollback`", n + 1));
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let key = |i: usize| Bytes::copy_from_slice(words[i].as_bytes());
        ops.push(
            match (words[0].to_ascii_lowercase().as_str(), words.len()) {
                ("get", 2) => RequestOp::Get { key: key(1) },
                ("getu", 2) => RequestOp::GetForUpdate { key: key(1) },
                ("put", 3) => RequestOp::Put {
                    key: key(1),
                    value: key(2),
                },
                ("del", 2) => RequestOp::Delete { key: key(1) },
                ("rollback", 1) => {
                    rollback = true;
                    continue;
                }
                _ => return Err(format!("line {}: cannot read {line:?}", n + 1)),
            },
        );
    }
    Ok((ops, rollback))
}

async fn run_tx(
    client: &Client,
    script: &std::path::Path,
    retries: u32,
    timeout: Duration,
) -> Result<u8, Failure> {
    let text = if script.as_os_str() == "-" {
        io::read_to_string(io::stdin())
    } else {
        std::fs::read_to_string(script)
    }
    .map_err(|e| Failure {
        code: 2,
        message: format!("cannot read {}: {e}", script.display()),
    })?;
    let (ops, rollback) = parse_tx_script(&text).map_err(|message| Failure { code: 2, message })?;
    let mut out = io::stdout().lock();
    let write_err = Failure::stdout;
    for attempt in 0..=retries {
        let mut frame = Vec::with_capacity(ops.len() + 2);
        frame.push(RequestOp::Begin);
        frame.extend(ops.iter().cloned());
        frame.push(if rollback {
            RequestOp::Rollback
        } else {
            RequestOp::Commit
        });
        let replies = within(timeout, client.batch(frame)).await?;
        let aborted = replies.iter().any(|r| r.status().is_txn_retry());
        if aborted && attempt < retries {
            continue;
        }
        for reply in &replies[1..replies.len() - 1] {
            match reply {
                OpReply::Value(v) => out.write_all(v).and_then(|()| out.write_all(b"\n")),
                OpReply::Ok => writeln!(out, "OK"),
                OpReply::NotFound => writeln!(out, "NOT_FOUND"),
                OpReply::Error { status, message } => writeln!(out, "ERROR {status} {message}"),
                OpReply::Stats(_) | OpReply::Expiry(_) | OpReply::Keys { .. } => {
                    writeln!(out, "ERROR unexpected answer {reply:?}")
                }
            }
            .map_err(write_err)?;
        }
        let (begin, end) = (&replies[0], &replies[replies.len() - 1]);
        let committed = !rollback
            && begin.status() == ringkv_client::Status::Ok
            && end.status() == ringkv_client::Status::Ok;
        match end {
            OpReply::Error { status, message } => writeln!(out, "ERROR {status} {message}"),
            _ if rollback => writeln!(out, "ROLLED BACK"),
            _ => writeln!(out, "COMMITTED"),
        }
        .map_err(write_err)?;
        return Ok(if committed || rollback {
            0
        } else {
            EXIT_SERVER_ERROR
        });
    }
    unreachable!("the last attempt returns")
}

/// Prints a progress line of the server's running backup to stderr every
/// second, from its STATS, until aborted.
async fn report_backup_progress(client: Client) {
    let mut last = None;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Ok(entries) = client.stats().await else {
            return;
        };
        let get = |name: &str| -> u64 {
            entries
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0)
        };
        let now = (
            get("engine.backup_files"),
            get("engine.backup_files_total"),
            get("engine.backup_bytes"),
        );
        if get("engine.backup_in_progress") == 1 && last != Some(now) {
            match now {
                (_, 0, _) => eprintln!("backup in progress: checkpointing every shard"),
                (files, total, bytes) => eprintln!(
                    "backup in progress: {files} of {total} files, {:.1} MiB",
                    bytes as f64 / 1048576.0
                ),
            }
            last = Some(now);
        }
    }
}

async fn within<T>(
    timeout: Duration,
    future: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(timeout, future).await {
        Ok(result) => result.map_err(Failure::from_client),
        Err(_) => Err(no_answer(timeout)),
    }
}

fn no_answer(timeout: Duration) -> Failure {
    Failure {
        code: EXIT_CONNECTION,
        message: format!("no answer from the server within {timeout:?}"),
    }
}

fn print_info(out: &mut impl Write, client: &Client) -> io::Result<()> {
    let server = client.server_info();
    let limits = client.limits();
    writeln!(out, "server_name {}", server.server_name)?;
    writeln!(out, "server_id {:#018x}", server.server_id)?;
    writeln!(out, "shard_count {}", server.shard_count)?;
    writeln!(out, "protocol_version {}", client.protocol_version())?;
    writeln!(out, "peer {}", client.peer_addr())?;
    writeln!(out, "frame_bytes_max {}", limits.frame_bytes_max)?;
    writeln!(out, "ops_per_frame_max {}", limits.ops_per_frame_max)?;
    writeln!(out, "key_bytes_max {}", limits.key_bytes_max)?;
    writeln!(out, "value_bytes_max {}", limits.value_bytes_max)?;
    writeln!(out, "pipeline_depth_max {}", limits.pipeline_depth_max)
}

/// One stdin command's slot in the output: answered by the server (as the
/// op at this position of its batch) or already decided locally.
enum Slot {
    /// `ping` marks a PING, whose OK prints as `PONG`.
    Op {
        ping: bool,
    },
    Local(String),
}

/// One frame's worth of stdin commands, in line order.
#[derive(Default)]
struct Batch {
    ops: Vec<RequestOp>,
    slots: Vec<Slot>,
    frame_bytes: usize,
}

/// A sent batch: its slots and the task awaiting its answer.
type InFlight = (Vec<Slot>, JoinHandle<Result<Vec<OpReply>, Failure>>);

async fn run_stdin(client: Arc<Client>, timeout: Duration) -> Result<u8, Failure> {
    let (line_tx, mut lines) = mpsc::channel::<io::Result<Vec<u8>>>(STDIN_LINES_QUEUED_MAX);
    // Stdin is read on its own thread: blocking reads must not stall the runtime.
    std::thread::spawn(move || {
        let mut stdin = io::stdin().lock();
        loop {
            let mut line = Vec::new();
            match stdin.read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => {
                    if line_tx.blocking_send(Ok(line)).is_err() {
                        break;
                    }
                }
                Err(error) => {
                    let _ = line_tx.blocking_send(Err(error));
                    break;
                }
            }
        }
    });
    let (sent_tx, sent) = mpsc::channel::<InFlight>(STDIN_FRAMES_IN_FLIGHT_MAX);
    let printer = tokio::spawn(print_answers(sent));

    let limits = *client.limits();
    let ops_max = STDIN_OPS_PER_FRAME_MAX.min(limits.ops_per_frame_max as usize);
    let mut batch = Batch::default();
    let mut read_error = None;
    loop {
        let next = if batch.slots.is_empty() {
            lines.recv().await
        } else {
            match tokio::time::timeout(STDIN_IDLE_FLUSH, lines.recv()).await {
                Ok(next) => next,
                Err(_) => {
                    if !send_batch(&client, &mut batch, &sent_tx, timeout).await {
                        break;
                    }
                    continue;
                }
            }
        };
        let line = match next {
            Some(Ok(line)) => line,
            Some(Err(error)) => {
                read_error = Some(error);
                break;
            }
            None => break,
        };
        let op = match parse_line(&line) {
            Ok(Some(op)) => op,
            Ok(None) => continue,
            Err(message) => {
                batch.slots.push(Slot::Local(format!("ERR {message}")));
                continue;
            }
        };
        if let Err(error) = limits.check_op(0, &op) {
            let message = error.to_string();
            let message = message.strip_prefix("op 0: ").unwrap_or(&message);
            batch
                .slots
                .push(Slot::Local(format!("ERR {}: {message}", error.status())));
            continue;
        }
        let full = batch.ops.len() >= ops_max
            || fits_frame(&limits, batch.frame_bytes + op.encoded_len()).is_err();
        if full && !send_batch(&client, &mut batch, &sent_tx, timeout).await {
            break;
        }
        if let Err(message) = fits_frame(&limits, op.encoded_len()) {
            batch.slots.push(Slot::Local(format!("ERR {message}")));
            continue;
        }
        batch.frame_bytes += op.encoded_len();
        batch.slots.push(Slot::Op {
            ping: op == RequestOp::Ping,
        });
        batch.ops.push(op);
    }
    if !batch.slots.is_empty() {
        send_batch(&client, &mut batch, &sent_tx, timeout).await;
    }
    drop(sent_tx);
    let outcome = match printer.await {
        Ok(outcome) => outcome,
        Err(error) => Err(Failure {
            code: EXIT_CONNECTION,
            message: format!("printer task failed: {error}"),
        }),
    };
    if let Some(error) = read_error {
        return Err(Failure {
            code: EXIT_CONNECTION,
            message: format!("cannot read stdin: {error}"),
        });
    }
    outcome
}

/// Whether a frame of `ops_bytes` operation bytes fits the server's limit.
fn fits_frame(limits: &Limits, ops_bytes: usize) -> Result<(), String> {
    let len = ringkv_client::protocol::FRAME_HEADER_BYTES + ops_bytes;
    if len > limits.frame_bytes_max as usize {
        return Err(format!(
            "FRAME_TOO_LARGE: this command needs a frame of {len} bytes, over the server's limit of {}",
            limits.frame_bytes_max
        ));
    }
    Ok(())
}

/// Sends the batch (if it holds ops) and queues it for printing. False once
/// the printer stopped (the connection failed).
async fn send_batch(
    client: &Arc<Client>,
    batch: &mut Batch,
    sent: &mpsc::Sender<InFlight>,
    timeout: Duration,
) -> bool {
    let Batch { ops, slots, .. } = std::mem::take(batch);
    let client = Arc::clone(client);
    let task = tokio::spawn(async move {
        // Cloning the ops copies no key or value bytes (they are `Bytes`).
        match tokio::time::timeout(timeout, client.batch(ops.clone())).await {
            Ok(Err(ClientError::Server { status, message }))
                if refused_for_permission(status, &message) =>
            {
                // The server refused the whole frame because one of its
                // operations is not allowed for this user, and applied
                // nothing of it. Each line gets its own answer: send each
                // operation again in a frame of its own.
                within(timeout, one_frame_each(&client, ops)).await
            }
            Ok(result) => result.map_err(Failure::from_client),
            Err(_) => Err(no_answer(timeout)),
        }
    });
    sent.send((slots, task)).await.is_ok()
}

/// Whether an ERROR frame refused a request because the user lacks a
/// permission (NO_PERMISSION; servers speaking a protocol version before
/// that status say BAD_REQUEST with a message starting `NOPERM`).
fn refused_for_permission(status: Status, message: &str) -> bool {
    status == Status::NoPermission
        || (status == Status::BadRequest && message.starts_with("NOPERM "))
}

/// Sends each of `ops` in a frame of its own and returns one reply per op,
/// in order: a frame refused as a whole becomes its op's error reply. The
/// frames leave in the order of `ops` and are pipelined.
async fn one_frame_each(client: &Client, ops: Vec<RequestOp>) -> Result<Vec<OpReply>, ClientError> {
    let mut sends: Vec<_> = ops
        .into_iter()
        .map(|op| Box::pin(client.batch(vec![op])))
        .collect();
    // Poll each send once, in order, before awaiting any: that queues its
    // frame, or, when the pipeline is full, its place in the queue for a
    // slot, which is first come, first served. A send the runtime makes
    // wait before it queued anything (tokio's per-task budget) makes every
    // later send of this pass wait too, and each is queued when awaited.
    // So the frames leave in line order, many of them at once.
    let mut done = Vec::with_capacity(sends.len());
    for send in &mut sends {
        done.push(
            std::future::poll_fn(|cx| match send.as_mut().poll(cx) {
                Poll::Ready(result) => Poll::Ready(Some(result)),
                Poll::Pending => Poll::Ready(None),
            })
            .await,
        );
    }
    let mut replies = Vec::with_capacity(sends.len());
    for (send, done) in sends.iter_mut().zip(done) {
        let result = match done {
            Some(result) => result,
            None => send.await,
        };
        replies.push(match result {
            Ok(mut one) => match one.pop() {
                Some(reply) => reply,
                None => unreachable!("Client::batch checks one reply per op"),
            },
            Err(ClientError::Server { status, message }) => OpReply::Error { status, message },
            Err(error) => return Err(error),
        });
    }
    Ok(replies)
}

/// Prints every batch's answers in order. Stops at the first batch that
/// failed as a whole for a connection reason (after answering its lines).
async fn print_answers(mut sent: mpsc::Receiver<InFlight>) -> Result<u8, Failure> {
    let mut out = io::BufWriter::new(io::stdout());
    let mut code = 0;
    let write_failed = Failure::stdout;
    while let Some((slots, task)) = sent.recv().await {
        let outcome = match task.await {
            Ok(outcome) => outcome,
            Err(error) => Err(Failure {
                code: EXIT_CONNECTION,
                message: format!("request task failed: {error}"),
            }),
        };
        let mut replies = match &outcome {
            Ok(replies) => replies.iter(),
            Err(_) => [].iter(),
        };
        for slot in &slots {
            let line = match (slot, &outcome) {
                (Slot::Local(line), _) => line.clone(),
                (Slot::Op { ping }, Ok(_)) => match replies.next() {
                    Some(OpReply::Ok) if *ping => "PONG".into(),
                    Some(reply) => answer_line(reply),
                    None => "ERR the server sent fewer answers than commands".into(),
                },
                (Slot::Op { .. }, Err(failure)) => format!("ERR {}", failure.message),
            };
            if line.starts_with("ERR ") {
                code = EXIT_SERVER_ERROR;
            }
            out.write_all(line.as_bytes())
                .and_then(|()| out.write_all(b"\n"))
                .map_err(write_failed)?;
        }
        out.flush().map_err(write_failed)?;
        if let Err(failure) = outcome {
            if failure.code == EXIT_CONNECTION {
                return Err(failure);
            }
        }
    }
    Ok(code)
}

fn answer_line(reply: &OpReply) -> String {
    match reply {
        OpReply::Ok => "OK".into(),
        OpReply::Value(value) => escape(value),
        OpReply::NotFound => "(nil)".into(),
        OpReply::Stats(entries) => entries
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join(" "),
        OpReply::Error { status, message } => format!("ERR {status}: {message}"),
        // The stdin mode sends neither TTL nor SCAN.
        OpReply::Expiry(_) | OpReply::Keys { .. } => format!("ERR unexpected answer {reply:?}"),
    }
}

/// Parses one stdin line. `Ok(None)` for a blank line.
fn parse_line(line: &[u8]) -> Result<Option<RequestOp>, String> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let (command, rest) = split_token(line);
    if command.is_empty() {
        return Ok(None);
    }
    let (key_token, rest) = split_token(rest);
    let command = String::from_utf8_lossy(command).to_ascii_lowercase();
    let key = || -> Result<Bytes, String> {
        if key_token.is_empty() {
            return Err(format!("{command} needs a KEY"));
        }
        unescape(key_token).map(Bytes::from)
    };
    let nothing_after = |what: &str| -> Result<(), String> {
        if rest.iter().all(u8::is_ascii_whitespace) {
            Ok(())
        } else {
            Err(format!(
                "{command} takes {what}; unexpected {:?}",
                String::from_utf8_lossy(rest)
            ))
        }
    };
    let op = match command.as_str() {
        "put" | "set" => {
            if rest.is_empty() {
                return Err("put needs KEY VALUE".into());
            }
            RequestOp::Put {
                key: key()?,
                value: Bytes::from(unescape(rest)?),
            }
        }
        "get" => {
            nothing_after("one KEY")?;
            RequestOp::Get { key: key()? }
        }
        "del" | "delete" => {
            nothing_after("one KEY")?;
            RequestOp::Delete { key: key()? }
        }
        "ping" => {
            if !key_token.is_empty() {
                return Err("ping takes no arguments".into());
            }
            RequestOp::Ping
        }
        other => {
            return Err(format!(
                "unknown command {other:?} (expected put, get, del or ping)"
            ))
        }
    };
    Ok(Some(op))
}

/// Splits off the first whitespace-separated token; the rest starts after the
/// whitespace that follows it.
fn split_token(line: &[u8]) -> (&[u8], &[u8]) {
    let start = line
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(line.len());
    let line = &line[start..];
    let end = line
        .iter()
        .position(u8::is_ascii_whitespace)
        .unwrap_or(line.len());
    let (token, rest) = line.split_at(end);
    let skip = rest
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(rest.len());
    (token, &rest[skip..])
}

/// Decodes `\\`, `\n`, `\r`, `\t` and `\xHH`.
fn unescape(text: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.iter().copied().enumerate();
    while let Some((at, byte)) = bytes.next() {
        if byte != b'\\' {
            out.push(byte);
            continue;
        }
        let decoded = match bytes.next().map(|(_, b)| b) {
            Some(b'\\') => b'\\',
            Some(b'n') => b'\n',
            Some(b'r') => b'\r',
            Some(b't') => b'\t',
            Some(b'x') => {
                let hex =
                    |digit: Option<(usize, u8)>| digit.and_then(|(_, d)| (d as char).to_digit(16));
                match (hex(bytes.next()), hex(bytes.next())) {
                    (Some(high), Some(low)) => (high * 16 + low) as u8,
                    _ => {
                        return Err(format!(
                            "bad \\x escape at byte {at}: expected two hex digits"
                        ))
                    }
                }
            }
            Some(other) => {
                return Err(format!(
                    "unknown escape \\{} at byte {at} (use \\\\ for a backslash)",
                    other.escape_ascii()
                ))
            }
            None => return Err("a trailing backslash escapes nothing (use \\\\)".into()),
        };
        out.push(decoded);
    }
    Ok(out)
}

/// Encodes a value for one output line: backslash, CR, LF, tab, other
/// control bytes and bytes that are not UTF-8 are escaped; text passes as is.
fn escape(value: &[u8]) -> String {
    let mut out = String::with_capacity(value.len());
    for chunk in value.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if c.is_control() => {
                    let mut utf8 = [0u8; 4];
                    for byte in c.encode_utf8(&mut utf8).bytes() {
                        out.push_str(&format!("\\x{byte:02x}"));
                    }
                }
                c => out.push(c),
            }
        }
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Bytes {
        Bytes::from(s.as_bytes().to_vec())
    }

    /// `--timeout` takes seconds or a unit, as loadgen and the config do.
    #[test]
    fn timeouts_take_seconds_or_a_unit() {
        for (text, want) in [
            ("10", Duration::from_secs(10)),
            ("0.5", Duration::from_millis(500)),
            ("10s", Duration::from_secs(10)),
            ("250ms", Duration::from_millis(250)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for bad in ["", "x", "10parsecs", "1.5s", "-1", "0", "0ms", "ms"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        let cli = Cli::try_parse_from(["ringkv", "--timeout", "10s", "ping"]).unwrap();
        assert_eq!(cli.timeout, Duration::from_secs(10));
        assert!(Cli::try_parse_from(["ringkv", "--timeout", "soon", "ping"]).is_err());
    }

    #[test]
    fn parses_commands_and_values_with_spaces() {
        assert_eq!(
            parse_line(b"put k hello world\r\n"),
            Ok(Some(RequestOp::Put {
                key: key("k"),
                value: key("hello world")
            }))
        );
        assert_eq!(
            parse_line(b"  GET   k \n"),
            Ok(Some(RequestOp::Get { key: key("k") }))
        );
        assert_eq!(
            parse_line(b"del k"),
            Ok(Some(RequestOp::Delete { key: key("k") }))
        );
        assert_eq!(parse_line(b"ping"), Ok(Some(RequestOp::Ping)));
        assert_eq!(parse_line(b"   \n"), Ok(None));
    }

    #[test]
    fn rejects_malformed_lines() {
        assert!(parse_line(b"put k").unwrap_err().contains("KEY VALUE"));
        assert!(parse_line(b"get").unwrap_err().contains("needs a KEY"));
        assert!(parse_line(b"get a b").unwrap_err().contains("one KEY"));
        assert!(parse_line(b"ping x").unwrap_err().contains("no arguments"));
        assert!(parse_line(b"frob k")
            .unwrap_err()
            .contains("unknown command"));
        assert!(parse_line(b"put k a\\qb")
            .unwrap_err()
            .contains("unknown escape \\q"));
    }

    #[test]
    fn escapes_round_trip_through_unescape() {
        let raw: Vec<u8> = (0..=255u8).chain("é\\ok".bytes()).collect();
        let line = escape(&raw);
        assert!(!line.contains('\n') && !line.contains('\r'));
        assert_eq!(unescape(line.as_bytes()), Ok(raw));
        assert_eq!(escape(b"plain text"), "plain text");
        assert_eq!(escape("héllo".as_bytes()), "héllo");
    }

    #[test]
    fn bad_hex_escapes_are_errors() {
        assert!(unescape(b"\\x4").is_err());
        assert!(unescape(b"\\xzz").is_err());
        assert!(unescape(b"abc\\").is_err());
        assert_eq!(unescape(b"\\x41\\t"), Ok(b"A\t".to_vec()));
    }
}
