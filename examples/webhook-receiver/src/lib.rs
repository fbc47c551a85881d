//! A webhook receiver on idem-worker.
//!
//! `POST /webhooks/{source}` takes an event. Its id (the `X-Event-Id` header, or the `id` field
//! of a JSON body) names the business operation: the key is `webhook:{source}:{id}` (a `:` or
//! `%` in the source percent-encoded, so that each source has keys of its own). The receiver
//! claims the key at once and answers:
//!
//! | situation | answer |
//! |---|---|
//! | a new event, queued | **202** `{"status":"accepted"}`; a worker processes it through the guard |
//! | a duplicate of a processed event | **200** with the stored result and `Idempotent-Replayed: true` |
//! | a duplicate while the first is queued or processing | **409** with `Retry-After` |
//! | the same id with another body | **422** |
//! | the queue is full | **429** with `Retry-After` (the key is released) |
//! | no id, or an invalid one | **400** |
//! | the store is down | **503** with `Retry-After` |
//!
//! Because the key is claimed before the 202, a duplicate arriving while the event waits in the
//! queue is answered 409, and the heartbeat keeps the claim alive while it waits. A transient
//! failure is retried inside the receiver with the guard's backoff (the sender already got its
//! 202 and will not resend), in a task of its own so the workers go on with the queue; the
//! retry claims the key again at once and holds it through the backoff, so a duplicate
//! meanwhile is answered 409 too. A permanent failure is recorded and answered to every
//! duplicate.
//!
//! **The crash window.** An accepted event waits in this process's memory until a worker has
//! run it. If the process dies in between, the event is gone: its claim lapses after the lease
//! (so nothing stays blocked), but the sender has its 202 and does not resend. This receiver
//! suits senders that let you replay events (most webhook providers do, from their dashboard or
//! API). Where an event must survive a crash, publish it to a durable queue (a JetStream stream,
//! a RabbitMQ quorum queue) before answering 202 and process it with a consumer on the same
//! guard (`examples/worker-nats`, `examples/worker-rabbitmq`); or answer 200 only after the job
//! has run (`JobGuard::run`), and let the sender's own retries cover a crash.
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_store_memory::MemoryStore;
//! use idem_worker::JobGuard;
//! use webhook_receiver::{Config, processor};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let guard = JobGuard::builder(Arc::new(MemoryStore::new())).job_type("webhook").build()?;
//! let process = processor(|event, _ctx| async move {
//!     Ok(serde_json::json!({ "handled": event.id }))
//! });
//! let app = webhook_receiver::app(guard, Config::default(), process);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem_core::{Fingerprint, IdempotencyKey};
use idem_worker::{
    Admission, Disposition, JobClaim, JobContext, JobError, JobGuard, JobOutcome, Run, RunError,
};
use serde_json::{Value, json};
use tokio::sync::{Mutex, mpsc};

/// One received event.
#[derive(Clone, Debug)]
pub struct Event {
    /// The sender (the `{source}` of the path).
    pub source: String,
    /// The event id.
    pub id: String,
    /// The body as received.
    pub body: Bytes,
}

/// The future a [`Processor`] returns.
pub type ProcessFuture = Pin<Box<dyn Future<Output = Result<Value, JobError>> + Send>>;

/// What the receiver does with an event: the side effect, run at most once to completion per
/// event id. Its `Ok` value is stored and replayed to duplicates.
pub type Processor = Arc<dyn Fn(Event, JobContext) -> ProcessFuture + Send + Sync>;

/// A [`Processor`] from an async closure.
pub fn processor<F, Fut>(f: F) -> Processor
where
    F: Fn(Event, JobContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, JobError>> + Send + 'static,
{
    Arc::new(move |event, ctx| Box::pin(f(event, ctx)))
}

/// The receiver's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// The header that carries the event id. Default: `x-event-id`.
    pub id_header: HeaderName,
    /// The top-level field of a JSON body that carries the event id when the header is
    /// missing. Default: `id`.
    pub id_field: String,
    /// How many events wait for a worker before the receiver answers 429. Default: 1,024.
    pub queue_capacity: usize,
    /// How many events are processed at once. Default: 4.
    pub workers: usize,
    /// The `Retry-After` of a 429 (queue full) or a 503 (store down). Default: 1 s.
    pub retry_after: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            id_header: HeaderName::from_static("x-event-id"),
            id_field: "id".to_owned(),
            queue_capacity: 1_024,
            workers: 4,
            retry_after: Duration::from_secs(1),
        }
    }
}

