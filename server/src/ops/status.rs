//! Engine outcomes to wire statuses: the ONE place where an engine error
//! becomes a status byte, so the mapping is reviewed (and changed) in one
//! match.

use engine::{OpError, OpResult, TxnError};
use ringkv_protocol::{OpReply, Status};

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
}
