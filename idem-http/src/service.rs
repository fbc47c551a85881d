//! [`Idempotency`]: the middleware service, and the life of one request through it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, request};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use idem_core::{
    BoxError, ClaimOutcome, ClaimRequest, Lease, OwnerToken, RecordKey, Store, StoreError,
    UnknownOutcome,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tower_service::Service;

use crate::body::{self, CaptureError, ResponseBody, StreamFrame};
use crate::claim::Claim;
use crate::codec::StoredResponse;
use crate::config::{Config, KeyPolicy, StoreFailure};
use crate::context::IdempotencyContext;
use crate::detach::Detached;
use crate::fields;
use crate::fingerprint::{request_fingerprint_with_host, request_host};
use crate::future::ResponseFuture;
use crate::header::parse_header;
use crate::layer::Shared;
use crate::metrics;
use crate::outcome::Outcome;
use crate::rejection::{Rejection, retry_after_secs};
use crate::replay::replay;
use crate::unknown::OutcomeUnknown;

/// Added to every replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// Added to a replay whose body was over the storage cap and not stored (value `omitted`).
pub const REPLAY_HEADER: &str = "idempotency-replay";
/// Added, in fail-open mode, to a response the store did not record (value `unrecorded`).
pub const STATUS_HEADER: &str = "idempotency-status";

/// Frames buffered between the handler's task and a slow client.
const STREAM_FRAMES: usize = 16;
/// The instant `by` from now, saturated ([`idem_lease::saturating_deadline`]).
pub(crate) fn after(by: Duration) -> Instant {
    idem_lease::saturating_deadline(Instant::now(), by)
}

/// The middleware of [`crate::IdempotencyLayer`]: wraps the service `S`.
pub struct Idempotency<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: Clone> Clone for Idempotency<S> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("store", &self.shared.store)
            .field("config", &self.shared.config)
            .finish()
    }
}

impl<S> Idempotency<S> {
    /// Wraps `inner` with a store and settings (the layer is the usual way in).
    pub fn new(inner: S, store: impl Store + 'static, config: Config) -> Self {
        Idempotency::from_shared(inner, Arc::new(Shared::new(Arc::new(store), config)))
    }

    pub(crate) fn from_shared(inner: S, shared: Arc<Shared>) -> Self {
        Idempotency { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Idempotency<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError> + Send,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let config = &self.shared.config;
        if !config.covers(request.method()) {
            if config.covers_in_another_case(request.method()) {
                let method = request.method().clone();
                return ResponseFuture::ready(
                    self.shared
                        .metrics
                        .counted(reject(&self.shared, Rejection::MethodCase { method })),
                );
            }
            return ResponseFuture::bypass(self.inner.call(request), self.shared.clone());
        }
        let key = match parse_header(request.headers(), &config.header_name, config.strict) {
            Ok(Some(key)) => key,
            Ok(None) if config.key_policy == KeyPolicy::Optional => {
                return ResponseFuture::bypass(self.inner.call(request), self.shared.clone());
            }
            Ok(None) => {
                let header = config.header_name.clone();
                let rejection = Rejection::MissingKey { header };
                return ResponseFuture::ready(
                    self.shared.metrics.counted(reject(&self.shared, rejection)),
                );
            }
            Err(error) => {
                let header = config.header_name.clone();
                let rejection = Rejection::InvalidKey { header, error };
                return ResponseFuture::ready(
                    self.shared.metrics.counted(reject(&self.shared, rejection)),
                );
            }
        };
        let (parts, body) = request.into_parts();
        let Ok(scope) = config.scope_of(&parts) else {
            return ResponseFuture::ready(
                self.shared
                    .metrics
                    .counted(reject(&self.shared, Rejection::InvalidScope)),
            );
        };
        // Take the service that was driven to readiness; leave a clone in its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let key = RecordKey::new(scope, key);
        // The work is polled inline by the response future, but owned by a guard that hands it
        // to a task of its own if that future is dropped (the client disconnected) or returns
        // before the work ends (a streamed response): the handler always runs to completion and
        // its claim is always settled. A panic in the work is caught and answered with 500.
        let (reply, answer) = oneshot::channel();
        let work = Detached::new(Box::pin(process(
            inner,
            self.shared.clone(),
            parts,
            body,
            key,
            reply,
        )));
        ResponseFuture::managed(work, answer, self.shared.clone())
    }
}

/// The response for `rejection`, with its outcome and `Retry-After`.
pub(crate) fn reject<B>(shared: &Shared, rejection: Rejection) -> Response<ResponseBody<B>> {
    let mut response = shared
        .config
        .rejection
        .respond(&rejection)
        .map(ResponseBody::full);
    if let Some(delay) = rejection.retry_after() {
        if !response.headers().contains_key(RETRY_AFTER) {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(delay)));
        }
    }
    response.extensions_mut().insert(rejection.outcome());
    response.extensions_mut().insert(rejection);
    response
}

