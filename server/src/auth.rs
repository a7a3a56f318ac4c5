//! Password authentication, shared by every listener: the native handshake
//! (`session`), `/metrics` (`http`, HTTP Basic) and the RESP listener's
//! `AUTH` / `HELLO ... AUTH`. A listener hands what the client offered to
//! [`Authenticator::check_user`] (or [`Authenticator::check`] for the
//! `default` user) and acts on the [`Verdict`]; an accepted client gets the
//! [`Identity`] (user and role) that `acl` checks its commands against. The
//! delay before refusing a wrong password is the listener's to apply
//! ([`Authenticator::failure_delay`]), since only it knows its runtime.
//!
//! What must hold:
//! - the comparison takes the same time whatever the offered bytes are: it
//!   always walks [`PASSWORD_BYTES_MAX`] bytes of both sides and folds the
//!   lengths in, so neither a matching prefix nor a length leaks; an unknown
//!   user name is compared against a placeholder the same way, and refused
//!   like a wrong password;
//! - the password never appears in `Debug` output, logs or errors;
//! - every refusal is counted (`ringkv_auth_failures_total`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tunables::{Config, DEFAULT_USER, PASSWORD_BYTES_MAX};

use crate::acl::{Identity, Role};

// The config's bound and the wire's bound are one number.
const _: () = assert!(PASSWORD_BYTES_MAX == ringkv_protocol::PASSWORD_BYTES_MAX);

/// Why the configured password cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    #[error("cannot read {field} {path}: {source}")]
    ReadFile {
        field: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{field} {path} holds no password (it is empty)")]
    EmptyFile { field: String, path: PathBuf },
    #[error(
        "the password in {origin} is {len} bytes; a password is 1..={PASSWORD_BYTES_MAX} bytes"
    )]
    Length { origin: String, len: usize },
    #[error("{field} = {role:?}: unknown role; a role is read-only, read-write or admin")]
    UnknownRole { field: String, role: String },
}

/// A configured password. Its bytes are padded to [`PASSWORD_BYTES_MAX`] so
/// a comparison always reads the same number of bytes.
pub struct Password {
    padded: Box<[u8; PASSWORD_BYTES_MAX]>,
    len: usize,
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Password(<redacted>)")
    }
}

impl Password {
    /// A password of 1..=[`PASSWORD_BYTES_MAX`] bytes; `origin` names where
    /// it came from for the error.
    pub fn new(bytes: &[u8], origin: &str) -> Result<Password, AuthError> {
        if bytes.is_empty() || bytes.len() > PASSWORD_BYTES_MAX {
            return Err(AuthError::Length {
                origin: origin.to_string(),
                len: bytes.len(),
            });
        }
        let mut padded = Box::new([0u8; PASSWORD_BYTES_MAX]);
        padded[..bytes.len()].copy_from_slice(bytes);
        Ok(Password {
            padded,
            len: bytes.len(),
        })
    }

    /// Reads a password file: its content, with one trailing `\n` (or
    /// `\r\n`) removed, as `echo secret > file` writes it.
    pub fn from_file(path: &Path) -> Result<Password, AuthError> {
        Password::from_file_of(path, "server.password_file")
    }

    /// [`Password::from_file`] for the config key `field` (named in errors).
    pub fn from_file_of(path: &Path, field: &str) -> Result<Password, AuthError> {
        let content = std::fs::read(path).map_err(|source| AuthError::ReadFile {
            field: field.to_string(),
            path: path.to_path_buf(),
            source,
        })?;
        let mut bytes: &[u8] = &content;
        if let Some(rest) = bytes.strip_suffix(b"\n") {
            bytes = rest.strip_suffix(b"\r").unwrap_or(rest);
        }
        if bytes.is_empty() {
            return Err(AuthError::EmptyFile {
                field: field.to_string(),
                path: path.to_path_buf(),
            });
        }
        Password::new(bytes, &format!("{field} {}", path.display()))
    }

    /// Whether `offered` is this password, in time independent of its bytes
    /// and length (offers over [`PASSWORD_BYTES_MAX`] bytes never match and
    /// are compared by their first [`PASSWORD_BYTES_MAX`] bytes).
    pub fn matches(&self, offered: &[u8]) -> bool {
        let mut other = [0u8; PASSWORD_BYTES_MAX];
        let take = offered.len().min(PASSWORD_BYTES_MAX);
        other[..take].copy_from_slice(&offered[..take]);
        let mut diff = 0u8;
        for (a, b) in self.padded.iter().zip(other.iter()) {
            diff |= a ^ b;
        }
        // Fold the length in without a data-dependent branch.
        let len_diff = (self.len ^ offered.len()) as u64;
        let len_diff = (len_diff | len_diff.wrapping_neg()) >> 63; // 1 if they differ
        let diff = std::hint::black_box(u64::from(diff) | len_diff);
        diff == 0
    }
}

