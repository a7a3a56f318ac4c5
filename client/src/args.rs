//! The connection flags shared by the `ringkv` CLI and loadgen's `--server`
//! mode: TLS (`--tls`, `--ca`, `--insecure`, `--tls-server-name`, `--cert`,
//! `--key`), the user (`--user`) and the password (`--password-file`, or the
//! `RINGKV_PASSWORD` environment variable, so it never shows in `ps`).
//! Only with the `cli` feature (on by default), which brings in clap.

use std::path::PathBuf;
use std::time::Duration;

use crate::client::ConnectOptions;
use crate::tls::TlsOptions;

/// Environment variable holding the password, when `--password-file` is not given.
pub const PASSWORD_ENV: &str = "RINGKV_PASSWORD";

/// Flags that say how to reach a server.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConnectArgs {
    /// Connect with TLS (the server's `server.tls_native = true`).
    #[arg(long)]
    pub tls: bool,
    /// PEM file of the CA that signed the server's certificate (implies --tls).
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Accept any server certificate: encrypted, but the server is not
    /// authenticated. For self-signed test setups only (implies --tls).
    #[arg(long)]
    pub insecure: bool,
    /// Name to check the server certificate against (default: the host of
    /// the server address).
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// Client certificate (PEM), for servers that require one; with --key.
    #[arg(long, value_name = "FILE", requires = "key")]
    pub cert: Option<PathBuf>,
    /// Private key of --cert (PEM).
    #[arg(long, value_name = "FILE", requires = "cert")]
    pub key: Option<PathBuf>,
    /// File holding the server's password (one trailing newline ignored).
    /// Without it, the RINGKV_PASSWORD environment variable is used if set.
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// User to authenticate as (the server's `[users.NAME]`), with the
    /// password of --password-file or RINGKV_PASSWORD. Default: the
    /// server's `default` user.
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
}

impl ConnectArgs {
    /// The password: from `--password-file`, else `RINGKV_PASSWORD`, else none.
    pub fn password(&self) -> Result<Option<Vec<u8>>, String> {
        if let Some(path) = &self.password_file {
            let mut bytes = std::fs::read(path)
                .map_err(|e| format!("cannot read --password-file {}: {e}", path.display()))?;
            if bytes.last() == Some(&b'\n') {
                bytes.pop();
                if bytes.last() == Some(&b'\r') {
                    bytes.pop();
                }
            }
            return Ok(Some(bytes));
        }
        Ok(std::env::var_os(PASSWORD_ENV)
            .filter(|v| !v.is_empty())
            .map(std::os::unix::ffi::OsStringExt::into_vec))
    }

    /// Whether TLS was asked for (any TLS flag implies it).
    pub fn wants_tls(&self) -> bool {
        self.tls || self.ca.is_some() || self.insecure || self.cert.is_some()
    }

    /// The options these flags describe, with `timeout` for connecting.
    pub fn options(&self, timeout: Duration) -> Result<ConnectOptions, String> {
        let tls = self.wants_tls().then(|| {
            let mut tls = TlsOptions::new().with_insecure(self.insecure);
            tls.ca_file = self.ca.clone();
            tls.server_name = self.tls_server_name.clone();
            tls.client_cert = self.cert.clone().zip(self.key.clone());
            tls
        });
        let password = self.password()?;
        if self.user.is_some() && password.is_none() {
            return Err(format!(
                "--user needs a password: --password-file or {PASSWORD_ENV}"
            ));
        }
        let mut options = ConnectOptions::new().with_timeout(timeout);
        if let Some(user) = &self.user {
            options = options.with_user(user.as_bytes());
        }
        if let Some(password) = password {
            options = options.with_password(password);
        }
        if let Some(tls) = tls {
            options = options.with_tls(tls);
        }
        Ok(options)
    }
}
