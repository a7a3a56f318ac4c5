//! The limits a server advertises in its hello-ack and both sides enforce.
//! A decoder checks every untrusted length against them before it buffers or
//! allocates for it.

use super::error::{LimitError, LimitsError};
use super::request::{Request, RequestOp};
use super::wire::{
    FRAME_BYTES_MAX_FLOOR, FRAME_HEADER_BYTES, RESULT_HEADER_BYTES, SCAN_PATTERN_BYTES_MAX,
};

/// Negotiated bounds of one connection. All sizes are in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest frame, counting its 4-byte length prefix. Applies to requests
    /// and responses. At least [`Limits::frame_bytes_min`].
    pub frame_bytes_max: u32,
    /// Most operations in one request (and so results in one response). >= 1.
    pub ops_per_frame_max: u32,
    /// Largest key. >= 1 (keys are never empty).
    pub key_bytes_max: u32,
    /// Largest value. May be 0.
    pub value_bytes_max: u32,
    /// Most requests a client may have sent and not yet seen answered. >= 1.
    pub pipeline_depth_max: u32,
}

impl Default for Limits {
    /// The server's default configuration: 16 MiB frames, 10,000 ops, 64 KiB
    /// keys, 8 MiB values, 128 frames in flight.
    fn default() -> Self {
        Limits {
            frame_bytes_max: 16 << 20,
            ops_per_frame_max: 10_000,
            key_bytes_max: 64 << 10,
            value_bytes_max: 8 << 20,
            pipeline_depth_max: 128,
        }
    }
}

impl Limits {
    /// The smallest `frame_bytes_max` valid with `ops_per_frame_max`: a
    /// response of that many payload-free results must fit, so a server can
    /// always answer a full batch (see [`fit_response`](super::fit_response)).
    pub fn frame_bytes_min(ops_per_frame_max: u32) -> u64 {
        let full_response =
            FRAME_HEADER_BYTES as u64 + RESULT_HEADER_BYTES as u64 * u64::from(ops_per_frame_max);
        full_response.max(u64::from(FRAME_BYTES_MAX_FLOOR))
    }

    /// Checks the relations every advertised set of limits must satisfy.
    pub fn validate(&self) -> Result<(), LimitsError> {
        for (field, value) in [
            ("frame_bytes_max", self.frame_bytes_max),
            ("ops_per_frame_max", self.ops_per_frame_max),
            ("key_bytes_max", self.key_bytes_max),
            ("pipeline_depth_max", self.pipeline_depth_max),
        ] {
            if value == 0 {
                return Err(LimitsError::Zero { field });
            }
        }
        let min = Limits::frame_bytes_min(self.ops_per_frame_max);
        if u64::from(self.frame_bytes_max) < min {
            return Err(LimitsError::FrameTooSmall {
                frame_bytes_max: self.frame_bytes_max,
                ops_per_frame_max: self.ops_per_frame_max,
                min,
            });
        }
        Ok(())
    }

    /// Checks one operation at position `index` against the key and value limits.
    pub fn check_op(&self, index: usize, op: &RequestOp) -> Result<(), LimitError> {
        if let Some(key) = op.key() {
            if key.is_empty() {
                return Err(LimitError::EmptyKey { index });
            }
            if key.len() > self.key_bytes_max as usize {
                return Err(LimitError::KeyTooLarge {
                    index,
                    len: key.len(),
                    max: self.key_bytes_max,
                });
            }
        }
        if let RequestOp::Scan { pattern, .. } = op {
            if pattern.len() > SCAN_PATTERN_BYTES_MAX {
                return Err(LimitError::PatternTooLarge {
                    index,
                    len: pattern.len(),
                    max: SCAN_PATTERN_BYTES_MAX,
                });
            }
        }
        if let RequestOp::Put { value, .. } | RequestOp::PutExpiring { value, .. } = op {
            if value.len() > self.value_bytes_max as usize {
                return Err(LimitError::ValueTooLarge {
                    index,
                    len: value.len(),
                    max: self.value_bytes_max,
                });
            }
        }
        Ok(())
    }