/// What a listener does with a client's offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Go on: the password is right, or none is configured and none offered.
    Accepted,
    /// A password is configured and the client offered none (RESP: `-NOAUTH`).
    Required,
    /// The offered password is wrong (RESP: `-WRONGPASS`). Refuse after
    /// [`Authenticator::failure_delay`].
    WrongPassword,
    /// The client offered a password but the server has none configured
    /// (refused, as Redis does, so a misdirected client notices).
    NoPasswordConfigured,
}

impl Verdict {
    pub fn is_accepted(self) -> bool {
        self == Verdict::Accepted
    }
}

/// A named user of `[users.NAME]`.
#[derive(Debug)]
struct User {
    identity: Identity,
    password: Password,
}

/// The password check of one server, shared by all its listeners and threads.
#[derive(Debug)]
pub struct Authenticator {
    /// The `default` user's password (`None`: it needs none).
    password: Option<Password>,
    /// Who a client is before it names a user: `default` with its role.
    default_identity: Identity,
    users: Vec<User>,
    /// Compared against when a client names an unknown user, so that the
    /// answer takes as long as for a known one.
    placeholder: Password,
    failure_delay: Duration,
    failures: AtomicU64,
    successes: AtomicU64,
}

impl Authenticator {
    /// An authenticator that requires `password` (or nothing, for `None`).
    /// The `default` user is an admin and there are no other users.
    pub fn new(password: Option<Password>, failure_delay: Duration) -> Authenticator {
        Authenticator::with_users(password, Role::Admin, Vec::new(), failure_delay)
    }

    /// An authenticator with the `default` user (`password`, `default_role`)
    /// and the named `users` (name, password, role; names not `default`).
    pub fn with_users(
        password: Option<Password>,
        default_role: Role,
        users: Vec<(String, Password, Role)>,
        failure_delay: Duration,
    ) -> Authenticator {
        let users = users
            .into_iter()
            .map(|(name, password, role)| {
                assert!(name != DEFAULT_USER, "the default user is not a named user");
                User {
                    identity: Identity::new(&name, role),
                    password,
                }
            })
            .collect();
        Authenticator {
            password,
            default_identity: Identity::new(DEFAULT_USER, default_role),
            users,
            placeholder: Password {
                padded: Box::new([0u8; PASSWORD_BYTES_MAX]),
                len: PASSWORD_BYTES_MAX,
            },
            failure_delay,
            failures: AtomicU64::new(0),
            successes: AtomicU64::new(0),
        }
    }

    /// No password: every client is accepted without one.
    pub fn open() -> Authenticator {
        Authenticator::new(None, Duration::ZERO)
    }

    /// From `server.requirepass` or `server.password_file`, and the
    /// `[users.NAME]` password files (all read now), with their roles.
    pub fn from_config(config: &Config) -> Result<Authenticator, AuthError> {
        let s = &config.server;
        let password = if !s.requirepass.is_empty() {
            Some(Password::new(
                s.requirepass.as_bytes(),
                "server.requirepass",
            )?)
        } else if !s.password_file.as_os_str().is_empty() {
            Some(Password::from_file(&s.password_file)?)
        } else {
            None
        };
        let role = |field: String, name: &str| {
            Role::from_name(name).ok_or_else(|| AuthError::UnknownRole {
                field,
                role: name.to_string(),
            })
        };
        let default_role = role("server.default_role".to_string(), &s.default_role)?;
        let mut users = Vec::with_capacity(config.users.len());
        for (name, user) in &config.users {
            let field = format!("users.{name}.password_file");
            let password = Password::from_file_of(&user.password_file, &field)?;
            let role = role(format!("users.{name}.role"), &user.role)?;
            users.push((name.clone(), password, role));
        }
        Ok(Authenticator::with_users(
            password,
            default_role,
            users,
            s.auth_failure_delay.get(),
        ))
    }

    /// Who a client is until it authenticates as someone: the `default`
    /// user with its role (on a server without a password, for good).
    pub fn default_identity(&self) -> &Identity {
        &self.default_identity
    }

