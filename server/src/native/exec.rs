//! Turning a decoded request into engine operations and the engine's answers
//! back into a response — without I/O, so it is tested on its own.
//!
//! What must hold: the response has exactly one result per request
//! operation, in request order; PUT/GET/DELETE and the expiry operations
//! are answered by the engine (which answers in order), PING, STATS and
//! SCAN by the server; a response never exceeds the frame limit (oversized
//! GET values are replaced by FRAME_TOO_LARGE results, see `fit_response`,
//! and SCAN answers only as many keys as [`scan_room_bytes`] leaves room for).

use engine::{Op, OpError, OpResult};
use ringkv_protocol::{
    fit_response, OpReply, Request, RequestOp, Response, Status, FRAME_HEADER_BYTES,
    RESULT_HEADER_BYTES,
};

use crate::native::expiry::{expire_op, expiry_reply, put_expiring_op, ttl_query_op};
use crate::native::scan::ScanArgs;
use crate::ops::counters::{OpKind, OpTally};
use crate::ops::status::{op_error_status, op_reply};

/// A request split into what the engine runs and what the server answers.
#[derive(Debug)]
pub struct Plan {
    pub id: u64,
    /// The kind of every request operation, in request order.
    pub kinds: Vec<OpKind>,
    /// The engine's operations (PUT/GET/DELETE and the expiry ones), in
    /// request order (the caller moves them out to run them).
    pub engine_ops: Vec<Op>,
    /// The SCAN operations, in request order (the caller runs them after
    /// the engine's operations).
    pub scans: Vec<ScanArgs>,
}

/// The engine operation and counted kind of a request operation the
/// engine runs; the others are handed back.
pub fn engine_op(op: RequestOp) -> Result<(OpKind, Op), RequestOp> {
    Ok(match op {
        RequestOp::Put { key, value } => (OpKind::Put, Op::Put { key, value }),
        RequestOp::Get { key } => (OpKind::Get, Op::Get { key }),
        RequestOp::Delete { key } => (OpKind::Delete, Op::Delete { key }),
        RequestOp::PutExpiring {
            key,
            value,
            expires_at_ms,
        } => (
            OpKind::PutExpiring,
            put_expiring_op(key, value, expires_at_ms),
        ),
        RequestOp::Expire { key, expires_at_ms } => (OpKind::Expire, expire_op(key, expires_at_ms)),
        RequestOp::Ttl { key } => (OpKind::Ttl, ttl_query_op(key)),
        other => return Err(other),
    })
}

/// The reply to an engine operation of `kind` from its result.
pub fn engine_reply(kind: OpKind, result: OpResult) -> OpReply {
    match kind {
        OpKind::PutExpiring | OpKind::Expire | OpKind::Ttl => {
            expiry_reply(kind, result, engine::clock::now_ms())
        }
        _ => op_reply(result),
    }
}

/// Bytes each SCAN of a request of `op_count` operations, `scan_count` of
/// them SCANs, may answer in its KEYS payload: the frame limit less the
/// header and every result's header, shared evenly.
pub fn scan_room_bytes(frame_bytes_max: u32, op_count: usize, scan_count: usize) -> usize {
    (frame_bytes_max as usize)
        .saturating_sub(FRAME_HEADER_BYTES + RESULT_HEADER_BYTES * op_count)
        .checked_div(scan_count)
        .unwrap_or(0)
}

/// Splits `request` (moving keys and values, no copies).
pub fn plan(request: Request) -> Plan {
    let mut kinds = Vec::with_capacity(request.ops.len());
    let mut engine_ops = Vec::with_capacity(request.ops.len());
    let mut scans = Vec::new();
    for op in request.ops {
        let op = match engine_op(op) {
            Ok((kind, op)) => {
                kinds.push(kind);
                engine_ops.push(op);
                continue;
            }
            Err(op) => op,
        };
        match op {
            RequestOp::Put { .. }
            | RequestOp::Get { .. }
            | RequestOp::Delete { .. }
            | RequestOp::PutExpiring { .. }
            | RequestOp::Expire { .. }
            | RequestOp::Ttl { .. } => unreachable!("engine_op takes every engine operation"),
            RequestOp::Ping => kinds.push(OpKind::Ping),
            RequestOp::Stats => kinds.push(OpKind::Stats),
            RequestOp::Scan {
                cursor,
                count,
                pattern,
            } => {
                kinds.push(OpKind::Scan);
                scans.push(ScanArgs {
                    cursor,
                    count,
                    pattern,
                });
            }
            // Frames with transaction ops run on the transaction path
            // (`crate::native::txn`); here they could only be outside a transaction.
            RequestOp::Begin
            | RequestOp::GetForUpdate { .. }
            | RequestOp::Commit
            | RequestOp::Rollback => kinds.push(OpKind::Txn),
            // A frame with BACKUP runs on the transaction path too.
            RequestOp::Backup { .. } => kinds.push(OpKind::Txn),
        }
    }
    Plan {
        id: request.id,
        kinds,
        engine_ops,
        scans,
    }
}

