//! A window over a file that slides forward, reading aligned chunks with
//! one chunk of read-ahead. Both the WAL's reader and the snapshot loader
//! read their files through it, so it sits in `io`, below both.

use crate::io::{AlignedBuf, DiskFile, ALIGN};
use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Bytes read from disk at a time.
pub const READ_CHUNK_BYTES: usize = 1 << 20;
const _: () = assert!(READ_CHUNK_BYTES.is_multiple_of(ALIGN));

fn align_down(n: u64) -> u64 {
    n - n % ALIGN as u64
}

/// A read of one chunk that is in flight (or already done) while the caller
/// works on the chunks before it.
type ChunkRead<'a> = Pin<Box<dyn Future<Output = (io::Result<usize>, AlignedBuf)> + 'a>>;

/// The read of the chunk after the last one taken into the window.
struct ReadAhead<'a> {
    offset: u64,
    read: ChunkRead<'a>,
}

/// A window over a file that slides forward: `get(offset, len)` returns the
/// bytes `[offset, offset + len)` (fewer at end of file), reading aligned
/// chunks as needed. Bytes before `min(offset, keep_from)` may be dropped.
///
/// Double buffered: whenever a full chunk arrives, the read of the next one
/// is started before `get` returns, so the disk reads chunk n + 1 while the
/// caller parses chunk n. A read-ahead's result (data or error) is used
/// only if the caller then asks for that chunk, so reading ahead never
/// changes what a caller sees.
pub struct FileWindow<'a, F: DiskFile> {
    file: &'a F,
    path: &'a Path,
    file_len: u64,
    start: u64,
    data: Vec<u8>,
    keep_from: u64,
    /// Chunk buffers not in use by a read (at most two exist).
    spare: Vec<AlignedBuf>,
    ahead: Option<ReadAhead<'a>>,
    bytes_read: u64,
}