/// The key as logs show it: as sent, or a digest when keys are redacted.
pub(crate) fn log_key(config: &Config, key: &RecordKey) -> String {
    if config.log_keys {
        key.to_string()
    } else {
        key.digest_hex()
    }
}

/// The answer sent from the task that processes a request to its caller.
pub(crate) type Reply<B, E> = Result<Response<ResponseBody<B>>, E>;

/// Captures the body, claims the key and answers from what the store says; runs the handler
/// under the claim if it is granted.
async fn process<S, ReqBody, ResBody>(
    inner: S,
    shared: Arc<Shared>,
    parts: request::Parts,
    body: ReqBody,
    key: RecordKey,
    reply: oneshot::Sender<Reply<ResBody, S::Error>>,
) where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: Body + From<Bytes>,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send,
    ResBody::Error: Into<BoxError> + Send,
{
    let config = &shared.config;
    let bytes = match read_body(&shared, body).await {
        Ok(bytes) => bytes,
        Err(rejection) => {
            let _ = reply.send(Ok(rejection));
            return;
        }
    };
    if reply.is_closed() {
        // The caller went away before its request was claimed: nothing ran, nothing to settle.
        return;
    }
    let host = if config.fingerprint_host {
        request_host(&parts)
    } else {
        None
    };
    let fingerprint = request_fingerprint_with_host(
        &parts.method,
        fingerprinted_uri(&parts),
        host.as_deref(),
        &bytes,
    );
    // The owner is chosen here, so that a claim whose answer is lost can be sent again to learn
    // whether it was granted ([`release_if_granted`]).
    let claim = ClaimRequest::new(key, fingerprint, config.lease).with_owner(OwnerToken::random());
    let deadline = config.wait.map(after);
    let mut pause = Duration::from_millis(10);
    let answer = loop {
        let answer = shared.store.claim(&claim).await;
        let state_before = answer.as_ref().map_or("unknown", ClaimOutcome::kind);
        tracing::debug!(
            idempotency_key = %log_key(config, &claim.key),
            state_before,
            "idempotency claim answered"
        );
        match answer {
            Ok(ClaimOutcome::Acquired { lease, taken_over }) => {
                let request = Request::from_parts(parts, ReqBody::from(bytes));
                let request = acquired(&shared, request, &lease, taken_over);
                drive(inner, shared.clone(), request, lease, reply).await;
                return;
            }
            Ok(ClaimOutcome::InFlight { retry_after }) => {
                if let Some(deadline) = deadline {
                    let now = Instant::now();
                    if now < deadline && !reply.is_closed() {
                        tokio::time::sleep(pause.min(deadline - now)).await;
                        pause = (pause * 2).min(Duration::from_millis(250));
                        continue;
                    }
                }
                shared.metrics.collisions.increment(1);
                let retry_after = shared.durations.retry_after(config.lease, retry_after);
                break Ok(reject(&shared, Rejection::InFlight { retry_after }));
            }
            // A settled record: its answer, never a run.
            Ok(settled) => break Ok(answer_settled(&shared, settled)),
            Err(error) => {
                claim_failed(&shared, &claim, &error);
                match config.store_failure {
                    StoreFailure::FailClosed => {
                        let retry_after = config.store_retry_after;
                        break Ok(reject(&shared, Rejection::StoreUnavailable { retry_after }));
                    }
                    StoreFailure::FailOpen => {
                        let reply = UnrecordedReply {
                            shared: shared.clone(),
                            reply: Some(reply),
                        };
                        // Boxed: fail-open is off the common path (see drive).
                        Box::pin(run_unrecorded(inner, parts, bytes, reply)).await;
                        return;
                    }
                }
            }
        }
    };
    let _ = reply.send(answer);
}

