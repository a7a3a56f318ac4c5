//! Connects to a ringkv server, writes, reads and sends a batch.
//!
//! ```text
//! cargo run -p ringkv-client --example basic -- [HOST:PORT]
//! ```
//!
//! HOST:PORT defaults to 127.0.0.1:7379. For a server with a password, set
//! RINGKV_PASSWORD.

use std::time::Duration;

use ringkv_client::{Client, ClientError, ConnectOptions, OpReply, RequestOp};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), ClientError> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:7379".to_owned());
    let mut options = ConnectOptions::new().with_timeout(Duration::from_secs(5));
    if let Some(password) = std::env::var_os("RINGKV_PASSWORD") {
        options = options.with_password(password.into_encoded_bytes());
    }
    let client = Client::connect_with(&addr, &options).await?;
    let server = client.server_info();
    println!(
        "connected to {} ({} shards), protocol version {}",
        server.server_name,
        server.shard_count,
        client.protocol_version()
    );

    // One operation per round trip.
    client.put("example:greeting", "hello").await?;
    let greeting = client.get("example:greeting").await?;
    println!(
        "example:greeting = {:?}",
        greeting.as_deref().map(String::from_utf8_lossy)
    );

    // Many operations in one frame: one round trip, one reply each, in order.
    let ops = (0..3)
        .map(|n| RequestOp::Put {
            key: format!("example:{n}").into(),
            value: format!("value {n}").into(),
        })
        .chain((0..4).map(|n| RequestOp::Get {
            key: format!("example:{n}").into(),
        }))
        .collect();
    for reply in client.batch(ops).await? {
        match reply {
            OpReply::Ok => println!("OK"),
            OpReply::Value(value) => println!("{}", String::from_utf8_lossy(&value)),
            OpReply::NotFound => println!("(nil)"),
            OpReply::Error { status, message } => println!("error {status}: {message}"),
            other => println!("{other:?}"),
        }
    }

    // Clean up: delete the example's keys in one frame.
    let deletes = ["example:greeting", "example:0", "example:1", "example:2"]
        .into_iter()
        .map(|key| RequestOp::Delete { key: key.into() })
        .collect();
    client.batch(deletes).await?;
    Ok(())
}