/// Builds the response for `plan` from the engine's answer to its
/// `engine_ops` (`None` when there were none) and the answers to its
/// `scans` (in order), and counts every result in `tally`. `stats` is
/// called once per STATS operation.
///
/// A batch-level engine error fails every engine operation of the request
/// with that status; PING, STATS and SCAN still succeed.
pub fn assemble(
    plan: &Plan,
    engine_answer: Option<Result<Vec<OpResult>, OpError>>,
    scan_answers: Vec<OpReply>,
    frame_bytes_max: u32,
    stats: &mut dyn FnMut() -> Vec<(String, String)>,
    tally: &mut OpTally,
) -> Response {
    // Counted from the kinds: the caller may have moved `engine_ops` out.
    let engine_op_count = plan.kinds.iter().filter(|k| k.is_engine_op()).count();
    let mut engine_results: Box<dyn Iterator<Item = OpReply> + '_> = match engine_answer {
        None => {
            assert_eq!(
                engine_op_count, 0,
                "engine operations without an engine answer"
            );
            Box::new(std::iter::empty())
        }
        Some(Ok(results)) => {
            assert_eq!(
                results.len(),
                engine_op_count,
                "the engine answered {} results to {} operations",
                results.len(),
                engine_op_count
            );
            let kinds = plan.kinds.iter().filter(|k| k.is_engine_op());
            Box::new(
                kinds
                    .zip(results)
                    .map(|(kind, result)| engine_reply(*kind, result)),
            )
        }
        Some(Err(error)) => {
            let status = op_error_status(&error);
            let message = error.to_string();
            Box::new(std::iter::repeat_n(
                OpReply::Error { status, message },
                engine_op_count,
            ))
        }
    };
    assert_eq!(
        scan_answers.len(),
        plan.scans.len(),
        "{} SCAN answers to {} SCANs",
        scan_answers.len(),
        plan.scans.len()
    );
    let mut scan_answers = scan_answers.into_iter();
    let mut results = Vec::with_capacity(plan.kinds.len());
    for &kind in &plan.kinds {
        let reply = match kind {
            OpKind::Put
            | OpKind::Get
            | OpKind::Delete
            | OpKind::PutExpiring
            | OpKind::Expire
            | OpKind::Ttl => match engine_results.next() {
                Some(reply) => reply,
                None => unreachable!("engine result count was checked above"),
            },
            OpKind::Scan => match scan_answers.next() {
                Some(reply) => reply,
                None => unreachable!("SCAN answer count was checked above"),
            },
            OpKind::Ping => OpReply::Ok,
            OpKind::Stats => OpReply::Stats(stats()),
            OpKind::Txn => OpReply::Error {
                status: Status::NoTransaction,
                message: "transaction operations run on the transaction path".to_string(),
            },
        };
        results.push(reply);
    }
    let mut response = Response {
        id: plan.id,
        results,
    };
    fit_response(&mut response, frame_bytes_max);
    for (kind, reply) in plan.kinds.iter().zip(response.results.iter()) {
        tally.add(*kind, reply.status());
    }
    response
}