/// The answer to a claim of a key whose record is settled (or whose payload differs): a
/// replay, or the rejection that says why it does not run.
fn answer_settled<B>(shared: &Shared, outcome: ClaimOutcome) -> Response<ResponseBody<B>> {
    match outcome {
        ClaimOutcome::Completed(record) => {
            shared.metrics.replays.increment(1);
            replay(shared, &record)
        }
        ClaimOutcome::Failed(_) => reject(shared, Rejection::FailedPermanently),
        // An earlier attempt lost the answer of its side effect: never run again.
        ClaimOutcome::Unknown(record) => reject(shared, outcome_unknown(record)),
        ClaimOutcome::Mismatch => {
            shared.metrics.mismatches.increment(1);
            reject(shared, Rejection::Mismatch)
        }
        // Answered by the caller's loop; never here.
        ClaimOutcome::Acquired { .. } | ClaimOutcome::InFlight { .. } => reject(
            shared,
            Rejection::StoreUnavailable {
                retry_after: shared.config.store_retry_after,
            },
        ),
    }
}

/// Logs a claim the store failed on; a claim that timed out may have been granted all the
/// same, and is released if it was ([`release_if_granted`]).
fn claim_failed(shared: &Arc<Shared>, claim: &ClaimRequest, error: &StoreError) {
    let config = &shared.config;
    tracing::warn!(
        idempotency_key = %log_key(config, &claim.key),
        error = %error.redacted(!config.log_keys),
        "idempotency store failed on claim"
    );
    if matches!(error, StoreError::Timeout { .. }) {
        release_if_granted(shared.clone(), claim.clone());
    }
}

/// Counts a granted claim and hands its request the [`IdempotencyContext`] of its lease.
fn acquired<B>(
    shared: &Shared,
    mut request: Request<B>,
    lease: &Lease,
    taken_over: bool,
) -> Request<B> {
    let config = &shared.config;
    shared.metrics.claims_acquired.increment(1);
    if taken_over {
        metrics::increment(metrics::key!(metrics::TAKEOVERS));
        tracing::info!(
            idempotency_key = %log_key(config, &lease.key),
            fence = lease.fence.get(),
            attempt = lease.attempt,
            "took over a lapsed lease"
        );
    }
    request.extensions_mut().insert(IdempotencyContext {
        key: lease.key.key.clone(),
        scope: lease.key.scope.clone(),
        fence: lease.fence,
        attempt: lease.attempt,
    });
    request
}

/// Reads a covered request's body, within the body limit and the body timeout; else the
/// rejection to answer (nothing is claimed yet, so there is nothing to release).
async fn read_body<B, R>(shared: &Shared, body: B) -> Result<Bytes, Response<ResponseBody<R>>>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let config = &shared.config;
    let captured =
        tokio::time::timeout(config.body_timeout, body::capture(body, config.body_limit));
    match captured.await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(CaptureError::TooLarge)) => {
            let limit = config.body_limit;
            Err(reject(shared, Rejection::BodyTooLarge { limit }))
        }
        Ok(Err(CaptureError::Read)) => Err(reject(shared, Rejection::BodyUnreadable)),
        Err(_) => {
            let timeout = config.body_timeout;
            let mut response = reject(shared, Rejection::BodyTimeout { timeout });
            // RFC 9110 section 15.5.9: the rest of the body is not read; the connection goes.
            response
                .headers_mut()
                .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
            Err(response)
        }
    }
}

/// The URI the fingerprint covers: the one the client sent. Behind axum's `Router::nest` the
/// request's URI has lost the prefix (two nested routers would fingerprint `POST /` alike);
/// axum keeps the URI as sent in `OriginalUri`.
fn fingerprinted_uri(parts: &request::Parts) -> &http::Uri {
    #[cfg(feature = "axum")]
    if let Some(original) = parts.extensions.get::<axum::extract::OriginalUri>() {
        return &original.0;
    }
    &parts.uri
}

