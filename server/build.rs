//! Records the git commit the binary is built from, for `--version`:
//! `RINGKV_GIT_COMMIT` is `git rev-parse --short HEAD`, or `unknown` when
//! the sources are not a git checkout (a crate tarball, a source package)
//! or git is missing.

use std::path::Path;
use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=RINGKV_GIT_COMMIT={commit}");
    // A new commit moves HEAD (or the branch HEAD points at): build again.
    if let Ok(out) = Command::new("git")
        .args(["rev-parse", "--git-dir"])
        .output()
    {
        if out.status.success() {
            let git_dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let git_dir = Path::new(&git_dir);
            let head = git_dir.join("HEAD");
            println!("cargo:rerun-if-changed={}", head.display());
            if let Ok(text) = std::fs::read_to_string(&head) {
                if let Some(branch) = text.strip_prefix("ref: ") {
                    let common = Command::new("git")
                        .args(["rev-parse", "--git-common-dir"])
                        .output()
                        .ok()
                        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
                    let base = common.as_deref().map_or(git_dir, Path::new);
                    println!(
                        "cargo:rerun-if-changed={}",
                        base.join(branch.trim()).display()
                    );
                }
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
