//! The hybrid tier's counters, declared once: each field says what it is
//! and where it shows (its STATS name, unit and meaning; its `/metrics`
//! name and help). STATS, `/metrics` and loadgen read them as a list
//! ([`HybridStats::counters`]) and the server sums its shards with
//! [`HybridStats::add`], so none of them names a field. A new counter is a
//! line here and its value in the tier's `stats()`.
//!
//! The order of the fields is the order of the `tier.*` names in a STATS
//! answer (`docs/protocol.md`); fields shown only on `/metrics`, or
//! nowhere, may sit anywhere.

use super::index::{KeyHash, SPILL_KEY_BYTES};
use super::log::{BLOCK, HOT, RECENT_BLOCKS};
use super::Inner;
use crate::histogram::HistogramSnapshot;
use crate::io::Disk;
use crate::tier::{CounterKind, MetricName, StatName, TierCounter};

/// Declares [`HybridStats`]: its fields (all `u64`), what each shows as,
/// and the field-by-field code (the list, the sum) made from them.
macro_rules! hybrid_stats {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $(
                $(#[doc = $doc:literal])*
                $field:ident: $kind:ident
                    $(, stat($stat:literal, $unit:literal, $meaning:literal))?
                    $(, metric($metric:literal, $help:literal))?;
            )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name {
            $($(#[doc = $doc])* pub $field: u64,)+
        }

        impl $name {
            /// Every field as a named value, in the order declared.
            fn fields(&self) -> Vec<TierCounter> {
                vec![$(TierCounter {
                    name: stringify!($field),
                    kind: CounterKind::$kind,
                    value: self.$field,
                    stat: None$(.or(Some(StatName {
                        name: $stat,
                        unit: $unit,
                        meaning: $meaning,
                    })))?,
                    metric: None$(.or(Some(MetricName {
                        name: $metric,
                        help: $help,
                    })))?,
                },)+]
            }

            /// Adds `other`'s values to these (what the server does to sum
            /// its shards).
            pub fn add(&mut self, other: &$name) {
                $(self.$field = self.$field.saturating_add(other.$field);)+
            }

            /// Sets the field named `name`; false when there is none.
            #[cfg(test)]
            fn set(&mut self, name: &str, value: u64) -> bool {
                match name {
                    $(stringify!($field) => self.$field = value,)+
                    _ => return false,
                }
                true
            }
        }
    };
}

hybrid_stats! {
    /// Counters of the hybrid tier (for STATS and `/metrics`).
    pub struct HybridStats {
        /// Keys in the index (unresolved entries left out).
        keys: Gauge;
        index_bytes: Gauge,
            stat("index_bytes", "bytes", "Bytes of RAM the hybrid index holds (slots, overflow marks, spilled keys)."),
            metric("ringkv_tier_index_bytes", "Bytes of RAM the hybrid index holds.");
        cache_bytes: Gauge,
            stat("cache_bytes", "bytes", "Bytes of RAM the read cache holds (records and their bookkeeping)."),
            metric("ringkv_tier_cache_bytes", "Bytes of RAM the hybrid read cache holds.");
        cache_records: Gauge;
        segments: Gauge,
            stat("segments", "segments", "Value segment files."),
            metric("ringkv_tier_segments", "Value segment files.");
        segment_bytes: Gauge,
            stat("segment_bytes", "bytes", "Bytes of value segment files that hold records."),
            metric("ringkv_tier_segment_bytes", "Bytes of value segment files that hold records.");
        live_bytes: Gauge,
            stat("live_bytes", "bytes", "Record bytes the index points to (the rest is garbage GC reclaims)."),
            metric("ringkv_tier_live_bytes", "Record bytes the index points to.");
        /// Record bytes appended to the open segments (live or not).
        record_bytes: Gauge,
            metric("ringkv_tier_record_bytes", "Record bytes in value segments, live or not.");
        gc_runs: Counter,
            stat("gc_runs", "passes", "GC passes (one victim segment each) since start."),
            metric("ringkv_tier_gc_runs_total", "GC passes (one victim segment each).");
        gc_bytes_read: Counter,
            stat("gc_bytes_read", "bytes", "Bytes GC read from victim segments since start."),
            metric("ringkv_tier_gc_read_bytes_total", "Bytes GC read from victim segments.");
        gc_bytes_written: Counter,
            stat("gc_bytes_written", "bytes", "Bytes of live records GC wrote again since start."),
            metric("ringkv_tier_gc_written_bytes_total", "Bytes of live records GC wrote again.");
        cache_hits: Counter,
            stat("cache_hits", "reads", "Reads answered by the read cache since start."),
            metric("ringkv_tier_cache_hits_total", "Reads answered by the read cache.");
        cache_misses: Counter,
            stat("cache_misses", "reads", "Reads the read cache could not answer since start."),
            metric("ringkv_tier_cache_misses_total", "Reads the read cache could not answer.");
        device_reads: Counter,
            stat("cold_reads", "reads", "Device reads of value segments since start (cold GETs, key checks, GC)."),
            metric("ringkv_tier_cold_reads_total", "Device reads of value segments.");
        device_bytes_read: Counter;
        device_bytes_written: Counter;
        read_errors: Counter,
            stat("read_errors", "reads", "Reads answered VALUE_UNREADABLE (device error or checksum mismatch) since start."),
            metric("ringkv_tier_read_errors_total", "Reads answered VALUE_UNREADABLE.");
        spilled_keys: Gauge,
            stat("spilled_keys", "keys", "Keys past the index's sized capacity (storage.index_keys), at ~40 bytes each."),
            metric("ringkv_tier_spilled_keys", "Keys past the index's sized capacity.");
        /// Entries blind writes left unresolved.
        unresolved_entries: Gauge,
            stat("unresolved_entries", "entries", "Index entries a blind write left unresolved (nearly all older versions of keys written since; GC settles them). `keys` leaves them out."),
            metric("ringkv_tier_unresolved_entries", "Index entries a blind write left unresolved (GC settles them).");
        /// Keys deleted without reading whose older entries are still in the
        /// index (unresolved, dead; GC settles them).
        deleted_keys: Gauge,
            stat("deleted_keys", "keys", "Keys deleted without a device read whose older entries are still in the index (unresolved, dead; the delete's answer read or GC settles them). Bounded at a 32nd of storage.index_keys per shard, plus the deletes whose answer reads are open."),
            metric("ringkv_tier_deleted_keys", "Keys deleted without a device read whose older entries GC has not settled yet.");
        /// Settling reads finished: reads of the older records of keys put
        /// while the unresolved set was full, made after the put.
        settles_done: Counter,
            stat("settles_done", "reads", "Settling reads finished since start: after a put made while the unresolved entries were at their bound, a read of its key's older record, which then goes."),
            metric("ringkv_tier_settles_total", "Settling reads finished (the older records of keys put past the unresolved bound).");
        /// RAM of the expiry list (an (expiry, address) pair per record with
        /// an expiry time the index may point at).
        expiry_bytes: Gauge;
        /// Pairs in the expiry list.
        expiry_pairs: Gauge;
        /// RAM of the unresolved entries' and deleted keys' sets.
        blind_sets_bytes: Gauge;
        /// Segment files on the hot device (a part of `segments`; 0 with no
        /// hot device), their bytes, and the live record bytes in them.
        hot_segments: Gauge,
            stat("hot_segments", "segments", "Value segment files on the hot device (storage.hot_device; part of `segments`, 0 without one)."),
            metric("ringkv_tier_hot_segments", "Value segment files on the hot device.");
        hot_segment_bytes: Gauge,
            stat("hot_segment_bytes", "bytes", "Bytes of value segment files on the hot device (emptied ones too, until removed)."),
            metric("ringkv_tier_hot_segment_bytes", "Bytes of value segment files on the hot device.");
        hot_live_bytes: Gauge,
            stat("hot_live_bytes", "bytes", "Record bytes on the hot device the index points to (part of `live_bytes`)."),
            metric("ringkv_tier_hot_live_bytes", "Record bytes on the hot device the index points to.");
        /// Device reads of hot segments (a part of `device_reads`).
        hot_reads: Counter,
            stat("hot_reads", "reads", "Device reads of hot segments since start (part of `cold_reads`; the rest read the value device)."),
            metric("ringkv_tier_hot_reads_total", "Device reads of value segments on the hot device.");
        /// Records copied from the cold device to the hot one on a read, and
        /// their bytes.
        promotions: Counter,
            stat("promotions", "records", "Records copied from the value device to the hot device since start (read often lately)."),
            metric("ringkv_tier_promotions_total", "Records copied from the value device to the hot device.");
        promoted_bytes: Counter,
            metric("ringkv_tier_promoted_bytes_total", "Bytes of records copied from the value device to the hot device.");
        /// Records GC moved from the hot device to the cold one, and their
        /// bytes.
        demotions: Counter,
            stat("demotions", "records", "Records GC moved from the hot device to the value device since start (not read lately)."),
            metric("ringkv_tier_demotions_total", "Records GC moved from the hot device to the value device.");
        demoted_bytes: Counter,
            metric("ringkv_tier_demoted_bytes_total", "Bytes of records GC moved from the hot device to the value device.");
        /// Moves held back by `storage.hot_move_percent`: copies up skipped,
        /// and waits of GC before a step through a hot segment.
        move_waits: Counter,
            stat("move_waits", "waits", "Moves held back by storage.hot_move_percent since start: copies up skipped, and GC waits before a step through a hot segment."),
            metric("ringkv_tier_move_waits_total", "Moves between devices held back by storage.hot_move_percent.");
        /// Value segments found cut short when the shard opened, and the keys
        /// whose values lay past their ends then (after the WAL replay; keys
        /// written or deleted since are not taken off).
        damaged_segments_at_start: Gauge;
        unreadable_keys_at_start: Gauge,
            metric("ringkv_tier_unreadable_keys_at_start", "Keys whose values lay past the end of value segments found cut short when the shard opened.");
    }
}

/// A STATS value worked out from the fields (on a sum of shards, so the
/// ratios are of the sums), shown right after the field `after`.
struct Derived {
    after: &'static str,
    stat: StatName,
    value: fn(&HybridStats, &HistogramSnapshot) -> u64,
}

/// The worked-out values; the cold read latencies come from the shards'
/// latency histogram, which the shard keeps beside these counters.
const DERIVED: &[Derived] = &[
    Derived {
        after: "cache_bytes",
        stat: StatName {
            name: "index_millibytes_per_key",
            unit: "millibytes",
            meaning: "Index RAM per key, in thousandths of a byte (7100 = 7.1 bytes per key).",
        },
        value: |h, _| {
            h.index_bytes
                .saturating_mul(1000)
                .checked_div(h.keys)
                .unwrap_or(0)
        },
    },
    Derived {
        after: "cache_bytes",
        stat: StatName {
            name: "cache_millibytes_per_key",
            unit: "millibytes",
            meaning: "Cache RAM per key, in thousandths of a byte.",
        },
        value: |h, _| {
            h.cache_bytes
                .saturating_mul(1000)
                .checked_div(h.keys)
                .unwrap_or(0)
        },
    },
    Derived {
        after: "live_bytes",
        stat: StatName {
            name: "live_percent",
            unit: "percent",
            meaning: "Live record bytes as a percent of record bytes in segments.",
        },
        value: |h, _| {
            h.live_bytes
                .saturating_mul(100)
                .checked_div(h.record_bytes)
                .map_or(0, |p| p.min(100))
        },
    },
    Derived {
        after: "cache_misses",
        stat: StatName {
            name: "cache_hit_percent",
            unit: "percent",
            meaning: "Cache hits as a percent of cache lookups since start.",
        },
        value: |h, _| {
            h.cache_hits
                .saturating_mul(100)
                .checked_div(h.cache_hits.saturating_add(h.cache_misses))
                .unwrap_or(0)
        },
    },
    Derived {
        after: "device_reads",
        stat: StatName {
            name: "cold_read_p50_us",
            unit: "microseconds",
            meaning: "Median latency of a cold read since start (upper bucket bound).",
        },
        value: |_, latency| quantile(latency, 0.5),
    },
    Derived {
        after: "device_reads",
        stat: StatName {
            name: "cold_read_p99_us",
            unit: "microseconds",
            meaning: "99th percentile latency of a cold read since start (upper bucket bound).",
        },
        value: |_, latency| quantile(latency, 0.99),
    },
];

/// A quantile of the cold read latencies (0 before any read).
fn quantile(latency: &HistogramSnapshot, q: f64) -> u64 {
    if latency.count() > 0 {
        latency.quantile(q)
    } else {
        0
    }
}

impl HybridStats {
    /// Every value, named: each field, and after the field it follows each
    /// STATS value worked out from them. `cold_read_latency_us` is the
    /// latency histogram of the same shards (`ShardMetrics`); only the
    /// worked-out latencies read it.
    pub fn counters(&self, cold_read_latency_us: &HistogramSnapshot) -> Vec<TierCounter> {
        let mut out = Vec::with_capacity(48);
        for field in self.fields() {
            let name = field.name;
            out.push(field);
            for d in DERIVED.iter().filter(|d| d.after == name) {
                out.push(TierCounter {
                    name: d.stat.name,
                    kind: CounterKind::Gauge,
                    value: (d.value)(self, cold_read_latency_us),
                    stat: Some(d.stat),
                    metric: None,
                });
            }
        }
        out
    }
}

impl<D: Disk> Inner<D> {
    /// The counters now (see the list above: a counter added there gets
    /// its value here).
    pub(super) fn stats(&self) -> HybridStats {
        let segs = self.log.segs.iter().flatten();
        let (mut segments, mut bytes, mut records, mut live) = (0, 0, 0, 0);
        for s in segs {
            segments += 1;
            bytes += s.end;
            records += s.total_bytes;
            live += s.live_bytes.min(s.total_bytes);
        }
        let hot = self.device_use(HOT);
        let t = self.tiering.as_ref();
        HybridStats {
            keys: self
                .index
                .len()
                .saturating_sub(self.blind.unresolved.len() as u64),
            index_bytes: self.index.memory_bytes(),
            cache_bytes: self.cache.bytes(),
            cache_records: self.cache.len() as u64,
            cache_hits: self.cache.hits,
            cache_misses: self.cache.misses,
            segments,
            segment_bytes: bytes,
            record_bytes: records,
            live_bytes: live,
            device_reads: self.log.reads,
            device_bytes_read: self.log.bytes_read,
            device_bytes_written: self.log.bytes_written,
            gc_runs: self.gc.runs,
            gc_bytes_read: self.gc.bytes_read,
            gc_bytes_written: self.gc.bytes_written,
            read_errors: self.faults.read_error_count,
            spilled_keys: self.index.spilled(),
            unresolved_entries: self.blind.unresolved.len() as u64,
            deleted_keys: self.blind.deleted.len() as u64,
            settles_done: self.settling.settles_done,
            expiry_bytes: self.expiring.memory_bytes(),
            expiry_pairs: self.expiring.len() as u64,
            blind_sets_bytes: self.blind.memory_bytes(),
            hot_segments: hot.segments,
            hot_segment_bytes: hot.file_bytes,
            hot_live_bytes: hot.live_bytes,
            hot_reads: self.log.hot_reads,
            promotions: t.map_or(0, |t| t.promotions),
            promoted_bytes: t.map_or(0, |t| t.promoted_bytes),
            demotions: t.map_or(0, |t| t.demotions),
            demoted_bytes: t.map_or(0, |t| t.demoted_bytes),
            move_waits: t.map_or(0, |t| t.move_waits),
            damaged_segments_at_start: self.loading.damage.len() as u64,
            unreadable_keys_at_start: self.loading.damage.iter().map(|d| d.keys).sum(),
        }
    }

    /// The read cache counts at its bound, full or not: reads fill it with
    /// no check against a memory limit, so a write must not take its room.
    /// RAM the tier holds ([`Tier::memory_bytes`]).
    pub(super) fn memory_bytes(&self) -> u64 {
        self.index.memory_bytes()
            + self.tiering.as_ref().map_or(0, |t| t.admission.memory_bytes())
            + self.cache.budget()
            + self.expiring.memory_bytes()
            + self.blind.memory_bytes()
            // The write buffer of each device's open segment.
            + (1 << 20) * (1 + u64::from(self.log.has_hot()))
            + (RECENT_BLOCKS * BLOCK) as u64
    }

    /// The value goes to a segment on the device, not to RAM. A put may add
    /// an index entry (a blind write keeps the older ones unresolved until
    /// GC settles them), which costs RAM only once its partition's fixed
    /// slots are all taken (a spilled entry); an expiry time adds its
    /// pair to the expiry list. Overwrites count the same (whether the key is there
    /// may need a device read). A blind write leaves the entries it could
    /// not tell apart in the unresolved set, which may have to grow.
    pub(super) fn put_growth_bytes(&self, hash: u64, expires_at_ms: Option<u64>) -> i64 {
        let h = KeyHash::new(hash);
        let spill = if self.index.insert_would_spill(h) {
            SPILL_KEY_BYTES
        } else {
            0
        };
        let expiry = expires_at_ms.map_or(0, |at| self.expiring.insert_growth_bytes(at));
        let unresolved = self
            .blind
            .unresolved_growth_bytes(self.index.candidate_count(h));
        (spill + expiry) as i64 + unresolved as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn names(
        list: &[TierCounter],
        f: impl Fn(&TierCounter) -> Option<&'static str>,
    ) -> Vec<&'static str> {
        list.iter().filter_map(f).collect()
    }

    fn unique(v: &[&str]) {
        let set: HashSet<&&str> = v.iter().collect();
        assert_eq!(set.len(), v.len(), "a name is used twice: {v:?}");
    }

    #[test]
    fn names_are_unique_and_every_worked_out_value_follows_a_field() {
        let list = HybridStats::default().counters(&HistogramSnapshot::default());
        unique(&names(&list, |c| Some(c.name)));
        unique(&names(&list, |c| c.stat.map(|s| s.name)));
        unique(&names(&list, |c| c.metric.map(|m| m.name)));
        let fields = HybridStats::default().fields();
        for d in DERIVED {
            assert!(fields.iter().any(|f| f.name == d.after), "{}", d.after);
        }
        assert_eq!(list.len(), fields.len() + DERIVED.len());
        for c in &list {
            if let Some(m) = c.metric {
                let total = m.name.ends_with("_total");
                assert_eq!(total, c.kind == CounterKind::Counter, "{}", m.name);
            }
        }
    }

    #[test]
    fn every_field_is_listed_once_with_its_value() {
        let mut s = HybridStats::default();
        let fields = s.fields();
        for (i, f) in fields.iter().enumerate() {
            assert!(s.set(f.name, i as u64 + 1), "{}", f.name);
        }
        // Each field holds its own number: a field listed twice, or one
        // listed with another's value, would show here.
        for (i, f) in s.fields().iter().enumerate() {
            assert_eq!(f.value, i as u64 + 1, "{}", f.name);
        }
        assert_ne!(s, HybridStats::default());
        assert!(!s.set("no_such_field", 1));
    }

    #[test]
    fn add_sums_every_field() {
        let mut a = HybridStats::default();
        let mut b = HybridStats::default();
        for (i, f) in a.fields().iter().enumerate() {
            a.set(f.name, i as u64 + 1);
            b.set(f.name, 100 * (i as u64 + 1));
        }
        let mut sum = a;
        sum.add(&b);
        for (i, f) in sum.fields().iter().enumerate() {
            assert_eq!(f.value, 101 * (i as u64 + 1), "{}", f.name);
        }
    }

    #[test]
    fn worked_out_values_are_of_the_sums() {
        let mut a = HybridStats {
            keys: 1000,
            index_bytes: 7100,
            live_bytes: 50,
            record_bytes: 100,
            cache_hits: 3,
            cache_misses: 1,
            ..HybridStats::default()
        };
        let b = a;
        a.add(&b);
        let list = a.counters(&HistogramSnapshot::default());
        let stat = |name: &str| {
            list.iter()
                .find(|c| c.stat.is_some_and(|s| s.name == name))
                .map(|c| c.value)
                .unwrap()
        };
        assert_eq!(stat("index_millibytes_per_key"), 7100);
        assert_eq!(stat("live_percent"), 50);
        assert_eq!(stat("cache_hit_percent"), 75);
        assert_eq!(stat("cold_read_p99_us"), 0);
        assert_eq!(stat("cold_reads"), 0);
    }
}