/// A claim whose answer timed out may have been granted all the same: its record would then
/// hold the key for a whole lease with nothing running, answering every retry 409. Sends the
/// claim again (same owner, so a grant it made is answered again) until the store answers,
/// backing off, for up to one lease, and releases what it is granted.
fn release_if_granted(shared: Arc<Shared>, claim: ClaimRequest) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let deadline = after(claim.lease);
        let mut pause = Duration::from_millis(100);
        loop {
            tokio::time::sleep(pause).await;
            match shared.store.claim(&claim).await {
                Ok(ClaimOutcome::Acquired { lease, .. }) => {
                    let released = shared.store.release(&lease).await;
                    tracing::debug!(
                        idempotency_key = %log_key(&shared.config, &claim.key),
                        fence = lease.fence.get(),
                        released = released.is_ok(),
                        "released the claim of a request whose claim had timed out"
                    );
                    return;
                }
                // Another attempt holds the key, or it is settled: nothing of this one's.
                Ok(_) => return,
                Err(error) if error.is_retryable() && Instant::now() + pause < deadline => {
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(_) => return,
            }
        }
    });
}

/// Fail-open: runs the handler without a record, and marks the response.
async fn run_unrecorded<S, ReqBody, ResBody>(
    mut inner: S,
    parts: request::Parts,
    bytes: Bytes,
    mut reply: UnrecordedReply<ResBody, S::Error>,
) where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: From<Bytes>,
{
    let answer = inner
        .call(Request::from_parts(parts, ReqBody::from(bytes)))
        .await
        .map(|mut response| {
            fields::settle_head(response.headers_mut());
            unrecorded(response.map(ResponseBody::inner))
        });
    reply.send(answer);
}

/// Marks a response the store did not record (fail open): `Idempotency-Status: unrecorded` and
/// the outcome `store_error`.
fn unrecorded<B>(mut response: Response<ResponseBody<B>>) -> Response<ResponseBody<B>> {
    response.headers_mut().insert(
        HeaderName::from_static(STATUS_HEADER),
        HeaderValue::from_static("unrecorded"),
    );
    response.extensions_mut().insert(Outcome::StoreError);
    response
}

/// The answer of a request run unrecorded (fail open). Dropped unsent (the handler panicked),
/// it answers the 500 of [`Rejection::HandlerFailed`], marked unrecorded like every response of
/// a request the store did not record.
struct UnrecordedReply<B, E> {
    shared: Arc<Shared>,
    reply: Option<oneshot::Sender<Reply<B, E>>>,
}

impl<B, E> UnrecordedReply<B, E> {
    fn send(&mut self, answer: Reply<B, E>) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(answer);
        }
    }
}

impl<B, E> Drop for UnrecordedReply<B, E> {
    fn drop(&mut self) {
        if self.reply.is_some() {
            let failed = unrecorded(reject(&self.shared, Rejection::HandlerFailed));
            self.send(Ok(failed));
        }
    }
}

/// Runs the handler under the claim, answers the caller and settles the claim (complete, or
/// release).
///
/// A response whose body is complete before it goes out (empty, of a known length within the
/// storage cap, or whose frames were all ready at once) goes out whole ([`answer_whole`]); any
/// other response streams to the caller as it is read ([`answer_streamed`]).
async fn drive<S, ReqBody, ResBody>(
    mut inner: S,
    shared: Arc<Shared>,
    request: Request<ReqBody>,
    lease: Lease,
    reply: oneshot::Sender<Reply<ResBody, S::Error>>,
) where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes>,
    ResBody::Error: Into<BoxError> + Send,
{
    let mut claim = Claim::new(shared.clone(), lease);
    let mut response = match claim.beating(inner.call(request)).await {
        Ok(response) => response,
        Err(error) => {
            claim.release("handler_error").await;
            let _ = reply.send(Err(error));
            return;
        }
    };
    if let Some(OutcomeUnknown(outcome)) = response.extensions_mut().remove::<OutcomeUnknown>() {
        claim.settle_unknown(outcome).await;
        fields::settle_head(response.headers_mut());
        let _ = reply.send(Ok(response.map(ResponseBody::inner)));
        return;
    }
    fields::settle_head(response.headers_mut());
    if !shared.config.stores_status(response.status()) {
        claim.release("status").await;
        let _ = reply.send(Ok(response.map(ResponseBody::inner)));
        return;
    }
    let (parts, body) = response.into_parts();
    let hint = body.size_hint();
    let mut body = std::pin::pin!(body);
    // The frames read before the response goes out, and whether they are the whole body.
    let mut early = Early::default();
    let cap = storage_cap(&shared.config);
    if early
        .read(&mut claim, body.as_mut(), &hint, cap)
        .await
        .is_err()
    {
        // The handler answered: its effect may have happened.
        let lost = UnknownOutcome::new("the response body broke off before it was read whole");
        claim.settle_unknown(lost.head_seen(true)).await;
        let _ = reply.send(Ok(reject(&shared, Rejection::ResponseBodyFailed)));
        return;
    }
    if early.ended {
        let sized = hint.exact().is_some();
        answer_whole(claim, &shared, parts, early, sized, reply).await;
    } else {
        // Boxed: its state (the channel, the capture, the frame held) is most of this future's
        // size, and a response that goes out whole would otherwise move it around for nothing.
        Box::pin(answer_streamed(
            claim, &shared, parts, early, body, hint, reply,
        ))
        .await;
    }
}

