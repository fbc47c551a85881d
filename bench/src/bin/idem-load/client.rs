//! A pooled HTTP/1.1 client that answers with the status, whether the answer was a replay, and
//! the Retry-After it carried.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// How long one request may take before it counts as unanswered (status 0).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What a request got back.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Answer {
    /// The status; 0 when no answer came (connection refused or reset, timeout).
    pub(crate) status: u16,
    /// `Idempotent-Replayed: true`: the stored response of an earlier execution.
    pub(crate) replayed: bool,
    /// The Retry-After header in seconds, if any.
    pub(crate) retry_after: Option<u64>,
}

impl Answer {
    pub(crate) fn success(self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// A client of one server.
#[derive(Clone)]
pub(crate) struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
}

impl Http {
    /// A client of `addr` (HOST:PORT) keeping up to `connections` idle connections.
    pub(crate) fn new(addr: &str, connections: usize) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(connections)
            .build(connector);
        Http {
            client,
            base: format!("http://{addr}"),
        }
    }

    /// POSTs `body` to `path` with the Idempotency-Key `key` (sent as an RFC 8941 string).
    pub(crate) async fn post(&self, path: &str, key: &str, body: Bytes) -> Answer {
        let request = Request::post(format!("{}{path}", self.base))
            .header("idempotency-key", format!("\"{key}\""))
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(body));
        let Ok(request) = request else {
            return Answer {
                status: 0,
                replayed: false,
                retry_after: None,
            };
        };
        let exchange = async {
            let response = self.client.request(request).await.ok()?;
            let status = response.status().as_u16();
            let headers = response.headers();
            let replayed = headers
                .get("idempotent-replayed")
                .is_some_and(|value| value == HeaderValue::from_static("true"));
            let retry_after = headers
                .get(RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.parse().ok());
            // Read the whole body: the connection goes back to the pool only then.
            response.into_body().collect().await.ok()?;
            Some(Answer {
                status,
                replayed,
                retry_after,
            })
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .ok()
            .flatten()
            .unwrap_or(Answer {
                status: 0,
                replayed: false,
                retry_after: None,
            })
    }

    /// The fixture's execution counter (`GET /counter`, `{"count": n}`).
    pub(crate) async fn counter(&self) -> Result<u64, String> {
        let request = Request::get(format!("{}/counter", self.base))
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| format!("GET {}/counter: {e}", self.base))?;
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let text = String::from_utf8_lossy(&body);
        text.trim()
            .trim_start_matches('{')
            .trim_end_matches('}')
            .split_once(':')
            .and_then(|(_, n)| n.trim().parse().ok())
            .ok_or_else(|| format!("GET /counter answered {text:?}"))
    }
}
