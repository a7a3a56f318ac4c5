//! Redis's glob patterns (`stringmatchlen`): matching a key or a name
//! against `*`, `?`, `[abc]`, `[^a-z]` and `\\x`. Shared by the RESP
//! commands (CONFIG GET, KEYS, SCAN MATCH) and the native protocol's SCAN.
//!
//! What must hold: no pattern costs more than O(pattern × text) steps
//! (backtracking goes to the last `*` only), and a pattern with more than
//! [`GLOB_STARS_MAX`] separate `*` matches nothing, as in Redis.

/// Redis's glob match (`stringmatchlen`) for CONFIG GET, KEYS and SCAN:
/// `*`, `?`, `[abc]`, `[^a-z]`, `\\x`; case-insensitive for CONFIG GET only
/// (`nocase`). Linear backtracking to the last `*` only, so no pattern costs
/// more than O(pattern × text); like Redis, a pattern that nests more than
/// 1000 `*` matches nothing.
pub fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    glob(pattern, text, false)
}

/// [`glob_match`] ignoring ASCII case.
pub fn glob_match_nocase(pattern: &[u8], text: &[u8]) -> bool {
    glob(pattern, text, true)
}

/// Most separate `*` a pattern may hold; one with more matches nothing.
pub const GLOB_STARS_MAX: usize = 1000;

fn glob(pattern: &[u8], text: &[u8], nocase: bool) -> bool {
    let fold = |c: u8| if nocase { c.to_ascii_lowercase() } else { c };
    let mut stars = 0;
    let mut i = 0;
    while i < pattern.len() {
        match pattern[i] {
            b'\\' => i += 1,
            b'*' if i + 1 < pattern.len() && pattern[i + 1] != b'*' => stars += 1,
            _ => {}
        }
        i += 1;
    }
    if stars > GLOB_STARS_MAX {
        return false;
    }
    let (mut p, mut t) = (0usize, 0usize);
    // (pattern index after the last star, text index it is tried at)
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() {
            if pattern[p] == b'*' {
                while p < pattern.len() && pattern[p] == b'*' {
                    p += 1;
                }
                if p == pattern.len() {
                    return true;
                }
                star = Some((p, t));
                continue;
            }
            let (matched, next) = glob_one(pattern, p, fold(text[t]), fold);
            if matched {
                p = next;
                t += 1;
                continue;
            }
        }
        match star {
            Some((sp, st)) => {
                p = sp;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    while p < pattern.len() && pattern[p] == b'*' {
        p += 1;
    }
    p == pattern.len()
}

/// Whether the pattern token at `p` matches the character `c`, and where
/// the next token starts.
fn glob_one(pattern: &[u8], mut p: usize, c: u8, fold: impl Fn(u8) -> u8) -> (bool, usize) {
    match pattern[p] {
        b'?' => (true, p + 1),
        b'\\' if p + 1 < pattern.len() => (fold(pattern[p + 1]) == c, p + 2),
        b'[' => {
            p += 1;
            let negate = p < pattern.len() && pattern[p] == b'^';
            if negate {
                p += 1;
            }
            let mut matched = false;
            while p < pattern.len() && pattern[p] != b']' {
                if pattern[p] == b'\\' && p + 1 < pattern.len() {
                    p += 1;
                    matched |= fold(pattern[p]) == c;
                } else if p + 2 < pattern.len() && pattern[p + 1] == b'-' && pattern[p + 2] != b']'
                {
                    let (a, b) = (fold(pattern[p]), fold(pattern[p + 2]));
                    let (a, b) = if a <= b { (a, b) } else { (b, a) };
                    matched |= (a..=b).contains(&c);
                    p += 2;
                } else {
                    matched |= fold(pattern[p]) == c;
                }
                p += 1;
            }
            // Past the closing ']' (an unclosed class ends the pattern).
            (matched != negate, (p + 1).min(pattern.len()))
        }
        other => (fold(other) == c, p + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match(b"*", b"anything"));
        assert!(glob_match(b"append*", b"appendonly"));
        assert!(glob_match_nocase(b"SAVE", b"save"));
        assert!(!glob_match(b"SAVE", b"save"));
        assert!(!glob_match(
            b"a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b",
            &[b'a'; 40]
        ));
        assert!(!glob_match(&b"*?".repeat(50_000), &[b'a'; 50_000]));
        assert!(glob_match(b"h?llo", b"hello"));
        assert!(glob_match(b"h*llo", b"heeeello"));
        assert!(!glob_match(b"h*llo", b"heeeellx"));
        assert!(glob_match(b"h\\*llo", b"h*llo"));
        assert!(glob_match(b"*b", b"aab"));
        assert!(glob_match(b"a*", b"a"));
        assert!(glob_match(b"s?ve", b"save"));
        assert!(glob_match(b"[abc]x", b"bx"));
        assert!(!glob_match(b"[^abc]x", b"bx"));
        assert!(glob_match(b"[a-c]x", b"bx"));
        assert!(!glob_match(b"save", b"saves"));
        assert!(glob_match(&[b'*'; 200], b"ab"));
        assert!(glob_match(b"*a*b*c", b"xxaxxbxxc"));
    }
}