impl<'a, F: DiskFile> FileWindow<'a, F> {
    pub async fn new(file: &'a F, path: &'a Path) -> io::Result<FileWindow<'a, F>> {
        let file_len = file.len().await?;
        Ok(FileWindow {
            file,
            path,
            file_len,
            start: 0,
            data: Vec::new(),
            keep_from: u64::MAX,
            spare: vec![AlignedBuf::with_capacity(READ_CHUNK_BYTES)],
            ahead: None,
            bytes_read: 0,
        })
    }

    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    pub fn path(&self) -> &Path {
        self.path
    }

    /// Bytes read from disk so far (chunks taken into the window; a
    /// read-ahead counts once it is used).
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// Keep bytes from `offset` on in memory (until changed).
    pub fn keep_from(&mut self, offset: u64) {
        self.keep_from = offset;
    }

    fn spare_buf(&mut self) -> AlignedBuf {
        self.spare
            .pop()
            .unwrap_or_else(|| AlignedBuf::with_capacity(READ_CHUNK_BYTES))
    }

    /// The chunk at `at`: the read-ahead if it is for `at`, else a new read
    /// (a read-ahead for another offset is waited for and dropped).
    async fn read_chunk(&mut self, at: u64) -> (io::Result<usize>, AlignedBuf) {
        if let Some(ahead) = self.ahead.take() {
            let (res, buf) = ahead.read.await;
            if ahead.offset == at {
                return (res, buf);
            }
            self.spare.push(buf);
        }
        let buf = self.spare_buf();
        self.file.read_at(buf, at).await
    }

    /// Starts reading the chunk at `at` and hands it to the backend before
    /// returning (polled once, then the backend's queue is submitted), so
    /// the read proceeds while the caller computes.
    fn read_ahead(&mut self, at: u64) {
        assert!(self.ahead.is_none(), "one read-ahead at a time");
        let buf = self.spare_buf();
        let mut read: ChunkRead<'a> = Box::pin(self.file.read_at(buf, at));
        let mut cx = Context::from_waker(Waker::noop());
        if let Poll::Ready(done) = read.as_mut().poll(&mut cx) {
            read = Box::pin(std::future::ready(done));
        } else {
            crate::io::submit_queued();
        }
        self.ahead = Some(ReadAhead { offset: at, read });
    }

    pub async fn get(&mut self, offset: u64, len: usize) -> io::Result<&[u8]> {
        let end = (offset.saturating_add(len as u64)).min(self.file_len);
        if offset < self.start {
            self.start = align_down(offset.min(self.keep_from));
            self.data.clear();
        }
        while self.start + (self.data.len() as u64) < end {
            let drop_to = align_down(offset.min(self.keep_from));
            if drop_to > self.start {
                let n = ((drop_to - self.start) as usize).min(self.data.len());
                self.data.drain(..n);
                self.start += n as u64;
            }
            let at = self.start + self.data.len() as u64;
            assert_eq!(at % ALIGN as u64, 0, "window reads stay aligned");
            let (res, buf) = self.read_chunk(at).await;
            let got = match res {
                Ok(n) => n,
                Err(e) => {
                    self.spare.push(buf);
                    return Err(e);
                }
            };
            self.data.extend_from_slice(&buf.as_slice()[..got]);
            self.spare.push(buf);
            self.bytes_read += got as u64;
            if got < READ_CHUNK_BYTES {
                // End of file (or a file shorter than its stat said).
                self.file_len = self.file_len.min(at + got as u64);
                break;
            }
            let next = at + READ_CHUNK_BYTES as u64;
            if next < self.file_len {
                self.read_ahead(next);
            }
        }
        let from = (offset.saturating_sub(self.start) as usize).min(self.data.len());
        let to = (end.saturating_sub(self.start) as usize).clamp(from, self.data.len());
        Ok(&self.data[from..to])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::real::RealDisk;
    use crate::io::sim::SimDisk;
    use crate::io::Disk;

    /// The window hands out the file's bytes whatever the read-ahead did:
    /// across chunk boundaries, after a backward seek, and at the end.
    async fn window_reads_the_file<D: Disk>(disk: &D, dir: &Path) {
        disk.create_dir_all(dir).expect("dir");
        let path = dir.join("f");
        let file = disk.open(&path, true).await.expect("open");
        let len = 3 * READ_CHUNK_BYTES + 5 * ALIGN;
        let image: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut buf = AlignedBuf::with_capacity(len);
        buf.extend_from_slice(&image);
        let (res, _) = file.write_at(buf, 0).await;
        res.expect("write");
        let mut win = FileWindow::new(&file, &path).await.expect("window");
        let reads = [
            (0u64, 100usize),
            (READ_CHUNK_BYTES as u64 - 10, 20),
            (2 * READ_CHUNK_BYTES as u64 + 3, READ_CHUNK_BYTES),
            (10, 4096), // backward
            (len as u64 - 7, 100),
            (len as u64 + 1, 10),
        ];
        for (offset, want) in reads {
            let got = win.get(offset, want).await.expect("get").to_vec();
            let from = (offset as usize).min(len);
            let to = (offset as usize + want).min(len);
            assert_eq!(got, image[from..to], "offset {offset} len {want}");
        }
    }

    #[test]
    fn window_reads_the_same_bytes_with_read_ahead_sim() {
        let rt = compio::runtime::Runtime::new().expect("runtime");
        rt.block_on(window_reads_the_file(&SimDisk::new(7), Path::new("/w")));
    }

    /// On a real file the read-ahead is in flight while `get` returns.
    #[test]
    fn window_reads_the_same_bytes_with_read_ahead_real() {
        let target = concat!(env!("CARGO_MANIFEST_DIR"), "/../target");
        std::fs::create_dir_all(target).expect("target dir");
        let tmp = tempfile::tempdir_in(target).expect("tempdir");
        let rt = compio::runtime::Runtime::new().expect("runtime");
        rt.block_on(window_reads_the_file(&RealDisk, tmp.path()));
    }
}
