//! "Did you mean ...?": the nearest known name to a mistyped one.
//!
//! Must hold: a suggestion is only made when it is close enough to be a
//! plausible typo; an unrelated word gets no suggestion rather than a silly one.

/// Lower-cases and maps '-' to '_' so "Wal-Segment-Size" finds "wal_segment_size".
fn normalize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c == '-' {
                '_'
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect()
}

/// The candidate nearest to `typed` by Damerau-Levenshtein distance (after
/// normalizing case and dashes), if it is within `max(1, len / 3)` edits.
/// Ties go to the earlier candidate.
pub(crate) fn nearest<'a, I>(typed: &str, candidates: I) -> Option<String>
where
    I: IntoIterator<Item = &'a str>,
{
    let typed_n = normalize(typed);
    let limit = (typed_n.chars().count() / 3).max(1);
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        let d = strsim::damerau_levenshtein(&typed_n, &normalize(c));
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_find_their_key() {
        let keys = ["durability", "data_dir", "tier", "wal_segment_size"];
        assert_eq!(nearest("durabilty", keys).as_deref(), Some("durability"));
        assert_eq!(nearest("teir", keys).as_deref(), Some("tier"));
        assert_eq!(
            nearest("Wal-Segment-Size", keys).as_deref(),
            Some("wal_segment_size")
        );
        assert_eq!(
            nearest("walsegmentsize", keys).as_deref(),
            Some("wal_segment_size")
        );
    }

    #[test]
    fn unrelated_words_get_no_suggestion() {
        let keys = ["durability", "data_dir", "tier"];
        assert_eq!(nearest("compression", keys), None);
        assert_eq!(nearest("x", keys), None);
    }
}