/// The rejection of a claim answered unknown: the record's key, fence and reason, and when to
/// come back (the hold left, at most a minute; a minute when held until resolved).
fn outcome_unknown(record: idem_core::Record) -> Rejection {
    use idem_core::Clock;
    const MOST: Duration = Duration::from_secs(60);
    let retry_after = record.hold_until.map_or(MOST, |until| {
        until
            .saturating_since(idem_core::SystemClock.now())
            .clamp(Duration::from_secs(1), MOST)
    });
    let reason = record.unknown.map_or_else(
        || "an earlier attempt lost its answer".to_owned(),
        |unknown| unknown.reason,
    );
    Rejection::OutcomeUnknown {
        key: record.key,
        fence: record.fence,
        reason,
        retry_after,
    }
}

/// The storage cap, in the unit of size hints.
fn storage_cap(config: &Config) -> u64 {
    u64::try_from(config.storage_cap).unwrap_or(u64::MAX)
}

/// Answers a response read whole (`early` ended; `sized` if its length was announced) once its
/// record is settled: the response leaves whole, head and body in one write, and a client that
/// holds it finds it stored, whatever the socket's `TCP_NODELAY` (a body sent less its end, and
/// the end after the store answered, would wait for the client's delayed ACK under Nagle).
async fn answer_whole<B, E>(
    mut claim: Claim,
    shared: &Shared,
    parts: http::response::Parts,
    early: Early,
    sized: bool,
    reply: oneshot::Sender<Reply<B, E>>,
) {
    let config = &shared.config;
    let (data, trailers) = early.into_whole();
    let response = StoredResponse {
        status: parts.status,
        headers: config.storable_headers(&parts.headers),
        body: (data.len() as u64 <= storage_cap(config)).then(|| data.clone()),
        trailers: trailers
            .as_ref()
            .map(|t| config.storable_headers(t))
            .unwrap_or_default(),
    };
    let unstored = claim.complete(response).await;
    let body = ResponseBody::whole(data, trailers, sized);
    let _ = reply.send(Ok(Response::from_parts(parts, body)));
    // The caller has its answer; a record the store failed to take is still worth storing.
    if let Some(encoded) = unstored {
        claim.retry_complete(encoded).await;
    }
}