    /// Checks a whole request the way a server's decoder will: op count, every
    /// key and value, and the encoded frame size. A client calls this before
    /// sending, so a mistake costs an error instead of the connection.
    pub fn check_request(&self, request: &Request) -> Result<(), LimitError> {
        if request.ops.is_empty() {
            return Err(LimitError::EmptyBatch);
        }
        if request.ops.len() > self.ops_per_frame_max as usize {
            return Err(LimitError::TooManyOps {
                count: request.ops.len(),
                max: self.ops_per_frame_max,
            });
        }
        for (index, op) in request.ops.iter().enumerate() {
            self.check_op(index, op)?;
        }
        let len = request.encoded_len();
        if len > self.frame_bytes_max as usize {
            return Err(LimitError::FrameTooLarge {
                len,
                max: self.frame_bytes_max,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(Limits::default().validate(), Ok(()));
    }

    #[test]
    fn zero_fields_are_rejected_except_value() {
        let base = Limits::default();
        let zero_key = Limits {
            key_bytes_max: 0,
            ..base
        };
        assert_eq!(
            zero_key.validate(),
            Err(LimitsError::Zero {
                field: "key_bytes_max"
            })
        );
        let zero_depth = Limits {
            pipeline_depth_max: 0,
            ..base
        };
        assert_eq!(
            zero_depth.validate(),
            Err(LimitsError::Zero {
                field: "pipeline_depth_max"
            })
        );
        let zero_value = Limits {
            value_bytes_max: 0,
            ..base
        };
        assert_eq!(zero_value.validate(), Ok(()));
    }

    #[test]
    fn frame_must_hold_a_full_response_of_empty_results() {
        let limits = Limits {
            frame_bytes_max: 50_000,
            ops_per_frame_max: 10_000,
            ..Limits::default()
        };
        assert_eq!(
            limits.validate(),
            Err(LimitsError::FrameTooSmall {
                frame_bytes_max: 50_000,
                ops_per_frame_max: 10_000,
                min: 60_024
            })
        );
        let tiny = Limits {
            frame_bytes_max: 100,
            ops_per_frame_max: 1,
            ..Limits::default()
        };
        assert!(matches!(
            tiny.validate(),
            Err(LimitsError::FrameTooSmall { min: 4096, .. })
        ));
    }

    #[test]
    fn check_request_names_the_offending_op() {
        let limits = Limits {
            key_bytes_max: 4,
            value_bytes_max: 8,
            ..Limits::default()
        };
        let request = |ops| Request { id: 1, ops };
        let key = |s: &'static str| Bytes::from_static(s.as_bytes());
        assert_eq!(
            limits.check_request(&request(vec![])),
            Err(LimitError::EmptyBatch)
        );
        assert_eq!(
            limits.check_request(&request(vec![
                RequestOp::Ping,
                RequestOp::Get { key: key("") }
            ])),
            Err(LimitError::EmptyKey { index: 1 })
        );
        assert_eq!(
            limits.check_request(&request(vec![RequestOp::Delete { key: key("abcde") }])),
            Err(LimitError::KeyTooLarge {
                index: 0,
                len: 5,
                max: 4
            })
        );
        assert_eq!(
            limits.check_request(&request(vec![RequestOp::Put {
                key: key("k"),
                value: key("123456789")
            }])),
            Err(LimitError::ValueTooLarge {
                index: 0,
                len: 9,
                max: 8
            })
        );
        assert_eq!(
            limits.check_request(&request(vec![RequestOp::Put {
                key: key("k"),
                value: key("12345678")
            }])),
            Ok(())
        );
    }

    #[test]
    fn check_request_counts_ops_and_frame_bytes() {
        let limits = Limits {
            ops_per_frame_max: 2,
            frame_bytes_max: 4096,
            ..Limits::default()
        };
        let pings = Request {
            id: 1,
            ops: vec![RequestOp::Ping; 3],
        };
        assert_eq!(
            limits.check_request(&pings),
            Err(LimitError::TooManyOps { count: 3, max: 2 })
        );
        let big = Request {
            id: 1,
            ops: vec![RequestOp::Put {
                key: Bytes::from_static(b"k"),
                value: Bytes::from(vec![0u8; 5000]),
            }],
        };
        let limits = Limits {
            value_bytes_max: 1 << 20,
            ..limits
        };
        assert_eq!(
            limits.check_request(&big),
            Err(LimitError::FrameTooLarge {
                len: big.encoded_len(),
                max: 4096
            })
        );
    }
}
