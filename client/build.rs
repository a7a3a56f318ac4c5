//! Sets `RINGKV_GIT_COMMIT` for `ringkv --version`: the short hash of the
//! git commit this crate is built from, or `unknown` when there is none to
//! ask (git is missing, or the crate was built from a tarball without `.git`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = git_commit(&manifest_dir).unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=RINGKV_GIT_COMMIT={commit}");
    println!("cargo:rerun-if-changed=build.rs");
}

/// The commit of the checkout holding this crate, and tells cargo to run
/// this script again when the checkout moves to another commit.
fn git_commit(dir: &Path) -> Option<String> {
    // Only a repository that tracks this crate's manifest counts: a crate
    // unpacked into some other repository's tree must not take its commit.
    git(dir, &["ls-files", "--error-unmatch", "Cargo.toml"])?;
    let commit = git(dir, &["rev-parse", "--short", "HEAD"])?;
    // HEAD names the branch (or holds the commit when detached); the
    // branch's ref file, or packed-refs, holds the commit. In a linked
    // worktree these live in different directories; --git-path finds each.
    let mut watched = vec![git(dir, &["rev-parse", "--git-path", "HEAD"])?];
    if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        watched.extend(git(dir, &["rev-parse", "--git-path", &branch]));
    }
    watched.extend(git(dir, &["rev-parse", "--git-path", "packed-refs"]));
    for path in watched {
        let path = dir.join(path);
        // Cargo treats a missing file as always changed: watch only files
        // that exist.
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    Some(commit)
}

/// Runs git in `dir`; its trimmed stdout when it succeeds and says something.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}
