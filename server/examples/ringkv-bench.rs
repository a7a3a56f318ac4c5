//! `ringkv-bench`: the shape of `redis-benchmark -t set,get -d 1000 -r KEYS
//! -n N -c C -P B` against a ringkv server, for scripts/bench-vs-redis.sh.
//! C connections each send batches of B operations (one batch in flight per
//! connection, as redis-benchmark keeps B pipelined commands in flight), on
//! random keys `key:NNNNNNNNNNNN` drawn from KEYS, first N PUTs of D-byte
//! values, then N GETs. It prints throughput and batch latency percentiles
//! per phase, and one `RESULT` line for scripts.
//!
//! What must hold: every batch is checked (all PUTs OK, every GET a value of
//! the written size or NOT_FOUND); a failed batch aborts the run, so a
//! number is never printed for work that was not done.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::builder::RangedU64ValueParser;
use clap::Parser;
use ringkv_client::{Client, OpReply, RequestOp};

// The length-of-time parser the engine's benches use too.
#[path = "../../engine/benches/shared/duration_arg.rs"]
mod duration_arg;

/// Options of one run.
#[derive(Debug, Clone)]
pub struct Options {
    pub server: SocketAddr,
    pub connections: usize,
    pub batch: usize,
    pub value_bytes: usize,
    pub keys: u64,
    pub requests: u64,
    pub seed: u64,
}

/// Results of one phase.
#[derive(Debug, Clone)]
pub struct Phase {
    pub name: &'static str,
    pub ops: u64,
    pub elapsed: Duration,
    /// Batch round-trip latencies, sorted.
    pub batch_latencies: Vec<Duration>,
    pub not_found: u64,
}

impl Phase {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    pub fn percentile(&self, q: f64) -> Duration {
        if self.batch_latencies.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((self.batch_latencies.len() as f64 * q).ceil() as usize)
            .clamp(1, self.batch_latencies.len());
        self.batch_latencies[rank - 1]
    }
}

/// A small, fast, seedable PRNG (xorshift64*), so runs are repeatable.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Length of `key:NNNNNNNNNNNN`.
const KEY_BYTES: usize = 16;

/// Writes `key:NNNNNNNNNNNN` (n modulo 10^12, zero-padded) into `out`.
fn write_key(out: &mut [u8; KEY_BYTES], mut n: u64) {
    out[..4].copy_from_slice(b"key:");
    for slot in out[4..].iter_mut().rev() {
        *slot = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// `count` random keys below `keys`, as slices of one buffer (one
/// allocation per batch, as a real client would build a frame).
fn random_keys(rng: &mut Rng, keys: u64, count: usize) -> Vec<Bytes> {
    let mut all = Vec::with_capacity(count * KEY_BYTES);
    let mut one = [0u8; KEY_BYTES];
    for _ in 0..count {
        write_key(&mut one, rng.next() % keys);
        all.extend_from_slice(&one);
    }
    let all = Bytes::from(all);
    (0..count)
        .map(|i| all.slice(i * KEY_BYTES..(i + 1) * KEY_BYTES))
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Put,
    Get,
}

async fn phase(opts: &Options, kind: Kind, clients: &[Arc<Client>]) -> Result<Phase, String> {
    let value = Bytes::from(vec![b'x'; opts.value_bytes]);
    let batches_total = opts.requests.div_ceil(opts.batch as u64);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        // Spread the batches over the connections, the first ones taking
        // one more when they do not divide evenly.
        let share = batches_total / clients.len() as u64
            + u64::from((c as u64) < batches_total % clients.len() as u64);
        let client = Arc::clone(client);
        let value = value.clone();
        let opts = opts.clone();
        let seed = opts.seed ^ ((c as u64 + 1) << 32) ^ if kind == Kind::Put { 0 } else { 0xABCD };
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(seed);
            let mut latencies = Vec::with_capacity(share as usize);
            let mut not_found = 0u64;
            for _ in 0..share {
                let ops: Vec<RequestOp> = random_keys(&mut rng, opts.keys, opts.batch)
                    .into_iter()
                    .map(|key| match kind {
                        Kind::Put => RequestOp::Put {
                            key,
                            value: value.clone(),
                        },
                        Kind::Get => RequestOp::Get { key },
                    })
                    .collect();
                let sent = Instant::now();
                let replies = client
                    .batch(ops)
                    .await
                    .map_err(|e| format!("batch failed: {e}"))?;
                latencies.push(sent.elapsed());
                for reply in &replies {
                    match (kind, reply) {
                        (Kind::Put, OpReply::Ok) => {}
                        (Kind::Get, OpReply::Value(v)) if v.len() == opts.value_bytes => {}
                        (Kind::Get, OpReply::NotFound) => not_found += 1,
                        (_, other) => return Err(format!("unexpected reply {other:?}")),
                    }
                }
            }
            Ok::<_, String>((latencies, not_found))
        }));
    }
    let mut latencies = Vec::new();
    let mut not_found = 0;
    for t in tasks {
        let (l, n) = t.await.map_err(|e| format!("task failed: {e}"))??;
        latencies.extend(l);
        not_found += n;
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Ok(Phase {
        name: match kind {
            Kind::Put => "PUT",
            Kind::Get => "GET",
        },
        ops: batches_total * opts.batch as u64,
        elapsed,
        batch_latencies: latencies,
        not_found,
    })
}

