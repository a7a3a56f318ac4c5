//! The read-modify-write string commands as engine update functions
//! ([`engine::UpdateFn`]): each runs on the key's shard in one step, so
//! INCR, APPEND, SETNX, GETSET... are atomic per key, and its write goes to
//! the WAL like any put.
//!
//! What must hold: these functions are pure, quick and never panic (they
//! run on a shard thread); they never build a value larger than the caller
//! checked (SETRANGE's offset is bounded before the op is sent, APPEND's
//! result is bounded by the engine's `value_bytes_max` check); the error
//! texts are Redis's.

use bytes::Bytes;
use engine::{Current, UpdateAnswer, UpdateOutcome, UpdateWrite};

pub const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
pub const OVERFLOW: &str = "ERR increment or decrement would overflow";
pub const NOT_FLOAT: &str = "ERR value is not a valid float";
pub const NAN_OR_INFINITY: &str = "ERR increment would produce NaN or Infinity";

/// Flag bits of [`set`] (its `number`).
pub const SET_NX: i64 = 1;
pub const SET_XX: i64 = 2;
pub const SET_GET: i64 = 4;

fn keep(answer: UpdateAnswer) -> UpdateOutcome {
    UpdateOutcome {
        write: UpdateWrite::Keep,
        answer,
    }
}

fn put(value: Bytes, answer: UpdateAnswer) -> UpdateOutcome {
    UpdateOutcome {
        write: UpdateWrite::Put(value),
        answer,
    }
}

/// SET with NX / XX / GET (`flags`): writes `arg` when the condition holds;
/// answers OK / nil, or with GET the old value.
pub fn set(current: Option<Bytes>, arg: &Bytes, flags: i64) -> UpdateOutcome {
    let exists = current.is_some();
    let write = !((flags & SET_NX != 0 && exists) || (flags & SET_XX != 0 && !exists));
    let answer = if flags & SET_GET != 0 {
        current.map_or(UpdateAnswer::Nil, UpdateAnswer::Value)
    } else if write {
        UpdateAnswer::Ok
    } else {
        UpdateAnswer::Nil
    };
    if write {
        // A SET (and GETSET) without KEEPTTL removes any expiry time.
        UpdateOutcome {
            write: UpdateWrite::PutExpiring(arg.clone(), None),
            answer,
        }
    } else {
        keep(answer)
    }
}

/// SETNX: 1 if `arg` was written, 0 if the key existed.
pub fn set_nx(current: Option<Bytes>, arg: &Bytes, _: i64) -> UpdateOutcome {
    match current {
        Some(_) => keep(UpdateAnswer::Int(0)),
        None => put(arg.clone(), UpdateAnswer::Int(1)),
    }
}

/// GETDEL: removes the key, answering its value (nil if absent).
pub fn get_del(current: Option<Bytes>, _: &Bytes, _: i64) -> UpdateOutcome {
    match current {
        Some(v) => UpdateOutcome {
            write: UpdateWrite::Delete,
            answer: UpdateAnswer::Value(v),
        },
        None => keep(UpdateAnswer::Nil),
    }
}

/// Deletes the key if it still holds `arg` (the second half of RENAME);
/// answers 1 if it did.
pub fn delete_if_equal(current: Option<Bytes>, arg: &Bytes, _: i64) -> UpdateOutcome {
    match current {
        Some(v) if v == arg => UpdateOutcome {
            write: UpdateWrite::Delete,
            answer: UpdateAnswer::Int(1),
        },
        _ => keep(UpdateAnswer::Int(0)),
    }
}

/// Redis's `string2ll` on a stored value (at most 20 characters).
fn stored_integer(v: &[u8]) -> Option<i64> {
    if v.len() > 20 {
        return None;
    }
    ringkv_protocol::resp::parse_i64(v)
}

/// INCRBY / DECRBY (`delta`); an absent key counts as 0.
pub fn incr_by(current: Option<Bytes>, _: &Bytes, delta: i64) -> UpdateOutcome {
    let old = match current {
        None => 0,
        Some(v) => match stored_integer(&v) {
            Some(n) => n,
            None => return keep(UpdateAnswer::Refused(NOT_INTEGER)),
        },
    };
    match old.checked_add(delta) {
        Some(new) => put(Bytes::from(new.to_string()), UpdateAnswer::Int(new)),
        None => keep(UpdateAnswer::Refused(OVERFLOW)),
    }
}

