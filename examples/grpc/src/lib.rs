//! A unary gRPC service, `payments.Payments/Create`, served by tonic behind the idem
//! idempotency layer (`idem-http`) on the in-memory store, and a client for it.
//!
//! A gRPC response is HTTP 200, a body and the trailers `grpc-status` / `grpc-message`; an error
//! returned by a handler is HTTP 200 too, with `grpc-status` in the headers (a trailers-only
//! response). The layer stores both like any 200, trailers included, and a retry with the same
//! `idempotency-key` metadata gets the same message or the same error, without the handler
//! running again.
//!
//! The messages are written by hand with `#[derive(prost::Message)]` and the service and client
//! with tonic's lower-level API (`tonic::server::Grpc`, `tonic::client::Grpc`): no `.proto`, no
//! `protoc`, no build script. The equivalent `.proto`:
//!
//! ```proto
//! package payments;
//! service Payments { rpc Create(CreatePayment) returns (Payment); }
//! message CreatePayment { uint64 amount = 1; string currency = 2; }
//! message Payment { string id = 1; uint64 amount = 2; string currency = 3; }
//! ```
//!
//! ```no_run
//! use std::sync::Arc;
//! use grpc_payments::{CreatePayment, Payments, PaymentsClient};
//! use idem_store_memory::MemoryStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let addr = listener.local_addr()?;
//! let payments = Arc::new(Payments::default());
//! let config = grpc_payments::config()?;
//! tokio::spawn(grpc_payments::serve(listener, payments.clone(), MemoryStore::new(), config));
//! let mut client = PaymentsClient::connect(addr).await?;
//! let request = CreatePayment { amount: 1250, currency: "eur".into() };
//! let first = client.create("\"pay-42\"", request.clone()).await?;
//! let retry = client.create("\"pay-42\"", request).await?;
//! assert_eq!(first.get_ref(), retry.get_ref());
//! assert_eq!(payments.charges(), 1);
//! # Ok(())
//! # }
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::uri::PathAndQuery;
use idem_http::{Config, IdempotencyLayer, LayerConfigError, Rejection};
use idem_store_memory::MemoryStore;
use tonic::server::{NamedService, UnaryService};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};
use tonic_prost::ProstCodec;
use tower::{Service, ServiceBuilder};

/// The gRPC service name.
pub const SERVICE: &str = "payments.Payments";
/// The path of the `Create` method.
pub const CREATE: &str = "/payments.Payments/Create";

/// The request of `Create`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct CreatePayment {
    /// The amount, in cents; 0 is refused with `INVALID_ARGUMENT`.
    #[prost(uint64, tag = "1")]
    pub amount: u64,
    /// The currency, such as `eur`.
    #[prost(string, tag = "2")]
    pub currency: String,
}

/// The answer of `Create`: the payment made.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Payment {
    /// `pay_1`, `pay_2`, ...: one per charge.
    #[prost(string, tag = "1")]
    pub id: String,
    /// The amount, in cents.
    #[prost(uint64, tag = "2")]
    pub amount: u64,
    /// The currency, upper case.
    #[prost(string, tag = "3")]
    pub currency: String,
}

/// The payment provider: counts every charge, so a test can tell a replay from a second run.
#[derive(Debug, Default)]
pub struct Payments {
    charges: AtomicU64,
}

impl Payments {
    /// How many times a charge reached the provider (the handler ran).
    #[must_use]
    pub fn charges(&self) -> u64 {
        self.charges.load(Ordering::SeqCst)
    }

    /// The handler of `Create`: counts the call, then charges or refuses.
    fn create(&self, request: &CreatePayment) -> Result<Payment, Status> {
        let n = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        if request.amount == 0 {
            return Err(Status::invalid_argument("amount must be positive"));
        }
        Ok(Payment {
            id: format!("pay_{n}"),
            amount: request.amount,
            currency: request.currency.to_uppercase(),
        })
    }
}

/// The tonic service of `payments.Payments`, as `tonic-build` would generate it.
#[derive(Clone, Debug)]
pub struct PaymentsServer {
    payments: Arc<Payments>,
}

impl PaymentsServer {
    /// The service, answering from `payments`.
    #[must_use]
    pub fn new(payments: Arc<Payments>) -> Self {
        PaymentsServer { payments }
    }
}

impl NamedService for PaymentsServer {
    const NAME: &'static str = SERVICE;
}

/// A boxed future, as generated services return.
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// `Create`, as a unary service for `tonic::server::Grpc`.
struct CreateMethod(Arc<Payments>);

impl UnaryService<CreatePayment> for CreateMethod {
    type Response = Payment;
    type Future = std::future::Ready<Result<Response<Payment>, Status>>;

    fn call(&mut self, request: Request<CreatePayment>) -> Self::Future {
        std::future::ready(self.0.create(request.get_ref()).map(Response::new))
    }
}