/// Connects (retrying while the server starts, up to `wait`) and runs the
/// PUT phase, then the GET phase.
pub async fn run(opts: &Options, wait: Duration) -> Result<(Phase, Phase), String> {
    assert!(opts.connections >= 1 && opts.batch >= 1 && opts.keys >= 1);
    let deadline = Instant::now() + wait;
    let mut clients = Vec::with_capacity(opts.connections);
    while clients.len() < opts.connections {
        match Client::connect_timeout(opts.server, Duration::from_secs(10)).await {
            Ok(c) => clients.push(Arc::new(c)),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(format!("cannot connect to {}: {e}", opts.server)),
        }
    }
    let put = phase(opts, Kind::Put, &clients).await?;
    report(&put);
    let get = phase(opts, Kind::Get, &clients).await?;
    report(&get);
    Ok((put, get))
}

/// Prints a phase as soon as it is done (flushed: stdout may be a file
/// that a script watches).
fn report(p: &Phase) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", describe(p));
    let _ = out.flush();
}

pub fn describe(p: &Phase) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "{}: {} ops in {:.2} s = {:.0} ops/s; batch latency ms p50 {:.2} p95 {:.2} p99 {:.2} p99.9 {:.2} max {:.2}{}",
        p.name,
        p.ops,
        p.elapsed.as_secs_f64(),
        p.ops_per_sec(),
        ms(p.percentile(0.50)),
        ms(p.percentile(0.95)),
        ms(p.percentile(0.99)),
        ms(p.percentile(0.999)),
        ms(p.percentile(1.0)),
        if p.not_found > 0 { format!("; {} not found", p.not_found) } else { String::new() }
    )
}

/// Runs N PUTs, then N GETs, of random keys against a ringkv server, as
/// `redis-benchmark -t set,get` does, and prints throughput, batch latency
/// percentiles and a RESULT line. The short flags are redis-benchmark's.
#[derive(Debug, Parser)]
#[command(name = "ringkv-bench", allow_negative_numbers = true)]
pub struct Args {
    /// Address of the server's native port, IP:PORT
    #[arg(
        short = 's',
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:7379"
    )]
    pub server: SocketAddr,

    /// Connections, each with one batch in flight, a count of at least 1
    #[arg(short = 'c', long, value_name = "N", default_value_t = 16,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    pub connections: usize,

    /// Operations per batch (redis-benchmark's pipeline depth), a count of at least 1
    #[arg(short = 'P', long, value_name = "N", default_value_t = 1000,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..))]
    pub batch: usize,

    /// Size of each PUT's value, in bytes
    #[arg(short = 'd', long, value_name = "BYTES", default_value_t = 1000)]
    pub value_bytes: usize,

    /// Distinct keys the random keys are drawn from, a count of at least 1
    #[arg(short = 'r', long, value_name = "N", default_value_t = 1_000_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub keys: u64,

    /// Operations in each phase (PUTs, then GETs), a count rounded up to whole batches
    #[arg(short = 'n', long, value_name = "N", default_value_t = 2_000_000)]
    pub requests: u64,

    /// Seed of the random keys, a number
    #[arg(long, value_name = "N", default_value_t = 42)]
    pub seed: u64,

    /// How long to retry connecting while the server starts, in seconds (or with a unit: 500ms, 2s)
    #[arg(long, value_name = "DURATION", default_value = "30", value_parser = duration_arg::parse_duration)]
    pub wait_secs: Duration,
}

impl Args {
    /// The run's options and how long to wait for the server.
    pub fn into_options(self) -> (Options, Duration) {
        let opts = Options {
            server: self.server,
            connections: self.connections,
            batch: self.batch,
            value_bytes: self.value_bytes,
            keys: self.keys,
            requests: self.requests,
            seed: self.seed,
        };
        (opts, self.wait_secs)
    }
}

