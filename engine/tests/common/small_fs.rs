//! A small ext4 file system made for one test: an image file, formatted and
//! loop-mounted on a temporary directory, unmounted and removed on drop.
//! Used by the disk-full tests of the engine and of the server (which
//! includes this file by path). Mounting needs root; callers skip, saying
//! so, when it is not permitted.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Mounted {
    dir: tempfile::TempDir,
    image: PathBuf,
}

impl Mounted {
    /// Where the file system is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A fresh ext4 file system of `mib` MiB, its image named after `name` and
/// this process, or why it could not be made.
pub fn mount_small_fs(name: &str, mib: u64) -> Result<Mounted, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let image = std::env::temp_dir().join(format!("{name}-{}.img", std::process::id()));
    let f = std::fs::File::create(&image).map_err(|e| e.to_string())?;
    f.set_len(mib << 20).map_err(|e| e.to_string())?;
    drop(f);
    let mounted = Mounted { dir, image };
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&mounted.image))?;
    run(Command::new("mount")
        .args(["-o", "loop"])
        .arg(&mounted.image)
        .arg(mounted.dir.path()))?;
    Ok(mounted)
}