struct Job {
    claim: JobClaim,
    event: Event,
    fingerprint: Fingerprint,
}

struct Shared {
    guard: JobGuard,
    config: Config,
    queue: mpsc::Sender<Job>,
    durations: Arc<Durations>,
}

/// How long this receiver's events took to process lately (a moving average, each new run
/// weighing a quarter), for the `Retry-After` of a 409: a duplicate of a 2-second job is told
/// to come back in about 2 seconds, not when the claim's 30-second lease would end.
#[derive(Debug, Default)]
struct Durations {
    average_micros: std::sync::atomic::AtomicU64,
}

impl Durations {
    fn record(&self, took: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let sample = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        let old = self.average_micros.load(Relaxed);
        let new = if old == 0 {
            sample
        } else {
            old - old / 4 + sample / 4
        };
        self.average_micros.store(new.max(1), Relaxed);
    }

    /// When a duplicate should come back: the recent average, at most `lease_left` (the
    /// guard's bound); `lease_left` when nothing was processed yet.
    fn retry_after(&self, lease_left: Duration) -> Duration {
        match self
            .average_micros
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            0 => lease_left,
            average => Duration::from_micros(average).min(lease_left),
        }
    }
}

/// The receiver's router, with `config.workers` worker tasks spawned on the current runtime.
/// The workers stop when the router (every clone of it) is dropped and the queue is drained.
pub fn app(guard: JobGuard, config: Config, process: Processor) -> Router {
    let (queue, receiver) = mpsc::channel(config.queue_capacity.max(1));
    let receiver = Arc::new(Mutex::new(receiver));
    let durations = Arc::new(Durations::default());
    for _ in 0..config.workers.max(1) {
        tokio::spawn(work(
            guard.clone(),
            receiver.clone(),
            process.clone(),
            durations.clone(),
        ));
    }
    let shared = Arc::new(Shared {
        guard,
        config,
        queue,
        durations,
    });
    Router::new()
        .route("/webhooks/{source}", post(receive))
        .with_state(shared)
}

async fn receive(
    State(shared): State<Arc<Shared>>,
    Path(source): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(id) = event_id(&headers, &body, &shared.config) else {
        return problem(
            StatusCode::BAD_REQUEST,
            "the event has no id: send it in the header or in the body",
        );
    };
    let Ok(key) = event_key(&source, &id) else {
        return problem(
            StatusCode::BAD_REQUEST,
            "the event id is not 1 to 255 bytes of printable ASCII",
        );
    };
    let fingerprint = Fingerprint::of(&[source.as_bytes(), &body]);
    match shared.guard.admit::<Value>(&key, fingerprint, 1).await {
        Admission::Claimed(claim) => {
            let event = Event { source, id, body };
            let job = Job {
                claim,
                event,
                fingerprint,
            };
            match shared.queue.try_send(job) {
                Ok(()) => (
                    StatusCode::ACCEPTED,
                    json_body(&json!({"status": "accepted"})),
                )
                    .into_response(),
                Err(full_or_closed) => {
                    let job = match full_or_closed {
                        mpsc::error::TrySendError::Full(job)
                        | mpsc::error::TrySendError::Closed(job) => job,
                    };
                    // Give the key back at once so the sender's retry is accepted.
                    if let Err(error) = job.claim.release().await {
                        tracing::warn!(%error, "release after a full queue failed; the key lapses with its lease");
                    }
                    let mut response = problem(
                        StatusCode::TOO_MANY_REQUESTS,
                        "the processing queue is full",
                    );
                    set_retry_after(&mut response, shared.config.retry_after);
                    response
                }
            }
        }
        Admission::Answered(run) => answer(run, &shared),
    }
}

/// The answer to a duplicate (or a store error).
fn answer(run: Run<Value>, shared: &Shared) -> Response {
    let config = &shared.config;
    match run.outcome {
        JobOutcome::Replayed(result) => replayed(StatusCode::OK, &result),
        JobOutcome::Failed(failure) => replayed(
            StatusCode::OK,
            &json!({"status": "failed", "error": failure.message}),
        ),
        JobOutcome::InFlight { retry_after } => {
            let mut response = problem(
                StatusCode::CONFLICT,
                "this event is still being processed; retry later",
            );
            set_retry_after(&mut response, shared.durations.retry_after(retry_after));
            response
        }
        JobOutcome::Mismatch => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "this event id was already received with another body",
        ),
        JobOutcome::Error(RunError::Store { .. }) => {
            let mut response = problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "the idempotency store is unavailable",
            );
            set_retry_after(&mut response, config.retry_after);
            response
        }
        _ => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the stored result could not be read",
        ),
    }
}

