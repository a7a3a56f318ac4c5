//! loadgen: ringkv's benchmark driver, as a library so its integration tests
//! can run the same code paths as the `loadgen` binary.
//!
//! Layout: `cli` (flags) -> `settings` -> `app` (device classes, embedded
//! server, runs) -> `workloads` (what each client task sends) -> `driver`
//! (phases, warm-up, pacing, histograms) -> `target` (the system under test).
//! Output: `report` (the JSON model), `render` / `table` (human tables),
//! `compare`, `plot`.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod allocator;
pub mod app;
pub mod capacity;
pub mod cli;
pub mod compare;
pub mod crash;
pub mod driver;
pub mod embedded;
pub mod engine_target;
pub mod hist;
pub mod keys;
pub mod machine;
pub mod plot;
pub mod published;
pub mod record;
pub mod render;
pub mod report;
pub mod ringkv;
pub mod settings;
pub mod stats;
pub mod table;
pub mod target;
pub mod workloads;