/// Parses a float the way Redis accepts one: no spaces, not NaN, at most
/// 5 KiB of text.
pub fn parse_float(s: &[u8]) -> Option<f64> {
    if s.is_empty() || s.len() > 5 * 1024 {
        return None;
    }
    let text = std::str::from_utf8(s).ok()?;
    let v: f64 = text.parse().ok()?;
    (!v.is_nan()).then_some(v)
}

/// The text Redis would store for a float: the shortest form that reads
/// back to the same number, never in exponent notation, never "-0".
pub fn format_float(v: f64) -> String {
    format!("{}", v + 0.0)
}

/// INCRBYFLOAT (`arg` is the increment, already checked to be a float).
pub fn incr_by_float(current: Option<Bytes>, arg: &Bytes, _: i64) -> UpdateOutcome {
    let Some(delta) = parse_float(arg) else {
        return keep(UpdateAnswer::Refused(NOT_FLOAT));
    };
    let old = match current {
        None => 0.0,
        Some(v) => match parse_float(&v) {
            Some(n) => n,
            None => return keep(UpdateAnswer::Refused(NOT_FLOAT)),
        },
    };
    let new = old + delta;
    if !new.is_finite() {
        return keep(UpdateAnswer::Refused(NAN_OR_INFINITY));
    }
    let text = Bytes::from(format_float(new));
    put(text.clone(), UpdateAnswer::Value(text))
}

/// APPEND: the new length.
pub fn append(current: Option<Bytes>, arg: &Bytes, _: i64) -> UpdateOutcome {
    let mut v = Vec::with_capacity(current.as_ref().map_or(0, |c| c.len()) + arg.len());
    if let Some(c) = current {
        v.extend_from_slice(&c);
    }
    v.extend_from_slice(arg);
    let len = v.len() as i64;
    put(Bytes::from(v), UpdateAnswer::Int(len))
}

/// SETRANGE at `offset` (>= 0, with `offset + arg.len()` checked against
/// the value limit by the caller): the new length.
pub fn set_range(current: Option<Bytes>, arg: &Bytes, offset: i64) -> UpdateOutcome {
    let old_len = current.as_ref().map_or(0, |c| c.len());
    if arg.is_empty() {
        // Nothing to write: Redis answers the length and creates nothing.
        return keep(UpdateAnswer::Int(old_len as i64));
    }
    let offset = usize::try_from(offset).unwrap_or(usize::MAX);
    let end = offset.saturating_add(arg.len());
    let mut v = Vec::with_capacity(end.max(old_len));
    if let Some(c) = current {
        v.extend_from_slice(&c);
    }
    if v.len() < end {
        v.resize(end, 0);
    }
    v[offset..end].copy_from_slice(arg);
    let len = v.len() as i64;
    put(Bytes::from(v), UpdateAnswer::Int(len))
}

/// SETBIT: `packed` is `offset << 1 | bit`; the value grows with zero
/// bytes to hold the offset (bit 0 is the top bit of byte 0, as in
/// Redis); answers the bit's old value. Keeps the expiry time.
pub fn set_bit(current: Option<Bytes>, _: &Bytes, packed: i64) -> UpdateOutcome {
    let offset = (packed >> 1) as usize;
    let (byte, shift) = (offset / 8, 7 - offset % 8);
    let mut v = current.map_or_else(Vec::new, |c| c.to_vec());
    if v.len() <= byte {
        v.resize(byte + 1, 0);
    }
    let old = (v[byte] >> shift) & 1;
    if packed & 1 == 1 {
        v[byte] |= 1 << shift;
    } else {
        v[byte] &= !(1 << shift);
    }
    put(Bytes::from(v), UpdateAnswer::Int(i64::from(old)))
}

// --- Expiry commands ([`engine::TtlUpdateFn`]): they see the key's
// expiry time and the shard's clock. Expiry times are absolute Unix ms,
// computed by the planner from the command's arguments.

/// Flag of [`set_expiring`]'s first `arg` byte: keep the current expiry.
pub const SET_KEEPTTL: u8 = 8;

