//! The ringkv daemon as a library, so loadgen can embed it.
