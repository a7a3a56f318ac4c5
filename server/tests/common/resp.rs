//! A blocking RESP client for tests, and a server started with a RESP port.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ringkv_protocol::resp::{decode_reply, Reply, ReplyLimits};

use super::{field, start_server, ServerProcess};

/// Starts a server on `dir/data` with `args` and a RESP port the kernel
/// picks; returns it and the RESP address.
pub fn start_with_resp(dir: &Path, args: &[&str]) -> (ServerProcess, SocketAddr) {
    let mut all = vec!["--resp-listen", "127.0.0.1:0"];
    all.extend_from_slice(args);
    let server = start_server(&dir.join("data"), &all);
    let line = server.wait_for_log("ringkv-server ready");
    let resp = field(&line, "resp")
        .parse()
        .expect("resp= in the ready line");
    (server, resp)
}

/// One RESP connection; every read has a 20 s timeout.
pub struct RespConn {
    pub stream: TcpStream,
    buf: BytesMut,
}

impl RespConn {
    pub fn connect(addr: SocketAddr) -> RespConn {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        RespConn {
            stream,
            buf: BytesMut::new(),
        }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    /// Sends one command as an array of bulk strings.
    pub fn send(&mut self, args: &[&[u8]]) {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        self.send_raw(&out);
    }

    /// The next reply, or None at end of stream.
    pub fn read(&mut self) -> Option<Reply> {
        loop {
            if let Some(r) =
                decode_reply(&mut self.buf, &ReplyLimits::default()).expect("valid reply")
            {
                return Some(r);
            }
            let mut chunk = [0u8; 64 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// The next `len` bytes of the stream, undecoded.
    pub fn read_raw(&mut self, len: usize) -> Vec<u8> {
        while self.buf.len() < len {
            let mut chunk = [0u8; 1024];
            let n = self.stream.read(&mut chunk).expect("read");
            assert!(n > 0, "closed");
            self.buf.extend_from_slice(&chunk[..n]);
        }
        self.buf.split_to(len).to_vec()
    }

    /// Sends `args` and returns the reply.
    pub fn call_args(&mut self, args: &[&[u8]]) -> Reply {
        self.send(args);
        self.read()
            .unwrap_or_else(|| panic!("connection closed while waiting for a reply"))
    }

    /// Sends a command written as space-separated words; returns the reply.
    pub fn call(&mut self, line: &str) -> Reply {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        self.send(&args);
        self.read()
            .unwrap_or_else(|| panic!("connection closed while waiting for the reply to {line}"))
    }
}

pub fn bulk(s: &str) -> Reply {
    Reply::Bulk(Bytes::copy_from_slice(s.as_bytes()))
}

pub fn ok() -> Reply {
    Reply::Simple("OK".into())
}

pub fn err(s: &str) -> Reply {
    Reply::Error(s.to_string())
}