/// SET with an expiry option: `arg` is one byte of flags (`SET_NX`,
/// `SET_XX`, `SET_GET`, `SET_KEEPTTL`) then the value; `at` is the expiry
/// time (Unix ms; 0: none, and ignored with KEEPTTL).
pub fn set_expiring(current: Current, _now: u64, arg: &Bytes, at: i64) -> UpdateOutcome {
    let flags = arg.first().copied().unwrap_or(0);
    let value = arg.slice(1.min(arg.len())..);
    let exists = current.is_some();
    let nx = flags as i64 & SET_NX != 0;
    let xx = flags as i64 & SET_XX != 0;
    let write = !((nx && exists) || (xx && !exists));
    let answer = if flags as i64 & SET_GET != 0 {
        current
            .as_ref()
            .map_or(UpdateAnswer::Nil, |(v, _)| UpdateAnswer::Value(v.clone()))
    } else if write {
        UpdateAnswer::Ok
    } else {
        UpdateAnswer::Nil
    };
    if !write {
        return keep(answer);
    }
    let expiry = if flags & SET_KEEPTTL != 0 {
        current.and_then(|(_, at)| at)
    } else if at > 0 {
        Some(at as u64)
    } else {
        None
    };
    UpdateOutcome {
        write: UpdateWrite::PutExpiring(value, expiry),
        answer,
    }
}

/// EXPIRE's conditions (its `arg`'s first byte).
pub const EXPIRE_NX: u8 = 1;
pub const EXPIRE_XX: u8 = 2;
pub const EXPIRE_GT: u8 = 4;
pub const EXPIRE_LT: u8 = 8;

/// EXPIRE / PEXPIRE / EXPIREAT / PEXPIREAT: sets the expiry to `at` (Unix
/// ms; one not in the future deletes the key) when the condition holds;
/// answers 1 if it was set, 0 if not (missing key, condition false).
pub fn expire(current: Current, _now: u64, arg: &Bytes, at: i64) -> UpdateOutcome {
    let flags = arg.first().copied().unwrap_or(0);
    let Some((_, old)) = current else {
        return keep(UpdateAnswer::Int(0));
    };
    let new = at.max(1) as u64;
    // A key without an expiry counts as expiring never (infinitely late).
    let holds = match old {
        _ if flags & EXPIRE_NX != 0 => old.is_none(),
        None if flags & EXPIRE_XX != 0 => false,
        None => flags & EXPIRE_GT == 0,
        Some(old) if flags & EXPIRE_GT != 0 => new > old,
        Some(old) if flags & EXPIRE_LT != 0 => new < old,
        Some(_) => true,
    };
    if !holds {
        return keep(UpdateAnswer::Int(0));
    }
    UpdateOutcome {
        write: UpdateWrite::SetExpiry(Some(new)),
        answer: UpdateAnswer::Int(1),
    }
}

/// PERSIST: removes the expiry; 1 if there was one.
pub fn persist(current: Current, _now: u64, _: &Bytes, _: i64) -> UpdateOutcome {
    match current {
        Some((_, Some(_))) => UpdateOutcome {
            write: UpdateWrite::SetExpiry(None),
            answer: UpdateAnswer::Int(1),
        },
        _ => keep(UpdateAnswer::Int(0)),
    }
}

/// What [`ttl`] answers (its `number`).
pub const TTL_SECONDS: i64 = 0;
pub const TTL_MILLIS: i64 = 1;
pub const EXPIRETIME_SECONDS: i64 = 2;
pub const EXPIRETIME_MILLIS: i64 = 3;

/// TTL / PTTL / EXPIRETIME / PEXPIRETIME: -2 for a missing key, -1 for one
/// without an expiry time.
pub fn ttl(current: Current, now: u64, _: &Bytes, what: i64) -> UpdateOutcome {
    let answer = match current {
        None => -2,
        Some((_, None)) => -1,
        Some((_, Some(at))) => {
            let left = at.saturating_sub(now) as i64;
            match what {
                TTL_SECONDS => (left + 500) / 1000,
                TTL_MILLIS => left,
                EXPIRETIME_SECONDS => (at / 1000) as i64,
                _ => at as i64,
            }
        }
    };
    keep(UpdateAnswer::Int(answer))
}

/// GETEX's `arg` byte: remove the expiry (PERSIST).
pub const GETEX_PERSIST: u8 = 1;
/// GETEX's `arg` byte: set the expiry to `at`.
pub const GETEX_SET: u8 = 2;

