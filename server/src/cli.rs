//! Command-line flags of `ringkv-server` and how they combine with the config
//! file into the effective configuration.
//!
//! What must hold: defaults, then the file (`--config`), then flags — a flag
//! always wins over the file, and the result is validated as a whole before
//! anything starts. `--check-config` and `--print-config` never start a server.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tunables::{Backend, Config, ConfigErrors, Durability, Tier};

/// The version `--version` prints: the package version and the git commit
/// the binary was built from (`unknown` outside a git checkout; see
/// `server/build.rs`).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("RINGKV_GIT_COMMIT"),
    ")"
);

/// ringkv-server: a persistent, thread-per-core key-value server.
#[derive(Debug, Clone, Parser)]
#[command(name = "ringkv-server", version = VERSION, about, long_about = None)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// Offline tools on a data directory (the server is not started).
    #[command(subcommand)]
    pub command: Option<Tool>,

    /// Configuration file (TOML). Without it the defaults apply; flags below
    /// override values from the file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Data directory (manifest, lock file, one folder per shard).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Address of the binary-protocol listener, e.g. 127.0.0.1:7379 (port 0
    /// picks a free port).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Address of the Prometheus /metrics endpoint (off unless set here or in
    /// the file).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,

    /// Address of the Redis-protocol (RESP2/RESP3) listener, e.g.
    /// 127.0.0.1:6379 (off unless set here or in the file; port 0 picks a
    /// free port).
    #[arg(long, value_name = "ADDR")]
    pub resp_listen: Option<SocketAddr>,

    /// Number of shards; 0 means one per available core.
    #[arg(long, value_name = "N")]
    pub shards: Option<u32>,

    // `--durability` and `--tier` take the config's own enums: their flag
    // values and help lines are in `tunables` (its `clap` feature), shared
    // with loadgen.
    /// When a write is acknowledged.
    #[arg(long, value_enum, value_name = "MODE")]
    pub durability: Option<Durability>,

    /// Storage tier (storage.tier). A data directory keeps the tier it was
    /// created with; the hybrid tier's other settings (value_device,
    /// cache_bytes, index_keys, ...) are set in the config file.
    #[arg(long, value_enum, value_name = "TIER")]
    pub tier: Option<Tier>,

    /// Disk profile of the WAL device (sas, gpssd, nvme, unthrottled, or a
    /// profile from the file).
    #[arg(long, value_name = "PROFILE")]
    pub device_profile: Option<String>,

    /// I/O backend.
    #[arg(long, value_enum, value_name = "BACKEND")]
    pub io_backend: Option<BackendArg>,

    /// Most connections open at once across all shards.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<u32>,

    /// File holding the password clients must present (server.password_file).
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,

    /// TLS certificate chain (PEM); with --tls-key it turns TLS on for the
    /// binary-protocol listener (server.tls_native).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// Private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// CA certificates (PEM): TLS clients must present a certificate signed by one.
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,

    /// Protected mode's opt-out: listen on a non-loopback address with no
    /// password. Anyone who can connect can then read and delete every key.
    #[arg(long)]
    pub dangerously_listen_without_password: bool,

    /// Print the effective configuration as TOML (the password redacted) and exit.
    #[arg(long)]
    pub print_config: bool,

    /// Validate FILE, print every problem (one line each) and exit: 0 when the
    /// file is valid, 1 when it is not.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["config", "print_config"])]
    pub check_config: Option<PathBuf>,
}

/// The offline tools (`docs/operations.md`). Each takes the data
/// directory's lock, so none runs beside a live server.
#[derive(Debug, Clone, Subcommand)]
pub enum Tool {
    /// Read every byte of the data directory, check every checksum and
    /// run recovery without writing anything. Exit 0: clean; 1: damaged
    /// but the server would start; 2: the server would refuse to start;
    /// 3: usage error, or the directory is in use.
    Verify(ToolArgs),
    /// List shards, WAL segments, snapshots and value segments from their
    /// headers, names and sizes (fast; checks only headers). Exit 0, or 1
    /// when a header is damaged, 3 on a usage error.
    Inspect(ToolArgs),
    /// Find WAL damage that recovery refuses but dropping the damaged tail
    /// of a shard's newest segment fixes; print what would be dropped, and
    /// drop it only with --truncate-wal-tail.
    Repair(RepairArgs),
}

/// Where the data directory is.
#[derive(Debug, Clone, Args)]
pub struct ToolArgs {
    /// Data directory to examine.
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,

    /// The server's configuration file, for `[devices]` (a WAL or value
    /// device outside the data directory) and segment sizes; the data
    /// directory and the manifest's shard count and tier win over it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// `repair`'s flags.
#[derive(Debug, Clone, Args)]
pub struct RepairArgs {
    #[command(flatten)]
    pub target: ToolArgs,

    /// Make the repair: zero the damaged flush and everything after it in
    /// the newest segment of each damaged shard. Without it nothing is
    /// written.
    #[arg(long)]
    pub truncate_wal_tail: bool,

    /// Directory for copies of the segments before they are changed
    /// (default: `DATA/repair-backup-UNIXSECONDS`).
    #[arg(long, value_name = "DIR", conflicts_with = "no_backup")]
    pub backup_dir: Option<PathBuf>,

    /// Change the segments without keeping a copy.
    #[arg(long)]
    pub no_backup: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// io_uring when allowed, else the fallback.
    Auto,
    /// io_uring or refuse to start.
    Uring,
    /// Always the fallback.
    Fallback,
}

impl From<BackendArg> for Backend {
    fn from(b: BackendArg) -> Backend {
        match b {
            BackendArg::Auto => Backend::Auto,
            BackendArg::Uring => Backend::Uring,
            BackendArg::Fallback => Backend::Fallback,
        }
    }
}

impl Cli {
    /// Defaults, then the `--config` file, then the flags; validated.
    pub fn effective_config(&self) -> Result<Config, ConfigErrors> {
        let mut config = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        self.apply_overrides(&mut config);
        config.validate()?;
        Ok(config)
    }

