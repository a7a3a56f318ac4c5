//! Turning a decoded request into engine operations and the engine's answers
//! back into a response — without I/O, so it is tested on its own.
//!
//! What must hold: the response has exactly one result per request
//! operation, in request order; PUT/GET/DELETE answers come from the engine
//! (which answers in order), PING and STATS are answered by the server; a
//! response never exceeds the frame limit (oversized GET values are replaced
//! by FRAME_TOO_LARGE results, see `fit_response`).

use engine::{Op, OpError, OpResult};
use ringkv_protocol::{fit_response, OpReply, Request, RequestOp, Response, Status};

use crate::counters::{OpKind, OpTally};
use crate::status::{op_error_status, op_reply};

/// A request split into what the engine runs and what the server answers.
#[derive(Debug)]
pub struct Plan {
    pub id: u64,
    /// The kind of every request operation, in request order.
    pub kinds: Vec<OpKind>,
    /// The PUT/GET/DELETE operations, in request order (the caller moves
    /// them out to run them).
    pub engine_ops: Vec<Op>,
}

/// Splits `request` (moving keys and values, no copies).
pub fn plan(request: Request) -> Plan {
    let mut kinds = Vec::with_capacity(request.ops.len());
    let mut engine_ops = Vec::with_capacity(request.ops.len());
    for op in request.ops {
        match op {
            RequestOp::Put { key, value } => {
                kinds.push(OpKind::Put);
                engine_ops.push(Op::Put { key, value });
            }
            RequestOp::Get { key } => {
                kinds.push(OpKind::Get);
                engine_ops.push(Op::Get { key });
            }
            RequestOp::Delete { key } => {
                kinds.push(OpKind::Delete);
                engine_ops.push(Op::Delete { key });
            }
            RequestOp::Ping => kinds.push(OpKind::Ping),
            RequestOp::Stats => kinds.push(OpKind::Stats),
            // Frames with transaction ops run on the transaction path
            // (`crate::txn`); here they could only be outside a transaction.
            RequestOp::Begin
            | RequestOp::GetForUpdate { .. }
            | RequestOp::Commit
            | RequestOp::Rollback => kinds.push(OpKind::Txn),
        }
    }
    Plan {
        id: request.id,
        kinds,
        engine_ops,
    }
}

/// Builds the response for `plan` from the engine's answer to its
/// `engine_ops` (`None` when there were none) and counts every result in
/// `tally`. `stats` is called once per STATS operation.
///
/// A batch-level engine error fails every engine operation of the request
/// with that status; PING and STATS still succeed.
pub fn assemble(
    plan: &Plan,
    engine_answer: Option<Result<Vec<OpResult>, OpError>>,
    frame_bytes_max: u32,
    stats: &mut dyn FnMut() -> Vec<(String, String)>,
    tally: &mut OpTally,
) -> Response {
    // Counted from the kinds: the caller may have moved `engine_ops` out.
    let engine_op_count = plan.kinds.iter().filter(|k| k.is_engine_op()).count();
    let mut engine_results: Box<dyn Iterator<Item = OpReply>> = match engine_answer {
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
            Box::new(results.into_iter().map(op_reply))
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
    let mut results = Vec::with_capacity(plan.kinds.len());
    for &kind in &plan.kinds {
        let reply = match kind {
            OpKind::Put | OpKind::Get | OpKind::Delete => match engine_results.next() {
                Some(reply) => reply,
                None => unreachable!("engine result count was checked above"),
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
        let r = assemble(&p, Some(Ok(answer)), 1 << 20, &mut stats, &mut tally);
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
        let r = assemble(&p, Some(Ok(answer)), 4096, &mut Vec::new, &mut tally);
        assert!(r.encoded_len() <= 4096);
        assert_eq!(r.results[1].status(), Status::FrameTooLarge);
        assert_eq!(tally.get(OpKind::Get, Status::FrameTooLarge), 1);
        assert_eq!(tally.get(OpKind::Get, Status::Ok), 1);
    }

    #[test]
    #[should_panic(expected = "answered 1 results to 3 operations")]
    fn wrong_result_count_is_a_broken_invariant() {
        let p = plan(mixed());
        let mut tally = OpTally::default();
        assemble(
            &p,
            Some(Ok(vec![OpResult::Ok])),
            1 << 20,
            &mut Vec::new,
            &mut tally,
        );
    }
}