/// Streams a response to the caller (`early` first, then the rest of `body`) while capturing
/// it for its record, up to the storage cap (a larger body is stored omitted). Its last frame
/// is held until the record is settled and then goes out with the end, so a caller that has
/// read the whole response finds it stored, and the server writes the two together.
async fn answer_streamed<B, E>(
    mut claim: Claim,
    shared: &Shared,
    parts: http::response::Parts,
    early: Early,
    mut body: Pin<&mut B>,
    hint: http_body::SizeHint,
    reply: oneshot::Sender<Reply<B, E>>,
) where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let config = &shared.config;
    let (status, headers) = (parts.status, config.storable_headers(&parts.headers));
    let (frames, receiver) = mpsc::channel(STREAM_FRAMES);
    let _ = reply.send(Ok(Response::from_parts(
        parts,
        ResponseBody::stream(receiver, hint),
    )));
    let mut out = Outgoing {
        frames,
        left: hint.exact(),
        held: None,
    };
    // A body announced over the cap is not captured at all.
    let cap = storage_cap(config);
    let mut captured = Capture::new(hint.lower() <= cap, cap);
    for frame in early.frames() {
        captured.add(config, &frame);
        out.send(&mut claim, frame).await;
    }
    // The frame read last, passed on once the next one is known not to be ready (or to be
    // another frame): a last frame whose end is ready with it is held for the end.
    let mut read: Option<Frame<Bytes>> = None;
    loop {
        let next = match poll_once(std::pin::pin!(body.frame())).await {
            Poll::Ready(next) => next,
            Poll::Pending => {
                if let Some(frame) = read.take() {
                    out.send(&mut claim, frame).await;
                }
                claim.beating(body.frame()).await
            }
        };
        match next.map(|frame| frame.map(fields::settle_frame)) {
            None => break,
            Some(Ok(frame)) => {
                captured.add(config, &frame);
                if let Some(before) = read.replace(frame) {
                    out.send(&mut claim, before).await;
                }
            }
            Some(Err(error)) => {
                let lost = UnknownOutcome::new("the response body broke off after its head");
                claim.settle_unknown(lost.head_seen(true)).await;
                if let Some(before) = read.take() {
                    out.send(&mut claim, before).await;
                }
                let _ = out.frames.send(StreamFrame::Frame(Err(error.into()))).await;
                return;
            }
        }
    }
    let response = StoredResponse {
        status,
        headers,
        body: captured.chunks.map(concat),
        trailers: captured.trailers,
    };
    if let Some(encoded) = claim.complete(response).await {
        claim.retry_complete(encoded).await;
    }
    // Only now is the body complete: a task that stops before this line (a panic in the
    // handler's body) breaks the caller's body off instead of ending it.
    out.end(read).await;
}

/// The sending end of a streamed body. Of a body of announced length it holds back the frame
/// that completes the length until the record is settled: with it, a client has the whole body
/// (its end is not signalled otherwise), so a client that has it finds the record stored.
struct Outgoing {
    frames: mpsc::Sender<StreamFrame>,
    /// The bytes still to come of the announced length.
    left: Option<u64>,
    held: Option<Frame<Bytes>>,
}

impl Outgoing {
    /// Sends `frame`, or holds it if it completes the announced length; a caller that went away
    /// no longer reads: the work goes on, the record matters.
    async fn send(&mut self, claim: &mut Claim, frame: Frame<Bytes>) {
        if let Some(held) = self.held.take() {
            // More than the announced length (or trailers): what was held goes first.
            let _ = claim
                .beating(self.frames.send(StreamFrame::Frame(Ok(held))))
                .await;
        }
        if let (Some(left), Some(data)) = (self.left.as_mut(), frame.data_ref()) {
            let len = data.len() as u64;
            if len == 0 {
                return;
            }
            let completes = len >= *left;
            *left = left.saturating_sub(len);
            if completes {
                self.held = Some(frame);
                return;
            }
        }
        let _ = claim
            .beating(self.frames.send(StreamFrame::Frame(Ok(frame))))
            .await;
    }

    /// Sends what was held back and `last`, the body's last frame if it was held too, with
    /// the end.
    async fn end(mut self, last: Option<Frame<Bytes>>) {
        let last = match (self.held.take(), last) {
            (Some(held), Some(last)) => {
                let _ = self.frames.send(StreamFrame::Frame(Ok(held))).await;
                Some(last)
            }
            (held, last) => last.or(held),
        };
        let end = last.map_or(StreamFrame::End, StreamFrame::Last);
        let _ = self.frames.send(end).await;
    }
}

/// Polls `future` once, in the calling task.
async fn poll_once<F: Future + ?Sized>(mut future: Pin<&mut F>) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await
}

/// The frames of a response body read before the response goes out (trailers settled).
#[derive(Default)]
struct Early {
    /// The first frame, and the others (most bodies that end at once are one frame: no
    /// allocation for them).
    first: Option<Frame<Bytes>>,
    rest: Vec<Frame<Bytes>>,
    /// The bytes of data among them.
    len: u64,
    /// The body ended: the frames are all of it.
    ended: bool,
}

impl Early {
    fn push(&mut self, frame: Frame<Bytes>) {
        if let Some(data) = frame.data_ref() {
            self.len = self.len.saturating_add(data.len() as u64);
        }
        let frame = fields::settle_frame(frame);
        if self.first.is_none() {
            self.first = Some(frame);
        } else {
            self.rest.push(frame);
        }
    }

