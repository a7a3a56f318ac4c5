//! The test vectors of `docs/protocol.md`, checked against the codec: each
//! described value encodes to exactly the documented bytes, and the bytes
//! decode to exactly that value (or to the documented rejection). A change to
//! the wire format that the document does not follow fails here.

use bytes::{Bytes, BytesMut};
use ringkv_protocol::{
    decode_auth, decode_hello, decode_hello_ack, decode_request, decode_request_version,
    decode_response, decode_user, encode_auth, encode_error, encode_hello, encode_hello_ack,
    encode_request, encode_response, encode_user, DecodeError, ErrorFrame, Expiry, Hello, HelloAck,
    Limits, OpReply, Request, RequestOp, Response, ServerFrame, ServerInfo, Status,
    PROTOCOL_VERSION,
};

const PROTOCOL_MD: &str = include_str!("../../docs/protocol.md");

/// One fenced ```vector block.
#[derive(Debug)]
struct Vector {
    name: String,
    kind: String,
    /// `field: value` lines in order (repeated fields like `op` stay in order).
    fields: Vec<(String, String)>,
    bytes: Vec<u8>,
}

impl Vector {
    fn get(&self, field: &str) -> &str {
        let mut found = self.fields.iter().filter(|(name, _)| name == field);
        let value = found
            .next()
            .unwrap_or_else(|| panic!("vector {}: no field {field}", self.name));
        assert!(
            found.next().is_none(),
            "vector {}: field {field} repeated",
            self.name
        );
        &value.1
    }

    fn has(&self, field: &str) -> bool {
        self.fields.iter().any(|(name, _)| name == field)
    }

    fn all(&self, field: &str) -> Vec<&str> {
        self.fields
            .iter()
            .filter(|(name, _)| name == field)
            .map(|(_, value)| value.as_str())
            .collect()
    }

    fn number<T: TryFrom<u64>>(&self, field: &str) -> T {
        let text = self.get(field);
        let value = match text.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => text.parse(),
        }
        .unwrap_or_else(|_| panic!("vector {}: {field} is not a number: {text}", self.name));
        T::try_from(value).unwrap_or_else(|_| panic!("vector {}: {field} out of range", self.name))
    }

    fn status(&self, field: &str) -> Status {
        let name = self.get(field);
        Status::from_name(name)
            .unwrap_or_else(|| panic!("vector {}: unknown status {name}", self.name))
    }

    fn text(&self, field: &str) -> String {
        let tokens = tokens(self.get(field));
        assert_eq!(
            tokens.len(),
            1,
            "vector {}: {field} must be one quoted string",
            self.name
        );
        String::from_utf8(tokens[0].clone()).expect("UTF-8 text")
    }
}

fn parse_vectors(markdown: &str) -> Vec<Vector> {
    let mut vectors = Vec::new();
    let mut lines = markdown.lines();
    while let Some(line) = lines.next() {
        if line.trim_end() != "```vector" {
            continue;
        }
        let mut fields = Vec::new();
        let mut hex = None::<Vec<u8>>;
        for line in lines.by_ref() {
            if line.trim_end() == "```" {
                break;
            }
            if let Some(bytes) = hex.as_mut() {
                let data = line.split('#').next().unwrap_or("");
                for pair in data.split_whitespace() {
                    bytes.push(
                        u8::from_str_radix(pair, 16)
                            .unwrap_or_else(|_| panic!("bad hex byte {pair:?}")),
                    );
                }
            } else if line.trim() == "hex:" {
                hex = Some(Vec::new());
            } else {
                let (name, value) = line
                    .split_once(':')
                    .unwrap_or_else(|| panic!("bad vector line {line:?}"));
                fields.push((name.trim().to_owned(), value.trim().to_owned()));
            }
        }
        let take = |field: &str| {
            fields
                .iter()
                .find(|(name, _)| name == field)
                .map(|(_, value)| value.clone())
                .unwrap_or_else(|| panic!("vector without {field}: {fields:?}"))
        };
        vectors.push(Vector {
            name: take("name"),
            kind: take("type"),
            bytes: hex.unwrap_or_else(|| panic!("vector {} has no hex", take("name"))),
            fields: fields
                .into_iter()
                .filter(|(name, _)| name != "name" && name != "type")
                .collect(),
        });
    }
    vectors
}

