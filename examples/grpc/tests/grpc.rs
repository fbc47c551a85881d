//! The gRPC service behind the layer, called by a tonic client over real HTTP/2 on
//! 127.0.0.1:0: a retry is a replay (same message, OK status, the handler did not run again),
//! the same key with another message is an error (a gRPC status with the example's rejection
//! handler, an HTTP 422 the client cannot read without it), and a handler's gRPC error is
//! replayed with its code and message.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use grpc_payments::{CreatePayment, Payments, PaymentsClient, serve};
use idem_http::Config;
use idem_store_memory::MemoryStore;
use tonic::Code;

/// Serves the service on a free port with the example's settings; a client of it, and the
/// provider it charges.
async fn start() -> (PaymentsClient, Arc<Payments>) {
    start_with(grpc_payments::config().unwrap()).await
}

async fn start_with(config: Config) -> (PaymentsClient, Arc<Payments>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let payments = Arc::new(Payments::default());
    tokio::spawn(serve(
        listener,
        payments.clone(),
        MemoryStore::new(),
        config,
    ));
    (PaymentsClient::connect(addr).await.unwrap(), payments)
}

fn payment(amount: u64) -> CreatePayment {
    CreatePayment {
        amount,
        currency: "eur".to_owned(),
    }
}

#[tokio::test]
async fn a_retry_is_replayed_with_its_message_and_an_ok_status() {
    let (mut client, payments) = start().await;
    let first = client.create("\"pay-1\"", payment(1250)).await.unwrap();
    assert_eq!(first.get_ref().id, "pay_1");
    assert_eq!(first.get_ref().currency, "EUR");
    assert_eq!(payments.charges(), 1);
    assert!(first.metadata().get("idempotent-replayed").is_none());

    let retry = client.create("\"pay-1\"", payment(1250)).await.unwrap();
    assert_eq!(retry.get_ref(), first.get_ref());
    assert_eq!(retry.metadata().get("idempotent-replayed").unwrap(), "true");
    // The status came in the replay's trailers: without them the client sees an error.
    assert_eq!(retry.metadata().get("grpc-status").unwrap(), "0");
    assert_eq!(payments.charges(), 1, "the retry ran the handler again");
}

#[tokio::test]
async fn the_same_key_with_another_message_is_an_error_and_runs_nothing() {
    let (mut client, payments) = start().await;
    client.create("\"pay-2\"", payment(500)).await.unwrap();
    let other = client.create("\"pay-2\"", payment(9999)).await.unwrap_err();
    assert_eq!(other.code(), Code::FailedPrecondition, "{other:?}");
    assert!(other.message().contains("use a new key"), "{other:?}");
    assert_eq!(payments.charges(), 1);
    // The first payment is still replayed.
    let retry = client.create("\"pay-2\"", payment(500)).await.unwrap();
    assert_eq!(retry.get_ref().id, "pay_1");
    assert_eq!(payments.charges(), 1);
}

/// With the layer's default rejections (`problem+json`, HTTP 422), the client still gets an
/// error, if not a readable one.
#[tokio::test]
async fn without_the_grpc_rejections_a_reused_key_is_still_an_error() {
    let (mut client, payments) = start_with(Config::default()).await;
    client.create("\"pay-4\"", payment(500)).await.unwrap();
    let other = client.create("\"pay-4\"", payment(9999)).await.unwrap_err();
    assert_ne!(other.code(), Code::Ok);
    assert!(other.message().contains("422"), "{other:?}");
    assert_eq!(payments.charges(), 1);
}

#[tokio::test]
async fn a_grpc_error_is_replayed_with_its_code_and_message() {
    let (mut client, payments) = start().await;
    let first = client.create("\"pay-3\"", payment(0)).await.unwrap_err();
    assert_eq!(first.code(), Code::InvalidArgument);
    assert_eq!(first.message(), "amount must be positive");
    assert_eq!(payments.charges(), 1);

    let retry = client.create("\"pay-3\"", payment(0)).await.unwrap_err();
    assert_eq!(retry.code(), Code::InvalidArgument);
    assert_eq!(retry.message(), "amount must be positive");
    assert_eq!(
        retry.metadata().get("idempotent-replayed").unwrap(),
        "true",
        "the error was not a replay"
    );
    assert_eq!(payments.charges(), 1, "the retry ran the handler again");
}

#[tokio::test]
async fn a_call_with_an_empty_key_runs_nothing() {
    let (mut client, payments) = start().await;
    let refused = client.create("", payment(1)).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert_eq!(payments.charges(), 0);
}