/// The status of a whole request for logs: the first error status, if any.
pub fn first_error(response: &Response) -> Option<Status> {
    response
        .results
        .iter()
        .map(OpReply::status)
        .find(|s| s.is_error())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn b(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    fn mixed() -> Request {
        Request {
            id: 3,
            ops: vec![
                RequestOp::Put {
                    key: b("a"),
                    value: b("1"),
                },
                RequestOp::Ping,
                RequestOp::Get { key: b("a") },
                RequestOp::Stats,
                RequestOp::Delete { key: b("zz") },
            ],
        }
    }

    #[test]
    fn engine_and_server_answers_interleave_in_request_order() {
        let p = plan(mixed());
        assert_eq!(p.engine_ops.len(), 3);
        let answer = vec![OpResult::Ok, OpResult::Value(b("1")), OpResult::NotFound];
        let mut calls = 0;
        let mut stats = || {
            calls += 1;
            vec![("server.shards".to_string(), "2".to_string())]
        };
        let mut tally = OpTally::default();
        let r = assemble(
            &p,
            Some(Ok(answer)),
            vec![],
            1 << 20,
            &mut stats,
            &mut tally,
        );
        assert_eq!(r.id, 3);
        assert_eq!(
            r.results,
            vec![
                OpReply::Ok,
                OpReply::Ok,
                OpReply::Value(b("1")),
                OpReply::Stats(vec![("server.shards".into(), "2".into())]),
                OpReply::NotFound,
            ]
        );
        assert_eq!(calls, 1);
        assert_eq!(tally.get(OpKind::Delete, Status::NotFound), 1);
        assert_eq!(tally.get(OpKind::Ping, Status::Ok), 1);
        assert_eq!(first_error(&r), None);
    }

    #[test]
    fn batch_error_fails_engine_ops_only() {
        let p = plan(mixed());
        let mut tally = OpTally::default();
        let r = assemble(
            &p,
            Some(Err(OpError::Overloaded { shard: 1 })),
            vec![],
            1 << 20,
            &mut Vec::new,
            &mut tally,
        );
        let statuses: Vec<Status> = r.results.iter().map(OpReply::status).collect();
        assert_eq!(
            statuses,
            vec![
                Status::Overloaded,
                Status::Ok,
                Status::Overloaded,
                Status::Ok,
                Status::Overloaded
            ]
        );
        assert_eq!(tally.get(OpKind::Put, Status::Overloaded), 1);
        assert_eq!(first_error(&r), Some(Status::Overloaded));
    }

    #[test]
    fn oversized_response_is_fitted() {
        let p = plan(Request {
            id: 1,
            ops: vec![
                RequestOp::Get { key: b("a") },
                RequestOp::Get { key: b("b") },
            ],
        });
        let big = Bytes::from(vec![7u8; 3000]);
        let answer = vec![OpResult::Value(big.clone()), OpResult::Value(big)];
        let mut tally = OpTally::default();
        let r = assemble(
            &p,
            Some(Ok(answer)),
            vec![],
            4096,
            &mut Vec::new,
            &mut tally,
        );
        assert!(r.encoded_len() <= 4096);
        assert_eq!(r.results[1].status(), Status::FrameTooLarge);
        assert_eq!(tally.get(OpKind::Get, Status::FrameTooLarge), 1);
        assert_eq!(tally.get(OpKind::Get, Status::Ok), 1);
    }

    #[test]
    fn expiry_ops_go_to_the_engine_and_scans_to_the_server() {
        use engine::UpdateAnswer;
        let p = plan(Request {
            id: 4,
            ops: vec![
                RequestOp::PutExpiring {
                    key: b("a"),
                    value: b("1"),
                    expires_at_ms: 99,
                },
                RequestOp::Scan {
                    cursor: 0,
                    count: 5,
                    pattern: b("a*"),
                },
                RequestOp::Ttl { key: b("a") },
                RequestOp::Expire {
                    key: b("zz"),
                    expires_at_ms: 0,
                },
            ],
        });
        assert_eq!(p.engine_ops.len(), 3);
        assert_eq!(
            p.scans,
            vec![ScanArgs {
                cursor: 0,
                count: 5,
                pattern: b("a*")
            }]
        );
        let answer = vec![
            OpResult::Updated(UpdateAnswer::Ok),
            OpResult::Updated(UpdateAnswer::Int(0)),
            OpResult::Updated(UpdateAnswer::Nil),
        ];
        let page = OpReply::Keys {
            cursor: 0,
            keys: vec![b("a")],
        };
        let mut tally = OpTally::default();
        let r = assemble(
            &p,
            Some(Ok(answer)),
            vec![page.clone()],
            1 << 20,
            &mut Vec::new,
            &mut tally,
        );
        assert_eq!(
            r.results,
            vec![OpReply::Ok, page, OpReply::Expiry(None), OpReply::NotFound]
        );
        assert_eq!(tally.get(OpKind::PutExpiring, Status::Ok), 1);
        assert_eq!(tally.get(OpKind::Scan, Status::Ok), 1);
        assert_eq!(tally.get(OpKind::Ttl, Status::Ok), 1);
        assert_eq!(tally.get(OpKind::Expire, Status::NotFound), 1);
    }

    #[test]
    fn scan_room_leaves_room_for_every_header() {
        assert_eq!(scan_room_bytes(4096, 1, 1), 4096 - 24 - 6);
        assert_eq!(scan_room_bytes(4096, 3, 2), (4096 - 24 - 18) / 2);
        assert_eq!(scan_room_bytes(20, 5, 1), 0);
        assert_eq!(scan_room_bytes(4096, 1, 0), 0);
    }

    #[test]
    #[should_panic(expected = "answered 1 results to 3 operations")]
    fn wrong_result_count_is_a_broken_invariant() {
        let p = plan(mixed());
        let mut tally = OpTally::default();
        assemble(
            &p,
            Some(Ok(vec![OpResult::Ok])),
            vec![],
            1 << 20,
            &mut Vec::new,
            &mut tally,
        );
    }
}
