//! HTTP/1 written and read by hand, for what a client library would not do: an upstream that
//! answers whatever bytes a test gives it (a 101, an HTTP/1.0 status line, a broken chunk,
//! trailers no library would send), and a client that sends trailers and reads the status
//! line and the trailers as they came.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedReadHalf;

/// One HTTP/1 message as read: its head (start line and header lines, as sent), its body
/// (de-chunked) and its trailer lines.
#[derive(Clone, Debug, Default)]
pub struct Message {
    pub head: Vec<String>,
    pub body: Vec<u8>,
    pub trailers: Vec<String>,
}

impl Message {
    /// The start line.
    pub fn start(&self) -> &str {
        self.head.first().map_or("", String::as_str)
    }

    /// The value of the first field `name` (case-insensitive) among `lines`.
    fn field<'a>(lines: &'a [String], name: &str) -> Option<&'a str> {
        lines.iter().find_map(|line| {
            let (field, value) = line.split_once(':')?;
            field
                .trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim())
        })
    }

    /// The value of the header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        Message::field(self.head.get(1..).unwrap_or_default(), name)
    }

    /// The value of the trailer `name`.
    pub fn trailer(&self, name: &str) -> Option<&str> {
        Message::field(&self.trailers, name)
    }

    /// The names of the trailers, in lower case.
    pub fn trailer_names(&self) -> Vec<String> {
        self.trailers
            .iter()
            .filter_map(|line| line.split_once(':'))
            .map(|(name, _)| name.trim().to_ascii_lowercase())
            .collect()
    }
}

/// Reads one line without its CRLF; `None` at the end of the stream.
async fn line(reader: &mut BufReader<OwnedReadHalf>) -> Option<String> {
    let mut text = String::new();
    let n = reader.read_line(&mut text).await.ok()?;
    (n > 0).then(|| text.trim_end_matches(['\r', '\n']).to_owned())
}

/// Reads one message: its head, then a body of `Content-Length`, a chunked body and its
/// trailers, or none. `None` when the stream ends (or breaks) before a whole message.
pub async fn read_message(reader: &mut BufReader<OwnedReadHalf>) -> Option<Message> {
    let mut message = Message::default();
    loop {
        let line = line(reader).await?;
        if line.is_empty() {
            break;
        }
        message.head.push(line);
    }
    if message
        .header("transfer-encoding")
        .is_some_and(|value| value.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let size = line(reader).await?;
            let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
            if size == 0 {
                break;
            }
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).await.ok()?;
            message.body.extend_from_slice(&chunk[..size]);
        }
        loop {
            let line = line(reader).await?;
            if line.is_empty() {
                break;
            }
            message.trailers.push(line);
        }
    } else if let Some(len) = message.header("content-length") {
        let mut body = vec![0; len.parse().ok()?];
        reader.read_exact(&mut body).await.ok()?;
        message.body = body;
    }
    Some(message)
}

/// What a [`RawUpstream`] answers to a request: the bytes to write, given the request and
/// the number of its execution (from 1).
pub type Answer = Arc<dyn Fn(&Message, u64) -> String + Send + Sync>;

/// An upstream that reads one request per connection, writes the bytes its [`Answer`] gives
/// and closes the connection.
pub struct RawUpstream {
    pub addr: SocketAddr,
    pub runs: Arc<AtomicU64>,
    pub requests: Arc<Mutex<Vec<Message>>>,
}

impl RawUpstream {
    pub async fn start(answer: impl Fn(&Message, u64) -> String + Send + Sync + 'static) -> Self {
        let answer: Answer = Arc::new(answer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let runs = Arc::new(AtomicU64::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (counter, log) = (runs.clone(), requests.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (answer, counter, log) = (answer.clone(), counter.clone(), log.clone());
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut reader = BufReader::new(read);
                    let Some(request) = read_message(&mut reader).await else {
                        return;
                    };
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    let bytes = answer(&request, n);
                    log.lock().unwrap().push(request);
                    let _ = write.write_all(bytes.as_bytes()).await;
                    let _ = write.shutdown().await;
                });
            }
        });
        RawUpstream {
            addr,
            runs,
            requests,
        }
    }

    /// How many requests it answered.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::SeqCst)
    }

    /// The last request it read.
    pub fn last_request(&self) -> Message {
        self.requests.lock().unwrap().last().cloned().unwrap()
    }
}

/// A client connection, kept open between requests.
pub struct RawClient {
    reader: BufReader<OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
}

impl RawClient {
    /// Connects to `url` (`http://host:port`).
    pub async fn connect(url: &str) -> RawClient {
        let stream = TcpStream::connect(url.trim_start_matches("http://"))
            .await
            .unwrap();
        let (read, writer) = stream.into_split();
        RawClient {
            reader: BufReader::new(read),
            writer,
        }
    }

    /// Writes `request` as it is and reads the answer; `None` when the connection ends first.
    pub async fn exchange(&mut self, request: &str) -> Option<Message> {
        self.writer.write_all(request.as_bytes()).await.ok()?;
        read_message(&mut self.reader).await
    }
}