impl Service<http::Request<tonic::body::Body>> for PaymentsServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if request.uri().path() != CREATE {
            return Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) });
        }
        let method = CreateMethod(self.payments.clone());
        Box::pin(async move {
            let mut grpc =
                tonic::server::Grpc::new(ProstCodec::<Payment, CreatePayment>::default());
            Ok(grpc.unary(method, request).await)
        })
    }
}

/// The layer's settings here: every call needs an `idempotency-key`, and the layer's own
/// answers (a key reused with another request, a call in flight, ...) are gRPC statuses
/// ([`grpc_rejection`]).
///
/// # Errors
/// None with these settings; [`LayerConfigError`] is the builder's.
pub fn config() -> Result<Config, LayerConfigError> {
    Config::builder()
        .require_key()
        .rejection_handler(grpc_rejection)
        .build()
}

/// A rejection of the layer as a gRPC status: a trailers-only response (HTTP 200 with
/// `grpc-status` and `grpc-message` in the headers), which a gRPC client reads as the error
/// [`grpc_code`] with the rejection's detail. The default, RFC 9457 `problem+json` with an
/// HTTP error status, reaches a tonic client as `INTERNAL` ("protocol error ... status: 422").
#[must_use]
pub fn grpc_rejection(rejection: &Rejection) -> http::Response<Bytes> {
    Status::new(grpc_code(rejection), rejection.detail()).into_http()
}

/// The gRPC code of a rejection of the layer.
#[must_use]
pub fn grpc_code(rejection: &Rejection) -> Code {
    match rejection {
        Rejection::InvalidKey { .. }
        | Rejection::MissingKey { .. }
        | Rejection::InvalidScope
        | Rejection::MethodCase { .. }
        | Rejection::BodyUnreadable => Code::InvalidArgument,
        Rejection::BodyTooLarge { .. } => Code::ResourceExhausted,
        // Another call with this key runs: retry later (the layer adds `retry-after`).
        Rejection::InFlight { .. } => Code::Aborted,
        // The key is bound to another request, or to a failed operation: use a new key.
        Rejection::Mismatch | Rejection::FailedPermanently => Code::FailedPrecondition,
        // An earlier call lost its answer: not run again; retry later for the answer.
        Rejection::OutcomeUnknown { .. } => Code::Aborted,
        Rejection::StoreUnavailable { .. } => Code::Unavailable,
        _ => Code::Internal,
    }
}

/// Serves `payments.Payments` on `listener` behind the idempotency layer, on `store` with
/// `config`, until the server fails. gRPC calls are all `POST`, so the layer covers every
/// method of every service added here.
///
/// # Errors
/// The server's, when it stops.
pub async fn serve(
    listener: tokio::net::TcpListener,
    payments: Arc<Payments>,
    store: MemoryStore,
    config: Config,
) -> Result<(), tonic::transport::Error> {
    // The layer hands the handler the request body it read as `ReqBody::from(bytes)`, which
    // tonic's body cannot be made from: the body goes through the layer as axum's (which can),
    // and back into tonic's for the services.
    let layer = ServiceBuilder::new()
        .map_request(|request: http::Request<tonic::body::Body>| request.map(axum::body::Body::new))
        .layer(IdempotencyLayer::with_config(store, config))
        .map_request(|request: http::Request<axum::body::Body>| {
            request.map(tonic::body::Body::new)
        });
    Server::builder()
        .layer(layer)
        .add_service(PaymentsServer::new(payments))
        .serve_with_incoming(TcpIncoming::from(listener))
        .await
}

/// A client of `payments.Payments`, as `tonic-build` would generate it.
#[derive(Clone, Debug)]
pub struct PaymentsClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl PaymentsClient {
    /// Connects to the service at `addr` (plain HTTP/2).
    ///
    /// # Errors
    /// When the connection fails.
    pub async fn connect(addr: SocketAddr) -> Result<Self, tonic::transport::Error> {
        let channel = Endpoint::from_shared(format!("http://{addr}"))?
            .connect()
            .await?;
        Ok(PaymentsClient {
            grpc: tonic::client::Grpc::new(channel),
        })
    }

    /// Calls `Create` with `key` as the `idempotency-key` metadata (a structured-field string
    /// such as `"pay-42"`, quotes included).
    ///
    /// # Errors
    /// The status the server answered (the handler's, or the layer's: see [`grpc_code`]), or
    /// `INVALID_ARGUMENT` for a key that cannot be sent as metadata.
    pub async fn create(
        &mut self,
        key: &str,
        message: CreatePayment,
    ) -> Result<Response<Payment>, Status> {
        let mut request = Request::new(message);
        let key = key
            .parse()
            .map_err(|_| Status::invalid_argument("the key is not valid metadata"))?;
        request.metadata_mut().insert("idempotency-key", key);
        self.grpc
            .ready()
            .await
            .map_err(|error| Status::unavailable(error.to_string()))?;
        let codec = ProstCodec::<CreatePayment, Payment>::default();
        self.grpc
            .unary(request, PathAndQuery::from_static(CREATE), codec)
            .await
    }
}
