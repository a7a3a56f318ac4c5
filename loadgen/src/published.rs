//! Figures published by the seed documents, kept here with where each one
//! comes from, so tables and charts can print them beside ringkv's own.
//!
//! What must hold: every number is copied from its document unchanged (the
//! unit is the document's); a missing cell in the document is `None` here,
//! never a guess. These numbers were measured on other hardware: whatever
//! prints them says "published, other hardware".

/// Where the sweep figures come from.
pub const SWEEP_SOURCE: &str = "\"Offheap Store Performance Benchmark\" (MapDB / ChronicleMap), \
section \"Test result\": one table per cloud disk class, write (W) and read (R) of N items, \
nanoseconds";

/// Short form printed next to every published row.
pub const PUBLISHED_LABEL: &str = "published, other hardware";

/// The sizes of the document's columns (10K ... 50M items).
pub const SWEEP_SIZES: [u64; 5] = [10_000, 100_000, 1_000_000, 10_000_000, 50_000_000];

/// One published row: a store's write or read times for each size of
/// [`SWEEP_SIZES`], on one disk class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepRow {
    /// The loadgen device class the document's table corresponds to.
    pub device: &'static str,
    /// The table's heading in the document (its own words).
    pub document_class: &'static str,
    /// "MapDB" or "ChronicleMap".
    pub store: &'static str,
    /// "write" or "read" (the document's W and R).
    pub operation: &'static str,
    /// Nanoseconds per size; `None` where the document's cell is empty.
    pub ns: [Option<u64>; 5],
}

impl SweepRow {
    /// The document's row label, e.g. "MapDB(W)".
    pub fn label(&self) -> String {
        let letter = if self.operation == "write" { "W" } else { "R" };
        format!("{}({letter})", self.store)
    }

    /// The published time for `items`, if the document has that column and cell.
    pub fn at(&self, items: u64) -> Option<u64> {
        let column = SWEEP_SIZES.iter().position(|&n| n == items)?;
        self.ns[column]
    }
}

const SAS: &str = "高IO - SAS (IOPS limit 1,800, burst 5,000)";
const GPSSD: &str = "通用型SSD - GPSSD (IOPS limit 2,300, burst 8,000)";
const SSD: &str = "超高IO - SSD (IOPS limit 6,500, burst 16,000)";

/// Every row of the document's three tables. MapDB has no 50M figure in
/// the document (its cells are empty).
pub const SWEEP: [SweepRow; 12] = [
    SweepRow {
        device: "sas",
        document_class: SAS,
        store: "MapDB",
        operation: "write",
        ns: [
            Some(37_584_770),
            Some(253_219_604),
            Some(1_905_269_137),
            Some(31_101_750_491),
            None,
        ],
    },
    SweepRow {
        device: "sas",
        document_class: SAS,
        store: "MapDB",
        operation: "read",
        ns: [
            Some(35_282_173),
            Some(278_026_460),
            Some(1_829_999_883),
            Some(25_191_501_020),
            None,
        ],
    },
    SweepRow {
        device: "sas",
        document_class: SAS,
        store: "ChronicleMap",
        operation: "write",
        ns: [
            Some(181_770_196),
            Some(576_221_796),
            Some(3_644_390_396),
            Some(48_709_053_791),
            Some(355_514_017_130),
        ],
    },
    SweepRow {
        device: "sas",
        document_class: SAS,
        store: "ChronicleMap",
        operation: "read",
        ns: [
            Some(95_215_281),
            Some(347_267_463),
            Some(1_959_736_493),
            Some(18_450_060_515),
            Some(89_740_821_302),
        ],
    },
    SweepRow {
        device: "gpssd",
        document_class: GPSSD,
        store: "MapDB",
        operation: "write",
        ns: [
            Some(40_376_008),
            Some(255_707_438),
            Some(1_876_907_352),
            Some(31_692_810_149),
            None,
        ],
    },
    SweepRow {
        device: "gpssd",
        document_class: GPSSD,
        store: "MapDB",
        operation: "read",
        ns: [
            Some(27_448_796),
            Some(226_203_656),
            Some(1_848_050_799),
            Some(26_478_899_168),
            None,
        ],
    },
    SweepRow {
        device: "gpssd",
        document_class: GPSSD,
        store: "ChronicleMap",
        operation: "write",
        ns: [
            Some(230_567_163),
            Some(585_120_010),
            Some(3_983_323_047),
            Some(37_181_110_409),
            Some(239_614_024_885),
        ],
    },
    SweepRow {
        device: "gpssd",
        document_class: GPSSD,
        store: "ChronicleMap",
        operation: "read",
        ns: [
            Some(107_263_033),
            Some(351_693_637),
            Some(2_072_631_422),
            Some(19_186_194_044),
            Some(91_854_562_988),
        ],
    },
    SweepRow {
        device: "nvme",
        document_class: SSD,
        store: "MapDB",
        operation: "write",
        ns: [
            Some(24_414_392),
            Some(241_636_276),
            Some(1_710_527_536),
            Some(25_158_254_950),
            None,
        ],
    },
    SweepRow {
        device: "nvme",
        document_class: SSD,
        store: "MapDB",
        operation: "read",
        ns: [
            Some(18_135_518),
            Some(190_535_648),
            Some(1_726_740_772),
            Some(24_883_570_860),
            None,
        ],
    },
    SweepRow {
        device: "nvme",
        document_class: SSD,
        store: "ChronicleMap",
        operation: "write",
        ns: [
            Some(106_815_321),
            Some(436_364_794),
            Some(3_855_152_122),
            Some(38_087_833_316),
            Some(206_487_973_496),
        ],
    },
    SweepRow {
        device: "nvme",
        document_class: SSD,
        store: "ChronicleMap",
        operation: "read",
        ns: [
            Some(42_593_050),
            Some(275_962_770),
            Some(2_093_011_499),
            Some(20_171_377_215),
            Some(91_046_667_947),
        ],
    },
];