/// The event id: the header, else the body's id field (a string or a number).
fn event_id(headers: &HeaderMap, body: &[u8], config: &Config) -> Option<String> {
    if let Some(value) = headers.get(&config.id_header) {
        return value
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned);
    }
    let parsed: Value = serde_json::from_slice(body).ok()?;
    match parsed.get(&config.id_field)? {
        Value::String(id) if !id.is_empty() => Some(id.clone()),
        Value::Number(id) => Some(id.to_string()),
        _ => None,
    }
}

/// The key of event `id` from `source`: `webhook:{source}:{id}`, with `%` and `:` of the
/// source percent-encoded, so the first `:` after the source ends it and two (source, id)
/// pairs never share a key (source `a:b` with id `c` against source `a` with id `b:c`).
fn event_key(source: &str, id: &str) -> Result<IdempotencyKey, idem_core::KeyError> {
    let source = source.replace('%', "%25").replace(':', "%3A");
    IdempotencyKey::new(format!("webhook:{source}:{id}"))
}

/// One worker: takes queued events and runs them through their claim; an event to retry goes
/// on in a task of its own ([`retry`]), so this worker goes on with the queue.
async fn work(
    guard: JobGuard,
    queue: Arc<Mutex<mpsc::Receiver<Job>>>,
    process: Processor,
    durations: Arc<Durations>,
) {
    loop {
        let job = {
            let mut receiver = queue.lock().await;
            receiver.recv().await
        };
        let Some(Job {
            claim,
            event,
            fingerprint,
        }) = job
        else {
            return;
        };
        let process_once = process.clone();
        let first = event.clone();
        let started = std::time::Instant::now();
        let run: Run<Value> = claim.run(move |ctx| process_once(first, ctx)).await;
        durations.record(started.elapsed());
        match run.disposition {
            // The sender already has its 202: retries are ours.
            Disposition::Retry { after } => {
                tokio::spawn(retry(
                    guard.clone(),
                    process.clone(),
                    event,
                    fingerprint,
                    after,
                ));
            }
            Disposition::DeadLetter => dead_lettered(&event),
            Disposition::Ack => {}
        }
    }
}

/// Runs `event` again after `backoff`, with the guard's backoff between tries, until it is
/// done or dead-lettered. Each try claims the key at once and holds it (the heartbeat keeps
/// it) through its backoff: a duplicate meanwhile is answered 409, not accepted again.
async fn retry(
    guard: JobGuard,
    process: Processor,
    event: Event,
    fingerprint: Fingerprint,
    mut backoff: Duration,
) {
    let Ok(key) = event_key(&event.source, &event.id) else {
        return;
    };
    let mut delivery = 1;
    loop {
        delivery += 1;
        let disposition = match guard.admit::<Value>(&key, fingerprint, delivery).await {
            Admission::Claimed(claim) => {
                tokio::time::sleep(backoff).await;
                let (process, again) = (process.clone(), event.clone());
                claim.run(move |ctx| process(again, ctx)).await.disposition
            }
            Admission::Answered(run) => match run.disposition {
                // Held elsewhere (or the store is down): wait as told, then claim and run.
                Disposition::Retry { after } => {
                    tokio::time::sleep(after).await;
                    backoff = Duration::ZERO;
                    continue;
                }
                settled => settled,
            },
        };
        match disposition {
            Disposition::Retry { after } => backoff = after,
            Disposition::DeadLetter => return dead_lettered(&event),
            Disposition::Ack => return,
        }
    }
}

fn dead_lettered(event: &Event) {
    tracing::error!(source = %event.source, id = %event.id, "event dead-lettered");
}

fn json_body(value: &Value) -> ([(HeaderName, HeaderValue); 1], String) {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        value.to_string(),
    )
}

fn replayed(status: StatusCode, value: &Value) -> Response {
    let mut response = (status, json_body(value)).into_response();
    response.headers_mut().insert(
        HeaderName::from_static("idempotent-replayed"),
        HeaderValue::from_static("true"),
    );
    response
}

fn problem(status: StatusCode, detail: &str) -> Response {
    let body = json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        )],
        body.to_string(),
    )
        .into_response()
}

/// `Retry-After` in whole seconds, at least 1.
fn set_retry_after(response: &mut Response, after: Duration) {
    let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
}