    /// Writes every flag that was given into `config`.
    pub fn apply_overrides(&self, config: &mut Config) {
        if let Some(dir) = &self.data_dir {
            config.storage.data_dir = dir.clone();
        }
        if let Some(addr) = self.listen {
            config.server.listen = addr.to_string();
        }
        if let Some(addr) = self.metrics_listen {
            config.server.metrics_listen = addr.to_string();
        }
        if let Some(addr) = self.resp_listen {
            config.server.resp_listen = addr.to_string();
        }
        if let Some(shards) = self.shards {
            config.shards = shards;
        }
        if let Some(d) = self.durability {
            config.storage.durability = d;
        }
        if let Some(t) = self.tier {
            config.storage.tier = t;
        }
        if let Some(profile) = &self.device_profile {
            // The WAL device may not be declared in the file yet: create it on
            // the data directory, as the default `wal` device is.
            let device = config
                .devices
                .entry(config.storage.wal_device.clone())
                .or_default();
            device.profile = profile.clone();
        }
        if let Some(b) = self.io_backend {
            config.io.backend = b.into();
        }
        if let Some(n) = self.max_connections {
            config.server.max_connections = n;
        }
        if let Some(path) = &self.password_file {
            config.server.password_file = path.clone();
            // The flag replaces an inline password from the file.
            config.server.requirepass.clear();
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            config.server.tls_cert_file = cert.clone();
            config.server.tls_key_file = key.clone();
            config.server.tls_native = true;
        }
        if let Some(ca) = &self.tls_client_ca {
            config.server.tls_client_ca_file = ca.clone();
        }
        if self.dangerously_listen_without_password {
            config.server.dangerously_listen_without_password = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(args: &[&str]) -> Cli {
        let mut all = vec!["ringkv-server"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).unwrap()
    }

    #[test]
    fn flags_override_defaults() {
        let cli = parse(&[
            "--data-dir",
            "/tmp/x",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:9100",
            "--resp-listen",
            "127.0.0.1:6390",
            "--shards",
            "3",
            "--durability",
            "async",
            "--tier",
            "hybrid",
            "--device-profile",
            "nvme",
            "--io-backend",
            "fallback",
            "--max-connections",
            "7",
            "--password-file",
            "/run/pw",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--tls-client-ca",
            "ca.pem",
            "--dangerously-listen-without-password",
        ]);
        let mut config = Config::default();
        cli.apply_overrides(&mut config);
        assert_eq!(config.storage.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(config.server.listen, "127.0.0.1:0");
        assert_eq!(config.server.metrics_listen, "127.0.0.1:9100");
        assert_eq!(config.server.resp_listen, "127.0.0.1:6390");
        assert_eq!(config.shards, 3);
        assert_eq!(config.storage.durability, Durability::Async);
        assert_eq!(config.storage.tier, Tier::Hybrid);
        assert_eq!(config.devices[&config.storage.wal_device].profile, "nvme");
        assert_eq!(config.io.backend, Backend::Fallback);
        assert_eq!(config.server.max_connections, 7);
        assert_eq!(config.server.password_file, PathBuf::from("/run/pw"));
        assert!(config.server.tls_native && !config.server.tls_metrics);
        assert_eq!(config.server.tls_cert_file, PathBuf::from("c.pem"));
        assert_eq!(config.server.tls_key_file, PathBuf::from("k.pem"));
        assert_eq!(config.server.tls_client_ca_file, PathBuf::from("ca.pem"));
        assert!(config.server.dangerously_listen_without_password);
    }

    #[test]
    fn no_flags_change_nothing() {
        let cli = parse(&[]);
        let mut config = Config::default();
        cli.apply_overrides(&mut config);
        assert_eq!(config, Config::default());
    }

    #[test]
    fn flags_win_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ringkv.toml");
        std::fs::write(
            &path,
            "shards = 2\n[server]\nlisten = \"127.0.0.1:1234\"\n[storage]\ndurability = \"none\"\n",
        )
        .unwrap();
        let cli = parse(&[
            "--config",
            path.to_str().unwrap(),
            "--listen",
            "127.0.0.1:4321",
        ]);
        let config = cli.effective_config().unwrap();
        assert_eq!(config.server.listen, "127.0.0.1:4321");
        assert_eq!(config.shards, 2);
        assert_eq!(config.storage.durability, Durability::None);
    }

    #[test]
    fn tools_parse_and_do_not_mix_with_server_flags() {
        let cli = parse(&["verify", "--data-dir", "/d"]);
        assert!(matches!(cli.command, Some(Tool::Verify(ref a)) if a.data_dir == Path::new("/d")));
        let cli = parse(&[
            "repair",
            "--data-dir",
            "/d",
            "--truncate-wal-tail",
            "--no-backup",
        ]);
        assert!(
            matches!(cli.command, Some(Tool::Repair(ref r)) if r.truncate_wal_tail && r.no_backup)
        );
        assert!(Cli::try_parse_from([
            "ringkv-server",
            "--shards",
            "2",
            "verify",
            "--data-dir",
            "/d"
        ])
        .is_err());
        assert!(Cli::try_parse_from(["ringkv-server", "inspect"]).is_err());
    }

    #[test]
    fn check_config_conflicts_with_config() {
        let r = Cli::try_parse_from(["ringkv-server", "--check-config", "a", "--config", "b"]);
        assert!(r.is_err());
    }
}
