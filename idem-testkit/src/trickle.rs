//! [`trickle`]: a client that sends a request's body one byte at a time, the slow-body attack
//! that a request body timeout answers.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends the request head `head` (with its blank line) to `addr`, then its body one byte
/// (`x`) every `every`, at most `most` bytes, until the server answers and closes the
/// connection (or stops reading). The server's answer, as text.
pub async fn trickle(addr: SocketAddr, head: &str, every: Duration, most: usize) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 1024];
    for _ in 0..most {
        if stream.write_all(b"x").await.is_err() {
            break;
        }
        match tokio::time::timeout(every, stream.read(&mut buffer)).await {
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&buffer[..n]),
            Err(_) => {}
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}
