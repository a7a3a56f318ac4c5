//! Engine outcomes to wire statuses: the ONE place where an engine error
//! becomes a status byte, so the mapping is reviewed (and changed) in one
//! match.

use engine::{OpError, OpResult, TxnError};
use ringkv_protocol::{OpReply, Response, Status};

/// The wire status for an engine error (for one operation or a whole batch).
pub fn op_error_status(error: &OpError) -> Status {
    match error {
        OpError::EmptyKey => Status::BadRequest,
        OpError::KeyTooLarge { .. } => Status::KeyTooLarge,
        OpError::ValueTooLarge { .. } => Status::ValueTooLarge,
        OpError::BatchTooLarge { .. } => Status::TooManyOps,
        OpError::Poisoned { .. } => Status::Poisoned,
        OpError::Overloaded { .. } => Status::Overloaded,
        OpError::ShuttingDown => Status::ShuttingDown,
        OpError::ReadLimitReached { .. } => Status::FrameTooLarge,
        OpError::Locked { .. } => Status::Locked,
        OpError::ValueUnreadable { .. } => Status::ValueUnreadable,
        OpError::OutOfMemory { .. } => Status::OutOfMemory,
        // A variant added to the engine after this server was written: the
        // client still gets a failure, and the message says what it was.
        _ => Status::Internal,
    }
}

/// The wire status for a transaction error.
pub fn txn_error_status(error: &TxnError) -> Status {
    match error {
        TxnError::Die => Status::Die,
        TxnError::LockTimeout => Status::LockTimeout,
        TxnError::Aborted { .. } => Status::Aborted,
        TxnError::TooManyLocks { .. } | TxnError::TooLarge { .. } => Status::TxnTooLarge,
        TxnError::Op(e) => op_error_status(e),
        TxnError::Poisoned { .. } => Status::Poisoned,
        _ => Status::Internal,
    }
}

/// The error reply for a transaction error.
pub fn txn_error_reply(error: &TxnError) -> OpReply {
    OpReply::Error {
        status: txn_error_status(error),
        message: error.to_string(),
    }
}

/// The reply for one engine result.
pub fn op_reply(result: OpResult) -> OpReply {
    match result {
        OpResult::Ok => OpReply::Ok,
        OpResult::Value(value) => OpReply::Value(value),
        OpResult::NotFound => OpReply::NotFound,
        OpResult::Err(error) => OpReply::Error {
            status: op_error_status(&error),
            message: error.to_string(),
        },
        // The native protocol sends no updates (only the RESP listener does).
        OpResult::Updated(answer) => OpReply::Error {
            status: Status::Internal,
            message: format!("unexpected update answer {answer:?}"),
        },
    }
}

/// The first protocol version with the status OUT_OF_MEMORY.
pub const OUT_OF_MEMORY_SINCE: u16 = 5;

/// `response` as a connection of protocol `version` may receive it: a
/// status its version does not define is replaced by the nearest one it
/// does, with the same message (an older client would refuse the whole
/// response over a status it cannot decode). OUT_OF_MEMORY reaches version
/// 1 to 4 connections as OVERLOADED.
pub fn for_version(mut response: Response, version: u16) -> Response {
    if version < OUT_OF_MEMORY_SINCE {
        for reply in &mut response.results {
            if let OpReply::Error { status, .. } = reply {
                if *status == Status::OutOfMemory {
                    *status = Status::Overloaded;
                }
            }
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn every_engine_error_maps_to_an_error_status() {
        let errors = [
            (OpError::EmptyKey, Status::BadRequest),
            (OpError::KeyTooLarge { len: 2, max: 1 }, Status::KeyTooLarge),
            (
                OpError::ValueTooLarge { len: 2, max: 1 },
                Status::ValueTooLarge,
            ),
            (
                OpError::BatchTooLarge { count: 2, max: 1 },
                Status::TooManyOps,
            ),
            (OpError::Poisoned { shard: 3 }, Status::Poisoned),
            (OpError::Overloaded { shard: 1 }, Status::Overloaded),
            (OpError::ShuttingDown, Status::ShuttingDown),
            (OpError::Locked { shard: 0 }, Status::Locked),
            (
                OpError::ReadLimitReached { shard: 0, max: 1 },
                Status::FrameTooLarge,
            ),
            (
                OpError::ValueUnreadable {
                    shard: 0,
                    reason: "damaged".into(),
                },
                Status::ValueUnreadable,
            ),
            (
                OpError::OutOfMemory {
                    shard: 1,
                    used: 10,
                    max: 9,
                },
                Status::OutOfMemory,
            ),
        ];
        for (error, status) in errors {
            assert_eq!(op_error_status(&error), status, "{error}");
            assert!(status.is_error());
            match op_reply(OpResult::Err(error.clone())) {
                OpReply::Error { status: s, message } => {
                    assert_eq!(s, status);
                    assert_eq!(message, error.to_string());
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn successes_map_to_ok_and_not_found() {
        assert_eq!(op_reply(OpResult::Ok), OpReply::Ok);
        assert_eq!(op_reply(OpResult::NotFound), OpReply::NotFound);
        let v = Bytes::from_static(b"v");
        assert_eq!(op_reply(OpResult::Value(v.clone())), OpReply::Value(v));
    }

    #[test]
    fn out_of_memory_reaches_older_connections_as_overloaded() {
        let refused = || Response {
            id: 7,
            results: vec![
                OpReply::Ok,
                OpReply::Error {
                    status: Status::OutOfMemory,
                    message: "full".to_string(),
                },
            ],
        };
        let status_of = |r: &Response| match &r.results[1] {
            OpReply::Error { status, message } => {
                assert_eq!(message, "full");
                *status
            }
            other => panic!("{other:?}"),
        };
        for version in 1..OUT_OF_MEMORY_SINCE {
            assert_eq!(
                status_of(&for_version(refused(), version)),
                Status::Overloaded
            );
        }
        assert_eq!(
            status_of(&for_version(refused(), OUT_OF_MEMORY_SINCE)),
            Status::OutOfMemory
        );
        assert_eq!(for_version(refused(), 1).results[0], OpReply::Ok);
    }
}