/// Splits `PUT "alpha" "one"` into words and quoted strings (with `\"`,
/// `\\` and `\xHH` escapes), as bytes.
fn tokens(text: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let mut token = Vec::new();
        if c == '"' {
            chars.next();
            loop {
                match chars.next().expect("unterminated string") {
                    '"' => break,
                    '\\' => match chars.next().expect("dangling escape") {
                        'x' => {
                            let hex: String = chars.by_ref().take(2).collect();
                            token.push(u8::from_str_radix(&hex, 16).expect("bad \\x escape"));
                        }
                        other => token.extend(other.to_string().bytes()),
                    },
                    other => token.extend(other.to_string().bytes()),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                token.extend(c.to_string().bytes());
                chars.next();
            }
        }
        out.push(token);
    }
    out
}

fn word(token: &[u8]) -> &str {
    std::str::from_utf8(token).expect("UTF-8 word")
}

fn number(token: &[u8]) -> u64 {
    word(token)
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {:?}", word(token)))
}

fn op(text: &str) -> RequestOp {
    let tokens = tokens(text);
    let arg = |index: usize| Bytes::from(tokens[index].clone());
    let num = |index: usize| number(&tokens[index]);
    match (word(&tokens[0]), tokens.len()) {
        ("PUT", 3) => RequestOp::Put {
            key: arg(1),
            value: arg(2),
        },
        ("GET", 2) => RequestOp::Get { key: arg(1) },
        ("DELETE", 2) => RequestOp::Delete { key: arg(1) },
        ("PING", 1) => RequestOp::Ping,
        ("STATS", 1) => RequestOp::Stats,
        ("PUT_EXPIRING", 4) => RequestOp::PutExpiring {
            key: arg(1),
            value: arg(2),
            expires_at_ms: num(3),
        },
        ("EXPIRE", 3) => RequestOp::Expire {
            key: arg(1),
            expires_at_ms: num(2),
        },
        ("TTL", 2) => RequestOp::Ttl { key: arg(1) },
        ("SCAN", 4) => RequestOp::Scan {
            cursor: num(1),
            count: u32::try_from(num(2)).expect("count fits a u32"),
            pattern: arg(3),
        },
        ("BEGIN", 1) => RequestOp::Begin,
        ("GET_FOR_UPDATE", 2) => RequestOp::GetForUpdate { key: arg(1) },
        ("COMMIT", 1) => RequestOp::Commit,
        ("ROLLBACK", 1) => RequestOp::Rollback,
        _ => panic!("bad op line {text:?}"),
    }
}