    /// Judges an offer of `user` (`None`: the client named none, so the
    /// `default` user) with `offered` (`None`: no password), counts it, and
    /// names who the client is when it is accepted. An unknown user is a
    /// [`Verdict::WrongPassword`]. For the `default` user the verdicts are
    /// those of [`Authenticator::check`]; on [`Verdict::NoPasswordConfigured`]
    /// the identity is `default`'s too (RESP's `AUTH default anything` is
    /// accepted there, as in Redis).
    pub fn check_user(
        &self,
        user: Option<&[u8]>,
        offered: Option<&[u8]>,
    ) -> (Verdict, Option<Identity>) {
        let named = user.filter(|u| !u.eq_ignore_ascii_case(DEFAULT_USER.as_bytes()));
        let Some(name) = named else {
            let verdict = self.check(offered);
            let identity = matches!(verdict, Verdict::Accepted | Verdict::NoPasswordConfigured)
                .then(|| self.default_identity.clone());
            return (verdict, identity);
        };
        let found = self
            .users
            .iter()
            .find(|u| u.identity.user.as_bytes() == name);
        let verdict = match (found, offered) {
            (_, None) => Verdict::Required,
            (Some(user), Some(offered)) if user.password.matches(offered) => Verdict::Accepted,
            (Some(_), Some(_)) => Verdict::WrongPassword,
            (None, Some(offered)) => {
                // The same work as for a known user; never a match.
                let _ = self.placeholder.matches(offered);
                Verdict::WrongPassword
            }
        };
        self.count(verdict);
        let identity = (verdict == Verdict::Accepted)
            .then(|| found.map(|u| u.identity.clone()))
            .flatten();
        (verdict, identity)
    }

