//! The store's clock: an estimate of the server's `TIME`, measured at connect and every
//! [`ClockEstimate::REFRESH`] after (see [`ClockEstimate`] for its error bound).

use std::sync::Weak;

use idem_core::{ClockEstimate, StoreError, Timestamp};
use redis::Value;

use crate::conn::resending;
use crate::primitives::Backend;
use crate::store::Shared;

/// Asks the server for `TIME` and records the measurement in the store's estimate.
pub(crate) async fn measure(backend: &Backend) -> Result<(), StoreError> {
    let sent = backend.clock.local_now();
    let time = resending(&backend.conn, |mut conn| async move {
        redis::cmd("TIME").query_async::<Value>(&mut conn).await
    });
    let reply = backend.bounded("time", time).await?;
    let received = backend.clock.local_now();
    let server = server_time(&reply).ok_or_else(|| StoreError::Backend {
        source: format!("TIME answered with an unexpected shape: {reply:?}").into(),
        retryable: false,
    })?;
    backend.clock.measured(sent, server, received);
    Ok(())
}

/// Measures again every [`ClockEstimate::REFRESH`] while the store lives. A failed measurement
/// keeps the last one (the next operations fail on their own if the server is gone).
pub(crate) async fn refresh(store: Weak<Shared>) {
    loop {
        tokio::time::sleep(ClockEstimate::REFRESH).await;
        let Some(shared) = store.upgrade() else {
            return;
        };
        let _ = measure(shared.primitives()).await;
    }
}

/// The reply of `TIME` as a timestamp.
fn server_time(reply: &Value) -> Option<Timestamp> {
    let (secs, micros): (u64, u64) = redis::from_redis_value_ref(reply).ok()?;
    Some(Timestamp::from_micros(
        secs.checked_mul(1_000_000)?.checked_add(micros)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_time_is_read() {
        let reply = Value::Array(vec![
            Value::BulkString(b"1700000000".to_vec()),
            Value::BulkString(b"250".to_vec()),
        ]);
        assert_eq!(
            server_time(&reply),
            Some(Timestamp::from_micros(1_700_000_000_000_250))
        );
        assert_eq!(server_time(&Value::Nil), None);
    }
}