fn result(text: &str) -> OpReply {
    let tokens = tokens(text);
    let utf8 = |index: usize| String::from_utf8(tokens[index].clone()).expect("UTF-8");
    match word(&tokens[0]) {
        "OK" => OpReply::Ok,
        "NOT_FOUND" => OpReply::NotFound,
        "VALUE" => OpReply::Value(Bytes::from(tokens[1].clone())),
        "EXPIRY" if word(&tokens[1]) == "none" => OpReply::Expiry(None),
        "EXPIRY" => OpReply::Expiry(Some(Expiry {
            at_ms: number(&tokens[1]),
            left_ms: number(&tokens[2]),
        })),
        "KEYS" => OpReply::Keys {
            cursor: number(&tokens[1]),
            keys: tokens[2..].iter().cloned().map(Bytes::from).collect(),
        },
        "STATS" => OpReply::Stats(
            (1..tokens.len())
                .step_by(2)
                .map(|i| (utf8(i), utf8(i + 1)))
                .collect(),
        ),
        "ERROR" => OpReply::Error {
            status: Status::from_name(word(&tokens[1])).expect("status name"),
            message: utf8(2),
        },
        other => panic!("bad result line {other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .chunks(16)
        .map(|row| format!("{row:02x?}\n"))
        .collect()
}

fn assert_encodes(vector: &Vector, encoded: &[u8]) {
    assert!(
        encoded == vector.bytes.as_slice(),
        "vector {}: the codec encodes\n{}but the document says\n{}",
        vector.name,
        hex(encoded),
        hex(&vector.bytes)
    );
}

fn check(vector: &Vector) {
    let mut buf = BytesMut::from(vector.bytes.as_slice());
    let mut encoded = BytesMut::new();
    let limits = Limits::default();
    match vector.kind.as_str() {
        "hello" => {
            let hello = Hello {
                version: vector.number("version"),
                flags: vector.number("flags"),
            };
            encode_hello(&hello, &mut encoded);
            let user = vector.has("user").then(|| vector.text("user"));
            if let Some(user) = &user {
                encode_user(user.as_bytes(), &mut encoded);
            }
            let password = vector.has("password").then(|| vector.text("password"));
            if let Some(password) = &password {
                encode_auth(password.as_bytes(), &mut encoded);
            }
            assert_encodes(vector, &encoded);
            assert_eq!(
                decode_hello(&mut buf),
                Ok(Some(hello)),
                "vector {}",
                vector.name
            );
            assert_eq!(
                hello.has_auth(),
                password.is_some(),
                "vector {}",
                vector.name
            );
            assert_eq!(hello.has_user(), user.is_some(), "vector {}", vector.name);
            if let Some(user) = user {
                assert_eq!(
                    decode_user(&mut buf),
                    Ok(Some(Bytes::from(user))),
                    "vector {}",
                    vector.name
                );
            }
            if let Some(password) = password {
                assert_eq!(
                    decode_auth(&mut buf),
                    Ok(Some(Bytes::from(password))),
                    "vector {}",
                    vector.name
                );
            }
        }
        "hello-ack" => {
            let version = vector.number("version");
            let ack = match vector.status("status") {
                Status::Ok => HelloAck::Accepted {
                    version,
                    limits: Limits {
                        frame_bytes_max: vector.number("frame_bytes_max"),
                        ops_per_frame_max: vector.number("ops_per_frame_max"),
                        key_bytes_max: vector.number("key_bytes_max"),
                        value_bytes_max: vector.number("value_bytes_max"),
                        pipeline_depth_max: vector.number("pipeline_depth_max"),
                    },
                    server: ServerInfo {
                        server_id: vector.number("server_id"),
                        shard_count: vector.number("shard_count"),
                        server_name: vector.text("server_name"),
                    },
                },
                status => HelloAck::Refused {
                    version,
                    status,
                    message: vector.text("message"),
                },
            };
            encode_hello_ack(&ack, &mut encoded);
            assert_encodes(vector, &encoded);
            assert_eq!(
                decode_hello_ack(&mut buf),
                Ok(Some(ack)),
                "vector {}",
                vector.name
            );
        }
        "request" => {
            let request = Request {
                id: vector.number("id"),
                ops: vector.all("op").into_iter().map(op).collect(),
            };
            encode_request(&request, &mut encoded);
            assert_encodes(vector, &encoded);
            assert_eq!(
                decode_request(&mut buf, &limits),
                Ok(Some(request)),
                "vector {}",
                vector.name
            );
        }
        "response" => {
            let response = Response {
                id: vector.number("id"),
                results: vector.all("result").into_iter().map(result).collect(),
            };
            encode_response(&response, &mut encoded);
            assert_encodes(vector, &encoded);
            assert_eq!(
                decode_response(&mut buf, &limits),
                Ok(Some(ServerFrame::Response(response))),
                "vector {}",
                vector.name
            );
        }
        "error" => {
            let error = ErrorFrame {
                id: (vector.get("id") != "none").then(|| vector.number("id")),
                status: vector.status("status"),
                message: vector.text("message"),
                close: vector.get("close") == "true",
            };
            encode_error(&error, &mut encoded);
            assert_encodes(vector, &encoded);
            assert_eq!(
                decode_response(&mut buf, &limits),
                Ok(Some(ServerFrame::Error(error))),
                "vector {}",
                vector.name
            );
        }
        // `version`: the connection's protocol version (default: the latest).
        "request-rejected" => match decode_request_version(
            &mut buf,
            &limits,
            if vector.has("version") {
                vector.number("version")
            } else {
                PROTOCOL_VERSION
            },
        ) {
            Err(error @ DecodeError::Rejected { .. }) => {
                assert_eq!(
                    error.request_id(),
                    Some(vector.number("id")),
                    "vector {}",
                    vector.name
                );
                assert_eq!(
                    error.status(),
                    vector.status("status"),
                    "vector {}: {error}",
                    vector.name
                );
            }
            other => panic!(
                "vector {}: expected a rejection, got {other:?}",
                vector.name
            ),
        },
        "hello-rejected" => match decode_hello(&mut buf).and_then(|hello| match hello {
            Some(hello) if hello.has_user() => decode_user(&mut buf)
                .and_then(|_| decode_auth(&mut buf))
                .map(|_| Some(hello)),
            Some(hello) if hello.has_auth() => decode_auth(&mut buf).map(|_| Some(hello)),
            other => Ok(other),
        }) {
            Err(error) => {
                assert!(error.closes_connection());
                let Some(HelloAck::Refused { status, .. }) = HelloAck::refusal_for(&error) else {
                    panic!("vector {}: no refusal for {error}", vector.name);
                };
                assert_eq!(
                    status,
                    vector.status("status"),
                    "vector {}: {error}",
                    vector.name
                );
            }
            other => panic!("vector {}: expected a refusal, got {other:?}", vector.name),
        },
        other => panic!("vector {}: unknown type {other}", vector.name),
    }
    if vector.kind != "hello-rejected" {
        assert!(
            buf.is_empty(),
            "vector {}: {} bytes left undecoded",
            vector.name,
            buf.len()
        );
    }
}

#[test]
fn every_vector_in_the_protocol_document_holds() {
    let vectors = parse_vectors(PROTOCOL_MD);
    for vector in &vectors {
        check(vector);
    }
    let mut names: Vec<&str> = vectors.iter().map(|v| v.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), vectors.len(), "vector names must be unique");
    for kind in [
        "hello",
        "hello-ack",
        "request",
        "response",
        "error",
        "request-rejected",
        "hello-rejected",
    ] {
        assert!(
            vectors.iter().any(|v| v.kind == kind),
            "no vector of type {kind}"
        );
    }
}

#[test]
fn every_version_3_operation_and_payload_has_a_vector() {
    let vectors = parse_vectors(PROTOCOL_MD);
    let lines: Vec<&str> = vectors
        .iter()
        .flat_map(|v| v.all("op").into_iter().chain(v.all("result")))
        .collect();
    for word in ["PUT_EXPIRING", "EXPIRE", "TTL", "SCAN", "EXPIRY", "KEYS"] {
        assert!(
            lines
                .iter()
                .any(|line| line.split_whitespace().next() == Some(word)),
            "no vector has an op or result {word}"
        );
    }
    assert!(
        vectors
            .iter()
            .any(|v| v.kind == "request-rejected" && v.has("version")),
        "no vector shows a new opcode refused on an older connection"
    );
}

#[test]
fn the_vector_parser_reads_fields_and_commented_hex() {
    let vectors = parse_vectors(
        "text\n```vector\nname: x\ntype: request\nid: 0x10\nop: PUT \"a\\x00\" \"b c\"\nhex:\n01 02  # note 03\n0a\n```\n",
    );
    assert_eq!(vectors.len(), 1);
    assert_eq!(vectors[0].bytes, vec![1, 2, 10]);
    assert_eq!(vectors[0].number::<u64>("id"), 16);
    assert_eq!(
        op(vectors[0].get("op")),
        RequestOp::Put {
            key: Bytes::from_static(b"a\0"),
            value: Bytes::from_static(b"b c")
        }
    );
}
