//! `io.cpus`: where shard threads run.

/// What `io.cpus` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuPlacement {
    /// Pinned to the CPUs of the process's affinity mask, from a start that
    /// differs per process.
    Auto,
    /// Not pinned.
    Off,
    /// Shard i on the i-th of these CPUs (round-robin), in the order given.
    List(Vec<usize>),
}

/// Highest CPU number a list may name (the kernel's `CPU_SETSIZE`).
pub const CPU_MAX: usize = 1023;

impl CpuPlacement {
    /// Reads `"auto"`, `"off"` or a list of CPUs and ranges (`"0-3,6"`).
    pub fn parse(text: &str) -> Result<CpuPlacement, String> {
        match text.trim() {
            "auto" => return Ok(CpuPlacement::Auto),
            "off" => return Ok(CpuPlacement::Off),
            _ => {}
        }
        let number = |s: &str| -> Result<usize, String> {
            let n: usize = s.trim().parse().map_err(|_| {
                format!(
                    "{s:?} is not a CPU number; give \"auto\", \"off\" or a list such as \"0-3,6\""
                )
            })?;
            if n > CPU_MAX {
                return Err(format!("CPU {n} is above {CPU_MAX}"));
            }
            Ok(n)
        };
        let mut cpus = Vec::new();
        for item in text.split(',') {
            let (first, last) = match item.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                None => {
                    let n = number(item)?;
                    (n, n)
                }
            };
            if first > last {
                return Err(format!("the range {:?} runs backwards", item.trim()));
            }
            for cpu in first..=last {
                if cpus.contains(&cpu) {
                    return Err(format!("CPU {cpu} is named twice"));
                }
                cpus.push(cpu);
            }
        }
        Ok(CpuPlacement::List(cpus))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_parse_and_bad_lists_say_why() {
        assert_eq!(CpuPlacement::parse("auto"), Ok(CpuPlacement::Auto));
        assert_eq!(CpuPlacement::parse("off"), Ok(CpuPlacement::Off));
        assert_eq!(
            CpuPlacement::parse("0-3,6"),
            Ok(CpuPlacement::List(vec![0, 1, 2, 3, 6]))
        );
        assert_eq!(
            CpuPlacement::parse(" 5, 1 "),
            Ok(CpuPlacement::List(vec![5, 1]))
        );
        for (bad, why) in [
            ("", "not a CPU number"),
            ("x", "not a CPU number"),
            ("1,,2", "not a CPU number"),
            ("3-1", "runs backwards"),
            ("1,1", "named twice"),
            ("0-2,2", "named twice"),
            ("5000", "above"),
            ("-1", "not a CPU number"),
        ] {
            let e = CpuPlacement::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