/// GETEX: the value (nil if missing), and with an option a new expiry
/// (`at`, Unix ms) or none (PERSIST).
pub fn get_ex(current: Current, _now: u64, arg: &Bytes, at: i64) -> UpdateOutcome {
    let flags = arg.first().copied().unwrap_or(0);
    let Some((value, old)) = current else {
        return keep(UpdateAnswer::Nil);
    };
    let write = if flags & GETEX_SET != 0 {
        UpdateWrite::SetExpiry(Some(at.max(1) as u64))
    } else if flags & GETEX_PERSIST != 0 && old.is_some() {
        UpdateWrite::SetExpiry(None)
    } else {
        UpdateWrite::Keep
    };
    UpdateOutcome {
        write,
        answer: UpdateAnswer::Value(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn set_conditions() {
        let v = b("v");
        assert_eq!(set(None, &v, 0).answer, UpdateAnswer::Ok);
        assert_eq!(set(Some(b("o")), &v, SET_NX).write, UpdateWrite::Keep);
        assert_eq!(set(Some(b("o")), &v, SET_NX).answer, UpdateAnswer::Nil);
        assert_eq!(set(None, &v, SET_XX).write, UpdateWrite::Keep);
        // A SET writes the value without an expiry time (it clears one).
        assert_eq!(
            set(Some(b("o")), &v, SET_XX).write,
            UpdateWrite::PutExpiring(v.clone(), None)
        );
        let got = set(Some(b("o")), &v, SET_GET);
        assert_eq!(got.write, UpdateWrite::PutExpiring(v.clone(), None));
        assert_eq!(got.answer, UpdateAnswer::Value(b("o")));
        let got = set(Some(b("o")), &v, SET_NX | SET_GET);
        assert_eq!(got.write, UpdateWrite::Keep);
        assert_eq!(got.answer, UpdateAnswer::Value(b("o")));
        assert_eq!(set(None, &v, SET_GET).answer, UpdateAnswer::Nil);
        assert_eq!(set_nx(None, &v, 0).answer, UpdateAnswer::Int(1));
        assert_eq!(set_nx(Some(v.clone()), &v, 0).answer, UpdateAnswer::Int(0));
    }

    #[test]
    fn expire_conditions_follow_redis() {
        let flag = |f: u8| Bytes::copy_from_slice(&[f]);
        let with = |at: Option<u64>| Some((b("v"), at));
        let set_to = |at: u64| UpdateWrite::SetExpiry(Some(at));
        // (current expiry, flags, new time) -> set?
        let cases: [(Option<u64>, u8, i64, bool); 10] = [
            (None, 0, 500, true),
            (None, EXPIRE_NX, 500, true),
            (Some(100), EXPIRE_NX, 500, false),
            (None, EXPIRE_XX, 500, false),
            (Some(100), EXPIRE_XX, 500, true),
            (None, EXPIRE_GT, 500, false),
            (Some(100), EXPIRE_GT, 500, true),
            (Some(900), EXPIRE_GT, 500, false),
            (None, EXPIRE_LT, 500, true),
            (Some(100), EXPIRE_LT, 500, false),
        ];
        for (old, flags, at, holds) in cases {
            let got = expire(with(old), 0, &flag(flags), at);
            if holds {
                assert_eq!(got.write, set_to(at as u64), "{old:?} {flags} {at}");
                assert_eq!(got.answer, UpdateAnswer::Int(1));
            } else {
                assert_eq!(got.write, UpdateWrite::Keep, "{old:?} {flags} {at}");
                assert_eq!(got.answer, UpdateAnswer::Int(0));
            }
        }
        let missing = expire(None, 0, &flag(0), 500);
        assert_eq!(missing.answer, UpdateAnswer::Int(0));
        assert_eq!(missing.write, UpdateWrite::Keep);
    }

    #[test]
    fn ttl_answers_round_like_redis() {
        let now = 1_000_000;
        let at = Some((b("v"), Some(now + 1_499)));
        assert_eq!(
            ttl(at.clone(), now, &b(""), TTL_SECONDS).answer,
            UpdateAnswer::Int(1)
        );
        assert_eq!(
            ttl(at.clone(), now, &b(""), TTL_MILLIS).answer,
            UpdateAnswer::Int(1_499)
        );
        assert_eq!(
            ttl(at.clone(), now, &b(""), EXPIRETIME_SECONDS).answer,
            UpdateAnswer::Int(1_001)
        );
        assert_eq!(
            ttl(None, now, &b(""), TTL_SECONDS).answer,
            UpdateAnswer::Int(-2)
        );
        let none = Some((b("v"), None));
        assert_eq!(
            ttl(none, now, &b(""), TTL_MILLIS).answer,
            UpdateAnswer::Int(-1)
        );
    }

    #[test]
    fn integers() {
        let e = Bytes::new();
        assert_eq!(incr_by(None, &e, 1).answer, UpdateAnswer::Int(1));
        assert_eq!(incr_by(Some(b("-5")), &e, 2).answer, UpdateAnswer::Int(-3));
        assert_eq!(
            incr_by(Some(b("9223372036854775807")), &e, 1).answer,
            UpdateAnswer::Refused(OVERFLOW)
        );
        for bad in [" 1", "1 ", "01", "x", "", "1.0"] {
            assert_eq!(
                incr_by(Some(b(bad)), &e, 1).answer,
                UpdateAnswer::Refused(NOT_INTEGER),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn floats() {
        let got = incr_by_float(Some(b("10.5")), &b("0.1"), 0);
        assert_eq!(got.answer, UpdateAnswer::Value(b("10.6")));
        let got = incr_by_float(Some(b("17179869184")), &b("1.5"), 0);
        assert_eq!(got.answer, UpdateAnswer::Value(b("17179869185.5")));
        let got = incr_by_float(Some(b("1")), &b("-1"), 0);
        assert_eq!(got.answer, UpdateAnswer::Value(b("0")));
        assert_eq!(
            incr_by_float(Some(b(" 1")), &b("1"), 0).answer,
            UpdateAnswer::Refused(NOT_FLOAT)
        );
        assert_eq!(
            incr_by_float(Some(b("1e308")), &b("1e308"), 0).answer,
            UpdateAnswer::Refused(NAN_OR_INFINITY)
        );
        assert_eq!(parse_float(b"nan"), None);
    }

    #[test]
    fn set_bit_grows_the_value_and_answers_the_old_bit() {
        let got = set_bit(None, &Bytes::new(), 5 << 1 | 1);
        assert_eq!(
            got.write,
            UpdateWrite::Put(Bytes::from_static(&[0b0000_0100]))
        );
        assert_eq!(got.answer, UpdateAnswer::Int(0));
        let got = set_bit(Some(Bytes::from_static(&[0xff])), &Bytes::new(), 1 << 1);
        assert_eq!(
            got.write,
            UpdateWrite::Put(Bytes::from_static(&[0b1011_1111]))
        );
        assert_eq!(got.answer, UpdateAnswer::Int(1));
        let got = set_bit(Some(b("a")), &Bytes::new(), 17 << 1);
        assert_eq!(got.write, UpdateWrite::Put(Bytes::from_static(b"a\0\0")));
    }

    #[test]
    fn append_and_set_range() {
        assert_eq!(append(None, &b("ab"), 0).answer, UpdateAnswer::Int(2));
        assert_eq!(
            append(Some(b("ab")), &b("cd"), 0).write,
            UpdateWrite::Put(b("abcd"))
        );
        assert_eq!(
            set_range(Some(b("hello")), &b("XY"), 1).write,
            UpdateWrite::Put(b("hXYlo"))
        );
        assert_eq!(
            set_range(None, &b("a"), 2).write,
            UpdateWrite::Put(Bytes::from_static(b"\0\0a"))
        );
        let got = set_range(None, &Bytes::new(), 5);
        assert_eq!(got.write, UpdateWrite::Keep);
        assert_eq!(got.answer, UpdateAnswer::Int(0));
    }

    #[test]
    fn get_del_takes_the_value() {
        let got = get_del(Some(b("v")), &Bytes::new(), 0);
        assert_eq!(got.write, UpdateWrite::Delete);
        assert_eq!(got.answer, UpdateAnswer::Value(b("v")));
        assert_eq!(get_del(None, &Bytes::new(), 0).answer, UpdateAnswer::Nil);
    }
}
