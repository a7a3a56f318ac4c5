//! What thread timing decided in one crash-test run, saved so that a
//! failing seed replays exactly.
//!
//! A crash test's operations come from its seed, but where a crash cuts a
//! tail of concurrent batches, and what background checkpoints and GC had
//! written by then, depend on thread timing. A [`Tape`] in recording mode
//! keeps, in order, every crash image ([`SimDisk::image`]) and which tail
//! batches were acknowledged; in playing mode it gives those back instead
//! of running the tail and instead of crashing ([`SimDisk::restore`]). So
//! every recovery, and every check after it, repeats exactly; what cannot
//! repeat is the interleaving that produced an image, which the image
//! itself shows.

use ringkv_engine::io::sim::{SimDisk, SimImage};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"RKVTAPE1";

/// One decision timing made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The disk as a crash left it.
    Crash(SimImage),
    /// Which of the tail's batches were acknowledged.
    Acked(Vec<bool>),
}

#[derive(Debug)]
pub enum Tape {
    Record(Vec<Event>),
    Play(VecDeque<Event>),
}

impl Tape {
    pub fn recording() -> Tape {
        Tape::Record(Vec::new())
    }

    /// Crashes the disk (recording the image), or puts the recorded image
    /// in its place (playing).
    pub fn crash(&mut self, disk: &SimDisk) -> Result<(), String> {
        match self {
            Tape::Record(events) => {
                disk.crash();
                events.push(Event::Crash(disk.image()));
                Ok(())
            }
            Tape::Play(events) => match events.pop_front() {
                Some(Event::Crash(image)) => {
                    disk.restore(&image);
                    Ok(())
                }
                other => Err(format!("the tape has {other:?} where a crash was recorded")),
            },
        }
    }

    /// Runs the concurrent tail (recording which batches were
    /// acknowledged), or skips it and gives back the recorded answer.
    pub fn tail(&mut self, run: impl FnOnce() -> Vec<bool>) -> Result<Vec<bool>, String> {
        match self {
            Tape::Record(events) => {
                let acked = run();
                events.push(Event::Acked(acked.clone()));
                Ok(acked)
            }
            Tape::Play(events) => match events.pop_front() {
                Some(Event::Acked(acked)) => Ok(acked),
                other => Err(format!(
                    "the tape has {other:?} where a tail's answers were recorded"
                )),
            },
        }
    }

    /// Writes a recording, with the seed and tier it belongs to, to `path`.
    pub fn save(&self, path: &Path, seed: u64, hybrid: bool) -> std::io::Result<()> {
        let Tape::Record(events) = self else {
            return Ok(());
        };
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&seed.to_le_bytes());
        out.push(u8::from(hybrid));
        out.extend_from_slice(&(events.len() as u64).to_le_bytes());
        for e in events {
            match e {
                Event::Crash(image) => {
                    out.push(1);
                    image.encode(&mut out);
                }
                Event::Acked(acked) => {
                    out.push(2);
                    out.extend_from_slice(&(acked.len() as u64).to_le_bytes());
                    out.extend(acked.iter().map(|&a| u8::from(a)));
                }
            }
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, out)
    }

    /// Reads a saved recording: its seed, its tier (true: hybrid) and a
    /// tape that plays it.
    pub fn load(path: &Path) -> Result<(u64, bool, Tape), String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let bad = |what: &str| format!("{}: not a crash tape ({what})", path.display());
        let mut input = &bytes[..];
        if take(&mut input, 8).ok_or_else(|| bad("magic"))? != MAGIC {
            return Err(bad("magic"));
        }
        let seed = take_u64(&mut input).ok_or_else(|| bad("seed"))?;
        let hybrid = take(&mut input, 1).ok_or_else(|| bad("tier"))?[0] == 1;
        let count = take_u64(&mut input).ok_or_else(|| bad("event count"))?;
        let mut events = VecDeque::new();
        for _ in 0..count {
            match take(&mut input, 1).ok_or_else(|| bad("event kind"))?[0] {
                1 => {
                    let image = SimImage::decode(&mut input).map_err(|e| bad(&e.to_string()))?;
                    events.push_back(Event::Crash(image));
                }
                2 => {
                    let n = take_u64(&mut input).ok_or_else(|| bad("tail length"))?;
                    let n = usize::try_from(n).map_err(|_| bad("tail length"))?;
                    let acked = take(&mut input, n).ok_or_else(|| bad("tail answers"))?;
                    events.push_back(Event::Acked(acked.iter().map(|&b| b == 1).collect()));
                }
                _ => return Err(bad("event kind")),
            }
        }
        if !input.is_empty() {
            return Err(bad("bytes after the last event"));
        }
        Ok((seed, hybrid, Tape::Play(events)))
    }
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if input.len() < n {
        return None;
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Some(head)
}

fn take_u64(input: &mut &[u8]) -> Option<u64> {
    take(input, 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// Where a failing seed's tape goes: the test target's scratch directory.
pub fn tape_path(test: &str, seed: u64, hybrid: bool) -> PathBuf {
    let tier = if hybrid { "hybrid" } else { "memory" };
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(test)
        .join(format!("seed-{seed}-{tier}.tape"))
}
