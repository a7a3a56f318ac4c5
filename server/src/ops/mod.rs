//! What operators see: the server's counters (`counters`), the STATS answer
//! (`stats`), the `/metrics` page (`metrics`, written by `prom`) and the tiny
//! HTTP server that serves it (`http`), and the one mapping from engine
//! outcomes to wire statuses (`status`).

pub mod backup;
pub mod counters;
pub mod http;
pub mod metrics;
pub mod prom;
pub mod sd_notify;
pub mod stats;
pub mod status;
pub mod verify;
