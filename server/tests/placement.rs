//! Where shard threads run (`io.cpus`): on the CPUs the process may use,
//! said in the ready line, and as each thread's own affinity.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size given.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(rc, 0);
    // SAFETY: CPU_ISSET reads the set within CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Runs the server with `cpus` as `io.cpus`, its affinity limited to
/// `mask`; returns its ready line and each shard thread's allowed CPUs,
/// or the log of a start that failed.
fn run(dir: &Path, cpus: &str, mask: &[usize]) -> Result<(String, Vec<String>), String> {
    let config = dir.join(format!("ringkv-{}.toml", cpus.replace(',', "_")));
    std::fs::write(&config, format!("shards = 2\n[io]\ncpus = \"{cpus}\"\n")).unwrap();
    let mask = mask.to_vec();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringkv-server"));
    cmd.arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.join(format!("data-{}", cpus.replace(',', "_"))))
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe calls (sched_setaffinity) between fork
    // and exec.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in &mask {
                libc::CPU_SET(c, &mut set);
            }
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let mut log = Vec::new();
    let mut ready = None;
    for line in stderr.lines() {
        let line = line.unwrap();
        log.push(line.clone());
        if line.contains("ringkv-server ready") {
            ready = Some(line);
            break;
        }
    }
    let Some(ready) = ready else {
        let _ = child.wait();
        return Err(log.join("\n"));
    };
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{}/task", child.id())).unwrap() {
        let task = task.unwrap().path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if name.starts_with("rkv-shard-") {
            let status = std::fs::read_to_string(task.join("status")).unwrap();
            let allowed = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap()
                .trim()
                .to_string();
            threads.push(format!("{}={allowed}", name.trim()));
        }
    }
    threads.sort();
    let _ = child.kill();
    let _ = child.wait();
    Ok((ready, threads))
}

#[test]
fn shards_run_on_the_cpus_the_process_may_use_and_say_where() {
    let dir = tempfile::tempdir().unwrap();
    let all = allowed_cpus();
    let last = *all.last().unwrap();
    // Limited to one CPU (as taskset would): both shards on it, whatever
    // CPU that is, not on CPU 0 and 1.
    let (ready, threads) = run(dir.path(), "auto", &[last]).unwrap();
    assert!(ready.contains(&format!("cpus={last},{last}")), "{ready}");
    assert_eq!(
        threads,
        [
            format!("rkv-shard-000={last}"),
            format!("rkv-shard-001={last}")
        ]
    );
    // Not pinned: each thread may run anywhere the process may.
    let (ready, threads) = run(dir.path(), "off", &all).unwrap();
    assert!(ready.contains("cpus=-,-"), "{ready}");
    assert_eq!(threads.len(), 2);
    // A list: shard i on its i-th CPU.
    let (ready, threads) = run(dir.path(), &last.to_string(), &all).unwrap();
    assert!(ready.contains(&format!("cpus={last},{last}")), "{ready}");
    assert!(
        threads.iter().all(|t| t.ends_with(&format!("={last}"))),
        "{threads:?}"
    );
    // A CPU outside the mask is refused, named.
    if all.len() > 1 {
        let log = run(dir.path(), &last.to_string(), &[all[0]]).unwrap_err();
        assert!(
            log.contains(&format!(
                "io.cpus names CPU {last}, which this process may not run on"
            )),
            "{log}"
        );
    }
}