#[allow(dead_code)] // Also compiled as a module of the smoke test, which has its own main.
fn main() {
    let (opts, wait) = Args::parse().into_options();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| {
            eprintln!("ringkv-bench: cannot start the runtime: {e}");
            std::process::exit(1)
        });
    println!(
        "ringkv-bench: server {} connections {} batch {} value {} B keys {} requests {} (cores: {})",
        opts.server,
        opts.connections,
        opts.batch,
        opts.value_bytes,
        opts.keys,
        opts.requests,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    match runtime.block_on(run(&opts, wait)) {
        Ok((put, get)) => {
            println!(
                "RESULT put_ops_per_sec={:.0} get_ops_per_sec={:.0} put_batch_p99_ms={:.2} get_batch_p99_ms={:.2}",
                put.ops_per_sec(),
                get.ops_per_sec(),
                put.percentile(0.99).as_secs_f64() * 1e3,
                get.percentile(0.99).as_secs_f64() * 1e3
            );
        }
        Err(e) => {
            eprintln!("ringkv-bench: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_zero_padded_like_redis_benchmark() {
        let mut k = [0u8; KEY_BYTES];
        write_key(&mut k, 42);
        assert_eq!(&k, b"key:000000000042");
        write_key(&mut k, 999_999_999_999);
        assert_eq!(&k, b"key:999999999999");
    }

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("ringkv-bench").chain(args.iter().copied()))
    }

    #[test]
    fn command_line_is_consistent() {
        use clap::CommandFactory;
        Args::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let (opts, wait) = parse(&[]).expect("no flags").into_options();
        assert_eq!(opts.server, "127.0.0.1:7379".parse().unwrap());
        assert_eq!(
            (opts.connections, opts.batch, opts.value_bytes),
            (16, 1000, 1000)
        );
        assert_eq!(
            (opts.keys, opts.requests, opts.seed),
            (1_000_000, 2_000_000, 42)
        );
        assert_eq!(wait, Duration::from_secs(30));
    }

    /// The command lines of scripts/bench-vs-redis.sh,
    /// scripts/bench-flushes-in-flight.sh, scripts/bench-durable-writes.sh
    /// and docs/benchmarks-history.md.
    #[test]
    fn the_scripts_command_lines_parse() {
        let (opts, _) = parse(&[
            "--server",
            "127.0.0.1:7500",
            "-c",
            "16",
            "-P",
            "1",
            "-d",
            "1000",
            "-r",
            "1000000",
            "-n",
            "60000",
            "--seed",
            "3",
        ])
        .expect("bench-flushes-in-flight.sh")
        .into_options();
        assert_eq!(opts.server, "127.0.0.1:7500".parse().unwrap());
        assert_eq!(
            (opts.connections, opts.batch, opts.value_bytes),
            (16, 1, 1000)
        );
        assert_eq!(
            (opts.keys, opts.requests, opts.seed),
            (1_000_000, 60_000, 3)
        );
        let (opts, wait) = parse(&["-s", "10.0.0.1:7379", "-c", "4", "--wait-secs", "5"])
            .expect("short server flag")
            .into_options();
        assert_eq!(opts.server, "10.0.0.1:7379".parse().unwrap());
        assert_eq!(opts.connections, 4);
        assert_eq!(wait, Duration::from_secs(5));
        let (_, wait) = parse(&["--wait-secs", "250ms"])
            .expect("unit")
            .into_options();
        assert_eq!(wait, Duration::from_millis(250));
    }

    /// Each bad value is an error that names its flag (by its long name,
    /// which `--help` shows beside the short one), never a default.
    #[test]
    fn bad_values_are_errors_naming_the_flag() {
        for (args, flag) in [
            (&["--wait-secs", "x"][..], "--wait-secs"),
            (&["--wait-secs", "-1"][..], "--wait-secs"),
            (&["--wait-secs", "5m"][..], "--wait-secs"),
            (&["-c", "-1"][..], "--connections <N>"),
            (&["-c", "0"][..], "--connections <N>"),
            (&["-P", "many"][..], "--batch <N>"),
            (&["-n", "1.5"][..], "--requests <N>"),
            (&["-r", "0"][..], "--keys <N>"),
            (&["--server", "localhost"][..], "--server"),
        ] {
            let err = parse(args).expect_err(&format!("{args:?} must fail"));
            let text = err.to_string();
            assert!(text.contains(flag), "{args:?}: {text}");
            assert_ne!(err.exit_code(), 0, "{args:?}");
        }
        let err = parse(&["--connections-max", "3"]).expect_err("unknown flag");
        assert_eq!(err.kind(), clap::error::ErrorKind::UnknownArgument);
        assert_ne!(err.exit_code(), 0);
    }

    #[test]
    fn help_describes_every_flag() {
        let err = parse(&["--help"]).expect_err("help is printed, not parsed");
        assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp);
        assert_eq!(err.exit_code(), 0);
        let help = err.to_string();
        for flag in [
            "--server",
            "-c,",
            "-P,",
            "-d,",
            "-r,",
            "-n,",
            "--seed",
            "--wait-secs",
            "bytes",
            "seconds",
        ] {
            assert!(help.contains(flag), "{flag} missing from:\n{help}");
        }
    }
}
