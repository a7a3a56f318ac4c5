//! Which allocator serves this process's heap, for the report.
//!
//! The `loadgen` binary installs mimalloc as its global allocator, as
//! `ringkv-server` does; the library cannot see that choice, so it asks
//! mimalloc whether a fresh heap allocation lies in memory mimalloc
//! manages. What must hold: the answer comes from the allocation itself,
//! not from a constant, so a binary built without mimalloc reports
//! "system".

// Linked for its C library: `mi_is_in_heap_region` below comes from it.
extern crate mimalloc;

unsafe extern "C" {
    /// mimalloc: whether `p` points into a region mimalloc allocated from.
    /// Safe to call with any pointer, including one from another allocator.
    fn mi_is_in_heap_region(p: *const std::ffi::c_void) -> bool;
}

/// "mimalloc" when the global allocator is mimalloc, else "system".
pub fn global_allocator() -> &'static str {
    let probe = Box::new(0u64);
    let ptr: *const u64 = &*probe;
    // SAFETY: mi_is_in_heap_region only compares the address with the
    // regions mimalloc owns; it never reads through it.
    if unsafe { mi_is_in_heap_region(ptr.cast()) } {
        "mimalloc"
    } else {
        "system"
    }
}

#[cfg(test)]
mod tests {
    /// The library's test binary keeps the system allocator: the probe
    /// must say so (the `loadgen` binary's "mimalloc" is checked by
    /// tests/embedded.rs).
    #[test]
    fn a_test_binary_without_mimalloc_reports_system() {
        assert_eq!(super::global_allocator(), "system");
    }
}
