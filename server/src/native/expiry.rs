//! The native protocol's expiry operations (PUT_EXPIRING, EXPIRE, TTL) as
//! engine updates that see the key's expiry time, and their answers as
//! wire replies.
//!
//! What must hold: an expiry time of 0 on the wire means "none" and is
//! never stored as a time; EXPIRE never creates a key; TTL writes nothing.
//! The engine deletes a key whose new expiry time is not after its clock,
//! so these functions need no clock of their own.

use bytes::Bytes;
use engine::{
    Current, Op, OpResult, TtlUpdate, TtlUpdateFn, UpdateAnswer, UpdateOutcome, UpdateWrite,
};
use ringkv_protocol::{Expiry, OpReply, Status};

use crate::ops::counters::OpKind;
use crate::ops::status::op_reply;

/// The expiry time a wire field names: 0 is none.
fn wire_expiry(at: i64) -> Option<u64> {
    (at != 0).then_some(at as u64)
}

/// A wire expiry time as an update's `number` (times past `i64::MAX` ms,
/// some 292 million years, are clamped).
fn update_number(expires_at_ms: u64) -> i64 {
    i64::try_from(expires_at_ms).unwrap_or(i64::MAX)
}

/// PUT_EXPIRING: `arg` is the value, `at` the expiry time (0: none).
pub fn put_expiring(_: Current, _now: u64, arg: &Bytes, at: i64) -> UpdateOutcome {
    UpdateOutcome {
        write: UpdateWrite::PutExpiring(arg.clone(), wire_expiry(at)),
        answer: UpdateAnswer::Ok,
    }
}

/// EXPIRE: sets the expiry time of an existing key to `at` (0: removes
/// it); a missing key answers Nil and is left missing.
pub fn set_expiry(current: Current, _now: u64, _: &Bytes, at: i64) -> UpdateOutcome {
    match current {
        None => UpdateOutcome {
            write: UpdateWrite::Keep,
            answer: UpdateAnswer::Nil,
        },
        Some(_) => UpdateOutcome {
            write: UpdateWrite::SetExpiry(wire_expiry(at)),
            answer: UpdateAnswer::Ok,
        },
    }
}

/// TTL: the key's expiry time as a number (0: none), Nil for a missing key.
pub fn expiry_of(current: Current, _now: u64, _: &Bytes, _: i64) -> UpdateOutcome {
    let answer = match current {
        None => UpdateAnswer::Nil,
        Some((_, at)) => UpdateAnswer::Int(update_number(at.unwrap_or(0))),
    };
    UpdateOutcome {
        write: UpdateWrite::Keep,
        answer,
    }
}

fn ttl_op(key: Bytes, apply: TtlUpdateFn, arg: Bytes, number: i64) -> Op {
    Op::UpdateTtl {
        key,
        update: TtlUpdate { apply, arg, number },
    }
}

/// The engine operation of PUT_EXPIRING.
pub fn put_expiring_op(key: Bytes, value: Bytes, expires_at_ms: u64) -> Op {
    ttl_op(key, put_expiring, value, update_number(expires_at_ms))
}

/// The engine operation of EXPIRE.
pub fn expire_op(key: Bytes, expires_at_ms: u64) -> Op {
    ttl_op(key, set_expiry, Bytes::new(), update_number(expires_at_ms))
}

/// The engine operation of TTL.
pub fn ttl_query_op(key: Bytes) -> Op {
    ttl_op(key, expiry_of, Bytes::new(), 0)
}

/// The reply to an expiry operation of `kind` from the engine's `result`;
/// `now_ms` is the clock the time left is measured on. Results that are
/// not updates (errors) are mapped like any engine result.
pub fn expiry_reply(kind: OpKind, result: OpResult, now_ms: u64) -> OpReply {
    let answer = match result {
        OpResult::Updated(answer) => answer,
        other => return op_reply(other),
    };
    match (kind, answer) {
        (OpKind::PutExpiring | OpKind::Expire, UpdateAnswer::Ok) => OpReply::Ok,
        (OpKind::Expire | OpKind::Ttl, UpdateAnswer::Nil) => OpReply::NotFound,
        (OpKind::Ttl, UpdateAnswer::Int(0)) => OpReply::Expiry(None),
        (OpKind::Ttl, UpdateAnswer::Int(at)) => {
            let at_ms = at as u64;
            OpReply::Expiry(Some(Expiry {
                at_ms,
                left_ms: at_ms.saturating_sub(now_ms),
            }))
        }
        (kind, answer) => OpReply::Error {
            status: Status::Internal,
            message: format!("unexpected engine answer {answer:?} to {}", kind.name()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    #[test]
    fn put_expiring_writes_value_and_time() {
        let out = put_expiring(None, 10, &b("v"), 500);
        assert_eq!(out.write, UpdateWrite::PutExpiring(b("v"), Some(500)));
        let out = put_expiring(Some((b("old"), Some(7))), 10, &b("v"), 0);
        assert_eq!(out.write, UpdateWrite::PutExpiring(b("v"), None));
    }

    #[test]
    fn set_expiry_never_creates_a_key() {
        let out = set_expiry(None, 10, &Bytes::new(), 500);
        assert_eq!(out.write, UpdateWrite::Keep);
        assert_eq!(out.answer, UpdateAnswer::Nil);
        let out = set_expiry(Some((b("v"), Some(9))), 10, &Bytes::new(), 0);
        assert_eq!(out.write, UpdateWrite::SetExpiry(None));
        assert_eq!(out.answer, UpdateAnswer::Ok);
    }

    #[test]
    fn ttl_answers_missing_none_and_a_time() {
        assert_eq!(
            expiry_of(None, 1, &Bytes::new(), 0).answer,
            UpdateAnswer::Nil
        );
        assert_eq!(
            expiry_of(Some((b("v"), None)), 1, &Bytes::new(), 0).answer,
            UpdateAnswer::Int(0)
        );
        let out = expiry_of(Some((b("v"), Some(u64::MAX))), 1, &Bytes::new(), 0);
        assert_eq!(out.answer, UpdateAnswer::Int(i64::MAX));
        assert_eq!(out.write, UpdateWrite::Keep);
    }

    #[test]
    fn replies_follow_the_op_kind() {
        let updated = |a| OpResult::Updated(a);
        assert_eq!(
            expiry_reply(OpKind::Expire, updated(UpdateAnswer::Nil), 0),
            OpReply::NotFound
        );
        assert_eq!(
            expiry_reply(OpKind::Ttl, updated(UpdateAnswer::Int(0)), 5),
            OpReply::Expiry(None)
        );
        assert_eq!(
            expiry_reply(OpKind::Ttl, updated(UpdateAnswer::Int(1_000)), 400),
            OpReply::Expiry(Some(Expiry {
                at_ms: 1_000,
                left_ms: 600
            }))
        );
        assert_eq!(
            expiry_reply(OpKind::Ttl, updated(UpdateAnswer::Int(1_000)), 4_000),
            OpReply::Expiry(Some(Expiry {
                at_ms: 1_000,
                left_ms: 0
            }))
        );
        assert_eq!(
            expiry_reply(OpKind::PutExpiring, updated(UpdateAnswer::Nil), 0).status(),
            Status::Internal
        );
        assert_eq!(
            expiry_reply(
                OpKind::PutExpiring,
                OpResult::Err(engine::OpError::Poisoned { shard: 1 }),
                0
            )
            .status(),
            Status::Poisoned
        );
    }
}
