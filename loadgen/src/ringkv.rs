//! The [`Target`] for a real ringkv server, over the `ringkv_client` crate:
//! one TCP connection per client task.
//!
//! What must hold: a request that gets no answer within the timeout fails the
//! run (a benchmark never hangs); per-operation refusals become
//! [`Reply::Failed`] and are counted, transport failures become
//! [`TargetError`]s and stop the run.

use crate::target::{Op, Reply, Session, Target, TargetError};
use ringkv_client::{Client, ConnectOptions, OpReply, RequestOp};
use std::time::Duration;

/// A ringkv server at `addr`.
#[derive(Debug, Clone)]
pub struct RingkvTarget {
    addr: String,
    timeout: Duration,
    options: ConnectOptions,
}

impl RingkvTarget {
    /// `timeout` bounds connecting and every request.
    pub fn new(addr: impl Into<String>, timeout: Duration) -> RingkvTarget {
        RingkvTarget::with_options(addr, ConnectOptions::new().with_timeout(timeout))
    }

    /// Connects with `options` (TLS, password); `options.timeout` bounds
    /// connecting and every request.
    pub fn with_options(addr: impl Into<String>, options: ConnectOptions) -> RingkvTarget {
        RingkvTarget {
            addr: addr.into(),
            timeout: options.timeout,
            options,
        }
    }
}

pub struct RingkvSession {
    client: Client,
    addr: String,
    timeout: Duration,
}

impl Target for RingkvTarget {
    type Session = RingkvSession;

    async fn connect(&self) -> Result<RingkvSession, TargetError> {
        let client = Client::connect_with(&self.addr, &self.options)
            .await
            .map_err(|e| TargetError::Connect {
                addr: self.addr.clone(),
                reason: e.to_string(),
            })?;
        Ok(RingkvSession {
            client,
            addr: self.addr.clone(),
            timeout: self.timeout,
        })
    }

    fn addr(&self) -> String {
        self.addr.clone()
    }
}

impl RingkvSession {
    fn request_error(&self, reason: String) -> TargetError {
        TargetError::Request {
            addr: self.addr.clone(),
            reason,
        }
    }
}

impl Session for RingkvSession {
    async fn batch(&mut self, ops: Vec<Op>) -> Result<Vec<Reply>, TargetError> {
        let mut request = Vec::with_capacity(ops.len());
        for op in ops {
            request.push(match op {
                Op::Put { key, value } => RequestOp::Put { key, value },
                Op::Get { key } => RequestOp::Get { key },
                Op::Begin => RequestOp::Begin,
                Op::GetForUpdate { key } => RequestOp::GetForUpdate { key },
                Op::Commit => RequestOp::Commit,
                Op::Rollback => RequestOp::Rollback,
                Op::Scan { .. } => {
                    return Err(TargetError::Unsupported {
                        addr: self.addr.clone(),
                        what: "SCAN",
                    })
                }
            });
        }
        let sent = request.len();
        let replies = match tokio::time::timeout(self.timeout, self.client.batch(request)).await {
            Ok(Ok(replies)) => replies,
            Ok(Err(e)) => return Err(self.request_error(e.to_string())),
            Err(_) => {
                return Err(self.request_error(format!(
                    "no answer within {:.1} s (--timeout)",
                    self.timeout.as_secs_f64()
                )))
            }
        };
        if replies.len() != sent {
            return Err(TargetError::ReplyCount {
                addr: self.addr.clone(),
                sent,
                got: replies.len(),
            });
        }
        Ok(replies
            .into_iter()
            .map(|r| match r {
                OpReply::Ok => Reply::Done,
                OpReply::Value(v) => Reply::Value(v),
                OpReply::NotFound => Reply::NotFound,
                OpReply::Error { status, message } if status.is_txn_retry() => {
                    Reply::Aborted(format!("{status}: {message}"))
                }
                OpReply::Error { status, message } => Reply::Failed(format!("{status}: {message}")),
                OpReply::Stats(_) | OpReply::Expiry(_) | OpReply::Keys { .. } => {
                    Reply::Failed("a STATS, EXPIRY or KEYS answer to a data operation".to_string())
                }
            })
            .collect())
    }

    async fn stats(&mut self) -> Result<Vec<(String, String)>, TargetError> {
        match tokio::time::timeout(self.timeout, self.client.stats()).await {
            Ok(Ok(pairs)) => Ok(pairs),
            Ok(Err(e)) => Err(self.request_error(format!("STATS: {e}"))),
            Err(_) => Err(self.request_error(format!(
                "STATS: no answer within {:.1} s (--timeout)",
                self.timeout.as_secs_f64()
            ))),
        }
    }

    fn supports_scan(&self) -> bool {
        // The protocol (docs/protocol.md) has PUT, GET, DELETE, PING, STATS.
        false
    }
}