/// The published rows of one device class, in the document's order.
pub fn sweep_rows(device: &str) -> impl Iterator<Item = &'static SweepRow> + '_ {
    SWEEP.iter().filter(move |r| r.device == device)
}

/// The fastest published time for (device, operation, items) and its store.
pub fn best_published(device: &str, operation: &str, items: u64) -> Option<(&'static str, u64)> {
    sweep_rows(device)
        .filter(|r| r.operation == operation)
        .filter_map(|r| r.at(items).map(|ns| (r.store, ns)))
        .min_by_key(|&(_, ns)| ns)
}

/// Where the PutGetTx numbers come from (seed document 004).
pub const PUTGETTX_SOURCE: &str = "Apache Ignite vs Hazelcast, pessimistic transactions \
    (Yardstick IgnitePutGetTxBenchmark / HazelcastPutGetTxPessimisticBenchmark), \
    4 AWS c4.2xlarge servers + 1 client";
/// The label of the published PutGetTx rows.
pub const PUTGETTX_LABEL: &str = "published, 4 servers";
/// Transactions per second the document reports, by product.
pub const PUTGETTX: [(&str, u64); 2] = [("Apache Ignite", 16_500), ("Hazelcast", 11_000)];

/// Where the put/get numbers come from (seed document 000).
pub const PUTGET_SOURCE: &str = "GridGain 9.1.1 vs 8.9.20 YCSB report (batched put/get, \
    batches of 1,000 records of 10 x 100 B), GridGain 9.1.1 columns, 2 servers";
/// The system the published put/get rows measured.
pub const PUTGET_SYSTEM: &str = "GridGain 9.1.1";
/// The label of the published put/get rows.
pub const PUTGET_LABEL: &str = "published, 2 servers";

/// One published put/get row: operations per second for a storage mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PutGetRow {
    /// "RAM Only" or "RAM+Disk" (the report's words).
    pub storage: &'static str,
    /// "put" or "get".
    pub operation: &'static str,
    pub ops_per_sec: u64,
}

/// The report's throughput rows (its unit is 1000 ops/s: 366 is 366K).
pub const PUTGET: [PutGetRow; 4] = [
    PutGetRow {
        storage: "RAM+Disk",
        operation: "put",
        ops_per_sec: 366_000,
    },
    PutGetRow {
        storage: "RAM Only",
        operation: "put",
        ops_per_sec: 524_000,
    },
    PutGetRow {
        storage: "RAM+Disk",
        operation: "get",
        ops_per_sec: 766_000,
    },
    PutGetRow {
        storage: "RAM Only",
        operation: "get",
        ops_per_sec: 744_000,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_class_has_both_stores_both_operations() {
        for device in ["sas", "gpssd", "nvme"] {
            let rows: Vec<String> = sweep_rows(device).map(|r| r.label()).collect();
            assert_eq!(
                rows,
                ["MapDB(W)", "MapDB(R)", "ChronicleMap(W)", "ChronicleMap(R)"]
            );
        }
        assert_eq!(sweep_rows("unthrottled").count(), 0);
    }

    #[test]
    fn cells_match_the_document() {
        // Spot checks against the document's text, one per table.
        assert_eq!(SWEEP[0].at(10_000), Some(37_584_770));
        assert_eq!(SWEEP[6].at(50_000_000), Some(239_614_024_885));
        assert_eq!(SWEEP[11].at(1_000_000), Some(2_093_011_499));
        assert_eq!(SWEEP[8].at(50_000_000), None, "MapDB has no 50M cell");
        assert_eq!(SWEEP[8].at(1_234), None, "not a column of the document");
    }

    #[test]
    fn best_is_the_smaller_of_the_two_stores() {
        assert_eq!(
            best_published("nvme", "write", 10_000),
            Some(("MapDB", 24_414_392))
        );
        // 50M: only ChronicleMap has a figure.
        assert_eq!(
            best_published("sas", "read", 50_000_000),
            Some(("ChronicleMap", 89_740_821_302))
        );
        // gpssd 10M read: ChronicleMap (19.2 s) beats MapDB (26.5 s).
        assert_eq!(
            best_published("gpssd", "read", 10_000_000),
            Some(("ChronicleMap", 19_186_194_044))
        );
        assert_eq!(best_published("unthrottled", "read", 10_000), None);
    }
}
