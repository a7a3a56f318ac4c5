//! An owned byte buffer whose memory is aligned to [`ALIGN`] bytes, as
//! O_DIRECT requires for the buffer address, length and file offset.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment of every buffer, offset and length given to O_DIRECT I/O.
pub const ALIGN: usize = 4096;

/// Owned, `ALIGN`-aligned, zero-initialised byte buffer with a length
/// (`len`, the bytes in use) and a fixed capacity (a multiple of `ALIGN`).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only give out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of at least `capacity` bytes (rounded up to `ALIGN`,
    /// and never less than `ALIGN`), with length 0.
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(1).div_ceil(ALIGN) * ALIGN;
        let layout = Layout::from_size_align(capacity, ALIGN).expect("buffer layout");
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout);
        };
        AlignedBuf {
            ptr,
            len: 0,
            capacity,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes still free before `capacity`.
    pub fn remaining(&self) -> usize {
        self.capacity - self.len
    }

    /// Sets the length. Bytes up to `capacity` are always initialised.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity, "AlignedBuf::set_len past capacity");
        self.len = len;
    }

    /// Appends bytes; panics if they do not fit (callers check `remaining`).
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        assert!(bytes.len() <= self.remaining(), "AlignedBuf overflow");
        let start = self.len;
        self.len += bytes.len();
        self.as_mut_slice()[start..].copy_from_slice(bytes);
    }

    /// Zeroes the whole capacity and sets the length to 0.
    pub fn clear_zeroed(&mut self) {
        self.len = self.capacity;
        self.as_mut_slice().fill(0);
        self.len = 0;
    }

    /// Extends the length with zero bytes up to the next multiple of `ALIGN`.
    pub fn pad_to_align(&mut self) {
        let padded = self.len.div_ceil(ALIGN) * ALIGN;
        assert!(padded <= self.capacity);
        let old = self.len;
        self.len = padded;
        self.as_mut_slice()[old..].fill(0);
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for capacity bytes, all initialised; len <= capacity.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The whole capacity, regardless of `len`.
    pub fn spare_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid and initialised for capacity bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity) }
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.capacity, ALIGN).expect("buffer layout");
        // SAFETY: allocated in with_capacity with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        let mut b = AlignedBuf::with_capacity(5000);
        assert_eq!(b.capacity(), 8192);
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        b.extend_from_slice(b"hello");
        assert_eq!(b.as_slice(), b"hello");
        b.pad_to_align();
        assert_eq!(b.len(), 4096);
        assert!(b.as_slice()[5..].iter().all(|&x| x == 0));
    }
}