    fn count(&self, verdict: Verdict) {
        let counter = if verdict.is_accepted() {
            &self.successes
        } else {
            &self.failures
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether clients must present a password (the `default` user has one).
    pub fn is_required(&self) -> bool {
        self.password.is_some()
    }

    /// Whether there are users besides `default`.
    pub fn has_users(&self) -> bool {
        !self.users.is_empty()
    }

    /// How long a listener waits before refusing a wrong password.
    pub fn failure_delay(&self) -> Duration {
        self.failure_delay
    }

    /// Judges an offer (`None`: the client offered no password) and counts it.
    pub fn check(&self, offered: Option<&[u8]>) -> Verdict {
        let verdict = match (&self.password, offered) {
            (None, None) => return Verdict::Accepted,
            (None, Some(_)) => Verdict::NoPasswordConfigured,
            (Some(_), None) => Verdict::Required,
            (Some(password), Some(offered)) => {
                if password.matches(offered) {
                    Verdict::Accepted
                } else {
                    Verdict::WrongPassword
                }
            }
        };
        self.count(verdict);
        verdict
    }

    /// Refused authentication attempts so far (no password, wrong password,
    /// a password offered to a server without one).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Successful password checks so far (not counting servers without one).
    pub fn successes(&self) -> u64 {
        self.successes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(password: &str) -> Authenticator {
        Authenticator::new(
            Some(Password::new(password.as_bytes(), "test").unwrap()),
            Duration::ZERO,
        )
    }

    #[test]
    fn only_the_exact_password_matches() {
        let p = Password::new(b"s3cret", "test").unwrap();
        assert!(p.matches(b"s3cret"));
        for wrong in [
            &b""[..],
            b"s",
            b"s3cre",
            b"s3cret\0",
            b"s3cret ",
            b"S3cret",
            b"s3cres",
            &[b'x'; 600][..],
        ] {
            assert!(!p.matches(wrong), "{wrong:?}");
        }
        let longest = vec![7u8; PASSWORD_BYTES_MAX];
        let p = Password::new(&longest, "test").unwrap();
        assert!(p.matches(&longest));
        let mut longer = longest.clone();
        longer.push(7);
        assert!(!p.matches(&longer), "a longer offer with the same prefix");
    }

    #[test]
    fn password_lengths_are_bounded_and_debug_is_redacted() {
        assert!(Password::new(b"", "x").is_err());
        assert!(Password::new(&[1; PASSWORD_BYTES_MAX + 1], "x").is_err());
        let p = Password::new(b"hunter2", "x").unwrap();
        assert!(!format!("{p:?}").contains("hunter2"));
        let a = auth("hunter2");
        assert!(!format!("{a:?}").contains("hunter2"));
    }

    #[test]
    fn verdicts_and_counts() {
        let a = auth("pw");
        assert_eq!(a.check(Some(b"pw")), Verdict::Accepted);
        assert_eq!(a.check(Some(b"nope")), Verdict::WrongPassword);
        assert_eq!(a.check(None), Verdict::Required);
        assert_eq!((a.successes(), a.failures()), (1, 2));
        let open = Authenticator::open();
        assert!(!open.is_required());
        assert_eq!(open.check(None), Verdict::Accepted);
        assert_eq!(open.check(Some(b"pw")), Verdict::NoPasswordConfigured);
        assert_eq!((open.successes(), open.failures()), (0, 1));
    }

    fn users() -> Authenticator {
        let pw = |p: &str| Password::new(p.as_bytes(), "test").unwrap();
        Authenticator::with_users(
            Some(pw("root")),
            Role::Admin,
            vec![
                ("reader".to_string(), pw("r-pw"), Role::ReadOnly),
                ("app".to_string(), pw("a-pw"), Role::ReadWrite),
            ],
            Duration::ZERO,
        )
    }

    #[test]
    fn named_users_get_their_role_and_only_with_their_password() {
        let a = users();
        let (v, who) = a.check_user(Some(b"reader"), Some(b"r-pw"));
        assert_eq!(
            (v, who),
            (
                Verdict::Accepted,
                Some(Identity::new("reader", Role::ReadOnly))
            )
        );
        let (v, who) = a.check_user(Some(b"app"), Some(b"a-pw"));
        assert_eq!(
            (v, who.map(|i| i.role)),
            (Verdict::Accepted, Some(Role::ReadWrite))
        );
        for (user, pw) in [
            (&b"reader"[..], &b"a-pw"[..]),
            (b"reader", b"root"),
            (b"Reader", b"r-pw"),
            (b"nobody", b"r-pw"),
            (b"app", b""),
        ] {
            assert_eq!(
                a.check_user(Some(user), Some(pw)),
                (Verdict::WrongPassword, None)
            );
        }
        assert_eq!(a.check_user(Some(b"app"), None), (Verdict::Required, None));
        // No name, or `default`: the single password, as before.
        for user in [None, Some(&b"default"[..]), Some(b"DEFAULT")] {
            let (v, who) = a.check_user(user, Some(b"root"));
            assert_eq!(
                (v, who),
                (
                    Verdict::Accepted,
                    Some(Identity::new("default", Role::Admin))
                )
            );
        }
        assert_eq!(a.check_user(None, Some(b"r-pw")).0, Verdict::WrongPassword);
        assert_eq!((a.successes(), a.failures()), (5, 7));
    }

    #[test]
    fn from_config_reads_users_and_names_the_broken_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reader.pw");
        std::fs::write(&path, "r-pw\n").unwrap();
        let mut config = Config::default();
        config.server.requirepass = "root".to_string();
        config.server.default_role = "read-write".to_string();
        config.users.insert(
            "reader".to_string(),
            tunables::UserConfig {
                password_file: path.clone(),
                role: "read-only".to_string(),
            },
        );
        let a = Authenticator::from_config(&config).unwrap();
        assert!(a.has_users());
        assert_eq!(a.default_identity().role, Role::ReadWrite);
        assert_eq!(
            a.check_user(Some(b"reader"), Some(b"r-pw"))
                .1
                .map(|i| i.role),
            Some(Role::ReadOnly)
        );
        config.users.get_mut("reader").unwrap().password_file = dir.path().join("missing");
        let error = Authenticator::from_config(&config).unwrap_err().to_string();
        assert!(
            error.starts_with("cannot read users.reader.password_file"),
            "{error}"
        );
    }

    #[test]
    fn password_file_drops_one_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "pa ss\n").unwrap();
        assert!(Password::from_file(&path).unwrap().matches(b"pa ss"));
        std::fs::write(&path, "pa ss\r\n").unwrap();
        assert!(Password::from_file(&path).unwrap().matches(b"pa ss"));
        std::fs::write(&path, "pa ss\n\n").unwrap();
        assert!(Password::from_file(&path).unwrap().matches(b"pa ss\n"));
        std::fs::write(&path, "\n").unwrap();
        assert!(matches!(
            Password::from_file(&path),
            Err(AuthError::EmptyFile { .. })
        ));
        let missing = dir.path().join("missing");
        let error = Password::from_file(&missing).unwrap_err().to_string();
        assert!(error.contains("server.password_file"), "{error}");
    }
}