    /// The frames, in order.
    fn frames(self) -> impl Iterator<Item = Frame<Bytes>> {
        self.first.into_iter().chain(self.rest)
    }

    /// Reads what can go out with the response's head: whatever of the body is ready at
    /// once, up to `cap` (most bodies are all ready with their head, and then go out whole);
    /// nothing of a body announced over it. A body that is not all ready is streamed after the
    /// head as it comes (its last frame held until the record is settled), so a slow body
    /// does not hold its head back.
    async fn read<B>(
        &mut self,
        claim: &mut Claim,
        body: Pin<&mut B>,
        hint: &http_body::SizeHint,
        cap: u64,
    ) -> Result<(), ()>
    where
        B: Body<Data = Bytes>,
    {
        if body.is_end_stream() {
            self.read_all(claim, body).await
        } else if hint.lower() <= cap {
            self.read_ready(body, cap).await
        } else {
            Ok(())
        }
    }

    /// Reads the whole body, keeping the lease while it waits.
    async fn read_all<B>(&mut self, claim: &mut Claim, mut body: Pin<&mut B>) -> Result<(), ()>
    where
        B: Body<Data = Bytes>,
    {
        while let Some(frame) = claim.beating(body.frame()).await {
            self.push(frame.map_err(drop)?);
        }
        self.ended = true;
        Ok(())
    }

    /// Reads the frames that are ready now, until the body ends, one is not ready, or more
    /// than `cap` bytes are read.
    async fn read_ready<B>(&mut self, mut body: Pin<&mut B>, cap: u64) -> Result<(), ()>
    where
        B: Body<Data = Bytes>,
    {
        while self.len <= cap {
            match poll_once(std::pin::pin!(body.frame())).await {
                Poll::Pending => return Ok(()),
                Poll::Ready(None) => {
                    self.ended = true;
                    return Ok(());
                }
                Poll::Ready(Some(frame)) => self.push(frame.map_err(drop)?),
            }
        }
        Ok(())
    }

    /// The whole body: its data in one piece and its trailers (the last trailer frame).
    fn into_whole(self) -> (Bytes, Option<HeaderMap>) {
        let len = usize::try_from(self.len).unwrap_or(usize::MAX);
        let mut data = Bytes::new();
        // Two chunks or more are joined here (one is passed on as it is, without a copy).
        let mut joined: Option<BytesMut> = None;
        let mut trailers = None;
        for frame in self.frames() {
            match frame.into_data() {
                Ok(chunk) if joined.is_none() && data.is_empty() => data = chunk,
                Ok(chunk) => joined
                    .get_or_insert_with(|| {
                        let mut joined = BytesMut::with_capacity(len);
                        joined.extend_from_slice(&data);
                        joined
                    })
                    .extend_from_slice(&chunk),
                Err(frame) => trailers = frame.into_trailers().ok().or(trailers),
            }
        }
        (joined.map_or(data, BytesMut::freeze), trailers)
    }
}

/// A streamed body as captured for its record: its data up to the storage cap (over it,
/// nothing: the record keeps status, headers and trailers, its body omitted) and its trailers,
/// filtered as headers are. Trailers are kept even when the body is over the cap: a replay
/// without its body still carries them (a gRPC status).
struct Capture {
    chunks: Option<Vec<Bytes>>,
    len: u64,
    cap: u64,
    trailers: Vec<(HeaderName, HeaderValue)>,
}

impl Capture {
    fn new(capturing: bool, cap: u64) -> Self {
        Capture {
            chunks: capturing.then(Vec::new),
            len: 0,
            cap,
            trailers: Vec::new(),
        }
    }

    fn add(&mut self, config: &Config, frame: &Frame<Bytes>) {
        if let Some(data) = frame.data_ref() {
            self.len = self.len.saturating_add(data.len() as u64);
            if self.len > self.cap {
                self.chunks = None;
            } else if let Some(chunks) = self.chunks.as_mut() {
                chunks.push(data.clone());
            }
        } else if let Some(sent) = frame.trailers_ref() {
            self.trailers.extend(config.storable_headers(sent));
        }
    }
}

/// Chunks of data in one piece (a single chunk as it is, without a copy).
fn concat(mut chunks: Vec<Bytes>) -> Bytes {
    match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.pop().unwrap_or_default(),
        _ => Bytes::from(chunks.concat()),
    }
}
